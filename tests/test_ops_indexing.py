"""Indexing family on tpu agrees with the CPU: advanced indexing, gather/scatter,
masks, unique, searching and binning, forward and backward, without CPU fallback."""

import warnings

import pytest
import torch
from conftest import (
    assert_same,
    assert_same_error,
    assert_same_grad,
    lowered_packets,
    no_fallback,
    packet,
)

_OURS = lowered_packets("indexing")


@pytest.fixture(autouse=True)
def _no_fallback_of_ours():
    with no_fallback("indexing", lambda op: packet(op) in _OURS):
        yield


def _x(dtype=torch.float32, shape=(4, 5)):
    x = torch.randn(shape) * 4
    return x.round().to(dtype) if dtype in (torch.int64, torch.bool) else x.to(dtype)


DTYPES = [torch.float32, torch.int64, torch.bool, torch.bfloat16]
INDEXED_DTYPES = [torch.float32, torch.bool, torch.bfloat16]  # int64 moves like float32
IDX = torch.tensor([0, 2, -1, 2])


def _strided(x):
    """The same values, non-contiguous: as a strided slice of a wider tensor."""
    wide = torch.zeros(x.shape[0], 2 * x.shape[1], dtype=x.dtype)
    wide[:, ::2] = x
    return wide[:, ::2]


def _transposed(x):
    return x.t().contiguous().t()


# --------------------------------------------------------------------- index


@pytest.mark.parametrize("dtype", INDEXED_DTYPES)
@pytest.mark.parametrize(
    "key",
    [
        lambda i, m: (i,),
        lambda i, m: (slice(None), i[:3].abs()),
        lambda i, m: (None, i, slice(1, 3)),
        lambda i, m: (i[:, None], i[None, :3].abs()),
        lambda i, m: (i[:2], Ellipsis, i[:2].abs()),
        lambda i, m: (m,),
        lambda i, m: (m[:, 0],),
        lambda i, m: (m[:, 0], 1),
        lambda i, m: (slice(None), m[0]),
    ],
)
def test_index(dtype, key):
    assert_same(lambda t, i, m: t[key(i, m)], _x(dtype), IDX, _x() > 0)


@pytest.mark.parametrize("layout", [_strided, _transposed])
def test_noncontiguous(layout):
    x, mask = layout(_x()), _x() > 0
    index = torch.tensor([2, 0, 3])
    assert_same(lambda t, i, m: (t[i], t[:, i], t[m], t[m[:, 0], 1]), x, IDX, mask)
    assert_same(lambda t, m: _setitem(t, m, 0), x, mask)
    gather_scatter = lambda t, i: (t.gather(1, i), t.scatter(1, i, 1.0), t.scatter_add(1, i, t))  # noqa: E731
    assert_same(gather_scatter, x, GIDX)
    assert_same(lambda t, i: (t.index_select(-1, i), t.index_fill(0, i, 1), t.take(i)), x, index)
    assert_same(lambda t, i: (t.index_add(0, i, t[:3]), t.index_copy(0, i, t[1:])), x, index)
    assert_same(lambda t, m: (t.masked_fill(m, 1), t.masked_scatter(m, t)), x, mask)
    assert_same(lambda t, m: t.masked_select(m), x, mask)
    assert_same(lambda t: (t.nonzero(), torch.unique(t, dim=0), torch.unique_consecutive(t)), x)


@pytest.mark.parametrize(
    "key",
    [lambda i, m: (i,), lambda i, m: (slice(None), i.abs()), lambda i, m: (m,)],
)
def test_index_grad(key):
    mask = _x() > 0
    assert_same_grad(lambda t, i, m: t[key(i, m)], _x(), IDX, mask)


# ----------------------------------------------------------------- index_put


def _setitem(x, key, value):
    x = x.clone()
    x[key] = value
    return x


@pytest.mark.parametrize("dtype", INDEXED_DTYPES)
@pytest.mark.parametrize(
    "case",
    [
        lambda x, i, m: ((i,), 1),
        lambda x, i, m: ((slice(None), i[:3].abs()), x[:, :3]),
        lambda x, i, m: ((m,), 0),
        lambda x, i, m: ((m,), x[m.cpu()].flip(0) if x.device.type == "cpu" else None),
        lambda x, i, m: ((m[:, 0],), x[: int(m[:, 0].sum())]),
        lambda x, i, m: ((slice(None), m[0]), x[:, : int(m[0].sum())]),
        lambda x, i, m: ((m[:, 0], i[:1].abs()), x[0, 0]),
    ],
)
def test_setitem(dtype, case):
    x = _x(dtype)
    mask = _x() > 0

    def fn(t, i, m):
        key, value = case(t, i, m)
        if value is None:  # the value depends on the mask: build it on CPU, move it over
            _, value = case(t.cpu(), i.cpu(), m.cpu())
            value = value.to(t.device)
        return _setitem(t, key, value)

    assert_same(fn, x, IDX, mask)


