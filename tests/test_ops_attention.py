"""Attention on tpu matches the CPU without any CPU fallback: nn.MultiheadAttention and
nn.TransformerEncoderLayer / TransformerEncoder in eval mode (PyTorch's inference fast
paths `_native_multi_head_attention`, `_transformer_encoder_layer_fwd`) and in training,
and F.scaled_dot_product_attention forward and backward."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

TOL = {"atol": 1e-5, "rtol": 1e-4}


@pytest.fixture(params=["strict", "fused"])
def mode(request):
    with torch.tpu.set_eager_mode(request.param):
        yield request.param


def tpu(value):
    return None if value is None else value.to("tpu")


def close(actual, expected, **tol):
    if expected is None:
        assert actual is None
        return
    assert actual.device.type == "tpu"
    torch.testing.assert_close(actual.cpu(), expected, **(tol or TOL))


PADDING = torch.tensor([[False, False, False, True], [False, False, False, False]])
CAUSAL = torch.triu(torch.ones(4, 4, dtype=torch.bool), 1)


@pytest.mark.parametrize("masks", ["none", "padding", "causal", "both", "float_causal"])
def test_mha_inference_fast_path(masks, mode, no_cpu_fallback):
    mha = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    twin = copy.deepcopy(mha).to("tpu")
    x = torch.randn(2, 4, 8)
    kwargs = {
        "none": {},
        "padding": {"key_padding_mask": PADDING},
        "causal": {"attn_mask": CAUSAL},
        "both": {"key_padding_mask": PADDING, "attn_mask": CAUSAL},
        "float_causal": {"attn_mask": torch.zeros(4, 4).masked_fill(CAUSAL, float("-inf"))},
    }[masks]
    for need_weights, average in ((True, True), (True, False), (False, True)):
        with torch.no_grad():
            out, weights = mha(x, x, x, need_weights=need_weights,
                               average_attn_weights=average, **kwargs)
            xt = x.to("tpu")
            t_out, t_weights = twin(xt, xt, xt, need_weights=need_weights,
                                    average_attn_weights=average,
                                    **{k: tpu(v) for k, v in kwargs.items()})
        close(t_out, out)
        close(t_weights, weights)


FULLY_PADDED = torch.tensor([[True, True, True, True], [False, False, True, False]])
ROW_MASKED = torch.zeros(4, 4, dtype=torch.bool).index_fill(0, torch.tensor([1]), True)


@pytest.mark.parametrize(
    "masks", [{"key_padding_mask": FULLY_PADDED}, {"attn_mask": ROW_MASKED},
              {"attn_mask": CAUSAL, "key_padding_mask": FULLY_PADDED}],
)  # fmt: skip
def test_inference_fast_paths_give_nan_for_rows_with_every_key_masked(masks, mode):
    """CPU's fused kernels give NaN weights (so NaN outputs) to a query whose every key
    is masked; tpu gave zeros (the out_proj bias), a silent difference."""
    mha = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True).eval()
    x = torch.randn(2, 4, 8)
    xt = x.to("tpu")
    tpu_masks = {k: v.to("tpu") for k, v in masks.items()}
    with torch.no_grad():
        for need_weights in (False, True):
            out, weights = mha(x, x, x, need_weights=need_weights, **masks)
            t_out, t_weights = copy.deepcopy(mha).to("tpu")(
                xt, xt, xt, need_weights=need_weights, **tpu_masks
            )
            assert out.isnan().any()
            close(t_out, out, equal_nan=True, **TOL)
            close(t_weights, weights, equal_nan=True, **TOL)
        if "attn_mask" not in masks:
            expected = layer(x, src_key_padding_mask=masks["key_padding_mask"])
            twin = copy.deepcopy(layer).to("tpu")
            actual = twin(xt, src_key_padding_mask=tpu_masks["key_padding_mask"])
            close(actual, expected, equal_nan=True, **TOL)


@pytest.mark.parametrize(
    "build,call,op",
    [
        (lambda: nn.MultiheadAttention(8, 2, batch_first=True), lambda m, x: m(x, x, x),
         "_native_multi_head_attention"),
        (lambda: nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), lambda m, x: m(x),
         "_transformer_encoder_layer_fwd"),
    ],
)
def test_inference_fast_path_is_taken(build, call, op, monkeypatch, no_cpu_fallback):
    """The inference tests exercise PyTorch's fused op on tpu, not the ordinary ops."""
    calls = []
    original = getattr(torch, op)

    def spy(*args, **kwargs):
        calls.append(args[0].device.type)
        return original(*args, **kwargs)

    monkeypatch.setattr(torch, op, spy)
    with torch.no_grad():
        call(build().eval().to("tpu"), torch.randn(2, 4, 8, device="tpu"))
    assert calls == ["tpu"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_inference_fast_path_half(dtype, no_cpu_fallback):
    """Half-precision inputs compute in float32 and keep their dtype in the outputs."""
    x = torch.randn(2, 4, 8, dtype=dtype)
    mha = nn.MultiheadAttention(8, 2, batch_first=True).eval().to(dtype)
    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True).eval().to(dtype)
    xt = x.to("tpu")
    with torch.no_grad():
        out, weights = mha(x, x, x)
        t_out, t_weights = copy.deepcopy(mha).to("tpu")(xt, xt, xt)
        expected, actual = layer(x), copy.deepcopy(layer).to("tpu")(xt)
    for a, e in ((t_out, out), (t_weights, weights), (actual, expected)):
        assert a.dtype == dtype
        close(a, e, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("batch_first", [True, False])
def test_mha_training(batch_first, mode, no_cpu_fallback):
    mha = nn.MultiheadAttention(8, 2, batch_first=batch_first, dropout=0.0)
    twin = copy.deepcopy(mha).to("tpu")
    q, kv = torch.randn(2, 4, 8), torch.randn(2, 5, 8)
    if not batch_first:
        q, kv = q.transpose(0, 1), kv.transpose(0, 1)
    padding = torch.tensor([[False] * 4 + [True], [False] * 5])
    results = []
    for module, dev in ((mha, "cpu"), (twin, "tpu")):
        qq = q.detach().to(dev).requires_grad_()
        kk = kv.detach().to(dev).requires_grad_()
        out, weights = module(qq, kk, kk, key_padding_mask=padding.to(dev))
        (out.sum() + (weights * weights).sum()).backward()
        grads = [qq.grad, kk.grad] + [p.grad for p in module.parameters()]
        results.append((out.detach(), weights.detach(), grads))
    (out, weights, grads), (t_out, t_weights, t_grads) = results
    close(t_out, out)
    close(t_weights, weights)
    for g, t_g in zip(grads, t_grads):
        close(t_g, g, atol=1e-4, rtol=1e-4)


LAYERS = {
    "relu": {},
    "gelu": {"activation": "gelu"},
    "norm_first": {"norm_first": True},
}


@pytest.mark.parametrize("padding", [False, True])
@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_encoder_layer_inference_fast_path(layer, padding, mode, no_cpu_fallback):
    module = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True, **LAYERS[layer]).eval()
    twin = copy.deepcopy(module).to("tpu")
    x = torch.randn(2, 4, 8)
    mask = PADDING if padding else None
    with torch.no_grad():
        close(twin(x.to("tpu"), src_key_padding_mask=tpu(mask)),
              module(x, src_key_padding_mask=mask))


