"""The fast path for repeat calls (engine/fastpath.py): a call that looks like an
earlier one skips the meta kernel and key building; anything new takes the general
path, with PyTorch's checks. Strict mode executes the op, fused mode records it: every
test runs in both (debug mode never takes the fast path)."""

from __future__ import annotations

import pytest
import torch
from conftest import hold_executables

from torch_tpu import metrics
from torch_tpu.engine import fastpath


@pytest.fixture(autouse=True)
def _executables_held(monkeypatch):
    """These tests look the fast path's table up after a call: no memory reset between."""
    hold_executables(monkeypatch)


@pytest.fixture(autouse=True, params=["strict", "fused"])
def mode(request):
    with torch.tpu.set_eager_mode(request.param):
        yield request.param


def _hits(fn) -> int:
    before = metrics.snapshot().get("cache_hits", 0)
    fn()
    return metrics.snapshot().get("cache_hits", 0) - before


def test_repeat_calls_take_the_fast_path_and_stay_right():
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    ta, tb = a.to("tpu"), b.to("tpu")
    (ta + tb).cpu()
    key = fastpath.signature(_spec_of("add.Tensor"), [ta, tb, 1])
    assert key is not None and fastpath.lookup(key[0]) is not None
    for _ in range(3):
        torch.testing.assert_close((ta + tb).cpu(), a + b)


def _spec_of(name: str):
    from torch_tpu.engine.executor import _CACHE

    return next(spec for spec, _ in _CACHE if spec.schema.name == f"aten::{name}")


def test_changed_strides_dtype_shape_offset_and_aliasing_still_right():
    a, b = torch.randn(6, 6), torch.randn(6, 6)
    ta, tb = a.to("tpu"), b.to("tpu")
    cases = [
        lambda x, y: x + y,
        lambda x, y: x.t() + y,  # strides
        lambda x, y: x[1:] + y[:-1],  # offsets
        lambda x, y: x[::2] + y[1::2],
        lambda x, y: x.double() + y,  # dtype promotion
        lambda x, y: x[:3] + y[:3],  # shape
        lambda x, y: x + x,  # one storage twice
        lambda x, y: x + y,
        lambda x, y: x.view(torch.int32) + 1,  # a dtype view of the storage
        lambda x, y: x + y.t(),
    ]
    for _ in range(2):  # second round: every signature seen before
        for case in cases:
            expected = case(a, b)
            actual = case(ta, tb).cpu()
            assert actual.dtype == expected.dtype
            torch.testing.assert_close(actual, expected)


def test_in_place_repeat_calls_write_through_views_and_return_their_argument():
    """Repeat calls of in-place and out= ops (fused mode records them through a recorder
    of their own, executor._plain_record): the op returns the tensor it wrote, and
    every view of the written storage sees the write, as on CPU."""
    x, other, out = torch.randn(6, 6), torch.randn(6), torch.empty(6)
    tpu = [t.to("tpu") for t in (x, other, out)]
    for _ in range(3):  # the later rounds take the fast path
        for t, o, written in ((x, other, out), tpu):
            row = t[1]
            assert row.mul_(2) is row
            assert t.add_(t, alpha=0.5) is t
            column = t[:, 2]
            assert column.addcmul_(o, o, value=0.1) is column
            assert torch.add(o, 1, out=written) is written
            torch.testing.assert_close(row.cpu() if t is tpu[0] else row, x[1])
    torch.testing.assert_close(tpu[0].cpu(), x)
    torch.testing.assert_close(tpu[2].cpu(), out)


def test_runtime_scalars_repeated_and_changing():
    a, b = torch.randn(16), torch.randn(16)
    ta, tb = a.to("tpu"), b.to("tpu")
    for alpha in (2, 2, 3, 2, -1, 3, True, 2.5, 2.5, -0.0, 0.0, -0.0, float("nan")):
        expected = torch.add(a, b, alpha=alpha) if not isinstance(alpha, bool) else a + b
        actual = (torch.add(ta, tb, alpha=alpha) if not isinstance(alpha, bool) else ta + tb).cpu()
        torch.testing.assert_close(actual, expected, equal_nan=True)
    for value in (-0.0, 0.0, -0.0, 1e300, 1e300, 2**62, 2**62):
        x = torch.zeros(4, dtype=torch.float64)
        torch.testing.assert_close((x.to("tpu") * value).cpu(), x * value, equal_nan=True)
    # signed zeros are kept apart: 1 / (0 * -0.0) is -inf on CPU
    for value in (0.0, -0.0, 0.0, -0.0):
        one = torch.ones(2)
        torch.testing.assert_close((1 / (one.to("tpu") * value)).cpu(), 1 / (one * value))


