"""`jax_op`: a type-annotated JAX function (jnp, lax, a Pallas kernel) as a PyTorch custom op.

The function becomes, at once:

- an op of the dispatcher (`torch.library.custom_op`, schema from the
  annotations), so Dynamo, AOTAutograd, torch.export and opcheck see it;
- a lowering in the one registry (`ops.registry`, key "namespace::op.default")
  with a PrivateUse1 kernel registered as every lowering's is
  (`engine.kernels.register_custom`): strict mode runs it as one cached
  executable, fused mode records it as a node of the segment, and a compiled
  graph inlines it (`compile.interpret` finds the lowering: no graph break);
- a fake kernel from `jax.eval_shape`;
- a CPU kernel that runs the same function with JAX on the host, so the op
  works on cpu tensors and `opcheck` can compare devices;
- an autograd formula from `jax.vjp` (a second op, "namespace::op_vjp", so the
  backward runs in every mode too); `jax.custom_vjp` rules are honoured and
  `op.register_autograd` replaces the formula.
"""

from __future__ import annotations

import inspect
import types
import typing
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import torch

from .. import dtypes
from .. import tensor as payload

_TENSOR, _OPT_TENSOR, _TENSORS, _STATIC = "Tensor", "Tensor?", "Tensor[]", "static"


@dataclass(frozen=True)
class _Param:
    name: str
    kind: str  # _TENSOR, _OPT_TENSOR, _TENSORS or _STATIC
    schema: str  # the schema's text for it: "Tensor x", "int n=3"
    kwarg_only: bool
    default: object = inspect.Parameter.empty


@dataclass(frozen=True)
class _Signature:
    params: tuple[_Param, ...]
    returns: tuple[str, ...]  # one "Tensor" per returned array, or ("Tensor[]",)
    single: bool  # the function returns one array, not a tuple

    def schema(self) -> str:
        parts, star = [], False
        for p in self.params:
            if p.kwarg_only and not star:
                parts.append("*")
                star = True
            parts.append(p.schema)
        out = self.returns[0] if len(self.returns) == 1 else f"({', '.join(self.returns)})"
        return f"({', '.join(parts)}) -> {out}"


_STATIC_TYPES = {int: "int", float: "float", bool: "bool", str: "str"}


def _is_array(t) -> bool:
    return t is jax.Array or (isinstance(t, type) and issubclass(t, jax.Array))


def _schema_type(name: str, op: str, t) -> tuple[str, str]:
    """(kind, schema type) of one parameter annotation."""
    if _is_array(t):
        return _TENSOR, "Tensor"
    if t in _STATIC_TYPES:
        return _STATIC, _STATIC_TYPES[t]
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin in (typing.Union, types.UnionType) and len(args) == 2 and type(None) in args:
        inner = args[0] if args[1] is type(None) else args[1]
        if _is_array(inner):
            return _OPT_TENSOR, "Tensor?"
        if inner in _STATIC_TYPES and inner is not str:
            return _STATIC, _STATIC_TYPES[inner] + "?"
    if origin in (list, tuple, Sequence, typing.Sequence) and args:
        item = args[0]
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            if len(set(args)) != 1:
                item = None
        if _is_array(item):
            return _TENSORS, "Tensor[]"
        if item in (int, float, bool):
            return _STATIC, _STATIC_TYPES[item] + "[]"
    raise TypeError(
        f"jax_op {op}: parameter {name!r} is annotated {t!r}; use jax.Array, "
        "Optional[jax.Array], list[jax.Array], int, float, bool, str, or a tuple of "
        "ints/floats/bools"
    )


def _default(value) -> str:
    if value is None:
        return "None"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_default(v) for v in value) + "]"
    raise TypeError(f"unsupported default {value!r}")