@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put(accumulate):
    rows = torch.tensor([0, 3, -1, 0])
    values = torch.randn(4, 5)
    fn = lambda x, r, v: x.index_put((r,), v, accumulate=accumulate)  # noqa: E731
    assert_same(fn, _x(), rows if accumulate else rows[:3], values if accumulate else values[:3])
    mask = _x() > 0
    two = torch.tensor(2.0)
    assert_same(lambda x, m, v: x.index_put((m,), v, True), _x(), mask, two)
    assert_same_grad(lambda x, v: x.index_put((rows[:3].to(x.device),), v), _x(), values[:3])


def test_index_put_mask_with_index():
    """A mask's positions pair with, or broadcast against, other index arrays."""
    rows = torch.tensor([True, False, True, False])
    one_row = torch.tensor([False, False, True, False])
    cols = torch.tensor([1, 4])

    values = torch.tensor([5.0, 6.0])
    put = torch.ops.aten.index_put
    for acc in (False, True):
        assert_same(lambda x, r, c, v, a: put(x, [r, c], v, a), _x(), rows, cols, values, acc)
        assert_same(lambda x, r, c, v, a: put(x, [r, c], v, a), _x(), one_row, cols, values, acc)
    both = torch.tensor([True, True])
    assert_same(lambda x, m, c: put(x.view(2, 2, 5), [m, None, c], x[:2, :2]), _x(), both, cols)


def test_index_put_impl():
    def fn(x, i, v):
        x = x.clone()
        return torch.ops.aten._index_put_impl_(x, [i], v, True, True)

    assert_same(fn, _x(), IDX, torch.randn(4, 5))


# ----------------------------------------------------------- gather / scatter

GIDX = torch.tensor([[0, 1], [1, 2], [3, 3], [4, 0]])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [1, -1])
def test_gather_scatter(dtype, dim):
    x = _x(dtype)
    src = _x(dtype, (4, 3))
    assert_same(lambda t, i: t.gather(dim, i), x, GIDX)
    assert_same(lambda t, i, s: t.scatter(dim, i, s), x, GIDX, src)
    assert_same(lambda t, i: t.scatter(dim, i, 1), x, GIDX)
    assert_same(lambda t, i: t.gather(0, i), x, GIDX.t()[:, :3] % 4)


@pytest.mark.filterwarnings("ignore:The reduce argument of torch.scatter")
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16])
def test_scatter_add_and_legacy_reduce(dtype):
    x, src = _x(dtype), _x(dtype, (4, 3))
    assert_same(lambda t, i, s: t.scatter_add(1, i, s), x, GIDX, src)
    assert_same(lambda t, i, s: t.scatter(1, i, s, reduce="add"), x, GIDX, src)
    assert_same(lambda t, i, s: t.scatter(1, i, s, reduce="multiply"), x, GIDX, src)
    assert_same(lambda t, i: t.scatter(1, i, 2, reduce="multiply"), x, GIDX)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(dtype, reduce, include_self):
    x, src = _x(dtype), _x(dtype, (4, 3))
    fn = lambda t, i, s: t.scatter_reduce(1, i, s, reduce, include_self=include_self)  # noqa: E731
    assert_same(fn, x, GIDX, src)


