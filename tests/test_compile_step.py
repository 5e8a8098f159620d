"""Whole-step compilation (`torch_tpu.compile_step`) and donation of the storages a
compiled graph writes: parity with CPU eager, the user's objects stay valid, a donated
buffer is never read after XLA reused it, and unsupported steps raise clearly."""

from __future__ import annotations

import copy
import gc
import io
import weakref

import jax
import numpy as np
import pytest
import torch
from conftest import hold_executables
from torch import nn

import torch_tpu
from torch_tpu import metrics
from torch_tpu.compile.step import UnsupportedStep
from torch_tpu.tensor import storage_of


def _mlp(batch_norm: bool = False) -> nn.Module:
    torch.manual_seed(0)
    middle = [nn.BatchNorm1d(16)] if batch_norm else []
    return nn.Sequential(nn.Linear(8, 16), *middle, nn.ReLU(), nn.Linear(16, 4))


def _batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(6, 8, generator=g), torch.randint(0, 4, (6,), generator=g)


def _optimizer(kind: str, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-3)
    return torch.optim.AdamW(params, lr=0.01)


def _train_both(kind: str, steps: int, batch_norm: bool = False, schedule: bool = False):
    """(cpu model, cpu optimizer, tpu model, tpu optimizer, compiled step, losses per step
    as (cpu, tpu)) after `steps` steps of the same training on CPU eager and compile_step."""
    cpu = _mlp(batch_norm)
    tpu = copy.deepcopy(cpu).to("tpu")
    cpu_opt, tpu_opt = _optimizer(kind, cpu.parameters()), _optimizer(kind, tpu.parameters())
    schedulers = []
    if schedule:  # lr changes every step: a run-time input, no new trace
        schedulers = [torch.optim.lr_scheduler.StepLR(o, 1, 0.5) for o in (cpu_opt, tpu_opt)]
    loss_fn = nn.functional.cross_entropy
    step = torch_tpu.compile_step(tpu, tpu_opt, loss_fn)
    x, y = _batch()
    xt, yt = x.to("tpu"), y.to("tpu")
    losses = []
    for _ in range(steps):
        cpu_opt.zero_grad()
        loss = loss_fn(cpu(x), y)
        loss.backward()
        cpu_opt.step()
        losses.append((loss.item(), step(xt, yt).item()))
        for s in schedulers:
            s.step()
    return cpu, cpu_opt, tpu, tpu_opt, step, losses


def _assert_models_equal(cpu: nn.Module, tpu: nn.Module) -> None:
    for (name, c), t in zip(cpu.state_dict().items(), tpu.state_dict().values()):
        assert t.device.type == "tpu", name
        torch.testing.assert_close(t.cpu(), c, msg=name)
    for c, t in zip(cpu.parameters(), tpu.parameters()):
        torch.testing.assert_close(t.grad.cpu(), c.grad)


@pytest.fixture(scope="module")
def sgd_run():
    """SGD with momentum on a model with BatchNorm, lr scheduled: shared by the parity and
    donation tests (each trace and compile costs seconds), which look at its executables."""
    with pytest.MonkeyPatch.context() as patch:
        hold_executables(patch)
        yield _train_both("sgd", steps=3, batch_norm=True, schedule=True)


def _assert_run_matches(run) -> None:
    cpu, cpu_opt, tpu, tpu_opt, step, losses = run
    for c, t in losses:
        assert t == pytest.approx(c, rel=1e-5, abs=1e-6)
    _assert_models_equal(cpu, tpu)  # BatchNorm's running statistics and counter too
    for c, t in zip(cpu.parameters(), tpu.parameters()):
        for name, value in cpu_opt.state[c].items():
            torch.testing.assert_close(tpu_opt.state[t][name].cpu(), value, msg=name)
    # a fresh optimizer: one trace creating its state, one with the state as inputs;
    # the scheduler's new lr each step is a run-time input, not a new trace
    assert step.traces == 2


def test_sgd_with_batch_norm_matches_cpu_and_objects_stay_valid(sgd_run):
    _assert_run_matches(sgd_run)
    cpu, _, tpu, tpu_opt, _, _ = sgd_run
    # the Parameters are the optimizer's objects still, and eval mode reads their values
    assert all(a is b for a, b in zip(tpu.parameters(), tpu_opt.param_groups[0]["params"]))
    x, _ = _batch()
    with torch.no_grad():
        cpu.eval(), tpu.eval()
        torch.testing.assert_close(tpu(x.to("tpu")).cpu(), cpu(x))
        cpu.train(), tpu.train()


