"""Pointwise math with PyTorch's type promotion, forward and backward.

Each lowering casts its operands to the dtype PyTorch computes the op in
(the promoted dtype, float32 for half types as CPU kernels do, float for
integer inputs of float functions) and leaves the final cast to the engine,
which already knows the result dtype from PyTorch's meta kernel. Scalars
arrive as weakly typed numbers and promote like Python scalars; 0-dim tensors
promote with lower priority than dimensioned ones, as in PyTorch.
"""

from __future__ import annotations

import functools
import math
import warnings

import jax.numpy as jnp
import jax.scipy.special as jss
import torch
from jax import lax
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as Promo
from torch._prims_common import elementwise_dtypes

from .. import dtypes
from . import incomplete_gamma
from .erfcx import erf, erfcx, log_ndtr
from .lgamma import lgamma
from .registry import lower

# ------------------------------------------------------------ type promotion


def convert(x, dtype):
    """x as dtype, converting floats to integers as PyTorch's CPU kernels do on x86
    (XLA saturates instead): truncate through int32 (int64 for 64-bit targets), a value
    out of that range or NaN becoming its minimum, then wrap to the target's width
    (-3.7 -> uint8 253, 300.0 -> int8 44)."""
    x, dtype = jnp.asarray(x), jnp.dtype(dtype)
    if jnp.iscomplexobj(x) and dtype.kind not in "cb":  # (to bool: nonzero, both parts)
        # CPU's warning, not JAX's ("will soon raise"): the real part, then as a float
        warnings.warn(
            "Casting complex values to real discards the imaginary part", UserWarning, stacklevel=2
        )
        x = jnp.real(x)
    if not (jnp.issubdtype(x.dtype, jnp.floating) and jnp.issubdtype(dtype, jnp.integer)):
        return x.astype(dtype)
    if x.dtype.itemsize < 4:  # (exactly; float16 cannot hold the limit: inf "fits" below it)
        x = x.astype(jnp.float32)
    via = jnp.int64 if dtype.itemsize == 8 else jnp.int32
    limit = float(2 ** (jnp.iinfo(via).bits - 1))
    whole = jnp.trunc(x)
    fits = (whole >= -limit) & (whole < limit)
    wide = jnp.where(fits, jnp.where(fits, whole, 0).astype(via), jnp.iinfo(via).min)
    return wide.astype(dtype)


def _is_scalar(x) -> bool:
    """A Scalar argument: a Python number, or one traced as a weakly typed value."""
    if isinstance(x, (bool, int, float, complex)):
        return True
    return bool(getattr(getattr(x, "aval", None), "weak_type", False))


def _describe(x) -> tuple:
    if _is_scalar(x):
        return ("scalar", jnp.result_type(x).kind)
    return ("tensor", x.ndim > 0, jnp.dtype(x.dtype))


_SCALAR_STAND_INS = {"b": True, "i": 1, "u": 1, "f": 1.0, "c": 1j}


def _stand_in(description):
    if description[0] == "scalar":
        return _SCALAR_STAND_INS[description[1]]
    _, dimensioned, dtype = description
    return torch.empty((1,) if dimensioned else (), dtype=dtypes.to_torch(dtype), device="meta")


_REDUCED = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))


@functools.cache
def _dtypes(descriptions: tuple, kind, default_dtype: torch.dtype) -> tuple:
    """(compute dtype, result dtype, common dtype if it is float16/bfloat16 else None)."""
    # (default_dtype: what integers promote to; elementwise_dtypes reads it itself)
    stand_ins = tuple(map(_stand_in, descriptions))
    compute, result = elementwise_dtypes(*stand_ins, type_promotion_kind=kind)
    common = result
    if kind is Promo.ALWAYS_BOOL:  # (the operands' common dtype, not the result's)
        _, common = elementwise_dtypes(*stand_ins, type_promotion_kind=Promo.DEFAULT)
    common = dtypes.to_jax(common)
    reduced = common if common in _REDUCED else None
    return dtypes.to_jax(compute), dtypes.to_jax(result), reduced


def _round_to(x, common):
    """x rounded to the reduced float dtype `common`, through float32 as C++ converts a
    double (a Scalar, a float64 tensor) or an integer to c10::Half/BFloat16."""
    if x.dtype == common:
        return x
    return x.astype(jnp.float32).astype(common)


def _cast(kind, *xs, exact_other=False):
    """xs (None passes through) in the dtype PyTorch computes this op in.

    Where the operands' common dtype is float16 or bfloat16, each operand is first
    rounded to it, as CPU's TensorIterator casts its inputs before a kernel computes in
    float32: `x_f16 + 0.1` adds float16(0.1), and so does a float32 or float64 0-dim
    tensor in its place. exact_other: CPU's mul and div kernels read a one-element
    second operand at its own precision instead (`x_f16 * 0.1` multiplies by float32(0.1))."""
    descriptions = tuple(_describe(x) for x in xs if x is not None)
    dtype, _, common = _dtypes(descriptions, kind, torch.get_default_dtype())
    out = []
    for k, x in enumerate(xs):
        if x is not None:
            x = jnp.asarray(x)
            if common is not None and not (exact_other and k == 1 and x.size == 1):
                x = _round_to(x, common)
            x = x.astype(dtype)
        out.append(x)
    return out


def _common_dtype(kind, *xs):
    """The operands' common dtype where it is float16/bfloat16 (else None): what CPU
    rounds a Scalar that takes no part in promotion (add's alpha) to."""
    descriptions = tuple(_describe(x) for x in xs if x is not None)
    return _dtypes(descriptions, kind, torch.get_default_dtype())[2]


def _result_dtype(kind, *xs):
    descriptions = tuple(_describe(x) for x in xs if x is not None)
    return _dtypes(descriptions, kind, torch.get_default_dtype())[1]


def _like(value, x, common=None):
    """A Scalar argument that takes no part in promotion (alpha, value) in x's dtype;
    rounded to `common` first where CPU does (add's alpha)."""
    value = jnp.asarray(value)
    if common is not None:
        value = _round_to(value, common)
    return value.astype(x.dtype)


def _is_int(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.integer)


def _is_complex(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.complexfloating)


def _unary(fn, kind=Promo.INT_TO_FLOAT):
    def lowering(self):
        return fn(*_cast(kind, self))

    return lowering


def _binary(fn, kind=Promo.DEFAULT, exact_other=False):
    def lowering(self, other):
        return fn(*_cast(kind, self, other, exact_other=exact_other))

    return lowering


# ---------------------------------------------------------------- arithmetic


def _check_alpha(values: list) -> bool:
    """CPU's checks of add's and sub's alpha against the result dtype (PyTorch's meta
    kernels let a float alpha on bool tensors through, and word the rest otherwise)."""
    alpha = values[2]
    dtype = torch.result_type(values[0], values[1])
    if isinstance(alpha, bool) and dtype != torch.bool:
        raise RuntimeError("Boolean alpha only supported for Boolean results.")
    if isinstance(alpha, float) and not (dtype.is_floating_point or dtype.is_complex):
        raise RuntimeError(
            "For integral input tensors, argument alpha must not be a floating point number."
        )
    if isinstance(alpha, complex) and not dtype.is_complex:
        raise RuntimeError(
            "For non-complex input tensors, argument alpha must not be a complex number."
        )
    return False  # (alpha's type is part of the cache key)


@lower("add.Tensor", "add.Scalar", check=_check_alpha)
def add(self, other, alpha=1):
    a, b = _cast(Promo.DEFAULT, self, other)
    return a + b * _like(alpha, b, _common_dtype(Promo.DEFAULT, self, other))


def _is_bool(value) -> bool:
    if isinstance(value, torch.Tensor):
        return value.dtype == torch.bool
    return isinstance(value, bool)


def _check_sub(values: list) -> bool:
    """CPU refuses to subtract with a bool operand, a Python True or False included
    (the meta kernels look at tensors only: tpu subtracted True as 1); then alpha's checks."""
    self_bool, other_bool = _is_bool(values[0]), _is_bool(values[1])
    if self_bool and other_bool:
        raise RuntimeError(
            "Subtraction, the `-` operator, with two bool tensors is not supported. "
            "Use the `^` or `logical_xor()` operator instead."
        )
    if self_bool or other_bool:
        raise RuntimeError(
            "Subtraction, the `-` operator, with a bool tensor is not supported. "
            "If you are trying to invert a mask, use the `~` or `logical_not()` operator instead."
        )
    return _check_alpha(values)


