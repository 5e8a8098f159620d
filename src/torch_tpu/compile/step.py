"""`torch_tpu.compile_step`: forward, backward and optimizer update as one executable.

`torch.compile` of a whole training step gives AOTAutograd's forward and
backward graphs and the optimizer's graph: three executables, the
activations and gradients materialised as tpu tensors between them, and
Python (guards, AOTAutograd's wrappers, a tensor object per output) around
each. A step written in JAX is one jitted function with its state donated.
`compile_step` builds that function from the user's own objects:

- `make_fx` traces, under functionalization, `loss_fn(model(*inputs), *targets)`
  through `torch.func.functional_call`, `torch.autograd.grad` of the loss, and
  the optimizer's own `step()` run on the traced tensors (param groups and
  state swapped for the trace, `torch.compiler.is_compiling()` true as under
  Dynamo, so it takes the paths it takes under torch.compile). The result is
  one ATen graph whose in-place updates of parameters, buffers (BatchNorm
  statistics) and optimizer state are `copy_`s into its inputs.
- The graph runs as a `CompiledGraph`: one cached executable per input
  layout, the written storages donated, the new values written into the same
  Parameter, buffer and state tensor objects, so the model, `state_dict()`,
  checkpoints and eval keep working on them. Gradients land in `p.grad`.
- Each group's learning rate is a run-time input (a 0-d tensor): a scheduler
  changes it without a recompile. Other hyperparameters are baked in; changing
  one traces again.

A fresh optimizer has no state: the first call's graph creates it, the second
traces again with the state as inputs (two traces, then none).
"""

from __future__ import annotations

import contextlib
import operator
import sys
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterator
from itertools import chain

import jax
import torch
from torch import nn

from .. import tensor
from ..strided import contiguous_strides

DEVICE_TYPE = "tpu"

# Optimizers whose step compile_step has been checked against CPU eager; others raise
# rather than risk a silently different update.
SUPPORTED_OPTIMIZERS = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW)


# compile_step packs the gradients of parameters up to this size into one buffer: copying
# 64K elements costs less than an executable output does on a TPU host (about 9 us)
PACKED_GRADIENT_ELEMENTS = 1 << 16


class UnsupportedStep(RuntimeError):
    """A model, optimizer or step that compile_step cannot compile faithfully."""


def compile_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable[..., torch.Tensor],
    *,
    options: dict | None = None,
    keep_grads: bool = True,
) -> CompiledStep:
    """One XLA executable for `optimizer.zero_grad(); loss_fn(model(*inputs), *targets)
    .backward(); optimizer.step()`, called as `loss = step(inputs, *targets)` (inputs: a
    tensor, or a tuple of the model's positional inputs). Returns the loss (a 0-d tpu
    tensor, not synchronised). options are XLA compiler options.

    keep_grads=False: the optimizer's parameters' gradients stay inside the executable,
    as in a jitted JAX step, and their `.grad` is None after each step (as after
    `optimizer.zero_grad()`): no gradient memory is held between steps and the call has
    one output per parameter fewer. For loops that do not read `.grad` after the step.
    See docs/compile.md."""
    return CompiledStep(model, optimizer, loss_fn, options, keep_grads)


