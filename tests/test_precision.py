"""torch.set_float32_matmul_precision reaches the programs: every matrix product and
convolution is lowered at the matching XLA precision (HIGHEST / HIGH / DEFAULT), in
every mode, and a change of the setting never runs a program traced under the old one.

XLA:CPU computes float32 products exactly at any precision, so results here equal the
CPU's whatever the setting; the programs' text is what tells the settings apart (on a
TPU they differ in speed and rounding)."""

from __future__ import annotations

import re

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
