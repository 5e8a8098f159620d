"""Pointwise ops on tpu agree with CPU: values, dtypes (type promotion), gradients,
integer and NaN semantics, and none of them falls back to the CPU."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from conftest import (
    assert_same,
    assert_same_error,
    assert_same_grad,
    assert_same_outcome,
    lowered_packets,
    no_fallback,
    packet,
)

_PACKETS = lowered_packets("pointwise")


@pytest.fixture
def no_pointwise_fallback():
    """Fails the test if a pointwise op (or a variant of one) ran on the CPU."""
    with no_fallback("pointwise", lambda op: packet(op) in _PACKETS):
        yield


def _signed(*shape):
    return torch.randn(*shape) * 2


def _positive(*shape):
    return torch.rand(*shape) * 3 + 0.1


def _unit(*shape):
    return torch.rand(*shape) * 1.8 - 0.9


def _prob(*shape):
    return torch.rand(*shape) * 0.9 + 0.05


# name -> (function, input maker, differentiable)
UNARY = {
    "neg": (torch.neg, _signed, True),
    "abs": (torch.abs, _signed, True),
    "sign": (torch.sign, _signed, True),
    "sgn": (torch.sgn, _signed, False),
    "exp": (torch.exp, _signed, True),
    "exp2": (torch.exp2, _signed, True),
    "expm1": (torch.expm1, _signed, True),
    "log": (torch.log, _positive, True),
    "log2": (torch.log2, _positive, True),
    "log10": (torch.log10, _positive, True),
    "log1p": (torch.log1p, _positive, True),
    "sqrt": (torch.sqrt, _positive, True),
    "rsqrt": (torch.rsqrt, _positive, True),
    "reciprocal": (torch.reciprocal, _positive, True),
    "sin": (torch.sin, _signed, True),
    "cos": (torch.cos, _signed, True),
    "tan": (torch.tan, _unit, True),
    "asin": (torch.asin, _unit, True),
    "acos": (torch.acos, _unit, True),
    "atan": (torch.atan, _signed, True),
    "sinh": (torch.sinh, _signed, True),
    "cosh": (torch.cosh, _signed, True),
    "tanh": (torch.tanh, _signed, True),
    "asinh": (torch.asinh, _signed, True),
    "acosh": (lambda x: torch.acosh(x + 1), _positive, True),
    "atanh": (torch.atanh, _unit, True),
    "sigmoid": (torch.sigmoid, _signed, True),
    "logit": (torch.logit, _prob, True),
    "logit_eps": (lambda x: torch.logit(x, 0.2), _prob, True),
    "erf": (torch.erf, _signed, True),
    "erfc": (torch.erfc, _signed, True),
    "erfinv": (torch.erfinv, _unit, True),
    "lgamma": (torch.lgamma, _positive, True),
    "digamma": (torch.digamma, _positive, True),
    "polygamma1": (lambda x: torch.polygamma(1, x), _positive, True),
    "polygamma2": (lambda x: torch.polygamma(2, x), _positive, False),
    "i0": (torch.i0, _signed, True),
    "i0e": (torch.special.i0e, _signed, True),
    "i1": (torch.special.i1, _signed, True),
    "i1e": (torch.special.i1e, _signed, True),
    "ndtri": (torch.special.ndtri, _prob, True),
    "log_ndtr": (torch.special.log_ndtr, _signed, True),
    "erfcx": (torch.special.erfcx, _signed, True),
    "entr": (torch.special.entr, _positive, True),
    "spherical_j0": (torch.special.spherical_bessel_j0, _signed, False),
    "modified_i0": (torch.special.modified_bessel_i0, _signed, False),
    "modified_i1": (torch.special.modified_bessel_i1, _signed, False),
    "sinc": (torch.sinc, _signed, True),
    "floor": (torch.floor, _signed, True),
    "ceil": (torch.ceil, _signed, True),
    "round": (torch.round, _signed, True),
    "round_decimals": (lambda x: torch.round(x * 10, decimals=2), _signed, True),
    "round_negative_decimals": (lambda x: torch.round(x * 1000, decimals=-2), _signed, False),
    "trunc": (torch.trunc, _signed, True),
    "frac": (torch.frac, _signed, True),
    "deg2rad": (torch.deg2rad, _signed, True),
    "square": (torch.square, _signed, True),
    "nan_to_num": (torch.nan_to_num, _signed, True),
    "isfinite": (lambda x: x * torch.isfinite(x), _signed, True),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_float32_forward_and_grad(name, no_pointwise_fallback):
    fn, make, differentiable = UNARY[name]
    x = make(3, 5)
    assert_same(fn, x, atol=1e-5, rtol=1e-4)
    if differentiable:
        assert_same_grad(fn, x, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["exp", "log", "sin", "sigmoid", "erf", "round"])
def test_unary_low_precision(name, dtype, no_pointwise_fallback):
    fn, make, _ = UNARY[name]
    tol = 1e-2 if dtype == torch.bfloat16 else 2e-3
    assert_same(fn, make(4, 8).to(dtype), atol=tol, rtol=tol)


@pytest.mark.parametrize("name", ["exp", "sqrt", "sin", "sigmoid", "reciprocal", "floor", "abs"])
def test_unary_integer_inputs(name, no_pointwise_fallback):
    """Float functions of integers give float32; rounding keeps integers."""
    fn, _, _ = UNARY[name]
    assert_same(fn, torch.arange(1, 9, dtype=torch.int64).reshape(2, 4), rtol=1e-5, atol=1e-6)


def test_special_values_follow_torch(no_pointwise_fallback):
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([nan, -0.0, 0.0, -2.0, 1.0, inf, -inf, 2.5, -2.5, 0.5])
    for fn in (torch.sign, torch.digamma, torch.lgamma, torch.round, torch.frac, torch.sgn,
               torch.signbit, torch.isnan, torch.isinf, torch.isposinf, torch.isneginf,
               torch.sinc, torch.special.spherical_bessel_j0):
        assert_same(fn, x)
    assert_same(lambda t: torch.nan_to_num(t, nan=1.0, posinf=2.0), x)
    assert_same(torch.nan_to_num, x.half())
    assert_same(torch.logit, x)
    assert_same(lambda t: torch.special.entr(t), x)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_binary_special_values_follow_torch(dtype, no_pointwise_fallback):
    """Edges where tpu's values differed from CPU's without an error (PyTorch's
    test_reductions and a binary-op probe, helper-63): CPU's pow(tensor, +-0.5) is a
    square root (NaN at -inf, -0.0 at -0.0), igamma/igammac's special cases (a == 0,
    infinite a or x), zeta at an s so large the second term underflows."""
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([-inf, -0.0, 0.0, 0.25, 2.0, inf, nan], dtype=dtype)
    for exponent in (0.5, -0.5):
        actual = assert_same(lambda t, e=exponent: torch.pow(t, e), x)
        expected = torch.pow(x, exponent)
        number = ~expected.isnan()  # (a NaN's sign is no value: differences.md)
        assert torch.equal(actual.cpu()[number].signbit(), expected[number].signbit())
    a = torch.tensor([0.0, -0.0, 0.0, inf, inf, 2.0, 0.0, 1.5, -1.0], dtype=dtype)
    z = torch.tensor([0.5, 0.5, 0.0, 1.0, inf, inf, inf, 0.7, 1.0], dtype=dtype)
    tolerance = {"rtol": 2e-3, "atol": 1e-3} if dtype == torch.float16 else {}
    for fn in (torch.igamma, torch.igammac):
        assert_same(fn, a, z, **tolerance)
    if dtype in (torch.float32, torch.float64):  # (CPU's zeta refuses the half types)
        s = torch.tensor([1e30, 1e30, 1e30, 3.0], dtype=dtype)
        q = torch.tensor([1.0, 0.5, 2.0, 1.0], dtype=dtype)
        assert_same(torch.special.zeta, s, q)


@pytest.mark.parametrize("fn", [torch.gcd, torch.lcm])
def test_gcd_lcm_refuse_floats_as_cpu_does(fn):
    """CPU's kernels take integers only; tpu computed floats, and its Euclid loop never
    ended for a NaN."""
    def floats(device):
        a = torch.tensor([4.0, float("nan")], device=device)
        return fn(a, torch.tensor([6.0, 1.0], device=device))

    assert_same_error(floats)
    assert_same(fn, torch.tensor([4, -6, 0]), torch.tensor([6, 4, 5]))


POLYNOMIALS = [
    f"{shift}{name}"
    for shift in ("", "shifted_")
    for name in ("chebyshev_polynomial_t", "chebyshev_polynomial_u",
                 "chebyshev_polynomial_v", "chebyshev_polynomial_w")
] + ["hermite_polynomial_h", "hermite_polynomial_he", "laguerre_polynomial_l",
     "legendre_polynomial_p"]


def test_orthogonal_polynomials(no_pointwise_fallback):
    """Degrees as a tensor (negative ones included) or a scalar, x as a tensor or scalar."""
    x = torch.rand(7, 1) * 2.4 - 1.2
    n = torch.arange(-1, 10)
    for name in POLYNOMIALS:
        fn = getattr(torch.special, name)
        assert_same(fn, x, n, rtol=1e-3, atol=1e-4)
        assert_same(lambda t, f=fn: f(t, 3), x, rtol=1e-3, atol=1e-4)
    legendre = torch.special.legendre_polynomial_p
    assert_same(lambda d: legendre(0.3, d), n.float(), rtol=1e-4, atol=1e-6)


BINARY = {
    "add": torch.add,
    "add_alpha": lambda a, b: torch.add(a, b, alpha=2),
    "sub": torch.sub,
    "sub_alpha": lambda a, b: torch.sub(a, b, alpha=3),
    "rsub": lambda a, b: torch.rsub(a, b, alpha=2),
    "mul": torch.mul,
    "div": torch.div,
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "floor_divide": torch.floor_divide,
    "remainder": torch.remainder,
    "fmod": torch.fmod,
    "pow": torch.pow,
    "atan2": torch.atan2,
    "hypot": torch.hypot,
    "copysign": torch.copysign,
    "minimum": torch.minimum,
    "maximum": torch.maximum,
    "fmin": torch.fmin,
    "fmax": torch.fmax,
    "xlogy": torch.xlogy,
    "xlog1py": torch.special.xlog1py,
    "logaddexp": torch.logaddexp,
    "logaddexp2": torch.logaddexp2,
    "nextafter": torch.nextafter,
    "heaviside": torch.heaviside,
    "lerp": lambda a, b: torch.lerp(a, b, 0.3),
    "lerp_tensor": lambda a, b: torch.lerp(a, b, torch.sigmoid(b)),
    "addcmul": lambda a, b: torch.addcmul(a, a, b, value=2),
    "addcdiv": lambda a, b: torch.addcdiv(a, a, b, value=-0.5),
    "clamp_tensor": lambda a, b: torch.clamp(a, min=b - 1, max=b + 1),
    "clamp_min_tensor": lambda a, b: torch.clamp_min(a, b),
    "clamp_max_tensor": lambda a, b: torch.clamp_max(a, b),
    "where": lambda a, b: torch.where(a > b, a, b),
    "igamma": lambda a, b: torch.igamma(a.abs() + 0.5, b.abs()),
    "igammac": lambda a, b: torch.igammac(a.abs() + 0.5, b.abs()),
    "zeta": lambda a, b: torch.special.zeta(a.abs() + 1.5, b.abs() + 0.5),
}
_NOT_DIFFERENTIABLE = {"div_trunc", "div_floor", "floor_divide", "nextafter", "heaviside",
                       "igamma", "igammac", "zeta"}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_float32_broadcast_forward_and_grad(name, no_pointwise_fallback):
    fn = BINARY[name]
    a = torch.randn(3, 4) * 3
    b = torch.randn(4) * 2
    if name in ("pow", "xlogy", "xlog1py"):
        b = b.abs() + 0.5
        a = a.abs() if name == "pow" else a
    if name in ("div_trunc", "div_floor", "floor_divide", "remainder", "fmod", "div"):
        b = torch.where(b.abs() < 0.2, torch.full_like(b, 0.7), b)
    assert_same(fn, a, b, atol=1e-5, rtol=1e-4)
    if name not in _NOT_DIFFERENTIABLE:
        assert_same_grad(fn, a, b, atol=1e-4, rtol=1e-4)


INT_BINARY = ["add_alpha", "rsub", "mul", "div", "div_trunc", "div_floor", "remainder", "fmod",
              "maximum", "where"]
INT_CASES = [(name, torch.int64) for name in INT_BINARY] + [
    (name, dtype)
    for name in ("div_trunc", "div_floor", "remainder", "fmod")
    for dtype in (torch.int32, torch.uint8)
]


@pytest.mark.parametrize("name,dtype", INT_CASES, ids=str)
def test_binary_integers(name, dtype, no_pointwise_fallback):
    """Integer math stays integral: signs of quotients and remainders as on CPU."""
    low = 0 if dtype == torch.uint8 else -20
    a = torch.randint(low, 20, (5, 6), dtype=dtype)
    b = torch.randint(1, 7, (6,), dtype=dtype)
    if dtype != torch.uint8:
        b = b * torch.tensor([1, -1, 1, -1, -1, 1], dtype=dtype)
    assert_same(BINARY[name], a, b)


PROMOTIONS = [
    (torch.int32, torch.float32),
    (torch.int64, torch.float16),
    (torch.bfloat16, torch.float16),
    (torch.bool, torch.int64),
    (torch.uint8, torch.int8),
]


@pytest.mark.parametrize("dtypes", PROMOTIONS, ids=str)
@pytest.mark.parametrize("name", ["add", "div", "maximum", "where"])
def test_binary_type_promotion(name, dtypes, no_pointwise_fallback):
    a = (torch.randn(3, 4) * 5).to(dtypes[0])
    b = (torch.randn(4) * 5 + 0.5).to(dtypes[1])
    if name == "div":
        b = torch.where(b == 0, torch.ones_like(b), b)
    assert_same(BINARY[name], a, b, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.int32])
@pytest.mark.parametrize("scalar", [-3, 2.5, True])
def test_scalar_operands_promote_like_python_numbers(dtype, scalar, no_pointwise_fallback):
    x = (torch.randn(4, 3) * 4).to(dtype)
    tol = 1e-2 if dtype == torch.float16 else None
    assert_same(lambda t: (t + scalar, t * scalar, t / scalar, t < scalar), x, atol=tol, rtol=tol)
    if not isinstance(scalar, bool):
        assert_same(lambda t: (scalar - t, t.clamp(min=scalar)), x, atol=tol, rtol=tol)


def test_bool_tensors_with_scalars(no_pointwise_fallback):
    x = torch.rand(4, 3) > 0.5
    assert_same(lambda t: (t + True, t * 3, t + 2.5, t == 1, t / 2), x)


def test_zero_dim_tensors_promote_below_dimensioned(no_pointwise_fallback):
    x = torch.randn(4).half()
    assert_same(lambda t, s: t * s, x, torch.tensor(3.0, dtype=torch.float64), atol=1e-2, rtol=1e-2)
    assert_same(lambda t, s: t + s, torch.arange(4, dtype=torch.int32), torch.tensor(2.5))
    assert_same(lambda t, s: t + s, torch.arange(4, dtype=torch.int8), torch.tensor(1000))


def test_float_division_rounding_modes_edge_cases(no_pointwise_fallback):
    inf, nan = float("inf"), float("nan")
    a = torch.tensor([7.0, -7.0, 7.0, -7.0, 0.0, -0.0, 1.0, -1.0, 0.0, inf, 5.0, 0.3, -0.5])
    b = torch.tensor([2.0, 2.0, -2.0, -2.0, 3.0, 3.0, 0.0, 0.0, 0.0, 2.0, inf, 0.1, 2.0])
    for fn in (BINARY["div_floor"], BINARY["div_trunc"], BINARY["remainder"], BINARY["fmod"],
               BINARY["div"], torch.floor_divide):
        assert_same(fn, a, b)
    assert_same(lambda t: t // -2.5, a)
    assert_same(lambda t: t % -2.5, a)
    assert_same(lambda t: torch.fmod(t, -2.5), a)
    assert_same(lambda t: torch.remainder(5, t), a[:4])
    assert_same(lambda t: t.float() // 2, torch.tensor([nan, -inf]))


def test_pow_overloads(no_pointwise_fallback):
    x = torch.randn(3, 4)
    e = torch.randint(0, 4, (4,)).float()
    assert_same(lambda t: t**2, x, rtol=1e-5, atol=1e-6)
    assert_same(lambda t: t**3, x, rtol=1e-5, atol=1e-6)
    assert_same(lambda t: t**-1.5, x.abs() + 0.1, rtol=1e-5, atol=1e-6)
    assert_same(lambda t: t**0.5, x.abs(), rtol=1e-5, atol=1e-6)
    assert_same(lambda t, u: t**u, x, e, rtol=1e-5, atol=1e-6)
    assert_same(lambda t: 2**t, x, rtol=1e-5, atol=1e-6)
    assert_same(lambda t: 2.5**t, torch.arange(5), rtol=1e-5, atol=1e-6)
    assert_same_grad(lambda t: t**3, x, rtol=1e-5, atol=1e-5)
    assert_same_grad(lambda t, u: t.abs() ** u, x, e.abs() + 0.5, rtol=1e-4, atol=1e-4)
    assert_same_grad(lambda t: 3**t, x, rtol=1e-5, atol=1e-5)
    assert_same(lambda t: t**2, x.half(), rtol=1e-3, atol=1e-3)


def test_integer_pow_wraps_and_negative_exponents(no_pointwise_fallback):
    base = torch.tensor([0, 1, -1, 2, -2, 3, 7, 10], dtype=torch.int64)
    exponent = torch.tensor([0, -3, -3, -1, 3, 40, 25, 0], dtype=torch.int64)
    assert_same(torch.pow, base, exponent)
    assert_same(lambda t: t**5, base.int())
    assert_same(lambda t: t**33, base.int())
    assert_same(lambda t: 2**t, exponent.clamp(min=0))


def test_integer_overflow_wraps(no_pointwise_fallback):
    big = torch.tensor([2**31 - 1, -(2**31), 123456789], dtype=torch.int32)
    assert_same(lambda t: t + 1, big)
    assert_same(lambda t: t * 3, big)
    assert_same(lambda t: -t, big)
    assert_same(torch.abs, big)
    assert_same(lambda t: t + 100, torch.tensor([200, 100, 27], dtype=torch.uint8))
    huge = torch.tensor([2**63 - 1, -(2**63)], dtype=torch.int64)
    assert_same(lambda t: t + 1, huge)
    assert_same(lambda t: t - 1, huge)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.int8, torch.uint8])
def test_float_to_integer_conversion_truncates(dtype, no_pointwise_fallback):
    x = torch.tensor([1.7, -1.7, -0.5, 0.5, 2.999, -2.999, 100.2, 0.0])
    if dtype == torch.uint8:
        x = x.abs()
    assert_same(lambda t: t.to(dtype), x)
    assert_same(lambda t: t.half().to(dtype), x)


COMPARISONS = [torch.eq, torch.ne, torch.lt, torch.le, torch.gt, torch.ge]


@pytest.mark.parametrize("op", COMPARISONS, ids=lambda f: f.__name__)
def test_comparisons(op, no_pointwise_fallback):
    a = torch.randint(-3, 3, (4, 5)).float()
    a[0, 0] = float("nan")
    b = torch.randint(-3, 3, (5,))
    assert_same(op, a, b)
    assert_same(lambda t: op(t, 0.5), b)


def test_comparisons_across_dtypes(no_pointwise_fallback):
    a = torch.randint(-3, 3, (4, 5)).float()
    assert_same(torch.eq, a.half(), a.bfloat16())
    assert_same(torch.ne, a > 0, torch.tensor(True))
    assert_same(lambda t: t <= 1, a.to(torch.int8))


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32])
def test_logical_ops(dtype, no_pointwise_fallback):
    a = torch.randint(-1, 2, (3, 4)).to(dtype)
    b = torch.randint(0, 2, (4,)).to(dtype)
    for fn in (torch.logical_and, torch.logical_or, torch.logical_xor):
        assert_same(fn, a, b)
    assert_same(torch.logical_not, a)
    assert_same(lambda t, u: t.clone().logical_and_(u), a, b)


@pytest.mark.parametrize("dtype", [torch.bool, torch.int64, torch.uint8])
def test_bitwise_ops(dtype, no_pointwise_fallback):
    a = torch.randint(0, 100, (3, 4)).to(dtype)
    b = torch.randint(0, 100, (4,)).to(dtype)
    one = True if dtype == torch.bool else 5
    for fn in (torch.bitwise_and, torch.bitwise_or, torch.bitwise_xor):
        assert_same(fn, a, b)
        assert_same(lambda t, f=fn: f(t, one), a)
    assert_same(lambda t: torch.bitwise_and(one, t), a)
    assert_same(torch.bitwise_not, a)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int64, torch.uint8])
def test_shifts_including_out_of_range_counts(dtype, no_pointwise_fallback):
    bits = torch.iinfo(dtype).bits
    low = 0 if dtype == torch.uint8 else -50
    a = torch.randint(low, 50, (8,), dtype=dtype)
    counts = torch.tensor([0, 1, 3, bits - 1, bits, bits + 3, 2, 5], dtype=dtype)
    assert_same(lambda t, s: t << s, a, counts)
    assert_same(lambda t, s: t >> s, a, counts)
    assert_same(torch.bitwise_left_shift, a, counts)
    assert_same(torch.bitwise_right_shift, a, counts)
    assert_same(lambda t: t >> 1, a)
    assert_same(lambda t, s: t.clone().__ilshift__(s), a, counts)


_SHIFT_INPUTS = {
    "bool": lambda d: torch.tensor([True, False, True], device=d),
    "int64": lambda d: torch.tensor([3, -4, 7], device=d),
    "uint8": lambda d: torch.tensor([3, 4, 255], dtype=torch.uint8, device=d),
    "float": lambda d: torch.tensor([1.0, 2.0, 3.0], device=d),
}
_SHIFT_COUNTS = {
    "1": lambda d: 1,
    "70": lambda d: 70,
    "1.5": lambda d: 1.5,
    "True": lambda d: True,
    "0-d int": lambda d: torch.tensor(2, device=d),
    "bool tensor": lambda d: torch.tensor([True, False, True], device=d),
    "int8 tensor": lambda d: torch.tensor([1, 2, 9], dtype=torch.int8, device=d),
    "0-d float": lambda d: torch.tensor(1.0, device=d),
}
_SHIFT_FORMS = {
    "<<": lambda a, s: a << s,
    ">>": lambda a, s: a >> s,
    "<<=": lambda a, s: a.__ilshift__(s),
    ">>=": lambda a, s: a.__irshift__(s),
    "bitwise_left_shift_": lambda a, s: a.bitwise_left_shift_(s),
}


@pytest.mark.parametrize("form", _SHIFT_FORMS)
@pytest.mark.parametrize("counts", _SHIFT_COUNTS)
@pytest.mark.parametrize("inputs", _SHIFT_INPUTS)
def test_shift_operators_promote_and_refuse_as_cpu(inputs, counts, form):
    """Python's shift operators are CPU's bitwise shift kernels: a bool tensor promotes
    (`mask << 1` is int64), floats are refused as CPU refuses them, an in-place form
    refuses a result it cannot hold first. PyTorch's meta kernel for the operators
    refused bool inputs, so tpu raised where CPU computes."""
    fn = _SHIFT_FORMS[form]
    assert_same_outcome(
        lambda d: fn(_SHIFT_INPUTS[inputs](d), _SHIFT_COUNTS[counts](d))
    )


def test_clamp_overloads_and_nan(no_pointwise_fallback):
    nan = float("nan")
    x = torch.tensor([-3.0, -1.0, 0.0, nan, 2.0, 5.0])
    assert_same(lambda t: t.clamp(-1.5, 2.5), x)
    assert_same(lambda t: t.clamp(min=0.5), x)
    assert_same(lambda t: t.clamp(max=0.5), x)
    assert_same(lambda t: t.clamp(3.0, 1.0), x)  # min > max gives max
    assert_same(lambda t: t.clamp(min=nan), x)
    lo = torch.tensor([nan, -2.0, -2.0, -2.0, 0.0, 0.0])
    assert_same(lambda t, m: t.clamp(min=m, max=m + 3), x, lo)
    assert_same(lambda t, m: torch.clamp_min(t, m), x, lo)
    assert_same(lambda t, m: torch.clamp_max(t, m), x, lo)
    assert_same(lambda t: t.clamp(1, 5), torch.arange(-3, 8))
    assert_same(lambda t: t.clamp(0.5), torch.arange(-3, 8))
    assert_same(lambda t: t.clone().clamp_(-1, 1), x)
    assert_same(torch.minimum, x, lo)
    assert_same(torch.maximum, x, lo)
    assert_same(torch.fmin, x, lo)
    assert_same(torch.fmax, x, lo)
    assert_same_grad(lambda t: t.clamp(-1.5, 2.5), torch.randn(10) * 3)
    assert_same_grad(lambda t: torch.clamp(t, min=0.0), torch.randn(10))


def test_where_and_gcd_lcm(no_pointwise_fallback):
    c = torch.tensor([True, False, True, False])
    assert_same(torch.where, c, torch.arange(4), torch.arange(4).float() * 0.5)
    assert_same(lambda cc, t: torch.where(cc, t, 0.0), c, torch.randn(3, 4))
    assert_same(lambda cc, t: torch.where(cc, 2, t), c, torch.arange(4, dtype=torch.int16))
    a = torch.tensor([12, -18, 0, 7, 0, 100])
    b = torch.tensor([8, 12, 5, -3, 0, 75])
    assert_same(torch.gcd, a, b)
    assert_same(torch.lcm, a, b)


def test_in_place_and_out_variants(no_pointwise_fallback):
    x = torch.randn(3, 4)
    y = torch.randn(4)
    assert_same(lambda t, u: t.clone().add_(u, alpha=2), x, y)
    assert_same(lambda t, u: t.clone().mul_(u).div_(2.0).sub_(1), x, y)
    assert_same(lambda t: t.clone().exp_().sqrt_().neg_().abs_(), x)
    assert_same(lambda t: t.clone().sigmoid_().logit_(), x, rtol=1e-4, atol=1e-4)
    assert_same(lambda t: t.clone().pow_(2).clamp_min_(0.5), x)
    assert_same(lambda t, u: torch.add(t, u, out=torch.empty(3, 4, device=t.device)), x, y)
    assert_same(lambda t: torch.sin(t, out=torch.empty(0, device=t.device)), x)
    assert_same(lambda t, u: torch.div(t, u, rounding_mode="floor",
                                       out=torch.empty(3, 4, device=t.device)), x, y)
    assert_same(lambda t, u: torch.lt(t, u, out=torch.empty(3, 4, device=t.device)), x, y)
    assert_same(lambda t: t.clone().t().add_(1.0), x)  # through a transposed view
    assert_same(lambda t, u: t.clone()[:, 1].mul_(u[0]), x, y)
    assert_same(lambda t: t.clone().round_(decimals=1), x)
    assert_same(lambda t: torch.ldexp(t, torch.tensor([1, 2, 3, 4], device=t.device)), x)
    assert_same(lambda t: torch.float_power(t, 2), x)


def test_complex_arithmetic(no_pointwise_fallback):
    a = torch.complex(torch.randn(3, 4), torch.randn(3, 4))
    b = torch.complex(torch.randn(4), torch.randn(4))
    tol = {"atol": 1e-5, "rtol": 1e-5}
    for fn in (torch.add, torch.sub, torch.mul, torch.div, torch.eq):
        assert_same(fn, a, b, **tol)
    for fn in (torch.abs, torch.angle, torch.exp, torch.log, torch.sqrt, torch.sgn,
               torch.sin, torch.tanh, torch.sigmoid, torch.reciprocal, torch.neg,
               torch.conj_physical, torch.rsqrt):
        assert_same(fn, a, **tol)
    assert_same(lambda t: t * 2.5 + 1j, a, **tol)
    assert_same(lambda t: t**2, a, **tol)
    assert_same(torch.angle, torch.tensor([-1.0, 0.0, 2.0, float("nan")]))
    assert_same(lambda t: t.real * 2, a)
    assert_same(lambda t: t.imag + 1, a)
    assert_same(torch.complex, torch.randn(4), torch.randn(4))
    assert_same(torch.polar, torch.rand(4), torch.randn(4), **tol)
    assert_same(lambda t: torch.view_as_real(t.clone().conj_physical_()), a)


def test_conj_and_neg_view_give_values(no_pointwise_fallback):
    a = torch.complex(torch.randn(5), torch.randn(5))
    assert_same(lambda t: t.conj().clone(), a)
    assert_same(lambda t: t.conj() * t, a)
    assert_same(lambda t: t.conj().imag * 1, a)
    assert_same(lambda t: torch.view_as_real(t.conj().resolve_conj()), a)
    assert_same(lambda t: torch._neg_view(t) + 0, a)
    assert_same(lambda t: t.conj() + 0, torch.randn(5))  # real conj is the identity
    assert_same_grad(lambda t: (t.conj() * t).real, a)
    assert_same_grad(lambda t: (t * t).abs(), a, atol=1e-5, rtol=1e-5)


def test_backward_helpers_directly(no_pointwise_fallback):
    g = torch.randn(6)
    y = torch.rand(6)
    aten = torch.ops.aten
    assert_same(aten.sigmoid_backward, g, y)
    assert_same(aten.tanh_backward, g, y)
    x = torch.tensor([-0.1, 0.0, 0.05, 0.5, 0.99, 1.2])
    assert_same(aten.logit_backward, g, x)
    assert_same(lambda a, b: aten.logit_backward(a, b, 0.1), g, x)


def test_no_cpu_fallback_for_a_pointwise_model_step(no_pointwise_fallback):
    """A small pointwise-only computation, forward and backward, on tpu tensors."""
    x = torch.randn(8, device="tpu", requires_grad=True)
    w = torch.rand(8, device="tpu", requires_grad=True)
    y = torch.where(x > 0, x.sigmoid() * w, torch.tanh(x) - w.sqrt())
    z = (y.clamp(-1, 1) ** 2 + torch.lerp(x, w, 0.25)).exp()
    z.backward(torch.ones_like(z))
    assert x.grad is not None and w.grad is not None


def test_erfinv_gradient_near_one(no_pointwise_fallback):
    """The backward's exp(erfinv(y)^2) amplifies erfinv's error tenfold near ±1."""
    y = torch.tensor([-0.99971, -0.9987144, -0.93, 0.0, 0.3, 0.7, 0.99, 0.9999])
    assert_same(torch.erfinv, y, rtol=3e-7, atol=0)
    assert_same_grad(torch.erfinv, y)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_polygamma_negative_arguments_and_poles(n, no_pointwise_fallback):
    """Reflection (n = 1) and the zeta shift (n >= 2) below -8, and torch's pole values."""
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([-30.3, -8.4784, -3.5, -3.0, -0.0, 0.0, 0.3, 2.5, 1e4, inf, -inf, nan])
    assert_same(lambda t: torch.polygamma(n, t), x, rtol=2e-5, atol=0)
    assert_same(lambda t: torch.polygamma(n, t), x.bfloat16())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_zeta_below_minus_eight_and_cpus_edge_values(dtype, no_pointwise_fallback):
    """Hurwitz zeta where jax's is wrong (q below about -8: zeta(3, -10.5) came out
    -7.1e13 where CPU gives 0.0041), at the poles and edges CPU's Cephes kernel defines
    (inf at s == 1 and at q = 0, -1, ...; NaN for s < 1 and for a fractional s at q < 0;
    s = inf), and float32 computed in float64 as CPU's kernel does."""
    inf, nan = float("inf"), float("nan")
    s = [3.0, 4.0, 2.0, 6.0, 8.0, 3.0, 2.0, 3.0, 1.0, 0.5, 0.0, 2.5, 5.0, inf, inf, inf, inf, 7.0]
    q = [-10.5, -20.3, -8.7, -15.25, -9.9, -100.5, 2.0, 0.001, 2.0, 3.0, -7.0, -3.0, 0.0, -3.5]
    s += [nan, 3.0]
    q += [0.5, 1.0, 2.0, -1.5, 2.0, nan]
    x, y = torch.tensor(s, dtype=dtype), torch.tensor(q, dtype=dtype)
    expected = torch.special.zeta(x, y)
    got = torch.special.zeta(x.to("tpu"), y.to("tpu")).cpu()
    torch.testing.assert_close(got, expected, rtol=1e-12 if dtype == torch.float64 else 3e-7,
                               atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_zeta_at_exponents_whose_terms_underflow_as_cpu(dtype, no_pointwise_fallback):
    """A finite s so large that the terms past q + 10 underflow: jax's zeta gave NaN for
    all of them. CPU gives 0 where every term underflows (zeta(1000, 12)), the sum of the
    terms near q where they do not (zeta(1e30, -2.5) = inf: (-0.5)^-1e30 overflows), and
    NaN where its Euler-Maclaurin product overflows too (zeta(1e30, 2.5))."""
    s = [400.0, 1000.0, 1001.0, 1e5, 1e30, 1e30, 1e30, 1e30, 1e30, 1e5, 1000.0, 60.0]
    q = [12.0, 2.5, 9.5, 2.5, 2.5, -2.5, -0.5, -7.25, 0.5, 1.0, -20.5, 30.0]
    x, y = torch.tensor(s, dtype=dtype), torch.tensor(q, dtype=dtype)
    expected = torch.special.zeta(x, y)
    got = torch.special.zeta(x.to("tpu"), y.to("tpu")).cpu()
    torch.testing.assert_close(got, expected, rtol=1e-12 if dtype == torch.float64 else 3e-7,
                               atol=0, equal_nan=True)


def test_digamma_gradient_at_negative_arguments(no_pointwise_fallback):
    assert_same_grad(torch.digamma, torch.tensor([-8.4784, -4.3228, -0.5735, 1.1351, 5.1]))


@pytest.mark.parametrize("eager", ["strict", "fused"])
def test_integer_promotion_follows_the_default_dtype(eager):
    """torch.set_default_dtype(torch.float64) makes int / int, uint8 + 5.5 and sqrt of an
    int float64, as on CPU. The first default seen stuck: its output dtype in the op's
    cached entry and its compute dtype in the traced program (float32 digits silently)."""
    a, b = torch.tensor([1, 2, 3], dtype=torch.int32), torch.tensor([3, 3, 7], dtype=torch.int32)
    u = torch.tensor([0, 1, 200], dtype=torch.uint8)
    programs = [lambda a, b, u: a / b, lambda a, b, u: u + 5.5, lambda a, b, u: torch.sqrt(a),
                lambda a, b, u: torch.div(a, 3.0), lambda a, b, u: a * 0.1]
    saved = torch.get_default_dtype()
    try:
        with torch.tpu.set_eager_mode(eager):
            for default in (torch.float32, torch.float64, torch.float32):
                torch.set_default_dtype(default)
                for program in programs:
                    expected = program(a, b, u)
                    actual = program(a.to("tpu"), b.to("tpu"), u.to("tpu"))
                    assert actual.dtype == expected.dtype == default
                    # 1 ulp of float64 at most: CPU's own float64 sqrt is not correctly
                    # rounded on some x86 machines (sqrt(2) 1 ulp low with AVX-512, tpu's
                    # exact); float32 digits would be 1e-8 off
                    torch.testing.assert_close(actual.cpu(), expected, rtol=3e-16, atol=0)
    finally:
        torch.set_default_dtype(saved)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8])
