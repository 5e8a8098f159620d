"""Lowerings: random sampling. Each receives a fresh PRNG key first (see torch_tpu.rng).

torch.rand/randn/randint/randperm and dropout reach these through PyTorch's
composites (empty + uniform_/normal_/random_/bernoulli_). The generator
argument is ignored: tpu randomness comes from torch_tpu.rng.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

from .. import dtypes
from ..rng import draw
from .nn import _up, leaky_relu, outside_unit_interval
from .pointwise import check_fill_value, scalar_type_name
from .registry import lower


def _float_dtype(dtype):
    return dtype if jnp.issubdtype(dtype, jnp.inexact) else jnp.float32


def _uniform(key, shape, dtype, low=0.0, high=1.0):
    """Uniform in [low, high); sampled in the target precision so it never rounds up to high."""
    if jnp.issubdtype(dtype, jnp.complexfloating):
        dtype = jnp.finfo(dtype).dtype
    return draw(jax.random.uniform, key, shape, _float_dtype(dtype), low, high)


def _check_uniform(values: list) -> bool:
    """CPU's range checks (tpu filled uniform_(42, -42) with 42, a range wider than the
    dtype's largest value with inf, and a NaN bound with NaN)."""
    dtype, low, high = values[0].dtype, values[1], values[2]
    real = dtype.to_real()
    if real.is_floating_point:  # (CPU's CHECK_OUT_OF_BOUNDS: a NaN or infinite bound too)
        info = torch.finfo(real)
        for value, which in ((low, "from"), (high, "to")):
            if not info.min <= value <= info.max:
                raise RuntimeError(f"{which} is out of bounds for {_CXX_NAMES[real]}")
    if low > high:
        raise RuntimeError(
            f"uniform_ expects to return a [from, to) range, but found from={low:g} > to={high:g}"
        )
    if dtype.is_floating_point and high - low > torch.finfo(dtype).max:
        raise RuntimeError(
            f"uniform_ expects to-from <= std::numeric_limits<{scalar_type_name(dtype)}>::max(), "
            f"but found to={high:g} and from={low:g} which result in to-from to exceed the limit"
        )
    return True  # the bounds are run-time values: checked at every call


@lower("uniform_.default", random=True, elementwise_draw=True, check=_check_uniform)
def uniform_(key, self, low=0.0, high=1.0, generator=None):
    return _uniform(key, self.shape, self.dtype, low, high)


@lower("normal_.default", random=True, elementwise_draw=True)
def normal_(key, self, mean=0.0, std=1.0, generator=None):
    return draw(jax.random.normal, key, self.shape, _float_dtype(self.dtype)) * std + mean


def _normal_like(key, mean, std):
    shape = jnp.broadcast_shapes(jnp.shape(mean), jnp.shape(std))
    dtype = jnp.result_type(mean, std)
    return draw(jax.random.normal, key, shape, _float_dtype(dtype)) * std + mean


_NEGATIVE_STD = "normal expects all elements of std >= 0.0"


def _check_std(values: list) -> bool:
    """CPU's refusal of a negative (or NaN) std in a tensor, read where it is free: a
    host tensor, or in debug mode. A tpu std is judged on the device (`_negative_std`)."""
    from ..engine import modes

    std = values[1]
    if not isinstance(std, torch.Tensor):
        return False  # a number: PyTorch's meta kernel checks it
    readable = std.is_cpu or modes.current is modes.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING
    if std.numel() and readable and not bool((std >= 0).all()):
        raise RuntimeError(_NEGATIVE_STD)
    return std.is_cpu  # (its values, read at every call; debug mode checks every call)


def _std_on_the_device(values: list) -> bool:
    std = values[1]
    return isinstance(std, torch.Tensor) and not std.is_cpu


def _negative_std(mean, std, generator=None) -> list:
    """In the program (a std tensor: `_std_on_the_device`): CPU's refusal of a std below
    0 or NaN (engine/device_asserts.py)."""
    return [(~jnp.all(std >= 0), RuntimeError, _NEGATIVE_STD)]


@lower(
    "normal.Tensor_float",
    "normal.float_Tensor",
    "normal.Tensor_Tensor",
    random=True,
    check=_check_std,
    device_check=_negative_std,
    device_check_applies=_std_on_the_device,
)
def normal_tensor(key, mean, std, generator=None):
    return _normal_like(key, mean, std)


