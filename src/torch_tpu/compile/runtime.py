"""Running one compiled ATen graph on tpu tensors.

AOTAutograd calls a `CompiledGraph` with the graph's inputs (boxed: one list
it may clear). Each input's flat storage array goes in as it is, and the
executable reads it at the layout it has now, so an input costs no dispatch
of its own; a new layout (strides, storage offset) compiles another
executable. Every compile goes through `torch_tpu.cache` under the graph's
stable name, so a recompile is recorded with the input that changed. Random
ops draw consecutive (seed, counter) pairs from `torch_tpu.rng` per call.

Donation: the storages a graph writes (an optimizer's parameters and moments,
BatchNorm statistics) are donated to the executable, so XLA writes the new
values into the old buffers instead of holding two copies. A buffer is donated
only when its storage is its sole owner (`engine/donation.held_only_by`); one referenced
elsewhere (another storage sharing it after a deepcopy, a pending host read, the
small shared zeros, an array the user took out) is copied first and the copy is
donated, so every executable of a graph donates the same arguments and nothing
that still holds the old array ever sees it deleted.
"""

from __future__ import annotations

import operator
import weakref

import jax
import jax.numpy as jnp
import torch
from torch.multiprocessing.reductions import StorageWeakRef

from .. import cache, memory_errors, metrics, precision, rng, strided, tensor
from ..engine import device_asserts, donation, executor, fastpath, modes
from ..engine.fuse import Pending
from ..tensor import Fresh, storage_of, view_of
from . import interpret
from .host_inputs import HostCopies, HostWrites

_LIVE: weakref.WeakSet = weakref.WeakSet()  # every graph's executables, for cache.clear()


def _clear_all() -> None:
    """cache.clear() or a change of the ambient compiler options: every graph looks its
    executable up again."""
    for graph in _LIVE:
        graph.executables.clear()


cache.on_clear(_clear_all)


