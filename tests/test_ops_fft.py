"""torch.fft on tpu matches the CPU in every norm mode, forward and backward (real and
complex inputs, sizes given or not), without any CPU fallback."""

import pytest
import torch

import torch_tpu

TRANSFORMS = {
    "fft": lambda x, norm: torch.fft.fft(x, norm=norm),
    "fft_n": lambda x, norm: torch.fft.fft(x, n=10, dim=0, norm=norm),
    "ifft": lambda x, norm: torch.fft.ifft(x, norm=norm),
    "rfft": lambda x, norm: torch.fft.rfft(x.real, norm=norm),
    "irfft": lambda x, norm: torch.fft.irfft(x, norm=norm),
    "irfft_n": lambda x, norm: torch.fft.irfft(x, n=7, norm=norm),
    "fft2": lambda x, norm: torch.fft.fft2(x, norm=norm),
    "ifft2": lambda x, norm: torch.fft.ifft2(x, norm=norm),
    "fftn_s": lambda x, norm: torch.fft.fftn(x, s=(3, 6), norm=norm),
    "rfftn": lambda x, norm: torch.fft.rfftn(x.real, norm=norm),
    "irfftn": lambda x, norm: torch.fft.irfftn(x, norm=norm),
    "hfft": lambda x, norm: torch.fft.hfft(x, norm=norm),
    "ihfft": lambda x, norm: torch.fft.ihfft(x.real, norm=norm),
}


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.parametrize("norm", [None, "ortho", "forward", "backward"])
def test_fft(norm, mode):
    torch_tpu.metrics.reset()
    x = torch.randn(4, 8, dtype=torch.complex64)
    with torch.tpu.set_eager_mode(mode):
        for name, transform in TRANSFORMS.items():
            c = x.clone().requires_grad_()
            t = x.to("tpu").requires_grad_()
            expected, actual = transform(c, norm), transform(t, norm)
            assert actual.device.type == "tpu"
            torch.testing.assert_close(actual.detach().cpu(), expected.detach(),
                                       atol=1e-4, rtol=1e-4, msg=name)
            cotangent = torch.randn(expected.shape, dtype=expected.dtype)
            (expected * cotangent).real.sum().backward()
            (actual * cotangent.to("tpu")).real.sum().backward()
            torch.testing.assert_close(t.grad.cpu(), c.grad, atol=1e-4, rtol=1e-4, msg=name)
        torch.tpu.synchronize()
    fell = torch_tpu.metrics.snapshot()["fallback_ops"]
    assert not fell, f"ops fell back to the CPU: {sorted(fell)}"


@pytest.mark.parametrize("dim", [None, (0,), (-1,), (1, 0), (0, 2), (2, 1)])
@pytest.mark.parametrize("layout", ["contiguous", "permuted"])
def test_real_to_complex_results_have_cpus_strides(dim, layout):
    """CPU lays an rfftn result out with the batch dims outermost (in the input's stride
    order) and the transformed dims innermost, in the order given; PyTorch's meta kernel
    transposes a transform over several dims, so tpu's rfftn/rfft2 results were
    non-contiguous where CPU's are contiguous (`.view(-1)` raised). Values were equal."""
    x = torch.randn(2, 3, 8) if layout == "contiguous" else torch.randn(8, 3, 2).permute(2, 1, 0)
    for transform in (torch.fft.rfftn, torch.fft.ihfftn, lambda a, dim: torch.fft.fftn(a, dim=dim)):
        expected, actual = transform(x, dim=dim), transform(x.to("tpu"), dim=dim)
        assert actual.stride() == expected.stride()
        torch.testing.assert_close(actual.cpu(), expected, atol=1e-5, rtol=1e-5)
