"""Automatic mixed precision for `tpu`: `torch.autocast("tpu")` with CUDA's casting policy.

PyTorch 2.13 registers no kernel, not even a fallthrough, for the
AutocastPrivateUse1 dispatch key, so enabling tpu autocast made every op fail.
`install()` (at registration, cheap) adds the fallthrough and makes bfloat16
the tpu autocast dtype, as on TPU. The per-op kernels, which cast and then
redispatch with autocast excluded exactly as PyTorch's C++ wrappers do, are
registered at the first `torch.autocast("tpu")` (PyTorch then calls
`torch.tpu.get_amp_supported_dtype()`), not at `import torch`.

The op lists follow the AutocastCUDA registrations of PyTorch 2.13 (its
`AT_FORALL_*` lists; cudnn-only ops left out); the five policies are those of
`at::autocast::CastPolicy`. CPU autocast uses other lists (softmax, sums and
norms stay in the lower precision there), so tpu matches CUDA, not CPU, op by op.
"""

from __future__ import annotations

import torch

DEVICE_TYPE = "tpu"
_KEY = "AutocastPrivateUse1"

# Run in the autocast dtype: the matrix-multiply-bound ops.
LOWER_PRECISION = (
    "_convolution.deprecated", "_convolution.default", "conv1d.default", "conv2d.default",
    "conv3d.default", "conv_tbc.default", "conv_transpose1d.default",
    "conv_transpose2d.input", "conv_transpose3d.input", "convolution.default",
    "prelu.default", "addmm.default", "addmv.default", "addr.default", "matmul.default",
    "einsum.default", "mm.default", "mv.default", "linalg_vecdot.default",
    "linear.default", "addbmm.default", "baddbmm.default", "bmm.default",
    "chain_matmul.default", "linalg_multi_dot.default", "_thnn_fused_lstm_cell.default",
    "_thnn_fused_gru_cell.default", "lstm_cell.default", "gru_cell.default",
    "rnn_tanh_cell.default", "rnn_relu_cell.default",
    "_scaled_dot_product_flash_attention.default", "scaled_dot_product_attention.default",
)  # fmt: skip

# Run in float32: ops whose range or accuracy bf16/fp16 would ruin.
FP32 = (
    "acos.default", "asin.default", "cosh.default", "erfinv.default", "exp.default",
    "expm1.default", "log.default", "log10.default", "log2.default", "log1p.default",
    "reciprocal.default", "rsqrt.default", "sinh.default", "tan.default",
    "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus.default",
    "layer_norm.default", "native_layer_norm.default", "rms_norm.default",
    "group_norm.default", "frobenius_norm.dim", "nuclear_norm.default", "nuclear_norm.dim",
    "cosine_similarity.default", "poisson_nll_loss.default",
    "cosine_embedding_loss.default", "nll_loss.default", "nll_loss2d.default",
    "hinge_embedding_loss.default", "kl_div.default", "l1_loss.default",
    "smooth_l1_loss.default", "huber_loss.default", "mse_loss.default",
    "margin_ranking_loss.default", "multilabel_margin_loss.default",
    "soft_margin_loss.default", "triplet_margin_loss.default", "multi_margin_loss.default",
    "binary_cross_entropy_with_logits.default", "dist.default", "pdist.default",
    "cdist.default", "renorm.default", "logsumexp.default", "upsample_nearest1d.default",
    "_upsample_nearest_exact1d.default", "upsample_nearest2d.default",
    "_upsample_nearest_exact2d.default", "upsample_nearest3d.default",
    "_upsample_nearest_exact3d.default", "upsample_linear1d.default",
    "upsample_bilinear2d.default", "_upsample_bilinear2d_aa.default",
    "upsample_trilinear3d.default", "upsample_bicubic2d.default",
    "_upsample_bicubic2d_aa.default",
)  # fmt: skip

# Reductions with a `dtype` argument: unless the caller chose one, it becomes float32
# when the first input is eligible (inputs are not cast).
FP32_SET_OPT_DTYPE = (
    "prod.default", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod.default",
    "cumsum.default", "linalg_vector_norm.default", "linalg_matrix_norm.default",
    "linalg_matrix_norm.str_ord", "sum.default", "sum.dim_IntList",
)  # fmt: skip

# Overloads without a dtype argument, redirected to their dtype-taking sibling.
FP32_APPEND_DTYPE = {
    "norm.Scalar": "norm.ScalarOpt_dtype",
    "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype",
}

# Run in the widest floating dtype among the inputs.
PROMOTE = (
    "addcdiv.default", "addcmul.default", "atan2.default", "bilinear.default",
    "cross.default", "dot.default", "vdot.default", "grid_sampler.default",
    "index_put.default", "tensordot.default", "scatter_add.default",
)  # fmt: skip

# CUDA refuses this one under autocast; so do we, for the same reason.
BANNED = "binary_cross_entropy.default"

_AUTOCAST_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)
for _name in ("AutocastCPU", "AutocastCUDA", "AutocastXPU", "AutocastMPS", "AutocastHPU"):
    _AUTOCAST_KEYS = _AUTOCAST_KEYS | torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, _name))

_fallthrough_lib: torch.library.Library | None = None
_kernel_lib: torch.library.Library | None = None


# ------------------------------------------------------------ device module