class CompiledStep:
    """A training step compiled whole; see `compile_step`."""

    def __init__(self, model, optimizer, loss_fn, options=None, keep_grads=True) -> None:
        _check_supported(model, optimizer)
        self.model, self.optimizer, self.loss_fn = model, optimizer, loss_fn
        self.options = dict(options or {})
        self.keep_grads = keep_grads
        self.traces = 0  # how many times a step was traced (tests, diagnostics)
        self._programs: dict = {}
        self._lr_tensors: dict = {}
        self._members: _Members | None = None
        self._state = _StateSeen()

    def __call__(self, inputs, *targets) -> torch.Tensor:
        model_inputs = list(inputs) if isinstance(inputs, (tuple, list)) else [inputs]
        data = model_inputs + list(targets)
        members = self._members
        if members is None or not members.current():
            members = self._members = _Members(self.model, members.version + 1 if members else 0)
        named, buffers, params = members.named, members.buffers, members.params
        state_keys, state_values = self._state.read(self.optimizer, params)
        lrs = [self._lr(group) for group in self.optimizer.param_groups]
        key = (
            self.model.training,
            len(model_inputs),
            members.version,  # the module tree: a swapped submodule traces again
            members.ids,
            tuple([p.requires_grad for p in params]),
            tuple(state_keys),
            _hyperparameters(self.optimizer),
            tuple(_describe(t) for t in data),
        )
        program = self._programs.get(key)
        if program is None:
            _check_inputs(data)
            if _pack_step_counters(self.optimizer, params):
                state_keys, state_values = _state(self.optimizer, params)
            program = self._programs[key] = self._trace(
                named, buffers, state_keys, state_values, lrs, data, len(model_inputs)
            )
        args = [*params, *(b for _, b in buffers), *state_values, *lrs, *data]
        return program.run(params, self.optimizer, args)

    def _lr(self, group: dict) -> torch.Tensor:
        """The group's learning rate as a 0-d tpu tensor, uploaded once per value. Its
        dtype is the group's scalar dtype (float32, or float64 for a float64 parameter),
        as the optimizer's step counters are: a float64 learning rate made every
        parameter's step size a float64 scalar, which a TPU emulates (gpt_small's step
        held about 600 more unfused scalar operations)."""
        lr = group["lr"]
        if isinstance(lr, torch.Tensor):
            return lr if lr.device.type == DEVICE_TYPE else lr.to(DEVICE_TYPE)
        dtype = torch.float32
        if any(p.dtype == torch.float64 for p in group["params"]):
            dtype = torch.float64
        tensor = self._lr_tensors.get((lr, dtype))
        if tensor is None:
            if len(self._lr_tensors) >= 64:  # a scheduler: a new value every step
                self._lr_tensors.clear()
            tensor = torch.tensor(lr, dtype=dtype).to(DEVICE_TYPE)
            self._lr_tensors[(lr, dtype)] = tensor
        return tensor

    def _trace(self, named, buffers, state_keys, state_values, lrs, data, n_inputs) -> _Program:
        from torch.fx.experimental.proxy_tensor import make_fx

        from . import backend, interpret
        from .runtime import CompiledGraph

        backend.register()  # our skip rules and Dynamo's state, as torch.compile sets up
        params = [p for _, p in named]
        names = [n for n, _ in named]
        buffer_names = [n for n, _ in buffers]
        sizes = (len(params), len(buffers), len(state_values), len(lrs))
        trainable = [p.requires_grad for p in params]  # frozen ones: inputs, no gradient
        in_optimizer = {id(p) for group in self.optimizer.param_groups for p in group["params"]}
        zeroed = [id(p) in in_optimizer for p in params]
        # (a trainable parameter outside the optimizer accumulates its gradient, as on CPU)
        dropped = [z and not self.keep_grads for z in zeroed]
        found: dict = {}

        def functional_step(*flat):
            traced_params, traced_buffers, traced_state, traced_lrs, batch = _split(flat, sizes)
            leaves = [p.detach().requires_grad_(t) for p, t in zip(traced_params, trainable)]
            with torch.enable_grad():
                values = dict(zip(names, leaves)) | dict(zip(buffer_names, traced_buffers))
                out = torch.func.functional_call(self.model, values, tuple(batch[:n_inputs]))
                loss = self.loss_fn(out, *batch[n_inputs:])
                _check_loss(loss)
                wanted = [x for x, t in zip(leaves, trainable) if t]
                found_grads = iter(torch.autograd.grad(loss, wanted, allow_unused=True))
                grads = [next(found_grads) if t else None for t in trainable]
            created = _run_optimizer(
                self.optimizer, params, traced_params, grads, state_keys, traced_state, traced_lrs
            )
            returned = [g is not None and not d for g, d in zip(grads, dropped)]
            flats, own, found["places"] = _pack_gradients(traced_params, grads, returned)
            found["flats"] = len(flats)
            found["created"] = [key for key, _ in created]
            return [loss.detach(), *flats, *own, *(v for _, v in created)]

        flat = [*params, *(b for _, b in buffers), *state_values, *lrs, *data]
        flat = [x.detach() for x in flat]
        with _compiling(), torch.no_grad():
            # autograd runs in the first trace (functorch's functionalize refuses
            # requires_grad_), functionalization and decompositions in the second
            joint = make_fx(
                functional_step, decomposition_table=_unfunctionalizable(), tracing_mode="fake"
            )(*flat)
            gm = make_fx(
                torch.func.functionalize(joint, remove="mutations"),
                decomposition_table=backend.decompositions(),
                tracing_mode="fake",
            )(*flat)
        self.traces += 1
        _drop_profiler_calls(gm)
        try:
            interpret.check_supported(gm.graph)
        except interpret.Unsupported as e:
            raise UnsupportedStep(f"compile_step: no tpu lowering for {e}") from None
        name = f"compile_step:{type(self.model).__name__}#{id(self):x}.{self.traces}"
        # parameters, buffers and optimizer state come back every step (a scheduler's
        # learning rates and the batch are new tensors each step)
        stable = len(params) + len(buffers) + len(state_values)
        graph = CompiledGraph(
            gm, name, None, self.options, stable_inputs=stable, pack_flag=True
        )
        return _Program(graph, found["places"], found["flats"], zeroed, found["created"])


