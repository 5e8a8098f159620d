"""Reductions, scans, sorting and norms on tpu against the CPU, forward and backward."""

from __future__ import annotations

import math
import re
import warnings

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
    to_cpu,
)

NAN = math.nan
INF = math.inf

# Aten packets this family lowers: none of them may take the CPU fallback.
FAMILY = lowered_packets("reduction")


@pytest.fixture(autouse=True)
def _family_never_falls_back():
    with no_fallback("reduction", lambda op: packet(op) in FAMILY):
        yield


def _sample(dtype, shape=(3, 4, 5)):
    if dtype is torch.bool:
        return torch.rand(shape) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape).to(dtype)
    return torch.randint(-3, 4, shape, dtype=dtype)


def _check(fn, x, **tol):
    """assert_same, skipped where the CPU itself rejects the dtype."""
    try:
        fn(x)
    except (RuntimeError, NotImplementedError) as error:
        pytest.skip(f"CPU does not support it: {error}")
    assert_same(fn, x, **tol)


def _tol(dtype):
    return {"atol": 2e-2, "rtol": 2e-2} if dtype is torch.bfloat16 else {}


ANY_DTYPE = {
    "sum": lambda x: x.sum(),
    "sum_dims": lambda x: x.sum((0, -1), keepdim=True),
    "sum_empty_dims": lambda x: x.sum(dim=[]),
    "sum_dtype": lambda x: torch.sum(x, 1, dtype=torch.float64),
    "prod": lambda x: x[0, 0].prod(),
    "prod_dim": lambda x: x.prod(-1, keepdim=True),
    "count_nonzero": lambda x: torch.count_nonzero(x, (0, 2)),
    "all": lambda x: x.all(),
    "all_dims": lambda x: torch.all(x, (0, -1), keepdim=True),
    "any_dim": lambda x: x.any(-1, keepdim=True),
    "max_dim": lambda x: x.max(1),
    "min_dim": lambda x: x.min(-1, keepdim=True),
    "amax": lambda x: x.amax((0, 2)),
    "amin": lambda x: x.amin(-1, keepdim=True),
    "aminmax": lambda x: torch.aminmax(x, dim=-2, keepdim=True),
    "argmax": lambda x: x.argmax(keepdim=True),
    "argmin_dim": lambda x: x.argmin(-1),
    "cumsum": lambda x: x.cumsum(1),
    "cumprod": lambda x: x[..., :4].cumprod(-1),
    "cummax": lambda x: x.cummax(1),
    "cummin": lambda x: x.cummin(-1),
    "sort_desc_stable": lambda x: x.sort(dim=1, descending=True, stable=True),
}
# Half and double precision only where accumulation or comparisons could differ.
WIDE = ["sum", "sum_dtype", "prod_dim", "max_dim", "amax", "argmax", "cumsum", "cumprod",
        "cummax", "sort_desc_stable"]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "dtype"),
    [(n, d) for n in ANY_DTYPE for d in (torch.float32, torch.int64, torch.bool)]
    + [(n, d) for n in WIDE for d in (torch.float64, torch.bfloat16)],
    ids=str,
)
def test_any_dtype(name, dtype):
    _check(ANY_DTYPE[name], _sample(dtype), **_tol(dtype))


