"""nn.LSTM / nn.GRU / nn.RNN and their cells on tpu match the CPU, forward and backward,
in every configuration the modules offer, without any CPU fallback."""

import copy

import pytest
import torch
import torch.nn as nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

TOL = {"atol": 1e-5, "rtol": 1e-4}


# fused cases compile large segments (about a minute each on 2 cores): the full run only
@pytest.fixture(params=["strict", pytest.param("fused", marks=pytest.mark.slow)])
def mode(request):
    with torch.tpu.set_eager_mode(request.param):
        yield request.param


def _flat(out):
    """Every tensor in a module's output (PackedSequence and (h, c) tuples included)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, nn.utils.rnn.PackedSequence):
        return [out.data]
    return [t for o in out for t in _flat(o)]


def check_module(module, inputs, run=lambda m, *a: m(*a)):
    """module(*inputs) on CPU and a copy on tpu: outputs and the gradients of every
    float input and every parameter agree."""
    module.zero_grad(set_to_none=True)
    twin = copy.deepcopy(module).to("tpu")
    cpu_in = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    tpu_in = [x.detach().to("tpu").requires_grad_(x.is_floating_point()) for x in inputs]
    expected, actual = _flat(run(module, *cpu_in)), _flat(run(twin, *tpu_in))
    assert len(expected) == len(actual)
    for e, a in zip(expected, actual):
        assert a.device.type == "tpu"
        torch.testing.assert_close(a.cpu(), e.detach(), **TOL)
    weights = [torch.randn(e.shape) for e in expected]  # a loss that weighs every output
    sum((e * w).sum() for e, w in zip(expected, weights)).backward()
    sum((a * w.to("tpu")).sum() for a, w in zip(actual, weights)).backward()
    for c, t in zip(cpu_in, tpu_in):
        if c.is_floating_point():
            torch.testing.assert_close(t.grad.cpu(), c.grad, **TOL)
    for (name, p), (_, q) in zip(module.named_parameters(), twin.named_parameters()):
        assert q.grad is not None, f"no gradient for {name}"
        torch.testing.assert_close(q.grad.cpu(), p.grad, **TOL, msg=f"grad of {name}")


RNNS = {
    "lstm": lambda **kw: nn.LSTM(5, 6, **kw),
    "gru": lambda **kw: nn.GRU(5, 6, **kw),
    "rnn_tanh": lambda **kw: nn.RNN(5, 6, **kw),
    "rnn_relu": lambda **kw: nn.RNN(5, 6, nonlinearity="relu", **kw),
}


def _with_state(kind, layers):
    """A run function passing a random initial state (h0, and c0 for an LSTM)."""
    h0, c0 = torch.randn(layers, 3, 6), torch.randn(layers, 3, 6)
    if kind == "lstm":
        return [h0, c0], lambda m, x, h, c: m(x, (h, c))
    return [h0], lambda m, x, h: m(x, h)


@pytest.mark.parametrize("kind", sorted(RNNS))
def test_rnn_module(kind, mode, no_cpu_fallback):
    """Two layers, bidirectional, batch_first, with and without an initial state."""
    module = RNNS[kind](num_layers=2, bidirectional=True, batch_first=True)
    x = torch.randn(3, 4, 5)
    check_module(module, [x])
    state, run = _with_state(kind, 4)
    check_module(module, [x, *state], run)


@pytest.mark.parametrize("kind", sorted(RNNS))
def test_rnn_no_bias_unbatched(kind, mode, no_cpu_fallback):
    check_module(RNNS[kind](bias=False), [torch.randn(4, 5)])


def test_lstm_proj_size(mode, no_cpu_fallback):
    module = nn.LSTM(5, 6, num_layers=2, proj_size=3, bidirectional=True)
    check_module(module, [torch.randn(4, 3, 5)])
    h0, c0 = torch.randn(4, 3, 3), torch.randn(4, 3, 6)
    check_module(module, [torch.randn(4, 3, 5), h0, c0], lambda m, x, h, c: m(x, (h, c)))


@pytest.mark.parametrize("kind", ["lstm", "gru", "rnn_tanh"])
def test_rnn_packed_sequence(kind, mode, no_cpu_fallback):
    module = RNNS[kind](num_layers=2, bidirectional=True)
    lengths = torch.tensor([2, 5, 3])  # unsorted: PyTorch sorts and unsorts on the device

    def run(m, x):
        packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
        out, hidden = m(packed)
        padded, _ = pad_packed_sequence(out)
        return padded, hidden

    check_module(module, [torch.randn(5, 3, 5)], run)


def test_lstm_dropout_between_layers(mode, no_cpu_fallback):
    """Dropout draws differ between devices, so check what must hold: eval mode ignores
    it exactly, and in training the dropped layer still runs on tpu with gradients."""
    module = nn.LSTM(5, 6, num_layers=3, dropout=0.5)
    check_module(module.eval(), [torch.randn(4, 3, 5)])
    twin = copy.deepcopy(module).train().to("tpu")
    out, (h, c) = twin(torch.randn(4, 3, 5, device="tpu"))
    (out.sum() + h.sum() + c.sum()).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad.cpu()).all() for p in twin.parameters())


CELLS = {
    "lstm_cell": nn.LSTMCell,
    "gru_cell": nn.GRUCell,
    "rnn_cell_tanh": nn.RNNCell,
    "rnn_cell_relu": lambda i, h, **kw: nn.RNNCell(i, h, nonlinearity="relu", **kw),
}


@pytest.mark.parametrize("kind", sorted(CELLS))
def test_cell(kind, mode, no_cpu_fallback):
    """With a given state, without one, unbatched, and without biases."""
    cell = CELLS[kind](5, 6)
    x, h = torch.randn(3, 5), torch.randn(3, 6)
    if kind == "lstm_cell":
        check_module(cell, [x, h, torch.randn(3, 6)], lambda m, x, h, c: m(x, (h, c)))
    else:
        check_module(cell, [x, h])
    check_module(cell, [x])
    check_module(cell, [torch.randn(5)])
    check_module(CELLS[kind](5, 6, bias=False), [x])


def test_lstm_cell_only_one_output_used(no_cpu_fallback):
    """Backward with a gradient for c but none for h (and the other way round)."""
    cell = nn.LSTMCell(5, 6)
    x = torch.randn(3, 5)
    check_module(cell, [x], lambda m, x: m(x)[1])
    check_module(cell, [x], lambda m, x: m(x)[0])


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_rnn_bfloat16(kind, no_cpu_fallback):
    module = RNNS[kind]().to(torch.bfloat16)
    x = torch.randn(4, 3, 5, dtype=torch.bfloat16)
    twin = copy.deepcopy(module).to("tpu")
    expected, actual = _flat(module(x)), _flat(twin(x.to("tpu")))
    for e, a in zip(expected, actual):
        assert a.dtype == torch.bfloat16
        torch.testing.assert_close(a.cpu(), e, atol=3e-2, rtol=3e-2)


def test_double_backward_through_lstm_cell(no_cpu_fallback):
    """create_graph=True takes PyTorch's differentiable cell backward (composite ops)."""
    cell = nn.LSTMCell(4, 3)
    twin = copy.deepcopy(cell).to("tpu")
    results = []
    for m, device in ((cell, "cpu"), (twin, "tpu")):
        x = torch.linspace(-1, 1, 8).reshape(2, 4).to(device).requires_grad_()
        h, c = m(x)
        (g,) = torch.autograd.grad((h * c).sum(), x, create_graph=True)
        (gg,) = torch.autograd.grad(g.pow(2).sum(), x)
        results.append((g.detach().cpu(), gg.cpu()))
    torch.testing.assert_close(results[1], results[0], **TOL)


def test_lstm_compiled(no_cpu_fallback):
    module = nn.LSTM(5, 6, num_layers=2, batch_first=True)
    twin = copy.deepcopy(module).to("tpu")
    compiled = torch.compile(twin, backend="tpu")
    x = torch.randn(3, 4, 5)
    out, (h, c) = module(x)
    tout, (th, tc) = compiled(x.to("tpu"))
    for e, a in ((out, tout), (h, th), (c, tc)):
        torch.testing.assert_close(a.cpu(), e.detach(), **TOL)
    out.sum().backward()
    tout.sum().backward()
    for (name, p), (_, q) in zip(module.named_parameters(), twin.named_parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, **TOL, msg=f"grad of {name}")