def _returns(op: str, t) -> tuple[tuple[str, ...], bool]:
    if _is_array(t):
        return ("Tensor",), True
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin is tuple and args and all(_is_array(a) for a in args):
        return tuple("Tensor" for _ in args), False
    if origin in (list, Sequence, typing.Sequence) and args and _is_array(args[0]):
        return ("Tensor[]",), True
    raise TypeError(
        f"jax_op {op}: the return annotation is {t!r}; use jax.Array, a tuple of them "
        "(tuple[jax.Array, jax.Array]) or list[jax.Array]"
    )


def signature_of(fn: Callable, op: str) -> _Signature:
    """The op's schema, read from fn's annotations."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception as error:
        raise TypeError(f"jax_op {op}: cannot read the annotations of {fn!r}: {error}") from None
    params = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"jax_op {op}: *args/**kwargs cannot become a schema")
        if p.name not in hints:
            raise TypeError(f"jax_op {op}: parameter {p.name!r} has no type annotation")
        kind, stype = _schema_type(p.name, op, hints[p.name])
        kwarg_only = p.kind is p.KEYWORD_ONLY
        if kwarg_only and kind != _STATIC:
            raise TypeError(f"jax_op {op}: tensor parameter {p.name!r} cannot be keyword-only")
        text = f"{stype} {p.name}"
        if p.default is not p.empty:
            text += f"={_default(p.default)}"
        params.append(_Param(p.name, kind, text, kwarg_only, p.default))
    if not any(p.kind != _STATIC for p in params):
        raise TypeError(f"jax_op {op}: needs at least one jax.Array parameter")
    if "return" not in hints:
        raise TypeError(f"jax_op {op}: the function needs a return annotation (jax.Array...)")
    returns, single = _returns(op, hints["return"])
    return _Signature(tuple(params), returns, single)


# ------------------------------------------------------------------ Pallas


class _InterpretPallas:
    """Truthy stand-in for Pallas's interpret-mode setting: `pallas_call` evaluates it
    when it traces a kernel, which is when we say, once, that the kernel is interpreted."""

    noted = False

    def __bool__(self) -> bool:
        if not _InterpretPallas.noted:
            _InterpretPallas.noted = True
            warnings.warn(
                "torch_tpu: this platform has no Pallas backend; Pallas kernels in jax_ops "
                "run in Pallas's interpret mode (correct, slow). On TPU/GPU they run natively.",
                stacklevel=4,
            )
        return True


_INTERPRET = _InterpretPallas()


class pallas_platform:
    """Around a traced call of a jax_op's function: on a platform without a Pallas
    backend (XLA:CPU) every `pallas_call` runs in interpret mode."""

    __slots__ = ("interpret", "previous")

    def __init__(self, platform: str) -> None:
        self.interpret = platform == "cpu"
        self.previous = None

    def __enter__(self) -> None:
        if self.interpret:
            self.previous = _interpret_setting().swap_local(_INTERPRET)

    def __exit__(self, *exc) -> None:
        if self.interpret:
            _interpret_setting().set_local(self.previous)


def _interpret_setting():
    """JAX's setting that forces interpret mode on every pallas_call (no public name)."""
    from jax._src import config

    return config.pallas_tpu_interpret_mode_context_manager


def _device_platform() -> str:
    from .. import platform

    return platform.device().platform


# ------------------------------------------------------------------ the op


class JaxOpError(RuntimeError):
    """A jax_op's function failed or returned something its annotation does not allow."""


def _flat_tensors(sig: _Signature, values: Sequence) -> list:
    """Every tensor argument in schema order, lists flattened, absent optionals skipped."""
    out = []
    for p, v in zip(sig.params, values):
        if p.kind == _TENSORS:
            out.extend(v)
        elif p.kind != _STATIC and v is not None:
            out.append(v)
    return out