class _Program:
    """One traced step: its compiled graph and where its outputs go."""

    def __init__(
        self, graph, places: list, flats: int, zeroed: list[bool], created: list[tuple[int, str]]
    ) -> None:
        self.graph = graph
        self.zeroed = zeroed  # per parameter: the optimizer's, so zero_grad() clears it
        self.created = created
        self.first_created = 1 + flats + sum(1 for p in places if p is not None and p[0] > 0)
        # where each parameter's gradient is (`_pack_gradients`), sorted by kind
        self.packed = [([], []) for _ in range(flats)]  # per buffer: parameters, geometries
        self.alone = []  # (parameter, output)
        self.cleared = []  # parameters without a gradient that zero_grad() would clear
        self.kept: list[_KeptGradients | None] = [None] * flats  # last step's, per buffer
        for k, place in enumerate(places):
            if place is None:
                if zeroed[k]:
                    self.cleared.append(k)
                continue
            output, offset, shape, dtype, strides = place
            if output < 0:
                indices, geometries = self.packed[-output - 1]
                indices.append(k)
                geometries.append((offset, shape, dtype, strides))
            else:
                self.alone.append((k, output))

    def run(self, params: list, optimizer, args: list) -> torch.Tensor:
        outputs = self.graph(args)
        zeroed = self.zeroed
        given = []
        for j, (indices, geometries) in enumerate(self.packed):
            kept = self.kept[j]
            if kept is not None and kept.refilled(params, indices, zeroed, outputs[1 + j]):
                continue
            parts = tensor.parts(outputs[1 + j].untyped_storage(), geometries)
            given += zip(indices, parts)
            outputs[1 + j] = None  # (the buffer's tensor: `_KeptGradients` counts holders)
            self.kept[j] = _KeptGradients(parts)
        given += [(k, outputs[output]) for k, output in self.alone]
        for k, grad in given:
            p = params[k]
            # backward accumulates into a gradient that zero_grad() did not clear
            p.grad = grad if zeroed[k] or p.grad is None else p.grad + grad
        for k in self.cleared:
            params[k].grad = None  # as after zero_grad(): backward left it unset
        k = self.first_created
        for index, name in self.created:
            optimizer.state[params[index]][name] = outputs[k]
            k += 1
        return outputs[0]


class _KeptGradients:
    """The last step's gradients of one packed buffer, given again with the next step's
    values when nothing else can see them: the step sets every such `p.grad` anew (as
    after `optimizer.zero_grad()`), and making the parts anew (a tensor and a `p.grad`
    assignment each) was a third of gpt_small's Python around its executable. They are
    refilled in place only while each part is its parameter's `.grad` and held by
    nothing else (no other reference or weak reference), keeps its geometry and flags,
    and the buffer's storage has no holder but the parts (no view, no `.data`) and no
    pending write; a gradient the user kept from an earlier step thus keeps its values,
    as on CPU. The parts and their storage's payload are held weakly: after
    `zero_grad()` the buffer is freed before the next step, as it was, and that step
    makes new parts."""

    __slots__ = ("refs", "payload", "holders", "looks")

    def __init__(self, parts: list[torch.Tensor]) -> None:
        # (with a callback: a user's plain weakref.ref(g) is then an object of its own,
        # counted below, not this one shared)
        self.refs = [weakref.ref(g, _unused) for g in parts]
        self.payload = weakref.ref(tensor.storage_of(parts[0]))
        self.holders = _storage_holders(parts[0])
        self.looks = _looks(parts)

    def refilled(self, params: list, indices: list, zeroed: list, buffer) -> bool:
        """Give the parts `buffer`'s values (an in-place write of them) if nothing else
        can see them; True if it did."""
        parts = [ref() for ref in self.refs]  # (no name holds a part: references count)
        payload = self.payload()
        if (
            parts[0] is None
            or tensor.storage_of(parts[0]) is not payload  # (given another payload)
            or not isinstance(payload.value, jax.Array)  # (a write still pending)
            or _storage_holders(parts[0]) != self.holders
        ):
            return False
        for j, k in enumerate(indices):
            if (
                not zeroed[k]  # (accumulated into, not set anew)
                or params[k].grad is not parts[j]
                # references: the list's, getrefcount's argument, and the one by which
                # autograd's C++ side (p.grad) holds the object; weakly, self.refs'
                or sys.getrefcount(parts[j]) != 3
                or weakref.getweakrefcount(parts[j]) != 1
            ):
                return False
        if _looks(parts) != self.looks:
            return False
        payload.value = tensor.storage_of(buffer).value
        torch.autograd.graph.increment_version(parts)
        return True


