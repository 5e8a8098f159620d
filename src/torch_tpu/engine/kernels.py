"""Registers tpu kernels with PyTorch's dispatcher.

Every lowering in the registry becomes the PrivateUse1 kernel of its
overload, and also of the overload's in-place and out= variants unless those
have lowerings of their own. View ops reuse PyTorch's own stride arithmetic
(the CPU kernel touches only metadata). Ops without a lowering run a PyTorch
decomposition where one exists, else the CPU fallback.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable

import torch

from .. import dtypes
from ..ops.registry import LOWERINGS, Lowering
from ..strided import storage_span
from ..tensor import new_tensor, replace_storage, set_geometry, storage_of
from . import executor, fallback, refusals
from .schema import parse

_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_COMPOSITE = (
    "CompositeImplicitAutograd",
    "CompositeExplicitAutograd",
    "CompositeExplicitAutogradNonFunctional",
)
# Ops whose CPU kernel only computes sizes and strides: PyTorch's own view logic serves us.
_METADATA_OPS = (
    "view.default",
    "_reshape_alias.default",
    "as_strided.default",
    "unfold.default",
    "view_as_real.default",
    "view_as_complex.default",
    "view.dtype",
    "set_.source_Storage",
    "set_.source_Storage_storage_offset",
    "set_.source_Tensor",
    "set_.source_Tensor_storage_offset",
)

# Those of them whose result has a dtype of its own.
_REINTERPRETING = ("view_as_complex.default", "view.dtype")

# Views that set PyTorch's conjugate / negative bit: in eager mode PyTorch's own kernel
# makes the alias (a copy would not see later writes to the base, nor pass writes back)
# and reads and writes honour the bits (`strided.View.conj`/`neg`); compiled graphs,
# which are functional, still use the lowerings.
_BIT_VIEWS = ("_conj.default", "_neg_view.default")

_lib = torch.library.Library("aten", "IMPL")
# Every overload we registered a PrivateUse1 kernel for -> how it runs:
# "lowered" (its own lowering), "derived" (in-place/out= variant of a lowering),
# "special" (host copies, allocation), "metadata" (views) or "decomposed".
KERNELS: dict[str, str] = {}


def overload(name: str) -> torch._ops.OpOverload:
    packet, _, ovl = name.partition(".")
    return getattr(getattr(torch.ops.aten, packet), ovl or "default")


def _has(name: str, key: str) -> bool:
    packet, _, ovl = name.partition(".")
    full = f"aten::{packet}" + ("" if ovl == "default" else f".{ovl}")
    return torch._C._dispatch_has_kernel_for_dispatch_key(full, key)


def _impl(name: str, kernel, category: str) -> None:
    _lib.impl(name.removesuffix(".default"), kernel, "PrivateUse1")
    KERNELS[name if "." in name else f"{name}.default"] = category


# The linalg `*_ex` ops (every overload) whose `check_errors=True` makes CPU's kernel
# raise on a nonzero `info` (their last result), with the API name its message uses.
# A lowering cannot raise on a value it computes: the kernel reads `info` afterwards
# (a sync, as on CPU and CUDA) through PyTorch's own check, whose message CPU's is.
_RAISE_ON_INFO = {
    "linalg_cholesky_ex": "linalg.cholesky_ex",
    "linalg_inv_ex": "linalg.inv_ex",
    "linalg_lu_factor_ex": "torch.linalg.lu_factor_ex",
    "_linalg_solve_ex": "torch.linalg.solve_ex",
}


def _legacy_cholesky(self: torch.Tensor, upper: bool = False) -> torch.Tensor:
    """torch.cholesky as CPU's kernel runs it: the factor and its `info`, read (a sync,
    as on CPU and CUDA) to raise CPU's LinAlgError for a matrix that is not positive
    definite; the lowering alone returned NaNs without an error. (Compiled graphs keep
    the lowering, as they do for linalg.cholesky.)"""
    factor, info = torch.ops.aten.linalg_cholesky_ex.default(self, upper=upper)
    torch.ops.aten._linalg_check_errors.default(info, "cholesky", is_matrix=self.dim() == 2)
    return factor


def _legacy_cholesky_out(spec, args: tuple, kwargs: dict) -> torch.Tensor:
    """torch.cholesky(..., out=): CPU's kernel factors, raises as the functional form
    does, then resizes and fills `out`. Here the lowering's out= path (its checks and
    resizing of `out` are CPU's) runs after `_legacy_cholesky`'s check: a deprecated
    form, so the factor is computed twice rather than given an out= path of its own."""
    self = args[0]
    upper = args[1] if len(args) > 1 else kwargs.get("upper", False)
    if self.dim() >= 2 and self.numel():  # (CPU's own checks of a bad shape come first)
        _legacy_cholesky(self, upper)
    return executor.run(spec, args, kwargs)


def _flip_dims(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """flip's dims in one order, wrapped: (1, 0), (0, 1) and (-1, 0) of a matrix are one
    program, not three (each a compile at a new shape). Invalid or repeated dims stay as
    given, for CPU's error about them."""
    self, dims = args if len(args) == 2 else (args[0], kwargs.pop("dims"))
    ndim = max(self.dim(), 1)
    wrapped = {d % ndim for d in dims if -ndim <= d < ndim}
    if len(wrapped) == len(dims):
        dims = sorted(wrapped)
    return (self, dims), kwargs