def _unflatten(sig: _Signature, values: Sequence, leaves: Sequence) -> list:
    """values with its tensor arguments replaced, in order, by leaves."""
    it = iter(leaves)
    out = []
    for p, v in zip(sig.params, values):
        if p.kind == _TENSORS:
            out.append([next(it) for _ in v])
        elif p.kind != _STATIC and v is not None:
            out.append(next(it))
        else:
            out.append(v)
    return out


def _bind(sig: _Signature, args: tuple, kwargs: dict) -> list:
    """Arguments in schema order (the dispatcher leaves out those equal to defaults)."""
    values = list(args)
    for p in sig.params[len(args) :]:
        values.append(kwargs[p.name] if p.name in kwargs else p.default)
    return values


def call(fn: Callable, sig: _Signature, values: Sequence):
    """fn on arguments in schema order (keyword-only ones by name)."""
    positional = [v for p, v in zip(sig.params, values) if not p.kwarg_only]
    keyword = {p.name: v for p, v in zip(sig.params, values) if p.kwarg_only}
    return fn(*positional, **keyword)


def _hashable(value):
    return tuple(value) if isinstance(value, list) else value


def _outputs(op: str, sig: _Signature, out) -> tuple:
    """fn's result as a tuple of leaves, after checking it matches the annotation."""
    if sig.returns == ("Tensor[]",):
        if not isinstance(out, (list, tuple)):
            raise JaxOpError(f"jax_op {op}: returned {type(out).__name__}, annotated a list")
        leaves = tuple(out)
    elif sig.single:
        leaves = (out,)
    else:
        if not isinstance(out, (tuple, list)) or len(out) != len(sig.returns):
            got = f"{len(out)} values" if isinstance(out, (tuple, list)) else type(out).__name__
            raise JaxOpError(
                f"jax_op {op}: returned {got}, the annotation declares "
                f"{len(sig.returns)} arrays"
            )
        leaves = tuple(out)
    for leaf in leaves:
        if not isinstance(leaf, (jax.Array, jax.ShapeDtypeStruct)):
            raise JaxOpError(
                f"jax_op {op}: returned a {type(leaf).__module__}.{type(leaf).__name__}; "
                "a jax_op must return jax.Array values (computed with jax.numpy/lax/Pallas)"
            )
    return leaves


def _shaped(t: torch.Tensor) -> jax.ShapeDtypeStruct:
    # a symbolic size is made concrete (a guard): the op is specialised per shape
    return jax.ShapeDtypeStruct(tuple(int(s) for s in t.shape), dtypes.to_jax(t.dtype))


def eval_shapes(op: str, sig: _Signature, fn: Callable, values: list, hint: str = "") -> tuple:
    """Output (shape, dtype)s of fn on these arguments, from jax.eval_shape (no compute).
    A tracer leaking out of fn is caught here, at its first trace."""
    tensors = [_shaped(t) for t in _flat_tensors(sig, values)]

    def traced(*leaves):
        return call(fn, sig, _unflatten(sig, values, leaves))

    try:
        try:
            with jax.checking_leaks(), pallas_platform("cpu"):
                out = jax.eval_shape(traced, *tensors)
        except Exception as error:
            if "Leaked" not in str(error):
                raise
            # a failed trace also leaves tracers behind: report the failure itself if any
            with pallas_platform("cpu"):
                jax.eval_shape(traced, *tensors)
            raise JaxOpError(
                f"jax_op {op}: the function leaks a tracer (stores a traced value outside "
                f"itself, e.g. in a global or a closure): {error}"
            ) from None
    except JaxOpError:
        raise
    except Exception as error:
        raise JaxOpError(
            f"jax_op {op} failed while tracing ({type(error).__name__}: {error}){hint}"
        ) from error
    return _outputs(op, sig, out)


