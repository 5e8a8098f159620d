"""nn.EmbeddingBag / F.embedding_bag on tpu match the CPU, forward and backward (weight
and per-sample-weight gradients), in every mode, without any CPU fallback."""

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_same_error


@pytest.fixture(params=["strict", "fused"])
def mode(request):
    with torch.tpu.set_eager_mode(request.param):
        yield request.param


def check(weight, indices, offsets=None, per_sample_weights=None, **kwargs):
    """F.embedding_bag on CPU and on tpu: output, weight gradient and per-sample-weight
    gradient agree; the loss weighs each output element differently."""
    results = []
    cotangent = None
    for device in ("cpu", "tpu"):
        w = weight.detach().to(device).requires_grad_()
        psw = None
        if per_sample_weights is not None:
            psw = per_sample_weights.detach().to(device).requires_grad_()
        off = None if offsets is None else offsets.to(device)
        out = F.embedding_bag(indices.to(device), w, off, per_sample_weights=psw, **kwargs)
        if cotangent is None:
            cotangent = torch.randn(out.shape, dtype=out.dtype)
        (out * cotangent.to(device)).sum().backward()
        results.append((out, w.grad, None if psw is None else psw.grad))
    (out, gw, gp), (t_out, t_gw, t_gp) = results
    assert t_out.device.type == "tpu"
    torch.testing.assert_close(t_out.detach().cpu(), out.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(t_gw.cpu(), gw, atol=1e-5, rtol=1e-5)
    if gp is not None:
        torch.testing.assert_close(t_gp.cpu(), gp, atol=1e-5, rtol=1e-5)


INDICES = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 0, 4])
OFFSETS = torch.tensor([0, 3, 3, 7])  # bag 1 is empty


@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_offsets(reduce, mode, no_cpu_fallback):
    check(torch.randn(10, 3), INDICES, OFFSETS, mode=reduce)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_include_last_offset(reduce, mode, no_cpu_fallback):
    offsets = torch.tensor([0, 3, 3, 7, 10])
    check(torch.randn(10, 3), INDICES, offsets, mode=reduce, include_last_offset=True)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_padding_idx(reduce, mode, no_cpu_fallback):
    check(torch.randn(10, 3), INDICES, OFFSETS, mode=reduce, padding_idx=4)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_2d_input(reduce, mode, no_cpu_fallback):
    check(torch.randn(10, 3), INDICES.reshape(2, 5), mode=reduce)