FLOAT_ONLY = {
    "mean": lambda x: x.mean(),
    "mean_dims": lambda x: x.mean((0, -1), keepdim=True),
    "mean_dtype": lambda x: x.mean(1, dtype=torch.float64),
    "var_dim": lambda x: x.var(1),
    "var_c0": lambda x: x.var((0, 2), correction=0, keepdim=True),
    "var_c2": lambda x: torch.var(x, -1, correction=2),
    "std": lambda x: x.std(),
    "var_mean": lambda x: torch.var_mean(x, 1),
    "var_mean_c0": lambda x: torch.var_mean(x, (0, 1), correction=0),
    "std_mean": lambda x: torch.std_mean(x, -1, keepdim=True),
    "std_mean_all": lambda x: torch.std_mean(x),
    "logsumexp": lambda x: x.logsumexp(1),
    "logsumexp_dims": lambda x: x.logsumexp((0, -1), keepdim=True),
    "logcumsumexp": lambda x: x.logcumsumexp(-1),
    "norm": lambda x: x.norm(),
    "norm_dim": lambda x: x.norm(dim=1, keepdim=True),
    "norm_p1": lambda x: x.norm(p=1, dim=-1),
    "vector_norm_3": lambda x: torch.linalg.vector_norm(x, 3, dim=(0, 2)),
    "vector_norm_half": lambda x: torch.linalg.vector_norm(x, 0.5),
    "vector_norm_0": lambda x: torch.linalg.vector_norm(x, 0, dim=1),
    "vector_norm_inf": lambda x: torch.linalg.vector_norm(x, INF, dim=-1),
    "vector_norm_ninf": lambda x: torch.linalg.vector_norm(x, -INF),
    "vector_norm_dtype": lambda x: torch.linalg.vector_norm(x, dim=1, dtype=torch.float64),
    "aten_norm": lambda x: torch.ops.aten.norm.ScalarOpt_dim(x, 3, [1], True),
    "aten_norm_scalar": lambda x: torch.ops.aten.norm.Scalar(x, 1),
    "aten_norm_dtype": lambda x: torch.ops.aten.norm.ScalarOpt_dtype(x, None, dtype=torch.float64),
    "aten_norm_dim_dtype": lambda x: torch.ops.aten.norm.ScalarOpt_dim_dtype(
        x, 2, [0, 2], False, dtype=torch.float64
    ),
}


FLOAT_WIDE = ["mean_dtype", "var_dim", "std_mean", "logsumexp", "logcumsumexp", "norm_dim",
              "vector_norm_3"]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "dtype"),
    [(n, torch.float32) for n in FLOAT_ONLY]
    + [(n, d) for n in FLOAT_WIDE for d in (torch.float64, torch.bfloat16)],
    ids=str,
)
def test_float_only(name, dtype):
    _check(FLOAT_ONLY[name], _sample(dtype), **_tol(dtype))


def test_integer_logsumexp_and_mean_dtype():
    x = torch.randint(-3, 4, (3, 4))
    assert_same(lambda t: t.logsumexp(1), x)
    assert_same(lambda t: t.mean(dtype=torch.float32), x)


# ------------------------------------------------------------------- NaN


def _with_nans():
    x = torch.randperm(24).float().reshape(4, 6)
    x[0, 2] = x[0, 4] = NAN
    x[2, :] = NAN
    x[3, 0] = NAN
    return x


NAN_CASES = {
    "max": lambda x: x.max(),
    "min": lambda x: x.min(),
    "max_dim": lambda x: x.max(1),
    "min_dim": lambda x: x.min(0),
    "amax": lambda x: x.amax(1),
    "amin": lambda x: x.amin(0),
    "aminmax": lambda x: torch.aminmax(x, dim=1),
    "argmax": lambda x: x.argmax(),
    "argmax_dim": lambda x: x.argmax(1),
    "argmin_dim": lambda x: x.argmin(1),
    "cummax": lambda x: x.cummax(1),
    "cummin": lambda x: x.cummin(1),
    "sort": lambda x: x.sort(1),
    "sort_desc": lambda x: x.sort(1, descending=True),
    "sort_dim0": lambda x: x.sort(dim=0, stable=True),
    "topk": lambda x: x.topk(3, 1).values,  # torch orders tied NaNs arbitrarily
    "topk_smallest": lambda x: x.topk(2, 1, largest=False).values,
    "median": lambda x: x.median(),
    "median_dim": lambda x: x.median(1),
    "nanmedian": lambda x: x.nanmedian(),
    "nanmedian_dim": lambda x: x.nanmedian(1).values,
    "nansum": lambda x: x.nansum(),
    "nansum_dim": lambda x: x.nansum(1, keepdim=True),
    "logsumexp": lambda x: x.logsumexp(1),
}


@pytest.mark.parametrize("name", NAN_CASES)
def test_nan_semantics(name):
    assert_same(NAN_CASES[name], _with_nans())


