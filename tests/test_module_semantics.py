"""Module and Parameter semantics across cpu<->tpu are CUDA's: `.to()` and friends keep
each Parameter object (so tied weights stay tied, optimizers built before the move,
Parameter attributes and hooks keep working); state dicts, deepcopy, torch.save and
optimizer state behave as on CPU. CPU is the oracle wherever it can be: a CPU dtype
conversion goes through the same in-place `param.data =` path CUDA takes for a move.
"""

from __future__ import annotations

import copy
import io
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

V, D = 16, 8


class TiedLM(nn.Module):
    """A tiny LM whose output head shares the embedding matrix (GPT-2, T5 style)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.mix = nn.Linear(D, D)
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, V, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("scale", torch.full((D,), 0.5))
        self.mix.register_buffer("scale", self.scale)  # one buffer in two slots

    def forward(self, tokens):
        h = self.emb(tokens) * self.scale
        return self.head(self.norm(torch.tanh(self.mix(h)) * self.mix.scale))


def slots(model: nn.Module) -> list[tuple[str, str, torch.Tensor]]:
    """Every (module, name, tensor) slot, ties included (named_* would drop duplicates)."""
    out = []
    for prefix, module in model.named_modules(remove_duplicate=False):
        for table in (module._parameters, module._buffers):
            out += [(prefix, name, t) for name, t in table.items() if t is not None]
    return out


def tie_structure(model: nn.Module) -> list[list[str]]:
    """Which slots hold the very same object, as groups of slot names."""
    groups: dict[int, list[str]] = {}
    for prefix, name, t in slots(model):
        groups.setdefault(id(t), []).append(f"{prefix}.{name}")
    return sorted(sorted(g) for g in groups.values())


def tokens(device="cpu", n=12):
    return torch.randint(0, V, (2, n), generator=torch.Generator().manual_seed(1)).to(device)


def converted_structure(model: nn.Module) -> list[list[str]]:
    """The tie structure CUDA gives after a device move, on CPU: a conversion that
    copies every tensor goes through the same paths (`param.data =` keeps each
    Parameter, so its ties; each buffer slot gets its own converted tensor)."""
    return tie_structure(copy.deepcopy(model).double())


def assert_same_values(a: nn.Module, b: nn.Module) -> None:
    for (_, name, x), (_, _, y) in zip(slots(a), slots(b), strict=True):
        assert x.dtype == y.dtype, name
        torch.testing.assert_close(x.detach().cpu(), y.detach().cpu(), rtol=0, atol=0)


# ---------------------------------------------------------------- conversions


class TaggedParameter(nn.Parameter):
    """A framework's Parameter subclass: CUDA's in-place conversion keeps the class."""


MOVES = {
    "to_tpu": lambda m: m.to("tpu"),
    "to_tpu_float64": lambda m: m.to("tpu", torch.float64),
    "to_device_dtype_kwargs": lambda m: m.to(device="tpu", dtype=torch.bfloat16),
    "tpu": lambda m: m.tpu(),
    "to_empty_tpu": lambda m: m.to_empty(device="tpu"),
}
# The CPU oracle for each: the same conversion minus the device change.
ORACLES = {
    "to_tpu": lambda m: m.to("cpu"),
    "to_tpu_float64": lambda m: m.to(torch.float64),
    "to_device_dtype_kwargs": lambda m: m.to(dtype=torch.bfloat16),
    "tpu": lambda m: m.cpu(),
    "to_empty_tpu": lambda m: m.to_empty(device="cpu"),
}


@pytest.mark.parametrize("move", list(MOVES))
def test_moving_to_tpu_keeps_parameter_objects_and_ties(move):
    torch.manual_seed(0)
    model = TiedLM()
    model.norm.bias = TaggedParameter(model.norm.bias.detach())
    oracle = copy.deepcopy(model)
    structure = converted_structure(model)
    params = {name: p for _, name, p in slots(model) if isinstance(p, nn.Parameter)}
    model.emb.weight._no_weight_decay = True  # frameworks tag Parameters like this
    before = [(m, n, t) for m, n, t in slots(model) if isinstance(t, nn.Parameter)]

    assert MOVES[move](model) is model
    ORACLES[move](oracle)

    after = [(m, n, t) for m, n, t in slots(model) if isinstance(t, nn.Parameter)]
    assert [id(t) for *_, t in after] == [id(t) for *_, t in before]  # same objects
    assert model.head.weight is model.emb.weight
    assert model.emb.weight._no_weight_decay is True
    assert type(model.norm.bias) is TaggedParameter
    assert all(p.device.type == "tpu" for p in params.values())
    assert tie_structure(model) == structure  # buffers too: as PyTorch does
    if move != "to_empty_tpu":  # to_empty's values are unspecified
        assert_same_values(model, oracle)


CONVERSIONS_ON_TPU = {
    "to_float16": lambda m: m.to(torch.float16),
    "half": lambda m: m.half(),
    "bfloat16": lambda m: m.bfloat16(),
    "double": lambda m: m.double(),
    "cpu": lambda m: m.cpu(),
    "to_cpu_float64": lambda m: m.to("cpu", torch.float64),
    "tpu_again": lambda m: m.to("tpu"),
}
ORACLES_ON_CPU = {
    "to_float16": lambda m: m.to(torch.float16),
    "half": lambda m: m.half(),
    "bfloat16": lambda m: m.bfloat16(),
    "double": lambda m: m.double(),
    "cpu": lambda m: m.cpu(),
    "to_cpu_float64": lambda m: m.to(torch.float64),
    "tpu_again": lambda m: m.to("cpu"),
}


@pytest.mark.parametrize("conversion", list(CONVERSIONS_ON_TPU))
def test_conversions_of_a_tpu_module_keep_objects_and_ties(conversion):
    torch.manual_seed(0)
    oracle = TiedLM()
    model = copy.deepcopy(oracle).to("tpu")
    weight = model.emb.weight
    CONVERSIONS_ON_TPU[conversion](model)
    ORACLES_ON_CPU[conversion](oracle)
    assert model.emb.weight is weight and model.head.weight is weight
    assert tie_structure(model) == converted_structure(oracle)
    expected = "cpu" if "cpu" in conversion else "tpu"
    assert {t.device.type for *_, t in slots(model)} == {expected}
    assert_same_values(model, oracle)


def test_to_empty_from_meta_unties_as_on_cpu_and_retying_trains():
    """The large-model init path: build on meta, to_empty, re-tie, reset_parameters.
    meta -> any device gives each slot a new Parameter in PyTorch (on CPU and CUDA
    alike), so the tie must be restored by the program; it then holds on tpu."""
    with torch.device("meta"):
        cpu_model, model = TiedLM(), TiedLM()
    cpu_model.to_empty(device="cpu")
    model.to_empty(device="tpu")
    assert tie_structure(model) == tie_structure(cpu_model)

    model.head.weight = model.emb.weight
    for module in model.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
    assert model.head.weight is model.emb.weight and model.emb.weight.device.type == "tpu"
    model(tokens("tpu")).sum().backward()
    assert model.head.weight.grad is model.emb.weight.grad is not None


def test_optimizer_built_before_the_move_trains_the_moved_parameters():
    torch.manual_seed(0)
    model = TiedLM()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    kept = model(tokens())  # a live graph on cpu holds the parameters' tensors too
    model.to("tpu")
    assert kept.grad_fn is not None
    before = model.emb.weight.detach().cpu()
    model(tokens("tpu")).sum().backward()
    optimizer.step()
    assert optimizer.param_groups[0]["params"][0] is model.emb.weight
    assert not torch.equal(model.emb.weight.detach().cpu(), before)


def test_one_parameter_in_two_slots_of_one_module_and_frozen_parameters():
    model = nn.Linear(3, 3)
    model.alias = model.weight  # the same Parameter under two names of one module
    model.bias.requires_grad_(False)
    view = model.bias[1:]  # a frozen parameter still referenced from C++ (a view's base)
    weight, bias = model.weight, model.bias
    model.to("tpu")
    assert model.alias is weight and model.weight is weight and model.bias is bias
    assert weight.device.type == bias.device.type == "tpu" and not bias.requires_grad
    assert view.device.type == "cpu"  # as on CUDA: a view keeps the storage it was made on


def test_parameter_hooks_survive_the_move():
    def run(device):
        torch.manual_seed(0)
        model = TiedLM()
        seen = []
        model.emb.weight.register_hook(lambda g: g * 2)
        model.emb.weight.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad.device))
        model.to(device)
        model(tokens(device)).sum().backward()
        return model.emb.weight.grad, seen

    grad_cpu, seen_cpu = run("cpu")
    grad_tpu, seen_tpu = run("tpu")
    assert [d.type for d in seen_tpu] == ["tpu"] * len(seen_cpu)
    torch.testing.assert_close(grad_tpu.cpu(), grad_cpu, rtol=1e-5, atol=1e-6)


def test_grad_moves_with_the_parameter():
    torch.manual_seed(0)
    model = TiedLM()
    model(tokens()).sum().backward()
    grad = model.emb.weight.grad.clone()
    model.to("tpu")
    assert model.emb.weight.grad.device.type == "tpu"
    torch.testing.assert_close(model.emb.weight.grad.cpu(), grad, rtol=0, atol=0)
    model.cpu()
    torch.testing.assert_close(model.emb.weight.grad, grad, rtol=0, atol=0)


def test_backward_through_a_graph_built_before_the_move_raises():
    model = TiedLM()
    loss = model(tokens()).sum()
    model.to("tpu")  # the graph in `loss` still feeds the parameters' old cpu tensors
    assert model.head.weight is model.emb.weight and model.emb.weight.device.type == "tpu"
    with pytest.raises(RuntimeError, match="moved between cpu and tpu"):
        loss.backward()


def test_overwrite_flag_keeps_pytorchs_new_parameters():
    """With torch.__future__.set_overwrite_module_params_on_conversion(True) PyTorch
    makes new Parameters on every device; the wrapper leaves that alone."""
    model = TiedLM()
    weight = model.emb.weight
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        model.to("tpu")
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(False)
    assert model.emb.weight is not weight and model.emb.weight.device.type == "tpu"


# ---------------------------------------------------------------- gradients, training


def test_tied_weight_gradients_accumulate_into_one_grad(eager_mode):
    torch.manual_seed(0)
    cpu = TiedLM()
    model = copy.deepcopy(cpu).to("tpu")
    cpu(tokens()).square().mean().backward()
    model(tokens("tpu")).square().mean().backward()
    assert model.head.weight.grad is model.emb.weight.grad
    for (_, name, c), (_, _, t) in zip(slots(cpu), slots(model), strict=True):
        if isinstance(c, nn.Parameter):
            torch.testing.assert_close(t.grad.cpu(), c.grad, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_tied_lm_training_matches_cpu_step_by_step(mode):
    """The optimizer is built before `.to()`, as many scripts do (fine on CUDA)."""

    def train(device):
        torch.manual_seed(0)
        model = TiedLM()
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-2, weight_decay=0.1)
        model.to(device)
        data = tokens(device, n=13)
        losses = []
        for _ in range(6):
            logits = model(data[:, :-1])
            loss = nn.functional.cross_entropy(logits.reshape(-1, V), data[:, 1:].reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        return losses, model

    cpu_losses, cpu_model = train("cpu")
    with torch.tpu.set_eager_mode(mode):
        tpu_losses, tpu_model = train("tpu")
    torch.testing.assert_close(tpu_losses, cpu_losses, rtol=1e-4, atol=1e-6)
    assert cpu_losses[-1] < cpu_losses[0]
    assert tpu_model.head.weight is tpu_model.emb.weight
    torch.testing.assert_close(
        tpu_model.emb.weight.detach().cpu(), cpu_model.emb.weight.detach(), rtol=1e-4, atol=1e-5
    )


# ---------------------------------------------------------------- param.data


@pytest.mark.parametrize("direction", ["cpu_to_tpu", "tpu_to_cpu"])
def test_param_data_across_devices_raises_and_changes_nothing(direction):
    """PyTorch's C++ check refuses `param.data = t` between cpu and tpu (a CUDA tensor
    would be accepted): PrivateUse1 is not in TensorImpl's dense-backend set. The
    parameter is left untouched; `module.to()` is the supported way to move."""
    src, dst = ("cpu", "tpu") if direction == "cpu_to_tpu" else ("tpu", "cpu")
    p = nn.Parameter(torch.arange(3.0).to(src))
    with pytest.raises(RuntimeError, match="incompatible tensor type"):
        p.data = torch.ones(3).to(dst)
    assert p.device.type == src
    torch.testing.assert_close(p.detach().cpu(), torch.arange(3.0))


def test_param_data_within_tpu_replaces_in_place():
    p = nn.Parameter(torch.zeros(3, device="tpu"))
    p.data = torch.arange(4.0, device="tpu")
    assert p.device.type == "tpu" and p.shape == (4,) and p.requires_grad
    torch.testing.assert_close(p.detach().cpu(), torch.arange(4.0))


# ---------------------------------------------------------------- state dicts, copies


@pytest.mark.parametrize("source", ["cpu", "tpu"])
def test_load_state_dict_into_a_tpu_model(source):
    torch.manual_seed(0)
    reference = TiedLM()
    state = {k: v.to(source) for k, v in reference.state_dict().items()}
    model = TiedLM().to("tpu")
    weight = model.emb.weight
    model.load_state_dict(state)
    assert model.emb.weight is weight and model.head.weight is weight
    assert weight.device.type == "tpu"
    assert_same_values(model, reference)


@pytest.mark.parametrize("source", ["cpu", "tpu"])
def test_load_state_dict_assign_as_on_cpu(source):
    """assign=True puts the state dict's own tensors in the slots: a slot per key, so
    PyTorch unties tied weights (on CPU as well), and the device is the tensors'."""
    torch.manual_seed(0)
    reference = TiedLM()
    cpu_model = TiedLM()
    cpu_model.load_state_dict(reference.state_dict(), assign=True)
    model = TiedLM().to("tpu")
    model.load_state_dict({k: v.to(source) for k, v in reference.state_dict().items()}, assign=True)
    assert tie_structure(model) == tie_structure(cpu_model)
    assert {p.device.type for p in model.parameters()} == {source}
    assert_same_values(model, reference)