class _Definition:
    """Everything one jax_op is made of; its kernels close over it."""

    def __init__(
        self, name: str, fn: Callable, sig: _Signature, donate: tuple[int, ...], hint: str = ""
    ):
        self.name = name
        self.hint = hint  # added to tracing errors (the vjp op's: how to give a backward)
        self.fn = fn
        self.sig = sig
        self.donate = donate
        statics = [k for k, p in enumerate(sig.params) if p.kind == _STATIC]
        self._cpu_jit = jax.jit(self._call_cpu, static_argnums=tuple(statics))

    # -- the lowering: traced by strict/fused executables and compiled graphs
    def lowering(self, *args):
        with pallas_platform(_device_platform()):
            out = call(self.fn, self.sig, args)
        leaves = _outputs(self.name, self.sig, out)
        return list(leaves) if self.sig.returns == ("Tensor[]",) else (
            leaves[0] if self.sig.single else leaves
        )

    # -- fake/meta kernel
    def fake(self, *args, **kwargs):
        values = _bind(self.sig, args, kwargs)
        device = _flat_tensors(self.sig, values)[0].device
        values = [_hashable(v) for v in values]
        shapes = eval_shapes(self.name, self.sig, self.fn, values, self.hint)
        outs = [torch.empty(s.shape, dtype=dtypes.to_torch(s.dtype), device=device) for s in shapes]
        return self._pack(outs)

    def _pack(self, outs: list):
        if self.sig.returns == ("Tensor[]",):
            return outs
        return outs[0] if self.sig.single else tuple(outs)

    # -- CPU kernel: the same function, run by JAX on the host
    def _call_cpu(self, *values):
        with pallas_platform("cpu"):
            return call(self.fn, self.sig, values)

    def cpu(self, *args, **kwargs):
        values = [_hashable(v) for v in _bind(self.sig, args, kwargs)]
        host = jax.devices("cpu")[0]
        leaves = [
            jax.device_put(dtypes.numpy_from_cpu(t), host) for t in _flat_tensors(self.sig, values)
        ]
        try:
            out = self._cpu_jit(*_unflatten(self.sig, values, leaves))
        except JaxOpError:
            raise
        except Exception as error:
            raise JaxOpError(
                f"jax_op {self.name} failed on the CPU ({type(error).__name__}: {error})"
            ) from error
        leaves = _outputs(self.name, self.sig, out)
        outs = [dtypes.cpu_from_numpy(np.asarray(x), dtypes.to_torch(x.dtype)) for x in leaves]
        return self._pack(outs)

    # -- around the tpu kernel: argument devices, then donation
    def wrap_tpu(self, kernel: Callable) -> Callable:
        sig, name, donate = self.sig, self.name, self.donate

        def tpu_kernel(*args, **kwargs):
            values = _bind(sig, args, kwargs)
            for p, v in zip(sig.params, values):
                for t in v if p.kind == _TENSORS else (v,):
                    if isinstance(t, torch.Tensor) and t.device.type != "tpu":
                        raise RuntimeError(
                            f"jax_op {name}: argument {p.name!r} is a {t.device.type} tensor "
                            "while others are on tpu; move it with .to('tpu')"
                        )
            result = kernel(*args, **kwargs)
            for index in donate:
                if isinstance(values[index], torch.Tensor):
                    donated(values[index], name)
            return result

        tpu_kernel.__name__ = f"tpu_{name.replace('::', '_')}"
        return tpu_kernel


class DonatedStorage(payload.Storage):
    """The payload of a storage donated to a jax_op: no value, a clear error on use."""

    __slots__ = ("op",)

    def _fail(self):
        raise RuntimeError(
            f"this tpu tensor's storage was donated to {self.op} (donate_argnums) and can "
            "no longer be used; keep a clone if you need the value, or do not donate it"
        )

    def array(self, reason: str = "value needed"):
        self._fail()

    def current(self):
        self._fail()


def donated(t: torch.Tensor, op: str) -> None:
    """Leave t's storage unusable (donate_argnums): every later use raises, naming op.
    Dropping our reference to its array frees it once the op's executable is done."""
    storage = t.untyped_storage()
    old = payload.storage_of(t)
    dead = DonatedStorage(None, old.numel, old.dtype)
    dead.op = op
    payload.replace_payload(storage, dead)


