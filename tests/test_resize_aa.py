"""Antialiased resizing (ops/resize_aa.py) against CPU: forward in float32, float64 and
uint8, gradients, scale factors, inf/NaN pixels, half images (computed, as CUDA) and
CPU's refusals of integers. A test in which a tpu op ran on the CPU fallback fails
(`no_cpu_fallback`)."""


import pytest
import torch
import torch.nn.functional as F

MODES = ("bilinear", "bicubic", "lanczos")
# (input shape, output size): down, up, mixed, one axis unchanged, big downscale
RESIZES = [
    ((2, 3, 32, 40), (15, 17)),
    ((1, 2, 9, 11), (20, 25)),
    ((1, 3, 64, 48), (8, 31)),
    ((1, 1, 12, 7), (12, 3)),
    ((1, 4, 100, 80), (13, 7)),
]


pytestmark = pytest.mark.usefixtures("no_cpu_fallback")


def _aa_op(mode):
    return getattr(torch.ops.aten, f"_upsample_{mode}2d_aa")


def _image(shape, dtype):
    x = torch.rand(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    return (x * 255).round().to(dtype) if dtype == torch.uint8 else x.to(dtype)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.uint8])
@pytest.mark.parametrize("align_corners", [False, True])
def test_forward_matches_cpu(mode, dtype, align_corners):
    for shape, size in RESIZES:
        x = _image(shape, dtype)
        expected = _aa_op(mode)(x, list(size), align_corners, None, None)
        got = _aa_op(mode)(x.to("tpu"), list(size), align_corners, None, None).cpu()
        if dtype == torch.uint8:  # CPU's integer arithmetic, reproduced exactly
            assert torch.equal(got, expected), (shape, size)
        else:  # (float sums can round a few units apart: CPU contracts to FMAs)
            tolerance = 1e-6 if dtype == torch.float32 else 1e-13
            torch.testing.assert_close(
                got, expected, rtol=tolerance, atol=tolerance, msg=str((shape, size))
            )


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gradients_match_cpu(mode, dtype):
    for shape, size in RESIZES[:3]:
        x = _image(shape, dtype)
        weights = _image((shape[0], shape[1], *size), dtype) - 0.5
        grads = []
        for device in ("cpu", "tpu"):
            leaf = x.detach().to(device).requires_grad_()
            out = F.interpolate(leaf, size=size, mode=mode, antialias=True)
            (out * weights.to(device)).sum().backward()
            grads.append(leaf.grad.cpu())
        torch.testing.assert_close(grads[1], grads[0], msg=str((shape, size)))


@pytest.mark.parametrize("mode", MODES)
def test_scale_factors_match_cpu(mode):
    """F.interpolate passes a scale factor on to the kernel, which uses it in place of
    the size ratio (0.37 of 40 rows is not 14 / 40)."""
    x = _image((1, 3, 40, 50), torch.float32)
    for factor in (0.37, (0.5, 1.7), 2.25):
        expected = F.interpolate(x, scale_factor=factor, mode=mode, antialias=True)
        got = F.interpolate(x.to("tpu"), scale_factor=factor, mode=mode, antialias=True)
        torch.testing.assert_close(got.cpu(), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_inf_and_nan_pixels_spread_as_on_cpu(mode):
    """A tap outside an output's window is skipped, not weighted by 0: an inf pixel must
    not make NaN of the outputs whose windows miss it."""
    x = _image((1, 1, 16, 24), torch.float32)
    x[0, 0, 3, 5] = float("inf")
    x[0, 0, 11, 20] = float("nan")
    expected = F.interpolate(x, size=(5, 7), mode=mode, antialias=True)
    got = F.interpolate(x.to("tpu"), size=(5, 7), mode=mode, antialias=True).cpu()
    assert torch.equal(got.isnan(), expected.isnan())
    assert torch.equal(got.isinf(), expected.isinf())
    finite = expected.isfinite()
    torch.testing.assert_close(got[finite], expected[finite])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.int32, torch.bool])
def test_refuses_dtypes_cpu_refuses(mode, dtype):
    x = _image((1, 1, 8, 8), dtype)
    with pytest.raises(NotImplementedError) as on_cpu:
        _aa_op(mode)(x, [3, 3], False, None, None)
    with pytest.raises(NotImplementedError) as on_tpu:
        _aa_op(mode)(x.to("tpu"), [3, 3], False, None, None)
    assert str(on_tpu.value) == str(on_cpu.value)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_images_resize_as_cpus_float32_rounded(mode, dtype):
    """CPU has no half kernel (CUDA has, computing in float32): tpu resizes half images
    in float32 and rounds, forward and backward (docs/differences.md)."""
    x = _image((1, 2, 24, 20), torch.float32).to(dtype)
    expected = F.interpolate(x.float(), size=(7, 9), mode=mode, antialias=True).to(dtype)
    leaf = x.to("tpu").requires_grad_()
    got = F.interpolate(leaf, size=(7, 9), mode=mode, antialias=True)
    assert got.dtype == dtype
    torch.testing.assert_close(got.cpu(), expected)
    got.sum().backward()
    assert leaf.grad.dtype == dtype
    reference = x.float().requires_grad_()
    F.interpolate(reference, size=(7, 9), mode=mode, antialias=True).sum().backward()
    torch.testing.assert_close(leaf.grad.cpu(), reference.grad.to(dtype))