def _unused(_) -> None:
    pass


def _storage_holders(t: torch.Tensor) -> int:
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


def _looks(parts: list[torch.Tensor]) -> list:
    return [(g.shape, g.stride(), g.storage_offset(), g.dtype, g.requires_grad) for g in parts]


def _pack_gradients(params: list, grads: list, returned: list[bool]) -> tuple:
    """(gradient buffers, gradients returned alone, per parameter where its gradient is)
    for the traced step's outputs. The gradients of small contiguous parameters go out
    as one flat buffer per dtype, each `p.grad` then a contiguous part of it (as DDP's
    `gradient_as_bucket_view` makes them): one executable output instead of one per
    parameter, each of which cost about 9 us of the call on a TPU host and a tensor of
    its own. Big ones go alone: XLA computes a gradient and then copies it into the
    buffer, so packing them held a second copy of the gradients at the step's peak (the
    101M-parameter MLP's step peaked 400 MB higher). A place is (output, offset, shape,
    dtype, strides): output -1 - j is buffer j, a positive output a gradient returned alone (a big
    one, or a parameter that is not contiguous, whose gradient keeps its own strides),
    None no gradient."""
    groups: dict = {}  # dtype -> [(parameter index, gradient)]
    alone = []
    for k, (p, g, r) in enumerate(zip(params, grads, returned)):
        if not r:
            continue
        if 0 < g.numel() <= PACKED_GRADIENT_ELEMENTS and p.is_contiguous() and g.is_contiguous():
            groups.setdefault(g.dtype, []).append((k, g))
        else:
            alone.append((k, g))
    places: list = [None] * len(params)
    flats = []
    for j, (dtype, members) in enumerate(groups.items()):
        offset = 0
        for k, g in members:
            places[k] = (-1 - j, offset, tuple(g.shape), dtype, contiguous_strides(g.shape))
            offset += g.numel()
        flats.append(torch.cat([g.reshape(-1) for _, g in members]))
    for n, (k, _) in enumerate(alone):
        places[k] = (1 + len(flats) + n, 0, None, None, None)
    return flats, [g for _, g in alone], places


# ------------------------------------------------------------------ helpers


class _Members:
    """The model's named parameters and buffers, kept between steps: walking the module
    tree every step cost more host time than the rest of the step's bookkeeping.
    `current()` checks, per module, the names and identities of its parameters, buffers
    and submodules: any assignment, deletion or new submodule anywhere in the tree
    changes one of them, and the next `_Members` (version + 1) keys a new trace. (The
    objects are held here, so no identity seen is reused by a new object.)"""

    def __init__(self, model: nn.Module, version: int) -> None:
        self.version = version
        self.named = list(model.named_parameters())
        self.buffers = list(model.named_buffers())
        self.params = [p for _, p in self.named]
        self.ids = tuple(id(p) for p in self.params)
        self.modules = [m for _, m in model.named_modules(remove_duplicate=False)]
        self.fingerprint = _fingerprint(self.modules)

    def current(self) -> bool:
        return _fingerprint(self.modules) == self.fingerprint


def _fingerprint(modules: list) -> list:
    out: list = []
    for m in modules:
        parameters, buffers, children = m._parameters, m._buffers, m._modules
        out += parameters  # the names
        out += map(id, parameters.values())
        out.append(len(buffers))  # (most modules have none)
        if buffers:
            out += buffers
            out += map(id, buffers.values())
        out += children
        out += map(id, children.values())
    return out