# ------------------------------------------------------------------ autograd


def _inexact(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.inexact)


def vjp_function(definition: _Definition) -> Callable:
    """fn's pullback as a JAX function: (forward args..., cotangents) -> one gradient per
    flattened tensor argument (an empty array for integer ones). The forward is
    recomputed inside it (no residuals cross the op boundary)."""
    sig, fn = definition.sig, definition.fn

    def vjp(*args):
        *values, cotangents = args
        leaves = _flat_tensors(sig, values)
        wrt = [k for k, x in enumerate(leaves) if _inexact(x.dtype)]

        def forward(*diff):
            full = list(leaves)
            for k, x in zip(wrt, diff):
                full[k] = x
            out = call(fn, sig, _unflatten(sig, values, full))
            return tuple(out) if isinstance(out, (tuple, list)) else (out,)

        outs, pullback = jax.vjp(forward, *[leaves[k] for k in wrt])
        cts = tuple(
            jnp.asarray(c).astype(o.dtype)
            if _inexact(o.dtype)
            else np.zeros(o.shape, jax.dtypes.float0)
            for c, o in zip(cotangents, outs)
        )
        grads = dict(zip(wrt, pullback(cts)))
        return [grads.get(k, jnp.zeros((0,), jnp.float32)) for k in range(len(leaves))]

    return vjp


def autograd_rule(definition: _Definition, vjp_op) -> tuple[Callable, Callable]:
    """(backward, setup_context) for CustomOpDef.register_autograd."""
    sig = definition.sig

    def setup_context(ctx, inputs, output, keyword_only_inputs=None):
        values = list(inputs) + [keyword_only_inputs[p.name] for p in sig.params if p.kwarg_only]
        ctx.values = [None if p.kind != _STATIC else v for p, v in zip(sig.params, values)]
        ctx.lengths = [len(v) if p.kind == _TENSORS else None for p, v in zip(sig.params, values)]
        ctx.present = [v is not None for v in values]
        ctx.save_for_backward(*_flat_tensors(sig, values))
        outs = output if isinstance(output, (tuple, list)) else (output,)
        ctx.out_meta = [(o.shape, o.dtype, o.device) for o in outs]

    def backward(ctx, *grads):
        leaves = list(ctx.saved_tensors)
        values = _regroup(sig, ctx.lengths, ctx.present, leaves, ctx.values)
        if sig.returns == ("Tensor[]",):
            grads = tuple(grads[0])
        cotangents = [
            g if g is not None else torch.zeros(shape, dtype=dtype, device=device)
            for g, (shape, dtype, device) in zip(grads, ctx.out_meta)
        ]
        positional = [v for p, v in zip(sig.params, values) if not p.kwarg_only]
        keyword = {p.name: v for p, v in zip(sig.params, values) if p.kwarg_only}
        flat = vjp_op(*positional, cotangents, **keyword)
        flat = [g if x.is_floating_point() or x.is_complex() else None
                for g, x in zip(flat, leaves)]
        out = _regroup(sig, ctx.lengths, ctx.present, flat, [None] * len(sig.params))
        return tuple(out) if len(out) > 1 else out[0]

    return backward, setup_context


def _regroup(sig: _Signature, lengths: list, present: list, flat: list, others: list) -> list:
    """Per parameter: its tensors taken in order from flat (a list for Tensor[]), or, for
    a static or absent one, its entry of others."""
    it = iter(flat)
    out = []
    for p, n, there, other in zip(sig.params, lengths, present, others):
        if p.kind == _TENSORS:
            out.append([next(it) for _ in range(n)])
        elif p.kind != _STATIC and there:
            out.append(next(it))
        else:
            out.append(other)
    return out


def _wants_keywords(sig: _Signature) -> bool:
    return any(p.kwarg_only for p in sig.params)