@lower("sub.Tensor", "sub.Scalar", check=_check_sub)
def sub(self, other, alpha=1):
    a, b = _cast(Promo.DEFAULT, self, other)
    return a - b * _like(alpha, b, _common_dtype(Promo.DEFAULT, self, other))


@lower("rsub.Tensor", "rsub.Scalar", check=_check_sub)
def rsub(self, other, alpha=1):
    return sub(other, self, alpha)


lower("mul.Tensor", "mul.Scalar")(_binary(jnp.multiply, exact_other=True))
lower("div.Tensor", "div.Scalar")(_binary(jnp.true_divide, Promo.INT_TO_FLOAT, exact_other=True))


def _exact(value):
    return value


def _floor_divide_float(a, b, rounded=_exact):
    """Float floor division as PyTorch rounds it: from fmod, so a == b * q + r
    holds as closely as floats allow; IEEE a / b when b is zero. `rounded` rounds
    each intermediate result (CPU's float16/bfloat16 kernels compute step by step in
    the tensor's dtype)."""
    mod = jnp.fmod(a, b)
    quotient = rounded(rounded(a - mod) / b)
    quotient = jnp.where((mod != 0) & ((b < 0) != (mod < 0)), rounded(quotient - 1), quotient)
    floored = jnp.floor(quotient)
    floored = jnp.where(quotient - floored > 0.5, rounded(floored + 1), floored)
    plain = rounded(a / b)
    floored = jnp.where(quotient == 0, jnp.copysign(jnp.zeros_like(a), plain), floored)
    return jnp.where(b == 0, plain, floored)


def _floor_divide(a, b, rounded=_exact):
    if _is_int(a):
        return jnp.floor_divide(a, b)
    return _floor_divide_float(a, b, rounded)


def _trunc_divide(a, b, rounded=_exact):
    if _is_int(a):
        return lax.div(*jnp.broadcast_arrays(a, b))  # XLA rounds toward zero, like C
    return jnp.trunc(rounded(a / b))


def _rounding_division(fn):
    """fn(a, b, rounded) as CPU computes it: for float16/bfloat16, in float32 when b has
    one element (CPU's kernels read it as a scalar), else rounding each step to the
    dtype (`trunc(a / b)` truncates float16(a / b): 33 of 4096 quotients differ)."""

    def lowering(self, other):
        a, b = _cast(Promo.DEFAULT, self, other, exact_other=True)
        common = _common_dtype(Promo.DEFAULT, self, other)
        if common is None or b.size == 1:
            return fn(a, b)
        return fn(a, b, lambda v: v.astype(common).astype(v.dtype))

    return lowering


def _host_number(value):
    """A divisor or exponent given on the host (a Python number, or the 0-d CPU tensor
    PyTorch wraps one in) as a Python number; None for a device tensor."""
    if isinstance(value, torch.Tensor):
        return value.item() if value.device.type == "cpu" and value.dim() == 0 else None
    return value


def _check_integer_division(values: list) -> bool:
    """CPU raises for an integer division by zero. A divisor on the host is judged at
    every call (a repeat call with another number skips the meta kernel and the key);
    zeros in a divisor on the device divide as XLA does (docs/differences.md)."""
    self, other = values[0], values[1]
    if not isinstance(self, torch.Tensor) or self.is_floating_point() or self.is_complex():
        return False
    if isinstance(other, torch.Tensor) and (other.is_floating_point() or other.is_complex()):
        return False
    divisor = _host_number(other)
    if divisor is None and _divides_by_device_integers(values):
        return _read_in_debug_mode(self, other)
    if divisor is None or isinstance(divisor, (float, complex)):
        return False
    if divisor == 0:
        raise RuntimeError("ZeroDivisionError")
    return True


def _divides_by_device_integers(values: list) -> bool:
    """An integer division whose divisor is a tpu tensor: CPU raises for a zero in it,
    which only the device can see without a sync (engine/device_asserts.py). A divisor
    on the host is `_check_integer_division`'s; floats divide by zero as CPU does."""
    self, other = values[0], values[1]
    if len(values) > 2 and values[2] is None:  # div without a rounding mode: true division
        return False
    return (
        isinstance(other, torch.Tensor)
        and other.device.type != "cpu"
        and _integral(self)
        and _integral(other)
    )


def _read_in_debug_mode(self: torch.Tensor, other: torch.Tensor) -> bool:
    """Debug mode stops at the call, as CPU does: it reads a device divisor (a sync);
    the other modes leave it to the device (`_zero_divisors`)."""
    from ..engine import modes

    if modes.current is not modes.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING:
        return False
    empty = not math.prod(torch.broadcast_shapes(self.shape, other.shape))
    if not empty and bool((other == 0).any()):
        raise RuntimeError("ZeroDivisionError")
    return True  # (debug mode runs its checks on every call)


def _integral(value) -> bool:
    if isinstance(value, torch.Tensor):
        return dtypes.is_integer(value.dtype)
    return isinstance(value, int) and not isinstance(value, bool)


def _zero_divisors(self, other, rounding_mode="floor") -> list:
    """In the program (for the calls `_divides_by_device_integers` picks): CPU's
    ZeroDivisionError for a zero among the divisor's elements, unless the result is
    empty (CPU divides nothing then)."""
    if not math.prod(jnp.broadcast_shapes(jnp.shape(self), jnp.shape(other))):
        return []
    return [(jnp.any(other == 0), RuntimeError, "ZeroDivisionError")]


_ZERO_DIVISORS = {
    "device_check": _zero_divisors,
    "device_check_applies": _divides_by_device_integers,
}


def _check_rounded_division(values: list) -> bool:
    """div with a rounding mode divides integers as floor_divide does; true division
    gives floats."""
    return len(values) > 2 and values[2] is not None and _check_integer_division(values)


_ROUNDED_DIVISIONS = {
    "trunc": _rounding_division(_trunc_divide),
    "floor": _rounding_division(_floor_divide),
}


@lower("div.Tensor_mode", "div.Scalar_mode", check=_check_rounded_division, **_ZERO_DIVISORS)
def div_mode(self, other, rounding_mode=None):
    if rounding_mode is None:
        return jnp.true_divide(*_cast(Promo.INT_TO_FLOAT, self, other, exact_other=True))
    return _ROUNDED_DIVISIONS[rounding_mode](self, other)


lower(
    "floor_divide.default", "floor_divide.Scalar", check=_check_integer_division, **_ZERO_DIVISORS
)(_ROUNDED_DIVISIONS["floor"])
lower("remainder.Tensor", "remainder.Scalar", check=_check_integer_division, **_ZERO_DIVISORS)(
    _binary(jnp.remainder)
)
lower("remainder.Scalar_Tensor", **_ZERO_DIVISORS)(_binary(jnp.remainder))
lower("fmod.Tensor", "fmod.Scalar", check=_check_integer_division, **_ZERO_DIVISORS)(
    _binary(jnp.fmod)
)


def _int_power(base, exponent):
    """Integer power by repeated squaring over every exponent bit, wrapping on
    overflow; negative exponents give 1/base truncated (1, -1 or 0), as PyTorch."""
    base, exponent = jnp.broadcast_arrays(base, exponent)
    negative = exponent < 0

    def step(carry):
        result, square, remaining = carry
        result = jnp.where(remaining & 1, result * square, result)
        return result, square * square, remaining >> 1

    start = (jnp.ones_like(base), base, jnp.where(negative, 0, exponent))
    result, _, _ = lax.while_loop(lambda c: jnp.any(c[2] != 0), step, start)
    odd = (exponent & 1) != 0
    inverse = jnp.where(base == 1, 1, jnp.where(base == -1, jnp.where(odd, -1, 1), 0))
    return jnp.where(negative, inverse.astype(base.dtype), result)


def _power(base, exponent):
    if _is_int(base):
        return _int_power(base, exponent)
    if _is_complex(base):
        return _complex_power(base, exponent)
    return jnp.power(base, exponent)


def _complex_power(base, exponent):
    """0 ** z is 0 where z's real part is positive, as on CPU (XLA's complex power
    gave NaN for a complex exponent)."""
    power = jnp.power(base, exponent)
    return jnp.where((base == 0) & (jnp.real(exponent) > 0), jnp.zeros_like(power), power)


lower("pow.Tensor_Tensor", "pow.Scalar")(_binary(_power))


