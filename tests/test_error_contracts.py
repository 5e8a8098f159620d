"""PyTorch's error contracts on tpu: where CPU raises for bad arguments, tpu raises the
same exception type with CPU's message, in every eager mode, before anything runs; and
the corner cases PyTorch's device-generic tests found giving other answers than CPU."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import assert_same_error, assert_same_outcome, count_compiles

from torch_tpu.engine import executor
from torch_tpu.engine.debug import TpuOpError

# ----------------------------------------------------------------- indexing


def _mask_assign(device, value_shape, mask_size=3):
    x = torch.zeros(3, 4, device=device)
    mask = torch.ones(mask_size, dtype=torch.bool, device=device)
    x[mask] = torch.ones(value_shape, device=device)
    return x


@pytest.mark.parametrize("value_shape", [(2, 4), (3, 5), (5,), (2, 1, 4)])
def test_mask_assignment_shape_mismatch_raises(eager_mode, value_shape):
    assert_same_error(lambda d: _mask_assign(d, value_shape))


@pytest.mark.parametrize("value_shape", [(3, 4), (1, 4), (4,), (1, 3, 4), ()])
def test_mask_assignment_that_broadcasts(eager_mode, value_shape):
    assert_same_outcome(lambda d: _mask_assign(d, value_shape))


def test_mask_of_the_wrong_shape_raises(eager_mode):
    assert_same_error(lambda d: _mask_assign(d, (2, 4), mask_size=2))
    mask = torch.ones(2, dtype=torch.bool)
    assert_same_error(lambda d: torch.zeros(3, device=d)[mask.to(d)])


def test_index_put_shape_mismatch_raises(eager_mode):
    def put(d):
        x = torch.zeros(3, 4, device=d)
        x[torch.tensor([0, 1], device=d)] = torch.ones(3, 4, device=d)

    assert_same_error(put)


CASES = {
    "empty dim, long index": lambda d: torch.zeros(0, 3, device=d)[torch.tensor([0], device=d)],
    "empty dim, index_put": lambda d: torch.zeros(0, 3, device=d).index_put_(
        (torch.tensor([0], device=d),), torch.tensor(1.0, device=d)
    ),
    "empty index_put, mismatched values": lambda d: torch.zeros(0, 3, device=d).index_put_(
        (torch.tensor([], dtype=torch.long, device=d),), torch.tensor([], device=d)
    ),
    "host index out of range": lambda d: torch.zeros(3, device=d)[torch.tensor([3])],
    "too many indices": lambda d: torch.zeros(3, device=d)[
        torch.tensor([0], device=d), torch.tensor([0], device=d)
    ],
    "float index": lambda d: torch.zeros(3, device=d)[torch.tensor([0.0], device=d)],
    "gather from empty dim": lambda d: torch.zeros(0, device=d).gather(
        0, torch.tensor([0], device=d)
    ),
    "scatter into empty dim": lambda d: torch.zeros(0, device=d).scatter(
        0, torch.tensor([0], device=d), 1.0
    ),
    "index_select from empty dim": lambda d: torch.zeros(0, device=d).index_select(
        0, torch.tensor([0], device=d)
    ),
    "index_add into empty dim": lambda d: torch.zeros(0, device=d).index_add(
        0, torch.tensor([0], device=d), torch.ones(1, device=d)
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_indexing_errors(eager_mode, case):
    assert_same_error(CASES[case])


@pytest.mark.parametrize(
    "fn",
    [
        lambda d: torch.zeros(0, device=d)[torch.tensor([], dtype=torch.long, device=d)],
        lambda d: torch.zeros(3, 0, device=d)[torch.tensor([], dtype=torch.long, device=d)],
        lambda d: torch.zeros(3, device=d).index_put_(
            (torch.tensor([], dtype=torch.long, device=d),), torch.tensor([], device=d)
        ),
        lambda d: torch.zeros(0, 2, device=d).index_put_(
            (torch.tensor([], dtype=torch.long, device=d),),
            torch.zeros(0, 2, device=d),
            accumulate=True,
        ),
        lambda d: torch.zeros(0, device=d)[torch.zeros(0, dtype=torch.bool, device=d)],
    ],
)
def test_empty_indexing_matches_cpu(eager_mode, fn):
    assert_same_outcome(fn)


def test_device_index_out_of_range_raises_in_debug_mode():
    """Debug mode reads device indices to check them (strict and fused modes do not,
    see docs/differences.md)."""
    with torch.tpu.set_eager_mode("debug"):
        assert_same_error(lambda d: torch.zeros(3, device=d)[torch.tensor([5], device=d)])
        assert_same_error(
            lambda d: torch.zeros(3, device=d).gather(0, torch.tensor([7], device=d))
        )


_NEGATIVE_ALONG_A_DIM = {  # CPU refuses a negative index where these ops index along dim
    "gather": lambda x, i: torch.gather(x, 1, i),
    "scatter": lambda x, i: torch.scatter(x, 1, i, 0.0),
    "scatter_add": lambda x, i: torch.scatter_add(x, 1, i, torch.ones_like(i, dtype=x.dtype)),
    "index_add": lambda x, i: x.index_add(1, i[0], torch.ones(1, 1, device=x.device)),
    "index_select": lambda x, i: x.index_select(1, i[0]),
}
_NEGATIVE_WRAPS = {  # and wraps it here, as Python does
    "index_fill": lambda x, i: x.index_fill(1, i[0], 0.0),
    "take_along_dim": lambda x, i: torch.take_along_dim(x, i, 1),
}


def test_negative_indices_along_a_dim_raise_in_debug_mode_where_cpu_refuses_them():
    """Debug mode's check accepted -size <= i < size: gather and scatter wrapped -1 to the
    last element where CPU raises."""
    with torch.tpu.set_eager_mode("debug"):
        for op in _NEGATIVE_ALONG_A_DIM.values():
            for device in ("cpu", "tpu"):
                x = torch.tensor([[10.0, 20.0, 30.0]], device=device)
                with pytest.raises(RuntimeError, match="out of|INDICES"):
                    op(x, torch.tensor([[-1]], device=device))
        for op in _NEGATIVE_WRAPS.values():
            assert_same_outcome(lambda d, op=op: op(
                torch.tensor([[10.0, 20.0, 30.0]], device=d), torch.tensor([[-1]], device=d)
            ))


def test_repeat_calls_are_checked_again(eager_mode):
    """Value-dependent checks run on cached keys too, not only on first calls."""
    x = torch.zeros(3, 4, device="tpu")
    mask = torch.tensor([True, True, False], device="tpu")
    x[mask] = torch.ones(2, 4, device="tpu")  # compiles this key
    with pytest.raises(RuntimeError, match="shape mismatch"):
        x[torch.tensor([True, True, True], device="tpu")] = torch.ones(2, 4, device="tpu")
    with pytest.raises(IndexError, match="out of bounds"):
        x[torch.tensor([7])]


# -------------------------------------------------------------- pointwise, out=


def test_clamp_without_bounds_raises_runtime_error(eager_mode):
    assert_same_error(lambda d: torch.zeros(3, device=d).clamp())
    assert_same_error(lambda d: torch.zeros(3, device=d).clamp_())


_BROADCAST_ERRORS = {
    "eq": lambda d: torch.eq(torch.ones(3, device=d), torch.ones(4, device=d)),
    "add": lambda d: torch.ones(2, 3, device=d) + torch.ones(5, 1, 4, device=d),
    "add_": lambda d: torch.ones(2, 3, device=d).add_(torch.ones(5, 1, 4, device=d)),
    "mul_": lambda d: torch.ones(3, device=d).mul_(torch.ones(2, 3, device=d)),
    "addcmul_": lambda d: torch.ones(3, device=d).addcmul_(
        torch.ones(2, 1, device=d), torch.ones(3, device=d)
    ),
    "where": lambda d: torch.where(
        torch.ones(3, device=d) > 0, torch.ones(1, 3, device=d), torch.ones(4, 1, 2, device=d)
    ),
    "sub_out": lambda d: torch.sub(
        torch.ones(2, 3, device=d), torch.ones(5, 1, 4, device=d), out=torch.ones(7, device=d)
    ),
    "isclose": lambda d: torch.isclose(torch.ones(3, device=d), torch.ones(4, device=d)),
}


@pytest.mark.parametrize("case", sorted(_BROADCAST_ERRORS))
def test_broadcast_errors_in_cpus_words(eager_mode, case):
    """(PyTorch's Python meta functions word them otherwise than CPU's TensorIterator)"""
    assert_same_error(_BROADCAST_ERRORS[case])


@pytest.mark.parametrize(
    ("op", "src", "out"),
    [
        (torch.sin, torch.float32, torch.int64),
        (torch.angle, torch.float32, torch.int64),
        (torch.angle, torch.float32, torch.bool),
        (torch.neg, torch.int64, torch.int32),
        (torch.round, torch.float32, torch.float16),
        (torch.bitwise_not, torch.int64, torch.int32),
        (torch.nan_to_num, torch.float32, torch.float16),
    ],
)
def test_out_of_a_dtype_the_result_cannot_take_raises(eager_mode, op, src, out):
    def call(d):
        return op(torch.ones(4, dtype=src, device=d), out=torch.empty(4, dtype=out, device=d))

    assert_same_error(call)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64])
@pytest.mark.parametrize("src", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_float_to_int_conversion_matches_cpu(src, dtype):
    values = [1.5, -3.7, 300.0, -300.0, 70000.0, -70000.0, 255.5, -128.9, 32768.0, 3e9, -1e10]
    x = torch.tensor(values).to(src)
    assert torch.equal(x.to("tpu").to(dtype).cpu(), x.to(dtype))
    out = torch.empty(len(values), dtype=dtype, device="tpu")
    out.copy_(x.to("tpu"))
    assert torch.equal(out.cpu(), x.to(dtype))


# -------------------------------------------------------------- shape, dynamic


@pytest.mark.parametrize("dims", [[0], [-1], [], [1]])
def test_flip_of_a_0d_tensor(eager_mode, dims):
    assert_same_outcome(lambda d: torch.tensor(3.0, device=d).flip(dims))


@pytest.mark.parametrize("dims", [(1, 1), (0, -3), (2, 0, 2), (0, 3), (-4,)])
def test_flip_of_bad_dims_raises_as_cpu(eager_mode, dims):
    assert_same_error(lambda d: torch.ones(3, 4, 5, device=d).flip(dims))


def test_flip_in_any_order_of_its_dims_is_one_program(monkeypatch):
    """flip treats its dims as a set: every order (and wrapping) of the same dims runs
    one program, not a compile each (PyTorch's test_flip met 46 programs for 29)."""
    programs = count_compiles(monkeypatch)
    x = torch.randn(3, 4, 5)
    with torch.tpu.set_eager_mode("strict"):
        for dims in [(2, 0), (0, 2), (-1, 0), (0, -1), (-3, 2)]:
            assert torch.equal(x.to("tpu").flip(dims).cpu(), x.flip(dims))
    assert programs.count("aten::flip.default") <= 1


def test_nonzero_out_is_resized():
    x = torch.tensor([[0, 1], [2, 0], [3, 3]])
    out = torch.empty(0, dtype=torch.long, device="tpu")
    result = torch.nonzero(x.to("tpu"), out=out)
    assert result is out
    assert torch.equal(out.cpu(), torch.nonzero(x))


def test_nonzero_out_non_contiguous():
    x = torch.tensor([[0, 1], [2, 0]])
    expected = torch.nonzero(x)
    out = torch.empty(4, 2, dtype=torch.long, device="tpu").t()[:2, :2]
    torch.nonzero(x.to("tpu"), out=out)
    assert torch.equal(out.cpu(), expected)


def test_nonzero_out_of_the_wrong_dtype_raises():
    def call(d):
        out = torch.empty(0, dtype=torch.int32, device=d)
        torch.nonzero(torch.tensor([1, 0, 1], device=d), out=out)

    with pytest.raises(RuntimeError, match="Expected out tensor to have scalar type Long"):
        call("tpu")
    with pytest.raises(RuntimeError):
        call("cpu")


@pytest.mark.parametrize(
    "write",
    [
        lambda view: torch.arange(-2, 0, out=view),
        lambda view: torch.add(torch.ones(2, device=view.device), 1, out=view),
        lambda view: torch.masked_select(  # (a result size known only after it ran)
            torch.tensor([7.0, 8.0, 9.0], device=view.device),
            torch.tensor([True, False, True], device=view.device),
            out=view,
        ),
    ],
)
def test_an_out_view_resized_in_its_storage_writes_through_to_its_base(write, eager_mode):
    """CPU resizes out= as resize_ does: within the storage, a view stays a view."""

    def call(d):
        base = torch.arange(5.0, device=d)
        view = base[3:3]
        write(view)
        return base, view, view.storage_offset()

    expected, actual = call("cpu"), call("tpu")
    assert torch.equal(actual[0].cpu(), expected[0])
    assert torch.equal(actual[1].cpu(), expected[1])
    assert actual[2] == expected[2]


@pytest.mark.parametrize(
    "write",
    [
        lambda d, out: torch.exp(torch.ones(3, device=d), out=out),
        lambda d, out: torch.cumsum(torch.ones(2, 3, device=d), 1, out=out),
        lambda d, out: torch.cat([torch.ones(3, device=d), torch.ones(1, device=d)], out=out),
        lambda d, out: torch.mean(torch.ones(3, 2, device=d), 0, out=out),
        lambda d, out: torch.clamp(torch.ones(3, device=d), 0, 1, out=out),
        lambda d, out: torch.arange(7, out=out),  # (arange's own words)
        lambda d, out: torch.linspace(0, 1, 7, out=out),  # (resized silently)
        lambda d, out: torch.fft.fftfreq(7, out=out),
        lambda d, out: torch.linalg.cholesky(torch.eye(3, device=d), out=out),  # (C++ meta)
        lambda d, out: torch.linalg.inv(torch.eye(3, device=d), out=out),
    ],
    ids=[
        "exp", "cumsum", "cat", "mean", "clamp", "arange", "linspace", "fftfreq", "cholesky",
        "inv",
    ],  # fmt: skip
)
@pytest.mark.parametrize("size", [5, 0], ids=["with-elements", "empty"])
def test_out_resized_warns_at_every_call_as_cpu(write, size, eager_mode):
    """CPU warns each time it resizes an out= that had elements (a deprecation); tpu
    warned only at the first call of a signature (its meta kernel's run), in the words
    of PyTorch's Python wrapper ("shape torch.Size([5])"), and not again."""

    def messages(d):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            for _ in range(3):
                write(d, torch.empty(size, device=d))
        return [str(w.message).split(" (Triggered internally")[0] for w in seen]

    expected = messages("cpu")
    assert messages("tpu") == expected


@pytest.mark.parametrize(
    "write",
    [
        lambda d, a, b: torch.sort(torch.ones(3, device=d), out=(a, b)),
        lambda d, a, b: torch.topk(torch.ones(4, device=d), 3, out=(a, b)),
        lambda d, a, b: torch.max(torch.ones(3, 4, device=d), 1, out=(a, b)),
        lambda d, a, b: torch.cummax(torch.ones(3, device=d), 0, out=(a, b)),
    ],
    ids=["sort", "topk", "max.dim", "cummax"],
)
def test_two_outs_resized_warn_once_each_as_cpu(write, eager_mode):
    """CPU warns once per resized out=; tpu warned two or three times: CPU's refusal run
    of the call (its kernel, on CPU stand-ins of the wrongly sized outs) and a meta kernel
    in C++ (topk's, max's) warned again, from C++, where no Python filter reaches."""

    def messages(d):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            for _ in range(2):
                a, b = torch.empty(5, device=d), torch.empty(5, dtype=torch.long, device=d)
                write(d, a, b)
        return [str(w.message).split(" (Triggered internally")[0] for w in seen]

    expected = messages("cpu")
    assert len(expected) == 4
    assert messages("tpu") == expected


def _spd(n: int) -> torch.Tensor:
    a = torch.randn(n, n, generator=torch.Generator().manual_seed(n))
    return a @ a.T + n * torch.eye(n)


@pytest.mark.parametrize(
    "write",
    [
        lambda d, out: torch.linalg.cholesky(_spd(4).to(d), out=out),
        lambda d, out: torch.linalg.inv(_spd(4).to(d), out=out),
        lambda d, out: torch.linalg.solve(_spd(4).to(d), torch.ones(4, 3, device=d), out=out),
        lambda d, out: torch.linalg.solve_triangular(
            _spd(4).tril().to(d), torch.ones(4, 2, device=d), upper=False, out=out
        ),
        # (pointwise: TensorIterator lays the out out as the input, where PyTorch's Python
        # meta kernels for out= make it row-major)
        lambda d, out: torch.exp(torch.ones(2, 3, device=d).t(), out=out),
        lambda d, out: torch.add(
            torch.ones(2, 3, 4, device=d).permute(2, 0, 1), 1.5, alpha=2, out=out
        ),
        # (a CPU fallback: CPU's kernel restrides the host copy of the out)
        lambda d, out: torch.ormqr(_spd(4).to(d), torch.ones(4, device=d), _spd(4).to(d), out=out),
    ],
    ids=["cholesky", "inv", "solve", "solve_triangular", "exp-transposed", "add-permuted", "ormqr"],
)
@pytest.mark.parametrize("size", [0, 5], ids=["empty", "with-elements"])
def test_resized_out_has_cpus_strides(write, size, eager_mode):
    """CPU restrides an out= it resizes as its meta function says (column-major for
    linalg results, the input's layout for a pointwise op); tpu left every resized out
    row-major: equal values, other strides (`.view`, `.is_contiguous()` and
    stride-reading code behaved otherwise)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the resize's deprecation: tested above)
        expected = torch.empty(size)
        write("cpu", expected)
        out = torch.empty(size, device="tpu")
        write("tpu", out)
    assert (out.shape, out.stride()) == (expected.shape, expected.stride())
    torch.testing.assert_close(out.cpu(), expected)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fftfreq_has_cpus_negative_half(n, dtype, eager_mode):
    """ATen's fftfreq writes its negative half through an out= slice of its result."""
    expected = torch.fft.fftfreq(n, 0.5, dtype=dtype)
    torch.testing.assert_close(torch.fft.fftfreq(n, 0.5, dtype=dtype, device="tpu").cpu(), expected)
    shifted = torch.fft.fftshift(torch.fft.fftfreq(n, dtype=dtype, device="tpu"))
    torch.testing.assert_close(shifted.cpu(), torch.fft.fftshift(torch.fft.fftfreq(n, dtype=dtype)))


def test_masked_select_out_is_resized():
    x, mask = torch.arange(6.0), torch.tensor([True, False] * 3)
    out = torch.empty(1, device="tpu")
    torch.masked_select(x.to("tpu"), mask.to("tpu"), out=out)
    assert torch.equal(out.cpu(), torch.masked_select(x, mask))


@pytest.mark.parametrize(
    ("size", "memory_format"),
    [
        ((2, 3, 4, 5), torch.channels_last),
        ((2, 3, 4, 5, 6), torch.channels_last_3d),
        ((2, 3), torch.contiguous_format),
    ],
)
def test_resize_honours_memory_format(size, memory_format):
    def resize(d):
        x = torch.arange(120.0, device=d)
        x.resize_(size, memory_format=memory_format)
        return x.stride(), x.flatten()[:10].cpu()

    (cpu_strides, cpu_values), (tpu_strides, tpu_values) = resize("cpu"), resize("tpu")
    assert tpu_strides == cpu_strides
    assert torch.equal(tpu_values, cpu_values)


def test_resize_to_a_format_of_another_rank_raises():
    assert_same_error(
        lambda d: torch.zeros(6, device=d).resize_(2, 3, memory_format=torch.channels_last)
    )


# ------------------------------------------------------------- factory, random


@pytest.mark.parametrize("dtype", [torch.int64, torch.int16, torch.uint8, torch.float32])
@pytest.mark.parametrize(
    ("start", "end", "steps", "base"),
    [(-2, 2, 101, 10.0), (-2, 3.7, 101, 0.5), (1.5, 0, 1, 10.0), (1.5, 6, 5, 10.0), (0, 3, 4, 2.0)],
)
def test_logspace_matches_cpu(dtype, start, end, steps, base):
    expected = torch.logspace(start, end, steps, base, dtype=dtype)
    actual = torch.logspace(start, end, steps, base, dtype=dtype, device="tpu")
    torch.testing.assert_close(actual.cpu(), expected)


RANDOM_BOUNDS = [
    (torch.int8, -42, 42),
    (torch.uint8, 0, 255),
    (torch.float16, -42, 42),
    (torch.int64, -(2**63), 2**63 - 1),
]


@pytest.mark.parametrize(("dtype", "low", "high"), RANDOM_BOUNDS)
def test_random_from_to_stays_in_range(dtype, low, high):
    x = torch.empty(2000, dtype=dtype, device="tpu").random_(low, high).cpu()
    assert x.min().item() >= low and x.max().item() < high


@pytest.mark.parametrize(
    ("dtype", "low", "high"),
    [
        (torch.int8, 42, 42),
        (torch.int8, 42, -42),
        (torch.int8, -200, 0),
        (torch.uint8, 0, 300),
        (torch.float16, -(2**63), 0),
        (torch.float16, 0, 2**63 - 1),
        (torch.uint8, -1, None),
        (torch.int8, 200, None),
    ],
)
def test_random_from_to_bad_bounds_raise(eager_mode, dtype, low, high):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CPU warns about float bounds past 2**digits
        assert_same_error(lambda d: torch.empty(4, dtype=dtype, device=d).random_(low, high))


# --------------------------------------------------------------- sort, debug


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.int16, torch.uint8, torch.float32])
def test_stable_sort_matches_cpu(dtype):
    x = torch.tensor([0, 1] * 1025, dtype=dtype)
    assert torch.equal(x.to("tpu").sort(stable=True)[1].cpu(), x.sort(stable=True)[1])
    y = (torch.randn(10, 10) * 10).to(dtype)
    for dim in (0, 1):
        expected = y.sort(dim=dim, stable=True)[1]
        assert torch.equal(y.to("tpu").sort(dim=dim, stable=True)[1].cpu(), expected)


