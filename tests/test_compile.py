"""torch.compile on tpu: the `tpu` backend against eager tpu and PyTorch CPU."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import count_compiles, hold_executables, to_cpu, to_tpu
from torch import nn

import torch_tpu
from torch_tpu import metrics, training
from torch_tpu.compile import backend


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles from scratch: Dynamo's caches would otherwise carry graphs
    (and their recompile counts) from one test to the next."""
    torch._dynamo.reset()
    metrics.reset()
    yield
    torch._dynamo.reset()


def graph_compiles() -> list:
    return [e for e in metrics.compiles() if e.kind == "graph"]


def _train(model_fn, device: str, steps: int, compiled: bool, optimizer: str = "sgd"):
    """Losses of training model_fn() on its fixed batch (training._batch), as
    training.train_losses does, with the model optionally compiled."""
    torch.manual_seed(0)
    model = model_fn().to(device)
    forward = torch.compile(model) if compiled else model
    if optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = training._batch(model_fn, 16)
    x, y = x.to(device), y.to(device)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(forward(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


@pytest.mark.parametrize("model_fn", [training.mlp, training.cnn], ids=["mlp", "cnn"])
def test_training_matches_eager_and_cpu(model_fn):
    compiled, model = _train(model_fn, "tpu", 4, compiled=True)
    eager, _ = _train(model_fn, "tpu", 4, compiled=False)
    cpu, cpu_model = _train(model_fn, "cpu", 4, compiled=False)
    assert compiled == pytest.approx(eager, rel=1e-5, abs=1e-6)
    assert compiled == pytest.approx(cpu, rel=1e-4, abs=1e-5)
    assert compiled[-1] < compiled[0]
    # BatchNorm's running statistics are input mutations: they reach the real buffers
    for (name, ours), (_, theirs) in zip(model.named_buffers(), cpu_model.named_buffers()):
        torch.testing.assert_close(ours.cpu(), theirs, msg=name, atol=1e-5, rtol=1e-4)
    names = {e.name.rsplit(".", 1)[1] for e in graph_compiles()}
    assert names == {"forward", "backward"}  # one executable per graph, nothing fell back
    assert "compiled_graphs_run_eagerly" not in metrics.snapshot()


def test_tiny_gpt_training_matches_eager_and_cpu():
    def losses(device, compiled):
        model, step = training.gpt_step_fn("gpt_small", device)
        if compiled:
            model.compile()
        return [step().item() for _ in range(3)]

    compiled = losses("tpu", True)
    assert compiled == pytest.approx(losses("tpu", False), rel=1e-5)
    assert compiled == pytest.approx(losses("cpu", False), rel=1e-4)
    assert compiled[-1] < compiled[0]
    assert len(graph_compiles()) == 2  # forward and backward


def test_compiled_optimizer_step_updates_parameters_and_state_in_place():
    """AdamW's step is an inference graph that mutates its inputs (parameters, moments,
    and the CPU step counters): the writes land in the real tensors."""

    def run(device, compiled):
        torch.manual_seed(0)
        model = training.mlp(width=16, depth=2).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=0.1, foreach=False)
        step = torch.compile(lambda: opt.step()) if compiled else opt.step
        x = torch.randn(8, 16).to(device)
        for _ in range(3):
            opt.zero_grad()
            model(x).square().mean().backward()
            step()
        return model, opt

    model, opt = run("tpu", True)
    cpu_model, cpu_opt = run("cpu", False)
    for ours, theirs in zip(model.parameters(), cpu_model.parameters()):
        torch.testing.assert_close(ours.cpu(), theirs, atol=1e-5, rtol=1e-4)
        state, cpu_state = opt.state[ours], cpu_opt.state[theirs]
        assert state["step"].device.type == "cpu" and state["step"].item() == 3
        torch.testing.assert_close(state["exp_avg_sq"].cpu(), cpu_state["exp_avg_sq"])


@pytest.mark.parametrize("optimizer", ["adamw-foreach", "adam", "adamw-amsgrad"])
def test_compiled_optimizer_steps_cpu_counters_on_the_host_without_a_sync(optimizer):
    """A non-capturable optimizer's CPU step counters are written on the host (as eager
    writes them), not downloaded from the device: no host sync in a compiled step; the
    device reads each counter's own value (they are uploaded once per value and
    shared), also when the counters differ between parameters."""

    def make(params):
        if optimizer == "adamw-foreach":
            return torch.optim.AdamW(params, lr=0.1, foreach=True)
        if optimizer == "adam":
            return torch.optim.Adam(params, lr=0.1, foreach=False, weight_decay=0.01)
        return torch.optim.AdamW(params, lr=0.1, foreach=False, amsgrad=True)

    def run(device, compiled):
        torch.manual_seed(0)
        model = training.mlp(width=16, depth=2).to(device)
        opt = make(model.parameters())
        step = torch.compile(lambda: opt.step()) if compiled else opt.step
        x = torch.randn(8, 16).to(device)
        syncs = []
        for k in range(4):
            opt.zero_grad()
            model(x).square().mean().backward()
            if k == 2:
                next(iter(opt.state.values()))["step"].fill_(10.0)  # one counter differs
            before = metrics.snapshot().get("host_syncs", 0)
            step()
            syncs.append(metrics.snapshot().get("host_syncs", 0) - before)
        return model, opt, syncs

    model, opt, syncs = run("tpu", True)
    cpu_model, cpu_opt, _ = run("cpu", False)
    assert opt.state[model[0].weight]["step"].device.type == "cpu"
    assert syncs[1:] == [0, 0, 0]  # (the first call traces and compiles)
    for ours, theirs in zip(model.parameters(), cpu_model.parameters()):
        torch.testing.assert_close(ours.detach().cpu(), theirs.detach(), atol=1e-5, rtol=1e-4)
        for name, value in cpu_opt.state[theirs].items():
            torch.testing.assert_close(opt.state[ours][name].cpu(), value, msg=name)


def test_inference_under_no_grad():
    torch.manual_seed(0)
    model = training.cnn().eval()
    x = torch.randn(4, 3, 16, 16)
    with torch.no_grad():
        expected, expected_again = model(x), model(x * 2)
        compiled = torch.compile(model.to("tpu"))
        out = compiled(x.to("tpu"))
        again = compiled(x.to("tpu") * 2)
    torch.testing.assert_close(out.cpu(), expected, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(again.cpu(), expected_again, atol=1e-5, rtol=1e-4)
    assert [e.name.rsplit(".", 1)[1] for e in graph_compiles()] == ["inference"]


def test_in_place_on_inputs_is_applied_to_the_real_tensors():
    def fn(x, y):
        x.add_(1)
        y[0].mul_(3)
        return (x * y).sum(1)

    x, y = torch.randn(3, 4), torch.randn(3, 4)
    tx, ty = to_tpu((x, y))
    out = torch.compile(fn)(tx, ty)
    expected = fn(x, y)
    torch.testing.assert_close(out.cpu(), expected)
    torch.testing.assert_close(tx.cpu(), x)
    torch.testing.assert_close(ty.cpu(), y)


def test_views_and_aliased_outputs():
    def fn(x, w):
        a = x.t() @ w  # transposed input
        b = a[1:, ::2].unsqueeze(0).expand(2, -1, -1)  # slice, step, unsqueeze, expand
        c = x.view(2, 4, 3).permute(2, 0, 1).select(1, 1)
        d = torch.as_strided(x, (3, 3), (1, 3), 1)
        return b * 2, c.sum() + d.sum(), a.t(), x[::2]  # last two alias a and the input

    x, w = torch.randn(8, 3), torch.randn(8, 5)
    expected = fn(x, w)
    out = torch.compile(fn)(*to_tpu((x, w)))
    for o, e in zip(out, expected):
        assert o.shape == e.shape and o.stride() == e.stride()
        torch.testing.assert_close(to_cpu(o), e, atol=1e-5, rtol=1e-5)


def test_inputs_at_other_offsets_or_sharing_a_storage_read_their_own_elements():
    """Dynamo may reuse one graph for inputs of equal sizes and strides; our runtime reads
    each input's storage at its offset, so a call whose inputs sit elsewhere in their
    storage, or share one storage, must get a program for that layout, not an earlier
    call's (which would silently read other elements)."""

    def fn(x, y):
        return x * 2 + y, (x - y).sum()

    compiled = torch.compile(fn)
    base, other = torch.randn(16), torch.randn(16)
    tbase, tother = base.to("tpu"), other.to("tpu")
    cases = [
        ((base[:4], other[:4]), (tbase[:4], tother[:4])),
        ((base[4:8], other[:4]), (tbase[4:8], tother[:4])),  # another offset
        ((base[:4], base[4:8]), (tbase[:4], tbase[4:8])),  # one storage for both
        ((base[8:12], base[8:12]), (tbase[8:12], tbase[8:12])),  # the same elements
        ((base[:4], other[:4]), (tbase[:4], tother[:4])),  # the first layout again
    ]
    for cpu_args, tpu_args in cases * 2:
        for got, want in zip(compiled(*tpu_args), fn(*cpu_args)):
            torch.testing.assert_close(got.cpu(), want)


def test_a_loop_over_rows_compiles_the_graph_once(monkeypatch):
    """An input's storage offset is passed to the graph's program at run time: a compiled
    step called on `x[i]` in a loop (a recurrence over time steps) compiled one program
    per i; the graph's in-place write into its row lands there too."""
    def step(row, h):
        row.mul_(0.5)  # an input mutation at the row's offset
        return torch.tanh(row @ h + 1)

    compiled = torch.compile(step)
    torch.manual_seed(0)
    x, h = torch.randn(10, 3, 3), torch.randn(3, 3)
    tx, th = x.to("tpu"), h.to("tpu")
    hold_executables(monkeypatch)  # (from the warm-up on)
    for i in range(2):  # warm up
        h, th = step(x[i], h), compiled(tx[i], th)
    programs = count_compiles(monkeypatch)
    for i in range(2, 10):
        h, th = step(x[i], h), compiled(tx[i], th)
    assert programs == []
    torch.testing.assert_close(th.cpu(), h)
    torch.testing.assert_close(tx.cpu(), x)


def test_forward_saves_views_of_weights_not_copies():
    """AOTAutograd's forward saves each linear layer's transposed weight for the backward;
    as in eager PyTorch it must be a view of the weight, not a second copy of it held
    from forward to backward."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    x = torch.randn(4, 16)
    model(x).square().sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.to("tpu")
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = torch.compile(model)(x.to("tpu")).square().sum()
    weights = {p.untyped_storage().data_ptr(): p for p in model.parameters() if p.dim() == 2}
    shapes = {w.shape for w in weights.values()}
    weight_shaped = [t for t in saved if t.dim() == 2 and t.t().shape in shapes]
    assert weight_shaped, [tuple(t.shape) for t in saved]
    for t in weight_shaped:  # each one aliases its weight
        w = weights.get(t.untyped_storage().data_ptr())
        assert w is not None, "a transposed weight was saved as a copy"
        assert torch.equal(t.cpu(), w.t().cpu())
    loss.backward()
    for p, e in zip(model.parameters(), expected):
        torch.testing.assert_close(p.grad.cpu(), e, atol=1e-5, rtol=1e-5)


def test_graph_break_runs_the_middle_in_tpu_eager():
    def fn(x):
        y = torch.tanh(x) * 2
        torch._dynamo.graph_break()
        z = y.nonzero().shape[0]  # between graphs: tpu eager
        return y.exp() + z

    x = torch.randn(5, 6)
    out = torch.compile(fn)(to_tpu(x))
    torch.testing.assert_close(out.cpu(), fn(x))
    names = {e.name for e in graph_compiles()}
    assert any(n.startswith("fn:") for n in names)  # the graph before the break
    assert any(n.startswith("torch_dynamo_resume_in_fn") for n in names)  # and after it


@pytest.mark.parametrize("dynamic", [False, None], ids=["static", "automatic"])
def test_new_input_shape_recompiles_with_reason(dynamic):
    offset = 0.125 if dynamic is False else 0.25  # programs no other test compiles

    def fn(x, w):
        return torch.relu(x @ w) + offset

    compiled = torch.compile(fn, dynamic=dynamic)
    w = torch.randn(16, 4)
    for rows in (8, 8, 3):
        x = torch.randn(rows, 16)
        torch.testing.assert_close(compiled(*to_tpu((x, w))).cpu(), fn(x, w))
    events = graph_compiles()
    assert len(events) == 2  # the repeated shape did not compile again
    assert events[0].name == events[1].name  # the same code
    assert events[0].reason is None
    assert "shape (8, 16) -> (3, 16)" in events[1].reason
    assert "'l_x_'" in events[1].reason  # named as Dynamo names the input


def test_random_ops_draw_new_numbers_per_call_and_follow_the_seed():
    def fn(x):
        return nn.functional.dropout(x, 0.5, training=True) + torch.rand_like(x)

    compiled = torch.compile(fn)
    x = torch.ones(64, device="tpu")
    torch.manual_seed(7)
    first, second = compiled(x).cpu(), compiled(x).cpu()
    torch.manual_seed(7)
    repeat = compiled(x).cpu()
    assert not torch.equal(first, second)
    torch.testing.assert_close(first, repeat)
    kept = first > 1  # dropout keeps with scale 2: kept elements are 2 + U(0, 1)
    assert 10 < kept.sum() < 54 and ((first[~kept] >= 0) & (first[~kept] < 1)).all()


def test_default_backend_routes_by_device(monkeypatch):
    seen = []

    def fake_inductor(self, gm, inputs):
        seen.append([i.device.type for i in inputs if isinstance(i, torch.Tensor)])
        return gm.forward

    monkeypatch.setattr(torch._TorchCompileInductorWrapper, "__call__", fake_inductor)

    def fn(x):
        return x.sin() + 1

    x = torch.randn(4)
    torch.testing.assert_close(torch.compile(fn)(to_tpu(x)).cpu(), fn(x))
    assert len(graph_compiles()) == 1 and not seen  # tpu graph: the tpu backend
    torch._dynamo.reset()
    torch.compile(fn)(x)
    assert seen == [["cpu"]]  # cpu graph: Inductor, as without torch_tpu


def test_inductor_on_tpu_tensors_suggests_tpu():
    compiled = torch.compile(lambda x: x * 2, backend="inductor")
    with pytest.raises(Exception, match="backend='tpu'") as info:
        compiled(torch.ones(3, device="tpu"))
    assert "Inductor generates no code for the tpu device" in str(info.value)


def test_compiler_options_reach_the_compile():
    def fn(x):
        return torch.exp(x) * 3 - 0.375

    x = torch.randn(32)
    with torch.tpu.compiler.custom_compiler_options(xla_no_such_option=1):
        with pytest.raises(Exception, match="xla_no_such_option"):
            torch.compile(fn)(to_tpu(x))
    torch._dynamo.reset()
    with torch.tpu.compiler.custom_compiler_options(xla_cpu_enable_fast_math=False):
        out = torch.compile(fn)(to_tpu(x))
    torch.testing.assert_close(out.cpu(), fn(x))
    torch._dynamo.reset()
    torch.compile(fn)(to_tpu(x))  # same program, other options: another executable
    assert len(graph_compiles()) == 2


def test_torch_compile_options_are_xla_options():
    compiled = torch.compile(lambda x: x + 0.625, backend="tpu", options={"xla_bogus": 1})
    with pytest.raises(Exception, match="xla_bogus"):
        compiled(torch.ones(2, device="tpu"))


def test_dynamic_true_specialises_per_shape():
    def fn(x):
        return (x * x).sum(0) - 0.875

    compiled = torch.compile(fn, dynamic=True)
    for rows in (5, 7):
        x = torch.randn(rows, 3)
        torch.testing.assert_close(compiled(to_tpu(x)).cpu(), fn(x))
    assert len(graph_compiles()) == 2


def test_a_python_float_that_changes_with_the_shapes_is_read_at_run_time():
    """A graph whose sizes vary (Dynamo made it dynamic) and that takes a Python float
    which changed too: Dynamo passes the float as a 0-d tensor and reads it with
    `.item()`; specialising the graph per shape traced that read without a shape
    environment and raised DataDependentOutputException (a compiled detection model's
    postprocessing). Forward and backward match CPU; a new float at a known shape
    compiles nothing."""

    def fn(x, s):
        kept = (x >= s) & (x <= 2 * s)
        return (x * s).sin() * kept

    compiled = torch.compile(fn)
    compiles = []
    for rows, s in ((8, 0.5), (9, 0.75), (10, 0.875), (10, 0.625)):
        x = torch.randn(rows, 3, generator=torch.Generator().manual_seed(rows))
        xc, xt = x.clone().requires_grad_(), to_tpu(x).requires_grad_()
        expected, out = fn(xc, s), compiled(xt, s)
        torch.testing.assert_close(out.detach().cpu(), expected.detach())
        expected.sum().backward(), out.sum().backward()
        torch.testing.assert_close(xt.grad.cpu(), xc.grad)
        compiles.append(len(graph_compiles()))
    assert compiles[3] == compiles[2]  # a new float at a known shape: a run-time input


def test_backend_is_registered_under_its_name():
    torch.compile(lambda x: x)  # the first torch.compile registers the backend
    assert "tpu" in torch._dynamo.list_backends()
    assert torch.compiler.get_default_backend() is backend.tpu_or_inductor
    assert torch_tpu.compile.custom_compiler_options is torch.tpu.compiler.custom_compiler_options


def test_complex_gradients_through_conj_views_match_cpu():
    """AOTAutograd's complex backward graphs hold `_conj` views (PyTorch's conj bit); a
    compiled graph must conjugate there, as eager does (it silently did not)."""
    torch.manual_seed(0)
    f = torch.randn(17, dtype=torch.complex64)
    x = torch.randn(2, 4, 32)

    def fn(x, f):
        y = torch.fft.irfft(torch.fft.rfft(x, dim=-1) * f, n=32, dim=-1)
        return y.pow(2).sum() + (f.conj() * f.conj().neg()).real.sum()

    expected = f.clone().requires_grad_()
    fn(x, expected).backward()
    actual = f.to("tpu").requires_grad_()
    torch.compile(fn, backend="tpu")(x.to("tpu"), actual).backward()
    torch.testing.assert_close(actual.grad.cpu(), expected.grad, rtol=1e-5, atol=1e-4)


def test_repeated_torch_compile_calls_do_not_grow_dynamos_skip_list():
    """torch.compile registers the backend at each call; re-adding our modules to
    Dynamo's skip list each time (each add recompiles its regex over the whole list)
    made every call slower than the last: 9 s per call in a long test process."""
    from torch._dynamo import trace_rules

    torch.compile(lambda x: x)
    before = len(trace_rules.SKIP_DIRS)
    for _ in range(3):
        torch.compile(lambda x: x + 1)
    assert len(trace_rules.SKIP_DIRS) == before


@pytest.mark.parametrize("transposed", [False, True], ids=["contiguous", "transposed"])
def test_as_strided_scatter_lowers_into_the_graph(transposed):
    """Functionalization writes through views it cannot replay one by one with
    as_strided_scatter (PyTorch's random view programs hit it: tests/test_view_programs.py):
    with no lowering the whole graph ran op by op. The copy keeps self's strides."""

    def scatter(x, s):
        return torch.as_strided_scatter(x, s, (2, 2), (1, 3), 1)

    x = torch.arange(12.0).reshape(4, 3).t() if transposed else torch.arange(12.0).reshape(3, 4)
    s = torch.tensor([[-1.0, -2.0], [-3.0, -4.0]])
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # ("runs op by op in tpu eager")
        actual = torch.compile(scatter)(x.to("tpu"), s.to("tpu"))
    expected = scatter(x, s)
    assert torch.equal(actual.cpu(), expected)
    assert actual.stride() == expected.stride()