class CompiledGraph:
    """One ATen graph: call it with its inputs (a list), get its outputs as tpu tensors."""

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        name: str,
        input_names: list[str] | None = None,
        options: dict | None = None,
        stable_inputs: int = 0,
        pack_flag: bool = False,
    ) -> None:
        """pack_flag: when the graph checks index values and its first output is a 0-d
        float (a training step's loss), that output's storage carries the device-check
        flag after it, so the host reads both in one transfer (`device_asserts.carried`).
        stable_inputs: how many leading inputs the caller passes again, unchanged, on
        most calls (a compiled training step's parameters and optimizer state): their
        description is remembered and checked instead of rebuilt (`_StablePrefix`), and
        their storage offsets are constants of the executable (a view among them, such
        as a step counter packed with others, costs no run-time input)."""
        # AOTAutograd passes one list we may clear (frees inputs early). An instance
        # attribute: Dynamo's disable() wrapper copies __dict__, not class attributes.
        self._boxed_call = True
        self.graph = gm.graph
        self.name = name
        self.reason = f"compiled graph {name}"  # why a fused segment had to run first
        self.options = dict(options or {})
        self.host_writes = HostWrites.split(gm)  # (before the graph's writes are read)
        nodes = interpret.input_nodes(gm.graph)
        self.n_placeholders = sum(1 for n in nodes if n.op == "placeholder")
        self.constants = [operator.attrgetter(n.target)(gm) for n in nodes[self.n_placeholders :]]
        for node, constant in zip(nodes[self.n_placeholders :], self.constants):
            node.meta.setdefault("val", constant)
        labels = (input_names or [n.name for n in nodes[: self.n_placeholders]]) + [
            n.name for n in nodes[self.n_placeholders :]
        ]
        self.signature = [  # tensor inputs only: a size input changes with a tensor's shape
            (label, tuple(n.meta["val"].shape), str(n.meta["val"].dtype))
            for label, n in zip(labels, nodes)
            if isinstance(n.meta.get("val"), torch.Tensor)
        ]
        self.random_nodes = tuple(n for n in gm.graph.nodes if interpret.is_random(n))
        self.written_inputs = tuple(dict.fromkeys(k for k, _ in interpret.input_writes(gm.graph)))
        self.host_copies = HostCopies(set(self.written_inputs))
        self.checked = interpret.device_checked(gm.graph)  # (index values: device_asserts)
        self._plan(gm.graph, nodes)
        self.pack_flag = pack_flag and self.checked and self._first_output_is_a_scalar()
        if self.pack_flag:
            self.fresh[0] = self.fresh[0].with_trailing(1)
        self.executables: dict = {}
        self.stable_inputs = stable_inputs
        self._prefix: _StablePrefix | None = None
        self._prefix_tokens: dict = {}  # a stable prefix's key -> the small int keys use
        _LIVE.add(self)

    def _plan(self, graph: torch.fx.Graph, inputs: list) -> None:
        """Per graph output: ("const", value) for a non-tensor, ("input", k) for an input
        returned as it is, ("view", (k, shape, strides, offset)) for a view of input k,
        or ("value", j) for the j-th distinct computed value."""
        input_index = {node: k for k, node in enumerate(inputs)}
        placeholders = inputs[: self.n_placeholders]
        value_index: dict = {}
        self.plan = []
        for item in graph.output_node().args[0]:
            if isinstance(item, torch.fx.Node) and item.target is torch.ops.aten.copy_.default:
                item = item.args[0]  # copy_ returns the input it wrote into
            if not isinstance(item, torch.fx.Node):
                self.plan.append(("const", item))
            elif item in input_index:
                self.plan.append(("input", input_index[item]))
            elif (view := _view_of_input(item, placeholders)) is not None:
                self.plan.append(("view", view))
            else:
                j = value_index.setdefault(item, len(value_index))
                self.plan.append(("value", j))
        self.value_nodes = tuple(value_index)
        self.fresh = [  # how each computed output becomes a tensor (worked out once)
            Fresh(v.shape, v.dtype, interpret.output_strides(v))
            for v in (n.meta["val"] for n in self.value_nodes)
        ]

    def _first_output_is_a_scalar(self) -> bool:
        """The first output is the first computed value, returned once, a 0-d float32 or
        float64 (which hold the flag's small codes exactly)."""
        return (
            bool(self.plan)
            and self.plan[0] == ("value", 0)
            and self.plan.count(("value", 0)) == 1
            and self.fresh[0].shape == ()
            and self.fresh[0].dtype in (torch.float32, torch.float64)
        )

    def __call__(self, args: list) -> list:
        precision.sync()
        tensors = list(args) + self.constants
        args.clear()
        key, storages, host, offsets = self._describe(tensors)
        if self.checked:
            storages.append(device_asserts.flag_storage())  # (after the inputs' storages)
        arrays = [  # (an array already: no call; else zeros, or a fused segment's value)
            v if (v := s.value) is not None and type(v) is not Pending else s.array(self.reason)
            for s in storages
        ]
        arrays += offsets  # inputs' storage offsets passed at run time (device scalars)
        if self.random_nodes:
            arrays.append(rng.next_key_words())  # the first random node's (seed, counter)
            for _ in range(len(self.random_nodes) - 1):
                rng.next_key_inputs()
        entry = self.executables.get(key)
        if entry is None:
            static = self._prefix.n if self.stable_inputs and self._prefix is not None else 0
            entry = self.executables[key] = self._compile(self._layouts(tensors, static), arrays)
        executable, written_slots, donated_slots = entry
        for slot in donation.not_held_only_by(arrays, donated_slots, 2):  # (its storage,
            arrays[slot] = jnp.array(arrays[slot], copy=True)  # this list)
            metrics.count("compiled_graph_donation_copies")
        metrics.count("compiled_graph_calls")
        try:
            written, flats = executable(*arrays)
            if modes.current is modes.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING:
                jax.block_until_ready((written, flats))
        except jax.errors.JaxRuntimeError as error:
            memory_errors.raise_if_out_of_memory(error)
            raise
        for slot, value in zip(written_slots, written):
            storages[slot].value = value
        if self.checked:
            device_asserts.noted()
            if self.pack_flag:
                device_asserts.carried(flats[0])
        if host:
            if self.host_writes is not None:
                self.host_writes.apply(host)
            bumped = []
            for k in self.written_inputs:
                if k in host:
                    host[k].copy_(tensors[k])  # back to the CPU tensor the graph mutated
                else:
                    bumped.append(tensors[k])
        else:
            bumped = [tensors[k] for k in self.written_inputs]
        if bumped:  # as an in-place op does; one call for all (a step writes hundreds)
            torch.autograd.graph.increment_version(bumped)
        values = [fresh.make(flat) for fresh, flat in zip(self.fresh, flats)]
        out = []
        for tag, index in self.plan:
            if tag == "value":
                out.append(values[index])
            elif tag == "input":
                out.append(host.get(index, tensors[index]))
            elif tag == "view":
                k, shape, strides, offset = index
                base = host.get(k, tensors[k])
                out.append(base.as_strided(shape, strides, base.storage_offset() + offset))
            else:
                out.append(index)
        return out

    def _describe(self, tensors: list) -> tuple[tuple, list, dict, list]:
        """(key, storages, host inputs, run-time offsets) of one call. The key is flat,
        cheap to build and hash (it runs on every call, over every parameter of a
        training step): per tensor what the eager fast path's signature holds
        (`fastpath.add_tensor`, offsets passed at run time included), per size input a
        1-tuple. A CPU input (an optimizer's step) is uploaded in place in `tensors`.
        With stable inputs, the key starts with a small int standing for the prefix's
        part, and a prefix seen on the last call is checked, not described again."""
        key: list = []
        storages: list = []
        slots: dict = {}
        offsets: list = []
        start = 0
        if self.stable_inputs:
            prefix = self._prefix
            seen = None if prefix is None else prefix.matches(tensors)
            if seen is None:
                prefix = self._prefix = self._describe_prefix(tensors)
            if prefix is not None:
                key.append(prefix.token)
                if seen is None:
                    payloads = [t.untyped_storage()._tpu for t in tensors[: prefix.n]]
                    seen = [payloads[k] for k in prefix.firsts]
                storages += seen
                slots.update(prefix.slots)
                start = prefix.n
        host: dict = {}
        add_tensor = fastpath.add_tensor
        for k in range(start, len(tensors)):
            t = tensors[k]
            try:
                storage = t.untyped_storage()._tpu
            except AttributeError:
                if not isinstance(t, torch.Tensor):
                    # a size input: the executable is specialised on it; an opaque object
                    # (a DeviceMesh) only passes through to the outputs (backend.py checks)
                    key.append((int(t) if isinstance(t, int) else interpret.OPAQUE,))
                    continue
                if t.device.type != executor.DEVICE_TYPE:  # a CPU scalar (optimizer step)
                    host[k] = t
                    t = tensors[k] = self.host_copies.upload(k, t)
                storage = storage_of(t)
            add_tensor(t, storage, key, storages, slots, offsets)
        # (cached device scalars: a host scalar input cost each call about 175 us on a TPU
        # host, 6 us here; a step's offsets repeat, a batch sliced the same way each step)
        return tuple(key), storages, host, [fastpath.int64_scalar(k) for k in offsets]

    def _describe_prefix(self, tensors: list) -> _StablePrefix | None:
        """The stable prefix of this call described, or None when it holds anything but
        tpu tensors (those take the general path every call)."""
        prefix = tensors[: self.stable_inputs]
        try:
            payloads = [t.untyped_storage()._tpu for t in prefix]
        except AttributeError:
            return None
        key: list = []
        storages: list = []
        slots: dict = {}
        for t, storage in zip(prefix, payloads):
            fastpath.add_tensor(t, storage, key, storages, slots)  # (offsets: in the key)
        token = self._prefix_tokens.setdefault(tuple(key), len(self._prefix_tokens))
        return _StablePrefix(prefix, payloads, token, slots)

    @staticmethod
    def _layouts(tensors: list, static: int = 0) -> tuple:
        """What the interpreter specialises an executable on, per input: (storage slot,
        View) for a tensor, the value of a size input, OPAQUE for anything else. The
        first `static` inputs (a described stable prefix) keep their offsets constant."""
        slots: dict = {}
        layouts = []
        offsets = 0
        for k, t in enumerate(tensors):
            if not isinstance(t, torch.Tensor):
                layouts.append(int(t) if isinstance(t, int) else interpret.OPAQUE)
                continue
            storage = storage_of(t)
            slot = slots.setdefault(id(storage), len(slots))
            view = view_of(t, storage)
            if k >= static and strided.offset_may_vary(view):  # (as `_describe` decided)
                view = view._replace(offset=strided.Offset(offsets))
                offsets += 1
            layouts.append((slot, view))
        return tuple(layouts)

    def _compile(self, layouts: tuple, arrays: list) -> tuple:
        """(executable, storage slots it writes, those it donates) for this input layout:
        the device-check flag is written, never donated (4 bytes; its array may be held
        elsewhere, and a copy per call would be counted as a donation failing)."""
        donated_slots = tuple(sorted({layouts[k][0] for k in self.written_inputs}))
        written_slots = donated_slots
        if self.checked:
            written_slots += (interpret.storage_slots(layouts),)  # the flag's
        fn = interpret.build(
            self.graph,
            layouts,
            self.value_nodes,
            self.random_nodes,
            written_slots,
            self.checked,
            self.pack_flag,
        )
        example = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays)
        return self._cache_compile(fn, example, donated_slots), written_slots, donated_slots

    def _cache_compile(self, fn, example: tuple, donate: tuple[int, ...] = ()):
        return cache.compile(
            fn,
            example,
            kind="graph",
            name=self.name,
            signature=self.signature,
            options=self.options,
            donate_argnums=donate,
        )