def test_adamw_matches_cpu():
    _assert_run_matches(_train_both("adamw", steps=3, schedule=True))


def _eager_step(model, optimizer, loss_fn, x, y) -> float:
    """One eager training step (zero_grad, backward, step); its loss."""
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()


def _step_storages(optimizer) -> set:
    return {s["step"].untyped_storage().data_ptr() for s in optimizer.state.values()}


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.parametrize("foreach", [False, True])
def test_packed_step_counters_count_as_on_cpu_in_every_later_use(foreach, mode):
    """compile_step makes Adam's per-parameter step counters views of one tensor (one
    executable argument instead of one per parameter). Eager optimizer steps (foreach or
    per tensor: writes into views of one storage), a checkpoint round trip and
    compile_step again must all count and update exactly as CPU's separate counters."""
    with torch.tpu.set_eager_mode(mode):
        _packed_counters_run(foreach)


def _packed_counters_run(foreach: bool) -> None:
    cpu = _mlp()
    tpu = copy.deepcopy(cpu).to("tpu")
    cpu_opt = torch.optim.AdamW(cpu.parameters(), lr=0.01, foreach=foreach)
    tpu_opt = torch.optim.AdamW(tpu.parameters(), lr=0.01, foreach=foreach)
    loss_fn = nn.functional.cross_entropy
    step = torch_tpu.compile_step(tpu, tpu_opt, loss_fn)
    x, y = _batch()
    xt, yt = x.to("tpu"), y.to("tpu")

    def cpu_step():
        return _eager_step(cpu, cpu_opt, loss_fn, x, y)

    def eager_step():
        return _eager_step(tpu, tpu_opt, loss_fn, xt, yt)

    for _ in range(2):
        assert step(xt, yt).item() == pytest.approx(cpu_step(), rel=1e-5)
    assert len(_step_storages(tpu_opt)) == 1  # packed: one storage for the four counters
    for _ in range(2):
        assert eager_step() == pytest.approx(cpu_step(), rel=1e-5)
    saved = io.BytesIO()
    torch.save(tpu_opt.state_dict(), saved)
    saved.seek(0)
    tpu_opt.load_state_dict(torch.load(saved))
    for _ in range(2):
        assert step(xt, yt).item() == pytest.approx(cpu_step(), rel=1e-5)
    for c, t in zip(cpu.parameters(), tpu.parameters()):
        for name, value in cpu_opt.state[c].items():
            torch.testing.assert_close(tpu_opt.state[t][name].cpu(), value, msg=name)
    assert [s["step"].item() for s in tpu_opt.state.values()] == [6.0] * 4
    _assert_models_equal(cpu, tpu)


def test_keep_grads_false_updates_as_cpu_and_leaves_no_gradients():
    """keep_grads=False: the same losses, parameters and optimizer state as CPU's, the
    optimizer's parameters' .grad None after each step, and one output fewer per
    parameter; a trainable parameter outside the optimizer still accumulates, as on CPU."""
    cpu = _mlp()
    tpu = copy.deepcopy(cpu).to("tpu")
    outside = [cpu[2].bias, tpu[2].bias]  # trained, but no optimizer updates it
    cpu_opt = torch.optim.AdamW([p for p in cpu.parameters() if p is not outside[0]], lr=0.01)
    tpu_opt = torch.optim.AdamW([p for p in tpu.parameters() if p is not outside[1]], lr=0.01)
    loss_fn = nn.functional.cross_entropy
    twin = copy.deepcopy(tpu)  # the same step with the gradients kept (the default)
    twin_opt = torch.optim.AdamW([p for p in twin.parameters() if p is not twin[2].bias], lr=0.01)
    kept = torch_tpu.compile_step(twin, twin_opt, loss_fn)
    step = torch_tpu.compile_step(tpu, tpu_opt, loss_fn, keep_grads=False)
    x, y = _batch()
    xt, yt = x.to("tpu"), y.to("tpu")
    for _ in range(3):
        expected = _eager_step(cpu, cpu_opt, loss_fn, x, y)
        assert step(xt, yt).item() == pytest.approx(expected, rel=1e-5)
        for c, t in zip(cpu.parameters(), tpu.parameters()):
            torch.testing.assert_close(t.detach().cpu(), c.detach())
            if c is outside[0]:
                torch.testing.assert_close(t.grad.cpu(), c.grad)  # accumulated over steps
            else:
                assert t.grad is None
    for c, t in zip(cpu_opt.param_groups[0]["params"], tpu_opt.param_groups[0]["params"]):
        for name, value in cpu_opt.state[c].items():
            torch.testing.assert_close(tpu_opt.state[t][name].cpu(), value, msg=name)
    kept(xt, yt)
    # the gradients leave in one buffer per dtype: kept's also holds the optimizer's three
    # parameters' gradients
    (graph,) = [program.graph for program in step._programs.values()][:1]
    (kept_graph,) = [program.graph for program in kept._programs.values()][:1]
    assert len(graph.value_nodes) == len(kept_graph.value_nodes)
    optimized = sum(p.numel() for p in tpu_opt.param_groups[0]["params"])
    assert _output_elements(kept_graph) - _output_elements(graph) == optimized


