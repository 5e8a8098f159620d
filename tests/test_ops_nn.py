"""nn ops on tpu match the CPU, forward and backward, without CPU fallback."""

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_same, assert_same_error, assert_same_grad, no_fallback

import torch_tpu
from torch_tpu.ops.registry import LOWERINGS

NN_OPS = {f"aten::{n}" for n, low in LOWERINGS.items() if low.fn.__module__.endswith("ops.nn")}


@pytest.fixture
def no_nn_fallback():
    """The test body may fall back for other families' ops, never for ours."""
    with no_fallback("nn", lambda op: op in NN_OPS):
        yield


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


ACTIVATIONS = {
    "relu": F.relu,
    "leaky_relu": lambda x: F.leaky_relu(x, 0.2),
    "elu": F.elu,
    "selu": F.selu,
    "celu": lambda x: F.celu(x, 0.5),
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "mish": F.mish,
    "hardtanh": F.hardtanh,
    "relu6": F.relu6,
    "hardswish": F.hardswish,
    "hardsigmoid": F.hardsigmoid,
    "hardshrink": lambda x: F.hardshrink(x, 1.5),
    "softplus": lambda x: F.softplus(x, beta=2, threshold=3),
    "logsigmoid": F.logsigmoid,
    "glu": lambda x: F.glu(x, 0),
    "prelu": lambda x: F.prelu(x, torch.full((1,), 0.25, device=x.device)),
    "softmax": lambda x: F.softmax(x, -1),
    "log_softmax": lambda x: F.log_softmax(x, 0),
}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation(name, no_nn_fallback):
    x = randn(6, 5) * 4
    assert_same(ACTIVATIONS[name], x, atol=1e-5, rtol=1e-5)
    assert_same_grad(ACTIVATIONS[name], x, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_of_signed_zeros_infinities_and_nan_matches_cpu(name, eager_mode):
    """Bit for bit where CPU's result is a zero, an infinity or NaN: relu(-0.0) gave 0.0
    (XLA's max), where CPU's clamp_min passes -0.0 through."""
    special = [-0.0, 0.0, float("inf"), -float("inf"), float("nan"), -1.0, 1.0, -0.0]
    x = torch.tensor(special * 2).view(4, 4)
    want = ACTIVATIONS[name](x)
    got = ACTIVATIONS[name](x.to("tpu")).cpu()
    if name == "gelu":  # CPU's vectorized gelu gives NaN at +inf, tpu inf (the limit)
        got, want = got[x != float("inf")], want[x != float("inf")]
    torch.testing.assert_close(got, want, equal_nan=True, atol=1e-6, rtol=1e-6)
    exact = (want == 0) | want.isinf()
    assert torch.equal(got.signbit()[exact], want.signbit()[exact])


@pytest.mark.parametrize("name", ["relu", "gelu", "silu", "softmax", "hardswish"])
def test_activation_bfloat16(name, no_nn_fallback):
    assert_same(ACTIVATIONS[name], randn(4, 8, dtype=torch.bfloat16) * 3, atol=2e-2, rtol=2e-2)


def test_softmax_half_to_float_and_scalar(no_nn_fallback):
    x = randn(3, 4, dtype=torch.bfloat16)
    assert_same(lambda t: torch.softmax(t, 1, dtype=torch.float32), x, atol=1e-2, rtol=1e-2)
    assert_same(lambda t: torch.log_softmax(t, 0), randn(()))


NORMS = {  # input (3, 4, 5, 6); weight and bias (5, 6) for layer norm, else (4,)
    "layer_norm": lambda x, w, b: F.layer_norm(x, (5, 6), w, b),
    "group_norm": lambda x, w, b: F.group_norm(x, 2, w, b),
    "batch_norm_train": lambda x, w, b: F.batch_norm(
        x, torch.zeros(4, device=x.device), torch.ones(4, device=x.device), w, b, True
    ),
    "batch_norm_eval": lambda x, w, b: F.batch_norm(
        x, torch.full((4,), 0.5, device=x.device), torch.full((4,), 2.0, device=x.device),
        w, b, False,
    ),
    "instance_norm": lambda x, w, b: F.instance_norm(x, weight=w, bias=b),
}


@pytest.mark.parametrize("name", sorted(NORMS))
def test_norm(name, no_nn_fallback):
    params = (5, 6) if name == "layer_norm" else (4,)
    x, w, b = randn(3, 4, 5, 6) * 2 + 1, randn(*params), randn(*params)
    assert_same(NORMS[name], x, w, b, atol=1e-5, rtol=1e-5)
    assert_same_grad(NORMS[name], x, w, b, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", ["layer_norm", "group_norm", "batch_norm_train"])
def test_norm_partial_grads(name, no_nn_fallback):
    """Autograd asks only for some gradients (output_mask): frozen input, or frozen affine."""
    params = (5, 6) if name == "layer_norm" else (4,)
    x, w, b = randn(3, 4, 5, 6), randn(*params), randn(*params)
    norm = NORMS[name]
    assert_same_grad(lambda w, b: norm(to_device(x, w), w, b), w, b, atol=1e-4, rtol=1e-4)
    frozen = lambda x: norm(x, to_device(w, x), to_device(b, x))  # noqa: E731
    assert_same_grad(frozen, x, atol=1e-4, rtol=1e-4)


def test_norm_without_affine(no_nn_fallback):
    x = randn(2, 4, 7)
    assert_same_grad(lambda t: F.layer_norm(t, (7,)), x, atol=1e-5, rtol=1e-5)
    assert_same_grad(lambda t: F.group_norm(t, 4), x, atol=1e-5, rtol=1e-5)
    assert_same_grad(lambda t: F.batch_norm(t, None, None, training=True), x, atol=1e-5, rtol=1e-5)


def test_layer_norm_bfloat16(no_nn_fallback):
    x, w = randn(4, 16, dtype=torch.bfloat16), randn(16, dtype=torch.bfloat16)
    assert_same(lambda t, s: F.layer_norm(t, (16,), s), x, w, atol=5e-2, rtol=5e-2)


def test_batch_norm_updates_running_stats(no_nn_fallback):
    bn = torch.nn.BatchNorm2d(3, momentum=0.3)
    tpu_bn = torch.nn.BatchNorm2d(3, momentum=0.3).to("tpu")
    for _ in range(2):
        x = randn(4, 3, 5, 5) * 3 + 2
        torch.testing.assert_close(tpu_bn(x.to("tpu")).cpu(), bn(x), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(tpu_bn.running_mean.cpu(), bn.running_mean)
    torch.testing.assert_close(tpu_bn.running_var.cpu(), bn.running_var)
    assert int(tpu_bn.num_batches_tracked) == 2
    bn.eval(), tpu_bn.eval()
    x = randn(2, 3, 5, 5)
    torch.testing.assert_close(tpu_bn(x.to("tpu")).cpu(), bn(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dim", [0, 1])
def test_log_softmax_half_rounds_like_cpu(dtype, dim, no_nn_fallback):
    """CPU's last-dim kernel stores the sum of exponentials (and its log) in half before
    subtracting: the max of [1.82, -3.52, -4.41, 2.33, 8.38] gives exactly 0, not -0.0038."""
    x = torch.tensor([[1.8203, -3.5156, -4.4062, 2.3281, 8.375], [3.2656, -3.8906, 2.8, -4.7, 4.2]])
    x = torch.cat([x, (randn(6, 5) * 5)]).to(dtype)
    assert_same(lambda t: F.log_softmax(t, dim), x, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fn", [F.silu, F.mish], ids=["silu", "mish"])
def test_half_silu_and_mish_backward_as_cpu(fn, dtype, eager_mode):
    """CPU's backward kernels compute halves in float32; PyTorch's decomposition of them,
    which a PrivateUse1 device gets, rounded each step to the half type (1-2 units in the
    last place apart). A double backward still differentiates the decomposition."""
    x, g = randn(300, dtype=dtype) * 4, randn(300, dtype=dtype)
    assert_same_grad(lambda t, w: fn(t) * w, x, g, atol=0, rtol=0)

    def second(t):
        first = torch.autograd.grad(fn(t).float().sum(), t, create_graph=True)[0]
        return torch.autograd.grad((first.float() ** 2).sum(), t)[0]

    cpu = second(x.float().requires_grad_())
    tpu = second(x.float().to("tpu").requires_grad_())
    torch.testing.assert_close(tpu.cpu(), cpu)


def test_layer_norm_grad_over_one_element(no_nn_fallback):
    """Normalizing a single element: CPU's weight gradient is dy * (rstd * x - rstd * mean),
    not exactly 0 (-2.4e-5 here)."""
    x, w, b = torch.tensor([-4.3228]), torch.tensor([-8.4784]), torch.tensor([-1.7658])
    assert_same_grad(lambda *a: F.layer_norm(a[0], (1,), a[1], a[2]), x, w, b, atol=1e-7, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(4, 3, 5, 7), (257, 2), (3, 4, 100)])
def test_batch_norm_half_bit_exact(dtype, shape, no_nn_fallback):
    """Output and running statistics match CPU exactly: the saved mean/invstd are rounded
    to the parameter dtype before out = x * alpha + beta (bfloat16 also rounds var_sum)."""
    x = (randn(*shape) * 3 + 1).to(dtype)
    w, b, rm, rv = (randn(shape[1]).to(dtype) for _ in range(4))
    rv = rv.abs() + 1
    results = []
    for device in ("cpu", "tpu"):
        stats = [rm.clone().to(device), rv.clone().to(device)]
        out = F.batch_norm(x.to(device), *stats, w.to(device), b.to(device), True, 0.3, 1e-5)
        results.append([t.cpu() for t in (out, *stats)])
    for actual, expected in zip(results[1], results[0]):
        torch.testing.assert_close(actual, expected, atol=0, rtol=0)


def test_dropout(no_nn_fallback):
    x = torch.ones(64, 64, device="tpu", requires_grad=True)
    y = F.dropout(x, 0.25)
    kept = y.detach().cpu() != 0
    assert 0.6 < kept.float().mean() < 0.9
    torch.testing.assert_close(y.detach().cpu()[kept], torch.full((int(kept.sum()),), 4 / 3))
    y.sum().backward()
    torch.testing.assert_close(x.grad.cpu(), kept.float() * 4 / 3)
    assert not torch.equal(F.dropout(x, 0.25).cpu(), y.detach().cpu())  # a fresh mask each call
    assert torch.equal(F.dropout(x, 0.25, training=False).cpu(), x.detach().cpu())


@pytest.mark.parametrize("padding_idx, scale", [(None, False), (2, True)])
def test_embedding(padding_idx, scale, no_nn_fallback):
    indices = torch.tensor([[1, 2, 4], [4, 3, 1]])
    fn = lambda w: F.embedding(  # noqa: E731
        indices.to(w.device), w, padding_idx=padding_idx, scale_grad_by_freq=scale
    )
    assert_same(fn, randn(6, 3))
    assert_same_grad(fn, randn(6, 3))


@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf")])
def test_embedding_max_norm(norm_type, no_nn_fallback):
    """max_norm renormalises the looked-up rows of the weight in place (embedding_renorm_)."""
    indices = torch.tensor([[1, 3, 3], [5, 0, 1]])
    weight = randn(6, 4) * 3
    tpu_weight = weight.to("tpu")
    fn = lambda w: F.embedding(indices.to(w.device), w, max_norm=1.5, norm_type=norm_type)  # noqa: E731
    torch.testing.assert_close(fn(tpu_weight).cpu(), fn(weight))
    torch.testing.assert_close(tpu_weight.cpu(), weight)  # rows 1, 3, 5, 0 were rescaled
    assert_same_grad(fn, randn(6, 4) * 3)


LOSSES = {
    "cross_entropy": lambda x, t: F.cross_entropy(x, t.argmax(1)),
    "cross_entropy_weighted_ignore": lambda x, t: F.cross_entropy(
        x, t.argmax(1).masked_fill(t[:, 0] > 0, -100), weight=torch.arange(1.0, 6, device=x.device)
    ),
    "cross_entropy_sum": lambda x, t: F.cross_entropy(x, t.argmax(1), reduction="sum"),
    "nll_none": lambda x, t: F.nll_loss(x, t.argmax(1), reduction="none"),
    "cross_entropy_2d": lambda x, t: F.cross_entropy(  # nll_loss2d: (N, C, H, W) logits
        x.reshape(2, 2, 1, 5).permute(0, 3, 1, 2), t.reshape(2, 2, 1, 5).argmax(3)
    ),
    "mse": F.mse_loss,
    "mse_sum": lambda x, t: F.mse_loss(x, t, reduction="sum"),
    "l1": F.l1_loss,
    "smooth_l1": lambda x, t: F.smooth_l1_loss(x, t, beta=0.5),
    "smooth_l1_zero_beta": lambda x, t: torch.ops.aten.smooth_l1_loss(x, t, 1, 0.0),  # F: l1
    "huber": lambda x, t: F.huber_loss(x, t, reduction="none", delta=0.7),
    "bce": lambda x, t: F.binary_cross_entropy(torch.sigmoid(x), torch.sigmoid(t)),
    "bce_weighted": lambda x, t: F.binary_cross_entropy(
        torch.sigmoid(x), torch.sigmoid(t), weight=torch.sigmoid(t), reduction="sum"
    ),
    "bce_logits": lambda x, t: F.binary_cross_entropy_with_logits(x, torch.sigmoid(t)),
    "bce_logits_pos_weight": lambda x, t: F.binary_cross_entropy_with_logits(
        x, torch.sigmoid(t), pos_weight=torch.arange(1.0, 6, device=x.device)
    ),
    "multi_margin": lambda x, t: F.multi_margin_loss(x, t.argmax(1)),
    "multi_margin_p2_weighted_none": lambda x, t: F.multi_margin_loss(
        x, t.argmax(1), p=2, margin=0.7, weight=torch.arange(1.0, 6, device=x.device),
        reduction="none",
    ),
    # classes listed up to the first -1 (three per sample here), repeats allowed
    "multilabel_margin": lambda x, t: F.multilabel_margin_loss(x, _labels(t)),
    "multilabel_margin_none": lambda x, t: F.multilabel_margin_loss(
        x, _labels(t), reduction="none"
    ),
}


def _labels(t):
    return torch.where(torch.arange(5, device=t.device) < 3, t.argsort(1) % 4, -1)


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_loss(name, no_nn_fallback):
    x, t = randn(4, 5) * 2, randn(4, 5)
    assert_same(LOSSES[name], x, t, atol=1e-5, rtol=1e-5)
    assert_same_grad(lambda a: LOSSES[name](a, to_device(t, a)), x, atol=1e-5, rtol=1e-5)


def to_device(t, like):
    return t.to(like.device)


CONVS = [
    # (dims, in, out, kernel, kwargs)
    (1, 4, 6, 3, {"stride": 2, "dilation": 2}),
    (2, 4, 6, (3, 5), {"dilation": (2, 1), "groups": 2, "padding": "same"}),
    (3, 2, 4, 2, {"stride": (1, 2, 1), "padding": 1}),
]


@pytest.mark.parametrize("dims, c_in, c_out, k, kwargs", CONVS)
def test_conv(dims, c_in, c_out, k, kwargs, no_nn_fallback):
    conv = getattr(F, f"conv{dims}d")
    kernel = (k,) * dims if isinstance(k, int) else k
    x = randn(2, c_in, *(7,) * dims)
    w = randn(c_out, c_in // kwargs.get("groups", 1), *kernel)
    b = randn(c_out)
    assert_same(lambda *a: conv(*a, **kwargs), x, w, b, atol=1e-4, rtol=1e-4)
    assert_same_grad(lambda *a: conv(*a, **kwargs), x, w, b, atol=1e-4, rtol=1e-4)


CONV_TRANSPOSES = [
    (1, {"stride": 3, "groups": 2, "dilation": 2}),
    (2, {"stride": (2, 3), "padding": 1, "output_padding": (1, 0)}),
]


@pytest.mark.parametrize("dims, kwargs", CONV_TRANSPOSES)
def test_conv_transpose(dims, kwargs, no_nn_fallback):
    conv = getattr(F, f"conv_transpose{dims}d")
    x, w = randn(2, 4, *(5,) * dims), randn(4, 3, *(3,) * dims)
    b = randn(3 * kwargs.get("groups", 1))
    assert_same(lambda *a: conv(*a, **kwargs), x, w, b, atol=1e-4, rtol=1e-4)
    assert_same_grad(lambda *a: conv(*a, **kwargs), x, w, b, atol=1e-4, rtol=1e-4)


def test_conv_bfloat16(no_nn_fallback):
    x, w = randn(1, 3, 8, 8, dtype=torch.bfloat16), randn(4, 3, 3, 3, dtype=torch.bfloat16)
    assert_same(F.conv2d, x, w, atol=5e-2, rtol=5e-2)


def test_conv_transpose_bfloat16_accumulates_in_float32(no_nn_fallback):
    """bfloat16 convolutions accumulate in float32 and round once: equal to the float64
    result rounded to bfloat16 (CPU's bfloat16 conv_transpose does not, so compare to that)."""
    x, w = randn(2, 2, 4, 4, dtype=torch.bfloat16) * 5, randn(2, 2, 4, 5, dtype=torch.bfloat16) * 5
    kwargs = dict(stride=(3, 2), padding=(1, 2), output_padding=(2, 3), groups=2, dilation=(4, 4))
    exact = F.conv_transpose2d(x.double(), w.double(), **kwargs).to(torch.bfloat16)
    actual = F.conv_transpose2d(x.to("tpu"), w.to("tpu"), **kwargs).cpu()
    torch.testing.assert_close(actual, exact, atol=0, rtol=0)


POOLS = {
    "max2d_pad_stride_dil": lambda x: F.max_pool2d(x, 3, stride=2, padding=1, dilation=2),
    "max2d_ceil": lambda x: F.max_pool2d(x, 3, stride=2, ceil_mode=True),
    "max2d_indices": lambda x: F.max_pool2d(x, (2, 3), return_indices=True),
    "max3d": lambda x: F.max_pool3d(x[:, None], 2, padding=1, return_indices=True),
    "avg2d_pad": lambda x: F.avg_pool2d(x, 3, stride=2, padding=1),
    "avg2d_pad_exclude_ceil": lambda x: F.avg_pool2d(
        x, 3, stride=2, padding=1, ceil_mode=True, count_include_pad=False
    ),
    "avg2d_divisor": lambda x: F.avg_pool2d(x, 2, divisor_override=3),
    "avg3d": lambda x: F.avg_pool3d(x[:, None], 2, stride=1, padding=1, ceil_mode=True),
    "adaptive_avg2d": lambda x: F.adaptive_avg_pool2d(x, (3, 4)),
    "adaptive_avg1d": lambda x: F.adaptive_avg_pool1d(x.flatten(2), 5),
    "adaptive_avg3d": lambda x: F.adaptive_avg_pool3d(x[:, None], (2, 3, 4)),
    "adaptive_max2d": lambda x: F.adaptive_max_pool2d(x, (3, 4), return_indices=True),
    "adaptive_max3d": lambda x: F.adaptive_max_pool3d(x[:, None], 2),
}


@pytest.mark.parametrize("name", sorted(POOLS))
def test_pool(name, no_nn_fallback):
    x = randn(2, 3, 7, 9)
    assert_same(POOLS[name], x, atol=1e-5, rtol=1e-5)
    assert_same_grad(POOLS[name], x, atol=1e-5, rtol=1e-5)


def test_max_pool_unbatched_and_bfloat16(no_nn_fallback):
    assert_same(lambda x: F.max_pool2d(x, 2, return_indices=True), randn(3, 6, 6))
    assert_same(lambda x: F.max_pool2d(x, 2), randn(1, 3, 6, 6, dtype=torch.bfloat16))


_NEG_INF, _NAN = float("-inf"), float("nan")
# which element a max pool reports where the window's maximum is ambiguous: CPU's
# kernel scans input elements only (padding never wins a tie), keeps the first maximum
# and the last NaN; tpu reported padding positions (negative or wrong indices, so the
# gradient and max_unpool landed elsewhere) and the first NaN
AMBIGUOUS_MAXIMA = {
    "all -inf with padding": lambda d: F.max_pool2d(
        torch.full((1, 1, 3, 3), _NEG_INF, device=d), 3, 1, 1, return_indices=True
    ),
    "int32 lowest with padding": lambda d: F.max_pool2d(
        torch.full((1, 1, 3, 3), -(2**31), dtype=torch.int32, device=d), 3, 1, 1,
        return_indices=True,
    ),
    "-inf rows, ceil_mode": lambda d: F.max_pool2d(
        torch.tensor([[[[1.0, _NEG_INF, _NEG_INF], [2.0, _NEG_INF, _NEG_INF]]]], device=d),
        2, 2, ceil_mode=True, return_indices=True,
    ),
    "two NaNs": lambda d: F.max_pool1d(
        torch.tensor([[_NAN, 1.0, _NAN, 2.0]], device=d), 4, return_indices=True
    ),
    "NaN then larger": lambda d: F.max_pool2d(
        torch.tensor([[[[1.0, _NAN, 3.0, 2.0]]]], device=d), (1, 4), return_indices=True
    ),
    "3d -inf with padding": lambda d: F.max_pool3d(
        torch.full((1, 1, 2, 2, 2), _NEG_INF, device=d), 3, 1, 1, return_indices=True
    ),
    "adaptive two NaNs": lambda d: F.adaptive_max_pool2d(
        torch.tensor([[[[_NAN, 1.0], [_NAN, 2.0]]]], device=d), 1, return_indices=True
    ),
    "max_unpool of -inf windows": lambda d: F.max_unpool2d(
        *F.max_pool2d(torch.full((1, 1, 4, 4), _NEG_INF, device=d), 3, 2, 1, return_indices=True),
        3, 2, 1, output_size=(4, 4),
    ),
}


@pytest.mark.parametrize("case", AMBIGUOUS_MAXIMA)
def test_max_pool_reports_cpus_element_for_ambiguous_maxima(case, eager_mode):
    fn = AMBIGUOUS_MAXIMA[case]
    torch.testing.assert_close(fn("tpu"), fn("cpu"), equal_nan=True, check_device=False)


def test_max_pool_gradient_of_an_all_inf_window_goes_to_cpus_element(eager_mode):
    def grad(device):
        x = torch.full((1, 1, 3, 3), _NEG_INF, device=device, requires_grad=True)
        F.max_pool2d(x, 3, 1, 1).sum().backward()
        return x.grad

    torch.testing.assert_close(grad("tpu").cpu(), grad("cpu"))


EMPTY_POOLS = {
    "max_pool2d zero batch backward": lambda d: _pool_grad(d, lambda x: F.max_pool2d(x, 2)),
    "max_pool3d zero batch backward": lambda d: _pool_grad(
        d, lambda x: F.max_pool3d(x[:, None], 2)
    ),
    "adaptive_max_pool2d zero batch": lambda d: _pool_grad(
        d, lambda x: F.adaptive_max_pool2d(x, 2)
    ),
    "adaptive_max_pool2d output size 0": lambda d: F.adaptive_max_pool2d(
        torch.ones(1, 2, 4, 4, device=d), (0, 2), return_indices=True
    ),
    "adaptive_max_pool3d output size 0": lambda d: F.adaptive_max_pool3d(
        torch.ones(1, 2, 4, 4, 4, device=d), (2, 0, 2), return_indices=True
    ),
    "max_unpool2d zero batch": lambda d: F.max_unpool2d(
        torch.ones(0, 1, 2, 2, device=d), torch.zeros(0, 1, 2, 2, dtype=torch.long, device=d), 2
    ),
}


def _pool_grad(device, pool):
    x = torch.ones(0, 2, 4, 4, device=device, requires_grad=True)
    out = pool(x)
    out.sum().backward()
    return out, x.grad


@pytest.mark.parametrize("case", EMPTY_POOLS)
def test_max_pools_of_empty_tensors_as_cpu(case, eager_mode):
    """These failed inside their lowerings (a reshape(0, -1), a max over no windows)."""
    fn = EMPTY_POOLS[case]
    torch.testing.assert_close(fn("tpu"), fn("cpu"), check_device=False)


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_max_unpool_matches_cpu_forward_and_backward(dims, eager_mode):
    pool, unpool = {
        1: (F.max_pool1d, F.max_unpool1d),
        2: (F.max_pool2d, F.max_unpool2d),
        3: (F.max_pool3d, F.max_unpool3d),
    }[dims]
    x = randn(2, 3, *(5,) * dims)
    values, indices = pool(x, 2, return_indices=True)
    size = (5,) * dims
    weight = torch.arange(2.0 * 3 * 5**dims).reshape(2, 3, *size)

    def run(device):
        v = values.to(device).requires_grad_()
        out = unpool(v, indices.to(device), 2, output_size=size)
        (out * weight.to(device)).sum().backward()
        return out, v.grad

    torch.testing.assert_close(run("tpu"), run("cpu"), check_device=False)


UPSAMPLES = {
    "nearest_scale": lambda x: F.interpolate(x, scale_factor=2),
    "nearest_fraction": lambda x: F.interpolate(x, scale_factor=(1.7, 0.6)),
    "nearest_exact": lambda x: F.interpolate(x, size=(10, 7), mode="nearest-exact"),
    "nearest3d": lambda x: F.interpolate(x[:, None], size=(2, 9, 5)),
    "bilinear": lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"),
    "bilinear_align": lambda x: F.interpolate(x, size=(5, 13), mode="bilinear", align_corners=True),
    "bilinear_down": lambda x: F.interpolate(x, scale_factor=0.5, mode="bilinear"),
    "bicubic": lambda x: F.interpolate(x, scale_factor=(1.5, 0.7), mode="bicubic"),
    "bicubic_align": lambda x: F.interpolate(x, size=(9, 4), mode="bicubic", align_corners=True),
    "linear": lambda x: F.interpolate(x.flatten(2), size=40, mode="linear"),
    "trilinear": lambda x: F.interpolate(
        x[:, None], size=(3, 9, 5), mode="trilinear", align_corners=True
    ),
}


@pytest.mark.parametrize("name", sorted(UPSAMPLES))
def test_upsample(name, no_nn_fallback):
    x = randn(2, 3, 7, 9)
    assert_same(UPSAMPLES[name], x, atol=1e-5, rtol=1e-5)
    assert_same_grad(UPSAMPLES[name], x, atol=1e-4, rtol=1e-4)


def _attention_mask(kind):
    if kind == "bool":
        mask = torch.rand(5, 6) > 0.3
        mask[2] = False  # a fully masked row: SDPA gives zeros (its safe softmax), as on CPU
        return mask
    return randn(2, 1, 5, 6)


@pytest.mark.parametrize(
    "kwargs", [{}, {"is_causal": True, "scale": 0.3}, {"attn_mask": "bool"}, {"attn_mask": "float"}]
)
def test_scaled_dot_product_attention(kwargs, no_nn_fallback):
    if "attn_mask" in kwargs:
        kwargs = {"attn_mask": _attention_mask(kwargs["attn_mask"])}

    def attention(q, k, v):
        mask = kwargs.get("attn_mask")
        extra = {} if mask is None else {"attn_mask": to_device(mask, q)}
        return F.scaled_dot_product_attention(q, k, v, **{**kwargs, **extra})

    q, k, v = randn(2, 3, 5, 8), randn(2, 3, 6, 8), randn(2, 3, 6, 8)
    assert_same(attention, q, k, v, atol=1e-5, rtol=1e-5)
    assert_same_grad(attention, q, k, v, atol=1e-5, rtol=1e-5)


def test_cnn_trains_like_cpu(no_nn_fallback):
    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1),
            torch.nn.BatchNorm2d(8),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.AdaptiveAvgPool2d((2, 2)),
            torch.nn.Flatten(),
            torch.nn.Linear(32, 4),
        )

    x, y = randn(8, 3, 10, 10), torch.randint(0, 4, (8,))  # no grad for x: weight-only conv grad
    losses = {}
    for device in ("cpu", "tpu"):
        model = make().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses[device] = []
        for _ in range(3):
            opt.zero_grad()
            loss = F.cross_entropy(model(x.to(device)), y.to(device))
            loss.backward()
            opt.step()
            losses[device].append(loss.item())
    torch.testing.assert_close(losses["tpu"], losses["cpu"], atol=1e-4, rtol=1e-4)
    assert losses["tpu"][-1] < losses["tpu"][0]


@pytest.mark.parametrize("dim", [0, 2, None])
def test_weight_norm_parametrization_trains_on_tpu(dim):
    """The fused weight-norm interface and its backward (wav2vec2's positional conv) run on
    tpu with CPU's gradients; the backward used to fall back to the CPU."""
    torch.manual_seed(0)
    conv = torch.nn.utils.parametrizations.weight_norm(torch.nn.Conv1d(4, 6, 3), dim=dim)
    x = torch.randn(2, 4, 10)
    tpu_conv = copy.deepcopy(conv).to("tpu")
    conv(x).pow(2).sum().backward()
    torch_tpu.metrics.reset()
    tpu_conv(x.to("tpu")).pow(2).sum().backward()
    assert torch_tpu.metrics.snapshot()["fallback_ops"] == {}
    for (name, p), (_, q) in zip(conv.named_parameters(), tpu_conv.named_parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize("batch", [0, 3])
def test_group_norm_of_an_empty_batch(batch):
    """GroupNorm of a (0, C, H, W) batch is empty on CPU, with empty gradients; tpu raised
    a ZeroDivisionError from the lowering's reshape(N, group, -1). Found by PyTorch's
    test_nn on tpu."""
    torch.manual_seed(0)
    cpu = torch.nn.GroupNorm(2, 4)
    tpu = copy.deepcopy(cpu).to("tpu")
    x = torch.randn(batch, 4, 2, 3)
    for model, inp in ((cpu, x.clone().requires_grad_()), (tpu, x.to("tpu").requires_grad_())):
        model(inp).sum().backward()
        model.inp = inp
    torch.testing.assert_close(tpu.inp.grad.cpu(), cpu.inp.grad)
    torch.testing.assert_close(tpu.weight.grad.cpu(), cpu.weight.grad)
    torch.testing.assert_close(tpu(x.to("tpu")).detach().cpu(), cpu(x).detach())


def test_nll_loss_takes_byte_targets_as_cpu_does():
    """CPU takes uint8 class indices; tpu raised "gather(): Expected dtype int32/int64"
    from PyTorch's meta decomposition. Found by PyTorch's test_nn on tpu."""
    torch.manual_seed(0)
    logits = torch.randn(10, 4)
    target = torch.randint(0, 4, (10,), dtype=torch.uint8)
    for reduction in ("mean", "none"):
        expected = F.nll_loss(logits.log_softmax(-1), target, reduction=reduction)
        actual = F.nll_loss(logits.to("tpu").log_softmax(-1), target.to("tpu"),
                            reduction=reduction)
        torch.testing.assert_close(actual.cpu(), expected)


NLL_REFUSALS = {
    "float target": lambda d: F.nll_loss(torch.zeros(2, 3, device=d), torch.zeros(2, device=d)),
    "int target": lambda d: F.nll_loss(
        torch.zeros(2, 3, device=d), torch.zeros(2, dtype=torch.int32, device=d)
    ),
    "float target 2d": lambda d: F.nll_loss(
        torch.zeros(2, 3, 4, 4, device=d), torch.zeros(2, 4, 4, device=d)
    ),
    "half weight": lambda d: F.nll_loss(
        torch.zeros(2, 3, device=d),
        torch.zeros(2, dtype=torch.long, device=d),
        weight=torch.ones(3, dtype=torch.half, device=d),
    ),
    "double weight 2d": lambda d: F.nll_loss(
        torch.zeros(2, 3, 4, 4, device=d),
        torch.zeros(2, 4, 4, dtype=torch.long, device=d),
        weight=torch.ones(3, dtype=torch.double, device=d),
    ),
}


@pytest.mark.parametrize("case", NLL_REFUSALS)
def test_nll_loss_refuses_what_cpu_refuses(case):
    """A float target raised gather()'s error from PyTorch's meta kernel instead of CPU's,
    and a weight of another dtype than the input gave a loss where CPU refuses. Found by
    PyTorch's test_modules (test_errors) on tpu."""
    assert_same_error(NLL_REFUSALS[case])


@pytest.mark.parametrize("shape", [(4,), (3, 4)])
def test_max_pool2d_refuses_low_rank_input_as_cpu_does(shape):
    """PyTorch's meta kernel raised IndexError for a 1-D or 2-D input; CPU raises
    RuntimeError("non-empty 3D or 4D ..."). Found by PyTorch's test_modules on tpu."""
    assert_same_error(lambda d: F.max_pool2d(torch.zeros(shape, device=d), 2))


MULTI_MARGIN_REFUSALS = {
    "target size": lambda d: F.multi_margin_loss(
        torch.zeros(5, 10, device=d), torch.zeros(3, dtype=torch.long, device=d)
    ),
    "2-d target": lambda d: F.multi_margin_loss(
        torch.zeros(5, 4, device=d), torch.zeros(5, 4, device=d)
    ),
    "empty classes": lambda d: F.multi_margin_loss(
        torch.zeros(5, 0, device=d), torch.zeros(5, dtype=torch.long, device=d)
    ),
    "float target": lambda d: F.multi_margin_loss(
        torch.zeros(5, 4, device=d), torch.zeros(5, device=d)
    ),
    "weight size": lambda d: torch.ops.aten.multi_margin_loss(
        torch.zeros(5, 4, device=d), torch.zeros(5, dtype=torch.long, device=d), 1, 1,
        torch.ones(5, device=d),
    ),
    "weight dtype": lambda d: torch.ops.aten.multi_margin_loss(
        torch.zeros(5, 4, device=d), torch.zeros(5, dtype=torch.long, device=d), 1, 1,
        torch.ones(4, dtype=torch.double, device=d),
    ),
    "p": lambda d: F.multi_margin_loss(
        torch.zeros(5, 4, device=d), torch.zeros(5, dtype=torch.long, device=d), p=3
    ),
}


@pytest.mark.parametrize("case", MULTI_MARGIN_REFUSALS)
def test_multi_margin_loss_refuses_what_cpu_refuses(case):
    """PyTorch's meta kernel worded a wrong target size "inconsistent target size" and
    failed a float target in a gather; tpu now raises CPU's errors. Found by PyTorch's
    test_modules (test_errors) on tpu."""
    assert_same_error(MULTI_MARGIN_REFUSALS[case])


@pytest.mark.parametrize("shape, target", [((), ()), ((), (1,)), ((4,), ()), ((4,), (1,))])
def test_multi_margin_loss_unbatched_shapes(shape, target):
    """An unreduced loss has the target's shape: PyTorch's meta kernel gave a 0-d input
    and target shape (1,) where CPU gives ()."""
    x = torch.randn(shape)
    t = torch.zeros(target, dtype=torch.long)
    assert_same(lambda a, b: F.multi_margin_loss(a, b, reduction="none"), x, t)


MULTILABEL_TARGETS = {
    "ends at -1": ((3, 5), [[3, 0, -1, 1, 2], [1, 2, 3, 4, 0], [2, 2, -1, -1, -1]]),
    "unbatched": ((5,), [4, 1, -1, 0, 0]),
    "0-d": ((), 0),
}


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("case", MULTILABEL_TARGETS)
def test_multilabel_margin_loss_matches_cpu(case, reduction):
    """PyTorch 2.13's decomposition (what tpu ran) counted the target slots after the -1
    as class 0 (a silently wrong loss), and gave an unbatched unreduced loss shape (1,)
    where CPU gives (). Found by PyTorch's test_modules on tpu."""
    torch.manual_seed(0)
    shape, target = MULTILABEL_TARGETS[case]
    x, t = torch.randn(shape, dtype=torch.double), torch.tensor(target)
    assert_same(lambda a, b: F.multilabel_margin_loss(a, b, reduction=reduction), x, t)
    assert_same_grad(lambda a: F.multilabel_margin_loss(a, t.to(a.device), reduction=reduction), x)


@pytest.mark.parametrize(
    "shapes", [((5, 4), (5, 3)), ((4,), (3,)), ((5, 0), (5, 0)), ((2, 2, 2), (2, 2, 2))]
)
def test_multilabel_margin_loss_refuses_what_cpu_refuses(shapes):
    x_shape, t_shape = shapes
    assert_same_error(
        lambda d: F.multilabel_margin_loss(
            torch.zeros(x_shape, device=d), torch.zeros(t_shape, dtype=torch.long, device=d)
        )
    )
    assert_same_error(
        lambda d: F.multilabel_margin_loss(torch.zeros(5, 4, device=d), torch.zeros(5, 4, device=d))
    )


@pytest.mark.parametrize(
    "in_place",
    [
        lambda y: torch.nn.functional.elu_(y, alpha=-2.0),
        lambda y: torch.nn.functional.celu_(y, alpha=-2.0),
        lambda y: torch.nn.functional.leaky_relu_(y, -0.5),
    ],
    ids=["elu_", "celu_", "leaky_relu_"],
)
def test_in_place_activation_with_a_negative_slope_refuses_backward(eager_mode, in_place):
    """Its backward works from the result, which is wrong for a negative slope: CPU
    raises, tpu returned a wrong gradient (elu_ at -1 with alpha -2: 1.0, true -0.74)."""

    def backward(device):
        x = torch.tensor([-1.0, 2.0], device=device, requires_grad=True)
        in_place(x.clone()).sum().backward()

    assert_same_error(backward)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_uint8_interpolate_is_within_one_of_cpu(mode):
    """Integer images were interpolated with taps cast to uint8 (every output between
    input pixels 0: 255 off); CPU's uint8 kernel works in fixed point, so a rounding
    step may differ by one. CPU resizes the width first, then the height, clamping to
    uint8 in between: bicubic (which overshoots) taken the other way was up to 28 off."""
    torch.manual_seed(0)
    for size_in, size_out in [((6, 6), (4, 4)), ((2, 2), (3, 3)), ((8, 8), (17, 17))]:
        x = torch.randint(0, 256, (2, 3, *size_in), dtype=torch.uint8)
        for align_corners in (False, True):
            expected, actual = (
                torch.nn.functional.interpolate(
                    t, size=size_out, mode=mode, align_corners=align_corners
                ).cpu()
                for t in (x, x.to("tpu"))
            )
            assert actual.dtype == torch.uint8
            assert (expected.int() - actual.int()).abs().max() <= 1
    checker = torch.tensor([[[[0, 255], [255, 0]]]], dtype=torch.uint8)
    expected = torch.nn.functional.interpolate(checker, (4, 4), mode=mode)
    actual = torch.nn.functional.interpolate(checker.to("tpu"), (4, 4), mode=mode).cpu()
    assert (expected.int() - actual.int()).abs().max() <= 1


def test_threshold_in_place_on_an_expanded_tensor_as_cpu(eager_mode):
    """CPU's threshold_ accepts a self-overlapping target (it is idempotent); relu_ and
    the other in-place activations refuse one on both."""

    def call(d):
        x = torch.tensor([[0.2, 0.7, -1.0, 0.5]], device=d).expand(3, 4)
        torch.nn.functional.threshold_(x, 0.5, -2.0)
        return x.clone()

    torch.testing.assert_close(call("tpu").cpu(), call("cpu"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bfloat16])
def test_threshold_matches_cpu(dtype, eager_mode):
    x = torch.tensor([-3, 0, 1, 2, 5, 7], dtype=dtype)
    assert_same(lambda t: torch.nn.functional.threshold(t, 2, 9), x)
    assert_same(lambda t: torch.nn.functional.threshold(t, 2.5, -1), x)


@pytest.mark.parametrize("dims", [2, 3])
@pytest.mark.parametrize("which", ["input", "weight", "both", "neither"])
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("out_channels", [3, 1])
def test_convolution_of_channels_last_tensors_is_laid_out_as_cpu(
    dims, which, transposed, out_channels, eager_mode
):
    """CPU returns a channels_last result when the input or the weight is channels_last;
    PyTorch's meta kernel (tpu's result layout) only for CUDA, so tpu's was contiguous:
    `y.permute(0, 2, 3, 1).view(n, -1)` ran on CPU and raised on tpu. One output channel:
    CPU's channels_last strides (HW, 1, W, 1), not the contiguous ones that equal them."""
    channels_last = torch.channels_last if dims == 2 else torch.channels_last_3d
    shape = (3, out_channels) if transposed else (out_channels, 3)
    x, w = randn(2, 3, *(5,) * dims), randn(*shape, *(3,) * dims)
    if which in ("input", "both"):
        x = x.contiguous(memory_format=channels_last)
    if which in ("weight", "both"):
        w = w.contiguous(memory_format=channels_last)
    conv = {
        (2, False): F.conv2d, (3, False): F.conv3d,
        (2, True): F.conv_transpose2d, (3, True): F.conv_transpose3d,
    }[(dims, transposed)]  # fmt: skip
    expected = conv(x, w)
    actual = conv(x.to("tpu"), w.to("tpu"))
    assert actual.stride() == expected.stride()
    torch.testing.assert_close(actual.cpu(), expected, atol=1e-5, rtol=1e-5)
    if dims == 2 and which != "neither":
        flat = actual.permute(0, 2, 3, 1).view(actual.shape[0], -1)
        torch.testing.assert_close(
            flat.cpu(), expected.permute(0, 2, 3, 1).reshape(expected.shape[0], -1)
        )


SHORT_PARAMETER_CONVOLUTIONS = {
    "padding='valid' 2d": lambda d: F.conv2d(
        torch.arange(10.0, device=d).view(1, 1, 1, 10),
        torch.ones(1, 1, 1, 4, device=d), padding="valid",
    ),
    "padding='valid' 3d": lambda d: F.conv3d(
        torch.arange(10.0, device=d).view(1, 1, 1, 1, 10),
        torch.ones(1, 1, 1, 1, 4, device=d), padding="valid",
    ),
    "stride=[2]": lambda d: torch.ops.aten.convolution(
        torch.arange(36.0, device=d).view(1, 1, 6, 6), torch.ones(2, 1, 3, 3, device=d),
        None, [2], [0, 0], [1, 1], False, [0, 0], 1,
    ),
    "dilation=[2]": lambda d: torch.ops.aten.convolution(
        torch.arange(36.0, device=d).view(1, 1, 6, 6), torch.ones(2, 1, 3, 3, device=d),
        None, [1, 1], [0, 0], [2], False, [0, 0], 1,
    ),
    "transposed, all one value": lambda d: torch.ops.aten.convolution(
        torch.arange(36.0, device=d).view(1, 1, 6, 6), torch.ones(1, 2, 3, 3, device=d),
        None, [2], [1], [1], True, [1], 1,
    ),
}


@pytest.mark.parametrize("case", SHORT_PARAMETER_CONVOLUTIONS)
def test_convolution_takes_one_value_for_every_spatial_dim(case, eager_mode):
    """aten::convolution stretches a one-value stride/padding/dilation list over every
    spatial dim (padding='valid' arrives as [0]); tpu's lowering failed on them."""
    fn = SHORT_PARAMETER_CONVOLUTIONS[case]
    torch.testing.assert_close(fn("tpu").cpu(), fn("cpu"))


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_convolution_with_no_input_channels_as_cpu(dims, eager_mode):
    """No input channels: PyTorch gives no output channels, and zero gradients (the bias's
    included); tpu convolved and failed its own shape check."""
    conv = {1: torch.nn.Conv1d, 2: torch.nn.Conv2d, 3: torch.nn.Conv3d}[dims](0, 4, 2, stride=2)

    def run(device):
        module = copy.deepcopy(conv).to(device)
        x = torch.randn(2, 0, *(7,) * dims, device=device, requires_grad=True)
        out = module(x)
        out.sum().backward()
        return out, x.grad, module.weight.grad, module.bias.grad

    torch.testing.assert_close(run("tpu"), run("cpu"), check_device=False)


@pytest.mark.parametrize(
    "call",
    [
        lambda d: F.conv1d(torch.ones(2, 2, 5, device=d), torch.ones(4, 3, 2, device=d)),
        lambda d: F.conv1d(torch.ones(2, 4, 5, device=d), torch.ones(4, 3, 2, device=d), groups=2),
        lambda d: F.conv2d(torch.ones(2, 1, 4, 0, device=d), torch.ones(3, 0, 3, 3, device=d)),
        lambda d: F.conv_transpose2d(
            torch.ones(2, 3, 5, 5, device=d), torch.ones(4, 2, 3, 3, device=d)
        ),
    ],
)
def test_convolution_channel_mismatch_says_what_cpu_says(call):
    """PyTorch's meta kernel said only "Invalid channel dimensions"."""
    assert_same_error(call)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_hardswish_grad_at_its_kinks_as_cpu(dtype, eager_mode):
    """CPU's hardswish gradient is 0 at -3 and 1 at 3; tpu gave -0.5 and 1.5 there
    (PyTorch's test_hardswish_grad_corner)."""
    x = torch.tensor([-4.0, -3.0, 0.0, 3.0, 4.0], dtype=dtype)
    assert_same_grad(F.hardswish, x, atol=0, rtol=0)


HALF_BOUNDED = {
    "threshold": lambda t: F.threshold(t, 0.1, 20.0),
    "hardtanh": lambda t: F.hardtanh(t, 0.1, 0.3),
    "softshrink": lambda t: F.softshrink(t, 0.1),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", sorted(HALF_BOUNDED))
def test_half_activation_bounds_as_cpu(name, dtype, eager_mode):
    """A bound such as 0.1 is not a half value: CPU compares (and subtracts) it in float32,
    so a bfloat16 input of 0.10009765625 lies above it; tpu rounded the bound to the
    input's type first (threshold gave 20 there, hardtanh a zero gradient, softshrink 0)."""
    near = torch.tensor([0.1, -0.1, 0.3], dtype=dtype)
    up = torch.nextafter(near, torch.tensor(1.0, dtype=dtype))
    down = torch.nextafter(near, torch.tensor(-1.0, dtype=dtype))
    x = torch.cat([near, up, down, torch.tensor([0.0, 0.5, -0.5], dtype=dtype)])
    assert_same(HALF_BOUNDED[name], x, atol=0, rtol=0)
    assert_same_grad(HALF_BOUNDED[name], x, atol=0, rtol=0)


@pytest.mark.parametrize("lambd", [-1.0, float("nan"), 1e39])
def test_softshrink_refuses_a_bad_lambda_on_every_call_as_cpu(lambd, eager_mode):
    """softshrink's lambda is checked on each call with CPU's message, also after a call
    of the same shape with a valid one (a check made once per shape would compute it)."""
    F.softshrink(torch.randn(3, device="tpu"), 0.5).cpu()
    assert_same_error(lambda d: torch._C._nn.softshrink(torch.randn(3, device=d), lambd))
    assert_same_error(lambda d: F.softshrink(torch.arange(3, device=d), 1))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int32, torch.int64])
def test_integer_threshold_converts_its_numbers_as_cpu(dtype, eager_mode):
    """CPU converts threshold and value to the input's integer type: a fractional bound is
    truncated (-0.5 becomes 0, so zeros are replaced; tpu compared with -0.5) and a number
    the type cannot hold raises (tpu wrapped a value of 300 into uint8 as 44)."""
    x = torch.tensor([0, 1, 2, 3, 100], dtype=dtype)
    assert_same(lambda t: F.threshold(t, 1.5, 7.9), x)
    if dtype != torch.uint8:
        assert_same(lambda t: F.threshold(t, -0.5, 9), x)
    for bound, value in [(1, 300), (300, 1), (float("nan"), 1)]:
        if dtype in (torch.uint8, torch.int8) or bound != 300 and value != 300:
            assert_same_error(lambda d, b=bound, v=value: F.threshold(x.to(d), b, v))


def test_integer_threshold_refuses_a_complex_number_as_cpu(eager_mode):
    """CPU cannot convert 1j to an integer input's type and raises; tpu compared with its
    real part. A complex number without an imaginary part is accepted on both."""
    x = torch.tensor([0, 1, 2])
    assert_same_error(lambda d: F.threshold(x.to(d), 1j, 0))
    assert_same_error(lambda d: F.threshold(x.to(d), 1, 2j))
    assert_same(lambda t: F.threshold(t, 1 + 0j, 0), x)


@pytest.mark.parametrize("dtype", [torch.int64, torch.uint8, torch.bool])
@pytest.mark.parametrize("name", ["leaky_relu", "leaky_relu_", "elu", "elu_"])
def test_float_activations_refuse_other_inputs_as_cpu(name, dtype, eager_mode):
    """CPU's NotImplementedError naming its kernel; tpu raised the ValueError of PyTorch's
    meta kernel about the float argument."""
    fn = getattr(F, name)
    assert_same_error(lambda d: fn(torch.tensor([-2, 0, 3], device=d).to(dtype)))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int32, torch.int64])
def test_integer_hardtanh_bounds_as_cpu(dtype, eager_mode):
    """CPU truncates an integer input's bounds and refuses those its type cannot hold
    (tpu clamped an int8 to -300..300) and negative ones for uint8."""
    x = torch.tensor([0, 1, 2, 3, 100], dtype=dtype)
    assert_same(lambda t: F.hardtanh(t, 0.5, 2.5), x)
    assert_same(lambda t: F.hardtanh(t, -0.9, 70), x)
    refused = [(float("nan"), 1)]
    refused += [(-300, 300)] if dtype in (torch.uint8, torch.int8) else []
    refused += [(-1, 1)] if dtype == torch.uint8 else []
    for low, high in refused:
        assert_same_error(lambda d, lo=low, hi=high: F.hardtanh(x.to(d), lo, hi))


@pytest.mark.parametrize(
    ("pool", "dims"),
    [
        (F.adaptive_avg_pool2d, 2),
        (F.adaptive_avg_pool3d, 3),
        (F.adaptive_max_pool2d, 2),
        (F.adaptive_max_pool3d, 3),
    ],
)
def test_adaptive_pool_backward_of_an_empty_output_raises_as_on_cpu(pool, dims):
    """CPU's words (PyTorch's test_adaptive_pooling_empty_output_size): the meta kernels
    say it otherwise, adaptive_avg_pool2d's with a run of spaces inside the sentence."""
    shape = (1, 4, 10, 9, 8)[: 2 + dims]
    assert_same_error(
        lambda device: (
            pool(torch.randn(shape, device=device, requires_grad=True), 0).sum().backward()
        )
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("view", ["whole", "depth sliced", "channels strided"])
def test_unbatched_max_pool3d_keeps_cpus_layout(dtype, view):
    """CPU pools an unbatched (C, D, H, W) input as a batch of one: a channels_last_3d
    batch gives channels_last_3d output and indices, squeezed (PyTorch's
    test_max_pool3d_ndhwc); the meta kernel made them contiguous."""
    batch = torch.randn(1, 6, 14, 12, 13, dtype=dtype).contiguous(
        memory_format=torch.channels_last_3d
    )
    x = {
        "whole": batch[0],
        "depth sliced": batch[0, :, 1:],
        "channels strided": batch[0, ::2].clone(),  # (dense, channels innermost)
    }[view]
    expected = F.max_pool3d(x, (3, 4, 5), return_indices=True)
    actual = F.max_pool3d(x.to("tpu"), (3, 4, 5), return_indices=True)
    for e, a in zip(expected, actual):
        assert a.stride() == e.stride()
        torch.testing.assert_close(a.cpu(), e)


@pytest.mark.parametrize(
    ("mode", "dims"), [("linear", 1), ("bilinear", 2), ("bicubic", 2), ("trilinear", 3)]
)
@pytest.mark.parametrize(
    "how", [{"size": 7}, {"scale_factor": 1.7}, {"size": 5, "align_corners": True}]
)
def test_float64_interpolation_keeps_float64_precision(mode, dims, how):
    """CPU computes a float64 image's source coordinates and weights in float64; tpu
    computed them in float32, so results carried float32's error (1e-6) under a float64
    dtype, without a sign. Forward and backward, to float64's precision."""
    how = {k: (v,) * dims if k == "size" else v for k, v in how.items()}
    x = torch.randn((2, 3) + (4, 5, 3)[:dims], dtype=torch.float64)

    def run(device):
        leaf = x.to(device).requires_grad_()
        out = F.interpolate(leaf, mode=mode, **how)
        grad = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=device)
        out.backward(grad.view(out.shape))
        return out.detach().cpu(), leaf.grad.cpu()

    for t, c in zip(run("tpu"), run("cpu")):
        assert t.dtype == torch.float64
        torch.testing.assert_close(t, c, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.15])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_cross_entropy_gradient_of_ignored_targets_is_cpus_zero(
    reduction, label_smoothing, eager_mode
):
    """CPU's nll_loss backward skips ignored targets, so their rows' gradient is +0.0,
    and a mean over a batch whose targets are all ignored (a padding-only batch) has a
    NaN loss but a zero gradient. tpu's gave NaN rows there (1 / total_weight = inf,
    times an ignored row's weight 0) and -0.0 elsewhere."""
    g = torch.Generator().manual_seed(0)
    cases = [  # (scores, targets, class weights)
        (torch.randn(3, 4, generator=g), torch.tensor([1, 1, 1]), None),
        (torch.randn(3, 4, generator=g), torch.tensor([1, 0, 1]), None),
        (torch.randn(3, 4, generator=g), torch.tensor([1, 1, 1]), torch.rand(4, generator=g)),
        (torch.randn(4, generator=g), torch.tensor(1), None),
        (torch.randn(2, 4, 3, 3, generator=g), torch.ones(2, 3, 3, dtype=torch.long), None),
    ]
    for scores, targets, weight in cases:
        results = []
        for device in ("cpu", "tpu"):
            x = scores.detach().to(device).requires_grad_()
            w = None if weight is None else weight.to(device)
            loss = F.cross_entropy(
                x, targets.to(device), w, ignore_index=1, reduction=reduction,
                label_smoothing=label_smoothing,
            )
            loss.backward()
            results.append((loss.detach().cpu(), x.grad.cpu()))
        (cpu_loss, cpu_grad), (tpu_loss, tpu_grad) = results
        torch.testing.assert_close(tpu_loss, cpu_loss, equal_nan=True)
        torch.testing.assert_close(tpu_grad, cpu_grad)
        assert torch.equal(tpu_grad.signbit(), cpu_grad.signbit()), (targets, weight)


def test_smooth_l1_loss_with_a_negative_beta_raises_as_on_cpu(eager_mode):
    """tpu computed a loss with beta=-1; CPU refuses it (beta=0 is l1_loss on both)."""
    x, y = torch.zeros(4), torch.linspace(-2, 2, 4)
    assert_same_error(lambda d: F.smooth_l1_loss(x.to(d), y.to(d), beta=-1.0))
    assert_same(lambda a, b: F.smooth_l1_loss(a, b, beta=0.0), x, y)