class _StablePrefix:
    """A call's leading inputs as `_describe` saw them: the same storages at the same
    offsets, with the same sizes, strides, dtype and dispatch keys (a C++ guard checks
    those), describe the same way, so the next call checks that instead of describing
    each tensor again (on a training step's hundreds of parameters and moments that cost
    more host time than the executable's own call). Storages are held weakly: a model
    moved off the device frees them.

    Storage and offset are checked together by the tensors' addresses (`data_ptr`, one
    C-level pass): a tpu storage's address is never reused, and names its payload while
    no payload has been replaced (`tensor.payloads_replaced`). An empty tensor has no
    address; a prefix holding one checks storages and offsets one by one."""

    __slots__ = (
        "n", "refs", "storage_offsets", "addresses", "epoch", "guards", "token", "firsts",
        "first_refs", "slots",
    )

    def __init__(self, prefix: list, payloads: list, token: int, slots: dict):
        from torch._C._dynamo.guards import TensorGuards

        self.n = len(prefix)
        self.refs = [weakref.ref(p) for p in payloads]
        self.storage_offsets = [t.storage_offset() for t in prefix]
        addresses = list(map(_DATA_PTR, prefix))
        self.addresses = addresses if all(addresses) else None
        self.epoch = tensor.payloads_replaced
        self.guards = TensorGuards(
            *prefix,
            dynamic_dims_sizes=[list(t.shape) for t in prefix],
            dynamic_dims_strides=[list(t.stride()) for t in prefix],
        )
        self.token = token
        firsts: dict = {}  # per storage slot, the first input over it
        for k, p in enumerate(payloads):
            firsts.setdefault(id(p), k)
        self.firsts = list(firsts.values())
        self.first_refs = [self.refs[k] for k in self.firsts]
        self.slots = slots  # id(storage) -> slot: the ids of live objects checked alike

    def matches(self, tensors: list) -> list | None:
        """The prefix's distinct storages, in slot order, if it matches, else None."""
        prefix = tensors[: self.n]
        if self.addresses is not None and self.epoch == tensor.payloads_replaced:
            try:
                if list(map(_DATA_PTR, prefix)) != self.addresses:
                    return None
            except TypeError:  # (not a tensor)
                return None
            if not self.guards.check(*prefix):
                return None
            return [ref() for ref in self.first_refs]  # (alive: the tensors hold them)
        try:
            payloads = [t.untyped_storage()._tpu for t in prefix]
        except AttributeError:
            return None
        if (
            payloads == [ref() for ref in self.refs]  # (Storage has no __eq__: identity)
            and [t.storage_offset() for t in prefix] == self.storage_offsets
            and self.guards.check(*prefix)
        ):
            return [payloads[k] for k in self.firsts]
        return None