@pytest.mark.parametrize("reduce", ["max", "min"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_takes_max_and_min(eager_mode, reduce, include_self):
    """CPU takes "max" and "min" for amax and amin; PyTorch's meta kernel refused them."""
    x, src = _x(), _x(shape=(4, 3))

    def fn(t, i, s):
        inplace = t.clone().scatter_reduce_(1, i, s, reduce, include_self=include_self)
        out = torch.empty(0, device=t.device)
        torch.scatter_reduce(t, 1, i, s, reduce, include_self=include_self, out=out)
        return t.scatter_reduce(1, i, s, reduce, include_self=include_self), inplace, out

    assert_same(fn, x, GIDX, src)
    with pytest.raises(RuntimeError, match="amax or amin, got maximum"):
        x.to("tpu").scatter_reduce(1, GIDX.to("tpu"), src.to("tpu"), "maximum")


def test_gather_scatter_grad():
    src = torch.randn(4, 2)
    assert_same_grad(lambda t: t.gather(1, GIDX.to(t.device)), _x())
    assert_same_grad(lambda t, s: t.scatter(1, GIDX.to(t.device), s), _x(), src)
    assert_same_grad(lambda t, s: t.scatter_add(1, GIDX.to(t.device), s), _x(), src)
    fn = lambda t, s: t.scatter_reduce(1, GIDX.to(t.device), s, "amax")  # noqa: E731
    assert_same_grad(fn, _x(), src)


def test_scalar_and_empty_gather_scatter():
    x, i = torch.tensor(3.0), torch.tensor(0)
    assert_same(lambda t, j: t.gather(0, j), x, i)
    assert_same(lambda t, j: t.scatter(0, j, 5.0), x, i)
    empty = torch.zeros(2, 0, dtype=torch.int64)
    assert_same(lambda t, j: (t.gather(0, j), t.scatter_add(0, j, t[None])), _x()[0], empty)


@pytest.mark.filterwarnings("ignore:index_reduce")
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
def test_index_reduce(dtype, reduce):
    index = torch.tensor([0, 2, 0])
    fn = lambda t, i, s, inc: t.index_reduce(-1, i, s, reduce, include_self=inc)  # noqa: E731
    for include_self in (True, False):
        assert_same(fn, _x(dtype), index, _x(dtype, (4, 3)), include_self)


# ------------------------------------------------------------- index_* ops


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [0, -1])
def test_index_ops(dtype, dim):
    x = _x(dtype)
    index = torch.tensor([2, 0, 3])
    source = _x(dtype, (3, 5) if dim == 0 else (4, 3))
    assert_same(lambda t, i: t.index_select(dim, i), x, index)
    assert_same(lambda t, i, s: t.index_copy(dim, i, s), x, index, source)
    assert_same(lambda t, i: t.index_fill(dim, i, 1), x, index)
    if dtype != torch.bool:
        assert_same(lambda t, i, s: t.index_add(dim, i, s, alpha=2), x, index, source)
    value = torch.tensor(1, dtype=dtype)
    assert_same(lambda t, i, v: t.index_fill(dim, -i - 1, v), x, index, value)


def test_index_ops_grad():
    index = torch.tensor([2, 0, 2])
    assert_same_grad(lambda t: t.index_select(1, index.to(t.device)), _x())
    assert_same_grad(lambda t, s: t.index_add(0, index.to(t.device), s), _x(), torch.randn(3, 5))
    copy_index = torch.tensor([2, 0, 3])
    fn = lambda t, s: t.index_copy(0, copy_index.to(t.device), s)  # noqa: E731
    assert_same_grad(fn, _x(), torch.randn(3, 5))
    assert_same_grad(lambda t: t.index_fill(1, index.to(t.device), 2.0), _x())


# -------------------------------------------------------------------- masks


@pytest.mark.parametrize("dtype", DTYPES)
def test_masks(dtype):
    x = _x(dtype)
    mask = _x() > 0
    assert_same(lambda t, m: t.masked_fill(m, 1), x, mask)
    assert_same(lambda t, m: t.masked_fill(m[0], torch.tensor(0, device=t.device)), x, mask)
    assert_same(lambda t, m: t.masked_scatter(m, t.flip(0)), x, mask)
    assert_same(lambda t, m: t.masked_select(m), x, mask)
    assert_same(lambda t, m: t.masked_select(m[1]), x, mask)
    assert_same(lambda t: t.nonzero(), x)
    assert_same(lambda t: torch.where(t), x)
    assert_same(lambda t: torch.nonzero_static(t, size=30), x)


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.int64, torch.int8, torch.bool, torch.float16]
)
@pytest.mark.parametrize(
    "value",
    [torch.tensor(-2), torch.tensor(3.7), torch.tensor(-2.7), torch.tensor(True),
     torch.tensor([5.5]), torch.tensor(300), torch.tensor(1 + 2j)],
    ids=lambda v: f"{v.dtype}{list(v.shape)}",
)  # fmt: skip
def test_one_host_value_through_a_lone_mask_as_cpu(dtype, value):
    """`x[x > 0] = torch.tensor(-2)`: CPU writes a value on the host through a lone bool
    mask with masked_fill_, so any dtype that converts is accepted (tpu refused all but
    x's own); a value that cannot convert raises CPU's error. With a mask of x's shape
    the write is a select (`_fills_through_a_mask`)."""

    def write(device, where):
        x = (torch.arange(6.0).reshape(2, 3) - 2).to(dtype).to(device)
        mask = torch.tensor([True, False, True], device=device)
        if where == "lone":
            x[x != 0] = value
        else:
            x[:, mask] = value
        return x

    for where in ("lone", "after a colon"):
        try:
            expected = write("cpu", where)
        except RuntimeError:
            assert_same_error(lambda device, where=where: write(device, where))
            continue
        assert torch.equal(write("tpu", where).cpu(), expected), where


def test_masks_grad():
    mask = _x() > 0
    assert_same_grad(lambda t, m: t.masked_fill(m, 2.0), _x(), mask)
    assert_same_grad(lambda t, s, m: t.masked_scatter(m, s), _x(), torch.randn(30), mask)
    assert_same_grad(lambda t, m: t.masked_select(m), _x(), mask)


