"""Fractional max pooling (ops/fractional_pool.py) against CPU. The caller draws the
windows' random offsets (`_random_samples`); given the same ones, tpu must give CPU's
values, indices (NaN and -inf windows included) and gradients exactly, in every float
dtype, batched or not, and refuse what CPU refuses in CPU's words. A test in which a
tpu op ran on the CPU fallback fails (`no_cpu_fallback`)."""

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.usefixtures("no_cpu_fallback")

# (input shape, kernel, output): overlapping windows, disjoint ones, one window, and
# windows of one element covering the input (3-D needs output + kernel - 1 < input)
CASES = {
    2: [((2, 3, 11, 13), 2, 4), ((3, 9, 10), 3, 3), ((1, 2, 7, 7), 2, 1), ((2, 2, 6, 5), 1, 5)],
    3: [((2, 2, 7, 8, 9), 2, 4), ((2, 6, 7, 5), 2, 3), ((1, 1, 6, 6, 6), 3, 1)],
}


def _op(dims: int, backward: bool = False):
    name = f"fractional_max_pool{dims}d" + ("_backward" if backward else "")
    return getattr(torch.ops.aten, name)


@pytest.mark.parametrize("dims", [2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_values_indices_and_gradients_match_cpu(dims, dtype):
    g = torch.Generator().manual_seed(0)
    for shape, kernel, out in CASES[dims]:
        kernel, out = [kernel] * dims, [out] * dims
        x = torch.randn(shape, generator=g).to(dtype)
        flat = x.view(-1)
        flat[3], flat[5], flat[7] = float("nan"), float("nan"), float("-inf")
        batch = 1 if x.dim() == dims + 1 else shape[0]
        samples = torch.rand(batch, shape[-dims - 1], dims, generator=g).to(dtype)
        values, indices = _op(dims)(x, kernel, out, samples)
        got_values, got_indices = _op(dims)(x.to("tpu"), kernel, out, samples.to("tpu"))
        assert torch.equal(got_indices.cpu(), indices), (shape, kernel, out)
        torch.testing.assert_close(got_values.cpu(), values, rtol=0, atol=0, equal_nan=True)
        grad = torch.randn(values.shape, generator=g).to(dtype)
        expected = _op(dims, True)(grad, x, kernel, out, indices)
        got = _op(dims, True)(grad.to("tpu"), x.to("tpu"), kernel, out, got_indices)
        torch.testing.assert_close(got.cpu(), expected)


def test_module_gradient_through_autograd_matches_cpu():
    x = torch.randn(2, 3, 12, 10, generator=torch.Generator().manual_seed(1))
    samples = torch.rand(2, 3, 2, generator=torch.Generator().manual_seed(2))
    grads = []
    for device in ("cpu", "tpu"):
        leaf = x.detach().to(device).requires_grad_()
        out = F.fractional_max_pool2d(
            leaf, 3, output_ratio=(0.5, 0.5), _random_samples=samples.to(device)
        )
        (out * out).sum().backward()
        grads.append(leaf.grad.cpu())
    torch.testing.assert_close(grads[1], grads[0])


def test_refuses_as_cpu():
    x2, x3 = torch.randn(2, 3, 11, 13), torch.randn(2, 2, 7, 8, 9)
    cases = [
        (2, x2, [2, 2], [11, 4], torch.rand(2, 3, 2)),  # window too tall
        (2, x2, [2, 2], [4, 13], torch.rand(2, 3, 2)),  # too wide
        (2, x2, [2, 2], [4, 4], torch.rand(2, 3, 2).double()),  # samples' dtype
        (2, x2, [2, 2], [4, 4], torch.rand(1, 3, 2)),  # samples' batch
        (3, x3, [1, 1, 1], [7, 8, 9], torch.rand(2, 2, 3)),
        (3, x3, [2, 2, 2], [4, 7, 4], torch.rand(2, 2, 3)),
    ]
    for dims, x, kernel, out, samples in cases:
        with pytest.raises(RuntimeError) as on_cpu:
            _op(dims)(x, kernel, out, samples)
        with pytest.raises(RuntimeError) as on_tpu:
            _op(dims)(x.to("tpu"), kernel, out, samples.to("tpu"))
        assert str(on_tpu.value) == str(on_cpu.value)
