"""Shape family on tpu agrees with the CPU: joins, flips, pads, triangles, copies,
and the backward/scatter ops of views, forward and backward, without CPU fallback."""

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_same, assert_same_grad, lowered_packets, no_fallback, packet

_OURS = lowered_packets("shape") | {
    "clone", "_to_copy", "copy", "split", "unbind", "expand_copy", "permute_copy"
}  # fmt: skip


@pytest.fixture(autouse=True)
def _no_fallback_of_ours():
    with no_fallback("shape", lambda op: packet(op) in _OURS):
        yield


DTYPES = [torch.float32, torch.int64, torch.bool, torch.bfloat16]


def _x(dtype=torch.float32, shape=(3, 4, 5)):
    x = torch.randn(shape) * 3
    return x.round().to(dtype) if dtype in (torch.int64, torch.bool) else x.to(dtype)


def _strided(x):
    """Non-contiguous: every other element of the last dim of a wider tensor."""
    wide = torch.zeros(*x.shape[:-1], 2 * x.shape[-1], dtype=x.dtype)
    wide[..., ::2] = x
    return wide[..., ::2]


def _permuted(x):
    return x.permute(2, 0, 1).contiguous().permute(1, 2, 0)


LAYOUTS = [lambda x: x, _strided, _permuted]


# ------------------------------------------------------------------ forward


CASES = {
    "cat": lambda t: torch.cat([t, t[:, :2]], 1),
    "cat_neg": lambda t: torch.cat([t, t], -1),
    "cat_legacy_empty": lambda t: torch.cat([t, t.new_zeros(0)]),
    "stack": lambda t: torch.stack([t, t], -2),
    "split": lambda t: t.split([1, 3], 1),
    "chunk": lambda t: t.chunk(2, -1),
    "unbind": lambda t: t.unbind(2),
    "flip": lambda t: t.flip(0, -1),
    "roll": lambda t: t.roll((1, -2), (0, -1)),
    "roll_flat": lambda t: t.roll(7),
    "repeat": lambda t: t.repeat(2, 1, 1, 2),
    "tile": lambda t: t.tile(2, 1),
    "tril": lambda t: t.tril(1),
    "triu": lambda t: t.triu(-1),
    "clone": lambda t: t.clone(),
    "contiguous": lambda t: t.transpose(0, 2).contiguous(),
    "channels_last": lambda t: t[None].contiguous(memory_format=torch.channels_last),
    "diag_embed": lambda t: torch.diag_embed(t, 1, 0, 2),
    "narrow_copy": lambda t: t.narrow_copy(-1, -3, 2),
    "expand_copy": lambda t: torch.ops.aten.expand_copy(t[:, :1], (2, 3, 4, 5)),
    "permute_copy": lambda t: torch.ops.aten.permute_copy(t, (2, 0, 1)),
    "alias_copy": lambda t: torch.ops.aten.alias_copy(t),
    "rot90": lambda t: t.rot90(1, (0, 2)),
    "where_one_arg": lambda t: torch.where(t),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(CASES))
def test_shape_ops(case, dtype):
    assert_same(CASES[case], _x(dtype))