def test_gcd_lcm_at_the_dtypes_minimum(eager_mode, dtype):
    """gcd/lcm with a dtype's minimum (|-128| wraps in int8) never returned on tpu;
    CPU's answers, wrapping included (gcd(55, INT32_MIN) is -1 there)."""
    info = torch.iinfo(dtype)
    torch.manual_seed(0)
    first = [-1 if info.min else 1, 55, info.min, 12, 0, info.max]
    a = torch.cat([torch.tensor(first, dtype=dtype),
                   torch.randint(info.min, info.max, (64,), dtype=dtype)])
    b = torch.cat([torch.tensor([info.min, info.min, info.min, 18, 0, 3], dtype=dtype),
                   torch.randint(info.min, info.max, (64,), dtype=dtype)])
    for fn in (torch.gcd, torch.lcm):
        assert torch.equal(fn(a.to("tpu"), b.to("tpu")).cpu(), fn(a, b))


def _same_bits(fn, *args):
    """fn on CPU and on tpu copies gives the same dtype and the same values, exactly
    (NaNs where CPU has them)."""
    expected = fn(*args)
    actual = fn(*[a.to("tpu") if isinstance(a, torch.Tensor) else a for a in args]).cpu()
    assert actual.dtype == expected.dtype
    differs = (actual != expected) & ~(actual.isnan() & expected.isnan())
    assert not differs.any(), (
        f"{int(differs.sum())} of {differs.numel()} differ: "
        f"{args[0][differs][:4].tolist() if isinstance(args[0], torch.Tensor) else args[0]} -> "
        f"cpu {expected[differs][:4].tolist()}, tpu {actual[differs][:4].tolist()}"
    )