def test_deepcopy_of_a_tpu_module():
    with torch.device("tpu"):  # built on tpu: the buffer is shared by two slots too
        model = TiedLM()
    cpu = copy.deepcopy(model).cpu()  # the values before any write
    clone = copy.deepcopy(model)
    assert tie_structure(clone) == tie_structure(model)
    assert clone.head.weight is clone.emb.weight and clone.mix.scale is clone.scale
    originals = {t.untyped_storage().data_ptr() for *_, t in slots(model)}
    assert not originals & {t.untyped_storage().data_ptr() for *_, t in slots(clone)}
    assert_same_values(clone, model)
    with torch.no_grad():
        clone.emb.weight.add_(1.0)
        model.scale.mul_(3.0)
    torch.testing.assert_close(model.emb.weight.detach().cpu(), cpu.emb.weight.detach())
    torch.testing.assert_close(clone.scale.cpu(), cpu.scale)
    torch.testing.assert_close(clone.mix.scale.cpu(), cpu.scale)


def test_deepcopy_of_tpu_tensors_keeps_views_of_one_storage(eager_mode):
    base = torch.arange(6.0, device="tpu")
    base.mul_(2.0)  # in fused mode the copied storage's value is still pending
    a, b = copy.deepcopy([base, base[2:]])
    a[3] = 100.0
    base[2] = -1.0
    assert b.tolist() == [4.0, 100.0, 8.0, 10.0] and base[3].item() == 6.0
    assert a[2].item() == 4.0