def test_debug_mode_errors_keep_cpu_types_and_name_the_line():
    with torch.tpu.set_eager_mode("debug"):
        with pytest.raises(IndexError) as info:
            torch.zeros(0, 3, device="tpu")[torch.tensor([0], device="tpu")]
    message = str(info.value)
    assert isinstance(info.value, TpuOpError)
    assert "aten::index.Tensor" in message and "test_error_contracts.py" in message
    assert '""' not in message


def test_lowering_failures_are_runtime_errors_naming_the_op():
    """The last resort: an exception escaping from JAX becomes a RuntimeError naming the
    op, never a TypeError/ValueError of JAX's; PyTorch's own RuntimeErrors pass as they are."""
    with pytest.raises(RuntimeError, match="aten::my_op.*TypeError: inside jax"):
        with executor.lowering_errors("aten::my_op"):
            raise TypeError("inside jax")
    with pytest.raises(RuntimeError, match="^as raised$"):
        with executor.lowering_errors("aten::my_op"):
            raise RuntimeError("as raised")


# ------------------------------------- found by PyTorch's test_type_promotion on tpu


def _t(values, dtype, device):
    return torch.tensor(values, dtype=dtype, device=device)


@pytest.mark.parametrize("case", [
    lambda d: torch.ones(4, device=d).index_put_((_t([0, 1], torch.long, d),),
                                                  _t([7, 8], torch.long, d)),
    lambda d: torch.ones(4, device=d).index_put_((_t([0], torch.long, d),),
                                                  _t(3, torch.long, d), accumulate=True),
    lambda d: torch.ones(5, 2, dtype=torch.float64, device=d).__setitem__(
        (slice(None), [1]), torch.zeros(5, 1, dtype=torch.int32, device=d)),
    lambda d: torch.ones(4, device=d).__setitem__(
        _t([True, False, True, False], torch.bool, d), _t([7, 8], torch.long, d)),
], ids=["index_put_", "accumulate_0d", "setitem_list", "setitem_mask"])
def test_index_put_of_another_dtype_raises(eager_mode, case):
    """CPU refuses values of another dtype; tpu cast and wrote them silently."""
    assert_same_error(case)