def test_encoder_layer_causal_mask(mode, no_cpu_fallback):
    module = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True).eval()
    twin = copy.deepcopy(module).to("tpu")
    x = torch.randn(2, 4, 8)
    with torch.no_grad():
        close(twin(x.to("tpu"), src_mask=CAUSAL.to("tpu")), module(x, src_mask=CAUSAL))


def test_encoder_with_padding_mask_keeps_dense_path(mode, no_cpu_fallback):
    """CPU packs the batch into a nested tensor (padded outputs become 0); tpu has none
    and keeps the dense path: every unpadded position matches CPU, and the whole output
    matches CPU's own dense path (enable_nested_tensor=False)."""
    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).eval()
    dense = copy.deepcopy(encoder)
    dense.use_nested_tensor = False
    twin = copy.deepcopy(encoder).to("tpu")
    x = torch.randn(2, 4, 8)
    with torch.no_grad():
        nested = encoder(x, src_key_padding_mask=PADDING)
        expected = dense(x, src_key_padding_mask=PADDING)
        actual = twin(x.to("tpu"), src_key_padding_mask=PADDING.to("tpu"))
    close(actual, expected)
    keep = ~PADDING
    torch.testing.assert_close(actual.cpu()[keep], nested[keep], **TOL)


def test_encoder_without_mask_check_explains():
    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    encoder = nn.TransformerEncoder(layer, 1, mask_check=False).eval().to("tpu")
    x = torch.randn(2, 4, 8, device="tpu")
    with torch.no_grad(), pytest.raises(NotImplementedError, match="enable_nested_tensor"):
        encoder(x, src_key_padding_mask=PADDING.to("tpu"))


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_training(norm_first, mode, no_cpu_fallback):
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, norm_first=norm_first)
    encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    twin = copy.deepcopy(encoder).to("tpu")
    x = torch.randn(4, 2, 8)
    padding = PADDING
    results = []
    for module, dev in ((encoder, "cpu"), (twin, "tpu")):
        xx = x.detach().to(dev).requires_grad_()
        out = module(xx, src_key_padding_mask=padding.to(dev))
        weights = torch.arange(out.numel(), dtype=out.dtype).reshape(out.shape)
        (out * weights.to(dev)).sum().backward()
        results.append((out.detach(), [xx.grad] + [p.grad for p in module.parameters()]))
    (out, grads), (t_out, t_grads) = results
    close(t_out, out)
    for g, t_g in zip(grads, t_grads):
        close(t_g, g, atol=1e-4, rtol=1e-4)