def _check_integer_power(values: list) -> bool:
    """CPU's refusal of an integer tensor to a negative integer power, judged at every
    call: PyTorch's meta kernel says it at the first call only, and a repeat call with
    another exponent skips it (pow(x, 2) then pow(x, -1) gave [1, 0, 0])."""
    self, exponent = values[0], values[1]
    if self.is_floating_point() or self.is_complex() or isinstance(exponent, (float, complex)):
        return False
    if exponent < 0:
        raise RuntimeError("Integers to negative integer powers are not allowed.")
    return True


@lower("pow.Tensor_Scalar", check=_check_integer_power)
def pow_scalar(self, exponent):
    """CPU's (and CUDA's) pow(tensor, number) computes the exponents 1, 2, 3, -1 and -2 as
    products and quotients (x * x * x), and 0.5 and -0.5 as sqrt and 1/sqrt (pow(-inf,
    0.5) is NaN and pow(-0.0, 0.5) is -0.0 there, inf and 0.0 in C's pow). XLA's pow gave
    pow(1j, 2) = -1 - 8.7e-8j where CPU's is -1 + 0j, pow(3 + 4j, 1) = 3 + 3.99..j, and
    float32 x ** 3 differed from CPU's x * x * x in 26% of elements. float16 computes
    the products in float32, rounded once, and leaves 0.5 and -0.5 to pow; bfloat16
    rounds each product; both as CPU's kernel."""
    base, exponent = _cast(Promo.DEFAULT, self, exponent)
    power = _power(base, exponent)
    if _is_int(base):
        return power
    dtype, x = jnp.asarray(self).dtype, dtypes.widen_half(base)

    def step(v):  # (bfloat16 arrives widened: its products are rounded here)
        return dtypes.rounded_to(v, dtype) if dtype == jnp.bfloat16 else v

    square = step(x * x)
    forms = [(1, x), (2, square), (3, step(square * x)), (-1, 1 / x), (-2, 1 / square)]
    if dtype != jnp.float16:
        root = _sqrt(base)
        forms += [(0.5, root), (-0.5, 1 / root)]
    for value, form in forms:
        power = jnp.where(exponent == value, form.astype(power.dtype), power)
    return power


def _check_ldexp(values: list) -> bool:
    """CPU computes a complex self's power of two in a complex dtype: complex32 has no
    pow kernel (a float16 exponent)."""
    self, other = values[0], values[1]
    if self.dtype.is_complex and other.dtype == torch.float16 and other.dim() > 0:
        raise NotImplementedError("\"pow\" not implemented for 'ComplexHalf'")
    return False  # dtypes are part of the key


@lower("ldexp.Tensor", "ldexp_.default", check=_check_ldexp)
def ldexp(self, other):
    """self * 2**other. A real floating self with an integer exponent is scaled exactly,
    in its own dtype (CPU's std::ldexp: float16's 2**-25 and 2**20 would be 0 and inf);
    otherwise mul(self, pow(2.0, other)), as CPU."""
    if jnp.issubdtype(self.dtype, jnp.floating) and not jnp.issubdtype(other.dtype, jnp.inexact):
        # the exponent as a C int (int64 wraps), clipped where every result is 0 or inf
        exponent = jnp.clip(other.astype(jnp.int32), -4096, 4096)
        return jnp.ldexp(self, exponent)
    two = jnp.asarray(2, self.dtype) if _is_complex(self) else 2.0  # (CPU: 2 in self's dtype)
    power = _power(*_cast(Promo.DEFAULT, two, other))
    power = power.astype(_result_dtype(Promo.DEFAULT, two, other))
    return jnp.multiply(*_cast(Promo.DEFAULT, self, power, exact_other=True))


def _check_complex_value(values: list) -> None:
    """CPU refuses a complex `value` with an imaginary part for a real result; tpu
    dropped the imaginary part. CPU's own kernel, on empty tensors of the result dtype,
    raises its error in its words."""
    value = values[3]
    if not isinstance(value, complex) or not value.imag:
        return
    _, dtype = elementwise_dtypes(*values[:3], type_promotion_kind=Promo.DEFAULT)
    if not dtype.is_complex and dtype != torch.bool:
        empty = torch.empty((0,), dtype=dtype, device="cpu")
        torch.addcmul(empty, empty, empty, value=value)


@lower("addcmul.default", check=_check_complex_value)
def addcmul(self, tensor1, tensor2, value=1):
    s, a, b = _cast(Promo.DEFAULT, self, tensor1, tensor2)
    return s + _like(value, s) * a * b


_INTEGER_ADDCDIV = (
    "Integer division with addcdiv is no longer supported, and in a future  release addcdiv "
    "will perform a true division of tensor1 and tensor2. The historic addcdiv behavior can "
    "be implemented as (input + value * torch.trunc(tensor1 / tensor2)).to(input.dtype) for "
    "integer inputs and as (input + value * tensor1 / tensor2) for float inputs. The future "
    "addcdiv behavior is just the latter implementation: (input + value * tensor1 / tensor2), "
    "for all dtypes."
)


def _check_addcdiv(values: list) -> None:
    """CPU's message for integer division (PyTorch's meta kernel words it as the repr of
    a tuple), then the complex value's check."""
    if not values[1].is_floating_point() and not values[1].is_complex():
        if not values[2].is_floating_point() and not values[2].is_complex():
            raise RuntimeError(_INTEGER_ADDCDIV)
    _check_complex_value(values)


@lower("addcdiv.default", check=_check_addcdiv)
def addcdiv(self, tensor1, tensor2, value=1):
    s, a, b = _cast(Promo.DEFAULT, self, tensor1, tensor2)
    return s + _like(value, s) * (a / b)


@lower("lerp.Scalar", "lerp.Tensor")
def lerp(self, end, weight):
    """Two formulas, each exact at its end of the interval, as PyTorch."""
    a, b = _cast(Promo.DEFAULT, self, end)
    w = jnp.asarray(weight).astype(a.dtype)  # (CPU reads a Scalar weight unrounded)
    diff = b - a
    return jnp.where(jnp.abs(w) < 0.5, a + w * diff, b - diff * (1 - w))


def _sign(x):
    if x.dtype == jnp.bool_:
        return x
    return (x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)  # NaN -> 0, as PyTorch


def _sgn(x):
    if not _is_complex(x):
        return _sign(x)
    magnitude = jnp.abs(x)
    return jnp.where(magnitude == 0, 0, x / jnp.where(magnitude == 0, 1, magnitude))


def _keep_ints(fn):
    """Rounding functions leave integer tensors unchanged."""
    return lambda x: x if _is_int(x) or x.dtype == jnp.bool_ else fn(x)


def _frac(x):
    return x - jnp.trunc(x)


def _same_dtype_out(values: list) -> None:
    """Ops whose CPU kernel wants out= in the input's dtype (no cast on the way out)."""
    out = values[-1]
    if len(values) > 1 and isinstance(out, torch.Tensor) and out.dtype != values[0].dtype:
        found, expected = scalar_type_name(out.dtype), scalar_type_name(values[0].dtype)
        raise RuntimeError(f"Found dtype {found} but expected {expected}")


def _nan_to_num_out(values: list) -> None:
    out = values[-1]
    if len(values) > 4 and isinstance(out, torch.Tensor) and out.dtype != values[0].dtype:
        raise RuntimeError(
            f"nan_to_num: dtype of out: {scalar_type_name(out.dtype)} should be same as "
            f"input: {scalar_type_name(values[0].dtype)}"
        )


_NAMES = {
    torch.bool: "Bool",
    torch.uint8: "Byte",
    torch.int8: "Char",
    torch.int16: "Short",
    torch.int32: "Int",
    torch.int64: "Long",
    torch.float16: "Half",
    torch.bfloat16: "BFloat16",
    torch.float32: "Float",
    torch.float64: "Double",
    torch.complex32: "ComplexHalf",
    torch.complex64: "ComplexFloat",
    torch.complex128: "ComplexDouble",
}