def _output_elements(graph) -> int:
    return sum(n.meta["val"].numel() for n in graph.value_nodes)


def test_donated_parameters_never_show_through_other_references(sgd_run):
    """compile_step donates the parameter buffers it rewrites: a view or a detached alias
    sees the new values (as after an in-place update on CPU), and a reference to the old
    buffer (another storage sharing it, the raw array) keeps the old values."""
    cpu, cpu_opt, tpu, tpu_opt, step, _ = sgd_run
    assert _donating_executables()
    weight = tpu[0].weight
    view, alias = weight.view(-1), weight.detach()
    shared = torch.empty(0, device="tpu").set_(  # a second storage sharing the array
        weight.untyped_storage().clone(), 0, weight.shape, weight.stride()
    )
    saved = (weight * weight).sum()  # autograd saved the old weight
    held = storage_of(tpu[3].weight).value  # a raw reference: must not be donated
    before_shared, before_held = shared.cpu(), np.array(held)
    copies = metrics.snapshot().get("compiled_graph_donation_copies", 0)
    x, y = _batch()

    def both_step():  # CPU in step too: the fixture's models stay comparable
        cpu_opt.zero_grad()
        nn.functional.cross_entropy(cpu(x), y).backward()
        cpu_opt.step()
        step(x.to("tpu"), y.to("tpu"))

    both_step()
    torch.testing.assert_close(view.cpu(), cpu[0].weight.detach().reshape(-1))
    torch.testing.assert_close(alias.cpu(), cpu[0].weight.detach())
    torch.testing.assert_close(shared.cpu(), before_shared)
    assert not held.is_deleted()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        saved.backward()  # as on CPU: the step bumped the version counter
    np.testing.assert_array_equal(np.array(held), before_held)
    assert metrics.snapshot().get("compiled_graph_donation_copies", 0) == copies + 2
    # with nothing else holding them, the next step donates without copying
    del held, shared
    both_step()
    assert metrics.snapshot().get("compiled_graph_donation_copies", 0) == copies + 2


def test_changes_to_the_model_between_steps_are_followed_as_on_cpu():
    """The step keeps the model's parameter list between calls; a change to the module tree
    (a swapped submodule, a replaced buffer) or a newly frozen parameter must trace again,
    never run the old program (a swapped activation gave the old results silently)."""
    cpu = _mlp(batch_norm=True)
    tpu = copy.deepcopy(cpu).to("tpu")
    cpu_opt, tpu_opt = _optimizer("sgd", cpu.parameters()), _optimizer("sgd", tpu.parameters())
    step = torch_tpu.compile_step(tpu, tpu_opt, nn.functional.cross_entropy)
    x, y = _batch()
    changes = [
        lambda m: None,
        lambda m: None,  # (the state exists from here: one trace per change below)
        lambda m: m.__setitem__(2, nn.Tanh()),
        lambda m: m[1].register_buffer("running_mean", m[1].running_mean * 0 + 0.5),
        lambda m: m[0].bias.requires_grad_(False),
    ]
    for change in changes:
        change(cpu), change(tpu)
        cpu_opt.zero_grad()
        loss = nn.functional.cross_entropy(cpu(x), y)
        loss.backward()
        cpu_opt.step()
        assert step(x.to("tpu"), y.to("tpu")).item() == pytest.approx(loss.item(), rel=1e-5)
    for (name, c), t in zip(cpu.state_dict().items(), tpu.state_dict().values()):
        torch.testing.assert_close(t.cpu(), c, msg=name)
    assert tpu[0].bias.grad is None and step.traces == 5


def _on_weight(make):
    """A change applied alike to the first weight of both models."""

    def change(cpu, tpu, cpu_opt, tpu_opt) -> None:
        with torch.no_grad():
            for model in (cpu, tpu):
                make(model[0].weight)

    return change


def _into_larger_storage(w: torch.Tensor) -> None:
    base = torch.zeros(w.numel() + 3, dtype=w.dtype, device=w.device)
    base[3:] = w.reshape(-1)
    w.data = base[3:].view(w.shape)  # same values, storage offset 3