def test_nonzero_scalar_and_empty():
    assert_same(lambda t: t.nonzero(), torch.tensor(2.0))
    assert_same(lambda t: t.nonzero(), torch.zeros(3, 0))


def test_searchsorted_warns_of_non_contiguous_inputs_as_cpu():
    """CPU's kernel warns (once per process; always under set_warn_always); the check
    that runs it for tpu gave it contiguous stand-ins."""
    b = torch.tensor([[[1, 3, 5], [2, 4, 6]], [[1, 2, 3], [4, 5, 6]]]).permute(2, 1, 0)
    caught = []
    torch.set_warn_always(True)
    try:
        for device in ("cpu", "tpu"):
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                torch.searchsorted(b.double().to(device), b.int().to(device))
            words = [str(w.message)[:60] for w in seen]
            caught.append(sorted(w for w in words if "contiguous" in w))
    finally:
        torch.set_warn_always(False)
    assert caught[0] == caught[1] and len(caught[0]) == 2
    assert_same(lambda s, v: torch.searchsorted(s, v), b.double(), b.int())


_SELECTIONS = {
    "rows": lambda t: t[t[:, 0, 0] > 0],
    "2-d mask": lambda t: t[t[:, :, 0] > 0],
    "full mask": lambda t: t[t > 0],
    "none": lambda t: t[t > 100],
    "all": lambda t: t[t > -100],
    "inner mask": lambda t: t[:, t[0, :, 0] > 0],
    "mask and int": lambda t: t[t[:, 0, 0] > 0, 1],
    "0-d": lambda t: t[0, 0, 0][t[0, 0, 0] > 0],
    "no rows": lambda t: t[:0][t[:0, 0, 0] > 0],
    "masked_select": lambda t: torch.masked_select(t, t > 0),
    "masked_select broadcast": lambda t: torch.masked_select(t, t[0] > 0),
    "nonzero": lambda t: (t > 0).nonzero(),
    "nonzero none": lambda t: (t > 100).nonzero(),
    "nonzero 0-d": lambda t: (t[0, 0, 0] > -100).nonzero(),
}


@pytest.mark.parametrize("case", sorted(_SELECTIONS))
def test_selections_by_mask_as_cpu(eager_mode, case):
    """Their results are views of bucket-sized arrays (registry.result_prefix): the
    values, shapes, dtypes and contiguity must be CPU's."""
    x = torch.randn(6, 5, 3)
    expected, got = _SELECTIONS[case](x), _SELECTIONS[case](x.to("tpu"))
    assert got.shape == expected.shape and got.dtype == expected.dtype
    assert got.is_contiguous() == expected.is_contiguous() or case.startswith("nonzero")
    assert torch.equal(got.cpu(), expected)
    assert torch.equal((got * 2).cpu(), expected * 2)  # (read through the view)


def test_new_true_counts_in_one_bucket_compile_no_selection_program():
    """A mask's True count sets the result's length; within a power-of-two bucket a new
    count compiles none of the programs that select (each compiled per count before: a
    loop over masks of changing counts spent ~1.5 s a step compiling)."""
    from torch_tpu.ops import indexing

    x = torch.randn(512, 3, device="tpu")
    programs = (indexing._argwhere, indexing._gather_indexed, indexing._masked_select)
    first = torch.arange(512, device="tpu") < 65  # (a first count: the bucket's programs)
    x[first], first.nonzero(), torch.masked_select(x[:, 0], first)
    before = [fn._cache_size() for fn in programs]
    for count in (70, 80, 99, 101, 127, 128):  # all in (64, 128]
        mask = torch.arange(512, device="tpu") < count
        assert x[mask].shape == (count, 3)
        assert torch.equal(mask.nonzero().flatten().cpu(), torch.arange(count))
        assert torch.equal(torch.masked_select(x[:, 0], mask).cpu(), x[:count, 0].cpu())
    assert [fn._cache_size() for fn in programs] == before


# ---------------------------------------------------------------- take/put


@pytest.mark.parametrize("dtype", DTYPES)
def test_take_put(dtype):
    x = _x(dtype)
    index = torch.tensor([[0, -1], [7, 3]])
    source = _x(dtype, (2, 2))
    assert_same(lambda t, i: t.take(i), x, index)
    assert_same(lambda t, i, s: t.clone().put_(i, s), x, index, source)
    if dtype != torch.bool:
        assert_same(lambda t, i, s: t.put(i, s, accumulate=True), x, index, source)
    assert_same_grad(lambda t: t.take(index.to(t.device)), _x())


# ------------------------------------------------------------------ unique