def _dtype_from_out(args: tuple, kwargs: dict, kernel: str | None = None):
    """CPU's reductions into out= compute in out's dtype when no dtype is given (a float32
    sum into a float64 out accumulates in float64; into an int64 out it sums the
    truncated elements), as if called with dtype=out.dtype; tpu rounded to the input's
    dtype first. `kernel` names a CPU kernel written for floating types only: mean (an
    integer input or out is refused by its checks) and nansum (a floating input into an
    integer out is refused; an integer input is summed, as CPU does, into any out)."""
    from ..ops.pointwise import scalar_type_name  # (the ops import JAX: not at start-up)

    out = kwargs.get("out")
    if kwargs.get("dtype") is not None or not isinstance(out, torch.Tensor):
        return args, kwargs
    if kernel == "nansum_cpu" and _inexact(args[0]) and not _inexact(out):
        raise NotImplementedError(
            f'"nansum_cpu" not implemented for \'{scalar_type_name(out.dtype)}\''
        )
    if kernel != "mean" or (_inexact(args[0]) and _inexact(out)):
        kwargs = {**kwargs, "dtype": out.dtype}
    return args, kwargs


def _inexact(t: torch.Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()


_MEAN_DTYPE_FROM_OUT = functools.partial(_dtype_from_out, kernel="mean")

# Ops whose arguments are put in CPU's canonical form before the executor keys the call:
# flip's dims are a set; these reductions' out= overloads take their dtype from out.
_CANONICAL_ARGS = {
    "flip.default": _flip_dims,
    "sum.IntList_out": _dtype_from_out,
    "sum.out": _dtype_from_out,
    "nansum.out": functools.partial(_dtype_from_out, kernel="nansum_cpu"),
    "prod.int_out": _dtype_from_out,
    "prod.out": _dtype_from_out,
    "cumsum.out": _dtype_from_out,
    "cumprod.out": _dtype_from_out,
    "mean.out": _MEAN_DTYPE_FROM_OUT,
    "mean.dtype_out": _MEAN_DTYPE_FROM_OUT,
}


def _register_spec(name: str, spec: executor.OpSpec, category: str) -> None:
    api = _RAISE_ON_INFO.get(name.partition(".")[0])
    canonical = _CANONICAL_ARGS.get(name)
    if canonical is not None:

        def kernel(*args, **kwargs):
            return executor.run(spec, *canonical(args, kwargs))

    elif name == "cholesky.default":

        def kernel(*args, **kwargs):
            return _legacy_cholesky(*args, **kwargs)

    elif name == "cholesky.out":

        def kernel(*args, **kwargs):
            return _legacy_cholesky_out(spec, args, kwargs)

    elif api is not None:
        check = torch.ops.aten._linalg_check_errors.default

        def kernel(*args, **kwargs):
            result = executor.run(spec, args, kwargs)
            if kwargs.get("check_errors"):
                check(result[-1], api, is_matrix=args[0].dim() == 2)
            return result

    else:

        def kernel(*args, **kwargs):
            return executor.run(spec, args, kwargs)

    kernel.__name__ = f"tpu_{name.replace('.', '_')}"
    _impl(name, kernel, category)


def _register_lowering(name: str, lowering: Lowering) -> None:
    from ..ops import composites  # (only once the registry is filled: it imports JAX)

    if _has(name, "CompositeImplicitAutograd") and name not in composites.GRADLESS:
        raise RuntimeError(
            f"aten::{name} is CompositeImplicitAutograd: PyTorch decomposes it before it "
            "reaches a backend, so a lowering would bypass autograd; lower its parts instead"
        )
    op = overload(name)
    _register_spec(name, executor.make_spec(parse(op), lowering), "lowered")
    _register_variants(name, op, lowering)


# CompositeImplicitAutograd backward ops that autograd's formulas call with grad mode
# off (with it on, for a double backward, they call a differentiable decomposition).
# CPU and CUDA run a kernel of their own there, computing half-precision inputs in
# float32; PyTorch's decomposition, which every other device gets, rounds each step to
# the half type (1-2 units in the last place apart). Their lowerings run whenever no
# gradient of the call itself can be wanted; otherwise the decomposition, as before.
_GRADLESS_BACKWARDS = ("silu_backward.default", "mish_backward.default")


def _register_gradless_backward(name: str, lowering: Lowering) -> None:
    op = overload(name)
    _register_spec(name, executor.make_spec(parse(op), lowering), "lowered")
    decompose = op.decompose
    below_autograd = torch._C._AutoDispatchBelowAutograd

    def autograd_kernel(*args, **kwargs):
        if torch.is_grad_enabled() and any(
            isinstance(a, torch.Tensor) and a.requires_grad for a in (*args, *kwargs.values())
        ):
            return decompose(*args, **kwargs)
        with below_autograd():
            return op(*args, **kwargs)

    _lib.impl(name.removesuffix(".default"), autograd_kernel, "AutogradPrivateUse1")


# CompositeImplicitAutograd ops whose CPU kernel checks values of a tensor argument
# (with a host read) only when that argument is on the CPU: CUDA, and tpu through the
# decomposition, computed on from the bad value without an error. Per op overload, its
# check, called with the op's arguments; it reads the value on the host as CPU does,
# before the decomposition runs (`_register_value_checked`).
def _quantile_q_in_range(self, q, *rest, **kwargs) -> None:
    """quantile's q within [0, 1] (NaN fails), checked as CPU checks it: after its
    dtype and shape checks, which the decomposition then makes with CPU's words."""
    if (
        isinstance(q, torch.Tensor)
        and q.device.type == "tpu"
        and self.is_floating_point()
        and q.dtype == self.dtype
        and q.dim() <= 1
        and not bool(((q >= 0) & (q <= 1)).all())
    ):
        raise RuntimeError("quantile() q values must be in the range [0, 1]")


_VALUE_CHECKED = {
    "quantile.default": _quantile_q_in_range,
    "quantile.out": _quantile_q_in_range,
    "nanquantile.default": _quantile_q_in_range,
    "nanquantile.out": _quantile_q_in_range,
}


def _register_value_checked(name: str, check) -> None:
    """The op's check, then PyTorch's own decomposition of it, at the autograd key (the
    decomposition's parts record their own gradients) and below it (inference mode)."""
    decompose = overload(name).decompose

    def kernel(*args, **kwargs):
        check(*args, **kwargs)
        return decompose(*args, **kwargs)

    for key in ("AutogradPrivateUse1", "PrivateUse1"):
        _lib.impl(name.removesuffix(".default"), kernel, key)
    KERNELS[name] = "special"


def _register_variants(name: str, op, lowering: Lowering) -> None:
    """The in-place and out= overloads of a functional op, derived from its lowering."""
    packet_name, _, ovl = name.partition(".")
    functional = op._schema
    signature = [(a.name, str(a.type)) for a in functional.arguments]
    candidates = []
    # (every in-place overload whose arguments are the functional's: floor_divide_.Tensor
    # is floor_divide.default's, under another overload name; the signature check below
    # keeps the others out)
    inplace_packet = getattr(torch.ops.aten, packet_name + "_", None)
    if inplace_packet is not None:
        candidates += [f"{packet_name}_.{other}" for other in inplace_packet.overloads()]
    packet = getattr(torch.ops.aten, packet_name)
    for other in packet.overloads():
        if other != ovl:
            candidates.append(f"{packet_name}.{other}")
    for candidate in candidates:
        if candidate in LOWERINGS or candidate in KERNELS:
            continue
        variant = overload(candidate)
        schema = variant._schema
        args = list(schema.arguments)
        written = [i for i, a in enumerate(args) if a.alias_info and a.alias_info.is_write]
        if not written:
            continue
        kept = [i for i in range(len(args)) if not args[i].is_out]
        if [(args[i].name, str(args[i].type).replace("Tensor(a!)", "Tensor")) for i in kept] != (
            signature
        ):
            continue
        outs = [i for i in range(len(args)) if args[i].is_out]
        # the lowering's results are the functional's returns, then the new values of
        # the arguments it mutates (`Lowering.writes`: batch norm's running statistics),
        # which the variant takes under the same names and must update as well
        names = [a.name for a in args]
        writes = tuple(names.index(w) for w in lowering.writes)
        if outs:
            if len(outs) != len(functional.returns):
                continue
            spec = executor.make_spec(parse(variant), lowering, tuple(kept), (*outs, *writes))
        else:
            if len(functional.returns) != 1 or written != [0]:
                continue
            spec = executor.make_spec(parse(variant), lowering, None, (0, *writes))
        if _has(candidate, "CompositeImplicitAutograd"):
            continue
        _register_spec(candidate, spec, "derived")


# ------------------------------------------------------------ special kernels


def _check_device(device) -> None:
    """A clear error for tpu:N beyond the devices this process has (api's own check)."""
    if device is not None:
        from .. import api

        api._index(device)


def _empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    _check_device(device)
    size = tuple(size)
    strides = None
    if memory_format is not None and memory_format != torch.contiguous_format:
        # (dropping channels_last laid resize_as_'s values out in another order than CPU)
        strides = _format_strides(size, memory_format)
    return _uninitialized(new_tensor(size, dtype or torch.get_default_dtype(), None, strides))


def _uninitialized(t: torch.Tensor) -> torch.Tensor:
    """A new tensor's unwritten memory: zeros, or, as CPU fills it under
    `torch.use_deterministic_algorithms(True)` with
    `torch.utils.deterministic.fill_uninitialized_memory`, NaN (floats, complex) or the
    dtype's largest value (integers, bool), so that reading it shows."""
    if not (
        torch.are_deterministic_algorithms_enabled()
        and torch.utils.deterministic.fill_uninitialized_memory
    ):
        return t
    if t.dtype.is_floating_point or t.dtype.is_complex:
        return t.fill_(float("nan"))
    return t.fill_(True if t.dtype == torch.bool else torch.iinfo(t.dtype).max)


def _format_strides(size: tuple, memory_format) -> tuple:
    """PyTorch's strides for a memory format (channels_last...), and its own checks
    (negative sizes, a format of another rank), from a meta tensor."""
    return torch.empty(size, memory_format=memory_format, device="meta").stride()


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    _check_device(device)
    dtype = dtype or torch.get_default_dtype()
    return _uninitialized(new_tensor(tuple(size), dtype, None, tuple(stride)))


def _resize(self, size, memory_format=None):
    size = tuple(size)
    if memory_format is None and tuple(self.shape) == size:
        # CPU keeps the strides of a tensor resized to its own size: `full(out=x[::2])`
        # resizes its out= first, and restriding it wrote outside the view
        return self
    strides = _format_strides(size, memory_format or torch.contiguous_format)
    if tuple(self.shape) != size or tuple(self.stride()) != strides:
        storage = self.untyped_storage()
        if self.storage_offset() + storage_span(size, strides, 0) <= (
            storage.nbytes() // self.element_size()
        ):
            # it fits: the same storage at new sizes, as CPU (its values and every
            # view sharing it stay: a shrink and a regrow give the elements back)
            set_geometry(self, storage, self.storage_offset(), size, strides)
            return self
        old = self.detach().clone() if self.numel() else None
        replace_storage(self, size, strides)
        if old is not None and self.numel():
            # PyTorch keeps the leading elements (in storage order) when a tensor
            # grows, shrinks or is restrided
            keep = min(old.numel(), self.numel())
            flat = self.as_strided((keep,), (1,), self.storage_offset())
            flat.copy_(old.reshape(-1)[:keep])
    return self


def _is_set_to(self, tensor) -> bool:
    """Metadata only, as CPU: the same storage, offset, sizes and strides (the CPU
    fallback compared two host copies: always False)."""
    return (
        self.untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr()
        and self.storage_offset() == tensor.storage_offset()
        and self.shape == tensor.shape
        and self.stride() == tensor.stride()
    )


def _set_empty(self):
    replace_storage(self, (0,))
    return self


_COPY = None


def _plain(t: torch.Tensor) -> torch.Tensor:
    """A lazy module's uninitialized parameter or buffer as a plain tensor over the same
    (empty) storage: the subclass refuses `.shape` and most methods, which CPU's C++
    copy never asks for."""
    if not isinstance(t, torch.nn.parameter.UninitializedTensorMixin):
        return t
    with torch._C.DisableTorchFunctionSubclass():
        return torch.Tensor._make_subclass(torch.Tensor, t)


def _copy(self, src, non_blocking=False):
    if not isinstance(src, torch.Tensor):  # `x.copy_(float("nan"))`: PyTorch's number
        src = torch.tensor(src, device="cpu")
    if isinstance(self, torch.nn.parameter.UninitializedTensorMixin) or isinstance(
        src, torch.nn.parameter.UninitializedTensorMixin
    ):  # (load_state_dict between lazy modules that have not run: empty into empty)
        _copy(_plain(self), _plain(src), non_blocking)
        return self
    if self.device.type == executor.DEVICE_TYPE:
        if src.device.type != executor.DEVICE_TYPE:
            src = upload_to(src, None, self.dtype)
            if _fills_fresh_storage(self, src):  # .to("tpu"): no program per shape
                storage_of(self).value = storage_of(src).value
                return self
        return executor.run(_COPY, (self, src, non_blocking), {})
    # tpu -> host
    host = dtypes.cpu_from_numpy(executor.download(src, "copy to host"), src.dtype)
    self.copy_(host)
    return self


def upload_to(cpu: torch.Tensor, device, dtype: torch.dtype | None) -> torch.Tensor:
    """A new contiguous tpu tensor with cpu's values, converted to dtype on the host."""
    _check_device(device)
    return executor.upload(cpu.to(dtype) if dtype is not None and dtype != cpu.dtype else cpu)


def _fills_fresh_storage(self, src) -> bool:
    """self is the whole of a never-written contiguous storage of src's shape (the empty
    tensor `.to("tpu")` makes): the uploaded array can become its value as it is. A copy_
    program there would compile once per shape (and materialise zeros per size), which
    made every new prompt length a compile."""
    storage = storage_of(self)
    return (
        storage.value is None
        and self.shape == src.shape
        and self.is_contiguous()
        and self.storage_offset() == 0
        and storage.shape == src.shape  # (a whole contiguous view of another shape: copy_)
    )


def _copy_from(self, dst, non_blocking=False):
    return _copy(dst, self, non_blocking)


def _copy_from_and_resize(self, dst):
    if tuple(dst.shape) != tuple(self.shape):
        dst.resize_(self.shape)
    return _copy(dst, self)


def _local_scalar_dense(self):
    """The first element, as CPU's kernel (`.item()` checks for one element before)."""
    if self.numel() == 0:
        raise RuntimeError("_local_scalar_dense: Empty tensor not supported")
    if self.numel() > 1:  # (its element at index 0, ..., 0: a view, no copy)
        self = self.as_strided((1,), (1,), self.storage_offset())
    return executor.download(self, "item()").item()


def _equal(self, other):
    if self.shape != other.shape:
        return False
    return bool(torch.eq(self, other).all().item())


def _nested_tensor_from_mask_left_aligned(t, mask):
    """False: tpu has no nested tensors. nn.TransformerEncoder asks this before packing a
    padded batch into one, and on False keeps the dense fast path (each layer's
    _transformer_encoder_layer_fwd with the padding mask), the path CPU takes with
    enable_nested_tensor=False: padded positions hold computed values, not zeros."""
    return False


def _nested_tensor_from_mask(t, mask, mask_check=True):
    raise NotImplementedError(
        "tpu has no nested tensors: nn.TransformerEncoder(..., mask_check=False) packs a "
        "padded batch into one; build it with enable_nested_tensor=False or mask_check=True"
    )


def _addr_inplace(self, vec1, vec2, *, beta=1, alpha=1):
    """addr_ with CPU's checks: in place, self is not broadcast, so it must be the (n, m)
    matrix itself. PyTorch's composite writes through addr.out, which resized a 0-d or
    (n,) self to (n, m) with a deprecation warning."""
    for name, vec in (("vec1", vec1), ("vec2", vec2)):
        if vec.dim() != 1:
            raise RuntimeError(f"addr: Expected 1-D argument {name}, but got {vec.dim()}-D")
    if self.dim() != 2:
        raise RuntimeError(f"2D tensor expected, got {self.dim()}D tensor for input")
    if tuple(self.shape) != (vec1.shape[0], vec2.shape[0]):
        raise RuntimeError(
            f"size mismatch, input: {list(self.shape)}, v1: {list(vec1.shape)}, "
            f"v2: {list(vec2.shape)}"
        )
    return self.copy_(torch.addr(self, vec1, vec2, beta=beta, alpha=alpha))


def _record_stream(self, stream):
    return None


# Python's shift operators and the bitwise shift ops: one kernel on CPU (results and
# errors alike, in-place forms included), but PyTorch's meta kernel for the operators
# refuses a bool input that CPU promotes (`mask << 1` is an int64 tensor there). The
# operators run the ops.
_SHIFT_OPERATORS = {
    "__lshift__.Tensor": "bitwise_left_shift.Tensor",
    "__lshift__.Scalar": "bitwise_left_shift.Tensor_Scalar",
    "__ilshift__.Tensor": "bitwise_left_shift_.Tensor",
    "__ilshift__.Scalar": "bitwise_left_shift_.Tensor_Scalar",
    "__rshift__.Tensor": "bitwise_right_shift.Tensor",
    "__rshift__.Scalar": "bitwise_right_shift.Tensor_Scalar",
    "__irshift__.Tensor": "bitwise_right_shift_.Tensor",
    "__irshift__.Scalar": "bitwise_right_shift_.Tensor_Scalar",
}


def _running(op: torch._ops.OpOverload):
    """A kernel that runs another op with its arguments."""

    def kernel(*args, **kwargs):
        return op(*args, **kwargs)

    return kernel


def _register_specials() -> None:
    global _COPY
    from ..ops.pointwise import convert
    from ..ops.registry import Lowering as _L

    _COPY = executor.make_spec(
        parse(torch.ops.aten.copy_.default),
        _L("copy_.default", lambda self, src, non_blocking: convert(src, self.dtype)),
    )
    _impl("empty.memory_format", _empty, "special")
    _impl("empty_strided", _empty_strided, "special")
    _impl("resize_", _resize, "special")
    _impl("set_", _set_empty, "special")
    _impl("is_set_to", _is_set_to, "special")
    _impl("copy_", _copy, "special")
    _impl("_copy_from", _copy_from, "special")
    _impl("_copy_from_and_resize", _copy_from_and_resize, "special")
    _impl("_local_scalar_dense", _local_scalar_dense, "special")
    _impl("equal", _equal, "special")
    _impl("record_stream", _record_stream, "special")
    _impl("addr_", _addr_inplace, "special")
    _impl("_nested_tensor_from_mask_left_aligned", _nested_tensor_from_mask_left_aligned, "special")
    _impl("_nested_tensor_from_mask", _nested_tensor_from_mask, "special")
    for name, target in _SHIFT_OPERATORS.items():
        _impl(name, _running(overload(target)), "special")
    for name in _METADATA_OPS:
        op = overload(name)

        # the handle's own redispatch: OpOverload.redispatch wraps it in a Python call,
        # a fifth of what every view (unsqueeze, t, slicing: they end in as_strided) costs
        def metadata_kernel(*args, _redispatch=op._handle.redispatch_boxed, **kwargs):
            return _redispatch(_CPU_KEYS, *args, **kwargs)

        if name in _REINTERPRETING:
            metadata_kernel = _refusing_unsupported_dtype(metadata_kernel)
        _impl(name, metadata_kernel, "metadata")


def _refusing_unsupported_dtype(kernel):
    """A view that reinterprets the storage can make a dtype tpu tensors lack (float16
    seen as complex32): refuse it there, as every other op does, rather than fail at the
    next read with a KeyError."""

    def checked(*args, **kwargs):
        view = kernel(*args, **kwargs)
        if view.dtype not in dtypes.TORCH_TO_JAX:
            raise TypeError(f"tpu tensors do not support dtype {view.dtype}")
        return view

    return checked


# -------------------------------------------------------------- decompositions

_in_decomposition = threading.local()


def _register_decompositions() -> None:
    """Backend-specific ops with no lowering but a PyTorch decomposition run that
    decomposition (into ops we lower) instead of falling back to the CPU."""
    from torch._decomp import decomposition_table

    for op, decomposition in list(decomposition_table.items()):
        if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten":
            continue
        name = f"{op._schema.name.removeprefix('aten::')}.{op._overloadname}"
        if name in KERNELS or name in LOWERINGS:
            continue
        if any(_has(name, key) for key in _COMPOSITE) or not _has(name, "CPU"):
            continue

        def kernel(*args, _op=op, _decomposition=decomposition, _name=name, **kwargs):
            active = getattr(_in_decomposition, "ops", None)
            if active is None:
                active = _in_decomposition.ops = set()
            if _name in active:  # the decomposition calls the op itself
                return fallback.run_on_cpu(_op, args, kwargs)
            refusals.check_per_signature(_op, args, kwargs)
            active.add(_name)
            try:
                return _decomposition(*args, **kwargs)
            except Exception as error:
                cpus = fallback.cpus_error(_op, args, kwargs)
                if cpus is None:
                    raise
                raise type(cpus)(str(cpus)) from error
            finally:
                active.discard(_name)

        _impl(name, kernel, "decomposed")


def register_custom(
    lib: torch.library.Library,
    op: torch._ops.OpOverload,
    lowering: Lowering,
    wrap: Callable[[Callable], Callable] | None = None,
) -> None:
    """The PrivateUse1 kernel of a custom op defined after start-up (a jax_op): the
    executor runs its lowering exactly as it runs an aten op's. `lib` is the op's own
    library (redefining the op replaces both); `wrap` adds the op's own checks."""

    def kernel(*args, **kwargs):
        return executor.run(spec, args, kwargs)

    spec = executor.make_spec(parse(op), lowering)
    lib.impl(op._schema.name.partition("::")[2], wrap(kernel) if wrap else kernel, "PrivateUse1")
    KERNELS[lowering.name] = "lowered"


def register_all() -> None:
    """Install every tpu kernel; called once, at the device's first use (torch_tpu.init).
    Ops left without a kernel reach the PrivateUse1 fallback device.register() installed
    at import, which from then on runs engine.fallback."""
    from .. import ops  # noqa: F401  (imports every op family, filling the registry)

    _register_specials()
    for name, lowering in sorted(LOWERINGS.items()):
        if name in _GRADLESS_BACKWARDS:
            _register_gradless_backward(name, lowering)
        elif name not in KERNELS and name not in _BIT_VIEWS:
            _register_lowering(name, lowering)
    _register_decompositions()
    for name, check in _VALUE_CHECKED.items():
        _register_value_checked(name, check)