@pytest.mark.parametrize("case", [
    lambda d: torch.add(_t([True, False], torch.bool, d), _t([True, True], torch.bool, d),
                        alpha=1.1),
    lambda d: torch.add(_t([1, 2], torch.int32, d), _t([1, 1], torch.int32, d), alpha=1.5),
    lambda d: torch.sub(_t([1, 2], torch.int64, d), 1, alpha=0.5),
    lambda d: torch.add(_t([1.0, 2.0], torch.float32, d), _t([1.0, 1.0], torch.float32, d),
                        alpha=True),
    lambda d: torch.add(_t([1.0], torch.float32, d), _t([1.0], torch.float32, d), alpha=1j),
    lambda d: torch.rsub(_t([1, 2], torch.int32, d), _t([1, 1], torch.int32, d), alpha=2.5),
], ids=["bool_float_alpha", "int_float_alpha", "sub_scalar", "bool_alpha", "complex_alpha",
        "rsub"])
def test_alpha_of_the_wrong_kind_raises(eager_mode, case):
    """A float alpha on bool tensors gave a result where CPU raises; on ints, a ValueError
    of PyTorch's reference implementation instead of CPU's RuntimeError."""
    assert_same_error(case)


@pytest.mark.parametrize("case", [
    lambda d: torch.add(_t([33000.0], torch.float16, d), _t([33000.0], torch.float16, d),
                        out=torch.empty(1, dtype=torch.float64, device=d)),
    lambda d: torch.add(_t([1.0, 3.33], torch.bfloat16, d), _t([0.001, 0.002], torch.bfloat16, d),
                        out=torch.empty(2, dtype=torch.float32, device=d)),
    lambda d: torch.true_divide(_t([2.252], torch.float16, d), _t([1.0], torch.float16, d),
                                out=torch.empty(1, dtype=torch.float64, device=d)),
    lambda d: torch.mul(_t([300.0], torch.float16, d), 300,
                        out=torch.empty(1, dtype=torch.float32, device=d)),
], ids=["f16_overflow", "bf16_rounding", "true_divide", "mul_scalar"])
def test_out_of_a_wider_dtype_gets_the_ops_own_rounding(eager_mode, case):
    """op(..., out=wider) computes in the op's result dtype and casts into out, as on CPU
    (tpu wrote the float32 intermediate: 65984 where CPU overflows to inf)."""
    assert_same_outcome(case)