def test_infinities():
    x = torch.tensor([[-INF, -INF, -INF], [1.0, INF, 2.0], [-INF, 0.0, 1.0]])
    assert_same(lambda t: t.logsumexp(1), x)
    assert_same(lambda t: t.logcumsumexp(1), x)
    assert_same(lambda t: torch.linalg.vector_norm(t, INF, dim=1), x)


# --------------------------------------------------------------- selection


@pytest.fixture
def distinct():
    return torch.randperm(60).float().reshape(3, 4, 5) / 7 - 4


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x.topk(3),
        lambda x: x.topk(2, dim=0, largest=False),
        lambda x: x.topk(4, dim=1, sorted=True),
        lambda x: x.kthvalue(2),
        lambda x: x.kthvalue(3, dim=1, keepdim=True),
        lambda x: x.median(),
        lambda x: x.median(-1),
        lambda x: x.median(0, keepdim=True),
        lambda x: x.nanmedian(1),
        lambda x: x.sort(-2),
        lambda x: x.sort(0, descending=True),
        lambda x: torch.argsort(x, dim=1),
    ],
)
def test_selection_indices(fn, distinct):
    assert_same(fn, distinct)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16], ids=str)
def test_selection_dtypes(dtype):
    x = torch.randperm(20).reshape(4, 5).to(dtype)
    for fn in (lambda t: t.topk(2), lambda t: t.kthvalue(3, 0), lambda t: t.median(1)):
        assert_same(fn, x)


def test_sort_ties_are_stable():
    x = torch.tensor([[0.0, -0.0, 1.0, 0.0, -0.0, 1.0, NAN, -1.0, NAN]])
    assert_same(lambda t: t.sort(stable=True), x)
    assert_same(lambda t: t.sort(descending=True, stable=True), x)
    ints = torch.randint(0, 3, (4, 9))
    assert_same(lambda t: t.sort(stable=True), ints)
    assert_same(lambda t: t.sort(dim=0, descending=True, stable=True), ints)
    assert_same(lambda t: t.sort(dim=-1, stable=True), ints > 0)


def test_mode():
    x = torch.tensor([[1, 2, 2, 1, 3, 3], [5, 5, 5, 4, 4, 4], [7, 0, 7, 0, 0, 1]])
    assert_same(lambda t: t.mode(), x)
    assert_same(lambda t: t.mode(0, keepdim=True), x)
    assert_same(lambda t: t.mode(1), x.float())


# ------------------------------------------------------ empty and 0-d inputs


EMPTY = {
    "sum": lambda x: x.sum(0),
    "sum_all": lambda x: x.sum(),
    "prod": lambda x: x.prod(0),
    "mean": lambda x: x.mean(0),
    "var": lambda x: x.var(0),
    "amax_other_dim": lambda x: x.amax(0),
    "max_other_dim": lambda x: x.max(0),
    "all": lambda x: x.all(1),
    "any": lambda x: x.any(),
    "cumsum": lambda x: x.cumsum(1),
    "sort": lambda x: x.sort(1),
    "logsumexp": lambda x: x.logsumexp(1),
    "norm": lambda x: x.norm(dim=1),
    "count_nonzero": lambda x: torch.count_nonzero(x, 1),
}


@pytest.mark.parametrize("name", EMPTY)
def test_empty(name):
    assert_same(EMPTY[name], torch.randn(3, 0))


SCALAR = {
    "sum_dim": lambda x: x.sum(0),
    "mean_dim": lambda x: x.mean(-1, keepdim=True),
    "max_dim": lambda x: x.max(0),
    "argmax": lambda x: x.argmax(0),
    "argmin_none": lambda x: x.argmin(),
    "cumsum": lambda x: x.cumsum(0),
    "cumprod": lambda x: x.cumprod(-1),
    "cummax": lambda x: x.cummax(0),
    "logcumsumexp": lambda x: x.logcumsumexp(0),
    "sort": lambda x: x.sort(0),
    "topk": lambda x: x.topk(1),
    "topk_0": lambda x: x.topk(0),  # (CPU returns the element, as for k=1)
    "kthvalue": lambda x: x.kthvalue(1),
    "median": lambda x: x.median(),
    "median_dim": lambda x: x.median(0),
    "amax": lambda x: x.amax(0),
    "norm": lambda x: x.norm(),
}