@lower("log_normal_.default", random=True, elementwise_draw=True)
def log_normal_(key, self, mean=1.0, std=2.0, generator=None):
    return jnp.exp(draw(jax.random.normal, key, self.shape, _float_dtype(self.dtype)) * std + mean)


@lower("exponential_.default", random=True, elementwise_draw=True)
def exponential_(key, self, lambd=1.0, generator=None):
    return -jnp.log1p(-_uniform(key, self.shape, self.dtype)) / lambd


@lower("cauchy_.default", random=True, elementwise_draw=True)
def cauchy_(key, self, median=0.0, sigma=1.0, generator=None):
    return median + sigma * jnp.tan(jnp.pi * (_uniform(key, self.shape, self.dtype) - 0.5))


@lower("geometric_.default", random=True, elementwise_draw=True)
def geometric_(key, self, p, generator=None):
    """Trials up to the first success: support 1, 2, 3, ..."""
    u = _uniform(key, self.shape, dtypes.opmath_float(self.dtype))
    return jnp.floor(jnp.log1p(-u) / jnp.log1p(-p)) + 1


def _check_p(values: list) -> bool:
    """CPU's refusal of a probability number outside [0, 1], judged at every call (the
    number is passed at run time)."""
    p = values[1]
    if not 0 <= p <= 1:
        raise RuntimeError(f"bernoulli_ expects p to be in [0, 1], but got p={p:g}")
    return True


# CPU's words for a probability tensor with an element outside [0, 1] (or NaN)
_P_OUTSIDE = (
    "Expected p_in >= 0 && p_in <= 1 to be true, but got false.  (Could this error message "
    "be improved?  If so, please report an enhancement request to PyTorch.)"
)


@lower("bernoulli_.float", random=True, elementwise_draw=True, check=_check_p)
def bernoulli_float(key, self, p=0.5, generator=None):
    return _uniform(key, self.shape, jnp.float32) < p


def _p_tensor_outside(self, p, generator=None) -> list:
    return [(outside_unit_interval(p), RuntimeError, _P_OUTSIDE)]


@lower("bernoulli_.Tensor", random=True, device_check=_p_tensor_outside)
def bernoulli_tensor(key, self, p, generator=None):
    return _uniform(key, self.shape, _float_dtype(p.dtype)) < jnp.broadcast_to(p, self.shape)


def _self_outside(self, generator=None) -> list:
    return [(outside_unit_interval(self), RuntimeError, _P_OUTSIDE)]


@lower("bernoulli.default", random=True, device_check=_self_outside)
def bernoulli(key, self, generator=None):
    return _uniform(key, self.shape, _float_dtype(self.dtype)) < self


def _integers(key, shape, dtype, low, high):
    """Integers in [low, high] (inclusive; any 64-bit span), as dtype."""
    span = high - low + 1
    bits = draw(jax.random.bits, key, shape, jnp.uint64)
    if span < 2**64:
        bits = bits % np.uint64(span)
    value = jax.lax.bitcast_convert_type(bits + np.uint64(low % 2**64), jnp.int64)
    return value.astype(dtype)


def _default_high(dtype) -> int:
    """random_'s inclusive upper bound: the dtype's max, or 2**mantissa for floats
    (so every value is exactly representable)."""
    if dtype == jnp.bool_:
        return 1
    if jnp.issubdtype(dtype, jnp.integer):
        return int(jnp.iinfo(dtype).max)
    return 2 ** (jnp.finfo(dtype).nmant + 1)


# ------------------------------------------------ random_'s argument checks (CPU's)

_INT64_MIN = -(2**63)
# how PyTorch's messages name each dtype (C++ type names)
_CXX_NAMES = {
    torch.bool: "bool",
    torch.uint8: "unsigned char",
    torch.int8: "signed char",
    torch.int16: "short int",
    torch.int32: "int",
    torch.int64: "long int",
    torch.float16: "c10::Half",
    torch.bfloat16: "c10::BFloat16",
    torch.float32: "float",
    torch.float64: "double",
}


def _digits(dtype: torch.dtype) -> int:
    return {torch.float16: 11, torch.bfloat16: 8, torch.float32: 24, torch.float64: 53}[dtype]


def _as_float_int(value: int, dtype: torch.dtype) -> int:
    """int64 -> dtype -> int64, as C++'s static_casts round it (x86: a value past the
    int64 range, or an infinity, becomes the int64 minimum)."""
    host = torch.tensor(value, dtype=torch.float64, device="cpu")
    rounded = host.to(dtype).to(torch.float64).item()
    return int(rounded) if -(2.0**63) <= rounded < 2.0**63 else _INT64_MIN