def check_fill_value(value, dtype: torch.dtype) -> bool:
    """CPU's check that a fill value converts to the tensor's dtype (c10's checked_convert:
    a complex value with an imaginary part into a real dtype, 300 into uint8, NaN into an
    integer raise there, where XLA wraps or drops silently), judged by CPU itself. Returns
    whether the verdict depends on the value (the op is checked again at every call):
    only for value types that can fail for this dtype, so float fills of float tensors
    (masked_fill(-inf)) keep the fast path; a float beyond a float dtype's range (1e300
    into float16), which CPU refuses, becomes inf here (docs/differences.md)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, complex)):
        return False
    if dtype == torch.bool:
        return False
    complex_into_real = isinstance(value, complex) and not dtype.is_complex
    integer = not (dtype.is_floating_point or dtype.is_complex)
    # (into int64, only a float or an int beyond int64's range, 2**63, can fail)
    int64_safe = dtype == torch.int64 and isinstance(value, int) and -(2**63) <= value < 2**63
    if not (complex_into_real or (integer and not int64_safe)):
        return False
    torch.empty((), dtype=dtype, device="cpu").fill_(value)  # raises CPU's error
    return True


def scalar_type_name(dtype: torch.dtype) -> str:
    """PyTorch's C++ name of a dtype (Long, Float, ...), as its error messages spell it."""
    return _NAMES.get(dtype, str(dtype))


lower("neg.default", check=_same_dtype_out)(_unary(jnp.negative, Promo.DEFAULT))
lower("_neg_view.default")(_unary(jnp.negative, Promo.DEFAULT))


def _abs(x):
    """|x|; a complex value with an infinite part is inf even when the other part is
    NaN, as CPU's hypot gives (XLA's complex abs says NaN)."""
    if not jnp.iscomplexobj(x):
        return jnp.abs(x)
    infinite = jnp.isinf(x.real) | jnp.isinf(x.imag)
    return jnp.where(infinite, jnp.inf, jnp.abs(x)).astype(x.real.dtype)


lower("abs.default")(_unary(_abs, Promo.DEFAULT))
lower("sign.default")(_unary(_sign, Promo.DEFAULT))
lower("sgn.default")(_unary(_sgn, Promo.DEFAULT))
lower("floor.default")(_unary(_keep_ints(jnp.floor), Promo.DEFAULT))
lower("ceil.default")(_unary(_keep_ints(jnp.ceil), Promo.DEFAULT))
# half to even
lower("round.default", check=_same_dtype_out)(_unary(_keep_ints(jnp.round), Promo.DEFAULT))
lower("trunc.default")(_unary(_keep_ints(jnp.trunc), Promo.DEFAULT))
lower("frac.default")(_unary(_frac, Promo.DEFAULT))


@lower("round.decimals")
def round_decimals(self, decimals):
    (x,) = _cast(Promo.DEFAULT, self)
    scale = 10.0 ** abs(decimals)
    if decimals >= 0:
        return jnp.round(x * scale) / scale
    return jnp.round(x / scale) * scale


# ------------------------------------------------------ elementary functions


def _rsqrt(x):
    return 1 / _sqrt(x) if _is_complex(x) else lax.rsqrt(x)


def _sqrt(z):
    """sqrt; for complex z with C99's signs, as CPU's: the imaginary part takes y's sign,
    -0 included (XLA's took +0's: sqrt(-(4 + 0j)) = sqrt(-4 - 0j) gave +2j where CPU
    gives -2j), and an infinite part makes it infinite (sqrt(nan + inf j) = inf + inf j)."""
    if not _is_complex(z):
        return jnp.sqrt(z)
    x, y, root = z.real, z.imag, jnp.sqrt(z)
    inf = jnp.array(jnp.inf, x.dtype)
    re = jnp.where(jnp.isinf(y) | ((x == inf) & jnp.isnan(y)), inf, jnp.abs(root.real))
    im = jnp.where(jnp.isinf(y), y, jnp.where(jnp.signbit(y), -1, 1) * jnp.abs(root.imag))
    im = jnp.where((x == -inf) & jnp.isnan(y), inf, im)
    return lax.complex(re, im)


def _expm1(z):
    """expm1; complex z as expm1(x) cos(y) - 2 sin(y/2)^2 + i exp(x) sin(y), as CPU's:
    XLA's real part cancelled near y = 2 pi k for a small x (2% off at expm1(-5.4e-7 -
    6.2833j))."""
    if not _is_complex(z):
        return jnp.expm1(z)
    x, y = z.real, z.imag
    half_sine = jnp.sin(0.5 * y)
    real = jnp.expm1(x) * jnp.cos(y) - 2 * half_sine * half_sine
    return lax.complex(real, jnp.exp(x) * jnp.sin(y))


def _tan(z):
    """tan; for complex z, a real z (y = +-0) keeps its zero imaginary part, as C99's (and
    CPU's) do: tan(inf + 0j) is NaN + 0j, where XLA's gave NaN + NaN j."""
    if not _is_complex(z):
        return jnp.tan(z)
    w, y = jnp.tan(z), z.imag
    return lax.complex(w.real, jnp.where(y == 0, y, w.imag))


def _tanh(z):
    """tanh; for complex z, an imaginary z (x = +-0) keeps its zero real part, as C99's
    (and CPU's) do: tanh(0 + inf j) is 0 + NaN j, where XLA's gave NaN + NaN j."""
    if not _is_complex(z):
        return jnp.tanh(z)
    w, x = jnp.tanh(z), z.real
    return lax.complex(jnp.where(x == 0, x, w.real), w.imag)


def _folded(f, odd: bool):
    """An inverse trig or hyperbolic function f of complex z by its symmetries from the
    upper half plane (odd ones: the first quadrant), as C99 defines them on the branch
    cuts: there a signed zero picks the side, which XLA's took as +0 (asin(3 - 0j) came
    out pi/2 + 1.76j, CPU's pi/2 - 1.76j; asinh(-0 + 3j) 1.76 + pi/2 j, CPU's -1.76 +
    pi/2 j). f(conj z) = conj f(z) for all of them, and odd ones f(-z) = -f(z)."""

    def folded(z):
        if not _is_complex(z):
            return f(z)
        x, y = z.real, z.imag
        w = f(lax.complex(jnp.abs(x) if odd else x, jnp.abs(y)))
        re = jnp.where(jnp.signbit(x), -w.real, w.real) if odd else w.real
        return lax.complex(re, jnp.where(jnp.signbit(y), -w.imag, w.imag))

    return folded


def _sigmoid(x):
    return 1 / (1 + jnp.exp(-x)) if _is_complex(x) else lax.logistic(x)


def _digamma(x):
    """PyTorch's poles: digamma(±0) is ∓inf, negative integers give NaN."""
    pole = jnp.where(jnp.signbit(x), jnp.inf, -jnp.inf).astype(x.dtype)
    return jnp.where(x == 0, pole, jss.digamma(x))


def _trigamma(x):
    """psi'(x) by reflection below 1/2, six recurrence steps and the asymptotic series:
    jax's polygamma(1, x) is wrong for negative x, and near the poles the result
    follows sin(pi * x) in x's precision, as PyTorch's CPU kernel does."""
    reflect = x < 0.5
    sin_pi_x = jnp.sin(math.pi * x)
    total = jnp.where(reflect, -(math.pi**2) / (sin_pi_x * sin_pi_x), 0)
    z = jnp.where(reflect, 1 - x, x)
    for _ in range(6):
        total = total + 1 / (z * z)
        z = z + 1
    w = 1 / (z * z)
    total = total + (1 + 1 / (2 * z) + w * (1 / 6 - w * (1 / 30 - w / 42))) / z
    return jnp.where(reflect, -total, total)


_ZETA_TERMS = 1 << 16  # negative terms summed one by one; a q further below 0: folded
_ZETA_DIRECT = 10  # terms below this are summed one by one, as CPU's loop (to a > 9) does