def test_complex32_is_refused_by_name(eager_mode):
    """tpu holds no complex32: an upload and an op whose result would be one say so (numpy's
    'unsupported ScalarType' and a KeyError inside the lowering reached the user)."""
    with pytest.raises(TypeError, match="do not support dtype torch.complex32"):
        torch.tensor([1 + 1j], dtype=torch.chalf, device="tpu")
    half = torch.tensor([1.0], dtype=torch.half, device="tpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyTorch's "ComplexHalf support is experimental"
        with pytest.raises(RuntimeError, match="do not support dtype torch.complex32"):
            half + 1j


_MASK = [True, False, True]


@pytest.mark.parametrize("case", [
    lambda d: torch.zeros(3, device=d).index_fill(0, _t([0], torch.long, d), 1 + 1j),
    lambda d: torch.zeros(3, device=d).index_fill(0, _t([0], torch.long, d),
                                                  _t(1 + 1j, torch.complex64, d)),
    lambda d: torch.zeros(3, device=d).fill_(1 + 1j),
    lambda d: torch.zeros(3, dtype=torch.long, device=d).fill_(1 + 1j),
    lambda d: torch.zeros(3, device=d).masked_fill(_t(_MASK, torch.bool, d), 1 + 1j),
    lambda d: torch.full((2,), 1 + 1j, dtype=torch.float32, device=d),
    lambda d: torch.zeros(3, dtype=torch.uint8, device=d).fill_(300),
    lambda d: torch.zeros(3, dtype=torch.int8, device=d).masked_fill(_t(_MASK, torch.bool, d),
                                                                    float("nan")),
    lambda d: torch.full((2,), 1e10, dtype=torch.int32, device=d),
], ids=["index_fill", "index_fill_tensor", "fill_float", "fill_long", "masked_fill", "full",
        "fill_uint8_300", "masked_fill_int8_nan", "full_int32"])
def test_fill_values_that_do_not_fit_raise(eager_mode, case):
    """CPU refuses a fill value its dtype cannot hold; tpu dropped the imaginary part or
    wrapped (300 -> 44 in uint8) silently. Found by PyTorch's test_indexing on tpu."""
    assert_same_error(case)


@pytest.mark.parametrize("case", [
    lambda d: torch.zeros(3, dtype=torch.uint8, device=d).fill_(-1),
    lambda d: torch.zeros(3, device=d).masked_fill(_t(_MASK, torch.bool, d), float("-inf")),
    lambda d: torch.zeros(3, dtype=torch.int64, device=d).fill_(1.5),
    lambda d: torch.zeros(3, dtype=torch.bool, device=d).fill_(1 + 1j),
    lambda d: torch.zeros(3, dtype=torch.complex64, device=d).fill_(1 + 1j),
], ids=["uint8_minus_one", "masked_fill_inf", "long_one_and_a_half", "bool", "complex"])
def test_fill_values_cpu_accepts(eager_mode, case):
    assert_same_outcome(case)


@pytest.mark.parametrize("case", [
    lambda d: torch.var(torch.arange(1, 7, device=d)),
    lambda d: torch.std(torch.arange(1, 7, device=d), 0),
    lambda d: torch.all(torch.ones(2, 2, device=d), 1, out=torch.empty(2, device=d)),
    lambda d: torch.any(torch.ones(2, 2, device=d), out=torch.empty((), device=d)),
    lambda d: torch.bincount(_t([1, -1], torch.long, d)),
    lambda d: _t([True, False], torch.bool, d).argmin(),
    lambda d: _t([True, False], torch.bool, d).argmax(0),
    lambda d: torch.zeros(0, 3, device=d).max(0),
    lambda d: torch.zeros(0, 3, device=d).min(-2),
    lambda d: torch.zeros([1] * 65, device=d).nansum(0),
], ids=["var_int", "std_int", "all_out_float", "any_all_out_float", "bincount_negative",
        "argmin_bool", "argmax_bool", "max_empty_dim", "min_empty_dim", "nansum_65_dims"])
def test_reductions_cpu_refuses_raise(eager_mode, case):
    """CPU refuses these; tpu returned results (var of ints truncated to an int, a float
    all(), counts for negative values) or a lowering's ValueError. Found by PyTorch's
    test_reductions on tpu."""
    assert_same_error(case)


def test_uint8_all_into_uint8_out_as_on_cpu(eager_mode):
    assert_same_outcome(lambda d: torch.all(torch.ones(2, 2, dtype=torch.uint8, device=d), 1,
                                            out=torch.empty(2, dtype=torch.uint8, device=d)))


def test_nll_loss_argument_errors_are_runtime_errors(eager_mode):
    """PyTorch's nll_loss decomposition raises AssertionError where CPU raises RuntimeError
    with (about) the same words."""
    assert_same_error(lambda d: torch.nn.functional.nll_loss(
        torch.randn(10, 4, device=d), torch.zeros(10, 2, dtype=torch.long, device=d)))
    with pytest.raises(RuntimeError, match="should be defined either for all 4 classes"):
        torch.nn.functional.nll_loss(torch.randn(10, 4, device="tpu"),
                                     torch.zeros(10, dtype=torch.long, device="tpu"),
                                     weight=torch.ones(5, device="tpu"))


@pytest.mark.parametrize("case", [
    lambda d: torch.histc(_t([1.0, float("inf")], torch.float32, d), 4),
    lambda d: torch.histc(_t([1.0, float("-inf")], torch.float32, d), 4),
    lambda d: torch.histc(_t([1.0, 2.0], torch.float32, d), 4, min=0, max=float("inf")),
], ids=["inf_data", "minus_inf_data", "inf_bound"])
def test_histc_of_a_range_that_is_not_finite_raises(eager_mode, case):
    """CPU refuses; tpu gave a histogram missing the infinite values (all zeros for data
    holding a NaN). Found by PyTorch's test_reductions on tpu."""
    assert_same_error(case)


def test_histc_over_nan_data_raises_and_finite_histograms_match(eager_mode):
    with pytest.raises(RuntimeError, match="is not finite"):
        torch.histc(torch.tensor([1.0, float("nan")], device="tpu"), 4)
    for data, kwargs in (([0.5, 1.5, 2.5, 2.5], {}), ([1.0, float("nan")], {"min": 0, "max": 3}),
                         ([], {})):
        assert_same_outcome(
            lambda d, data=data, kwargs=kwargs: torch.histc(torch.tensor(data, device=d), 3,
                                                            **kwargs)
        )


# ------------------------------------------------------ dtypes CPU's kernels refuse


def _complex(d):
    return torch.tensor([1 + 2j, 3 - 1j, 0.5j], device=d)


@pytest.mark.parametrize("case", [
    lambda d: _complex(d).max(),
    lambda d: _complex(d).amax(),
    lambda d: _complex(d).sort(),
    lambda d: _complex(d).median(),
    lambda d: _complex(d).cummax(0),
    lambda d: _complex(d).kthvalue(1),
    lambda d: _complex(d).clamp(0, 1),
    lambda d: torch.maximum(_complex(d), _complex(d)),
    lambda d: torch.nansum(_complex(d)),
    lambda d: torch.tensor([True, False], device=d).abs(),
    lambda d: torch.arange(4, device=d).frac(),
    lambda d: torch.arange(4, device=d).logcumsumexp(0),
    lambda d: torch.nn.functional.hardshrink(torch.arange(4, device=d)),  # decomposed
    lambda d: torch.ones(4, dtype=torch.bool, device=d).cumsum(0, dtype=torch.bool),
    lambda d: _complex(d).clamp_(0, 1),  # in place
])  # fmt: skip
def test_dtypes_cpu_refuses_raise(eager_mode, case):
    """CPU's kernels refuse these dtypes (complex order, bool abs, int frac...) where
    PyTorch's meta kernels and XLA accept them: tpu returned results CPU never gives."""
    assert_same_error(case)


def test_half_kernels_cpu_lacks_are_computed(eager_mode):
    """CPU has no half-float cdist or avg_pool3d (CUDA has): tpu computes them, as
    float32 would, rather than refuse a CUDA program's half precision."""
    x = torch.randn(2, 3, 4, 4, 4)
    a, b = torch.randn(5, 3), torch.randn(4, 3)
    for dtype in (torch.float16, torch.bfloat16):
        pooled = torch.nn.functional.avg_pool3d(x.to("tpu", dtype), 2)
        expected = torch.nn.functional.avg_pool3d(x.to(dtype).float(), 2)
        torch.testing.assert_close(pooled.cpu().float(), expected, atol=1e-2, rtol=1e-2)
        distances = torch.cdist(a.to("tpu", dtype), b.to("tpu", dtype))
        expected = torch.cdist(a.to(dtype).float(), b.to(dtype).float())
        torch.testing.assert_close(distances.cpu().float(), expected, atol=5e-2, rtol=2e-2)


def test_refusal_checks_leave_cpu_random_numbers_alone():
    """The check runs the op once on CPU: the CPU generator must not move."""
    torch.manual_seed(0)
    expected = torch.rand(4)
    torch.manual_seed(0)
    ints = torch.arange(6, device="tpu").reshape(2, 3) * 7  # new keys holding int64
    torch.testing.assert_close((ints % 5).cpu(), (torch.arange(6).reshape(2, 3) * 7) % 5)
    torch.testing.assert_close(torch.rand(4), expected)


@pytest.mark.parametrize("value", [7.0, torch.tensor(7.0), torch.tensor([7.0])])
def test_one_value_through_a_byte_mask_raises(eager_mode, value):
    """CPU writes one value through a lone mask with masked_fill_, which refuses uint8
    masks; tpu wrote it."""

    def assign(d):
        x = torch.zeros(2, 3, device=d)
        mask = torch.tensor([1, 0, 1], dtype=torch.uint8, device=d)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (the uint8-index deprecation)
            x[:, mask] = value.to(d) if isinstance(value, torch.Tensor) else value
        return x

    assert_same_error(assign)


def _expanded(d):
    return torch.zeros(1, 3, device=d).expand(4, 3)


@pytest.mark.parametrize("case", [
    lambda d: torch.add(torch.ones(4, 3, device=d), 1, out=_expanded(d)),
    lambda d: torch.cat([torch.ones(2, 3, device=d)] * 2, out=_expanded(d)),
    lambda d: _expanded(d).add_(1),
    lambda d: _expanded(d).copy_(torch.ones(4, 3, device=d)),
    lambda d: torch.mm(torch.ones(4, 2, device=d), torch.ones(2, 3, device=d), out=_expanded(d)),
])  # fmt: skip
def test_writing_to_elements_that_share_memory_raises(eager_mode, case):
    """An out= or in-place target whose elements share memory (expanded): CPU refuses
    to write it; tpu wrote each shared element once, silently."""
    assert_same_error(case)


def _eight(d):
    return torch.arange(8.0, device=d)


def _square(d):
    return torch.arange(8.0, device=d)[:4].view(2, 2)


@pytest.mark.parametrize("case", [
    lambda d: (lambda x: torch.add(x[1:4], 10, out=x[0:3]))(_eight(d)),
    lambda d: (lambda x: x[0:3].add_(x[1:4]))(_eight(d)),
    lambda d: (lambda x: x[1:].copy_(x[:-1]))(_eight(d)),
    lambda d: (lambda x: torch.cat([x[:2], x[2:4]], out=x[1:5]))(_eight(d)),
    lambda d: (lambda x: torch.where(x[:3] > 0, x[:3], x[3:6], out=x[1:4]))(_eight(d)),
    lambda d: (lambda x: x[:3].lerp_(x[2:5], 0.5))(_eight(d)),
    lambda d: (lambda x: torch.add(x, x.t(), out=x))(_square(d)),
])  # fmt: skip
def test_writing_over_an_inputs_memory_raises(eager_mode, case):
    """An out= or in-place target whose memory partly meets an input's: CPU refuses it;
    tpu computed it as if the input had been copied first, silently."""
    assert_same_error(case)


@pytest.mark.parametrize("op", ["atan2_", "lt_", "eq_", "fmod_", "remainder_"])
def test_in_place_op_never_resizes_self(eager_mode, op):
    """An in-place op whose broadcast shape is larger than self: CPU refuses; tpu resized
    self to the broadcast shape (PyTorch's meta kernels for atan2_, the comparisons,
    fmod_ and remainder_ resize it as if it were out=) and wrote other values."""
    small, large = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([[0.5, 1, 2], [3, 4, 5]])
    assert_same_error(lambda d: getattr(small.to(d), op)(large.to(d)))


@pytest.mark.parametrize("case", [
    lambda d: (lambda i: i.index_add_(0, i, i))(torch.tensor([0, 1, 2], device=d)),
    lambda d: (lambda x: x.scatter_(0, torch.tensor([0, 1], device=d), x))(_eight(d)),
])  # fmt: skip
def test_an_in_place_self_given_again_as_an_input_raises(eager_mode, case):
    """The same tensor as self and as another argument CPU cannot read while writing."""
    assert_same_error(case)


@pytest.mark.parametrize("case", [
    lambda d: (lambda x: (x.add_(x), x)[1])(_eight(d)),
    lambda d: (lambda x: (torch.mul(x, 2, out=x), x)[1])(_eight(d)),
    lambda d: (lambda x: (torch.neg(x[:3], out=x[3:6]), x)[1])(_eight(d)),
])  # fmt: skip
def test_writes_cpu_allows_over_an_inputs_memory_still_work(eager_mode, case):
    """The whole input written in place and a disjoint part of its storage keep working."""
    assert_same_outcome(case)


def test_mm_into_one_of_its_inputs_reads_the_inputs_first(eager_mode):
    """CPU accepts mm(a, b, out=a); its result depends on the BLAS path (MKL on an AMD
    EPYC zeroes out= before reading a: [0, 0, 0, 0]; other machines give the product).
    tpu computes from the inputs' values before the write, the product, everywhere."""
    x = _eight("tpu")
    torch.mm(x[:4].view(2, 2), x[4:].view(2, 2), out=x[:4].view(2, 2))
    cpu = _eight("cpu")
    product = torch.mm(cpu[:4].view(2, 2).clone(), cpu[4:].view(2, 2).clone())
    torch.testing.assert_close(x.cpu(), torch.cat([product.flatten(), cpu[4:]]))


@pytest.mark.parametrize("case", [
    lambda d: _expanded(d).fill_(2),
    lambda d: _expanded(d).zero_(),
])  # fmt: skip
def test_writes_cpu_allows_into_shared_elements_still_work(eager_mode, case):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_same_outcome(case)


@pytest.mark.parametrize("case", [
    lambda d: torch.empty(3, device=d).uniform_(42, -42),
    lambda d: torch.empty(3, device=d).uniform_(-3.4e38, 3.4e38),
    lambda d: torch.empty(3, dtype=torch.half, device=d).uniform_(-65504, 65504),
    lambda d: torch.randperm(257, out=torch.empty(0, dtype=torch.uint8, device=d), device=d),
    lambda d: torch.randperm(2050, out=torch.empty(0, dtype=torch.half, device=d), device=d),
    lambda d: torch.randperm(129, dtype=torch.int8, device=d),
    lambda d: torch.randperm(40000, dtype=torch.int16, device=d),
    lambda d: torch.ones(2, dtype=torch.int32, device=d).addcmul_(
        torch.ones(2, dtype=torch.int32, device=d), torch.ones(2, dtype=torch.int32, device=d),
        value=1 + 2j),
    lambda d: torch.addcmul(torch.ones(2, dtype=torch.half, device=d), torch.ones(2, device=d),
                            torch.ones(2, device=d), value=2j),
    lambda d: torch.addcdiv(torch.ones(2, dtype=torch.float64, device=d),
                            torch.ones(2, device=d), torch.ones(2, device=d), value=1 - 1j),
    lambda d: torch.polar(torch.ones(2, device=d), torch.ones(2, dtype=torch.float64, device=d)),
    lambda d: torch.complex(torch.ones(2, dtype=torch.long, device=d),
                            torch.ones(2, dtype=torch.long, device=d)),
    lambda d: torch.heaviside(torch.ones(2, device=d), torch.ones(2, dtype=torch.half, device=d)),
    lambda d: torch.heaviside(torch.ones(2, dtype=torch.bool, device=d), torch.ones(2, device=d),
                              out=torch.empty(2, dtype=torch.bool, device=d)),
])  # fmt: skip
def test_random_and_complex_arguments_cpu_refuses_raise(eager_mode, case):
    """tpu gave uniform_(42, -42) as all 42, a range wider than the dtype as inf,
    randperm(257) into uint8 with repeats, a complex128 from float32 and float64 parts,
    addcmul's complex value into a real result without its imaginary part."""
    assert_same_error(case)


def test_negative_std_on_the_device_is_checked_in_debug_mode():
    """Reading a device std costs a sync: debug mode does it (as index values)."""
    with torch.tpu.set_eager_mode("debug"), pytest.raises(RuntimeError, match="std >= 0.0"):
        torch.normal(torch.zeros(2, device="tpu"), torch.tensor([1.0, -1.0], device="tpu"))


@pytest.mark.parametrize(
    "call",
    [
        lambda d: torch.logcumsumexp(
            torch.ones(3, 3, dtype=torch.float64, device=d), 1, out=torch.empty(3, 3, device=d)
        ),
        lambda d: torch.logcumsumexp(
            torch.ones(4, device=d), 0, out=torch.empty(4, dtype=torch.float64, device=d)
        ),
    ],
    ids=["double_into_float", "float_into_double"],
)
def test_out_of_another_dtype_is_refused_where_cpus_kernel_refuses_it(eager_mode, call):
    """Most out= variants cast into out when the cast is safe, but some CPU kernels want
    out's dtype exact (logcumsumexp); tpu cast into out."""
    assert_same_error(call)


_DECOMPOSED_BAD_CALLS = {
    "grid_sampler_2d_5d_input": lambda d: torch.grid_sampler_2d(
        torch.zeros(1, 1, 2, 2, 2, device=d), torch.zeros(1, 2, 2, 2, device=d), 0, 0, False
    ),
    "grid_sampler_2d_batch": lambda d: torch.grid_sampler_2d(
        torch.zeros(2, 1, 2, 2, device=d), torch.zeros(1, 2, 2, 2, device=d), 0, 0, False
    ),
}


@pytest.mark.parametrize("case", sorted(_DECOMPOSED_BAD_CALLS))
def test_a_failing_decomposition_raises_cpus_error(eager_mode, case):
    """Ops tpu runs through a PyTorch decomposition check less than CPU's kernel: a bad
    call failed in the decomposition's words ("too many values to unpack", a reshape's)."""
    assert_same_error(_DECOMPOSED_BAD_CALLS[case])


def test_local_scalar_dense_reads_the_first_element_and_refuses_empty(eager_mode):
    """`_local_scalar_dense` (what .item() and `if tensor:` call after their own checks)
    reads the element at index 0 of any tensor, as CPU's kernel: tpu raised numpy's
    ValueError for more than one element or none."""
    read = torch.ops.aten._local_scalar_dense
    for make in (lambda d: torch.tensor([3.0, 4.0], device=d),
                 lambda d: torch.arange(6.0, device=d).view(2, 3).t()[1:]):  # fmt: skip
        assert read(make("tpu")) == read(make("cpu"))
    assert_same_error(lambda d: read(torch.empty(0, device=d)))


@pytest.mark.parametrize(
    "call",
    [
        lambda x, out: torch.kthvalue(x, 2, out=out),
        lambda x, out: torch.mode(x, 0, out=out),
        lambda x, out: torch.median(x, 0, out=out),
        lambda x, out: torch.nanmedian(x, 0, out=out),
    ],
)
@pytest.mark.parametrize("values_dtype", [torch.float64, torch.float32])
def test_decomposed_out_of_another_dtype_is_refused_as_cpu(call, values_dtype, eager_mode):
    """A decomposition's out= wrapper casts into the out= tensors; CPU's kernels refuse
    values of another dtype than the input's (tpu wrote them)."""

    def run(d):
        x = torch.tensor([3.0, 1.0, 2.0, 4.0], device=d)  # (no ties: indices are exact)
        out = (
            torch.empty(0, dtype=values_dtype, device=d),
            torch.empty(0, dtype=torch.long, device=d),
        )
        call(x, out)
        return out

    assert_same_outcome(run)


# ------------------------------------------- checks that depend on a number's value

# (name, call(x, number), x, a number CPU accepts, one it refuses). Each call is made
# with the good number first: a repeat call with another number skips the meta kernel
# and the key (the number is passed at run time), so its check must run at every call.
_VALUE_CHECKED = [
    ("pow", lambda x, v: torch.pow(x, v), torch.tensor([1, -2, 3]), 2, -1),
    ("pow_", lambda x, v: x.clone().pow_(v), torch.tensor([1, -2, 3]), 2, -1),
    ("floor_divide", lambda x, v: x // v, torch.tensor([7, -5]), 3, 0),
    ("floor_divide_", lambda x, v: x.clone().floor_divide_(v), torch.tensor([7, -5]), 3, 0),
    ("remainder", lambda x, v: x % v, torch.tensor([7, -5]), 3, 0),
    ("fmod", lambda x, v: torch.fmod(x, v), torch.tensor([7, -5]), 3, 0),
    ("div trunc", lambda x, v: torch.div(x, v, rounding_mode="trunc"), torch.tensor([7, -5]), 3, 0),
    ("div floor", lambda x, v: torch.div(x, v, rounding_mode="floor"), torch.tensor([7, -5]), 3, 0),
    ("clamp int8", lambda x, v: x.clamp(max=v), torch.tensor([1, 2], dtype=torch.int8), 5, 1000),
    ("clamp_min uint8", lambda x, v: x.clamp_min(v), torch.tensor([1, 2], dtype=torch.uint8),
     3, 300),
    ("clamp_ int16", lambda x, v: x.clone().clamp_(v, 9), torch.tensor([1, 2], dtype=torch.int16),
     0, -40000),
]  # fmt: skip


@pytest.mark.parametrize(
    ("call", "x", "good", "bad"),
    [c[1:] for c in _VALUE_CHECKED],
    ids=[c[0] for c in _VALUE_CHECKED],
)
def test_number_values_are_checked_at_every_call(eager_mode, call, x, good, bad):
    """An integer division by a zero number (CPU: ZeroDivisionError), an integer tensor to
    a negative integer power, an integer bound beyond an int8/int16/int32/uint8 tensor's
    type: tpu answered [1, 0, 0], -2, wrapped bounds, at the first call or after a call
    with a good number."""

    def good_then_bad(device):
        t = x.to(device)
        torch.testing.assert_close(call(t, good).cpu(), call(x, good))
        return call(t, bad)

    assert_same_error(good_then_bad)
    assert_same_error(lambda d: call(x.to(d), bad))


def test_numbers_near_the_checked_values_still_compute(eager_mode):
    """The checks refuse only what CPU refuses: a uint8 bound of -1 wraps (c10's
    conversion takes negatives down to -255), float bounds promote, a float tensor divides
    by zero, an integer tensor divides by a float zero into floats."""
    x, u = torch.tensor([7, -5], dtype=torch.int8), torch.tensor([3, 250], dtype=torch.uint8)
    for fn in (
        lambda d: u.to(d).clamp(max=-1),
        lambda d: x.to(d).clamp(max=1000.5),
        lambda d: x.to(d).float() // 0,
        lambda d: x.to(d) // 0.0,
        lambda d: torch.fmod(x.to(d), 0.0),
        lambda d: torch.pow(x.to(d), 0),
    ):
        assert_same_outcome(fn)


@pytest.mark.parametrize("op", ["floor_divide_", "pow_"])
def test_in_place_ops_do_not_resize_their_input_to_broadcast(eager_mode, op):
    """floor_divide_ and pow_ with a tensor argument ran PyTorch's decomposition, which
    resized a (5, 1) input to the broadcast (5, 5) with a warning; CPU refuses."""

    def call(device):
        x = torch.arange(1.0, 6.0, device=device).reshape(5, 1)
        return getattr(x, op)(torch.arange(1.0, 26.0, device=device).reshape(5, 5))

    assert_same_error(call)


def test_nan_to_num_replaces_by_the_input_value_class():
    """A NaN replaced by a number beyond float16 is inf on CPU; tpu replaced that inf
    again, as if it had been an input inf, giving 65504."""
    x = torch.tensor([0.2, float("nan"), float("inf"), -float("inf")], dtype=torch.float16)
    for kwargs in ({"nan": 1e6}, {"nan": 1e6, "posinf": 7.0}, {"neginf": -1e6}, {}):
        expected = torch.nan_to_num(x, **kwargs)
        assert torch.equal(torch.nan_to_num(x.to("tpu"), **kwargs).cpu(), expected), kwargs


_ADDR_MISFITS = [
    ((1, 4), (3,), (4,)), ((4, 3), (3,), (4,)), ((3, 4), (3, 1), (4,)), ((12,), (3,), (4,)),
    ((), (3,), (4,)),
]  # fmt: skip


@pytest.mark.parametrize("shapes", _ADDR_MISFITS)
def test_addr_in_place_refuses_an_input_of_another_shape(eager_mode, shapes):
    """In place, addr_'s input is not broadcast: CPU refuses any but the (3, 4) matrix.
    PyTorch's composite, which tpu ran, resized a 0-d or (12,) input to (3, 4)."""
    self_shape, v1_shape, v2_shape = shapes

    def call(device):
        v1 = torch.arange(1.0, 4.0, device=device).reshape(v1_shape)
        v2 = torch.ones(v2_shape, device=device)
        return torch.ones(self_shape, device=device).addr_(v1, v2)

    assert_same_error(call)

    def good(device):
        vectors = torch.arange(3.0, device=device), torch.arange(4.0, device=device)
        return torch.ones(3, 4, device=device).addr_(*vectors, beta=0.5, alpha=2)

    assert_same_outcome(good)


@pytest.mark.parametrize("source", [torch.int64, torch.int32, torch.bool, torch.float32])
@pytest.mark.parametrize("target", [torch.int64, torch.float32])
def test_nansum_into_out_as_cpu(source, target):
    """CPU sums an integer or bool input into any out= (it takes sum's path) and refuses
    only a floating input into an integer out; tpu refused every integer out."""
    assert_same_outcome(
        lambda d: torch.nansum(
            torch.tensor([1, 2], device=d).to(source), out=torch.empty((), dtype=target, device=d)
        )
    )


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
def test_ldexp_in_place_refuses_an_integer_input(dtype):
    """ldexp's result is floating; CPU refuses to write it into an integer tensor in
    place, and tpu wrote it, truncated."""
    assert_same_error(
        lambda d: torch.tensor([1, 2], dtype=dtype, device=d).ldexp_(torch.tensor([1, 2], device=d))
    )