# ------------------------------------------------------------------ definition


_VJP_HINT = (
    "; JAX cannot differentiate it (a Pallas kernel, for one, has no reverse-mode rule): "
    "give it one with jax.custom_vjp, or register a backward with op.register_autograd"
)


def define(
    name: str, fn: Callable, sig: _Signature, donate: tuple[int, ...], grad: bool, hint: str = ""
):
    """Register the op (dispatcher, registry, kernels) and, if grad, its vjp op."""
    import torch_tpu

    from ..engine import kernels
    from ..ops.registry import LOWERINGS, canonical, lower

    torch_tpu.init()  # JAX with x64, the kernel tables: the op may be used at once
    definition = _Definition(name, fn, sig, donate, hint)
    op = torch.library.custom_op(
        name, definition.cpu, mutates_args=(), device_types="cpu", schema=sig.schema()
    )
    op.register_fake(definition.fake)
    lower(name, replace=True)(definition.lowering)
    kernels.register_custom(
        op._lib, op._opoverload, LOWERINGS[canonical(name)], definition.wrap_tpu
    )
    if grad:
        vjp_params = sig.params + (_Param("cotangents", _TENSORS, "Tensor[] cotangents", False),)
        # keyword-only statics stay keyword-only: cotangents goes before them
        positional = tuple(p for p in vjp_params if not p.kwarg_only)
        keyword = tuple(p for p in vjp_params if p.kwarg_only)
        vjp_sig = _Signature(positional + keyword, ("Tensor[]",), True)
        vjp_def = _reorder(vjp_function(definition), sig, vjp_sig)
        vjp_op = define(f"{name}_vjp", vjp_def, vjp_sig, (), grad=False, hint=_VJP_HINT)
        backward, setup = autograd_rule(definition, vjp_op)
        if _wants_keywords(sig):
            op.register_autograd(
                backward,
                setup_context=lambda ctx, inputs, keyword_only_inputs, output: setup(
                    ctx, inputs, output, keyword_only_inputs
                ),
            )
        else:
            op.register_autograd(backward, setup_context=setup)
    op.jax_function = fn
    return op


def _reorder(vjp: Callable, sig: _Signature, vjp_sig: _Signature) -> Callable:
    """The vjp op is called as (positional forward args, cotangents, **keyword-only
    statics); the vjp function wants (forward args in schema order, cotangents)."""

    def ordered(*args, **keyword):
        *positional, cotangents = args
        values = positional + [keyword[p.name] for p in sig.params if p.kwarg_only]
        return vjp(*values, cotangents)

    return ordered


def jax_op(
    name: str,
    fn: Callable | None = None,
    /,
    *,
    donate_argnums: int | Sequence[int] | None = None,
):
    """Turn a type-annotated JAX function into a PyTorch custom op ("namespace::name").

    Parameters annotated `jax.Array` (or Optional/list of it) are tensors;
    int/float/bool/str and tuples of numbers are static (part of the cache
    key). The return annotation (`jax.Array`, a tuple of them, a list) gives
    the outputs. Without fn, a decorator. Arguments in donate_argnums are left
    unusable after a tpu call (a later use raises). See docs/kernels.md.
    """
    if fn is None:
        return lambda f: jax_op(name, f, donate_argnums=donate_argnums)
    if not isinstance(name, str) or name.count("::") != 1:
        raise ValueError(f"jax_op: name must be 'namespace::op', got {name!r}")
    sig = signature_of(fn, name)
    if isinstance(donate_argnums, int):
        donate_argnums = (donate_argnums,)
    donate = tuple(donate_argnums or ())
    for index in donate:
        if not 0 <= index < len(sig.params) or sig.params[index].kind != _TENSOR:
            raise ValueError(
                f"jax_op {name}: donate_argnums entry {index} is not a jax.Array parameter"
            )
    return define(name, fn, sig, donate, grad=True)
