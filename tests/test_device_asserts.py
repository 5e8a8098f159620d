"""Index values out of range, and other values CPU refuses at the call (zeros in an
integer divisor, probabilities outside [0, 1], invalid distributions, a negative std,
margin-loss classes out of range): tpu checks them on the device and raises CPU's error
type at the next host read, in every eager mode (before, strict and fused modes clamped,
dropped or computed with them and returned wrong numbers without an error)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_tpu


def _t(values, device):
    return torch.tensor(values, device=device)


def _weights(device):
    return torch.arange(40.0).view(10, 4).to(device)


def _scores(device):
    return torch.arange(20.0).view(4, 5).to(device)


CASES = {
    "embedding past the vocabulary": lambda d: F.embedding(_t([1, 12], d), _weights(d)),
    "embedding negative": lambda d: F.embedding(_t([-1, 2], d), _weights(d)),
    "cross_entropy class past the classes": lambda d: F.cross_entropy(
        _scores(d), _t([0, 1, 7, 2], d)
    ),
    "cross_entropy negative class": lambda d: F.cross_entropy(_scores(d), _t([0, -3, 1, 2], d)),
    "nll_loss2d": lambda d: F.nll_loss(
        torch.zeros(2, 3, 4, 4, device=d), torch.full((2, 4, 4), 3, device=d)
    ),
    "gather": lambda d: _scores(d).gather(1, _t([[0], [5], [1], [1]], d)),
    "scatter_add": lambda d: torch.zeros(3, device=d).scatter_add(
        0, _t([3], d), torch.ones(1, device=d)
    ),
    "one_hot": lambda d: F.one_hot(_t([0, 3], d), 3),
    "x[idx]": lambda d: _scores(d)[_t([0, 4], d)],
    "x[idx] negative": lambda d: _scores(d)[_t([-5], d)],
    "x[:, idx]": lambda d: _scores(d)[:, _t([5], d)],
    "index_select negative": lambda d: _scores(d).index_select(0, _t([3, -1], d)),
    "index_put_": lambda d: _scores(d).index_put_((_t([9], d),), torch.tensor(1.0, device=d)),
    "take": lambda d: _scores(d).take(_t([20], d)),
    "embedding_bag past the rows": lambda d: F.embedding_bag(
        _t([1, 12], d), _weights(d), _t([0], d)
    ),
    "embedding_bag offsets past the input": lambda d: F.embedding_bag(
        _t([1, 2], d), _weights(d), _t([0, 5], d)
    ),
    "embedding_bag first offset not 0": lambda d: F.embedding_bag(
        _t([1, 2], d), _weights(d), _t([1, 2], d)
    ),
    "index_fill past the end": lambda d: _scores(d).index_fill(1, _t([5], d), 1.0),
    "index_fill negative": lambda d: _scores(d).index_fill(1, _t([-6], d), 1.0),
    "put": lambda d: _scores(d).put(_t([20], d), torch.ones(1, device=d)),
    "put negative": lambda d: _scores(d).put(_t([-21], d), torch.ones(1, device=d)),
    "index_add_": lambda d: torch.zeros(3, device=d).index_add_(
        0, _t([3], d), torch.ones(1, device=d)
    ),
    # an index past its 2x4 plane: PyTorch's decomposition wrote it into the next channel
    "max_unpool2d past the plane": lambda d: F.max_unpool2d(
        torch.ones(1, 2, 1, 2, device=d), _t([[[[0, 9]], [[0, 1]]]], d), 2
    ),
    "max_unpool1d negative": lambda d: F.max_unpool1d(
        torch.ones(1, 1, 2, device=d), _t([[[0, -1]]], d), 2
    ),
    "max_unpool3d past the volume": lambda d: F.max_unpool3d(
        torch.ones(1, 1, 1, 1, 2, device=d), _t([[[[[0, 16]]]]], d), 2
    ),
    "normal with a negative std": lambda d: torch.normal(
        torch.zeros(2, device=d), torch.tensor([1.0, -1.0], device=d)
    ),
    "normal with a NaN std": lambda d: torch.normal(0.5, torch.tensor([float("nan")], device=d)),
    "binary_cross_entropy input above 1": lambda d: F.binary_cross_entropy(
        torch.tensor([0.5, 1.5], device=d), torch.tensor([0.0, 1.0], device=d)
    ),
    "binary_cross_entropy NaN input": lambda d: F.binary_cross_entropy(
        torch.tensor([float("nan")], device=d), torch.tensor([1.0], device=d)
    ),
    "binary_cross_entropy target 2": lambda d: F.binary_cross_entropy(
        torch.tensor([0.5], device=d), torch.tensor([2.0], device=d)
    ),
    "bernoulli p above 1": lambda d: torch.bernoulli(torch.tensor([0.5, 1.5], device=d)),
    "bernoulli_ negative p": lambda d: torch.zeros(2, device=d).bernoulli_(
        torch.tensor([0.2, -0.1], device=d)
    ),
    "multinomial negative": lambda d: torch.multinomial(torch.tensor([0.5, -0.5, 1], device=d), 2),
    "multinomial inf": lambda d: torch.multinomial(torch.tensor([1.0, float("inf")], device=d), 1),
    "multi_margin_loss class past the classes": lambda d: F.multi_margin_loss(
        _scores(d), _t([0, 1, 5, 2], d)
    ),
    "multi_margin_loss negative class": lambda d: F.multi_margin_loss(
        _scores(d), _t([0, -1, 1, 2], d)
    ),
    "multilabel_margin_loss class past the classes": lambda d: F.multilabel_margin_loss(
        _scores(d)[:1, :3], _t([[0, 3, -1]], d)
    ),
    "multilabel_margin_loss below -1": lambda d: F.multilabel_margin_loss(
        _scores(d)[:1, :3], _t([[0, -2, 1]], d)
    ),
    "index_copy past the end": lambda d: torch.zeros(3, device=d).index_copy(
        0, _t([5], d), torch.ones(1, device=d)
    ),
    "multinomial row of zeros": lambda d: torch.multinomial(
        torch.tensor([[0.0, 0.0], [1.0, 1.0]], device=d), 4, replacement=True
    ),
}


def _cpu_error(fn) -> type:
    with pytest.raises(Exception) as raised:
        fn("cpu")
    return type(raised.value)


@pytest.mark.parametrize("case", CASES)
def test_an_index_out_of_range_raises_cpus_error_type_by_the_next_read(case, eager_mode):
    fn = CASES[case]
    expected = _cpu_error(fn)
    with pytest.raises(expected) as raised:
        fn("tpu").cpu()
    if eager_mode != "debug":  # (debug mode raises at the call, with CPU's own words)
        assert "since the last host read" in str(raised.value)
    # reported once: the device goes on, and the next reads see no error
    torch.tpu.synchronize()
    assert torch.ones(2, device="tpu").sum().item() == 2.0


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_the_error_names_the_op_and_waits_for_a_read(mode):
    with torch.tpu.set_eager_mode(mode):
        weights = _weights("tpu")
        rows = F.embedding(_t([1, 12], "tpu"), weights)  # no error yet: nothing was read
        doubled = rows * 2
        with pytest.raises(IndexError, match=r"index out of range in self.*embedding"):
            torch.tpu.synchronize()
        assert torch.equal(weights.cpu(), _weights("cpu"))  # reported once
        del doubled


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_values_cpu_accepts_compute_cpus_results_without_an_error(mode):
    cases = [
        lambda d: _scores(d)[_t([-4, 3], d)],  # negatives from -size
        lambda d: _scores(d).take(_t([-20, 19], d)),
        lambda d: F.cross_entropy(_scores(d), _t([0, -100, 4, 2], d)),  # ignore_index
        lambda d: F.embedding(_t([0, 9], d), _weights(d)),
        lambda d: _scores(d).gather(1, _t([[0], [4], [1], [1]], d)),
        lambda d: F.one_hot(_t([0, 2], d), 3),
        lambda d: _scores(d).index_fill(1, _t([-5, 4], d), 1.0),
        lambda d: _scores(d).put(_t([-20, 19], d), torch.ones(2, device=d)),
        lambda d: F.embedding_bag(_t([1, 9, 0], d), _weights(d), _t([0, 2], d), mode="max"),
        lambda d: F.max_unpool2d(
            torch.ones(1, 2, 1, 2, device=d), _t([[[[0, 7]], [[0, 1]]]], d), 2
        ),
        lambda d: torch.normal(torch.ones(2, device=d), torch.tensor([0.0, -0.0], device=d)),
        lambda d: F.binary_cross_entropy(
            torch.tensor([0.0, 1.0, 0.5], device=d), torch.tensor([0.0, 1.0, 1.0], device=d)
        ),
        lambda d: torch.bernoulli(torch.tensor([0.0, 1.0], device=d)),
        lambda d: torch.multinomial(torch.tensor([[0.0, 2.0], [1.0, 0.0]], device=d), 1),
        lambda d: F.multi_margin_loss(_scores(d), _t([0, 4, 1, 2], d)),
        lambda d: F.multilabel_margin_loss(_scores(d)[:2, :3], _t([[0, -1, 2], [2, 1, -1]], d)),
    ]
    with torch.tpu.set_eager_mode(mode):
        for fn in cases:
            torch.testing.assert_close(fn("tpu").cpu(), fn("cpu"))
        torch.tpu.synchronize()


def test_an_in_place_checked_op_still_donates_its_buffer():
    with torch.tpu.set_eager_mode("strict"):
        x = torch.zeros(1000, device="tpu")
        index, ones = _t([3, 5], "tpu"), torch.ones(2, device="tpu")
        x.index_add_(0, index, ones)
        torch_tpu.metrics.reset()
        x.index_add_(0, index, ones)
        assert torch_tpu.metrics.snapshot().get("buffers_donated") == 1  # x's, not the flag's
        assert x.sum().item() == 4.0


def test_compiled_graphs_check_index_values_too():
    embedding, head = torch.nn.Embedding(10, 4).to("tpu"), torch.nn.Linear(4, 5).to("tpu")

    def step(tokens, target):
        return F.cross_entropy(head(embedding(tokens)), target)

    compiled = torch.compile(step, backend="tpu")
    good = (_t([1, 2], "tpu"), _t([0, 4], "tpu"))
    torch.testing.assert_close(compiled(*good).cpu(), step(*good).cpu())
    for tokens, target, op in [([1, 12], [0, 4], "embedding"), ([1, 2], [0, 5], "nll_loss")]:
        with pytest.raises(IndexError, match=op):
            compiled(_t(tokens, "tpu"), _t(target, "tpu")).item()
    compiled(*good).backward()  # the graph goes on, with its backward
    assert embedding.weight.grad[1:3].abs().sum().item() > 0


DIVISIONS = {
    "x // y": lambda x, y: x // y,
    "remainder": torch.remainder,
    "fmod": torch.fmod,
    "div trunc": lambda x, y: torch.div(x, y, rounding_mode="trunc"),
    "div floor out=": lambda x, y: torch.div(x, y, rounding_mode="floor", out=torch.empty_like(x)),
    "number % y": lambda x, y: torch.remainder(5, y),
    "x //= y": lambda x, y: x.clone().floor_divide_(y),
    "uint8 %": lambda x, y: x.to(torch.uint8) % y.to(torch.uint8),
}


@pytest.mark.parametrize("case", DIVISIONS)
def test_an_integer_division_by_a_device_zero_raises_cpus_error(case, eager_mode):
    """CPU raises `RuntimeError: ZeroDivisionError` for a zero in an integer divisor;
    tpu gave XLA's quotients (-1, x, ...) without an error when the divisor was a tpu
    tensor."""
    fn = DIVISIONS[case]
    x, y = torch.tensor([7, -8, 9]), torch.tensor([2, 0, 3])
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        fn(x, y)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        fn(x.to("tpu"), y.to("tpu")).cpu()
    nonzero = torch.tensor([2, -5, 3])
    torch.testing.assert_close(fn(x.to("tpu"), nonzero.to("tpu")).cpu(), fn(x, nonzero))


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_divisions_that_cannot_divide_an_integer_by_zero_carry_no_check(mode):
    """Float divisions (inf and NaN, as on CPU), a divisor given as a number (checked on
    the host at the call) and an empty result leave nothing for the next read to check:
    no flag, and strict mode's plain fast path."""
    from torch_tpu.engine import device_asserts

    x, y = torch.tensor([7, -8, 9]), torch.tensor([2, 0, 3])
    tx, ty = x.to("tpu"), y.to("tpu")
    with torch.tpu.set_eager_mode(mode):
        torch.tpu.synchronize()
        results = [tx.float() // ty, torch.fmod(tx, ty.double()), tx // 2, tx % 3]
        assert not device_asserts._unread
        for got, want in zip(results, [x.float() // y, torch.fmod(x, y.double()), x // 2, x % 3]):
            torch.testing.assert_close(got.cpu(), want, equal_nan=True)
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            tx // 0
        empty = torch.empty(0, 3, dtype=torch.int64)
        torch.testing.assert_close((empty.to("tpu") // ty).cpu(), empty // y)


def test_compiled_graphs_check_integer_divisors_too(monkeypatch):
    """Only a graph dividing integers by a tpu tensor carries the flag: one of floats
    does not (the same applicability as eager calls: `device_check_applies`)."""
    from torch_tpu.compile import interpret

    carried = []
    real = interpret.device_checked

    def spy(graph):
        carried.append(real(graph))
        return carried[-1]

    monkeypatch.setattr(interpret, "device_checked", spy)

    def fn(x, y):
        return (x // y + x % y) * 2

    compiled = torch.compile(fn, backend="tpu")
    x = torch.tensor([7, -8, 9])
    good = torch.tensor([2, -5, 3])
    torch.testing.assert_close(compiled(x.to("tpu"), good.to("tpu")).cpu(), fn(x, good))
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        compiled(x.to("tpu"), torch.tensor([2, 0, 3], device="tpu")).cpu()
    floats = compiled(x.float().to("tpu"), torch.tensor([2.0, 0.0, 3.0], device="tpu"))
    want = fn(x.float(), torch.tensor([2.0, 0.0, 3.0]))
    torch.testing.assert_close(floats.cpu(), want, equal_nan=True)
    assert carried == [True, False]  # (the integer graph, then the float one)


def test_assert_async_checks_on_the_device(eager_mode):
    """torch._assert_async (what PyTorch's one_hot decomposition asserts its classes
    with): CPU raises its message at the call for a zero, tpu at the next read (debug
    mode: at the call), without a CPU fallback (which copied the value to the host at
    every call)."""
    torch_tpu.metrics.reset()
    torch._assert_async(torch.tensor(True, device="tpu"), "never")
    torch._assert_async(torch.tensor([3], device="tpu"))
    torch.tpu.synchronize()
    with pytest.raises(RuntimeError, match="the value is zero"):
        torch._assert_async(torch.tensor(0.0, device="tpu"), "the value is zero")
        torch.tpu.synchronize()
    with pytest.raises(RuntimeError, match="single nonzero value, but got zero"):
        torch._assert_async(torch.tensor(0, device="tpu"))
        torch.tpu.synchronize()
    with pytest.raises(RuntimeError, match="more than one value is ambiguous"):
        torch._assert_async(torch.ones(2, device="tpu"), "two")
    assert torch_tpu.metrics.snapshot()["fallback_ops"] == {}


def test_a_compiled_one_hot_runs_whole_and_checks_its_classes(recwarn):
    """one_hot's decomposition asserts its classes with _assert_async: without a lowering
    a compiled graph holding it (transformers' mixture-of-experts routing) ran op by op."""

    def route(ids):
        return F.one_hot(ids, num_classes=4).sum(0)

    compiled = torch.compile(route, backend="tpu")
    ids = torch.tensor([0, 3, 3, 1])
    torch.testing.assert_close(compiled(ids.to("tpu")).cpu(), route(ids))
    assert not [w for w in recwarn if "op by op" in str(w.message)]
    with pytest.raises(RuntimeError, match="smaller than num_classes"):
        compiled(torch.tensor([0, 4, 1, 1], device="tpu")).cpu()