def _update_from(value: int, dtype: torch.dtype) -> int:
    """PyTorch's update_from: the smallest from the dtype represents exactly."""
    plus_one = _as_float_int(value + 1, dtype)
    if plus_one < value:
        n = abs(value + 1).bit_length() - 1
        value = plus_one + (1 << (n - _digits(dtype) + 1))
    return value


def _update_to(value: int, dtype: torch.dtype) -> int:
    minus_one = _as_float_int(value - 1, dtype)
    if minus_one >= value:
        n = abs(value - 1).bit_length() - 1
        value = minus_one - (1 << (n - _digits(dtype) + 1))
    return value


def _float_bounds(dtype: torch.dtype, low: int, high: int | None) -> tuple[int, int | None]:
    """For a float dtype, CPU's bounds: from and to moved to values the dtype holds
    (update_from/update_to), so that an integer drawn below `to` never rounds up to it
    (float16 random_(3000) draws from [0, 2998): 2999 would round to 3000). The checks
    judge these bounds, and the lowerings draw between them."""
    if not dtype.is_floating_point:
        return low, high
    return _update_from(low, dtype), (None if high is None else _update_to(high, dtype))


def _check_in_range(low: int, high_inclusive: int, dtype: torch.dtype) -> None:
    if dtype.is_floating_point:
        info = torch.finfo(dtype)
        bounds = (info.min, info.max)
    else:
        info = torch.iinfo(dtype) if dtype != torch.bool else None
        bounds = (0, 1) if info is None else (info.min, info.max)
    for value, name in ((low, "from"), (high_inclusive, "to - 1")):
        if not bounds[0] <= value <= bounds[1]:
            raise RuntimeError(f"{name} is out of bounds for {_CXX_NAMES.get(dtype, dtype)}")


def _random_bounds(dtype: torch.dtype, low: int, high: int | None) -> None:
    """CPU's checks of random_(from, to) (DistributionTemplates.h), before anything runs."""
    floating = dtype.is_floating_point
    if high is not None:
        if not low < high:
            raise RuntimeError(
                f"random_ expects 'from' to be less than 'to', but got from={low} >= to={high}"
            )
        if floating:
            low, high = _float_bounds(dtype, low, high)
            if not low < high:
                raise RuntimeError(
                    "random_ expects 'from' casted to dtype to be less than 'to' casted to "
                    f"dtype, but got from={low} >= to={high}"
                )
        _check_in_range(low, high - 1, dtype)
    elif low != _INT64_MIN:
        if floating:
            high_inclusive = 1 << _digits(dtype)
            low, _ = _float_bounds(dtype, low, None)
            if not low < high_inclusive:
                raise RuntimeError(
                    "random_ expects 'from' casted to dtype to be less than or equal to 'to_inc' "
                    f"casted to dtype, but got from={low} > to_inc={high_inclusive}"
                )
        else:
            high_inclusive = 1 if dtype == torch.bool else torch.iinfo(dtype).max
        _check_in_range(low, high_inclusive, dtype)


def _check_random_from(values: list) -> bool:
    _random_bounds(values[0].dtype, values[1], values[2])
    return False  # from and to are part of the cache key


def _check_random_to(values: list) -> bool:
    _random_bounds(values[0].dtype, 0, values[1])
    return False


@lower("random_.default", random=True, elementwise_draw=True)
def random_(key, self, generator=None):
    return _integers(key, self.shape, self.dtype, 0, _default_high(self.dtype))


@lower("random_.from", random=True, elementwise_draw=True, check=_check_random_from)
def random_from(key, self, low, high=None, generator=None):
    low, high = _float_bounds(dtypes.to_torch(self.dtype), low, high)
    high = _default_high(self.dtype) if high is None else high - 1
    return _integers(key, self.shape, self.dtype, low, high)


@lower("random_.to", random=True, elementwise_draw=True, check=_check_random_to)
def random_to(key, self, high, generator=None):
    _, high = _float_bounds(dtypes.to_torch(self.dtype), 0, high)
    return _integers(key, self.shape, self.dtype, 0, high - 1)


_EXACT_FLOAT_LIMITS = {torch.float16: ("2049", 2049), torch.float32: ("2^24+1", 2**24 + 1),
                       torch.float64: ("2^53+1", 2**53 + 1)}  # fmt: skip