_IN_PLACE_CASTS = {
    "mul_float": lambda x: x.mul_(1.5),
    "mul_0dim_float": lambda x: x.mul_(torch.tensor(1.5, device=x.device)),
    "mul_float_tensor": lambda x: x.mul_(torch.full((3,), 1.5, device=x.device)),
    "div_float": lambda x: x.div_(2.0),
    "add_float": lambda x: x.add_(1.5),
    "fmod_float": lambda x: x.fmod_(1.5),
    "exp": lambda x: x.exp_(),
    "float_mul_complex": lambda x: x.float().mul_(1j),
    "float_add_complex": lambda x: x.float().add_(1j),
    "bool_mul_int": lambda x: x.bool().mul_(2),
}


@pytest.mark.parametrize("case", list(_IN_PLACE_CASTS), ids=str)
def test_in_place_result_must_cast_to_self(case, no_pointwise_fallback):
    """CPU refuses an in-place op whose result dtype self cannot hold; PyTorch's meta
    kernels check only some (add_, sub_), and int.mul_(1.5) truncated on tpu."""
    fn = _IN_PLACE_CASTS[case]
    with pytest.raises(RuntimeError) as cpu_error:
        fn(torch.tensor([1, 2, 3], dtype=torch.int32))
    x = torch.tensor([1, 2, 3], dtype=torch.int32, device="tpu")
    with pytest.raises(RuntimeError) as tpu_error:
        fn(x)
    assert str(tpu_error.value) == str(cpu_error.value)
    assert x.cpu().tolist() == [1, 2, 3]