def _hurwitz_zeta(s, q):
    """zeta(s, q), the sum over k >= 0 of (q + k)^-s, with CPU's (Cephes') edge values:
    inf at s == 1, NaN for s < 1, inf at the poles q = 0, -1, -2, ..., NaN for other
    q <= 0 when s is not an integer. jax's zeta is right only for q above about -8 (and
    a cancellation there amplifies its error), so as in CPU's loop the terms that bring q
    to at least _ZETA_DIRECT are summed first, in CPU's order.
    Past _ZETA_TERMS of them (where CPU loops as long) the negative terms are folded
    onto zetas at positive arguments: sum over j = 1..m of (r - j)^-s is (-1)^s
    (zeta(s, 1 - r) - zeta(s, m + 1 - r)), r = q + m. s: a Python int or an array."""
    pole = (q <= 0) & (q == jnp.floor(q))
    far = (q < -_ZETA_TERMS) & ~pole
    shifting = (q < _ZETA_DIRECT) & ~pole & ~far & jnp.isfinite(q)
    shape = jnp.broadcast_shapes(jnp.shape(s), q.shape)

    def pending(state):
        return jnp.any(shifting & (q + state[0] < _ZETA_DIRECT))

    def add_term(state):
        k, total = state
        term = jnp.where(shifting & (q + k < _ZETA_DIRECT), (q + k) ** -s, 0)
        return k + 1, total + term

    start = (jnp.zeros((), q.dtype), jnp.zeros(shape, q.dtype))
    _, head = lax.while_loop(pending, add_term, start)
    exponent = jnp.asarray(s, q.dtype)
    rest = jnp.where(shifting, q + jnp.ceil(_ZETA_DIRECT - q), q)  # (>= _ZETA_DIRECT)
    # A finite s so large that the rest's first term underflows (q = 2.5, s = 1000):
    # jax's zeta gives NaN there. CPU's loop returns the head at its first zero term
    # once the sum is not 0; a sum still 0 goes on to its Euler-Maclaurin terms, 0 * a
    # product of 23 factors s + k, which is NaN where that product overflows (s = 1e30).
    vanishing = (rest**-exponent == 0) & (exponent != jnp.inf) & (rest != jnp.inf)
    value = jnp.where(
        vanishing,
        jnp.where(head != 0, head, jnp.where(_em_product_overflows(exponent), jnp.nan, 0)),
        head + jss.zeta(s, rest),
    )
    m = jnp.where(far, jnp.ceil(-q), 1)
    r = jnp.where(far, q + m, 0.5)
    sign = jnp.where(jnp.asarray(s) % 2 == 0, 1, -1).astype(q.dtype)
    folded = jss.zeta(s, r) + sign * (jss.zeta(s, 1 - r) - jss.zeta(s, m + 1 - r))
    value = jnp.where(far, folded, value)
    # s = inf, as CPU's loop: a term (q + k)^-inf in (-1, 1) is inf; from q = 1 the sum
    # is 1 at its first step; above 1 the tail's inf * 0 makes it NaN (mathematically 0)
    infinite = jnp.where(q < 1, jnp.inf, jnp.where(q == 1, 1.0, jnp.nan))
    value = jnp.where(exponent == jnp.inf, infinite.astype(q.dtype), value)
    value = jnp.where((q <= 0) & (exponent != jnp.floor(exponent)), jnp.nan, value)
    value = jnp.where(pole, jnp.inf, value)
    value = jnp.where(exponent < 1, jnp.nan, value)
    return jnp.where(exponent == 1, jnp.inf, value)


def _em_product_overflows(s):
    """Whether s (s + 1) ... (s + 22), the product CPU's zeta builds for its Euler-Maclaurin
    terms, overflows CPU's accumulation type (double; float for half types)."""
    limit = 709.782712893384 if s.dtype.itemsize >= 4 else 88.72283905206835  # log(max)
    return sum(jnp.log(s + k) for k in range(23)) > limit


def _higher_polygamma(n, x):
    """psi^(n)(x) = (-1)^(n+1) n! zeta(n + 1, x), n >= 2, as PyTorch's CPU kernel."""
    return (-1) ** (n + 1) * math.factorial(n) * _hurwitz_zeta(n + 1, x)


def _erfinv(y):
    """XLA's erf_inv, refined by one Newton step: near ±1 its float32 error would be
    amplified tenfold by the backward's exp(erfinv(y)^2). Past |y| = 0.5 the residual
    goes through erfc, since 1 - |y| is exact there and erf(x) - |y| cancels."""
    wide = y.astype(jnp.float32) if y.dtype in (jnp.float16, jnp.bfloat16) else y
    a = jnp.abs(wide)
    x = lax.erf_inv(a)
    residual = jnp.where(a <= 0.5, lax.erf(x) - a, (1 - a) - lax.erfc(x))
    slope = (2 / math.sqrt(math.pi)) * jnp.exp(-x * x)
    refined = jnp.where(jnp.isfinite(x), x - residual / slope, x)
    return jnp.copysign(refined, wide).astype(y.dtype)


def _spherical_bessel_j0(x):
    safe = jnp.where(x == 0, 1, x)
    value = jnp.where(x == 0, 1, jnp.sin(safe) / safe)
    return jnp.where(jnp.isinf(x), 0, value)


def _exp(z):
    """exp; for complex z with an infinite real part and an infinite or NaN imaginary
    part, CPU's values (C99's: +inf gives inf + nan j, -inf gives 0 + 0j), where XLA
    gives NaN in both parts."""
    if not jnp.iscomplexobj(z):
        return jnp.exp(z)
    a, b = z.real, z.imag
    value = jnp.exp(z)
    unbounded = ~jnp.isfinite(b)
    up = (a == jnp.inf) & unbounded
    down = (a == -jnp.inf) & unbounded
    zero = jnp.zeros_like(a)
    real = jnp.where(up, jnp.inf, jnp.where(down, zero, value.real))
    vanishing = jnp.where(jnp.isnan(b), zero, jnp.copysign(zero, b))
    imag = jnp.where(up, jnp.nan, jnp.where(down, vanishing, value.imag))
    return lax.complex(real, imag)


def _real_exp2(x):
    """2**x as 2**f * 2**n with n = round(x): XLA's exp2 misses exact powers of two
    (exp2(34.) in float32 was 17179887616); here an integer x gives 2**n exactly.
    float16/bfloat16 are computed in float32, as CPU does."""
    wide = x.astype(jnp.float32) if x.dtype in (jnp.float16, jnp.bfloat16) else x
    n = jnp.clip(jnp.round(wide), -2200, 2200)
    scaled = jnp.ldexp(jnp.exp2(wide - n), jnp.where(jnp.isfinite(n), n, 0).astype(jnp.int32))
    return jnp.where(jnp.isfinite(wide), scaled, jnp.exp2(wide)).astype(x.dtype)


def _exp2(z):
    """2**z; complex z is scaled by ln 2 part by part (a complex product would turn
    inf * 0 into NaN), then goes through _exp."""
    if not jnp.iscomplexobj(z):
        return _real_exp2(z)
    ln2 = math.log(2)
    return _exp(lax.complex(z.real * ln2, z.imag * ln2))


def _sinh(z):
    """sinh; complex z as sinh(x) cos(y) + i cosh(x) sin(y), as CPU's: jnp.sinh takes
    (exp(z) - exp(-z)) / 2, which cancels for small |Re z| (sinh(1e-5 + 0j) came out
    0.14% off, the real part of sinh(1e-6 + 1e-6j) 1.7%)."""
    if not _is_complex(z):
        return _real_sinh(z)
    x, y = z.real, z.imag
    return lax.complex(_times_sinh(jnp.cos(y), x, True), _times_cosh(jnp.sin(y), x))


def _cosh(z):
    """cosh; complex z as cosh(x) cos(y) + i sinh(x) sin(y), as CPU's: jnp.cosh's
    imaginary part cancelled for small |Re z| (3.4% off at cosh(1e-6 + 1j))."""
    if not _is_complex(z):
        return _real_cosh(z)
    x, y = z.real, z.imag
    return lax.complex(_times_cosh(jnp.cos(y), x, True), _times_sinh(jnp.sin(y), x))


def _sin(z):
    """sin; complex z as sin(x) cosh(y) + i cos(x) sinh(y), finite wherever CPU's is."""
    if not _is_complex(z):
        return jnp.sin(z)
    x, y = z.real, z.imag
    return lax.complex(_times_cosh(jnp.sin(x), y), _times_sinh(jnp.cos(x), y, True))


def _cos(z):
    """cos; complex z as cos(x) cosh(y) - i sin(x) sinh(y), finite wherever CPU's is."""
    if not _is_complex(z):
        return jnp.cos(z)
    x, y = z.real, z.imag
    return lax.complex(_times_cosh(jnp.cos(x), y, True), -_times_sinh(jnp.sin(x), y))


def _real_sinh(x):
    """(e - 1/e) / 2 with e = exp(|x|) from |x| = 1, XLA's sinh below (where that
    difference would cancel): XLA's float32 sinh was 1.5e-6 relative off for |x| > 10
    (25 ulp; CPU 6e-8), 8e-8 now. Like CPU's, it overflows where exp(|x|) does."""
    if not jnp.issubdtype(x.dtype, jnp.floating) or x.dtype.itemsize < 4:
        return jnp.sinh(x)
    e = jnp.exp(jnp.abs(x))
    far = jnp.sign(x) * (0.5 * e - 0.5 / e)
    return jnp.where(jnp.abs(x) < 1, jnp.sinh(x), far)