_DATA_PTR = torch.Tensor.data_ptr


def _view_of_input(node: torch.fx.Node, placeholders: list) -> tuple | None:
    """(k, shape, strides, storage offset relative to input k's) when the output `node`
    is a view of graph input k (its traced value shares that input's storage), else None.

    Such an output is returned as a view of the input, as eager PyTorch (and Inductor)
    return it, rather than computed into a new buffer: a forward graph saves the
    transposed weights of its linear layers for the backward, and copying them held a
    second copy of every weight from forward to backward."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return None
    geometry = (*val.shape, *val.stride(), val.storage_offset())
    if not all(isinstance(v, int) for v in geometry):  # symbolic: computed instead
        return None
    storage = StorageWeakRef(val.untyped_storage())
    for k, placeholder in enumerate(placeholders):
        base = placeholder.meta.get("val")
        if (
            isinstance(base, torch.Tensor)
            and base.dtype == val.dtype
            and (base.is_conj(), base.is_neg()) == (val.is_conj(), val.is_neg())  # _conj views
            and isinstance(base.storage_offset(), int)
            and StorageWeakRef(base.untyped_storage()) == storage
        ):
            offset = val.storage_offset() - base.storage_offset()
            return k, tuple(val.shape), tuple(val.stride()), offset
    return None