def test_in_place_results_that_cast_still_run(no_pointwise_fallback):
    x = torch.tensor([1, 2, 3], dtype=torch.int32)
    assert_same(lambda t: t.clone().mul_(True), x)
    assert_same(lambda t: t.clone().mul_(2).eq_(4.5), x)
    assert_same(lambda t: t.clone().div_(2, rounding_mode="floor"), x)
    assert_same(lambda t: t.to(torch.uint8).mul_(-1), x)
    assert_same(lambda t: t.clone().masked_fill_(t > 1, 7), x)
    assert_same(lambda t: t.half().add_(t.double() / 3), x)


def _half_values(dtype):
    generator = torch.Generator().manual_seed(0)
    return (torch.randn(4096, generator=generator) * 10).to(dtype)


_SCALARS = (0.1, 1 / 3, 3.3, 7.77, -0.7, 1e5)
_SCALAR_OPS = [
    lambda t, s: t + s,
    lambda t, s: t - s,
    lambda t, s: s - t,
    lambda t, s: t * s,
    lambda t, s: t / s,
    lambda t, s: torch.div(t, s),
    lambda t, s: torch.add(t, s, alpha=0.3),
    lambda t, s: torch.add(t, t.flip(0), alpha=s if abs(s) < 1e4 else -s / 1e5),
    lambda t, s: t + torch.tensor(s, device=t.device),
    lambda t, s: t + torch.tensor(s, dtype=torch.float64, device=t.device),
    lambda t, s: torch.mul(torch.tensor(s, device=t.device), t),
    lambda t, s: torch.div(torch.tensor(s, device=t.device), t),
    lambda t, s: t.clone().add_(s),
    lambda t, s: t.clone().mul_(s),
    lambda t, s: torch.remainder(t, s),
    lambda t, s: torch.fmod(t, s),
    lambda t, s: torch.pow(t.abs() + 0.5, s if abs(s) < 1e4 else 2.5),
    lambda t, s: torch.pow(abs(s), t / 8),
    lambda t, s: torch.xlogy(t, abs(s)),
    lambda t, s: (t * 0 + s) < s,
    lambda t, s: (t * 0 + s) == s,
    lambda t, s: torch.lerp(t, t * 2, s),
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_with_a_python_scalar_rounds_as_cpu(dtype, no_pointwise_fallback):
    """CPU rounds a Scalar (or a 0-dim tensor) to the tensor's float16/bfloat16 before
    computing in float32, except as mul's and div's second operand."""
    x = _half_values(dtype)
    for s in _SCALARS:
        for op in _SCALAR_OPS:
            _same_bits(op, x, s)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_xlogy_rounds_the_log_as_cpu(dtype, no_pointwise_fallback):
    x = _half_values(dtype)
    y = x.abs().flip(0) + 0.25
    _same_bits(torch.xlogy, x, y)
    _same_bits(torch.special.xlog1py, x, y)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_rounded_division_rounds_the_quotient_as_cpu(dtype, no_pointwise_fallback):
    """CPU's float16/bfloat16 trunc and floor divisions round each step (the quotient
    first) to the dtype, except for a one-element divisor, read as a scalar."""
    a = _half_values(dtype) * 100
    b = _half_values(dtype).flip(0)
    b[::97] = 0
    for mode in ("trunc", "floor"):
        divide = lambda t, u, mode=mode: torch.div(t, u, rounding_mode=mode)  # noqa: E731
        _same_bits(divide, a, b)
        _same_bits(divide, a, 3.3)
        _same_bits(divide, a, torch.tensor([3.3], dtype=dtype))
        _same_bits(divide, a, torch.tensor(3.3))
        _same_bits(divide, a * 30, b / 7)
    _same_bits(torch.floor_divide, a, b)
    if dtype == torch.float16:  # (PyTorch's test_div_rounding_numpy case)
        _same_bits(
            lambda t, u: torch.div(t, u, rounding_mode="trunc"),
            torch.full((64,), -55808.0, dtype=dtype),
            torch.full((64,), 65.75, dtype=dtype),
        )


def test_ldexp_scales_exactly_in_half_precision(no_pointwise_fallback):
    """PyTorch's composite computed 2**other in float16 (2**-25 -> 0, 2**20 -> inf)."""
    mantissas = torch.tensor([-2, 2**-10], dtype=torch.half)
    exponents = torch.tensor([-25, 20])
    _same_bits(torch.ldexp, mantissas, exponents)
    _same_bits(lambda t, e: t.clone().ldexp_(e), mantissas, exponents)
    _same_bits(lambda t, e: torch.ldexp(t, e, out=torch.empty_like(t)), mantissas, exponents)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4096, generator=generator) * torch.exp2(
        torch.randint(-20, 20, (4096,), generator=generator).float())
    for dtype in (torch.float16, torch.float64):
        for exponent_dtype in (torch.int64, torch.int32, torch.int8, torch.float16):
            e = torch.randint(-120, 120, (4096,), generator=generator).to(exponent_dtype)
            _same_bits(torch.ldexp, x.to(dtype), e)
    _same_bits(torch.ldexp, x.half()[:5], torch.tensor([2**40, -(2**40), 2**31, 7, -3]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_nextafter_in_half_precision(dtype, no_pointwise_fallback):
    """nextafter steps in the dtype's own bits (tpu stepped in float32 and rounded:
    nextafter(0, 1) was 0, not the smallest subnormal)."""
    inf = float("inf")
    _same_bits(torch.nextafter, torch.zeros(4, dtype=dtype),
               torch.tensor([1, -1, 0, inf], dtype=dtype))
    _same_bits(torch.nextafter, _half_values(dtype), _half_values(dtype).flip(0))


_BOOL_SUBTRACTIONS = {
    "sub_true": lambda x: torch.sub(x, True),
    "minus_true": lambda x: x - True,
    "true_minus": lambda x: True - x,
    "rsub_false": lambda x: torch.rsub(x, False),
    "sub_in_place_true": lambda x: x.clone().sub_(True),
    "bool_minus_true": lambda x: x.bool() - True,
}


@pytest.mark.parametrize("case", list(_BOOL_SUBTRACTIONS), ids=str)
def test_subtracting_a_python_bool_raises_as_cpu(case, no_pointwise_fallback):
    """CPU refuses a bool operand of sub, a Python True included; the meta kernels look
    at tensors only, and tpu subtracted True as 1."""
    fn = _BOOL_SUBTRACTIONS[case]
    with pytest.raises(RuntimeError) as cpu_error:
        fn(torch.ones(3))
    with pytest.raises(RuntimeError) as tpu_error:
        fn(torch.ones(3, device="tpu"))
    assert str(tpu_error.value) == str(cpu_error.value)


_COMPLEX_CLAMPS = {
    "clamp_min": lambda x: torch.clamp_min(x, 1 + 2j),
    "clamp_max": lambda x: torch.clamp_max(x, 1j),
    "clamp_max_zero_imag": lambda x: torch.clamp_max(x, 1 + 0j),
    "clamp": lambda x: torch.clamp(x, 1j),
    "clamp_upper": lambda x: torch.clamp(x, 0, 2j),
    "clamp_int": lambda x: torch.clamp(x.int(), 1j),
    "clamp_min_in_place": lambda x: x.clone().clamp_min_(1j),
}


@pytest.mark.parametrize("case", list(_COMPLEX_CLAMPS), ids=str)
def test_clamp_refuses_complex_bounds_as_cpu(case, no_pointwise_fallback):
    """PyTorch's meta kernels accept a complex bound on a real tensor; CPU refuses it,
    and tpu returned a complex result."""
    fn = _COMPLEX_CLAMPS[case]
    with pytest.raises(RuntimeError) as cpu_error:
        fn(torch.ones(3))
    with pytest.raises(RuntimeError) as tpu_error:
        fn(torch.ones(3, device="tpu"))
    assert type(tpu_error.value) is type(cpu_error.value)
    assert str(tpu_error.value) == str(cpu_error.value)


def test_complex_zero_to_a_complex_power_is_zero(no_pointwise_fallback):
    """0 ** z with Re(z) > 0 is 0 on CPU; XLA's complex power gave NaN (foreach pow of
    a bool list with a complex exponent showed it)."""
    base = torch.tensor([0j, 1 + 0j, 2j, -3 + 1j], dtype=torch.complex64)
    exponents = torch.tensor([0.9 + 0.05j, 3 + 4.5j, 0.5 - 2j, 2 + 0j], dtype=torch.complex64)
    assert_same(torch.pow, base, exponents, atol=1e-5, rtol=1e-5)
    assert_same(lambda b: torch.pow(b, 3 + 4.5j), base, atol=1e-5, rtol=1e-5)
    assert_same(lambda b: torch._foreach_pow([b, b.real.bool()], 0.9 + 0.05j), base)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int32])