def _real_cosh(x):
    """(e + 1/e) / 2 with e = exp(|x|): XLA's float32 cosh was 1.5e-6 relative off for
    |x| > 10 (CPU 6e-8); no cancellation here, and the same overflow point as CPU's."""
    if not jnp.issubdtype(x.dtype, jnp.floating) or x.dtype.itemsize < 4:
        return jnp.cosh(x)
    e = jnp.exp(jnp.abs(x))
    return 0.5 * e + 0.5 / e


# Past these |t| exp(|t|) overflows while cosh(t) = sinh(|t|) = exp(|t|) / 2 times a
# factor below 1 may not: CPU's complex sin, cos, sinh and cosh stay finite there (up to
# |t| = 89.4 in float32)
_HALVED_FROM = {jnp.float32: 88.0, jnp.float64: 709.0}


def _times_cosh(c, t, cosine: bool = False):
    """c * cosh(t), a part of a complex function's product form (`_times_hyperbolic`)."""
    return _times_hyperbolic(c, t, _real_cosh(t), cosine)


def _times_sinh(c, t, cosine: bool = False):
    """c * sinh(t), a part of a complex function's product form (`_times_hyperbolic`).
    A zero t gives a zero whatever c is (sinh(0 + inf j) is 0 + NaN j)."""
    product = _times_hyperbolic(c, t, _real_sinh(t), cosine, odd=True)
    return jnp.where(t == 0, jnp.where(c < 0, -t, t), product)


def _times_hyperbolic(c, t, near, cosine: bool, odd: bool = False):
    """c * near, near being cosh(t) or sinh(t), with C99's special cases as CPU gives
    them: a zero c gives a zero whatever t is, and an infinite t times the undefined
    cosine of an infinite or NaN part is infinite (cos(inf + inf j) is inf + NaN j).
    Past exp's overflow c * exp(|t|) / 2 applies the exponential in two halves, so
    the product overflows only where its value does."""
    limit = _HALVED_FROM.get(t.dtype.type)
    product = c * near
    if limit is not None:
        far = jnp.abs(t) > limit
        half = jnp.exp(0.5 * jnp.where(far, jnp.abs(t), 0))
        scaled = c * (0.5 * half) * half
        product = jnp.where(far, jnp.where(t < 0, -scaled, scaled) if odd else scaled, product)
    if cosine:
        product = jnp.where(jnp.isinf(t) & jnp.isnan(c), jnp.abs(t), product)
    return jnp.where(c == 0, c, product)


_FLOAT_FUNCTIONS = {
    "exp": _exp,
    "exp2": _exp2,
    "expm1": _expm1,
    "log": jnp.log,
    "log2": jnp.log2,
    "log10": jnp.log10,
    "log1p": jnp.log1p,
    "sqrt": _sqrt,
    "rsqrt": _rsqrt,
    "reciprocal": jnp.reciprocal,
    "sin": _sin,
    "cos": _cos,
    "tan": _tan,
    "asin": _folded(jnp.arcsin, odd=True),
    "acos": _folded(jnp.arccos, odd=False),
    "atan": _folded(jnp.arctan, odd=True),
    "sinh": _sinh,
    "cosh": _cosh,
    "tanh": _tanh,
    "asinh": _folded(jnp.arcsinh, odd=True),
    "acosh": _folded(jnp.arccosh, odd=False),
    "atanh": _folded(jnp.arctanh, odd=True),
    "sigmoid": _sigmoid,
    "erf": erf,
    "erfc": lax.erfc,
    "erfinv": _erfinv,
    "lgamma": lgamma,
    "digamma": _digamma,
    "i0": jss.i0,
    "sinc": jnp.sinc,
    "special_i0e": jss.i0e,
    "special_i1": jss.i1,
    "special_i1e": jss.i1e,
    "special_modified_bessel_i0": jss.i0,
    "special_modified_bessel_i1": jss.i1,
    "special_ndtri": jss.ndtri,
    "special_log_ndtr": log_ndtr,
    "special_erfcx": erfcx,
    "special_entr": jss.entr,
    "special_spherical_bessel_j0": _spherical_bessel_j0,
}
for _name, _fn in _FLOAT_FUNCTIONS.items():
    lower(f"{_name}.default")(_unary(_fn))


@lower("polygamma.default")
def polygamma(n, self):
    (x,) = _cast(Promo.INT_TO_FLOAT, self)
    if n == 0:
        return _digamma(x)
    if n == 1:
        return _trigamma(x)
    wide = x.astype(dtypes.accumulate_float(x.dtype))  # (as CPU's kernel: its acc_type)
    return _higher_polygamma(n, wide).astype(x.dtype)


@lower("logit.default")
def logit(self, eps=None):
    (x,) = _cast(Promo.INT_TO_FLOAT, self)
    if eps is not None:
        x = jnp.clip(x, eps, 1 - eps)
    return jnp.log(x / (1 - x))


def _xlogy(log):
    """x * log(y) that is 0 where x is 0, unless y is NaN; in float16/bfloat16 log(y) is
    rounded to the dtype before the product, as CPU's kernels compute it."""

    def lowering(self, other):
        x, y = _cast(Promo.INT_TO_FLOAT, self, other)
        common = _common_dtype(Promo.INT_TO_FLOAT, self, other)
        logged = log(y)
        if common is not None:
            logged = logged.astype(common).astype(logged.dtype)
        value = jnp.where(x == 0, 0, x * logged)
        return jnp.where(jnp.isnan(y), jnp.nan, value)

    return lowering


lower("xlogy.Tensor", "xlogy.Scalar_Other", "xlogy.Scalar_Self")(_xlogy(jnp.log))
lower("special_xlog1py.default", "special_xlog1py.other_scalar", "special_xlog1py.self_scalar")(
    _xlogy(jnp.log1p)
)
@lower("special_zeta.default", "special_zeta.other_scalar", "special_zeta.self_scalar")
def special_zeta(self, other):
    x, q = _cast(Promo.INT_TO_FLOAT, self, other)
    wide = dtypes.accumulate_float(x.dtype)  # (as CPU's kernel: its acc_type)
    return _hurwitz_zeta(x.astype(wide), q.astype(wide)).astype(x.dtype)
def _igamma_edges(upper):
    """CPU's special cases (ATen's calc_igamma/calc_igammac), in CPU's order: a == 0
    with x > 0, an infinite a with a finite x and an infinite x, where JAX's
    gammainc/gammaincc give NaN (igamma(0, 1) is 1 on CPU, NaN in JAX); the rest by
    `incomplete_gamma.regularized`."""

    def igamma(a, x):
        one, zero = jnp.ones_like(a), jnp.zeros_like(a)
        nan = jnp.full_like(a, jnp.nan)
        lo, hi = (one, zero) if upper else (zero, one)  # the values at x == 0, x == inf
        return jnp.select(
            [(x < 0) | (a < 0), a == 0, x == 0, jnp.isinf(a), jnp.isinf(x)],
            [nan, jnp.where(x > 0, hi, nan), lo, jnp.where(jnp.isinf(x), nan, lo), hi],
            incomplete_gamma.regularized(a, x, upper),
        )

    return igamma


lower("igamma.default")(_binary(_igamma_edges(upper=False)))
lower("igammac.default")(_binary(_igamma_edges(upper=True)))
lower("atan2.default")(_binary(jnp.arctan2, Promo.INT_TO_FLOAT))
lower("hypot.default")(_binary(jnp.hypot))
lower("copysign.Tensor", "copysign.Scalar")(_binary(jnp.copysign, Promo.INT_TO_FLOAT))
lower("nextafter.default")(_binary(jnp.nextafter, Promo.NO_OPMATH))  # (bits of the dtype)
lower("logaddexp.default")(_binary(jnp.logaddexp))
lower("logaddexp2.default")(_binary(jnp.logaddexp2))


