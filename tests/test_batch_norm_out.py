"""Batch norm's out= overloads on tpu match CPU: the outs and the running statistics.

Their kernels are derived from the functional ops' lowerings (`kernels._register_variants`),
which also return the new running statistics (`Lowering.writes`); the derived kernels
must write those back too, in every eager mode, and resize empty or wrongly sized outs
as CPU does (`_native_batch_norm_legit.out` has no meta kernel of PyTorch's to tell).
"""

import warnings

import pytest
import torch
from conftest import no_fallback

aten = torch.ops.aten

C = 3
SHAPES = {"out": (4, C, 5, 5), "save_mean": (C,), "save_invstd": (C,)}
MOMENTUM, EPS = 0.3, 1e-5


def _call(op: str, x, w, b, rm, rv, training: bool, outs: dict):
    if op == "native_batch_norm.out":
        return aten.native_batch_norm.out(x, w, b, rm, rv, training, MOMENTUM, EPS, **outs)
    if op == "_native_batch_norm_legit.out":
        return aten._native_batch_norm_legit.out(x, w, b, rm, rv, training, MOMENTUM, EPS, **outs)
    if op == "_native_batch_norm_legit.no_stats_out":
        return aten._native_batch_norm_legit.no_stats_out(x, w, b, training, MOMENTUM, EPS, **outs)
    assert op == "_batch_norm_with_update.out" and training
    reserve = torch.empty(0, dtype=torch.uint8, device=x.device)
    return aten._batch_norm_with_update.out(
        x, w, b, rm, rv, MOMENTUM, EPS, **outs, reserve=reserve
    )[:3]


def _outs(kind: str, device: str) -> dict:
    if kind == "right":  # (a sentinel CPU's kernel overwrites)
        return {k: torch.full(s, 7.0, device=device) for k, s in SHAPES.items()}
    if kind == "empty":
        return {k: torch.empty(0, device=device) for k in SHAPES}
    assert kind == "wrong"
    return {
        "out": torch.zeros(2, 2, device=device),
        "save_mean": torch.zeros(5, device=device),
        "save_invstd": torch.zeros(1, device=device),
    }


def _run(op: str, device: str, training: bool, kind: str, steps: int = 3, stats: bool = True):
    """The op called `steps` times into the same outs (the running statistics accumulate;
    strict mode's later calls run the compiled executable); the outs and statistics."""
    torch.manual_seed(0)
    xs = [torch.randn(SHAPES["out"]) * 3 + 2 for _ in range(steps)]
    w, b = torch.randn(C), torch.randn(C)
    rm, rv = (torch.randn(C), torch.rand(C) + 0.5) if stats else (None, None)
    w, b, rm, rv = (None if t is None else t.to(device) for t in (w, b, rm, rv))
    outs = _outs(kind, device)
    for x in xs:
        result = _call(op, x.to(device), w, b, rm, rv, training, outs)
        assert all(r is o for r, o in zip(result, outs.values()))
    return {**outs, "running_mean": rm, "running_var": rv}


def _compare(actual: dict, expected: dict, training: bool) -> None:
    for name, want in expected.items():
        if not training and name in ("save_mean", "save_invstd"):
            # In eval mode CPU's out= kernels leave these untouched (the functional
            # ops return them empty); tpu's lowering writes the running statistics
            # the output was normalized with. Not compared.
            continue
        got = actual[name]
        if want is None:
            assert got is None
            continue
        assert got.device.type == "tpu"
        torch.testing.assert_close(got.cpu(), want, atol=1e-5, rtol=1e-5, msg=name)


OPS = ["native_batch_norm.out", "_native_batch_norm_legit.out"]


@pytest.fixture
def no_bn_fallback():
    with no_fallback("batch norm", lambda op: "batch_norm" in op):
        yield