@pytest.mark.parametrize("dtype", DTYPES)
def test_unique(dtype):
    x = _x(dtype)
    assert_same(lambda t: torch.unique(t, return_inverse=True, return_counts=True), x)
    assert_same(lambda t: torch.unique(t, dim=-1, return_inverse=True), x)
    assert_same(lambda t: torch.unique_consecutive(t, return_counts=True, dim=0), x)
    if dtype == torch.int64:
        assert_same(lambda t: torch.unique(t), x)
        fn = lambda t: torch.unique_consecutive(t, return_inverse=True, return_counts=True)  # noqa: E731
        assert_same(fn, x)
    assert_same(lambda t: torch.ops.aten._unique(t, True, True), x)


def _signs(result):
    return [torch.signbit(t.cpu()) for t in result if t.is_floating_point()]


@pytest.mark.parametrize("first", [-0.0, 0.0])
def test_unique_keeps_the_first_of_equal_values(first):
    """-0.0 == 0.0: CPU keeps the first value of each group of equal ones (every value
    was scattered to its group's slot, so XLA kept the last)."""
    x = torch.tensor([1.0, first, -first, 2.0])
    fns = [
        lambda t: torch.unique(t, return_inverse=True, return_counts=True),
        lambda t: torch.unique_consecutive(t, return_inverse=True, return_counts=True),
        lambda t: torch.unique(t, dim=0, return_inverse=True, return_counts=True),
        lambda t: torch.unique(t.reshape(1, 4), dim=1),
        lambda t: torch.unique_consecutive(t.reshape(4, 1), dim=0, return_counts=True),
    ]
    for fn in fns:
        actual = assert_same(fn, x)
        expected = fn(x)
        expected = expected if isinstance(expected, tuple) else (expected,)
        actual = actual if isinstance(actual, tuple) else (actual,)
        assert [s.tolist() for s in _signs(actual)] == [s.tolist() for s in _signs(expected)]


UNIQUE_ERRORS = {
    "dim_out_of_range": lambda d: torch.unique(torch.zeros(2, 3, device=d), dim=2),
    "consecutive_dim_out_of_range": lambda d: torch.unique_consecutive(
        torch.zeros(2, 3, device=d), dim=-5
    ),
    "0d_has_no_dims": lambda d: torch.unique(torch.tensor(3.0, device=d), dim=0),
    "consecutive_0d_has_no_dims": lambda d: torch.unique_consecutive(
        torch.tensor(3.0, device=d), dim=-1
    ),
    "empty_dim_not_selected": lambda d: torch.unique(torch.empty(2, 0, device=d), dim=0),
    "two_empty_dims": lambda d: torch.unique_consecutive(torch.empty(0, 0, device=d), dim=1),
}


@pytest.mark.parametrize("name", UNIQUE_ERRORS)
def test_unique_dim_errors_are_cpus(name):
    """unique_dim and unique_consecutive have no meta kernel: a dim out of range was
    wrapped (or failed inside the lowering), and empty dims gave a result."""
    assert_same_error(UNIQUE_ERRORS[name])


# --------------------------------------------------------------- searching


@pytest.mark.filterwarnings("ignore:torch.searchsorted")
@pytest.mark.parametrize("right", [False, True])
def test_searchsorted_bucketize(right):
    seq = torch.tensor([-2.0, 0.0, 0.0, 1.5, 3.0])
    x = _x()
    assert_same(lambda s, t: torch.searchsorted(s, t, right=right), seq, x)
    assert_same(lambda s, t: torch.searchsorted(s, t, out_int32=True, right=right), seq, x)
    assert_same(lambda s: torch.searchsorted(s, 0.0, right=right), seq)
    assert_same(lambda t, s: torch.bucketize(t, s, right=right), x, seq)
    assert_same(lambda s: torch.bucketize(0.0, s, right=right), seq)
    sorted_rows = x.sort(-1).values
    assert_same(lambda s, t: torch.searchsorted(s, t, right=right), sorted_rows, x[:, :2])
    shuffled = torch.tensor([3.0, 0.0, -2.0, 1.5])
    sorter = shuffled.argsort()
    side = "right" if right else "left"
    assert_same(lambda s, t, o: torch.searchsorted(s, t, side=side, sorter=o), shuffled, x, sorter)
    assert_same(lambda s, t: torch.bucketize(t, s), torch.tensor([-1, 0, 2]), x)