def _gcd_parts(self, other):
    """CPU's Euclid, in CPU's integer width (C promotes int8/int16/uint8 to int) with
    its wrapping abs and truncating remainder. jnp.gcd loops on |x|, which never
    reached 0 for a dtype's minimum (|-128| in int8): the call never returned."""
    a, b = _cast(Promo.DEFAULT, self, other)
    width = jnp.int32 if a.dtype.itemsize < 4 else a.dtype
    a, b = jnp.broadcast_arrays(jnp.abs(a.astype(width)), jnp.abs(b.astype(width)))

    def step(pair):
        x, y = pair
        nonzero = x != 0
        return jnp.where(nonzero, lax.rem(y, jnp.where(nonzero, x, 1)), 0), jnp.where(nonzero, x, y)

    _, divisor = lax.while_loop(lambda pair: jnp.any(pair[0] != 0), step, (a, b))
    return a, b, divisor


def _check_integral(kernel, in_place: bool = False):
    def check(values: list) -> bool:
        """CPU's kernels take integers only; the meta kernels (and tpu's refusals, which
        try only bool, integer and complex keys) accepted floats, and gcd's Euclid loop
        never ends for a NaN or an infinity (XLA's shifts refuse floats). An in-place
        form refuses a result it cannot hold first, as CPU's does."""
        dtype = torch.result_type(values[0], values[1])
        if in_place and not torch.can_cast(dtype, values[0].dtype):
            raise RuntimeError(
                f"result type {scalar_type_name(dtype)} can't be cast to the desired "
                f"output type {scalar_type_name(values[0].dtype)}"
            )
        if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
            raise NotImplementedError(
                f'"{kernel}" not implemented for \'{scalar_type_name(dtype)}\''
            )
        return False  # dtypes are part of the key

    return check


@lower("gcd.default", check=_check_integral("gcd_cpu"))
def gcd(self, other):
    return _gcd_parts(self, other)[2]


@lower("lcm.default", check=_check_integral("lcm_cpu"))
def lcm(self, other):
    a, b, divisor = _gcd_parts(self, other)
    return jnp.where(divisor == 0, 0, jnp.abs(lax.div(a, jnp.where(divisor == 0, 1, divisor)) * b))


def _check_heaviside(values: list) -> bool:
    """CPU's refusal of parts of different dtypes (tpu promoted them)."""
    if values[0].dtype != values[1].dtype:
        raise RuntimeError("heaviside is not yet implemented for tensors with different dtypes.")
    return False  # dtypes are part of the key


@lower("heaviside.default", check=_check_heaviside)
def heaviside(self, values):
    x, v = _cast(Promo.DEFAULT, self, values)
    return jnp.where(x == 0, v, (x > 0).astype(x.dtype))


def _polynomial(first, step):
    """The orthogonal polynomial P_n(x) for a tensor of degrees n, by its three-term
    recurrence: P_0 = 1, P_1 = first(x), P_{k+1} = step(k, x, P_k, P_{k-1});
    negative degrees give 0, and non-integral ones are truncated, as PyTorch."""

    def fn(x, n):
        x, n = jnp.broadcast_arrays(x, n)
        n = n.astype(jnp.int64)
        p0, p1 = jnp.ones_like(x), first(x)
        result = jnp.where(n == 0, p0, jnp.where(n == 1, p1, 0)).astype(x.dtype)

        def body(carry):
            k, previous, current, result = carry
            following = step(k, x, current, previous)
            return k + 1, current, following, jnp.where(n == k + 1, following, result)

        start = (jnp.int64(1), p0, p1, result)
        result = lax.while_loop(lambda c: c[0] < jnp.max(n, initial=0), body, start)[3]
        return jnp.where(n < 0, 0, result)

    return fn


def _shifted(x):
    return x + x - 1


def _chebyshev(first):
    return _polynomial(first, lambda k, x, p, q: 2 * x * p - q)


_POLYNOMIALS = {
    "chebyshev_polynomial_t": _chebyshev(lambda x: x),
    "chebyshev_polynomial_u": _chebyshev(lambda x: 2 * x),
    "chebyshev_polynomial_v": _chebyshev(lambda x: 2 * x - 1),
    "chebyshev_polynomial_w": _chebyshev(lambda x: 2 * x + 1),
    "hermite_polynomial_h": _polynomial(lambda x: 2 * x, lambda k, x, p, q: 2 * x * p - 2 * k * q),
    "hermite_polynomial_he": _polynomial(lambda x: x, lambda k, x, p, q: x * p - k * q),
    "laguerre_polynomial_l": _polynomial(
        lambda x: 1 - x, lambda k, x, p, q: ((2 * k + 1 - x) * p - k * q) / (k + 1)
    ),
    "legendre_polynomial_p": _polynomial(
        lambda x: x, lambda k, x, p, q: ((2 * k + 1) * x * p - k * q) / (k + 1)
    ),
}
for _name, _fn in _POLYNOMIALS.items():
    lower(f"special_{_name}.default", f"special_{_name}.x_scalar", f"special_{_name}.n_scalar")(
        _binary(_fn, Promo.INT_TO_FLOAT)
    )
for _kind in "tuvw":
    _unshifted = _POLYNOMIALS[f"chebyshev_polynomial_{_kind}"]
    _name = f"special_shifted_chebyshev_polynomial_{_kind}"
    lower(f"{_name}.default", f"{_name}.x_scalar", f"{_name}.n_scalar")(
        _binary(lambda x, n, f=_unshifted: f(_shifted(x), n), Promo.INT_TO_FLOAT)
    )


# ----------------------------------------------------- autograd helper ops


def _conj(x):
    return jnp.conj(x) if _is_complex(x) else x


@lower("sigmoid_backward.default")
def sigmoid_backward(grad_output, output):
    g, y = _cast(Promo.DEFAULT, grad_output, output)
    return g * _conj((1 - y) * y)


@lower("tanh_backward.default")
def tanh_backward(grad_output, output):
    g, y = _cast(Promo.DEFAULT, grad_output, output)
    return g * _conj(1 - y * y)


@lower("logit_backward.default")
def logit_backward(grad_output, self, eps=None):
    """Zero outside [eps, 1 - eps]; NaN outside [0, 1] when eps is None."""
    g, x = _cast(Promo.DEFAULT, grad_output, self)
    lo, hi, outside = (0.0, 1.0, jnp.nan) if eps is None else (eps, 1 - eps, 0.0)
    return jnp.where((x < lo) | (x > hi), outside, g / (x * (1 - x)))


# ------------------------------------------------------- min, max, clamp


lower("minimum.default")(_binary(jnp.minimum, Promo.NO_OPMATH))  # NaN propagates
lower("maximum.default")(_binary(jnp.maximum, Promo.NO_OPMATH))
lower("fmin.default")(_binary(jnp.fmin, Promo.NO_OPMATH))  # NaN ignored
lower("fmax.default")(_binary(jnp.fmax, Promo.NO_OPMATH))


_COMPLEX_CLAMP = "clamp is not supported for complex types"


def _check_integer_bounds(self: torch.Tensor, bounds: list) -> bool:
    """CPU converts integer number bounds to an integer tensor's dtype as it converts a
    fill value (`check_fill_value`: c10's checked conversion), refusing those beyond it
    (clamp(int8, max=1000)); tpu wrapped them. Whether a later call must be judged again
    (the bound's value is not part of the key); float bounds promote the result."""
    verdicts = [check_fill_value(b, self.dtype) for b in bounds if type(b) is int]
    return any(verdicts)


def _check_clamp(values: list) -> bool:
    """CPU's refusals of missing and complex bounds (PyTorch's meta kernels raise
    ValueError for the first and accept the second: tpu clamped in complex), and of
    bounds beyond an integer dtype."""
    if values[1] is None and values[2] is None:
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
    bounds = [b for b in values[1:3] if isinstance(b, complex)]
    if not bounds:
        return _check_integer_bounds(values[0], values[1:3])
    if not values[0].is_floating_point():
        raise NotImplementedError(_COMPLEX_CLAMP)
    if any(b.imag for b in bounds):  # (CPU reads a float self's bounds as doubles)
        raise RuntimeError("value cannot be converted to type double without overflow")


def _check_one_sided_clamp(values: list) -> bool:
    """CPU refuses a complex bound, which PyTorch's meta kernels accept, and a bound
    beyond an integer dtype."""
    if isinstance(values[1], complex):
        raise NotImplementedError(_COMPLEX_CLAMP)
    return _check_integer_bounds(values[0], values[1:2])