@pytest.mark.parametrize("name", SCALAR)
def test_zero_dim(name):
    assert_same(SCALAR[name], torch.tensor(1.5))


def test_empty_dim_lists():
    """dim=[] reduces everything, except in all/any where it reduces nothing. (nansum's CPU
    kernel reduces everything but its meta kernel nothing; the engine follows the meta.)"""
    x = torch.randn(3, 4)
    assert_same(lambda t: (t.amax(dim=[]), t.mean(dim=[]), t.var(dim=[], keepdim=True)), x)
    assert_same(lambda t: (torch.count_nonzero(t, dim=()), torch.linalg.vector_norm(t, dim=())), x)
    assert_same(lambda t: (torch.all(t, dim=()), torch.any(t, dim=[], keepdim=True)), x)


def test_median_of_empty_is_nan():
    assert_same(lambda t: t.median(), torch.empty(0))


# CPU's errors where the meta kernels wrap the dim (sort), return zeros (median over an
# empty dim) or word the error otherwise (kthvalue, mode, topk)
SELECTION_ERRORS = {
    "sort_dim": lambda d: torch.sort(torch.zeros(2, 3, device=d), dim=3),
    "argsort_dim": lambda d: torch.argsort(torch.zeros(2, 3, device=d), dim=-5),
    "sort_stable_0d": lambda d: torch.sort(torch.tensor(3.0, device=d), dim=1, stable=True),
    "median_empty_dim": lambda d: torch.median(torch.empty(3, 0, device=d), 1),
    "nanmedian_empty_dim": lambda d: torch.nanmedian(torch.empty(3, 0, device=d), -1),
    "kthvalue_empty_dim": lambda d: torch.kthvalue(torch.empty(3, 0, device=d), 1, 1),
    "mode_empty_dim": lambda d: torch.mode(torch.empty(3, 0, device=d), 1),
    "max_dim_out_of_range": lambda d: torch.max(torch.empty(3, 0, device=d), 4),
    "topk_k_out_of_range": lambda d: torch.topk(torch.zeros(3, device=d), 4),
}


@pytest.mark.parametrize("name", SELECTION_ERRORS)
def test_selection_errors_are_cpus(eager_mode, name):
    assert_same_error(SELECTION_ERRORS[name])


# --------------------------------------------------------- out= and in-place