@pytest.mark.parametrize("op", [torch.addcmul, torch.addcdiv], ids=lambda op: op.__name__)
def test_addcmul_addcdiv_refuse_a_complex_value_for_a_real_result(op, dtype, no_pointwise_fallback):
    """CPU reads `value` in the result's type and refuses an imaginary part; tpu dropped
    it (also through _foreach_addcmul)."""
    def call(device):
        x = torch.ones(3, dtype=dtype, device=device)
        return op(x, x.float(), x.float() + 1, value=0.5 + 1j)

    with pytest.raises(RuntimeError) as cpu_error:
        call("cpu")
    with pytest.raises(RuntimeError) as tpu_error:
        call("tpu")
    assert str(tpu_error.value) == str(cpu_error.value)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_integer_addcdiv_raises_cpu_message(dtype, no_pointwise_fallback):
    """PyTorch's meta kernel gives the message as a tuple's repr."""
    def call(device):
        x = torch.ones(3, device=device)
        t = torch.ones(3, dtype=dtype, device=device)
        return torch.addcdiv(x, t, t, value=2)

    with pytest.raises(RuntimeError) as cpu_error:
        call("cpu")
    with pytest.raises(RuntimeError) as tpu_error:
        call("tpu")
    assert str(tpu_error.value) == str(cpu_error.value)