def _replace_moment(cpu, tpu, cpu_opt, tpu_opt) -> None:
    for model, opt in ((cpu, cpu_opt), (tpu, tpu_opt)):
        opt.state[model[2].weight]["momentum_buffer"] = torch.ones_like(model[2].weight)


def _delete_moment(cpu, tpu, cpu_opt, tpu_opt) -> None:
    for model, opt in ((cpu, cpu_opt), (tpu, tpu_opt)):
        del opt.state[model[2].weight]["momentum_buffer"]  # (SGD starts it again)


def _rename_moment(cpu, tpu, cpu_opt, tpu_opt) -> None:
    for model, opt in ((cpu, cpu_opt), (tpu, tpu_opt)):
        state = opt.state[model[2].weight]  # (the same tensors under other names)
        state["kept"] = state.pop("momentum_buffer")


def _load_state(cpu, tpu, cpu_opt, tpu_opt) -> None:
    for opt in (cpu_opt, tpu_opt):
        opt.load_state_dict(copy.deepcopy(cpu_opt.state_dict()))


def _steps_with_changes(model: nn.Module, changes: dict, steps: int) -> tuple:
    """`steps` SGD steps of model on CPU eager and of a copy by compile_step, each change
    applied to both before its step (changes[k](cpu, tpu, cpu_opt, tpu_opt)); the losses
    and the models after agree. Returns (cpu, tpu, cpu_opt, tpu_opt)."""
    cpu, tpu = model, copy.deepcopy(model).to("tpu")
    cpu_opt, tpu_opt = _optimizer("sgd", cpu.parameters()), _optimizer("sgd", tpu.parameters())
    step = torch_tpu.compile_step(tpu, tpu_opt, nn.functional.cross_entropy)
    x, y = _batch()
    for k in range(steps):
        if k in changes:
            changes[k](cpu, tpu, cpu_opt, tpu_opt)
        cpu_opt.zero_grad()
        loss = nn.functional.cross_entropy(cpu(x), y)
        loss.backward()
        cpu_opt.step()
        assert step(x.to("tpu"), y.to("tpu")).item() == pytest.approx(loss.item(), rel=1e-5)
    _assert_models_equal(cpu, tpu)
    return cpu, tpu, cpu_opt, tpu_opt


@pytest.mark.parametrize(
    "setup, change",
    [
        (None, _on_weight(lambda w: setattr(w, "data", w * 0.5))),
        (None, _on_weight(lambda w: setattr(w, "data", w.t().contiguous().t()))),
        # the same storage read at other strides or another offset (other elements)
        (None, _on_weight(lambda w: w.as_strided_(w.shape, (1, w.shape[0])))),
        (
            _on_weight(_into_larger_storage),
            _on_weight(lambda w: w.as_strided_(w.shape, w.stride(), 0)),
        ),
        (None, _replace_moment),
        (None, _delete_moment),
        (None, _rename_moment),
        (None, _load_state),
    ],
    ids=[
        "new-data",
        "new-strides",
        "strides-in-place",
        "offset-in-place",
        "moment-replaced",
        "moment-deleted",
        "moment-renamed",
        "state-loaded",
    ],
)
def test_tensors_changed_between_steps_are_read_as_on_cpu(setup, change):
    """The step remembers how the last call's parameters and optimizer state were laid
    out (their storages, offsets, sizes and strides) and checks that instead of
    describing them again: a parameter given new data, restrided or moved in its
    storage, or a moment replaced, must be read as it now is, never as it was."""
    cpu, tpu, cpu_opt, tpu_opt = _steps_with_changes(
        _mlp(), {0: setup, 2: change} if setup is not None else {2: change}, steps=4
    )
    for c, t in zip(cpu.parameters(), tpu.parameters()):
        torch.testing.assert_close(
            tpu_opt.state[t]["momentum_buffer"].cpu(), cpu_opt.state[c]["momentum_buffer"]
        )


def test_an_empty_buffer_keeps_changes_between_steps_read_as_on_cpu():
    """An empty tensor has no address, so the step checks its parameters one by one
    (storage, offset) instead of by address: the empty buffer given a new storage, then a
    weight given new data, are seen."""
    model = _mlp()
    model.register_buffer("nothing", torch.zeros(0))

    def new_storage(cpu, tpu, cpu_opt, tpu_opt) -> None:
        tpu.nothing.data = torch.zeros(0, device="tpu")

    changes = {2: new_storage, 3: _on_weight(lambda w: setattr(w, "data", w * 0.5))}
    _steps_with_changes(model, changes, steps=5)