def get_amp_supported_dtype() -> list[torch.dtype]:
    """The dtypes `torch.autocast("tpu", dtype=...)` accepts; PyTorch calls this when
    a tpu autocast region is created, which is when the cast kernels are registered."""
    install_kernels()
    return [torch.bfloat16, torch.float16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """XLA computes in bfloat16 on every platform (natively on TPU)."""
    return True


# ----------------------------------------------------------------- install


def install() -> None:
    """Make tpu autocast safe to enable (fallthrough) and bfloat16 by default.

    The autocast dtype is thread-local in PyTorch: this sets it for the thread that
    imports torch; other threads start with PyTorch's default (float16) unless they
    pass a dtype or call `torch.set_autocast_dtype("tpu", torch.bfloat16)`.
    """
    global _fallthrough_lib
    if _fallthrough_lib is None:
        _fallthrough_lib = torch.library.Library("_", "IMPL")
        _fallthrough_lib.fallback(torch.library.fallthrough_kernel, _KEY)
        torch.set_autocast_dtype(DEVICE_TYPE, torch.bfloat16)


def install_kernels() -> None:
    """Register the casting kernel of every listed op (once)."""
    global _kernel_lib
    if _kernel_lib is not None:
        return
    install()
    lib = torch.library.Library("aten", "IMPL")
    for name in LOWER_PRECISION:
        _register(lib, name, _lower_precision)
    for name in FP32:
        _register(lib, name, _fp32)
    for name in FP32_SET_OPT_DTYPE:
        _register(lib, name, _fp32_set_opt_dtype)
    for name, target in FP32_APPEND_DTYPE.items():
        _register(lib, name, _fp32_append_dtype(_overload(target)))
    for name in PROMOTE:
        _register(lib, name, _promote)
    lib.impl(BANNED.removesuffix(".default"), _banned, _KEY)
    _kernel_lib = lib


def _overload(name: str) -> torch._ops.OpOverload:
    packet, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, packet), overload)


def _register(lib: torch.library.Library, name: str, policy) -> None:
    op = _overload(name)
    arguments = op._schema.arguments
    positional = [a for a in arguments if not a.kwarg_only]
    keyword = [a for a in arguments if a.kwarg_only]

    def kernel(*args, **kwargs):
        # every argument present, so policies see the same shape whatever the caller passed
        args = list(args) + [
            kwargs.pop(a.name) if a.name in kwargs else a.default_value
            for a in positional[len(args) :]
        ]
        for a in keyword:
            if a.name not in kwargs and a.has_default_value():
                kwargs[a.name] = a.default_value
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_KEYS):
            return policy(op, args, kwargs)

    kernel.__name__ = f"autocast_tpu_{name.replace('.', '_')}"
    lib.impl(name.removesuffix(".default"), kernel, _KEY)


# ---------------------------------------------------------------- policies


def _eligible(value) -> bool:
    """A floating tpu tensor autocast may cast (float64 is never touched)."""
    return (
        isinstance(value, torch.Tensor)
        and value.is_floating_point()
        and value.dtype is not torch.float64
        and value.device.type == DEVICE_TYPE
    )


def _cast(value, dtype: torch.dtype):
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if _eligible(value) and value.dtype is not dtype else value
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        return type(value)(_cast(v, dtype) for v in value)
    return value


def _call_cast(op, args: list, kwargs: dict, dtype: torch.dtype):
    return op(*[_cast(a, dtype) for a in args], **{k: _cast(v, dtype) for k, v in kwargs.items()})


def _lower_precision(op, args, kwargs):
    return _call_cast(op, args, kwargs, torch.get_autocast_dtype(DEVICE_TYPE))


def _fp32(op, args, kwargs):
    return _call_cast(op, args, kwargs, torch.float32)


def _fp32_set_opt_dtype(op, args, kwargs):
    if _eligible(args[0]):
        names = [a.name for a in op._schema.arguments if not a.kwarg_only]
        if "dtype" in names:
            index = names.index("dtype")
            if args[index] is None:
                args[index] = torch.float32
        elif kwargs.get("dtype") is None:
            kwargs["dtype"] = torch.float32
    return op(*args, **kwargs)


def _fp32_append_dtype(target: torch._ops.OpOverload):
    def policy(op, args, kwargs):
        dtype = torch.float32 if _eligible(args[0]) else args[0].dtype
        return target(*args, **kwargs, dtype=dtype)

    return policy


def _promote(op, args, kwargs):
    lower = torch.get_autocast_dtype(DEVICE_TYPE)
    widest = lower
    for value in (*args, *kwargs.values()):
        for t in value if isinstance(value, (list, tuple)) else (value,):
            if not _eligible(t):
                continue
            if widest is torch.float32 or t.dtype is torch.float32:
                widest = torch.float32
            elif t.dtype is not lower:
                raise RuntimeError(
                    f"tpu autocast ({lower}): {op._schema.name} got a {t.dtype} input; "
                    f"only {lower} and float32 mix under this autocast dtype"
                )
    return _call_cast(op, args, kwargs, widest)


def _banned(*args, **kwargs):
    raise RuntimeError(
        "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe inside "
        "autocast (as on CUDA): the probabilities they take lose too much in low precision. "
        "Feed logits to torch.nn.functional.binary_cross_entropy_with_logits or "
        "torch.nn.BCEWithLogitsLoss instead (safe under autocast), or compute the loss "
        "outside the autocast region."
    )