@pytest.mark.filterwarnings("ignore:torch.searchsorted")
@pytest.mark.parametrize("right", [False, True])
def test_searchsorted_bucketize_with_nan_in_sequence(right):
    """CPU's binary search compares plainly, so a NaN in the sequence reads as below every
    value (jnp.searchsorted ordered NaN last: [4, 5, 2, 4, 1] for CPU's [6, 6, 2, 6, 1])."""
    nan, inf = float("nan"), float("inf")
    seq = torch.tensor([-inf, -1.0, 0.0, 1.0, inf, nan])
    values = torch.tensor([3.0, nan, -0.0, inf, -2.0])
    side = "right" if right else "left"
    assert_same(lambda s, v: torch.searchsorted(s, v, right=right), seq, values)
    assert_same(lambda s, v: torch.searchsorted(s, v, side=side, out_int32=True), seq, values)
    assert_same(lambda s: torch.searchsorted(s, 5.0, right=right), torch.tensor([0.0, 1.0, nan]))
    assert_same(lambda v, s: torch.bucketize(v, s, right=right), values, torch.tensor([0.0, nan]))
    rows = torch.tensor([[nan, 0.0, 1.0, 2.0, 3.0], [0.0, nan, nan, 3.0, inf]])
    row_values = torch.tensor([[0.5, 2.0, nan], [nan, 3.0, -1.0]])
    assert_same(lambda s, v: torch.searchsorted(s, v, right=right), rows, row_values)
    shuffled = torch.tensor([1.0, nan, -1.0, 0.0, nan])
    sorter = torch.tensor([2, 3, 0, 1, 4])
    fn = lambda s, v, o: torch.searchsorted(s, v, side=side, sorter=o)  # noqa: E731
    assert_same(fn, shuffled, values, sorter)
    assert_same(lambda s, v: torch.searchsorted(s, v, right=right), torch.empty(0), values)


def test_bincount_histc():
    values = torch.tensor([0, 3, 3, 1, 7])
    assert_same(lambda v: torch.bincount(v), values)
    assert_same(lambda v: torch.bincount(v, minlength=10), values)
    assert_same(lambda v, w: torch.bincount(v, w), values, torch.randn(5))
    assert_same(lambda v, w: torch.bincount(v, w), values, torch.arange(5))
    assert_same(lambda v: torch.bincount(v), torch.zeros(0, dtype=torch.int64))
    x = _x()
    assert_same(lambda t: torch.histc(t), x)
    assert_same(lambda t: torch.histc(t, 7, -1, 2), x)
    assert_same(lambda t: torch.histc(t, 4), torch.ones(5))
    assert_same(lambda t: torch.histc(t, 6), x.to(torch.float64).t())


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8])
def test_histc_of_integers_bins_as_cuda(dtype):
    """CUDA has an integer histc, CPU refuses one: transformers' mixture-of-experts layers
    count tokens per expert with it on every device but the CPU. Binned as CUDA's kernel
    does, in int64: bounds truncated, (v - min) * bins // (max - min), max in the last bin."""
    ids = torch.tensor([0, 3, 3, 1, 2, 2, 2, 9, 5], dtype=dtype, device="tpu")
    counts = torch.histc(ids, bins=4, min=0, max=3)
    assert counts.dtype == dtype and counts.tolist() == [1, 1, 3, 2]
    assert torch.histc(ids, bins=2, min=0.9, max=3.7).tolist() == [2, 5]  # [0, 3]
    assert torch.histc(ids, bins=3).tolist() == [5, 3, 1]  # the data's [0, 9]
    assert torch.histc(ids[:0], bins=2).tolist() == [0, 0]


# ----------------------------------------------- selection backward (scatter)


def test_value_selecting_backward():
    x = _x()
    assert_same_grad(lambda t: t.sort(1).values, x)
    assert_same_grad(lambda t: t.topk(2, -1).values, x)
    assert_same_grad(lambda t: t.max(0).values, x)


def test_byte_masks_index_as_bool_masks_with_cpus_warning():
    """x[uint8_mask] is deprecated but valid on CPU (a bool mask, with a warning); tpu
    raised "tensors used as indices must be long, int, byte or bool" (PyTorch's meta
    kernel for index.Tensor accepts int8 where it means uint8). Found by PyTorch's
    test_indexing on tpu."""
    x = torch.arange(12.0).reshape(3, 4)
    masks = [torch.tensor([1, 0, 1], dtype=torch.uint8),
             torch.tensor([[1, 0, 0, 1]] * 3, dtype=torch.uint8)]
    for mask in masks:
        expected = x[mask]
        with pytest.warns(UserWarning, match="uint8 is now deprecated"):
            actual = x.to("tpu")[mask.to("tpu")]
        torch.testing.assert_close(actual.cpu(), expected)


@pytest.mark.parametrize(
    "scatter",
    [
        lambda d: torch.zeros(5, device=d).masked_scatter_(
            torch.tensor([1, 0, 1, 1, 0], dtype=torch.bool, device=d), torch.ones(2, device=d)
        ),
        lambda d: torch.zeros(2, 3, device=d).masked_scatter(  # (the mask broadcast: 4 ones)
            torch.tensor([True, False, True], device=d), torch.ones(3, device=d)
        ),
    ],
    ids=["in_place", "broadcast_mask"],
)
def test_masked_scatter_refuses_a_source_shorter_than_the_mask(eager_mode, scatter):
    """The lowering reused the source's last value for the mask's extra ones, where CPU
    raises."""
    assert_same_error(scatter)


