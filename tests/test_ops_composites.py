"""Composite ops lowered whole (ops/composites.py) agree with CPU bit for bit, raise
CPU's errors, and compile one program at a new shape instead of one per part."""

from __future__ import annotations

import itertools

import pytest
import torch

import torch_tpu

# (no subnormals: XLA reads them as zero, a documented difference of every op)
_SPECIALS = [0.0, -0.0, 1.0, -1.0, float("nan"), float("inf"), float("-inf"), 1e-30, 3e38]
_TOLERANCES = [(1e-5, 1e-8), (0.0, 0.0), (0.1, 0.0), (0.0, 0.5), (1e-3, 1e-3), (1.3e-6, 1e-5)]


def _pair(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Operands with every relation isclose can find: equal, special values against
    each other, and differences on both sides of each tolerance's border."""
    if dtype == torch.bool:
        a = torch.tensor([True, False, True, False])
        return a, torch.tensor([True, True, False, False])
    if not (dtype.is_floating_point or dtype.is_complex):
        low = 0 if dtype == torch.uint8 else -50
        a = torch.randint(low, 50, (64,), dtype=dtype)
        return a, (a + torch.randint(-3, 4, (64,))).to(dtype)  # (uint8 wraps below 0)
    specials = torch.tensor(_SPECIALS, dtype=torch.float64)
    grid = torch.cartesian_prod(specials, specials)
    base = torch.randn(200, dtype=torch.float64) * 10
    steps = torch.tensor([0, 1e-9, 1e-8, 1e-6, 1e-5, 1.2e-5, 1e-3, 0.1, 0.5, 0.6, 1.0])
    nudged = base * (1 + steps.repeat(20)[:200] * torch.randn(200).sign())
    a = torch.cat([grid[:, 0], base]).to(dtype)
    b = torch.cat([grid[:, 1], nudged]).to(dtype)
    if dtype.is_complex:
        b = b + 1j * torch.cat([grid[:, 0], base * 1e-6]).to(dtype)
    return a, b


_DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.complex64,
    torch.int64,
    torch.int32,
    torch.uint8,
    torch.bool,
]


@pytest.mark.parametrize("dtype", _DTYPES, ids=str)
def test_isclose_as_cpu(eager_mode, dtype):
    a, b = _pair(dtype)
    for (rtol, atol), equal_nan in itertools.product(_TOLERANCES, (False, True)):
        expected = torch.isclose(a, b, rtol, atol, equal_nan)
        got = torch.isclose(a.to("tpu"), b.to("tpu"), rtol, atol, equal_nan).cpu()
        assert got.dtype == torch.bool
        mismatch = (got != expected).nonzero().flatten()[:5].tolist()
        assert not mismatch, (rtol, atol, equal_nan, [(a[i], b[i]) for i in mismatch])


def test_isclose_broadcasts_and_reads_strided_operands_as_cpu(eager_mode):
    a = torch.randn(5, 4, 3)
    b = a + torch.randn(5, 4, 3) * 1e-4
    a_t, b_t = a.transpose(0, 2).contiguous().transpose(0, 2), b.transpose(0, 1)
    cases = [(a, b), (a_t, b), (a, b_t.transpose(0, 1)), (a[::2], b[::2]), (a[:, :1], b)]
    cases += [(a[0, 0, 0], b), (a[:0], b[:0])]
    for x, y in cases:
        expected = torch.isclose(x, y, rtol=1e-4)
        got = torch.isclose(x.to("tpu"), y.to("tpu"), rtol=1e-4)
        assert got.shape == expected.shape
        assert torch.equal(got.cpu(), expected)
    assert torch.allclose(a.to("tpu"), a.to("tpu") + 1e-9) is True
    assert torch.allclose(a.to("tpu"), a.to("tpu") + 1) is False


@pytest.mark.parametrize(
    "call",
    [
        lambda dev: torch.isclose(
            torch.ones(3, device=dev), torch.ones(3, dtype=torch.float64, device=dev)
        ),
        lambda dev: torch.isclose(torch.ones(3, device=dev), torch.ones(3, device=dev), rtol=-1.0),
        lambda dev: torch.isclose(torch.ones(3, device=dev), torch.ones(3, device=dev), atol=-1e-3),
    ],
    ids=["dtypes", "rtol", "atol"],
)
def test_isclose_refuses_what_cpu_refuses(eager_mode, call):
    with pytest.raises(Exception) as on_cpu:
        call("cpu")
    with pytest.raises(type(on_cpu.value)) as on_tpu:
        call("tpu")
        torch.tpu.synchronize()
    assert str(on_cpu.value) in str(on_tpu.value)  # (debug mode adds the op and its line)


def test_isclose_at_a_new_shape_compiles_one_program():
    """PyTorch's decomposition would run (and compile) eleven ops one by one."""
    a = torch.randn(3, 17, 11, device="tpu")
    b = a + 1e-7
    torch.tpu.synchronize()
    before = len(torch_tpu.metrics.compiles())
    with torch.tpu.set_eager_mode("strict"):
        close = torch.isclose(a, b, rtol=2e-5, atol=3e-7)
        torch.tpu.synchronize()
    names = [event.name for event in torch_tpu.metrics.compiles()[before:]]
    assert set(names) <= {"aten::isclose.default"} and len(names) <= 1, names
    assert torch.equal(close.cpu(), torch.isclose(a.cpu(), b.cpu(), rtol=2e-5, atol=3e-7))