@pytest.mark.parametrize("kind", ["right", "empty"])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("op", OPS)
def test_out_updates_running_stats_as_cpu(op, training, kind, eager_mode, no_bn_fallback):
    expected = _run(op, "cpu", training, kind)
    actual = _run(op, "tpu", training, kind)
    _compare(actual, expected, training)
    if training:  # (the bug: the statistics stayed as they were)
        initial = _run(op, "cpu", training, kind, steps=0)
        assert not torch.equal(actual["running_mean"].cpu(), initial["running_mean"])
        assert not torch.equal(actual["running_var"].cpu(), initial["running_var"])


# (CPU's no_stats_out crashes in eval mode, without statistics to normalize with)
@pytest.mark.parametrize("kind", ["right", "empty"])
@pytest.mark.parametrize(
    "op", ["_native_batch_norm_legit.no_stats_out", "_batch_norm_with_update.out"]
)
def test_training_only_out_variants_as_cpu(op, kind, eager_mode, no_bn_fallback):
    stats = op != "_native_batch_norm_legit.no_stats_out"
    expected = _run(op, "cpu", True, kind, stats=stats)
    _compare(_run(op, "tpu", True, kind, stats=stats), expected, True)


@pytest.mark.parametrize("kind", ["right", "empty"])
def test_native_batch_norm_out_without_running_stats(kind, eager_mode):
    """Its running statistics are optional: none to write (training mode only: eval
    mode normalizes with them)."""
    expected = _run("native_batch_norm.out", "cpu", True, kind, stats=False)
    _compare(_run("native_batch_norm.out", "tpu", True, kind, stats=False), expected, True)


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("op", [*OPS, "_native_batch_norm_legit.no_stats_out"])
def test_wrongly_sized_outs_are_resized_with_a_warning(op, training, eager_mode):
    if op.endswith("no_stats_out") and not training:
        pytest.skip("CPU's no_stats_out crashes in eval mode")
    stats = not op.endswith("no_stats_out")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (CPU's own resize warnings)
        expected = _run(op, "cpu", training, "wrong", stats=stats)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        actual = _run(op, "tpu", training, "wrong", stats=stats)
    resized = [str(w.message) for w in caught if "was resized" in str(w.message)]
    # CPU's resize_output warning, once per wrongly sized out (at the first call only;
    # in eval mode CPU leaves save_mean and save_invstd alone, `_compare`)
    compared = SHAPES if training else {"out": SHAPES["out"]}
    if training:
        assert len(resized) == 3, resized
    for name, old in zip(SHAPES, ("[2, 2]", "[5]", "[1]")):
        if name in compared:
            assert any(f"since it had shape {old}," in m for m in resized), old
            assert tuple(actual[name].shape) == tuple(expected[name].shape) == SHAPES[name]
    _compare(actual, expected, training)


def test_module_forward_still_updates_running_stats(eager_mode):
    """The functional path (what nn.BatchNorm2d runs) is untouched by the out= fix."""
    cpu = torch.nn.BatchNorm2d(C, momentum=MOMENTUM)
    tpu = torch.nn.BatchNorm2d(C, momentum=MOMENTUM).to("tpu")
    for _ in range(2):
        x = torch.randn(SHAPES["out"]) * 3 + 2
        torch.testing.assert_close(tpu(x.to("tpu")).cpu(), cpu(x), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(tpu.running_mean.cpu(), cpu.running_mean)
    torch.testing.assert_close(tpu.running_var.cpu(), cpu.running_var)


@pytest.mark.parametrize("kind", ["empty", "wrong"])
def test_out_variant_without_any_meta_kernel_is_resized(kind, eager_mode):
    """The same mechanism for a derived out= variant whose functional has no meta kernel
    either (`_logcumsumexp`): the lowering's own result shape resizes the out."""
    x = torch.randn(4, 5)
    out = {"empty": torch.empty(0), "wrong": torch.zeros(3)}[kind]
    expected = torch.ops.aten._logcumsumexp.out(x, 1, out=out.clone())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        actual = torch.ops.aten._logcumsumexp.out(x.to("tpu"), 1, out=out.to("tpu"))
    assert actual.shape == (4, 5)
    torch.testing.assert_close(actual.cpu(), expected)