def _check_randperm(values: list) -> bool:
    """CPU's refusal of an n the out= dtype cannot count to (tpu's randperm(257) into
    uint8 repeated values). CPU does not check bfloat16."""
    n, dtype = values[0], values[-1].dtype
    if dtype in _EXACT_FLOAT_LIMITS:
        text, limit = _EXACT_FLOAT_LIMITS[dtype]
        if n > limit:
            name = scalar_type_name(dtype)
            raise RuntimeError(f"n cannot be greater than {text} for {name} type.")
    elif n > 0:
        check_fill_value(n - 1, dtype)  # (CPU's own conversion judges: its error, its words)
    return False  # n and the dtype are part of the key


@lower("randperm.generator_out", random=True, check=_check_randperm)
def randperm(key, n, generator=None, out=None):
    return jax.random.permutation(key, n).astype(out.dtype)


def _invalid_distribution(self, num_samples, replacement=False, generator=None) -> list:
    """CPU's refusals of multinomial's probabilities, judged on the device."""
    return [
        (
            ~jnp.all(jnp.isfinite(self) & (self >= 0)),
            RuntimeError,
            "probability tensor contains either `inf`, `nan` or element < 0",
        ),
        (
            jnp.any(jnp.sum(self, axis=-1) <= 0),
            RuntimeError,
            "invalid multinomial distribution (sum of probabilities <= 0)",
        ),
    ]


def _check_samples(values: list) -> bool:
    if values[1] <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    return False


@lower(
    "multinomial.default",
    random=True,
    check=_check_samples,
    device_check=_invalid_distribution,
)
def multinomial(key, self, num_samples, replacement=False, generator=None):
    """With replacement: independent categorical draws. Without: the top-k of
    Gumbel-perturbed log-probabilities, which samples without replacement."""
    logits = jnp.log(self.astype(_float_dtype(self.dtype)))
    batch = self.shape[:-1]
    if replacement:
        shape = batch + (num_samples,)
        return jax.random.categorical(key, logits[..., None, :], axis=-1, shape=shape)
    perturbed = logits + draw(jax.random.gumbel, key, self.shape, logits.dtype)
    return jax.lax.top_k(perturbed, num_samples)[1]


def _flat_draw(sample, key, parameter, dtype):
    """`sample(key, parameter, dtype=dtype)` over a flat copy of the parameter (see
    rng.draw: flat draws compile faster), in the parameter's shape. (JAX's samplers take
    no half dtypes: callers draw in `dtypes.opmath_float`.)"""
    return sample(key, parameter.reshape(-1), dtype=dtype).reshape(parameter.shape)


@lower("_standard_gamma.default", random=True)
def standard_gamma(key, self, generator=None):
    """Gamma(self, 1) samples (torch.distributions' Gamma, Beta, Chi2, StudentT). CPU floors
    a sample at the dtype's smallest normal number, which is also its answer for a
    concentration <= 0 or NaN."""
    tiny = jnp.asarray(jnp.finfo(self.dtype).tiny, self.dtype)
    sample = _flat_draw(jax.random.gamma, key, self, dtypes.opmath_float(self.dtype))
    return jnp.where(self > 0, jnp.maximum(sample.astype(self.dtype), tiny), tiny)


@lower("_standard_gamma_grad.default")
def standard_gamma_grad(self, output):
    """d sample / d concentration at fixed quantile (Gamma.rsample's backward)."""
    return jax.lax.random_gamma_grad(self, output)


@lower("_sample_dirichlet.default", random=True)
def sample_dirichlet(key, self, generator=None):
    """Gamma samples normalized over the last dim, drawn in log space (as CPU draws in
    float64: a concentration of 1e-3 underflows a float32 gamma sample), then held in
    [smallest normal, the float below 1] as CPU holds them; a concentration <= 0 or NaN
    draws CPU's floor, and a row a NaN reaches gets the floor, as CPU's clamp gives."""
    dtype, sampled = self.dtype, dtypes.opmath_float(self.dtype)
    floor = jnp.asarray(np.log(np.finfo(np.float64).tiny), sampled)  # CPU's, in log space
    logs = jnp.where(self > 0, _flat_draw(jax.random.loggamma, key, self, sampled), floor)
    value = jax.nn.softmax(logs, axis=-1).astype(dtype)
    tiny = jnp.asarray(jnp.finfo(dtype).tiny, dtype)
    below_one = jnp.nextafter(jnp.asarray(1, dtype), jnp.asarray(0, dtype))
    return jnp.where(jnp.isnan(value), tiny, jnp.clip(value, tiny, below_one))