_INF, _NAN = float("inf"), float("nan")
_COMPLEX_EXTREMES = [
    complex(a, b)
    for a in (0.0, -0.0, 1.0, -2.5, _INF, -_INF, _NAN, 1e20)
    for b in (0.0, -0.0, 1.0, -2.5, _INF, -_INF, _NAN, 1e20)
]


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
@pytest.mark.parametrize("op", [torch.exp, torch.exp2], ids=lambda op: op.__name__)
def test_complex_exp_at_infinities_is_cpus(op, dtype, no_pointwise_fallback):
    """exp(+-inf + i*inf/nan) is inf + nan j / 0 + 0j on CPU; XLA gave NaN in both parts,
    and exp2's complex product with ln 2 turned inf * 0 into NaN (exp2(inf + 0j))."""
    z = torch.tensor(_COMPLEX_EXTREMES, dtype=dtype)
    assert_same(lambda t: torch.view_as_real(op(t)), z, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_abs_with_an_infinite_part_is_inf(dtype, no_pointwise_fallback):
    """|inf + nan j| is inf on CPU (hypot); XLA's complex abs gave NaN."""
    assert_same(torch.abs, torch.tensor(_COMPLEX_EXTREMES, dtype=dtype))


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32]
)
def test_exp2_of_integers_is_an_exact_power_of_two(dtype, no_pointwise_fallback):
    """XLA's exp2 missed exact powers of two (exp2(34.) in float32 was 17179887616)."""
    x = torch.arange(-60, 61).to(dtype)
    assert_same(torch.exp2, x, atol=0, rtol=0)
    values = torch.tensor([_INF, -_INF, _NAN, 0.0, -0.0, 1e30, -1e30, 0.5, -7.25, 100.3])
    assert_same(torch.exp2, values.to(dtype) if dtype.is_floating_point else values)