def test_a_scalar_passed_as_its_default_is_a_constant_of_the_program():
    """`a + b` passes alpha=1, the schema's default: its program takes no scalar (one
    argument fewer to convert per call). Another value, or the same value as another
    type (1.0, True), is still a run-time scalar, and every mix gives CPU's result."""
    a, b = torch.randn(16), torch.randn(16)
    ta, tb = a.to("tpu"), b.to("tpu")
    spec = None
    for alpha in (1, 1.0, 2, 1, True, 2, 1.0, 1):
        expected = a + b if alpha is True else torch.add(a, b, alpha=alpha)
        actual = ta + tb if alpha is True else torch.add(ta, tb, alpha=alpha)
        torch.testing.assert_close(actual.cpu(), expected)
        spec = spec or _spec_of("add.Tensor")
        dynamic = fastpath.signature(spec, [ta, tb, alpha])[2]
        assert dynamic == ([] if type(alpha) is int and alpha == 1 else [alpha])
    ints = torch.arange(6, dtype=torch.uint8)
    for alpha in (1, 3, 1):
        assert torch.equal(torch.add(ints.to("tpu"), ints.to("tpu"), alpha=alpha).cpu(),
                           torch.add(ints, ints, alpha=alpha))  # fmt: skip
    x = torch.randn(32)
    for slope in (0.01, 0.02, 0.01, -0.0, 0.01):
        torch.testing.assert_close(
            torch.nn.functional.leaky_relu(x.to("tpu"), slope).cpu(),
            torch.nn.functional.leaky_relu(x, slope),
        )


def test_numbers_in_tensor_arguments_are_runtime_scalars():
    """`x.mul_(0.9)` reaches mul_.Tensor with the float where a tensor goes (an
    optimizer's moments every step): a repeat call with another number, or another
    kind of number, gives CPU's result."""
    x = torch.randn(16, dtype=torch.float64)
    values = (0.9, 0.9, 0.5, 2, 2, True, -0.0, 0.0, float("nan"), 1e300, 0.9)
    for ops in (lambda t, v: t.mul_(v), lambda t, v: t.add_(v, alpha=2), lambda t, v: t / v):
        cpu, tpu = x.clone(), x.to("tpu")
        for value in values:
            cpu, tpu = ops(cpu, value), ops(tpu, value)
            torch.testing.assert_close(tpu.cpu(), cpu, equal_nan=True)
        ints = torch.arange(6)
        for value in (3, 3, 2.5, True):  # an int tensor times a float is a float tensor
            assert torch.equal((ints.to("tpu") * value).cpu(), ints * value)


def test_checks_still_run_for_anything_new():
    a = torch.randn(4, 4).to("tpu")
    b = torch.randn(4, 4).to("tpu")
    for _ in range(3):
        a + b  # warm: this signature takes the fast path now
    for cpu_fn, tpu_fn in (
        (lambda: torch.randn(4, 4) + torch.randn(3, 4), lambda: a + b[:3]),
        (
            lambda: torch.randn(4, 4).add_(torch.randn(4, 8)),
            lambda: a.add_(torch.randn(4, 8).to("tpu")),
        ),
        (lambda: torch.mm(torch.randn(4, 4), torch.randn(3, 4)), lambda: torch.mm(a, b[:3])),
    ):
        with pytest.raises(RuntimeError) as cpu_error:
            cpu_fn()
        with pytest.raises(type(cpu_error.value)):
            tpu_fn()
    # a device mismatch is judged by the general path on every call
    for _ in range(2):
        with pytest.raises(RuntimeError, match="same device"):
            a + torch.randn(4, 4)


def test_value_dependent_checks_run_on_every_call():
    """Indexing with host indices checks their bounds on every call, as on CPU."""
    x = torch.randn(5, 3)
    tx = x.to("tpu")
    good = torch.tensor([0, 4])
    for _ in range(2):
        torch.testing.assert_close(tx[good].cpu(), x[good])
    bad = torch.tensor([0, 5])
    with pytest.raises(IndexError):
        x[bad]
    with pytest.raises(IndexError):
        tx[bad]


def test_out_resize_and_fast_path(mode):
    a = torch.randn(3, 3)
    out = torch.empty(0).to("tpu")
    for _ in range(3):
        torch.add(a.to("tpu"), 1, out=out)
    torch.testing.assert_close(out.cpu(), a + 1)
    # resized: the general path's job, every time. (PyTorch's meta kernel warns when
    # a layout is first seen; the other mode's run has seen size 2 in this process.)
    out2 = torch.empty(2 if mode == "strict" else 5).to("tpu")
    with pytest.warns(UserWarning):
        torch.add(a.to("tpu"), 1, out=out2)
    torch.testing.assert_close(out2.cpu(), a + 1)


def test_fast_path_counts_cache_hits():
    a = torch.randn(4).to("tpu")
    (a * 2).cpu()
    assert _hits(lambda: a * 2) == 1
