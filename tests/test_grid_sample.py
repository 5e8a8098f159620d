"""Grid sampling (ops/grid_sample.py) agrees with CPU: 3-D values and both gradients in
every interpolation, padding and align_corners setting, the 2-D gradients, CPU's edge
rules, on the device (they ran on the CPU before)."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_same_error

_SETTINGS = list(
    itertools.product(("bilinear", "nearest"), ("zeros", "border", "reflection"), (False, True))
)


def _inputs(dtype=torch.float32):
    """A volume and a grid reaching past [-1, 1], with points exactly on the volume's
    faces and corners (where the clamps' gradients change)."""
    g = torch.Generator().manual_seed(0)
    volume = torch.randn(2, 3, 4, 5, 6, generator=g, dtype=dtype)
    grid = torch.rand(2, 3, 2, 4, 3, generator=g, dtype=dtype) * 2.6 - 1.3
    grid[0, 0, 0, :2] = torch.tensor([[1.0, -1.0, 0.0], [-1.0, 1.0, 1.0]], dtype=dtype)
    return volume, grid


def _assert_matches_cpu(fn, inputs: tuple, weights: torch.Tensor) -> None:
    """fn(*inputs) on CPU and tpu: the outputs, and the gradients of the outputs weighted
    by `weights` (so each output's gradient counts) with respect to every input."""
    results = []
    for device in ("cpu", "tpu"):
        leaves = [t.detach().to(device).requires_grad_() for t in inputs]
        out = fn(*leaves)
        (out * weights.to(device)).sum().backward()
        results.append([out.detach().cpu(), *(t.grad.cpu() for t in leaves)])
    for cpu, tpu in zip(*results):
        torch.testing.assert_close(tpu, cpu, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode, padding, align", _SETTINGS)
def test_grid_sample_3d_and_its_gradients_match_cpu(mode, padding, align, no_cpu_fallback):
    _assert_matches_cpu(
        lambda v, g: F.grid_sample(v, g, mode=mode, padding_mode=padding, align_corners=align),
        _inputs(),
        torch.randn(2, 3, 3, 2, 4),
    )


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
def test_grid_sample_2d_gradients_match_cpu(mode, padding, no_cpu_fallback):
    """The 2-D forward is PyTorch's decomposition; its backward op ran on the CPU."""
    g = torch.Generator().manual_seed(1)
    image = torch.randn(2, 3, 5, 6, generator=g)
    grid = torch.rand(2, 4, 3, 2, generator=g) * 2.6 - 1.3
    grid[1, 0, 0] = torch.tensor([1.0, -1.0])
    _assert_matches_cpu(
        lambda v, p: F.grid_sample(v, p, mode=mode, padding_mode=padding, align_corners=False),
        (image, grid),
        torch.randn(2, 3, 4, 3, generator=g),
    )


def test_only_the_needed_gradient(no_cpu_fallback):
    """A volume that needs no gradient gets none (CPU's output_mask), the grid's is CPU's."""
    volume, grid = _inputs()
    results = []
    for device in ("cpu", "tpu"):
        g = grid.detach().to(device).requires_grad_()
        F.grid_sample(volume.to(device), g, align_corners=False).sum().backward()
        results.append(g.grad.cpu())
    torch.testing.assert_close(results[1], results[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
def test_a_nan_coordinate_reads_as_on_cpu(padding, no_cpu_fallback):
    """Zeros padding drops the tap; border and reflection clamp NaN to the last index (CPU's
    min/max), so the output is a number, not NaN."""
    volume, grid = _inputs()
    grid[1, 2, 1, 3] = torch.tensor([float("nan"), 0.2, 0.5])
    expected = F.grid_sample(volume, grid, padding_mode=padding, align_corners=False)
    got = F.grid_sample(volume.to("tpu"), grid.to("tpu"), padding_mode=padding, align_corners=False)
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_other_dtypes(dtype, no_cpu_fallback):
    volume, grid = _inputs(dtype)
    expected = F.grid_sample(volume, grid, align_corners=True)
    got = F.grid_sample(volume.to("tpu"), grid.to("tpu"), align_corners=True).cpu()
    tolerance = {"rtol": 0.02, "atol": 0.02} if dtype == torch.bfloat16 else {}
    torch.testing.assert_close(got, expected, **tolerance)


def test_bicubic_other_dtypes_and_mixed_dtypes_are_refused_as_on_cpu():
    volume, grid = _inputs()
    assert_same_error(
        lambda d: F.grid_sample(volume.to(d), grid.to(d), mode="bicubic", align_corners=False)
    )
    for dtype in (torch.int64, torch.bool, torch.complex64):
        assert_same_error(
            lambda d, t=dtype: torch.ops.aten.grid_sampler_3d(
                volume.to(d, t), grid.to(d, t), 0, 0, False
            )
        )
    assert_same_error(
        lambda d: F.grid_sample(volume.to(d), grid.to(d, torch.float64), align_corners=False)
    )