def test_a_parameter_donated_to_a_jax_op_between_steps_raises_naming_the_op():
    """Donating a parameter's storage to a jax_op gives the storage another payload at
    the same address: the step must see that, not run on the donated array."""
    @torch_tpu.jax_op("compile_step_test::donating", donate_argnums=(0,))
    def donating(buf: jax.Array) -> jax.Array:
        return buf * 2

    model = _mlp().to("tpu")
    opt = _optimizer("sgd", model.parameters())
    step = torch_tpu.compile_step(model, opt, nn.functional.cross_entropy)
    x, y = (t.to("tpu") for t in _batch())
    for _ in range(2):
        step(x, y).item()
    donating(model[0].bias.detach())
    with pytest.raises(RuntimeError, match="donated to compile_step_test::donating"):
        step(x, y).item()


def test_gradients_of_parameters_outside_the_optimizer_accumulate_as_on_cpu():
    """zero_grad() clears only the optimizer's parameters: the others' gradients add up
    step after step on CPU, and so they must here."""
    cpu = _mlp()
    tpu = copy.deepcopy(cpu).to("tpu")
    cpu_opt = _optimizer("sgd", cpu[2].parameters())
    tpu_opt = _optimizer("sgd", tpu[2].parameters())
    step = torch_tpu.compile_step(tpu, tpu_opt, nn.functional.cross_entropy)
    x, y = _batch()
    for _ in range(3):
        cpu_opt.zero_grad()
        nn.functional.cross_entropy(cpu(x), y).backward()
        cpu_opt.step()
        step(x.to("tpu"), y.to("tpu"))
    _assert_models_equal(cpu, tpu)  # parameters and gradients, the accumulated ones too


def test_compiled_optimizer_step_donates_and_matches_cpu():
    """torch.compile's optimizer graph (an inference graph writing its inputs) donates
    what it writes; a deep copy taken before the step keeps its values."""
    cpu = _mlp()
    tpu = copy.deepcopy(cpu).to("tpu")
    cpu_opt, tpu_opt = _optimizer("adamw", cpu.parameters()), _optimizer("adamw", tpu.parameters())
    compiled = torch.compile(lambda: tpu_opt.step(), backend="tpu")
    x, y = _batch()
    for _ in range(2):
        for model, opt, xx, yy, run in ((cpu, cpu_opt, x, y, cpu_opt.step),
                                         (tpu, tpu_opt, x.to("tpu"), y.to("tpu"), compiled)):
            opt.zero_grad()
            nn.functional.cross_entropy(model(xx), yy).backward()
            snapshot = copy.deepcopy(model[0].weight)
            before = snapshot.detach().cpu()
            run()
            torch.testing.assert_close(snapshot.detach().cpu(), before)
    _assert_models_equal(cpu, tpu)
    assert _donating_executables()


def _donating_executables() -> int:
    """How many executables of graphs writing their inputs alias a donated input to an
    output (XLA's input_output_alias); fails if one of them donates nothing."""
    from torch_tpu.compile import runtime

    count = 0
    for graph in list(runtime._LIVE):
        if graph.written_inputs:
            for executable, *_ in graph.executables.values():
                assert "input_output_alias" in executable.as_text(), graph.name
                count += 1
    return count


def _alias_pairs(hlo_text: str) -> dict[int, int]:
    """{output index: parameter index} from an executable's input_output_alias header."""
    import re

    header = hlo_text.split("input_output_alias={", 1)[1].split("\n", 1)[0]
    return {int(o): int(p) for o, p in re.findall(r"\{(\d+)\}: \((\d+), \{\}", header)}


def test_each_donated_storage_is_paired_with_its_own_new_value(sgd_run):
    """XLA updates a donated buffer in place only if the output it is paired with is its
    new value; paired with another output of its shape (a parameter with its gradient)
    XLA copied every parameter and momentum buffer each step. Outputs put written
    storages first, in slot order, so JAX's pairing by shape gives each its own."""
    from torch_tpu.compile import runtime

    step = sgd_run[4]
    graphs = [p.graph for p in step._programs.values()]
    checked = 0
    for graph in graphs:
        assert graph in runtime._LIVE
        for executable, written_slots, donated_slots in graph.executables.values():
            pairs = _alias_pairs(executable.as_text())
            assert sorted(pairs.values()) == sorted(donated_slots), graph.name
            for output, parameter in pairs.items():
                assert written_slots[output] == parameter, (graph.name, output, parameter)
            checked += 1
    assert checked == 2  # the trace creating the momentum buffers, and the one after