def _split(flat, sizes) -> tuple:
    parts, start = [], 0
    for size in sizes:
        parts.append(list(flat[start : start + size]))
        start += size
    return (*parts, list(flat[start:]))


class _StateSeen:
    """The optimizer's state as the last step read it. Its tensors are the same objects
    from step to step (the executable writes them in place), so checking that every
    parameter's state dict, every name and every value is the one seen before (C-level
    passes over the lists) replaces walking them in Python, which cost about a tenth of
    gpt_small's step on the host. Anything replaced, added or removed reads again."""

    __slots__ = ("dicts", "names", "values", "found")

    def __init__(self) -> None:
        self.dicts: list = []
        self.names: list = []
        self.values: list = []
        self.found: tuple[list, list] = ([], [])

    def read(self, optimizer, params: list) -> tuple[list, list]:
        """(keys, tensors) as `_state` gives them."""
        dicts = list(map(optimizer.state.get, params))
        names, values = _contents(dicts)
        if (
            len(dicts) == len(self.dicts)
            and all(map(operator.is_, dicts, self.dicts))
            and names == self.names  # (strings: values are compared by identity below)
            and len(values) == len(self.values)
            and all(map(operator.is_, values, self.values))
        ):
            return self.found
        self.found = _state(optimizer, params)
        # (as read after _state, which may have replaced a CPU tensor with a tpu one)
        self.dicts = dicts
        self.names, self.values = _contents(dicts)
        return self.found


def _contents(dicts: list) -> tuple[list, list]:
    """(names, values) of the state dicts that exist, in order, in C-level passes."""
    live = list(filter(None, dicts))
    return list(chain.from_iterable(live)), list(chain.from_iterable(map(dict.values, live)))


def _state(optimizer, params: list) -> tuple[list, list]:
    """((param index, state name) per tensor in the optimizer's state, the tensors)."""
    keys, values = [], []
    states = optimizer.state
    tensor = torch.Tensor
    for k, p in enumerate(params):
        state = states.get(p)
        if not state:
            continue
        for name, value in state.items():
            if isinstance(value, tensor):
                if value.is_cpu:  # a CPU step counter (eager, a checkpoint)
                    value = state[name] = value.to(DEVICE_TYPE)
                keys.append((k, name))
                values.append(value)
    return keys, values


def _pack_step_counters(optimizer, params: list) -> bool:
    """Make the parameters' 0-d step counters (Adam's, AdamW's) elements of one tensor,
    each `state["step"]` a view of it; True if it did. The executable then reads and
    writes one buffer for them all instead of one per parameter: on a TPU host each
    argument of an executable call costs about 5 us (benchmarks/bench_call_cost.py), and
    a 31-parameter model's counters were a quarter of its step's arguments. Values,
    dtype, device and the update are unchanged; the counters stay separate elements."""
    states = [optimizer.state.get(p) for p in params]
    holders = [
        state
        for state in states
        if state
        and type(state.get("step")) is torch.Tensor  # (not a DTensor or other subclass)
        and state["step"].dim() == 0
        and state["step"].device.type == DEVICE_TYPE
    ]
    steps = [state["step"] for state in holders]
    if (
        len(steps) < 2
        or len({t.dtype for t in steps}) != 1
        or len({t.untyped_storage().data_ptr() for t in steps}) == 1  # (packed already)
    ):
        return False
    packed = torch.stack([t.detach() for t in steps])
    for j, state in enumerate(holders):
        state["step"] = packed[j]
    return True


def _hyperparameters(optimizer) -> tuple:
    """Everything of the param groups that the trace bakes in (all but params and lr),
    and non-tensor state: a change traces again."""
    return tuple(
        tuple((k, v) for k, v in group.items() if k not in ("params", "lr"))
        for group in optimizer.param_groups
    )


def _describe(t) -> tuple:
    if not isinstance(t, torch.Tensor):
        raise UnsupportedStep(
            f"compile_step: step inputs and targets must be tensors, got {type(t).__name__}"
        )
    # (a conjugate view reads differently from a plain tensor of the same geometry)
    return (tuple(t.shape), t.stride(), t.dtype, t.device.type, t.is_conj(), t.is_neg())


def _check_inputs(data: list) -> None:
    for t in data:
        if t.device.type != DEVICE_TYPE:
            raise UnsupportedStep(
                f"compile_step: inputs and targets must be on 'tpu', got a tensor on "
                f"{t.device}; move the batch with .to('tpu')"
            )


