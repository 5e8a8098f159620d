"""Ops run by the CPU fallback (engine/fallback.py) keep the executor's device rule:
a tensor on another device than the call's tpu tensors (an out= on the CPU, a CPU
matrix) raises CUDA's "Expected all tensors to be on the same device" naming both,
where the fallback had written the result into the CPU out= or read the CPU operand;
a CPU scalar (0-dim) is still read and CPU indices still taken, as on CUDA."""

from __future__ import annotations

import warnings

import pytest
import torch

import torch_tpu  # noqa: F401

_SAME_DEVICE = r"Expected all tensors to be on the same device, .* tpu:0 and cpu!"

_lib = torch.library.Library("tpu_fallback_device_test", "DEF")
_lib.define("mul(Tensor x, Tensor y) -> Tensor")
_lib.define("mul.out(Tensor x, Tensor y, *, Tensor(a!) out) -> Tensor(a!)")
_lib.define("pick(Tensor x, Tensor?[] indices) -> Tensor")
_lib.impl("mul", lambda x, y: x * y, "CPU")
_lib.impl("mul.out", lambda x, y, *, out: torch.mul(x, y, out=out), "CPU")
_lib.impl("pick", lambda x, indices: x[indices], "CPU")
_ops = torch.ops.tpu_fallback_device_test


@pytest.fixture(autouse=True)
def _quiet_fallback():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the fallback's warning, once per op)
        yield


def _x(*shape):
    return torch.rand(*shape, device="tpu") + 0.5


# out= targets on the CPU, per op that tpu runs by its CPU fallback (or by a PyTorch
# decomposition, whose out= wrapper raised "cross-device copies are not allowed")
CPU_OUT = {
    "histogram": lambda: torch.histogram(_x(10), bins=4, out=(torch.empty(4), torch.empty(5))),
    "linalg.eig": lambda: torch.linalg.eig(
        _x(3, 3), out=(torch.empty(3, dtype=torch.cfloat), torch.empty(3, 3, dtype=torch.cfloat))
    ),
    "linalg.eigvals": lambda: torch.linalg.eigvals(
        _x(3, 3), out=torch.empty(3, dtype=torch.cfloat)
    ),
    "linalg.ldl_factor": lambda: torch.linalg.ldl_factor(
        _x(3, 3) + 3 * torch.eye(3, device="tpu"),
        out=(torch.empty(3, 3), torch.empty(3, dtype=torch.int32)),
    ),
    **{
        f"special.{name}": (lambda fn: lambda: fn(_x(4), out=torch.empty(4)))(
            getattr(torch.special, name)
        )
        for name in (
            "bessel_j0",
            "bessel_j1",
            "bessel_y0",
            "bessel_y1",
            "modified_bessel_i0",
            "modified_bessel_i1",
            "modified_bessel_k0",
            "modified_bessel_k1",
            "scaled_modified_bessel_k0",
            "scaled_modified_bessel_k1",
            "spherical_bessel_j0",
            "airy_ai",
        )
    },
    "custom op out=": lambda: _ops.mul(_x(3), _x(3), out=torch.empty(3)),
}


@pytest.mark.parametrize("case", list(CPU_OUT))
def test_a_cpu_out_of_an_op_the_fallback_runs_is_refused_as_cuda_refuses_it(case):
    with pytest.raises(RuntimeError, match=_SAME_DEVICE):
        CPU_OUT[case]()


def test_a_refused_cpu_out_is_left_unwritten():
    out = torch.zeros(4)
    with pytest.raises(RuntimeError, match=_SAME_DEVICE):
        torch.special.bessel_y0(_x(4), out=out)
    assert out.eq(0).all()


def test_a_tpu_out_of_an_op_the_fallback_runs_still_gets_the_result():
    x = _x(4)
    out = torch.empty(4, device="tpu")
    assert torch.special.bessel_y0(x, out=out) is out
    torch.testing.assert_close(out.cpu(), torch.special.bessel_y0(x.cpu()))
    hist, edges = torch.histogram(
        x, bins=3, out=(torch.empty(3, device="tpu"), torch.empty(4, device="tpu"))
    )
    expected = torch.histogram(x.cpu(), bins=3)
    torch.testing.assert_close(hist.cpu(), expected.hist)
    torch.testing.assert_close(edges.cpu(), expected.bin_edges)


def test_a_cpu_operand_of_an_op_the_fallback_runs_is_refused():
    with pytest.raises(RuntimeError, match=_SAME_DEVICE):
        _ops.mul(_x(3), torch.rand(3))
    with pytest.raises(RuntimeError, match=_SAME_DEVICE):
        _ops.mul(torch.rand(3), _x(3))
    with pytest.raises(RuntimeError, match=_SAME_DEVICE):
        torch.histogram(_x(10), bins=torch.tensor([0.0, 1.0, 2.0]))


def test_the_fallback_reads_a_cpu_scalar_and_cpu_indices_as_cuda_does():
    x = _x(3)
    result = _ops.mul(x, torch.tensor(2.0))
    assert result.device.type == "tpu"
    torch.testing.assert_close(result.cpu(), x.cpu() * 2)
    picked = _ops.pick(x, [torch.tensor([2, 0])])
    assert picked.device.type == "tpu"
    torch.testing.assert_close(picked.cpu(), x.cpu()[[2, 0]])


def test_a_cpu_scalar_written_by_the_fallback_is_refused():
    out = torch.tensor(0.0)
    with pytest.raises(RuntimeError, match=_SAME_DEVICE):
        _ops.mul(torch.tensor(2.0, device="tpu"), torch.tensor(3.0, device="tpu"), out=out)
    assert out.item() == 0.0


def test_cpu_calls_of_those_ops_are_untouched():
    out = torch.empty(4)
    torch.special.bessel_y0(torch.rand(4) + 0.5, out=out)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(
        _ops.mul(torch.ones(2), torch.full((2,), 3.0)), torch.full((2,), 3.0)
    )