def test_unsupported_steps_raise_clear_errors():
    model = _mlp().to("tpu")
    with pytest.raises(UnsupportedStep, match="supports SGD, Adam, AdamW; got RMSprop"):
        torch_tpu.compile_step(model, torch.optim.RMSprop(model.parameters()), nn.MSELoss())
    other = nn.Linear(2, 2).to("tpu")
    with pytest.raises(UnsupportedStep, match="not in the model"):
        torch_tpu.compile_step(model, torch.optim.SGD(other.parameters(), lr=0.1), nn.MSELoss())
    step = torch_tpu.compile_step(model, torch.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss())
    x = torch.randn(3, 8)
    with pytest.raises(UnsupportedStep, match="must be on 'tpu'"):
        step(x, torch.randn(3, 4))
    with pytest.raises(UnsupportedStep, match="one-element tensor"):
        torch_tpu.compile_step(
            model, torch.optim.SGD(model.parameters(), lr=0.1), lambda out, t: out - t
        )(x.to("tpu"), torch.randn(3, 4).to("tpu"))
    assert isinstance(UnsupportedStep("x"), RuntimeError)


def test_a_model_moved_off_the_device_frees_its_storages():
    """The step remembers the last call's parameter storages to check the next call
    against: weakly, so moving the model to the CPU frees its device buffers."""
    import gc
    import weakref

    model = _mlp().to("tpu")
    opt = _optimizer("sgd", model.parameters())
    step = torch_tpu.compile_step(model, opt, nn.functional.cross_entropy)
    x, y = _batch()
    for _ in range(3):
        step(x.to("tpu"), y.to("tpu")).item()
    refs = [weakref.ref(storage_of(p)) for p in model.parameters()]
    opt.state.clear()  # (the momentum buffers are the optimizer's to free)
    model.to("cpu")
    gc.collect()
    assert [r() for r in refs] == [None] * len(refs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_step_computes_in_the_parameters_precision(dtype):
    """The learning rate is a run-time input of the parameters' precision: a float64 one
    made a float32 model's AdamW step sizes float64 scalars (emulated on a TPU), and a
    float32 one would round a float64 model's learning rate. (A float64 model trains
    with float64 as the default dtype, as PyTorch's step counters follow it: with
    float32 counters the bias corrections carry float32's error, as under
    torch.compile; docs/compile.md.)"""
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        cpu, _, tpu, _, step, _ = _stepped("adamw", 3)
    finally:
        torch.set_default_dtype(saved)
    assert tpu[0].weight.dtype == dtype
    _assert_models_equal(cpu, tpu)
    graph = list(step._programs.values())[-1].graph.graph
    float64 = [
        n.name
        for n in graph.nodes
        if isinstance(n.meta.get("val"), torch.Tensor) and n.meta["val"].dtype == torch.float64
    ]
    assert (float64 != []) == (dtype == torch.float64), float64[:5]


def _stepped(kind: str, steps: int):
    """(cpu model, cpu optimizer, tpu model, tpu optimizer, compiled step, batch) after
    `steps` steps of `_mlp` with the `_optimizer` of that kind, CPU eager and compiled."""
    cpu = _mlp()
    tpu = copy.deepcopy(cpu).to("tpu")
    cpu_opt, tpu_opt = _optimizer(kind, cpu.parameters()), _optimizer(kind, tpu.parameters())
    step = torch_tpu.compile_step(tpu, tpu_opt, nn.functional.cross_entropy)
    x, y = _batch()
    for _ in range(steps):
        _eager_step(cpu, cpu_opt, nn.functional.cross_entropy, x, y)
        step(x.to("tpu"), y.to("tpu"))
    return cpu, cpu_opt, tpu, tpu_opt, step, (x, y)


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_gradients_in_one_buffer_behave_as_separate_tensors(mode):
    """The gradients leave the step as one buffer per dtype and each `p.grad` is a part of
    it: each still reads, and is changed in place, as its own tensor; a gradient kept
    from an earlier step keeps its values; clipping, zeroing and an eager optimizer step
    over them give CPU's results."""
    with torch.tpu.set_eager_mode(mode):
        cpu, cpu_opt, tpu, tpu_opt, step, (x, y) = _stepped("sgd", 1)
        grads = [p.grad for p in tpu.parameters()]
        assert len({g.untyped_storage().data_ptr() for g in grads}) == 1  # one buffer
        assert len({g.data_ptr() for g in grads}) == len(grads)
        first = [g.cpu() for g in grads]
        for c, t in zip(cpu.parameters(), tpu.parameters()):
            torch.testing.assert_close(t.grad.cpu(), c.grad)
        # in place, one gradient alone; then a foreach clip over all of them
        grads[1].mul_(3)
        list(cpu.parameters())[1].grad.mul_(3)
        for model in (cpu, tpu):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5, foreach=True)
        for c, t in zip(cpu.parameters(), tpu.parameters()):
            torch.testing.assert_close(t.grad.cpu(), c.grad)
        cpu_opt.step()
        tpu_opt.step()  # eager, over the parts
        for c, t in zip(cpu.parameters(), tpu.parameters()):
            torch.testing.assert_close(t.detach().cpu(), c.detach())
        kept = [p.grad for p in tpu.parameters()]  # held across the next step
        expected = [g.cpu() for g in kept]
        step(x.to("tpu"), y.to("tpu"))
        for k, g in zip(expected, kept):
            torch.testing.assert_close(g.cpu(), k)
        assert all(p.grad is not g for p, g in zip(tpu.parameters(), kept))
        assert not all(torch.equal(f, p.grad.cpu()) for f, p in zip(first, tpu.parameters()))
        tpu_opt.zero_grad(set_to_none=False)
        assert all(torch.count_nonzero(p.grad.cpu()) == 0 for p in tpu.parameters())