@lower("clamp.default", "clamp.Tensor", check=_check_clamp)
def clamp(self, min=None, max=None):
    """max(x, min) then min(.., max): a NaN anywhere gives NaN; min > max gives max."""
    x, lo, hi = _cast(Promo.NO_OPMATH, self, min, max)
    if lo is not None:
        x = jnp.maximum(x, lo)
    if hi is not None:
        x = jnp.minimum(x, hi)
    return x


@lower("clamp_min.default", "clamp_min.Tensor", check=_check_one_sided_clamp)
def clamp_min(self, min):
    return clamp(self, min, None)


@lower("clamp_max.default", "clamp_max.Tensor", check=_check_one_sided_clamp)
def clamp_max(self, max):
    return clamp(self, None, max)


@lower("where.self")
def where(condition, self, other):
    a, b = _cast(Promo.NO_OPMATH, self, other)
    return jnp.where(condition.astype(jnp.bool_), a, b)


# ------------------------------------------------------- float classification


@lower("nan_to_num.default", check=_nan_to_num_out)
def nan_to_num(self, nan=None, posinf=None, neginf=None):
    if _is_complex(self):
        parts = (nan_to_num(p, nan, posinf, neginf) for p in (self.real, self.imag))
        return lax.complex(*parts)
    if not jnp.issubdtype(self.dtype, jnp.floating):
        return self
    # (each replacement picked by the input's value: a NaN replaced by a number beyond
    # the dtype is inf, as on CPU, and must stay so)
    info = jnp.finfo(self.dtype)
    x = jnp.where(self == -jnp.inf, info.min if neginf is None else neginf, self)
    x = jnp.where(self == jnp.inf, info.max if posinf is None else posinf, x)
    return jnp.where(jnp.isnan(self), 0.0 if nan is None else nan, x)


lower("isnan.default")(_unary(jnp.isnan, Promo.NO_OPMATH))
lower("isinf.default")(_unary(jnp.isinf, Promo.NO_OPMATH))
lower("isposinf.default")(_unary(jnp.isposinf, Promo.NO_OPMATH))
lower("isneginf.default")(_unary(jnp.isneginf, Promo.NO_OPMATH))


@lower("signbit.default")
def signbit(self):
    return jnp.zeros(self.shape, jnp.bool_) if self.dtype == jnp.bool_ else jnp.signbit(self)


# ----------------------------------------------------------- comparisons


_COMPARISONS = {
    "eq": jnp.equal,
    "ne": jnp.not_equal,
    "lt": jnp.less,
    "le": jnp.less_equal,
    "gt": jnp.greater,
    "ge": jnp.greater_equal,
}
for _name, _fn in _COMPARISONS.items():
    lower(f"{_name}.Tensor", f"{_name}.Scalar")(_binary(_fn, Promo.ALWAYS_BOOL))


# --------------------------------------------------------- logical, bitwise


def _truth(x):
    return jnp.asarray(x) != 0


def _logical(fn):
    return lambda self, other: fn(_truth(self), _truth(other))


lower("logical_and.default")(_logical(jnp.logical_and))
lower("logical_or.default")(_logical(jnp.logical_or))
lower("logical_xor.default")(_logical(jnp.logical_xor))
lower("logical_not.default")(lambda self: ~_truth(self))

for _name, _fn in {"and": jnp.bitwise_and, "or": jnp.bitwise_or, "xor": jnp.bitwise_xor}.items():
    lower(f"bitwise_{_name}.Tensor", f"bitwise_{_name}.Scalar", f"bitwise_{_name}.Scalar_Tensor")(
        _binary(_fn)
    )
lower("bitwise_not.default", check=_same_dtype_out)(_unary(jnp.invert, Promo.NO_OPMATH))

# XLA shifts give 0 (left) or the sign fill (right) for counts outside the
# type's width, negative counts included: PyTorch's semantics.
_SHIFT_OVERLOADS = ("Tensor", "Tensor_Scalar", "Scalar_Tensor")
# (Python's `<<` and `>>` run these: engine/kernels.py's _SHIFT_OPERATORS)
for _direction, _fn in (("left", jnp.left_shift), ("right", jnp.right_shift)):
    _kernel = f"{_direction[0]}shift_cpu"
    lower(
        *(f"bitwise_{_direction}_shift.{o}" for o in _SHIFT_OVERLOADS),
        check=_check_integral(_kernel),
    )(_binary(_fn))
    lower(
        *(f"bitwise_{_direction}_shift_.{o}" for o in ("Tensor", "Tensor_Scalar")),
        check=_check_integral(_kernel, in_place=True),
    )(_binary(_fn))


# ------------------------------------------------------------------ complex


lower("_conj.default", "_conj_physical.default", "conj_physical_.default")(_conj)


@lower("angle.default")
def angle(self):
    (x,) = _cast(Promo.INT_TO_FLOAT, self)
    if _is_complex(x):
        return jnp.angle(x)
    return jnp.where(jnp.isnan(x), x, jnp.where(x < 0, math.pi, 0).astype(x.dtype))


def _check_complex_parts(values: list) -> bool:
    """CPU's checks of complex/polar's parts, which the meta kernels miss (tpu made a
    complex128 of float32 and float64 parts, or failed inside the lowering)."""
    first, second = values[0].dtype, values[1].dtype
    if first not in (torch.float16, torch.float32, torch.float64) or second != first:
        if first in (torch.float16, torch.float32, torch.float64) and second.is_floating_point:
            raise RuntimeError(
                f"Expected object of scalar type {scalar_type_name(first)} but got scalar "
                f"type {scalar_type_name(second)} for second argument"
            )
        raise RuntimeError(
            "Expected both inputs to be Half, Float or Double tensors but got "
            f"{scalar_type_name(first)} and {scalar_type_name(second)}"
        )
    return False  # dtypes are part of the key


@lower("complex.default", check=_check_complex_parts)
def complex_(real, imag):
    return lax.complex(*jnp.broadcast_arrays(real, imag))  # (lax.complex does not broadcast)


@lower("polar.default", check=_check_complex_parts)
def polar(abs, angle):
    return lax.complex(*jnp.broadcast_arrays(abs * jnp.cos(angle), abs * jnp.sin(angle)))


# float dtype -> (bits as unsigned, exponent bits, mantissa bits)
_FLOAT_LAYOUTS = {
    jnp.dtype(jnp.float16): (jnp.uint16, 5, 10),
    jnp.dtype(jnp.bfloat16): (jnp.uint16, 8, 7),
    jnp.dtype(jnp.float32): (jnp.uint32, 8, 23),
    jnp.dtype(jnp.float64): (jnp.uint64, 11, 52),
}


@lower("frexp.Tensor")
def frexp(self):
    """(mantissa in [0.5, 1) with the sign, int32 exponent), CPU's: zeros, infinities
    and NaN keep their value with exponent 0. Worked on the bits, so subnormals get
    their true exponent (-132 for float32 1e-40) where XLA:CPU flushes them to zero
    (the reason it ran on the CPU fallback)."""
    unsigned, exponent_bits, mantissa_bits = _FLOAT_LAYOUTS[jnp.dtype(self.dtype)]
    width = jnp.iinfo(unsigned).bits
    bits = lax.bitcast_convert_type(self, unsigned)
    one = unsigned(1)
    mantissa_mask = unsigned((1 << mantissa_bits) - 1)
    biased = ((bits >> mantissa_bits) & unsigned((1 << exponent_bits) - 1)).astype(jnp.int32)
    fraction = bits & mantissa_mask
    sign = bits & (one << unsigned(width - 1))
    bias = (1 << (exponent_bits - 1)) - 1
    special = (biased == (1 << exponent_bits) - 1) | ((biased == 0) & (fraction == 0))
    # a subnormal's highest set bit p: its value is 2^(p + 2 - bias - mantissa_bits) times a
    # mantissa in [0.5, 1) made of the bits below p
    top = (width - 1 - lax.clz(fraction)).astype(jnp.int32)
    subnormal = (biased == 0) & (fraction != 0)
    shift = jnp.where(subnormal, mantissa_bits - top, 0).astype(unsigned)
    fraction = jnp.where(subnormal, (fraction << shift) & mantissa_mask, fraction)
    exponent = jnp.where(subnormal, top + 2 - bias - mantissa_bits, biased - (bias - 1))
    half = unsigned(bias - 1) << unsigned(mantissa_bits)  # the exponent field of [0.5, 1)
    mantissa = lax.bitcast_convert_type(sign | half | fraction, self.dtype)
    return jnp.where(special, self, mantissa), jnp.where(special, 0, exponent).astype(jnp.int32)