def _check_loss(loss) -> None:
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        got = f"shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else type(loss)
        raise UnsupportedStep(f"compile_step: loss_fn must return a one-element tensor, got {got}")


def _check_supported(model: nn.Module, optimizer) -> None:
    if type(optimizer) not in SUPPORTED_OPTIMIZERS:
        names = ", ".join(c.__name__ for c in SUPPORTED_OPTIMIZERS)
        raise UnsupportedStep(
            f"compile_step supports {names}; got {type(optimizer).__name__}. Use "
            "torch.compile on the step instead."
        )
    model_params = {id(p) for p in model.parameters()}
    for group in optimizer.param_groups:
        if group.get("differentiable"):
            raise UnsupportedStep("compile_step: differentiable=True optimizers are not supported")
        for p in group["params"]:
            if id(p) not in model_params:
                raise UnsupportedStep(
                    "compile_step: the optimizer holds a parameter that is not in the model"
                )
            if p.device.type != DEVICE_TYPE:
                raise UnsupportedStep(
                    f"compile_step: parameters must be on 'tpu', got one on {p.device}; "
                    "call model.to('tpu') before building the optimizer"
                )
    if optimizer._optimizer_step_pre_hooks or optimizer._optimizer_step_post_hooks:
        # a hook would run once, at the trace, not at every step
        raise UnsupportedStep("compile_step: optimizer step hooks are not supported")


def _unfunctionalizable() -> dict:
    """Decompositions for the batch-norm entry points that write running statistics
    but have no functional variant: their `_native_batch_norm_legit` form has one."""
    from torch._decomp import decomposition_table

    aten = torch.ops.aten
    ops = (aten.native_batch_norm.default, aten._batch_norm_with_update.default)
    return {op: decomposition_table[op] for op in ops if op in decomposition_table}


def _drop_profiler_calls(gm: torch.fx.GraphModule) -> None:
    """Remove the optimizer's record_function markers: they are no computation."""
    for node in reversed(list(gm.graph.nodes)):
        if node.op == "call_function" and getattr(node.target, "namespace", None) == "profiler":
            gm.graph.erase_node(node)
    gm.recompile()


@contextlib.contextmanager
def _compiling() -> Iterator[None]:
    """torch.compiler.is_compiling() is true while tracing, as under Dynamo: optimizers
    then keep step counters and tensor learning rates on the device (no .item())."""
    import torch.compiler as compiler

    saved = compiler._is_compiling_flag
    compiler._is_compiling_flag = True
    try:
        yield
    finally:
        compiler._is_compiling_flag = saved


def _run_optimizer(optimizer, params, traced, grads, state_keys, traced_state, lrs) -> list:
    """Run optimizer.step() on the traced tensors; returns ((param index, name), value)
    for each state tensor the step created or replaced (the rest it updated in place)."""
    index = {id(p): k for k, p in enumerate(params)}
    state: defaultdict = defaultdict(dict)
    inputs = {}
    for k, p in enumerate(params):
        for name, value in optimizer.state.get(p, {}).items():
            state[traced[k]][name] = value  # non-tensors (and tensors, replaced below)
    for (k, name), value in zip(state_keys, traced_state):
        state[traced[k]][name] = value
        inputs[(k, name)] = value
    saved_state, saved_groups = optimizer.state, [dict(g) for g in optimizer.param_groups]
    try:
        optimizer.state = state
        for group, lr in zip(optimizer.param_groups, lrs):
            group["params"] = [traced[index[id(p)]] for p in group["params"]]
            group["lr"] = lr
            if "capturable" in group and not group.get("fused"):
                group["capturable"] = True  # step counters stay tensors on the device
            if "foreach" in group and not group.get("fused"):
                group["foreach"] = True  # tensor lr: the foreach paths handle it on device
        for t, g in zip(traced, grads):
            t.grad = g
        optimizer.step()
    finally:
        optimizer.state = saved_state
        for group, saved in zip(optimizer.param_groups, saved_groups):
            group.clear()
            group.update(saved)
        for t in traced:
            t.grad = None
    created = []
    for k, t in enumerate(traced):
        for name, value in state.get(t, {}).items():
            if isinstance(value, torch.Tensor) and value is not inputs.get((k, name)):
                created.append(((k, name), value))
    return created