@pytest.mark.parametrize("op", [torch.complex, torch.polar])
def test_complex_parts_broadcast_as_cpu(op, eager_mode):
    """real (5, 1) with imag (5,): lax.complex does not broadcast and the lowering failed
    (helper-44, PyTorch's test_ops)."""
    a, b = torch.rand(5, 1) + 0.1, torch.randn(5)
    torch.testing.assert_close(op(a.to("tpu"), b.to("tpu")).cpu(), op(a, b))


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.int32, torch.int64, torch.uint8, torch.bool]
)
def test_complex_to_real_casts_warn_and_convert_as_on_cpu(dtype):
    """The real part, then CPU's float conversion (x86 truncation for integers; bool is
    "nonzero", imaginary part included), with torch's UserWarning: JAX's own cast warned
    "Casting from complex to real dtypes will soon raise a ValueError"."""
    # (a shape of its own: the warning comes with the cast's first compile, as CPU warns
    # once per process)
    x = torch.tensor([1e10 + 1j, -3.7 + 2j, 0 + 1j, complex("nan")] * 3 + [2.5j]).reshape(13, 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = x.to("tpu").to(dtype).cpu()
    assert torch.equal(got, x.to(dtype)) or torch.allclose(got, x.to(dtype), equal_nan=True)
    categories = {type(w.message) for w in caught}
    assert DeprecationWarning not in categories
    if dtype is not torch.bool:
        assert any("discards the imaginary part" in str(w.message) for w in caught)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_frexp_matches_cpu_on_subnormals_and_specials(dtype):
    """CPU's frexp gives a subnormal its true exponent (-132 for float32 1e-40); XLA's
    flushed it (frexp ran on the CPU fallback). Zeros, infinities and NaN keep their
    value with exponent 0. Every subnormal bit pattern up to 299 is compared, and the
    out= form."""
    tiny = torch.finfo(dtype).tiny
    special = torch.tensor(
        [0.0, -0.0, 1.0, -3.5, tiny, -tiny / 3, float("inf"), -float("inf"), float("nan")],
        dtype=torch.float64,
    ).to(dtype)
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]
    subnormals = torch.arange(1, 300, dtype=bits).view(dtype)
    scaled = torch.randn(200, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    scaled = scaled * 10.0 ** torch.arange(-30, 30, 0.3, dtype=torch.float64)[:200]
    x = torch.cat([special, -subnormals, subnormals, scaled.to(dtype)])
    mantissa, exponent = torch.frexp(x)
    got_mantissa, got_exponent = torch.frexp(x.to("tpu"))
    assert got_exponent.dtype == torch.int32
    assert torch.equal(got_exponent.cpu(), exponent)
    torch.testing.assert_close(got_mantissa.cpu(), mantissa, rtol=0, atol=0, equal_nan=True)
    finite = mantissa.isfinite()
    assert torch.equal(got_mantissa.cpu()[finite].signbit(), mantissa[finite].signbit())
    out = (torch.empty(0, dtype=dtype, device="tpu"), torch.empty(0, device="tpu").int())
    torch.frexp(x.to("tpu"), out=out)
    assert torch.equal(out[1].cpu(), exponent)
    with pytest.raises(RuntimeError, match="only supports floating-point"):
        torch.frexp(torch.arange(3, device="tpu"))


def _ulps_from(value: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """|value - exact| in units of the last place of float32 at exact."""
    target = exact.float().abs()
    ulp = torch.nextafter(target, torch.tensor(math.inf)) - target
    return (value.double() - exact).abs() / ulp.double()


def test_float32_lgamma_is_within_a_few_ulps_as_cpu_s():
    """XLA's float32 lgamma was up to ~40 ulp off for x in (3, 40] and gave 4.8e-7 for
    lgamma(1) and lgamma(2); ops/lgamma.py holds positive x to 4 ulp of float64's value
    (CPU: 1), its zeros exact, and negative x (a cancellation near lgamma's zeros there)
    to 1e-6 of max(1, |lgamma|)."""
    ranges = [torch.logspace(-30, 36, 4001), torch.linspace(0.5, 3, 20001)]
    positive = torch.cat([*ranges, torch.linspace(3, 40, 20001)])
    exact = torch.lgamma(positive.double())
    assert _ulps_from(torch.lgamma(positive.to("tpu")).cpu(), exact).max() <= 4
    assert torch.lgamma(torch.tensor([1.0, 2.0], device="tpu")).cpu().tolist() == [0.0, 0.0]
    negative = torch.linspace(-20, -1e-3, 40001)
    negative = negative[negative != negative.round()]
    exact = torch.lgamma(negative.double())
    error = (torch.lgamma(negative.to("tpu")).cpu().double() - exact).abs()
    assert (error / exact.abs().clamp_min(1)).max() < 1e-6


def test_lgamma_edge_values_are_cpu_s():
    """Poles, infinities, NaN, signed zeros, half types and the float32 overflow point
    CPU's libm has (inf from 4.0371103e36, below where lgamma passes float32's max)."""
    values = [0.0, -0.0, -3.0, -1e30, math.inf, -math.inf, math.nan, 2e-38]  # (normal floats)
    x = torch.tensor([*values, 4.0371100e36, 4.0371103e36])
    torch.testing.assert_close(torch.lgamma(x.to("tpu")).cpu(), torch.lgamma(x), equal_nan=True)
    grid = torch.linspace(-10, 30, 4001)
    grid = grid[grid != grid.round()]
    for dtype in (torch.float16, torch.bfloat16):
        h = grid.to(dtype)
        torch.testing.assert_close(torch.lgamma(h.to("tpu")).cpu(), torch.lgamma(h))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_erfcx_and_log_ndtr_follow_float64_where_jax_s_lost_them(dtype):
    """jax's erfcx multiplied exp(x^2) by an erfc that XLA flushes to zero below
    float32's normal range: erfcx was exactly 0 for x in [9.196, 9.4186] (0.061 is right).
    Its log_ndtr took log(ndtr(x)) where ndtr rounds to near 1: 9% off at x = 4.97 in
    float32, 7.6% at x = 7.98 in float64. Both now hold CPU's accuracy (ops/erfcx.py)."""
    x = torch.cat([torch.linspace(0, 9.19, 5001), torch.linspace(9.19, 9.42, 2001)])
    x = torch.cat([x, torch.linspace(9.42, 100, 5001), torch.linspace(-9, 0, 2001)]).to(dtype)
    exact = torch.special.erfcx(x.double())
    error = (torch.special.erfcx(x.to("tpu")).cpu().double() - exact).abs() / exact
    positive = x >= 0
    assert error[positive].max() < (1e-6 if dtype == torch.float32 else 1e-14)
    assert error[~positive].max() < (5e-6 if dtype == torch.float32 else 1e-14)  # (CPU: 3.8e-6)
    x = torch.cat([torch.linspace(-30, 9, 20001), torch.linspace(-1e4, -30, 101)]).to(dtype)
    exact = torch.special.log_ndtr(x.double())
    kept = exact.abs() > (1e-30 if dtype == torch.float32 else 1e-290)  # (not flushed)
    error = (torch.special.log_ndtr(x.to("tpu")).cpu().double() - exact).abs() / exact.abs()
    assert error[kept].max() < (2e-5 if dtype == torch.float32 else 1e-12)  # (CPU: 1e-5, 0)
    edges = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan], dtype=dtype)
    for fn in (torch.special.erfcx, torch.special.log_ndtr):
        torch.testing.assert_close(fn(edges.to("tpu")).cpu(), fn(edges), equal_nan=True)