def test_a_gradient_of_a_non_contiguous_parameter_has_its_strides_as_on_cpu():
    """A parameter that is not contiguous gets its gradient alone, laid out as CPU's."""
    torch.manual_seed(0)
    cpu = nn.Linear(8, 4)
    cpu.weight = nn.Parameter(torch.randn(8, 4).t())  # (4, 8), strides (1, 4)
    tpu = copy.deepcopy(cpu).to("tpu")
    assert not tpu.weight.is_contiguous()
    cpu_opt = torch.optim.SGD(cpu.parameters(), lr=0.1)
    tpu_opt = torch.optim.SGD(tpu.parameters(), lr=0.1)
    loss_fn = nn.functional.mse_loss
    step = torch_tpu.compile_step(tpu, tpu_opt, loss_fn)
    x, y = torch.randn(3, 8), torch.randn(3, 4)
    for _ in range(2):
        expected = _eager_step(cpu, cpu_opt, loss_fn, x, y)
        assert step(x.to("tpu"), y.to("tpu")).item() == pytest.approx(expected, rel=1e-5)
    for c, t in zip(cpu.parameters(), tpu.parameters()):
        assert t.grad.stride() == c.grad.stride()
        torch.testing.assert_close(t.grad.cpu(), c.grad)
        torch.testing.assert_close(t.detach().cpu(), c.detach())


def test_big_gradients_leave_alone(monkeypatch):
    """Gradients above `PACKED_GRADIENT_ELEMENTS` are outputs of their own (packing one
    costs a copy of it at the step's peak); the small ones still share a buffer."""
    from torch_tpu.compile import step as step_module

    monkeypatch.setattr(step_module, "PACKED_GRADIENT_ELEMENTS", 16)
    cpu, _, tpu, _, _, _ = _stepped("sgd", 1)  # weights of 128, 64 elements; biases 16, 4
    weights, biases = [tpu[0].weight, tpu[2].weight], [tpu[0].bias, tpu[2].bias]
    storages = {p: p.grad.untyped_storage().data_ptr() for p in weights + biases}
    assert storages[biases[0]] == storages[biases[1]]
    assert len({storages[w] for w in weights} | {storages[biases[0]]}) == 3
    assert all(w.grad.untyped_storage().nbytes() == w.numel() * 4 for w in weights)
    for c, t in zip(cpu.parameters(), tpu.parameters()):
        torch.testing.assert_close(t.grad.cpu(), c.grad)


def test_the_loss_carries_the_index_check_and_a_later_check_is_not_missed():
    """A checked step's loss storage carries the device-check flag after the loss, so
    the host reads both in one transfer (`device_asserts.carried`). An index out of
    range raises at the loss's read, once; a checked op run after the step changes the
    flag, and a read of that step's loss then reads the flag itself."""
    from torch_tpu.engine import device_asserts

    model = _mlp().to("tpu")
    step = torch_tpu.compile_step(
        model, _optimizer("sgd", model.parameters()), nn.functional.cross_entropy
    )
    x, y = _batch()
    xt, yt = x.to("tpu"), y.to("tpu")
    loss = step(xt, yt)
    assert loss.shape == () and loss.untyped_storage().nbytes() == 8  # [loss, flag]
    assert device_asserts._carried_value() is storage_of(loss).value
    value = loss.item()
    assert value == loss.cpu().item() == (loss * 2).item() / 2
    with pytest.raises(IndexError, match="nll_loss"):
        step(xt, torch.full_like(yt, 9)).item()
    assert np.isfinite(step(xt, yt).item())  # reported once: the device goes on
    loss = step(xt, yt)
    torch.zeros(3, device="tpu")[torch.tensor([5], device="tpu")]
    with pytest.raises(IndexError, match="out of bounds"):
        loss.item()