def _seq(d):
    return torch.tensor([1, 2, 3], device=d)


@pytest.mark.parametrize(
    "call",
    [
        lambda d: torch.searchsorted(_seq(d), _seq(d), side="bad"),
        lambda d: torch.searchsorted(_seq(d), _seq(d), right=True, side="left"),
        lambda d: torch.searchsorted(_seq(d), 2.5, sorter=torch.tensor([0, 1], device=d)),
        lambda d: torch.searchsorted(_seq(d), 2.5, sorter=torch.tensor([0, 1, 3], device=d)),
        lambda d: torch.searchsorted(_seq(d), 2.5, sorter=torch.tensor([-1, 1, 2], device=d)),
        lambda d: torch.searchsorted(torch.tensor([[1, 2, 3], [4, 5, 6]], device=d), 1),
        lambda d: torch.searchsorted(torch.zeros(2, 3, device=d), torch.zeros(3, 1, device=d)),
        lambda d: torch.bucketize(torch.zeros(2, 2, device=d), torch.zeros(2, 3, device=d)),
        lambda d: torch.searchsorted(_seq(d), 2.5, sorter=torch.tensor([2, 1, 0], device=d)),
        lambda d: torch.bucketize(torch.tensor([0.5, 2.5], device=d), _seq(d).float()),
    ],
)
def test_searchsorted_and_bucketize_refuse_what_cpu_refuses(call, eager_mode):
    expected = _raised_or_value(lambda: call("cpu"))
    actual = _raised_or_value(lambda: call("tpu").cpu())
    if isinstance(expected, Exception):
        assert isinstance(actual, type(expected)), actual
        assert str(expected) in str(actual)
    else:
        assert torch.equal(actual, expected)


def _raised_or_value(fn):
    try:
        return fn()
    except Exception as error:  # the outcome under test
        return error