def _poisson_device_check(self, *rest) -> list:
    """CPU refuses a negative or NaN rate (engine/device_asserts.py)."""
    words = "invalid Poisson rate, expected rate to be non-negative"
    return [(jnp.any(~(self >= 0)), RuntimeError, words)]


@lower("poisson.default", random=True, device_check=_poisson_device_check)
def poisson(key, self, generator=None):
    """Counts in the rate's dtype; half rates drawn from float32."""
    rate = self.astype(dtypes.opmath_float(self.dtype))
    return _flat_draw(jax.random.poisson, key, rate, jnp.int64).astype(self.dtype)


def _check_binomial(values: list) -> bool:
    """CPU's kernel's checks (its meta kernel has none): floating counts, one dtype."""
    count, prob = values[0], values[1]
    for name, t in (("count", count), ("prob", prob)):
        if not t.dtype.is_floating_point:
            raise ValueError(
                f"binomial only supports floating-point dtypes for {name}, got: "
                f"{scalar_type_name(t.dtype)}"
            )
    if prob.dtype != count.dtype:
        raise RuntimeError(
            f"Found dtype {scalar_type_name(prob.dtype)} but expected "
            f"{scalar_type_name(count.dtype)}"
        )
    return False


@lower("binomial.default", random=True, check=_check_binomial)
def binomial(key, count, prob, generator=None):
    """Successes in `count` trials: a negative count has none, a probability above 1
    succeeds every time and a NaN one gives NaN, as on CPU; a fractional count (outside
    the distribution) is taken as its floor."""
    dtype = dtypes.opmath_float(count.dtype)
    shape = jnp.broadcast_shapes(count.shape, prob.shape)
    n = jnp.broadcast_to(jnp.maximum(jnp.floor(count.astype(dtype)), 0), shape).reshape(-1)
    p = jnp.broadcast_to(prob.astype(dtype), shape).reshape(-1)
    drawn = jax.random.binomial(key, n, jnp.clip(p, 0, 1), dtype=dtype)
    return jnp.where(jnp.isnan(p), jnp.nan, drawn).reshape(shape).astype(count.dtype)


def _check_rrelu(values: list) -> bool:
    """CPU's refusals: a noise of another shape; in training a non-float input, a noise
    of another dtype, lower > upper; in eval leaky_relu's. (float16 in training, which
    CPU's kernel lacks and CUDA's has, is computed: docs/differences.md.)"""
    self, noise, lower, upper, training = values[:5]
    name = scalar_type_name(self.dtype)
    if noise.shape != self.shape:
        raise RuntimeError(
            "noise tensor shape must match self tensor shape. Got self.shape = "
            f"{list(self.shape)} noise.shape = {list(noise.shape)}"
        )
    if not training:
        if not self.is_floating_point():
            raise NotImplementedError(f"\"leaky_relu_cpu\" not implemented for '{name}'")
        return False
    if not self.is_floating_point():  # (float16, which CPU refuses, CUDA computes: so do we)
        raise NotImplementedError(f"\"rrelu_with_noise_out_cpu\" not implemented for '{name}'")
    if noise.dtype != self.dtype:
        raise RuntimeError(
            f"expected scalar type {name} but found {scalar_type_name(noise.dtype)}"
        )
    if float(lower) > float(upper):
        raise RuntimeError(
            "Expected from <= to to be true, but got false.  (Could this error message be "
            "improved?  If so, please report an enhancement request to PyTorch.)"
        )
    return True  # (the bounds are run-time scalars: checked at every call)


@lower("rrelu_with_noise.default", random=True, writes=("noise",), check=_check_rrelu)
def rrelu_with_noise(key, self, noise, lower=0.125, upper=1 / 3, training=False, generator=None):
    """nn.RReLU: in training each input <= 0 is scaled by a slope drawn uniformly from
    [lower, upper), kept in `noise` (1 elsewhere) for the backward; in eval, leaky_relu
    with the mean slope, `noise` left as it is."""
    if not training:
        return leaky_relu(self, (lower + upper) / 2), noise
    x = _up(self)
    slopes = _uniform(key, x.shape, x.dtype, lower, upper)
    negative = x <= 0
    return (
        jnp.where(negative, x * slopes, x).astype(self.dtype),
        jnp.where(negative, slopes, 1).astype(noise.dtype),
    )