def _hold_list(tpu):
    return [p.grad for p in tpu.parameters()]


def _hold_view(tpu):
    return tpu[0].bias.grad.view(-1)


def _hold_data(tpu):
    return tpu[0].bias.grad.data


@pytest.mark.parametrize("hold", [_hold_list, _hold_view, _hold_data])
def test_a_gradient_held_across_a_step_keeps_its_values(hold):
    """Each step's gradients are the last step's tensors refilled when nothing else can
    see them (`_KeptGradients`); one held as itself, a view or `.data` keeps the earlier
    step's values, as on CPU, and the step's own gradients are CPU's."""
    cpu, cpu_opt, tpu, _, step, (x, y) = _stepped("adamw", 3)
    held = hold(tpu)
    before = [t.cpu() for t in (held if isinstance(held, list) else [held])]
    _eager_step(cpu, cpu_opt, nn.functional.cross_entropy, x, y)
    step(x.to("tpu"), y.to("tpu"))
    for b, a in zip(before, held if isinstance(held, list) else [held]):
        torch.testing.assert_close(a.cpu(), b, rtol=0, atol=0)
    for c, t in zip(cpu.parameters(), tpu.parameters()):
        torch.testing.assert_close(t.grad.cpu(), c.grad)


def test_a_weakly_referenced_gradient_dies_at_the_next_step_as_on_cpu():
    """A weak reference to a gradient is not a holder, but a refilled tensor would stay
    alive under it with new values: it dies at the next step, as CPU's does."""
    cpu, cpu_opt, tpu, _, step, (x, y) = _stepped("adamw", 3)
    held = {device: weakref.ref(m[0].bias.grad) for device, m in (("cpu", cpu), ("tpu", tpu))}
    _eager_step(cpu, cpu_opt, nn.functional.cross_entropy, x, y)
    step(x.to("tpu"), y.to("tpu"))
    assert held["cpu"]() is None and held["tpu"]() is None
    torch.testing.assert_close(tpu[0].bias.grad.cpu(), cpu[0].bias.grad)


def test_zero_grad_frees_the_gradient_buffer_before_the_next_step():
    """The step keeps its gradients only weakly for refilling: after `zero_grad()` the
    buffer is freed, as CPU's gradients are, not held until the next step's peak."""
    _, _, tpu, tpu_opt, step, _ = _stepped("adamw", 3)  # (step alive: it could hold it)
    buffer = weakref.ref(tpu[0].bias.grad.untyped_storage()._tpu)
    tpu_opt.zero_grad()
    gc.collect()
    assert buffer() is None
    assert step.traces == 2


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_gradients_refilled_step_after_step_are_cpu_s(mode):
    """In a loop that holds nothing, the same gradient tensors come back each step with
    the step's values (an in-place write: their version moves on); after
    `zero_grad()`, a clip in place, a gradient transposed in place, and a write still
    pending in fused mode, each step's gradients are still CPU's and laid out as CPU's."""
    with torch.tpu.set_eager_mode(mode):
        cpu, cpu_opt, tpu, tpu_opt, step, (x, y) = _stepped("adamw", 3)
        ids = [id(p.grad) for p in tpu.parameters()]
        versions = [p.grad._version for p in tpu.parameters()]
        tweaks = [
            lambda opt, model: None,
            lambda opt, model: opt.zero_grad(),
            lambda opt, model: torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1),
            lambda opt, model: model[0].weight.grad.t_(),
            lambda opt, model: model[0].bias.grad.mul_(2),
        ]
        for tweak in tweaks:
            tweak(cpu_opt, cpu)
            tweak(tpu_opt, tpu)
            _eager_step(cpu, cpu_opt, nn.functional.cross_entropy, x, y)
            step(x.to("tpu"), y.to("tpu"))
            for c, t in zip(cpu.parameters(), tpu.parameters()):
                assert t.grad.shape == c.grad.shape and t.grad.stride() == c.grad.stride()
                torch.testing.assert_close(t.grad.cpu(), c.grad)
                torch.testing.assert_close(t.detach().cpu(), c.detach())
            if tweak is tweaks[0]:  # nothing held: the same tensors, written in place
                assert [id(p.grad) for p in tpu.parameters()] == ids
                assert all(p.grad._version > v for p, v in zip(tpu.parameters(), versions))
