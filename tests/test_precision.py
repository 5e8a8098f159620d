"""torch.set_float32_matmul_precision reaches the programs: every matrix product and
convolution is lowered at the matching XLA precision (HIGHEST / HIGH / DEFAULT), in
every mode, and a change of the setting never runs a program traced under the old one.

XLA:CPU computes float32 products exactly at any precision, so results here equal the
CPU's whatever the setting; the programs' text is what tells the settings apart (on a
TPU they differ in speed and rounding)."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
import torch.nn.functional as F

from torch_tpu import cache

TOKENS = {"highest": "HIGHEST", "high": "HIGH", "medium": "DEFAULT"}
PRECISION = re.compile(r"precision(?:_config)? = \[(?:#stablehlo<precision )?(\w+)")


@pytest.fixture(autouse=True)
def restore_precision():
    yield
    torch.set_float32_matmul_precision("highest")


@pytest.fixture
def lowered(monkeypatch):
    """The StableHLO text of every program traced from here on (lookups forgotten
    first: an earlier test in this process may have run the same op and shapes)."""
    texts: list[str] = []
    real = cache._lower
    cache.forget_lookups()

    def catch(traced):
        out = real(traced)
        texts.append(out.as_text())
        return out

    monkeypatch.setattr(cache, "_lower", catch)
    return texts


def _precisions(texts: list[str]) -> set[str]:
    """The precisions of every dot_general and convolution in the texts; "unset" for
    one without a precision (JAX's default, one bfloat16 pass on a TPU)."""
    found = set()
    for text in texts:
        for line in text.splitlines():
            if "stablehlo.dot_general" in line or "stablehlo.convolution" in line:
                match = PRECISION.search(line)
                found.add(match.group(1) if match else "unset")
    return found


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.parametrize("setting", ["high", "medium"])
def test_eager_matmul_follows_the_setting_and_back(mode, setting, lowered):
    a, b = torch.randn(5, 7), torch.randn(7, 3)
    ta, tb = a.to("tpu"), b.to("tpu")
    with torch.tpu.set_eager_mode(mode):
        torch.testing.assert_close((ta @ tb).cpu(), a @ b)
        assert _precisions(lowered) == {"HIGHEST"}
        lowered.clear()
        torch.set_float32_matmul_precision(setting)
        torch.testing.assert_close((ta @ tb).cpu(), a @ b)
        assert _precisions(lowered) == {TOKENS[setting]}
        lowered.clear()
        torch.set_float32_matmul_precision("highest")
        torch.testing.assert_close((ta @ tb).cpu(), a @ b)
        assert _precisions(lowered) == {"HIGHEST"}


def test_convolution_follows_the_setting(lowered):
    x, w = torch.randn(1, 2, 6, 6), torch.randn(3, 2, 3, 3)
    torch.set_float32_matmul_precision("high")
    out = F.conv2d(x.to("tpu"), w.to("tpu"))
    torch.testing.assert_close(out.cpu(), F.conv2d(x, w))
    assert _precisions(lowered) == {"HIGH"}


def test_compiled_graph_follows_a_change_between_calls(lowered):
    """Dynamo does not recompile for the setting; the graph's executable is looked up
    again and traced at the new precision."""

    def f(a, b):
        return torch.relu(a @ b) + 1

    compiled = torch.compile(f, backend="tpu")
    a, b = torch.randn(4, 6), torch.randn(6, 5)
    ta, tb = a.to("tpu"), b.to("tpu")
    torch.testing.assert_close(compiled(ta, tb).cpu(), f(a, b))
    assert _precisions(lowered) == {"HIGHEST"}
    lowered.clear()
    torch.set_float32_matmul_precision("medium")
    torch.testing.assert_close(compiled(ta, tb).cpu(), f(a, b))
    assert _precisions(lowered) == {"DEFAULT"}


def test_native_multi_head_attention_sets_a_precision_on_every_product(lowered):
    """nn.MultiheadAttention's inference fast path (one fused op of our own lowering)
    once left its products at JAX's default: one bfloat16 pass on a TPU, whatever
    PyTorch's setting said."""
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval()
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        expected, _ = mha(x, x, x)
        got, _ = mha.to("tpu")(*(x.to("tpu"),) * 3)
    torch.testing.assert_close(got.cpu(), expected)
    ops = [t for t in lowered if "stablehlo.dot_general" in t]
    assert ops and _precisions(ops) == {"HIGHEST"}


def test_mixing_pytorchs_legacy_and_new_precision_apis_keeps_ops_running(lowered):
    """set_float32_matmul_precision("high") and then allow_tf32 = False leave PyTorch
    refusing to answer get_float32_matmul_precision() (a RuntimeError); the tpu ops
    must keep running, at the precision the new API now says (ieee: HIGHEST)."""
    torch.set_float32_matmul_precision("high")
    torch.backends.cuda.matmul.allow_tf32 = False
    with pytest.raises(RuntimeError):
        torch.get_float32_matmul_precision()
    a, b = torch.randn(3, 4), torch.randn(4, 2)
    torch.testing.assert_close((a.to("tpu") @ b.to("tpu")).cpu(), a @ b)
    assert _precisions(lowered) == {"HIGHEST"}


@pytest.fixture
def compiled_as_on_a_tpu(monkeypatch):
    """The compilation cache told that the platform is a TPU (XLA:CPU still compiles,
    and accepts the TPU's options); its once-only warnings fresh."""
    from types import SimpleNamespace

    from torch_tpu import platform

    tpu = SimpleNamespace(platform=lambda: "tpu", devices=platform.devices, device=platform.device)
    monkeypatch.setattr(cache, "platform", tpu)
    monkeypatch.setattr(cache, "_warned", set())
    cache.forget_lookups()
    yield
    cache.forget_lookups()


def test_programs_off_xla_cpu_keep_the_roundings_they_ask_for(compiled_as_on_a_tpu, monkeypatch):
    """XLA:TPU skips a bfloat16 rounding that the same program widens again (excess
    precision), so `add(bf16, bf16, out=float32)` kept float32 bits on a v5e and an
    autocast step's losses differed between strict, fused and compiled mode. Every
    program off XLA:CPU (ops, fused segments, compiled graphs) must be compiled without
    it."""
    from torch_tpu.engine.modes import EagerMode

    kinds: dict[str, list[dict]] = {}
    compile_ = cache._xla_compile

    def spy(lowered, options, kind, name):
        kinds.setdefault(kind, []).append(dict(options))
        return compile_(lowered, options, kind, name)

    monkeypatch.setattr(cache, "_xla_compile", spy)
    a = torch.tensor([1.0, 3.33], dtype=torch.bfloat16)
    b = torch.tensor([0.001, 0.002], dtype=torch.bfloat16)
    want = torch.add(a, b, out=torch.empty(2))
    for mode in (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE):
        with torch.tpu.set_eager_mode(mode):
            got = torch.add(a.to("tpu"), b.to("tpu"), out=torch.empty(2, device="tpu"))
            torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)
    compiled = torch.compile(lambda x, y: (x * y + x).float(), backend="tpu")
    torch.testing.assert_close(compiled(a.to("tpu"), b.to("tpu")).cpu(), (a * b + a).float())
    assert {"op", "segment", "graph"} <= set(kinds)
    for options in (o for per_kind in kinds.values() for o in per_kind):
        assert options["xla_allow_excess_precision"] is False


def test_float64_on_a_tpu_warns_once_that_it_is_emulated(compiled_as_on_a_tpu):
    """A TPU emulates float64 with float32's exponent range (on a v5e `x * 1e300` gave
    inf and `x * 1e-45` gave 0): the first float64 program says so, once; float32
    programs say nothing."""
    x = torch.randn(6, 7)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.testing.assert_close((x.to("tpu") * 3.5).cpu(), x * 3.5)
        assert not caught, [(w.category, str(w.message)[:300]) for w in caught]
        torch.testing.assert_close((x.double().to("tpu") * 2.5).cpu(), x.double() * 2.5)
        torch.testing.assert_close((x.double().to("tpu") - 1.5).cpu(), x.double() - 1.5)
    emulated = [w for w in caught if "float64 on a TPU is emulated" in str(w.message)]
    assert len(emulated) == 1 and emulated[0].category is RuntimeWarning


def test_float64_on_xla_cpu_does_not_warn():
    x = torch.randn(6, 9, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close((x.to("tpu") * 4.5).cpu(), x * 4.5)