def test_save_load_round_trip_of_a_tied_tpu_state_dict():
    torch.manual_seed(0)
    cpu = TiedLM()
    model = copy.deepcopy(cpu).to("tpu")
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)
    cpu_buffer = io.BytesIO()
    torch.save(cpu.state_dict(), cpu_buffer)
    cpu_buffer.seek(0)
    cpu_loaded = torch.load(cpu_buffer)

    def shared(state):
        return state["emb.weight"].untyped_storage().data_ptr() == (
            state["head.weight"].untyped_storage().data_ptr()
        )

    assert shared(loaded) and shared(cpu_loaded)
    assert {v.device.type for v in loaded.values()} == {"tpu"}
    for key, value in cpu_loaded.items():
        torch.testing.assert_close(loaded[key].cpu(), value, rtol=0, atol=0)
    fresh = TiedLM().to("tpu")
    fresh.load_state_dict(loaded)
    assert fresh.head.weight is fresh.emb.weight
    assert_same_values(fresh, cpu)

    whole = io.BytesIO()  # the module itself, pickled
    torch.save(model, whole)
    whole.seek(0)
    restored = torch.load(whole, weights_only=False)
    assert restored.head.weight is restored.emb.weight
    assert tie_structure(restored) == tie_structure(model)
    assert restored.emb.weight.device.type == "tpu"
    assert_same_values(restored, cpu)


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_optimizer_load_state_dict_onto_tpu_parameters(mode):
    """State is moved to the parameters' device; `step` stays a CPU scalar tensor
    (non-capturable Adam), as PyTorch does for CUDA; training then continues as on CPU."""

    def steps(model, optimizer, n):
        losses = []
        for _ in range(n):
            optimizer.zero_grad()
            loss = model(tokens(model.emb.weight.device)).square().mean()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        return losses

    torch.manual_seed(0)
    cpu = TiedLM()
    cpu_opt = torch.optim.Adam(cpu.parameters(), lr=1e-2)
    steps(cpu, cpu_opt, 2)
    saved_model, saved_opt = copy.deepcopy(cpu.state_dict()), copy.deepcopy(cpu_opt.state_dict())

    with torch.tpu.set_eager_mode(mode):
        model = TiedLM().to("tpu")
        model.load_state_dict(saved_model)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        optimizer.load_state_dict(saved_opt)
        state = optimizer.state[model.emb.weight]
        assert state["exp_avg"].device.type == "tpu"
        assert state["exp_avg_sq"].device.type == "tpu"
        cpu_state = cpu_opt.state[cpu.emb.weight]
        assert state["step"].device == cpu_state["step"].device
        assert state["step"].dtype == cpu_state["step"].dtype
        tpu_losses = steps(model, optimizer, 3)
    torch.testing.assert_close(tpu_losses, steps(cpu, cpu_opt, 3), rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------- CPU-only programs


_CPU_PROGRAM = textwrap.dedent(
    """
    import copy, json, sys
    import torch
    from torch import nn

    sys.path.insert(0, {tests!r})
    from test_module_semantics import TiedLM, slots, tie_structure

    torch.manual_seed(0)
    model = TiedLM()
    ids = [id(t) for *_, t in slots(model) if isinstance(t, nn.Parameter)]
    report = {{"wrapped": nn.Module._apply.__module__}}
    for step, convert in [
        ("float64", lambda m: m.to(torch.float64)),
        ("cpu", lambda m: m.to("cpu")),
        ("float32", lambda m: m.float()),
    ]:
        assert convert(model) is model
        same = ids == [id(t) for *_, t in slots(model) if isinstance(t, nn.Parameter)]
        report[step] = [same, tie_structure(model)]
    clone = copy.deepcopy(model)
    report["deepcopy"] = tie_structure(clone)
    report["values"] = [t.double().sum().item() for *_, t in slots(clone)]
    report["loss"] = clone(torch.arange(8).view(2, 4)).sum().item()
    print(json.dumps(report))
    """
)


def test_cpu_only_modules_are_untouched_by_the_autoloaded_package():
    """A CPU program gets the same objects, ties and values whether torch_tpu was
    autoloaded (its Module._apply wrapper installed) or not."""

    def run(autoload):
        env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": autoload}
        program = _CPU_PROGRAM.format(tests=os.path.dirname(__file__))
        done = subprocess.run(
            [sys.executable, "-c", program], capture_output=True, text=True, timeout=300, env=env
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    with_package, without = run("1"), run("0")
    assert with_package.pop("wrapped") == "torch_tpu.modules"
    assert without.pop("wrapped") == "torch.nn.modules.module"
    assert with_package == without
    assert all(with_package[step][0] for step in ("float64", "cpu", "float32"))


@pytest.mark.parametrize(
    "make", [lambda: nn.LazyLinear(4), lambda: nn.LazyConv1d(4, 3), lambda: nn.LazyBatchNorm1d()]
)
def test_lazy_module_moves_to_tpu_before_its_first_forward(make):
    """`LazyLinear(4).to("tpu")` raised "Can't access the shape of an uninitialized
    parameter" (the upload read `.shape`, which UninitializedParameter forbids); CPU and
    CUDA move it, and the first forward materializes it on the device. Found by
    PyTorch's test_modules on tpu."""
    cpu = make()
    tpu = make().to("tpu")
    assert all(type(p) is nn.UninitializedParameter for p in tpu.parameters())
    assert all(p.device.type == "tpu" for p in tpu.parameters())
    x = torch.randn(2, 3, 5)
    with torch.no_grad():
        cpu(x)
        tpu(x.to("tpu"))
    for (name, p), (_, q) in zip(cpu.named_parameters(), tpu.named_parameters()):
        assert q.device.type == "tpu" and q.shape == p.shape, name
    tpu.load_state_dict(cpu.state_dict())
    torch.testing.assert_close(tpu(x.to("tpu")).detach().cpu(), cpu(x).detach())


def test_load_state_dict_between_lazy_modules_that_have_not_run():
    """Copying an uninitialized lazy parameter or buffer into another (load_state_dict
    before either module ran) is an empty copy on CPU; tpu raised "Can't access the shape
    of an uninitialized parameter". Found by PyTorch's test_lazy_modules on tpu."""
    for make in (lambda: nn.LazyLinear(4), lambda: nn.LazyBatchNorm1d()):
        cpu = make()
        cpu.load_state_dict(make().state_dict())
        tpu = make().to("tpu")
        tpu.load_state_dict(make().to("tpu").state_dict())
        assert [type(t) for t in tpu.state_dict().values()] == [
            type(t) for t in cpu.state_dict().values()
        ]
        x = torch.randn(3, 5)
        with torch.no_grad():
            assert tpu(x.to("tpu")).shape == cpu(x).shape
    target, source = nn.UninitializedParameter(device="tpu"), nn.UninitializedParameter()
    with torch.no_grad():
        assert target.copy_(source.to("tpu")) is target
        with pytest.raises(RuntimeError, match="must match the size"):  # as CPU's
            target.copy_(torch.ones(3, device="tpu"))