@pytest.mark.parametrize("layout", LAYOUTS[1:])
def test_noncontiguous(layout):
    x = layout(_x())
    assert_same(lambda t: (torch.cat([t, t], -1), torch.stack([t, t]), t.flip(1)), x)
    assert_same(lambda t: (t.roll(1, 2), t.repeat(1, 2, 1), t.tril(), t.triu(2)), x)
    assert_same(lambda t: (F.pad(t, (1, 2)), F.pad(t, (2, 1), mode="reflect")), x)
    assert_same(lambda t: (t.clone(), t.contiguous(), t.to(torch.bfloat16)), x)
    assert_same(lambda t: (torch.diag_embed(t), t.narrow_copy(2, 1, 3)), x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_constant_pad(dtype):
    x = _x(dtype)
    assert_same(lambda t: F.pad(t, (1, 2), value=1), x)
    assert_same(lambda t: F.pad(t, (1, 2, -1, 1, 0, 1)), x)
    assert_same(lambda t: torch.ops.aten.constant_pad_nd(t, (0, -2)), x)


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
@pytest.mark.parametrize("pad", [(2, 1), (2, 1, 1, 3), (1, 1, 2, 0, 1, 1)])
def test_mode_pad(mode, pad):
    x = _x(shape=(2, 3, 4, 5))
    if len(pad) == 2:
        x = x[0]
    assert_same(lambda t: F.pad(t, pad, mode=mode), x)
    assert_same_grad(lambda t: F.pad(t, pad, mode=mode) * 1.5, x)


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
def test_mode_pad_negative(mode):
    x = _x(shape=(2, 4, 5))
    pads = [(-1, 2), (2, -1, -1, 1)] + ([(-5, 6, 0, 0)] if mode == "replicate" else [])
    for pad in pads:
        assert_same(lambda t, p=pad: F.pad(t, p, mode=mode), x)
        assert_same_grad(lambda t, p=pad: F.pad(t, p, mode=mode) * 1.5, x)


def test_mode_pad_bfloat16():
    x = _x(torch.bfloat16, (2, 4, 5))
    assert_same(lambda t: F.pad(t, (2, 1), mode="reflect"), x)
    assert_same(lambda t: F.pad(t, (1, 2, 3, 1), mode="replicate"), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
@pytest.mark.parametrize("to", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_to_copy(dtype, to):
    assert_same(lambda t: t.to(to), _x(dtype))


def test_fill_views():
    def fn(t):
        t = t.clone()
        t[:, 1].fill_(7)
        t.transpose(0, 2)[1:].zero_()
        t[..., ::2].fill_(torch.tensor(-1.0, device=t.device))
        return t

    assert_same(fn, _x())


# ---------------------------------------------------- view backwards, scatters


def test_view_scatters():
    x = _x()
    assert_same(lambda t: torch.slice_scatter(t, t[:, ::2] * 2, 1, 0, None, 2), x)
    assert_same(lambda t: torch.slice_scatter(t, t[..., 1:-1] * 2, -1, -4, -1), x)
    assert_same(lambda t: torch.select_scatter(t, t[:, 0] * 2, 1, -1), x)
    assert_same(lambda t: torch.diagonal_scatter(t, t.diagonal(1, 1, 2) * 2, 1, 1, 2), x)
    assert_same(lambda t: torch.diagonal_scatter(t, t.diagonal(-1, 2, 0) * 2, -1, 2, 0), x)


GRAD_CASES = {
    "cat": lambda t: torch.cat([t, t * 2], -1),
    "stack": lambda t: torch.stack([t, t], 1),
    "split": lambda t: t.split([1, 3], 1)[1],
    "unbind": lambda t: t.unbind(-1)[2],
    "flip": lambda t: t.flip(0, -1),
    "roll": lambda t: t.roll((1, -2), (0, 2)),
    "repeat": lambda t: t.repeat(2, 1, 1, 2),
    "constant_pad": lambda t: F.pad(t, (1, 2, -1, 1), value=3.0),
    "tril": lambda t: t.tril(1),
    "triu": lambda t: t.triu(-1),
    "clone": lambda t: t.transpose(0, 2).contiguous(),
    "to_bfloat16": lambda t: t.to(torch.bfloat16),
    "diag_embed": lambda t: torch.diag_embed(t, -1),
    "diagonal": lambda t: t.diagonal(1, 0, 2),
    "diagonal_neg": lambda t: t.diagonal(-1, -1, 1),
    "select": lambda t: t.select(1, -1),
    "slice": lambda t: t[:, 1:4:2],
    "narrow": lambda t: t.narrow(2, -3, 2),
    "unfold": lambda t: t.unfold(2, 2, 1),
    "unfold_step": lambda t: t.unfold(1, 2, 2),
    "unfold_scalar": lambda t: t[0, 0, 0].unfold(0, 1, 1),
}


def _weighted(out):
    """Distinct weights per output element, so a misplaced gradient shows."""
    return out * torch.arange(out.numel()).reshape(out.shape).to(out.device)


@pytest.mark.parametrize("case", list(GRAD_CASES))
def test_grad(case):
    assert_same_grad(lambda t: _weighted(GRAD_CASES[case](t)), _x())


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
@pytest.mark.parametrize("dims", [2, 3])
def test_pads_of_channels_last_tensors_stay_channels_last_as_on_cpu(mode, dims, eager_mode):
    """PyTorch's meta kernels (tpu's result layouts) gave contiguous results; CPU keeps
    the input's memory format."""
    memory_format = torch.channels_last if dims == 2 else torch.channels_last_3d
    x = torch.randn(2, 3, *(5,) * dims).contiguous(memory_format=memory_format)
    pad = (1, 2) * dims
    expected = F.pad(x, pad, mode=mode)
    actual = F.pad(x.to("tpu"), pad, mode=mode)
    assert actual.stride() == expected.stride()
    torch.testing.assert_close(actual.cpu(), expected)


LAYOUT_KEEPING_OPS = {
    "roll": lambda t: t.roll(1, 2),
    "roll flat": lambda t: t.roll(3),
    "pixel_shuffle": lambda t: F.pixel_shuffle(t, 2),
    "pixel_shuffle to one channel": lambda t: F.pixel_shuffle(t[:, :4], 2),
    "pixel_unshuffle": lambda t: F.pixel_unshuffle(t, 2),
}


@pytest.mark.parametrize("case", list(LAYOUT_KEEPING_OPS))
@pytest.mark.parametrize("channels_last", [True, False])
def test_roll_and_pixel_shuffles_keep_cpus_layout(case, channels_last, eager_mode):
    """CPU's kernels give a channels_last input a channels_last result; PyTorch's meta
    kernel (roll) and decomposition (pixel_shuffle, as CUDA runs) gave contiguous, so
    code viewing the result as channels_last raised on tpu only. Gradients too."""
    op = LAYOUT_KEEPING_OPS[case]
    x = torch.randn(2, 8, 4, 6)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    xt = x.to("tpu").requires_grad_()
    x.requires_grad_()
    expected, actual = op(x), op(xt)
    assert actual.stride() == expected.stride()
    torch.testing.assert_close(actual.cpu(), expected)
    weights = torch.randn(expected.shape)
    (expected * weights).sum().backward()
    (actual * weights.to("tpu")).sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), x.grad)


def _ones(d, *shape, dtype=torch.float32):
    return torch.ones(*shape, dtype=dtype, device=d)


# joins into an out= whose dtype the inputs' cannot be cast to, and CPU's checks that
# come before that one (a 0-dim input, the dim, stack's sizes; cat's sizes come after)
JOIN_OUT_ERRORS = {
    "cat": lambda d: torch.cat([_ones(d, 2)] * 2, out=_ones(d, 4, dtype=torch.long)),
    "concat": lambda d: torch.concat([_ones(d, 2)] * 2, out=_ones(d, 4, dtype=torch.long)),
    "concatenate": lambda d: torch.concatenate(
        [_ones(d, 2)] * 2, out=_ones(d, 4, dtype=torch.long)
    ),
    "stack": lambda d: torch.stack([_ones(d, 2)] * 2, out=_ones(d, 2, 2, dtype=torch.long)),
    "hstack": lambda d: torch.hstack([_ones(d, 2)] * 2, out=_ones(d, 4, dtype=torch.long)),
    "vstack": lambda d: torch.vstack([_ones(d, 2)] * 2, out=_ones(d, 2, 2, dtype=torch.long)),
    "dstack": lambda d: torch.dstack([_ones(d, 2)] * 2, out=_ones(d, 1, 2, 2, dtype=torch.long)),
    "column_stack": lambda d: torch.column_stack(
        [_ones(d, 2)] * 2, out=_ones(d, 2, 2, dtype=torch.long)
    ),
    "complex into float": lambda d: torch.cat(
        [_ones(d, 2, dtype=torch.cfloat)] * 2, out=_ones(d, 4)
    ),
    "float into bool": lambda d: torch.cat([_ones(d, 2)] * 2, out=_ones(d, 4, dtype=torch.bool)),
    "mixed inputs into int": lambda d: torch.cat(
        [_ones(d, 2, dtype=torch.int32), _ones(d, 2, dtype=torch.half)],
        out=_ones(d, 4, dtype=torch.int32),
    ),
    "legacy empty input": lambda d: torch.cat(
        [_ones(d, 2, dtype=torch.long), _ones(d, 0)], out=_ones(d, 2, dtype=torch.long)
    ),
    "cat sizes differ": lambda d: torch.cat(
        [_ones(d, 2, 3), _ones(d, 2, 4)], out=_ones(d, 14, dtype=torch.long)
    ),
    "cat dim out of range": lambda d: torch.cat(
        [_ones(d, 2)] * 2, dim=3, out=_ones(d, 4, dtype=torch.long)
    ),
    "cat of 0-dim": lambda d: torch.cat([_ones(d)] * 2, out=_ones(d, 2, dtype=torch.long)),
    "cat of 0-dim, no out": lambda d: torch.cat([_ones(d)] * 2),
    "cat of none": lambda d: torch.cat([], out=_ones(d, 2, dtype=torch.long)),
    "stack sizes differ": lambda d: torch.stack(
        [_ones(d, 2), _ones(d, 3)], out=_ones(d, 4, dtype=torch.long)
    ),
    "stack dim out of range": lambda d: torch.stack(
        [_ones(d, 2)] * 2, dim=5, out=_ones(d, 4, dtype=torch.long)
    ),
}


@pytest.mark.parametrize("case", list(JOIN_OUT_ERRORS))
def test_joins_refuse_an_out_dtype_as_cpu_does(case, eager_mode):
    """CPU's cat raises TypeError ("torch.cat(): input types can't be cast to the desired
    output type Long"); tpu's generic out= check raised RuntimeError in other words."""
    expected_type = type(_raised(JOIN_OUT_ERRORS[case], "cpu"))
    actual = _raised(JOIN_OUT_ERRORS[case], "tpu")
    assert isinstance(actual, expected_type), f"{type(actual).__name__}: {actual}"
    if case != "stack sizes differ":  # (the meta kernel's message prints torch.Size([2]))
        assert str(_raised(JOIN_OUT_ERRORS[case], "cpu")) in str(actual)


def _raised(fn, device) -> Exception:
    try:
        fn(device)
    except Exception as e:  # the outcome under test
        return e
    raise AssertionError(f"no error on {device}")


def test_joins_into_an_out_its_dtype_can_hold_still_cast(eager_mode):
    for inputs, out_dtype in [
        ([torch.arange(2), torch.arange(2)], torch.float32),
        ([torch.ones(2, dtype=torch.float64)] * 2, torch.float32),
        ([torch.ones(2, dtype=torch.bool)] * 2, torch.int8),
    ]:
        for join in (torch.cat, torch.stack):
            expected = join(inputs, out=torch.empty(0, dtype=out_dtype))
            out = torch.empty(0, dtype=out_dtype, device="tpu")
            assert join([t.to("tpu") for t in inputs], out=out) is out
            assert out.dtype == out_dtype
            torch.testing.assert_close(out.cpu(), expected)