_PRODUCT_FORMS = [torch.sinh, torch.cosh, torch.sin, torch.cos]


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
@pytest.mark.parametrize("op", _PRODUCT_FORMS, ids=lambda op: op.__name__)
def test_complex_sinh_cosh_sin_cos_of_small_parts_are_cpu_s(op, dtype):
    """jnp.sinh and jnp.cosh of a complex take (exp(z) -+ exp(-z)) / 2, which cancels for
    a small real part: sinh(1e-5 + 0j) was 0.14% off in complex64, the real part of
    sinh(1e-6 + 1e-6j) 1.7%, the imaginary part of cosh(1e-6 + 1j) 3.4% (and 100% below
    |x| = 3e-8). The product forms (sinh(x) cos(y) + i cosh(x) sin(y), ...), as CPU's,
    keep them."""
    g = torch.Generator().manual_seed(0)
    magnitude = torch.exp(torch.empty(2000, dtype=torch.float64).uniform_(-14, 3, generator=g))
    angle = torch.empty(2000, dtype=torch.float64).uniform_(-math.pi, math.pi, generator=g)
    z = torch.polar(magnitude, angle).to(dtype)
    exact = op(z.to(torch.complex128))
    for part in ("real", "imag"):
        got, want = getattr(op(z.to("tpu")).cpu(), part), getattr(exact, part)
        cpu = getattr(op(z), part)
        scale = want.abs().clamp_min(1e-300)
        ours, cpus = [((v.double() - want).abs() / scale).max() for v in (got, cpu)]
        assert ours <= 4 * cpus + 16 * torch.finfo(dtype).eps  # (complex128's oracle is CPU's)


def test_complex_expm1_near_whole_turns_is_cpu_s():
    """expm1(x + iy) for a small x and y near 2 pi k: XLA's real part cancelled (2% off at
    expm1(-5.4e-7 - 6.2833j)); CPU's expm1(x) cos(y) - 2 sin(y/2)^2 does not. (Measured
    against |expm1(z)|: where x is near y^2 / 2 that real part cancels on CPU too.)"""
    g = torch.Generator().manual_seed(0)
    x = torch.empty(4000, dtype=torch.float64).uniform_(-1e-6, 1e-6, generator=g)
    turns = torch.randint(-3, 4, (4000,), generator=g) * 2 * math.pi
    y = turns + torch.empty(4000, dtype=torch.float64).uniform_(-1e-2, 1e-2, generator=g)
    z = torch.complex(x, y).to(torch.complex64)
    exact = torch.view_as_real(torch.expm1(z.to(torch.complex128)))
    for got in (torch.expm1(z.to("tpu")).cpu(), torch.expm1(z)):
        error = (torch.view_as_real(got).double() - exact).abs().amax(-1) / exact.abs().amax(-1)
        assert error.max() < 1e-6, error.max()


_NEAR_OVERFLOW = [0.0, -0.0, 1e-30, 1e-6, 0.5, 3.0, 9.5, 88.5, 88.9, 89.3, 89.5, 200.0, 1e30]
_NEAR_OVERFLOW += [-v for v in _NEAR_OVERFLOW[2:]] + [_INF, -_INF, _NAN]


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
@pytest.mark.parametrize("op", _PRODUCT_FORMS, ids=lambda op: op.__name__)
def test_complex_sinh_cosh_sin_cos_near_overflow_and_at_extremes_are_cpu_s(op, dtype):
    """Where exp(|t|) overflows but cosh(t) times a factor below 1 does not (float32
    |t| in (88.7, 89.4]: sin(0.5 + 88.9j) is 1e38 + 2e38j on CPU) the results were inf;
    and C99's special cases (sinh(0 + inf j) = 0 + NaN j, cos(inf + inf j) = inf + NaN j,
    sin(0 + NaN j) = 0 + NaN j) came out NaN + NaN j. 196 of these 1089 points differed
    from CPU in complex64 sin, 218 in sinh."""
    z = torch.tensor([complex(a, b) for a in _NEAR_OVERFLOW for b in _NEAR_OVERFLOW], dtype=dtype)
    got, want = (torch.view_as_real(op(v)).cpu() for v in (z.to("tpu"), z))
    torch.testing.assert_close(got, want, rtol=4e-6 if dtype == torch.complex64 else 1e-13,
                               atol=0, equal_nan=True)  # fmt: skip


def test_erf_near_one_is_within_a_ulp_and_a_half():
    """XLA's float32 erf was 2.7-5.3 ulp off for |x| in [0.5, 4) (CPU: 1): erf now goes
    through erfc from |x| = 1 (within 1.5 ulp; 1 - erf(x) cancels there, as gelu's tail
    shows: docs/differences.md)."""
    x = torch.linspace(-4, 4, 80001)
    x = x[x.abs() >= 1]
    exact = torch.erf(x.double())
    assert _ulps_from(torch.erf(x.to("tpu")).cpu(), exact).max() <= 1.5


def test_float32_sinh_and_cosh_of_large_arguments_and_their_overflow_are_cpu_s():
    """XLA's float32 sinh and cosh were 1.5e-6 relative off for |x| in [10, 80] (CPU:
    6e-8), and finite where CPU's overflow (|x| from 88.72 on); now within 1e-7 there
    and inf where CPU is."""
    x = torch.cat([torch.linspace(-89.5, -10, 20001), torch.linspace(10, 89.5, 20001)])
    for fn in (torch.sinh, torch.cosh):
        exact, cpu = fn(x.double()), fn(x)
        got = fn(x.to("tpu")).cpu()
        assert torch.equal(got.isinf(), cpu.isinf())
        finite = cpu.isfinite() & (x.abs() <= 80)
        assert ((got.double() - exact).abs() / exact.abs())[finite].max() < 1e-7


_FORMED_EXPONENTS = [1, 2, 3, -1, -2, 0.5, -0.5]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("exponent", _FORMED_EXPONENTS)
def test_pow_of_a_number_is_cpu_s_product_bit_for_bit(dtype, exponent):
    """CPU's pow(tensor, number) computes these exponents as x * x, x * x * x, 1 / x,
    1 / (x * x), sqrt and 1 / sqrt (bfloat16 rounding each product, float16 rounding
    once): XLA's pow differed from x ** 3 in 26% of float32 elements, and from x ** 2
    (CPU's exact square) in 0.08%."""
    x = (torch.randn(20000, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 3)
    x = torch.cat([x, torch.tensor([0.0, -0.0, _INF, -_INF, _NAN, 1e-30, 1e30])]).to(dtype)
    if dtype == torch.bfloat16 and exponent == -0.5:
        pytest.skip("CPU's bfloat16 -0.5 power is neither form (6 of these 20007 apart, a unit)")
    got, want = torch.pow(x.to("tpu"), exponent).cpu(), torch.pow(x, exponent)
    if exponent == 0.5 and dtype in (torch.float32, torch.float64):
        # (CPU's vectorized sqrt is not correctly rounded: 0.66% of float32 elements)
        want = torch.from_numpy(np.sqrt(x.double().numpy())).to(dtype)
    assert torch.equal(got.nan_to_num(), want.nan_to_num())
    assert torch.equal(got.isnan(), want.isnan())


@pytest.mark.parametrize("exponent", _FORMED_EXPONENTS)
def test_pow_of_a_complex_keeps_cpu_s_exact_parts(exponent):
    """pow(1j, 2) was -1 - 8.7e-8j (exp(2 log z)) where CPU's product is -1 + 0j, and
    pow(3 + 4j, 1) was 3 + 3.9999998j: the products and quotients CPU takes give exact
    parts where they exist."""
    z = torch.tensor([1j, 3 + 4j, -4 - 0j, 0.5j, -2 + 0j, 1 + 1j], dtype=torch.complex64)
    got, want = torch.pow(z.to("tpu"), exponent).cpu(), torch.pow(z, exponent)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)  # (complex products round apart)
    for part in (torch.real, torch.imag):
        assert torch.equal(part(got) == 0, part(want) == 0)