@pytest.mark.parametrize("fn", [torch.var, torch.std])
def test_moments_of_a_zero_dim_tensor_over_dim_zero(fn):
    """A 0-d tensor reduces over dim 0 as over one element: CPU gives NaN (with its
    degrees-of-freedom warning); tpu's check indexed the empty shape (IndexError)."""
    x = torch.tensor(2.5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for kwargs in ({"dim": 0}, {"dim": -1, "keepdim": True}, {"dim": 0, "correction": 0}):
            assert_same(lambda t, k=kwargs: fn(t, **k), x)


def test_out_and_inplace_variants():
    x = torch.randn(3, 5)

    def fn(t):
        total = torch.empty(0, device=t.device)
        torch.sum(t, 1, out=total)
        values = torch.empty(0, device=t.device)
        indices = torch.empty(0, dtype=torch.long, device=t.device)
        torch.max(t, 1, out=(values, indices))
        sorted_values = torch.empty(0, device=t.device)
        sorted_indices = torch.empty(0, dtype=torch.long, device=t.device)
        torch.sort(t, 0, out=(sorted_values, sorted_indices))
        scanned = t.clone().cumsum_(1)
        return total, values, indices, sorted_values, sorted_indices, scanned

    assert_same(fn, x)


_NO_DEGREES_OF_FREEDOM = {
    "var": lambda t: torch.var(t, dim=-1, correction=20),
    "std": lambda t: torch.std(t, dim=-1, correction=21),
    "var_mean": lambda t: torch.var_mean(t, dim=-1, correction=25),
    "std_mean": lambda t: torch.std_mean(t, correction=200),
    "one element": lambda t: torch.var(t[:, :1], dim=-1),
    "enough": lambda t: torch.var(t, dim=(0, 1), correction=199),
}


@pytest.mark.parametrize("case", sorted(_NO_DEGREES_OF_FREEDOM))
def test_no_degrees_of_freedom_warns_at_every_call_as_cpu(eager_mode, case):
    """CPU's kernel warns (and gives inf/nan); tpu was silent for real dtypes."""
    x = torch.randn(10, 20)
    fn = _NO_DEGREES_OF_FREEDOM[case]
    caught = {}
    for device in ("cpu", "tpu", "tpu"):  # (the repeat call too: CPU warns every time)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            fn(x.to(device))
        words = [str(w.message).partition(" (Triggered")[0] for w in seen]
        caught.setdefault(device, []).append([w for w in words if "freedom" in w])
    assert caught["tpu"] == caught["cpu"] * 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_same(fn, x)  # (inf and nan where CPU gives them)


@pytest.mark.parametrize(
    "reduce",
    [
        lambda t: t.sum((0, 0)),
        lambda t: t.mean((1, -2)),
        lambda t: t.var((2, 2)),
        lambda t: torch.logsumexp(t, (0, 0)),
        lambda t: torch.linalg.vector_norm(t, dim=(0, 0)),
        lambda t: t.amax((0, 1, 0)),
    ],
    ids=["sum", "mean", "var", "logsumexp", "vector_norm", "amax"],
)
def test_a_dim_named_twice_is_refused_in_cpus_words(eager_mode, reduce):
    """(PyTorch's Python meta functions say "duplicate value in the list of dims")"""
    assert_same_error(lambda d: reduce(torch.randn(3, 4, 5, device=d)))


@pytest.mark.parametrize("op", [torch.argmax, torch.argmin, torch.amax, torch.sum])
def test_more_than_64_dims_are_refused_as_cpu(op):
    assert_same_error(lambda d: op(torch.ones([1] * 65, device=d), 0))


_REDUCTIONS_INTO_OUT = {
    "sum": lambda t, out: torch.sum(t, 0, out=out),
    "nansum": lambda t, out: torch.nansum(t, 0, out=out),
    "mean": lambda t, out: torch.mean(t, 0, out=out),
    "prod": lambda t, out: torch.prod(t, 0, out=out),
    "cumsum": lambda t, out: torch.cumsum(t, 0, out=out),
    "cumprod": lambda t, out: torch.cumprod(t, 0, out=out),
}
_INTO_OUT_DTYPES = [
    (torch.float32, torch.float64),
    (torch.float16, torch.float32),
    (torch.bfloat16, torch.float64),
    (torch.float32, torch.int64),
    (torch.int64, torch.float32),
    (torch.complex64, torch.complex128),
    (torch.float64, torch.float32),
]


@pytest.mark.parametrize("case", sorted(_REDUCTIONS_INTO_OUT))
@pytest.mark.parametrize("src,dst", _INTO_OUT_DTYPES, ids=str)
def test_reductions_compute_in_the_dtype_of_their_out(case, src, dst):
    """CPU's sum/mean/prod/cumsum/cumprod into an out= of another dtype compute in out's
    dtype (a float32 sum into float64 accumulates in float64); tpu computed in the
    input's and cast: a silently different value. What CPU refuses, tpu refuses."""
    x = (torch.randn(40, 3) * 3).to(src)
    fn = _REDUCTIONS_INTO_OUT[case]
    results = []
    for d in ("cpu", "tpu"):
        try:
            results.append(fn(x.to(d), torch.empty(0, dtype=dst, device=d)).cpu())
        except (RuntimeError, NotImplementedError) as error:
            results.append(type(error))
    expected, got = results
    if isinstance(expected, type):
        assert got is expected
        return
    assert got.dtype == expected.dtype and got.shape == expected.shape
    if dst.is_floating_point or dst.is_complex:  # (summation order: XLA's, not CPU's)
        tolerance = 64 * torch.finfo(dst).eps * expected.abs().max().item()
        assert (got - expected).abs().max().item() <= tolerance
    else:
        assert torch.equal(got, expected)


# ---------------------------------------------------------------- backward

GRADS = {
    "sum": lambda x: x.sum((0, 2)),
    "mean": lambda x: x.mean(1),
    "var": lambda x: x.var(1),
    "std": lambda x: x.std(),
    "prod": lambda x: x.prod(1),
    "logsumexp": lambda x: x.logsumexp(2),
    "cumsum": lambda x: x.cumsum(1),
    "cumprod": lambda x: x.cumprod(-1),
    "logcumsumexp": lambda x: x.logcumsumexp(0),
    "cummax": lambda x: x.cummax(1)[0],
    "amax": lambda x: x.amax(1),
    "max": lambda x: x.max(),
    "max_dim": lambda x: x.max(2)[0],
    "sort": lambda x: x.sort(1)[0] * torch.arange(4.0, device=x.device)[:, None],
    "topk": lambda x: x.topk(2)[0],
    "median_dim": lambda x: x.median(1)[0],
    "norm": lambda x: x.norm(dim=1),
    "vector_norm_3": lambda x: torch.linalg.vector_norm(x, 3),
    "vector_norm_inf": lambda x: torch.linalg.vector_norm(x, INF, dim=0),
    "nansum": lambda x: x.nansum(1),
}


@pytest.mark.parametrize("name", GRADS)
def test_grad(name, distinct):
    assert_same_grad(GRADS[name], distinct, atol=1e-4, rtol=1e-4)


def test_foreach_norm_and_clip_grad_norm():
    tensors = [torch.randn(3, 4), torch.randn(5), torch.randn(2, 2, 2)]
    assert_same(lambda *ts: torch._foreach_norm(list(ts)), *tensors)
    assert_same(lambda *ts: torch._foreach_norm(list(ts), INF), *tensors)

    def clip(*grads):
        params = [torch.zeros_like(g, requires_grad=True) for g in grads]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        total = torch.nn.utils.clip_grad_norm_(params, 1.0)
        return total, *(p.grad for p in params)

    assert_same(clip, *tensors)


@pytest.mark.parametrize(
    "op",
    [
        lambda d: torch.histc(torch.tensor([0.5, 1.5, 2.5, 2.7], device=d), bins=3, min=0, max=3),
        lambda d: torch.median(torch.tensor([[3.0, 1.0, 2.0], [0.0, 5.0, 4.0]], device=d), 1),
    ],
    ids=["histc", "median_dim"],
)
def test_deterministic_mode_computes_what_cpu_computes(eager_mode, op):
    """PyTorch's meta kernels of histc and median(dim) raise deterministic mode's alert for
    CUDA's kernels on every device but CPU: tpu raised where CPU computes."""
    from torch.testing._internal.common_utils import DeterministicGuard

    from torch_tpu import cache

    with DeterministicGuard(True):
        expected = op("cpu")
    for warn_only in (False, True):
        cache.forget_lookups()  # (a meta kernel runs at its key's first call)
        with DeterministicGuard(True, warn_only=warn_only), warnings.catch_warnings():
            warnings.simplefilter("error")  # (an alert made a warning fails too)
            actual = op("tpu")
            # (the meta kernel ran with the mode off: it is back as it was)
            assert torch.are_deterministic_algorithms_enabled()
            assert torch.is_deterministic_algorithms_warn_only_enabled() is warn_only
        torch.testing.assert_close(to_cpu(actual), expected)


def test_histc_refuses_min_above_max_on_every_call(eager_mode):
    """The bounds are not part of the cache key: a valid call first must not let a later
    invalid one through (it returned all-zero bins)."""
    x = torch.tensor([1.0, 2.0, 3.0])
    assert_same_outcome(lambda d: torch.histc(x.to(d), bins=4, min=0, max=3))
    assert_same_outcome(lambda d: torch.histc(x.to(d), bins=4, min=5, max=1))


@pytest.mark.parametrize(
    "call",
    [
        lambda d: torch.bincount(torch.tensor([[1, 2]], device=d)),
        lambda d: torch.bincount(torch.tensor([1, 3], device=d), minlength=-1),
        lambda d: torch.bincount(torch.tensor([1.0, 2.0], device=d)),
        lambda d: torch.bincount(torch.tensor([1, 2], device=d), torch.ones(3, device=d)),
        lambda d: torch.bincount(torch.tensor([1, 3], device=d), minlength=6),
    ],
)
def test_bincount_refuses_what_cpu_refuses(call):
    assert_same_outcome(call)


@pytest.mark.parametrize(
    "call",
    [
        lambda x: x.amax(dim=1),
        lambda x: x.amin(dim=(0, 1)),
        lambda x: x.amax(),
        lambda x: x.amax(dim=0),
        lambda x: x.argmax(),
        lambda x: x.argmin(),
        lambda x: x.argmin(dim=1),
        lambda x: x.argmax(dim=0),
        lambda x: x.bool().argmax(dim=0),
    ],
)
def test_extremes_of_an_empty_tensor_raise_cpus_error_type(call, eager_mode):
    assert_same_outcome(lambda d: call(torch.zeros(2, 0, 4, device=d)))


@pytest.mark.parametrize("reduce", [torch.nansum, torch.nanmean])
def test_nansum_over_no_dims_is_refused_not_answered_unreduced(reduce, eager_mode):
    """CPU reduces every dim for dim=[]; PyTorch's meta kernel (tpu's result shapes) none:
    tpu returned the input itself (nanmean: divided by the count). A clear error now;
    dim=None and explicit dims give CPU's results."""
    x = torch.tensor([[1.0, float("nan"), 2.0], [3.0, 4.0, float("nan")]])
    with pytest.raises(RuntimeError, match=r"dim=\[\].*dim=None"):
        reduce(x.to("tpu"), dim=[]).cpu()
    for dim in (None, (0, 1), 1):
        torch.testing.assert_close(reduce(x.to("tpu"), dim=dim).cpu(), reduce(x, dim=dim))
    torch.testing.assert_close(reduce(x[0, 0].to("tpu"), dim=[]).cpu(), reduce(x[0, 0], dim=[]))


def test_vector_norm_of_a_complex_order_raises_as_on_cpu():
    """PyTorch's meta kernel raised a TypeError ('<' not supported between complex and
    float) where CPU raises its RuntimeError (found by PyTorch's test_linalg on tpu)."""
    assert_same_error(
        lambda device: torch.linalg.vector_norm(torch.ones(3, device=device), ord=1j)
    )


@pytest.mark.parametrize("fn", [torch.quantile, torch.nanquantile])
@pytest.mark.parametrize("q", [1.5, -0.1, [0.2, math.nan], [-0.0, 1.0], [0.3, 0.7]])
def test_quantile_checks_a_tpu_q_as_cpu_checks_its_own(fn, q):
    """CPU refuses q outside [0, 1] (NaN too) with a host read of q; the decomposition
    checks only a CPU q, so a tpu q of -0.1 computed a quantile without an error (and 1.5
    failed as an out-of-range gather at the next read). Now each raises CPU's error at
    the call; in-range q, out= and gradients are CPU's."""
    x = torch.randn(10, generator=torch.Generator().manual_seed(0))
    q = torch.tensor(q)
    try:
        expected = fn(x, q)
    except RuntimeError as error:
        with pytest.raises(RuntimeError, match=re.escape(str(error))):
            fn(x.to("tpu"), q.to("tpu"))
        with torch.inference_mode(), pytest.raises(RuntimeError, match=re.escape(str(error))):
            fn(x.to("tpu"), q.to("tpu"))
        return
    torch.testing.assert_close(fn(x.to("tpu"), q.to("tpu")).cpu(), expected)
    out = torch.empty(0, device="tpu")
    fn(x.to("tpu"), q.to("tpu"), out=out)
    torch.testing.assert_close(out.cpu(), expected)
    leaves = [x.clone().requires_grad_(), x.to("tpu").requires_grad_()]
    for leaf in leaves:
        fn(leaf, q.to(leaf.device)).sum().backward()
    torch.testing.assert_close(leaves[1].grad.cpu(), leaves[0].grad)


def test_quantile_of_an_integer_input_keeps_cpu_s_first_error():
    """The q check runs after CPU's dtype checks, so their error comes first, as on CPU."""
    with pytest.raises(RuntimeError, match="must be either float or double dtype"):
        torch.quantile(torch.arange(5, device="tpu"), torch.tensor(2.0, device="tpu"))