HALF_SCATTERS = {
    # CPU's scatter kernels take float16/bfloat16 sums and products in float32 and round
    # once (a mean: the rounded sum over the count)
    "scatter_add": lambda b, d, i, i1, s: b.scatter_add(d, i, s),
    "scatter_reduce sum": lambda b, d, i, i1, s: b.scatter_reduce(d, i, s, "sum"),
    "scatter_reduce sum, no self": lambda b, d, i, i1, s: b.scatter_reduce(
        d, i, s, "sum", include_self=False
    ),
    "scatter_reduce mean": lambda b, d, i, i1, s: b.scatter_reduce(d, i, s, "mean"),
    "scatter_reduce prod": lambda b, d, i, i1, s: b.scatter_reduce(d, i, s.abs() + 0.5, "prod"),
    "scatter reduce=add": lambda b, d, i, i1, s: b.scatter(d, i, s, reduce="add"),
    "index_add": lambda b, d, i, i1, s: b.index_add(d, i1, s),
    # its loop rounds after every add: an int32 index, alpha != 1, a 1-D self or a middle dim
    "index_add int32 index": lambda b, d, i, i1, s: b.index_add(d, i1.int(), s),
    "index_add alpha": lambda b, d, i, i1, s: b.index_add(d, i1, s, alpha=2),
    "index_reduce mean": lambda b, d, i, i1, s: b.index_reduce(d, i1, s, "mean"),
    "index_put accumulate": lambda b, d, i, i1, s: b.index_put((i1,), s, accumulate=True),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape,dim", [((5,), 0), ((5, 8), 0), ((8, 5), 1), ((4, 5, 6), 1)])
@pytest.mark.parametrize("case", list(HALF_SCATTERS))
def test_half_precision_scatters_round_as_cpu(case, shape, dim, dtype, eager_mode):
    """300 values into a few positions: tpu rounded after every add where CPU's scatter
    kernels sum in float32 (several units in the last place apart); now bit for bit."""
    if case == "index_put accumulate" and dim != 0:
        pytest.skip("index_put indexes the first dim: covered by dim 0")
    g = torch.Generator().manual_seed(0)
    n = 300
    base = torch.randn(shape, generator=g).to(dtype)
    source_shape = list(shape)
    source_shape[dim] = n
    source = torch.randn(source_shape, generator=g).to(dtype)
    index = torch.randint(0, shape[dim], source_shape, generator=g)
    index1 = torch.randint(0, shape[dim], (n,), generator=g)
    op = HALF_SCATTERS[case]
    expected = op(base, dim, index, index1, source)
    tpu = [t.to("tpu") for t in (base, index, index1, source)]
    actual = op(tpu[0], dim, tpu[1], tpu[2], tpu[3])
    assert torch.equal(actual.cpu(), expected)


def test_masked_scatter_of_an_empty_source_under_an_empty_mask(eager_mode):
    """CPU returns the input; tpu's lowering indexed the empty source and failed (the
    backward of torch.combinations of one element reaches it; helper-44, test_ops)."""
    x = torch.arange(3.0, device="tpu")
    mask = torch.zeros(3, dtype=torch.bool, device="tpu")
    assert torch.equal(x.masked_scatter(mask, torch.empty(0, device="tpu")).cpu(), x.cpu())


def test_bucketize_with_out_as_cpu(eager_mode):
    """bucketize(out=) raised "too many values to unpack" in its argument check."""
    b = torch.tensor([-4.7, -2.8, 0.3, 3.3, 7.8])
    x = torch.tensor([8.2, 0.0, -5.0])
    out = torch.empty(3, dtype=torch.long, device="tpu")
    torch.bucketize(x.to("tpu"), b.to("tpu"), out=out)
    assert torch.equal(out.cpu(), torch.bucketize(x, b))


def test_searchsorted_out_writes_and_checks_its_dtype_as_cpu():
    """searchsorted(out=) raised "too many values to unpack" in tpu's CPU-check stand-in
    (found by PyTorch's test_ops test_out on tpu); it writes out and refuses an out whose
    dtype does not match out_int32, as CPU does."""
    seq, val = torch.tensor([1.0, 3, 5, 7]), torch.tensor([6.0, 0.5, 7.0])
    for out_int32, dtype in ((False, torch.int64), (True, torch.int32)):
        expected = torch.searchsorted(seq, val, out_int32=out_int32)
        out = torch.empty(3, dtype=dtype, device="tpu")
        got = torch.searchsorted(seq.to("tpu"), val.to("tpu"), out_int32=out_int32, out=out)
        assert got is out and torch.equal(out.cpu(), expected)
    wrong = torch.empty(3, dtype=torch.int32, device="tpu")
    with pytest.raises(RuntimeError, match="output tensor's dtype is wrong"):
        torch.searchsorted(seq.to("tpu"), val.to("tpu"), out=wrong)


def test_searchsorted_of_empty_multi_dim_sequences_as_cpu():
    """A sorted sequence of 2+ dims with no elements (a (2, 0) sequence, (0, 0) ones)
    raised "integer modulo by zero" in the lowering's reshape; CPU answers (found by
    PyTorch's test_ops test_noncontiguous_samples on tpu)."""
    for sequence, values in (((0, 0), (0, 0)), ((2, 0), (2, 3)), ((0, 5), (0, 2)), ((0,), (3,))):
        seq, val = torch.empty(sequence), torch.zeros(values)
        got = torch.searchsorted(seq.to("tpu"), val.to("tpu"))
        assert torch.equal(got.cpu(), torch.searchsorted(seq, val))


@pytest.mark.parametrize(
    "repeats",
    [[2, 0, 3], [0, 0], [], [40, 1, 7]],
    ids=["mixed", "zeros", "empty", "long"],
)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_repeat_interleave_of_tensor_repeats_runs_on_tpu(
    eager_mode, repeats, dtype, no_cpu_fallback
):
    """repeat_interleave.Tensor (the indices `x.repeat_interleave(repeats_tensor)`
    gathers with) ran on the CPU, a copy to the host and back at each call."""
    r = torch.tensor(repeats, dtype=dtype)
    assert_same(torch.repeat_interleave, r)
    assert_same(lambda t: torch.repeat_interleave(t, output_size=int(r.sum())), r)
    x = torch.randn(len(repeats), 3)
    assert_same_grad(lambda x, r: torch.repeat_interleave(x, r, dim=0), x, r)


@pytest.mark.parametrize(
    "repeats", [torch.tensor([[1, 2]]), torch.tensor(3), torch.tensor([2, 1], dtype=torch.int16)]
)
def test_repeat_interleave_refuses_what_cpu_refuses(repeats):
    assert_same_error(lambda device: torch.repeat_interleave(repeats.to(device)))


def test_repeat_interleave_value_errors_as_on_cpu(eager_mode):
    """Negative repeats, and an output_size other than their sum: CPU's errors. Given
    output_size nothing syncs, so that check comes at the next read (a device-side
    check), as CUDA's would; without it the sum is read at the call, as on CPU."""
    negative = torch.tensor([2, -1])
    assert_same_error(lambda device: torch.repeat_interleave(negative.to(device)))
    for repeats, size in ((torch.tensor([2, 1]), 5), (negative, 5), (negative, 1)):
        with pytest.raises(RuntimeError) as cpu:
            torch.repeat_interleave(repeats, output_size=size)
        with pytest.raises(RuntimeError) as tpu:
            torch.repeat_interleave(repeats.to("tpu"), output_size=size).cpu()
        assert str(cpu.value) in str(tpu.value)