def test_mha_compiled(no_cpu_fallback):
    mha = nn.MultiheadAttention(8, 2, batch_first=True, dropout=0.0)
    twin = copy.deepcopy(mha).to("tpu")
    compiled = torch.compile(twin, backend="tpu")
    x = torch.randn(2, 4, 8)
    out, weights = mha(x, x, x, key_padding_mask=PADDING)
    xt = x.to("tpu")
    t_out, t_weights = compiled(xt, xt, xt, key_padding_mask=PADDING.to("tpu"))
    close(t_out, out)
    close(t_weights, weights)
    out.sum().backward()
    t_out.sum().backward()
    for p, q in zip(mha.parameters(), twin.parameters()):
        close(q.grad, p.grad, atol=1e-4, rtol=1e-4)


# ------------------------------------------------------- scaled_dot_product_attention

BOOL_MASK = torch.rand(5, 6) > 0.3
BOOL_MASK[1] = False  # a row with every key masked


SDPA = {
    "plain": {},
    "causal": {"is_causal": True},
    "bool_mask": {"attn_mask": BOOL_MASK},
    "float_mask": {"attn_mask": torch.randn(2, 1, 5, 6)},
    "scale": {"scale": 0.3},
}


def check_sdpa(q, k, v, **kwargs):
    cotangent = None
    results = []
    for dev in ("cpu", "tpu"):
        args = [t.detach().to(dev).requires_grad_() for t in (q, k, v)]
        extra = {n: tpu(a) if dev == "tpu" and isinstance(a, torch.Tensor) else a
                 for n, a in kwargs.items()}
        out = F.scaled_dot_product_attention(*args, **extra)
        if cotangent is None:
            cotangent = torch.randn(out.shape)
        (out * cotangent.to(dev)).sum().backward()
        results.append((out.detach(), [a.grad for a in args]))
    (out, grads), (t_out, t_grads) = results
    close(t_out, out)
    for g, t_g in zip(grads, t_grads):
        close(t_g, g, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("case", sorted(SDPA))
def test_sdpa(case, mode, no_cpu_fallback):
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8)
    check_sdpa(q, k, v, **SDPA[case])


def test_sdpa_gqa_and_3d(mode, no_cpu_fallback):
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
    check_sdpa(q, k, v, enable_gqa=True)
    check_sdpa(torch.randn(3, 5, 8), torch.randn(3, 6, 8), torch.randn(3, 6, 8), is_causal=True)