def test_per_sample_weights(mode, no_cpu_fallback):
    check(torch.randn(10, 3), INDICES, OFFSETS, torch.randn(10), mode="sum")
    check(torch.randn(10, 3), INDICES, OFFSETS, torch.randn(10), mode="sum", padding_idx=2)


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_scale_grad_by_freq_equal_counts(reduce, mode, no_cpu_fallback):
    """Every index occurs twice: PyTorch 2.13's CPU kernel is right on such input."""
    indices = torch.tensor([3, 1, 3, 0, 1, 0])
    check(torch.randn(5, 3), indices, torch.tensor([0, 2, 3]), mode=reduce, scale_grad_by_freq=True)


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_scale_grad_by_freq_mixed_counts(reduce, mode, no_cpu_fallback):
    """With indices of different frequencies PyTorch 2.13's CPU embedding_bag divides
    some rows by another index's count (pytorch/pytorch#190063; CUDA and nn.Embedding
    divide by the row's own frequency, as documented). The oracle is therefore the same
    bags built on CPU from F.embedding, whose scale_grad_by_freq is right."""
    weight = torch.randn(10, 3)
    bag = torch.tensor([0, 0, 0, 2, 2, 2, 2, 3, 3, 3])  # OFFSETS' bag of each position
    cotangent = torch.randn(4, 3)
    w = weight.clone().requires_grad_()
    rows = F.embedding(INDICES, w, scale_grad_by_freq=True)
    expected = torch.zeros(4, 3).index_add(0, bag, rows)
    if reduce == "mean":
        expected = expected / torch.bincount(bag, minlength=4).clamp(min=1)[:, None]
    (expected * cotangent).sum().backward()
    t = weight.to("tpu").requires_grad_()
    actual = F.embedding_bag(
        INDICES.to("tpu"), t, OFFSETS.to("tpu"), mode=reduce, scale_grad_by_freq=True
    )
    (actual * cotangent.to("tpu")).sum().backward()
    torch.testing.assert_close(actual.detach().cpu(), expected.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(t.grad.cpu(), w.grad, atol=1e-5, rtol=1e-5)


def test_max_ties_pick_first(mode, no_cpu_fallback):
    weight = torch.tensor([[1.0, 2.0], [1.0, 0.0], [0.0, 2.0]])
    check(weight, torch.tensor([0, 1, 2, 2, 1]), torch.tensor([0, 3]), mode="max")


def test_module_int32_and_no_grad(mode, no_cpu_fallback):
    bag = torch.nn.EmbeddingBag(10, 4, mode="mean")
    twin = torch.nn.EmbeddingBag(10, 4, mode="mean", _weight=bag.weight.detach().to("tpu"))
    indices, offsets = INDICES.int(), OFFSETS.int()
    with torch.no_grad():  # _embedding_bag_forward_only
        expected = bag(indices, offsets)
        actual = twin(indices.to("tpu"), offsets.to("tpu"))
    torch.testing.assert_close(actual.cpu(), expected)


def test_bfloat16(mode, no_cpu_fallback):
    weight = torch.randn(10, 3, dtype=torch.bfloat16)
    for reduce in ("sum", "mean", "max"):
        expected = F.embedding_bag(INDICES, weight, OFFSETS, mode=reduce)
        actual = F.embedding_bag(
            INDICES.to("tpu"), weight.to("tpu"), OFFSETS.to("tpu"), mode=reduce
        )
        assert actual.dtype == torch.bfloat16
        torch.testing.assert_close(actual.cpu(), expected, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize(
    ("index_dtype", "offset_dtype"), [(torch.int32, torch.int64), (torch.int64, torch.int32)]
)
def test_mixed_index_and_offset_dtypes_forward_and_backward(index_dtype, offset_dtype, mode):
    """PyTorch's test_embedding mixes them; the backward's first-call dtype check must not
    mistake its stand-ins' refusal for CPU's verdict (our forward's index dtypes)."""
    check(
        torch.randn(10, 3),
        INDICES.to(index_dtype),
        OFFSETS.to(offset_dtype),
        torch.randn(10),
        mode="sum",
    )


@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_empty_input_gives_empty_bags(reduce, mode, no_cpu_fallback):
    """max mode failed inside its lowering (it indexed the empty input)."""
    check(torch.randn(10, 3), torch.tensor([], dtype=torch.long), torch.tensor([0, 0]), mode=reduce)
    check(
        torch.randn(10, 3),
        torch.tensor([], dtype=torch.long),
        torch.tensor([], dtype=torch.long),
        mode=reduce,
    )


@pytest.mark.parametrize("include_last_offset", [False, True])
def test_max_mode_indices_without_bags_raise_a_clear_error(include_last_offset, mode):
    """CPU's kernel crashes the process on this call (segfault, PyTorch 2.13); tpu ran that
    kernel on stand-ins to check dtypes, and crashed too. Now a RuntimeError says why."""
    offsets = torch.tensor([0] if include_last_offset else [], dtype=torch.long, device="tpu")
    with pytest.raises(RuntimeError, match="no bags"):
        F.embedding_bag(
            torch.tensor([1, 2], device="tpu"),
            torch.randn(5, 3, device="tpu"),
            offsets,
            mode="max",
            include_last_offset=include_last_offset,
        )


@pytest.mark.parametrize(
    "op", [torch.embedding_bag, torch._embedding_bag, torch._embedding_bag_forward_only]
)
@pytest.mark.parametrize(
    ("weight", "indices", "offsets"),
    [
        ((2, 6), (2, 0, 0, 6, 6), (2, 0, 0, 6, 6)),  # input checked first
        ((2, 6), (2,), (2, 0, 0, 6, 6)),
        ((2, 2, 2), (2,), (2,)),
        ((2, 2, 2), (3,), (2, 2)),  # offsets before weight
        ((4,), (3,), (1,)),
        ((2, 6), (), (1,)),
    ],
)
def test_argument_ranks_raise_as_on_cpu(op, weight, indices, offsets):
    """CPU checks each argument's rank, in its order and words (PyTorch's
    test_embedding_bag_dimension_errors); the lowering failed inside JAX on them."""
    assert_same_error(
        lambda device: op(
            torch.zeros(weight, device=device),
            torch.ones(indices, dtype=torch.long, device=device),
            torch.zeros(offsets, dtype=torch.long, device=device),
        )
    )


@pytest.mark.parametrize("op", [torch.embedding_bag, torch._embedding_bag])
def test_two_d_indices_given_to_the_op_itself_raise_a_clear_error(op):
    """CPU's kernel sums 2-D indices flattened but sizes the bags (mean's divisor, offsets'
    bound) by their first dimension, so its results depend on which of the two a mode reads;
    tpu raised "lowering produced shape (2, 2, 3)". Now a RuntimeError says why, and the
    functional form, which flattens them with its own offsets, matches CPU."""
    weight, indices = torch.randn(10, 3), torch.tensor([[1, 2, 2], [3, 4, 9]])
    with pytest.raises(RuntimeError, match="2-D indices passed to the op itself"):
        op(weight.to("tpu"), indices.to("tpu"), torch.tensor([0, 1], device="tpu"))
    torch.testing.assert_close(
        F.embedding_bag(indices.to("tpu"), weight.to("tpu"), mode="mean").cpu(),
        F.embedding_bag(indices, weight, mode="mean"),
    )
