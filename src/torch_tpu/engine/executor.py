"""Strict eager execution: each ATen call runs as one cached, jitted XLA executable.

The executable reads every input tensor through its strides from its
storage's flat array, applies the lowering, casts each result to the dtype
PyTorch's own meta kernel gives, and writes in-place results back through
the target's strides. It is cached by the op, its static arguments and the
geometry of every input, so a loop compiles once. Dispatch is asynchronous:
the host waits only when it reads a value.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
import warnings
from dataclasses import dataclass, field, replace

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch._subclasses.fake_tensor import DataDependentOutputException

from .. import cache, dtypes, env, memory_errors, metrics, platform, precision, rng, strided
from ..ops.pointwise import convert, scalar_type_name
from ..ops.registry import Lowering, take_result_prefix
from ..tensor import Fresh, new_tensor, storage_of, view_of
from . import (
    arguments,
    debug,
    device_asserts,
    donation,
    fallback,
    fastpath,
    fuse,
    host_moves,
    modes,
    predrawn,
    refusals,
)
from .schema import Kind, OpSchema

DEVICE_TYPE = "tpu"


@dataclass(frozen=True, eq=False)
class OpSpec:
    """How one registered overload maps onto a lowering (hashed by identity: it is
    part of every cache key, and hashing its fields would cost more than the op)."""

    schema: OpSchema
    lowering: Lowering
    lowering_args: tuple[int, ...]  # which schema args the lowering receives
    targets: tuple[int | None, ...]  # per lowering output: the arg it is written into, or None
    kinds: tuple[Kind, ...] = field(default=())
    # PyTorch hands this op conjugate / negative views as they are (mm, copy_, clone...;
    # for every other op it resolves them first): its signature must tell them apart
    sees_bits: bool = False
    # schema args the op writes (out=, self of an in-place op): a host tensor there
    # cannot be uploaded, since the result would land in the upload, not in it
    written_args: frozenset = frozenset()
    # tensor args a lowering takes as a run-time float (a fused optimizer's tensor lr):
    # a one-element CPU tensor there is read as CUDA's fused kernels read it, a number
    host_numbers: frozenset = frozenset()
    # per schema arg: the default of a run-time scalar (alpha=1, negative_slope=0.01),
    # else NO_DEFAULT. A call passing exactly it (same type, same value) bakes it into
    # the program: the commonest call, `a + b`, then takes no scalar input at all.
    scalar_defaults: tuple = ()


NO_DEFAULT = object()


def _scalar_default(arg, kind: Kind) -> object:
    """A scalar arg's default when a program may take it as a constant. Not a float
    zero: 0.0 == -0.0, and the constant would lose the sign of a -0.0 passed."""
    default = arg.default if kind is Kind.SCALAR and arg.has_default else None
    if default is None or type(default) not in (int, float) or default == 0.0:
        return NO_DEFAULT
    return default


def make_spec(schema: OpSchema, lowering: Lowering, lowering_args=None, targets=None) -> OpSpec:
    if lowering_args is None:
        lowering_args = tuple(range(len(schema.args)))
    if targets is None:
        names = [a.name for a in schema.args]
        targets = tuple(schema.return_aliases) + tuple(names.index(w) for w in lowering.writes)
    kinds = tuple(_kind(a, lowering) for a in schema.args)
    name = schema.name.removesuffix(".default")
    sees_bits = any(
        torch._C._dispatch_has_kernel_for_dispatch_key(name, key)
        for key in ("Conjugate", "Negative")
    )
    written_args = frozenset(t for t in targets if t is not None) | {
        index for index, arg in enumerate(schema.args) if arg.written
    }
    host_numbers = frozenset(
        index
        for index, arg in enumerate(schema.args)
        if arg.kind is Kind.TENSOR and arg.name in lowering.runtime_floats
    )
    return OpSpec(
        schema,
        lowering,
        tuple(lowering_args),
        tuple(targets),
        kinds,
        sees_bits,
        written_args,
        host_numbers,
        tuple(_scalar_default(a, k) for a, k in zip(schema.args, kinds)),
    )


def _kind(arg, lowering: Lowering) -> Kind:
    if arg.kind in (Kind.SCALAR, Kind.SCALAR_LIST) and lowering.static_scalars:
        return Kind.STATIC
    if arg.kind is Kind.STATIC and arg.name in lowering.runtime_floats:
        return Kind.SCALAR
    return arg.kind


class _Inputs:
    """The storages one call touches, deduplicated, and the cache key being built."""

    __slots__ = ("storages", "slots", "dynamic")

    def __init__(self) -> None:
        self.storages: list = []
        self.slots: dict[int, int] = {}
        self.dynamic: list = []

    def tensor(self, t: torch.Tensor, host_ok: bool = False, written: bool = False):
        if t.is_cpu or t.is_meta:  # (cheaper than building t.device on every call)
            if not fallback.reads_host(t, host_ok, written):  # (the CPU fallback's rule too)
                raise fallback.device_mismatch(t.device)
            t = upload(t)
        storage = storage_of(t)
        slot = self.slots.get(id(storage))
        if slot is None:
            slot = self.slots[id(storage)] = len(self.storages)
            self.storages.append(storage)
        view = view_of(t, storage)
        if strided.offset_may_vary(view):  # (a run-time value: fastpath.add_tensor too)
            self.dynamic.append(view.offset)
            view = view._replace(offset=strided.Offset(len(self.dynamic) - 1))
        return (slot, view)


def _static(value):
    if isinstance(value, list):
        return tuple(_static(v) for v in value)
    if isinstance(value, torch.Generator):
        # as CUDA does: a generator of another device cannot drive this one, and
        # ignoring it would silently break the reproducibility it was passed for
        raise RuntimeError(
            f"Expected a 'tpu' device type for generator but found '{value.device.type}': "
            "tpu random numbers come from torch.manual_seed / torch.tpu.manual_seed (a tpu "
            "torch.Generator cannot exist in PyTorch 2.13's Python backends); to use this "
            "generator, draw on the CPU and move the result with .to('tpu')"
        )
    return value


def _layout(spec: OpSpec, values: list, inputs: _Inputs) -> tuple:
    """Per schema arg, its hashable description: tensor (slot, view), scalar type, or value."""
    layout = []
    written = spec.written_args
    defaults = spec.scalar_defaults
    for index, (kind, value) in enumerate(zip(spec.kinds, values)):
        if value is None:
            layout.append(None)
        elif kind is Kind.TENSOR or kind is Kind.OPT_TENSOR:
            if isinstance(value, torch.Tensor):
                number = index in spec.host_numbers and value.numel() == 1
                layout.append(("t", inputs.tensor(value, number, index in written)))
            else:  # a Python number PyTorch wrapped as a tensor: weakly typed, like a Scalar
                layout.append(("s", len(inputs.dynamic), type(value)))
                inputs.dynamic.append(value)
        elif kind is Kind.TENSOR_LIST or kind is Kind.INDEX_LIST:
            # CPU index tensors are accepted, as CUDA accepts them (copied over)
            host_ok = kind is Kind.INDEX_LIST
            write = index in written
            layout.append(
                ("l", tuple(None if t is None else inputs.tensor(t, host_ok, write) for t in value))
            )
        elif kind is Kind.SCALAR:
            default = defaults[index]
            if type(value) is type(default) and value == default:
                layout.append(("v", value))
                continue
            layout.append(("s", len(inputs.dynamic), type(value)))
            inputs.dynamic.append(value)
        elif kind is Kind.SCALAR_LIST:  # foreach ops' per-tensor scalars (bias corrections)
            start = len(inputs.dynamic)
            layout.append(("sl", tuple((start + k, type(v)) for k, v in enumerate(value))))
            inputs.dynamic.extend(value)
        else:
            layout.append(("v", _static(value)))
    return tuple(layout)


@dataclass(eq=False)
class _Executable:
    # compiled (storage arrays, dynamic scalars, rng inputs) -> (fresh, written); None
    # until strict or debug mode first runs it (fused mode replays `program` instead)
    fn: object
    program: object  # the pure function: compiled by the cache, or replayed in a segment
    fresh: tuple  # per fresh output: (shape, torch dtype) or a list of them
    written_slots: tuple[int, ...]
    # arg index -> (shape, strides or None) that out= arguments must be resized to first
    resize: dict
    name: str = ""  # the ATen op, for metrics and segment names
    signature: list = field(default_factory=list)  # (arg, storage shape, dtype) per slot
    recheck: bool = False  # the lowering's check depends on values: run it on every call
    traced: bool = False  # the program traced once without error (fused mode checks first)
    # written_slots less the device-check flag's (engine/device_asserts.py): what strict
    # mode donates (a 4-byte flag is not worth a donating executable of its own)
    donated_slots: tuple[int, ...] = ()
    # its calls carry the device-check flag in their last slot (`device_asserts.checks`)
    checked: bool = False
    # strict mode's repeat calls of a plain entry (`_plain_call`): None until it is
    # compiled, False for an entry that is not plain
    plain: object = None
    # fused mode's repeat calls of a plain entry (`_plain_record`): None until it is
    # traced, False for an entry that is not plain
    recorder: object = None
    # elements an elementwise draw takes predrawn bits for in strict and debug modes
    # (engine/predrawn.py), fixed per entry: its executable takes one kind of rng input
    predrawn: int = 0
    spec: object = None  # the OpSpec (a strict window's run compiles what it lacks)
    # strict mode's first calls of a data-movement program run on the host
    # (engine/host_moves.py), as an elementwise draw's run through its bucket: the
    # HostPlan (True for a draw), None until planned, False when no more calls are
    # served that way (or none can be)
    host_plan: object = None
    hosted: int = 0  # first calls served: at host_moves.calls_before_compile(), compile
    traced_at_first_call: object = None  # (the plan's trace, for the compile that follows)
    # strict mode: compiling(entry) waits for the executable compiling on a worker
    # thread, sets fn and returns it (`_compile_soon`); None when no compile runs ahead
    compiling: object = None
    # the written slots the program never reads (fill_, a random fill, an out= write):
    # None until a call finds one of them never written (`_unread_written`)
    unread: tuple | None = None
    # per tuple of such slots never written at a call: the executable without them
    without: dict = field(default_factory=dict)


_CACHE: dict[tuple, _Executable] = {}
_DEBUG = modes.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING
_STRICT = modes.EagerMode.DEFER_NEVER
cache.on_clear(_CACHE.clear)


def run(spec: OpSpec, args: tuple, kwargs: dict):
    """Execute one ATen call on tpu tensors; returns what the op returns."""
    precision.sync()
    try:
        if modes.current is modes.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING:
            return debug.guarded(_run, spec, args, kwargs)
        return _run(spec, args, kwargs)
    except jax.errors.JaxRuntimeError as error:
        memory_errors.raise_if_out_of_memory(error)
        raise


def _run(spec: OpSpec, args: tuple, kwargs: dict):
    values = spec.schema.bind(args, kwargs)
    fast = None
    if modes.current is not _DEBUG:
        fast = fastpath.signature(spec, values)
        if fast is not None:
            entry = fastpath.lookup(fast[0])
            if entry is not None:  # a repeat call: no layout, key, meta kernel or check
                metrics.count_hit()
                if modes.current is _STRICT:
                    if fuse.window:
                        return _behind_compiles(spec, entry, values, fast[1], fast[2])
                    plain = entry.plain
                    if plain:
                        return plain(fast[1], fast[2])
                    return _execute(spec, entry, values, fast[1], fast[2])
                recorder = entry.recorder
                if recorder:
                    return recorder(entry, values, fast[1], fast[2])
                return _record(spec, entry, values, fast[1], fast[2])
    inputs = _Inputs()
    layout = _layout(spec, values, inputs)
    if device_asserts.checks(spec.lowering, values):
        inputs.storages.append(device_asserts.flag_storage())  # (the last slot)
    key = (spec, layout)
    entry = _CACHE.get(key)
    metrics.count("ops_dispatched")
    check = spec.lowering.check
    if entry is None:
        # PyTorch's checks its meta kernels miss; a True verdict means "depends on
        # values": run again on every call of this key (index bounds, mask counts)
        recheck = check is not None and bool(check(values))
        dynamic = spec.lowering.dynamic_shape
        if dynamic is True or (dynamic and dynamic(values)):
            return _run_unjitted(spec, values, layout, inputs)
        entry = _CACHE[key] = _build(spec, values, layout)
        entry.recheck = recheck
        entry.predrawn = _predrawn_elements(spec, values)
    else:
        metrics.count("cache_hits")
        if check is not None and not entry.resize and (entry.recheck or modes.current is _DEBUG):
            # (debug mode also checks values that cost a sync: index bounds; a call that
            # resizes its outs is checked after the resize, as the first call was)
            check(values)
    if entry.resize:  # out= arguments of the wrong size: resize them, then run
        for index, (shape, strides) in entry.resize.items():
            _warn_resized(spec, values[index], shape)
            # resize_, as CPU's resize_output: in place where the storage holds the new
            # size, so an out= view stays a view (ATen's fftfreq writes its negative half
            # through an empty slice of its output grown this way); then, as CPU's out=
            # kernels restride an out they resize, the strides CPU gives it
            # (`_out_resizes`: column-major for linalg results)
            values[index].resize_(shape)
            if strides is not None:
                values[index].as_strided_(shape, strides)
        return _run(spec, args, kwargs)
    result = _call(spec, entry, values, inputs)
    if fast is not None:  # it ran: later calls that look the same take the fast path
        fastpath.remember(fast[0], entry)
    return result


def _plain_maker(spec: OpSpec, entry: _Executable) -> Fresh | None:
    """The one output's Fresh of the commonest call (one fresh tensor out, nothing
    written, donated, drawn at random or checked on the device), else None."""
    maker = _maker(entry.fresh[0]) if len(entry.fresh) == 1 else None
    if (
        type(maker) is not Fresh  # (an absent output or a list of them)
        or entry.written_slots
        or spec.lowering.random
        or entry.checked
        or spec.schema.return_aliases != (None,)
    ):
        return None
    return maker


def _plain_call(spec: OpSpec, entry: _Executable):
    """For the commonest strict call (`_plain_maker`), `_execute` with every decision
    already taken: (storages, run-time scalars) -> the result. False for any other
    entry."""
    maker = _plain_maker(spec, entry)
    if maker is None:
        return False
    fn, make = entry.fn, maker.make
    device_scalars = fastpath.device_scalars

    def plain(storages: list, dynamic: list) -> torch.Tensor:
        fresh, _ = fn(tuple([s.array() for s in storages]), device_scalars(dynamic), ())
        return make(fresh[0])

    return plain


def _plain_record(spec: OpSpec, entry: _Executable):
    """The fused counterpart of `_plain_call`, for an op with one result: one fresh
    tensor (`_plain_maker`), or one written storage whose argument it returns (an
    in-place op: an optimizer's updates). `_record` with every decision already taken:
    (entry, args, storages, run-time scalars) -> the result. False for any other entry.
    (The entry is an argument, not captured: an entry holding a closure that holds it
    is a reference cycle, and its executable then outlived the cache's forgetting it
    until the next garbage collection.)"""
    record = fuse.record_one
    maker = _plain_maker(spec, entry)
    if maker is not None:
        make, shape = maker.make, fuse.fresh_shapes(entry)[0]

        def fresh(entry, values: list, storages: list, dynamic: list) -> torch.Tensor:
            return make(record(entry, storages, dynamic, shape, False))

        return fresh
    aliases = spec.schema.return_aliases
    if (
        entry.fresh
        or len(entry.written_slots) != 1
        or spec.lowering.random
        or entry.checked
        or len(aliases) != 1
        or aliases[0] is None
    ):
        return False
    slot, alias = entry.written_slots[0], aliases[0]

    def in_place(entry, values: list, storages: list, dynamic: list) -> torch.Tensor:
        storage = storages[slot]
        storage.value = record(entry, storages, dynamic, storage.shape, True)
        return values[alias]

    return in_place


def _key_inputs(spec: OpSpec, predrawn_elements: int = 0):
    """A random op's key, or the bits of a draw of `predrawn_elements` (engine/predrawn.py)."""
    if not spec.lowering.random:
        return ()
    words = rng.next_key_words()
    if predrawn_elements:
        return (predrawn.bits(words, predrawn_elements),)
    return (predrawn.key(words),)


def _predrawn_elements(spec: OpSpec, values: list) -> int:
    """For an elementwise draw into `self` that predrawn bits serve, its element count."""
    if not spec.lowering.elementwise_draw:
        return 0
    target = values[0]
    n = target.numel()
    return n if predrawn.serves(n) and not target.is_complex() else 0  # (complex normal_
    # draws from a split key)


# what a random op's program takes where its key goes (`predrawn.key`'s result)
_ABSTRACT_KEY = (jax.ShapeDtypeStruct((2,), np.uint32),)


def _call(spec: OpSpec, entry: _Executable, values: list, inputs: _Inputs):
    if modes.current is not modes.EagerMode.DEFER_AND_FUSE:
        if fuse.window and modes.current is _STRICT:
            return _behind_compiles(spec, entry, values, inputs.storages, inputs.dynamic)
        return _execute(spec, entry, values, inputs.storages, inputs.dynamic)
    return _record(spec, entry, values, inputs.storages, inputs.dynamic)


def _record(spec: OpSpec, entry: _Executable, values: list, storages: list, dynamic: list):
    """Fused mode: add the op to the pending segment; its outputs are pending values."""
    # Python numbers go to the executable as they are (weakly typed, as jnp.asarray
    # would make them): cheaper than a device array per new value (an optimizer's
    # bias corrections change every step)
    dynamic = tuple(dynamic)
    current = [s.current() for s in storages]
    if not entry.traced:
        _trace_once(spec, entry, storages, dynamic)
    if entry.recorder is None:
        entry.recorder = _plain_record(spec, entry)
    fresh, written = fuse.record(entry, current, dynamic, _key_inputs(spec))
    return _results(spec, entry, values, storages, fresh, written)


def _execute(spec: OpSpec, entry: _Executable, values: list, storages: list, dynamic: list):
    """Run the executable now (strict and debug modes); an in-place op donates the
    buffers it overwrites when nothing else holds them (engine/donation.py)."""
    # (host_plan turns False when the first calls are over: a donating entry, whose fn
    # stays None, pays only the first two tests from then on)
    first_call = entry.fn is None and entry.host_plan is not False and modes.current is _STRICT
    if first_call and spec.lowering.random:
        if spec.lowering.elementwise_draw and _drawn_in_bucket(spec, entry, values):
            return values[0]
        entry.host_plan = first_call = False  # (no other random program is served)
    written = entry.donated_slots
    numbers = dynamic
    dynamic = fastpath.device_scalars(dynamic)
    key_inputs = _key_inputs(spec, entry.predrawn)
    skip = ()
    if written and not first_call and any(storages[k].value is None for k in written):
        skip = _never_written_unread(spec, entry, storages, dynamic, key_inputs)
    if skip:  # (not materialised as zeros: a second buffer and a zeros program)
        arrays = tuple([None if k in skip else s.array() for k, s in enumerate(storages)])
        fn = _without(spec, entry, skip, storages, arrays, dynamic, key_inputs)
    else:
        arrays = tuple([s.array() for s in storages])
        if first_call:
            served = _on_host(spec, entry, (arrays, dynamic, key_inputs))
            if served is not None:
                return _results(spec, entry, values, storages, *served)
        donate = bool(written) and donation.possible(arrays, written)
        donate = donate and not (modes.check_nans and modes.current is _DEBUG)
        if (
            (not donation.ready(entry) if donate else entry.fn is None)  # (later calls: this)
            and modes.current is _STRICT
            and _recordable(spec, entry, storages)
            and env.compile_threads() > 0
            and _compiling_ahead(spec, entry, arrays, dynamic, donate)
        ):  # (its executable compiling: record this call, run it at the next read)
            fuse.open_window(_run_node)
            return _record(spec, entry, values, storages, numbers)
        if donate:
            fn = donation.executable(
                entry, arrays, dynamic, key_inputs, lowering_errors(spec.schema.name)
            )
            metrics.count("buffers_donated", len(written))
        else:
            fn = entry.fn or _compile(spec, entry, arrays, dynamic, key_inputs)
    if modes.current is _STRICT:
        fresh, written = fn(arrays, dynamic, key_inputs)
    else:
        fresh, written = debug.run_blocking(spec, values, fn, arrays, dynamic, key_inputs)
    return _results(spec, entry, values, storages, fresh, written)


def _never_written_unread(
    spec: OpSpec, entry: _Executable, storages: list, dynamic: tuple, key_inputs: tuple
) -> tuple:
    """The written slots of this call whose storage was never written (no array yet) and
    that the program never reads: `torch.ones` is `empty` and `fill_`, and materialising
    the empty storage as zeros ran a zeros program and held a second buffer (on a TPU
    until the next op) for a value fill_ overwrites unread."""
    unread = entry.unread
    if unread is None:
        unread = entry.unread = _unread_written(spec, entry, storages, dynamic, key_inputs)
    return tuple(k for k in unread if storages[k].value is None)


def _unread_written(
    spec: OpSpec, entry: _Executable, storages: list, dynamic: tuple, key_inputs: tuple
) -> tuple:
    """The written slots whose input the program never reads (traced once per entry)."""
    abstract = tuple(jax.ShapeDtypeStruct(s.shape, s.dtype) for s in storages)
    with lowering_errors(spec.schema.name):
        closed = jax.make_jaxpr(entry.program)(abstract, dynamic, key_inputs)
    jaxpr = closed.jaxpr
    read = {id(v) for eqn in jaxpr.eqns for v in eqn.invars}
    read.update(id(v) for v in jaxpr.outvars)
    inputs = jaxpr.invars[: len(storages)]
    return tuple(k for k in entry.donated_slots if id(inputs[k]) not in read)


class _Without:
    """An entry's executable compiled without some storage inputs (slots it never reads,
    whose storages hold no array); called like the plain executable, None in those
    slots."""

    __slots__ = ("fn", "skip")

    def __init__(self, fn, skip: tuple) -> None:
        self.fn = fn
        self.skip = skip

    def __call__(self, arrays: tuple, dynamic: tuple, key_inputs: tuple):
        given = tuple([a for k, a in enumerate(arrays) if k not in self.skip])
        return self.fn(given, dynamic, key_inputs)


def _without(
    spec: OpSpec, entry: _Executable, skip: tuple, storages: list, arrays: tuple, dynamic,
    key_inputs,
) -> _Without:
    """The entry's executable without the storage inputs in `skip`, compiled once."""
    found = entry.without.get(skip)
    if found is not None:
        return found
    program, n = entry.program, len(arrays)
    skipped = {k: (storages[k].shape, storages[k].dtype) for k in skip}

    def program_without(given, dyn, keys):
        rest = iter(given)
        # (a stand-in the program never reads: dead code that XLA removes)
        full = [jnp.zeros(*skipped[k]) if k in skipped else next(rest) for k in range(n)]
        return program(tuple(full), dyn, keys)

    example = (tuple([a for a in arrays if a is not None]), dynamic, key_inputs)
    with lowering_errors(spec.schema.name):
        fn = cache.compile(
            program_without,
            example,
            kind="op",
            name=entry.name,
            signature=[item for k, item in enumerate(entry.signature) if k not in skip],
        )
    found = entry.without[skip] = _Without(fn, skip)
    return found


def _on_host(spec: OpSpec, entry: _Executable, args: tuple):
    """A first call's (fresh, written) computed on the host, or None: compile it (from
    the trace the plan looked at, when it made one: `entry.traced_at_first_call`; a
    donating entry's executable traces its own)."""
    if entry.host_plan is None:
        _plan_on_host(spec, entry, args)
    plan = _first_calls_left(entry)
    return plan(args) if plan else None


def _plan_on_host(spec: OpSpec, entry: _Executable, args: tuple) -> None:
    """Decide once whether the entry's first calls run on the host (args: arrays or
    their avals)."""
    with lowering_errors(spec.schema.name):
        plan, traced = host_moves.plan(entry.program, args)
    entry.host_plan = plan or False
    if not entry.donated_slots:
        entry.traced_at_first_call = traced


def _first_calls_left(entry: _Executable):
    """The entry's host plan if it serves this call (and counts it), else None; after
    the last call it serves, host_plan is False: the next compiles."""
    plan = entry.host_plan
    if entry.hosted >= host_moves.calls_before_compile():
        entry.host_plan = False
        return None
    entry.hosted += 1
    return plan


def _drawn_in_bucket(spec: OpSpec, entry: _Executable, values: list) -> bool:
    """A first call of an elementwise draw into `self` at a new shape, run as the same
    draw into a flat tensor of its predrawn bucket's size (one program per bucket,
    dtype and argument kinds, not per shape) whose prefix is then copied into self (a
    data-movement program: served on the host, engine/host_moves.py). Element i of a
    draw depends on the key and i alone (`Lowering.elementwise_draw`) and the flat
    draw takes the same one step of the counter, so self gets the values it would
    have drawn itself (complex draws too, which split their key and take no predrawn
    bits: each half is elementwise). False when self is already such a flat tensor."""
    target = values[0]
    n = target.numel()
    size = predrawn.bucket_size(n)
    if (
        not predrawn.serves(n)
        or (target.dim() == 1 and n == size)
        or any(isinstance(v, torch.Generator) for v in values)
    ):
        entry.host_plan = False  # (nothing to serve: from now on the executable)
        return False
    if entry.host_plan is None:
        entry.host_plan = True
    if not _first_calls_left(entry):
        return False
    flat = torch.empty(size, dtype=target.dtype, device=target.device)
    _run(spec, (flat, *values[1:]), {})
    target.copy_(flat[: target.numel()].view(target.shape))
    return True


def _results(spec: OpSpec, entry: _Executable, values: list, storages: list, fresh, written):
    for slot, value in zip(entry.written_slots, written):
        storages[slot].value = value
    if entry.checked:
        device_asserts.noted()
    makers = _MAKERS.get(entry)
    if makers is None:
        makers = _MAKERS[entry] = tuple(_maker(meta) for meta in entry.fresh)
    if len(makers) == 1 and type(makers[0]) is Fresh:
        tensors = [makers[0].make(fresh[0])]
    else:
        tensors = [_made(maker, value) for maker, value in zip(makers, fresh)]
    return _returns(spec, values, tensors)


_MAKERS: dict = {}  # _Executable -> per fresh output its Fresh (or list of them, or None)
cache.on_clear(_MAKERS.clear)


def _maker(meta):
    if meta is ABSENT:
        return None
    if isinstance(meta, list):
        return [_maker(m) for m in meta]
    return Fresh(*meta)


def _made(maker, value):
    if maker is None:
        return None
    if isinstance(maker, list):
        return [_made(m, v) for m, v in zip(maker, value)]
    return maker.make(value)


def _compile(spec: OpSpec, entry: _Executable, arrays: tuple, dynamic: tuple, key_inputs: tuple):
    if entry.compiling is not None:
        return entry.compiling(entry)
    fn = _compile_program(cache.compile, spec, entry, (arrays, dynamic, key_inputs))
    return _compiled(spec, entry, fn)


def _compile_program(compile_with, spec: OpSpec, entry: _Executable, example: tuple):
    """compile_with (`cache.compile` or `cache.compile_soon`) of the entry's program at
    example, from the trace its host plan made when it made one."""
    traced, entry.traced_at_first_call = entry.traced_at_first_call, None
    with lowering_errors(spec.schema.name):
        return compile_with(
            entry.program,
            example,
            kind="op",
            name=entry.name,
            signature=entry.signature,
            traced=traced,
        )


def _recordable(spec: OpSpec, entry: _Executable, storages: list) -> bool:
    """Whether a strict op may be recorded while first calls compile on worker threads
    (`fuse.open_window`): one that draws nothing (its key kind stays strict's), checks
    no index on the device and writes no storage that was never written (reading it
    would materialise zeros; executed, strict mode skips them). A window that fails
    gives back what it wrote (`fuse._restore`)."""
    if spec.lowering.random or entry.checked:
        return False
    return all(storages[slot].value is not None for slot in entry.donated_slots)


def _behind_compiles(spec: OpSpec, entry: _Executable, values: list, storages: list, dynamic):
    """A strict op while first calls compile ahead: recorded if it can be and reads a
    value still pending; else `_execute` (which records a first call that can be, and
    runs anything else now: reading a pending value then runs the recorded ops first,
    as any read does). A first call that moves data only is served on the host, as
    without a window (`host_moves`): a compile saved beats a longer window. An op
    that writes starts compiling its donating executable, which its later calls use."""
    if any(type(s.value) is fuse.Pending for s in storages) and _recordable(
        spec, entry, storages
    ):
        if entry.fn is None and entry.compiling is None and not donation.started(entry):
            # (placed as committed arrays are: the program's text, hence its key, the same)
            placed = jax.sharding.SingleDeviceSharding(platform.device())
            abstract = tuple(
                jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=placed) for s in storages
            )
            args = (abstract, fastpath.device_scalars(dynamic), ())
            if entry.host_plan is None:
                _plan_on_host(spec, entry, args)
            if entry.host_plan and entry.hosted < host_moves.calls_before_compile():
                return _execute(spec, entry, values, storages, dynamic)
            _compile_soon(spec, entry, *args[:2], donating=bool(entry.donated_slots))
        return _record(spec, entry, values, storages, dynamic)
    return _execute(spec, entry, values, storages, dynamic)


def _compiling_ahead(
    spec: OpSpec, entry: _Executable, arrays: tuple, dynamic: tuple, donating: bool
) -> bool:
    """Whether the executable this first call needs (donating: the one that donates its
    written storages) compiles on a worker thread, its compile started here if not
    yet; False when the cache held it."""
    if donating:  # (the caller saw it not ready: started means compiling)
        return donation.started(entry) or _compile_soon(spec, entry, arrays, dynamic, True)
    return entry.compiling is not None or _compile_soon(spec, entry, arrays, dynamic, False)


def _compile_soon(
    spec: OpSpec, entry: _Executable, arrays: tuple, dynamic: tuple, donating: bool
) -> bool:
    """Start compiling the entry's executable (donating: `donation.executable`'s) on a
    worker thread (`cache.compile_soon`: traced and lowered here, so a lowering's error
    names this call); False when the cache held it (nothing to wait for)."""
    if donating:
        errors = lowering_errors(spec.schema.name)
        found = donation.executable(entry, arrays, dynamic, (), errors, cache.compile_soon)
        entry.traced = True
        return type(found.fn) is cache.Compiling
    found = _compile_program(cache.compile_soon, spec, entry, (arrays, dynamic, ()))
    entry.traced = True
    if not isinstance(found, cache.Compiling):
        _compiled(spec, entry, found)
        return False
    entry.compiling = functools.partial(_compiled_soon, spec, found)
    return True


def _compiled_soon(spec: OpSpec, found, entry: _Executable):
    """`entry.compiling(entry)`: wait for the compile `_compile_soon` started (the entry
    is an argument: see `_plain_record`)."""
    entry.compiling = None  # (after a failure, the next call compiles again)
    with lowering_errors(spec.schema.name):
        fn = found.result()
    return _compiled(spec, entry, fn)


def _compiled(spec: OpSpec, entry: _Executable, fn):
    """The entry's executable is fn from now on; returns it."""
    entry.fn = fn
    entry.traced = True
    if entry.plain is None:
        entry.plain = _plain_call(spec, entry)
    return fn


def _run_node(entry: _Executable, arrays: tuple, numbers: list):
    """One node of a strict window (`fuse._run_each`): (fresh outputs, written values)
    of the entry's executable, as `_execute` calls it. A write donates the buffer it
    overwrites when the window's argument tuple alone holds it (the storage already
    holds the op's result). Python numbers go as they are: the call that recorded the
    node already counted them for `fastpath.device_scalars`, and counting them again
    made a device scalar of every number seen once."""
    dynamic = tuple(numbers)
    written = entry.donated_slots
    if written and donation.possible(arrays, written, holders=1):
        errors = lowering_errors(entry.name)
        fn = donation.executable(entry, arrays, dynamic, (), errors)
        metrics.count("buffers_donated", len(written))
    else:
        fn = entry.fn or _compile(entry.spec, entry, arrays, dynamic, ())
    return fn(arrays, dynamic, ())


def _trace_once(spec: OpSpec, entry: _Executable, storages: list, dynamic: tuple) -> None:
    """Fused mode traces an op's program only when its segment flushes; tracing it once
    here, at its first call, makes a lowering's failure name this op, not the flush."""
    storages = tuple(jax.ShapeDtypeStruct(s.shape, s.dtype) for s in storages)
    key_inputs = _ABSTRACT_KEY if spec.lowering.random else ()
    with lowering_errors(spec.schema.name):
        jax.eval_shape(entry.program, storages, dynamic, key_inputs)
    entry.traced = True


# Exception types a lowering raises on purpose, with PyTorch's message; anything else
# escaping from JAX or a lowering is a bug of ours and is reported as one
_DELIBERATE = (RuntimeError, NotImplementedError, torch.linalg.LinAlgError)


class lowering_errors:
    """Last resort: an exception from inside JAX or a lowering (a TypeError, an XLA
    error) becomes a RuntimeError naming the op. PyTorch's own argument checks run
    before this point (meta kernels, lowering checks), so users see CPU's errors."""

    __slots__ = ("op",)

    def __init__(self, op: str) -> None:
        self.op = op

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, error, tb) -> bool:
        if error is None or type(error) in _DELIBERATE or not isinstance(error, Exception):
            return False
        raise RuntimeError(
            f"tpu: {self.op} failed inside its XLA lowering ({type(error).__name__}: {error})"
        ) from error


def _wrap(meta, value):
    if meta is ABSENT:
        return None
    if isinstance(meta, list):
        return [_wrap(m, v) for m, v in zip(meta, value)]
    shape, dtype, strides = meta
    return new_tensor(shape, dtype, value, strides)


def _returns(spec: OpSpec, values: list, fresh: list):
    """The op's return value: aliased args as themselves, the rest fresh tensors in order."""
    fresh_iter = iter(fresh)
    out = []
    for alias in spec.schema.return_aliases:
        out.append(values[alias] if alias is not None else next(fresh_iter))
    if len(out) == 1:
        return out[0]
    return tuple(out) if out else None


# ---------------------------------------------------------------- building


def _meta_tensor(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def to_meta(value):
    """value with its tensors as meta tensors of the same geometry (for meta kernels)."""
    return arguments.replace_tensors(value, _meta_tensor, "meta")


def _meta_run(spec: OpSpec, values: list):
    """Run the op on meta tensors: PyTorch's own shapes, dtypes and input checks; also
    `_out_result_dtypes`."""
    meta_values = [to_meta(v) for v in values]
    _accept_byte_indices(spec, meta_values)
    # (before the op: some meta kernels word the cast error otherwise)
    out_dtypes = _out_result_dtypes(spec, meta_values)
    # A meta kernel in C++ resizing a wrongly sized out warns past any Python filter
    # (PyTorch hands C++ warnings to the outermost Python call): a first run on emptied
    # outs tells their shapes, and the run on the outs as given follows only when no
    # resize is due (`_build` resizes the real outs, warning as CPU does).
    outs = _outs_with_elements(spec, meta_values)
    if outs:
        emptied = list(meta_values)
        for t in outs:
            emptied[t] = torch.empty(0, dtype=meta_values[t].dtype, device="meta")
        result = _meta_call(spec, emptied, values)
        if any(emptied[t].shape != meta_values[t].shape for t in outs):
            return emptied, result, out_dtypes
    return meta_values, _meta_call(spec, meta_values, values), out_dtypes


def _out_tensors(spec: OpSpec, values: list) -> list[int]:
    """The indices of the call's out= arguments that are tensors."""
    arguments_ = spec.schema.op._schema.arguments
    return [
        t
        for t in spec.targets
        if t is not None and arguments_[t].is_out and isinstance(values[t], torch.Tensor)
    ]


def _outs_with_elements(spec: OpSpec, values: list) -> list[int]:
    """The out= tensors holding elements, for ops whose outs resize_output resizes."""
    if spec.lowering.name in _OWN_RESIZE:
        return []
    return [t for t in _out_tensors(spec, values) if values[t].numel()]


def _meta_call(spec: OpSpec, meta_values: list, values: list):
    """The op's meta kernel on meta_values (of the call's values), its errors as CPU
    words them."""
    try:
        with _no_cuda_alerts(), warnings.catch_warnings():
            # (`_warn_resized` warns at every call that resizes, as CPU, in CPU's words)
            warnings.filterwarnings("ignore", _RESIZED)
            try:
                return arguments.call_op(spec.schema.op, meta_values)
            except NotImplementedError:
                return _derived_out_meta(spec, meta_values)
    except AssertionError as e:
        # some of PyTorch's decompositions (nll_loss's) check arguments with AssertionError
        # where CPU's kernels raise RuntimeError with the same words
        raise RuntimeError(str(e)) from None
    except RuntimeError as e:
        if str(e).startswith(_REFS_BROADCAST):
            _raise_as_tensor_iterator(spec, values)
        if str(e) == "duplicate value in the list of dims":
            _raise_repeated_dim(spec, values)
        raise


def _raise_repeated_dim(spec: OpSpec, values: list) -> None:
    """CPU's words for a dim list naming a dim twice (PyTorch's Python meta functions
    say "duplicate value"): the first repeated dim, wrapped, as CPU's bitset finds it."""
    names = [arg.name for arg in spec.schema.args]
    name = "dim" if "dim" in names else "dims"  # (flip's)
    if name not in names or not isinstance(values[0], torch.Tensor):
        return
    dims = values[names.index(name)]
    ndim, seen = max(values[0].dim(), 1), set()
    for d in dims if isinstance(dims, (list, tuple)) else ():
        d = d % ndim if -ndim <= d < ndim else d
        if d in seen:
            raise RuntimeError(f"dim {d} appears multiple times in the list of dims")
        seen.add(d)


# PyTorch's Python meta functions of elementwise ops word broadcast errors otherwise
# than CPU's TensorIterator, which folds the operands' shapes left to right (an out=
# argument is resized, not broadcast; an in-place self is an operand)
_REFS_BROADCAST = ("Attempting to broadcast a dimension of length", "output with shape torch.Size(")


def _raise_as_tensor_iterator(spec: OpSpec, values: list) -> None:
    shape = None
    for arg, value in zip(spec.schema.args, values):
        if isinstance(value, torch.Tensor) and not (arg.written and arg.kwarg_only):
            shape = value.shape if shape is None else torch._C._infer_size(shape, value.shape)
    written = [v for a, v in zip(spec.schema.args, values) if a.written and not a.kwarg_only]
    if shape is not None and written and written[0].shape != shape:
        raise RuntimeError(
            f"output with shape {list(written[0].shape)} doesn't match the broadcast shape "
            f"{list(shape)}"
        )


_RESIZED = "An output with one or more elements was resized"


def _warn_resized(spec: OpSpec, out: torch.Tensor, shape) -> None:
    """CPU's warning for an out= argument with elements resized: `resize_output`'s
    deprecation, or the op's own words (`_OWN_RESIZE`)."""
    if not out.numel():
        return
    if spec.lowering.name in _OWN_RESIZE:
        words = _OWN_RESIZE[spec.lowering.name]
        message = words and words(out, math.prod(shape))
    else:
        message = (
            f"{_RESIZED} since it had shape {list(out.shape)}, which does not match the "
            f"required output shape {list(shape)}. This behavior is deprecated, and in a "
            "future PyTorch release outputs will not be resized unless they have zero "
            "elements. You can explicitly reuse an out tensor t by resizing it, inplace, "
            "to zero elements with t.resize_(0)."
        )
    if message:
        warnings.warn(message, UserWarning, stacklevel=2)


def _arange_resized(out: torch.Tensor, size: int) -> str:
    return (
        f"The number of elements in the out tensor of shape {list(out.shape)} is "
        f"{out.numel()} which does not match the computed number of elements {size}. Note "
        "that this may occur as a result of rounding error. The out tensor will be "
        f"resized to a tensor of shape ({size},)."
    )


@contextlib.contextmanager
def _no_cuda_alerts():
    """Deterministic mode off around a meta kernel: some (histc, median(dim)) raise the
    alert meant for CUDA's kernels on every device but CPU, where CPU computes; XLA's
    kernels are deterministic."""
    if not torch.are_deterministic_algorithms_enabled():
        yield
        return
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(False)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(True, warn_only=warn_only)


def _accept_byte_indices(spec: OpSpec, meta_values: list) -> None:
    """uint8 indices where CPU takes them but PyTorch's meta kernels do not: a byte mask
    is a bool mask to CPU (with a deprecation warning; index.Tensor's meta kernel lists
    int8), and nll_loss takes byte class indices (its meta decomposition's gather not)."""
    for k, arg in enumerate(spec.schema.args):
        value = meta_values[k]
        if arg.name == "indices" and isinstance(value, (list, tuple)):
            meta_values[k] = [
                ix.bool() if isinstance(ix, torch.Tensor) and ix.dtype == torch.uint8 else ix
                for ix in value
            ]
        elif arg.name == "target" and spec.schema.name.startswith("aten::nll_loss"):
            if isinstance(value, torch.Tensor) and value.dtype == torch.uint8:
                meta_values[k] = value.long()


ABSENT = "absent"  # an output the op does not produce (a masked-out gradient)


def _describe(t) -> object:
    if t is None:
        return ABSENT
    if isinstance(t, (list, tuple)):
        return [_describe(x) for x in t]
    if t.dtype not in dtypes.TORCH_TO_JAX:  # (a RuntimeError: `x + 1j` turns a TypeError
        # into Python's "unsupported operand" message)
        raise RuntimeError(f"tpu tensors do not support dtype {t.dtype}, this op's result")
    shape = tuple(t.shape)
    return (shape, t.dtype, _kept_strides(shape, tuple(t.stride())))


def _kept_strides(shape: tuple, strides: tuple) -> tuple | None:
    """PyTorch's strides for a result, when they are a permutation of a dense layout
    (transposed results, LAPACK's column-major factors: backward formulas and user
    code can depend on them); None for row-major and for anything else, which is
    stored row-major."""
    if strides == strided.contiguous_strides(shape) or not strided.is_dense(shape, strides):
        return None
    return strides


def _build(spec: OpSpec, values: list, layout: tuple) -> _Executable:
    try:
        if spec.lowering.skip_meta:
            raise NotImplementedError
        meta_values, result, out_dtypes = _meta_run(spec, values)
        if spec.lowering.result_layout is not None:
            result = spec.lowering.result_layout(meta_values, result)
    except NotImplementedError:
        meta_values, result, out_dtypes = None, None, None
    if meta_values is not None:
        # (before CPU's refusal run: its kernel would warn about the resize once more,
        # from C++, past any filter; the run after the resize judges the call)
        resize = _out_resizes(spec, values, meta_values)
        if resize:
            return _Executable(None, None, (), (), resize)
    targets = list(arguments.tensors([values[t] for t in spec.targets if t is not None]))
    aliased = refusals.written_memory_overlaps(targets, values) if targets else ()
    casts_target = out_dtypes is not None and any(
        dtype is not None and dtype != dtypes.TORCH_TO_JAX.get(values[target].dtype)
        for dtype, target in zip(out_dtypes, spec.targets)
        if target is not None and isinstance(values[target], torch.Tensor)
    )
    refusals.check(
        spec.schema.op,
        *arguments.split_args(spec.schema.op, values),
        result,
        aliased,
        casts_target,
    )
    n_returns = len(spec.schema.return_aliases)
    results = result if isinstance(result, tuple) else (result,)
    if n_returns == 0:
        results = ()
    fresh_meta = []
    if meta_values is not None:
        for k, target in enumerate(spec.targets):
            if target is None:
                fresh_meta.append(_describe(results[k]))
            elif isinstance(values[target], torch.Tensor):
                want = tuple(meta_values[target].shape)
                out = values[target]
                if want != tuple(out.shape) and not _keeps_shape(spec, want, out):
                    # an in-place op's self keeps its shape (PyTorch's meta kernels for
                    # some, atan2_ and lt_, resize it as if it were out=; out= arguments
                    # were resized before this)
                    raise RuntimeError(
                        f"output with shape {list(out.shape)} doesn't match the "
                        f"broadcast shape {list(want)}"
                    )
    else:
        resize = _lowering_resizes(spec, values, layout)
        if resize:
            return _Executable(None, None, (), (), resize)
        fresh_meta = _eval_shapes(spec, layout)
    written = []
    for target in spec.targets:
        if target is not None and layout[target] is not None:
            entry = layout[target]
            refs = [entry[1]] if entry[0] == "t" else [r for r in entry[1] if r is not None]
            written.extend(slot for slot, _ in refs if slot not in written)
    donated = tuple(written)
    flag_slot = None
    if device_asserts.checks(spec.lowering, values):
        flag_slot = len(_abstract_storages(layout))  # (appended after the arguments')
        written.append(flag_slot)
    program = _program(spec, layout, fresh_meta, tuple(written), out_dtypes, flag_slot)
    return _Executable(
        None,
        program,
        tuple(fresh_meta),
        tuple(written),
        {},
        spec.schema.name,
        _signature(spec, layout),
        donated_slots=donated,
        checked=flag_slot is not None,
        spec=spec,
    )


# CPU resizes these ops' out= by their own rules, not resize_output's: only when its
# element count differs, where PyTorch's meta kernels make it 1-D (`arange(4, out=x)`
# keeps a (2, 2) x's shape: a (2, 2) view given as out was replaced by a new 1-D
# storage, and x never written), warning in arange's own words, or not at all
_OWN_RESIZE = {"arange.start_out": _arange_resized, "linspace.out": None, "logspace.out": None}


def _out_resizes(spec: OpSpec, values: list, meta_values: list) -> dict:
    """The out= arguments whose shape differs from what the meta kernel resized their
    stand-ins to, with that shape and the strides CPU restrides them to (`_kept_strides`
    of the stand-in's, or of a pointwise op's functional result: `_pointwise_results`),
    as CPU resizes them, with a warning."""
    resize = {}
    outs = _out_tensors(spec, values)
    results = None
    for k, target in enumerate(spec.targets):
        if target not in outs:
            continue
        meta, out = meta_values[target], values[target]
        want = tuple(meta.shape)
        if want == tuple(out.shape) or _keeps_shape(spec, want, out):
            continue
        if results is None:
            results = _pointwise_results(spec, meta_values)
        laid_out = results[k] if k < len(results) else None
        if not isinstance(laid_out, torch.Tensor) or tuple(laid_out.shape) != want:
            laid_out = meta
        resize[target] = (want, _kept_strides(want, tuple(laid_out.stride())))
    return resize


def _pointwise_results(spec: OpSpec, meta_values: list) -> tuple:
    """For the out= variant of a pointwise op, its functional's meta results (per
    target), else (): CPU's TensorIterator gives a resized out that result's layout (a
    transposed input's), where PyTorch's Python meta kernels for out= give row-major.
    (Other ops' out= meta kernels agree with CPU, or their functional's layout does
    not: FFTs, random fills.)"""
    functional = _functional_of(spec)
    if functional is None or torch.Tag.pointwise not in functional.tags:
        return ()
    try:
        results = arguments.call_op(functional, [meta_values[i] for i in spec.lowering_args])
    except Exception:  # (no meta kernel of its own, or one that refuses: keep the out='s)
        return ()
    return results if isinstance(results, tuple) else (results,)


def _lowering_resizes(spec: OpSpec, values: list, layout: tuple) -> dict:
    """Where no meta kernel tells (neither the out= variant's nor its functional's:
    `_logcumsumexp.out`): the out= arguments whose shape differs from the lowering's
    result for them, with that shape, to be resized as CPU's kernels resize their
    outs (an empty out, or a wrongly sized one with a warning), not written through
    a view of the wrong shape."""
    outs = _out_tensors(spec, values)
    if not outs:
        return {}
    shapes = _eval_shapes(replace(spec, targets=(None,) * len(spec.targets)), layout)
    resize = {}
    for k, target in enumerate(spec.targets):
        if target not in outs:
            continue
        meta = shapes[k] if k < len(shapes) else ABSENT
        if not isinstance(meta, tuple):  # (absent, or a list of tensors)
            continue
        want = meta[0]
        if want != tuple(values[target].shape) and not _keeps_shape(spec, want, values[target]):
            resize[target] = (want, None)
    return resize


def _keeps_shape(spec: OpSpec, want: tuple, out: torch.Tensor) -> bool:
    return spec.lowering.name in _OWN_RESIZE and math.prod(want) == out.numel()


def _functional_of(spec: OpSpec) -> torch._ops.OpOverload | None:
    """The functional overload whose lowering an out= or in-place variant is derived
    from (`kernels._register_variants`); None for any other op."""
    op = spec.schema.op
    if op.namespace != "aten":  # (derived variants are aten's; custom ops have none)
        return None
    out_variant = any(a.is_out for a in op._schema.arguments)
    if not out_variant and not op._schema.name.endswith("_"):
        return None
    packet, _, overload = spec.lowering.name.partition(".")
    functional = getattr(getattr(torch.ops.aten, packet), overload)
    if functional is op:
        return None
    if not out_variant and op._schema.name != functional._schema.name + "_":
        return None
    return functional


def _derived_out_meta(spec: OpSpec, meta_values: list):
    """The meta run of a derived out= variant PyTorch has no meta kernel for
    (`_native_batch_norm_legit.out`): its functional's meta kernel gives each out=
    argument's shape, and the out= stand-ins are resized to it, as CPU's kernels
    resize their outs (`_build` then resizes the real ones, warning as CPU does).
    NotImplementedError, as before, for any other op or when the functional has no
    meta kernel either."""
    functional = _functional_of(spec)
    op = spec.schema.op
    if functional is None or not any(a.is_out for a in op._schema.arguments):
        raise NotImplementedError(f"{spec.schema.name} has no meta kernel")
    results = arguments.call_op(functional, [meta_values[i] for i in spec.lowering_args])
    results = results if isinstance(results, tuple) else (results,)
    for result, target in zip(results, spec.targets):
        out = None if target is None else meta_values[target]
        if isinstance(out, torch.Tensor) and isinstance(result, torch.Tensor):
            if out.shape != result.shape:
                out.resize_(result.shape)
    returns = tuple(meta_values[a] if a is not None else None for a in spec.schema.return_aliases)
    return returns[0] if len(returns) == 1 else returns


def _out_result_dtypes(spec: OpSpec, meta_values: list) -> tuple | None:
    """For an out= or in-place variant derived from a functional lowering: per target,
    the dtype of the functional result (None where there is none, and for the arguments
    the lowering also writes, `Lowering.writes`, which keep their own dtype), after
    CPU's rule that it must cast safely to out's or self's (some of PyTorch's meta
    kernels accept any dtype: angle's out=, mul_ of an int self by 1.5, which tpu
    truncated). The result is rounded to that dtype before it is cast into out, as on
    CPU: `add(f16, f16, out=f64)` overflows where float32 arithmetic would not. None
    for any other op."""
    functional = _functional_of(spec)
    if functional is None:
        return None
    try:  # (by name where the functional takes them so: add's alpha)
        results = arguments.call_op(functional, [meta_values[i] for i in spec.lowering_args])
    except Exception:  # the out= variant's own meta kernel has already judged the call
        return None
    results = results if isinstance(results, tuple) else (results,)
    dtypes_out = []
    for result, target in zip(results, spec.targets):
        out = None if target is None else meta_values[target]
        if isinstance(out, torch.Tensor) and isinstance(result, torch.Tensor):
            _check_result_casts(result, out)
            dtypes_out.append(dtypes.TORCH_TO_JAX.get(result.dtype))  # (None: named later)
        else:
            if isinstance(out, list) and isinstance(result, list):  # foreach targets
                for each_result, each_out in zip(result, out):
                    _check_result_casts(each_result, each_out)
            dtypes_out.append(None)
    # (one per target: the written arguments after the returns take no cast)
    dtypes_out.extend([None] * (len(spec.targets) - len(dtypes_out)))
    return tuple(dtypes_out)


def _check_result_casts(result: torch.Tensor, out: torch.Tensor) -> None:
    """CPU's rule: an out= or in-place target must hold the result's dtype."""
    if not torch.can_cast(result.dtype, out.dtype):
        raise RuntimeError(
            f"result type {scalar_type_name(result.dtype)} can't be cast to the desired "
            f"output type {scalar_type_name(out.dtype)}"
        )


def _signature(spec: OpSpec, layout: tuple) -> list:
    """Per storage slot, the first argument reading it as (name, shape, dtype): what a
    recompile names when an input changed."""
    out = []
    for arg, entry in zip(spec.schema.args, layout):
        if entry is None or entry[0] not in ("t", "l"):
            continue
        refs = (
            [(arg.name, entry[1])]
            if entry[0] == "t"
            else [(f"{arg.name}[{k}]", ref) for k, ref in enumerate(entry[1]) if ref is not None]
        )
        for name, (slot, view) in refs:
            if slot == len(out):
                out.append((name, view.shape, str(view.dtype)))
    return out


def _eval_shapes(spec: OpSpec, layout: tuple) -> list:
    """Output metadata from the lowering itself, for ops PyTorch has no meta kernel for."""
    program = _program(spec, layout, None, ())
    key_inputs = _ABSTRACT_KEY if spec.lowering.random else ()
    shapes = jax.eval_shape(
        program, _abstract_storages(layout), _abstract_dynamic(layout), key_inputs
    )
    return [_meta_of(s) for s in shapes[0]]


def _meta_of(s):
    if s is None:
        return ABSENT
    if isinstance(s, (list, tuple)):
        return [_meta_of(x) for x in s]
    return (tuple(s.shape), dtypes.to_torch(s.dtype), None)


def _abstract_storages(layout):
    views = {}
    for entry in layout:
        if entry is None:
            continue
        if entry[0] == "t":
            views[entry[1][0]] = entry[1][1]
        elif entry[0] == "l":
            for ref in entry[1]:
                if ref is not None:
                    views[ref[0]] = ref[1]
    return tuple(
        jax.ShapeDtypeStruct(views[s].storage_shape, views[s].storage_dtype)
        for s in range(len(views))
    )


def _abstract_dynamic(layout):
    kinds = {}  # index -> weakly typed stand-in, as _layout numbered them
    for e in layout:
        if e is None:
            continue
        if e[0] == "s":
            kinds[e[1]] = e[2](0)
        elif e[0] == "sl":
            kinds.update((index, kind(0)) for index, kind in e[1])
        elif e[0] in ("t", "l"):
            for ref in [e[1]] if e[0] == "t" else e[1]:
                if ref is not None and type(ref[1].offset) is strided.Offset:
                    kinds[ref[1].offset.index] = 0
    return tuple(kinds[k] for k in range(len(kinds)))


def _program(
    spec: OpSpec, layout: tuple, fresh_meta, written_slots: tuple, out_dtypes=None, flag_slot=None
):
    """The pure function that becomes one XLA executable for this call's geometry
    (out_dtypes: `_out_result_dtypes`; flag_slot: the device-check flag's storage, which
    the program also writes, when the lowering has a device check)."""
    lowering = spec.lowering
    extra = {}
    if lowering.contiguity:
        extra["contiguous"] = tuple(
            strided.is_contiguous(layout[i][1][1].shape, layout[i][1][1].strides)
            for i in spec.lowering_args
            if layout[i] is not None and layout[i][0] == "t"
        )

    def program(storages, dynamic, key_inputs):
        reads = {}

        def value(ref):
            if ref is None:
                return None
            if ref not in reads:
                slot, view = ref
                reads[ref] = strided.read_with(storages[slot], view, dynamic)
            return reads[ref]

        def arg(entry):
            if entry is None:
                return None
            tag = entry[0]
            if tag == "t":
                return value(entry[1])
            if tag == "l":
                return [value(r) for r in entry[1]]
            if tag == "s":
                return dynamic[entry[1]]
            if tag == "sl":
                return [dynamic[index] for index, _ in entry[1]]
            return entry[1]

        lowering_inputs = [arg(layout[i]) for i in spec.lowering_args]
        new = {}
        if flag_slot is not None:
            failures = lowering.device_check(*lowering_inputs)
            new[flag_slot] = device_asserts.fold(storages[flag_slot], failures, spec.schema.name)
        if lowering.random:
            lowering_inputs.insert(0, predrawn.as_key(key_inputs[0]))
        outputs = lowering.fn(*lowering_inputs, **extra)
        if len(spec.targets) == 1 or not isinstance(outputs, (tuple, list)):
            outputs = (outputs,)
        fresh = []
        fresh_index = 0
        for k, (out, target) in enumerate(zip(outputs, spec.targets)):
            if out_dtypes is not None and out_dtypes[k] is not None:
                out = jax.tree.map(lambda v, d=out_dtypes[k]: convert(v, d), out)
            if target is None:
                meta = None if fresh_meta is None else fresh_meta[fresh_index]
                fresh.append(_finish(out, meta, spec))
                fresh_index += 1
                continue
            entry = layout[target]
            if entry is None:
                continue
            refs = [entry[1]] if entry[0] == "t" else entry[1]
            outs = [out] if entry[0] == "t" else out
            for ref, val in zip(refs, outs):
                slot, view = ref
                base = new.get(slot, storages[slot])
                new[slot] = strided.write_with(base, view, convert(val, view.dtype), dynamic)
        return fresh, tuple(new[s] for s in written_slots)

    return program


def _finish(out, meta, spec: OpSpec):
    """A fresh output as a flat array of PyTorch's dtype, after checking its shape."""
    if meta is ABSENT:
        return None
    if isinstance(out, (list, tuple)):
        metas = meta if meta is not None else [None] * len(out)
        return [_finish(o, m, spec) for o, m in zip(out, metas)]
    if meta is None:  # shape-finding runs: the caller flattens; None stays absent
        return None if out is None else jnp.asarray(out)
    shape, dtype, strides = meta
    return strided.fresh_storage(checked_result(out, shape, dtype, spec.schema.name), strides)


def checked_result(out, shape: tuple, dtype: torch.dtype, op: str):
    """A lowering's result as PyTorch's dtype, after checking it has PyTorch's shape
    (eager and compiled graphs alike: a wrong lowering must not pass silently)."""
    out = jnp.asarray(out)
    if tuple(out.shape) != tuple(shape):
        raise RuntimeError(
            f"tpu lowering of {op} produced shape {tuple(out.shape)}, "
            f"PyTorch expects {tuple(shape)}"
        )
    return convert(out, dtypes.TORCH_TO_JAX[dtype])


# ----------------------------------------------------- data-dependent shapes


def _run_unjitted(spec: OpSpec, values: list, layout: tuple, inputs: _Inputs):
    """Ops whose output shape depends on values (nonzero, unique): run op by op on
    concrete arrays, syncing with the device, as a TPU must."""
    if not spec.lowering.skip_meta:
        try:  # PyTorch's checks (most meta kernels stop at the data-dependent size)
            _meta_run(spec, values)  # (its checks)
        except (NotImplementedError, DataDependentOutputException):
            pass
    refusals.check_per_signature(spec.schema.op, *arguments.split_args(spec.schema.op, values))
    metrics.count("host_syncs")
    metrics.count(f"host sync: {spec.schema.name}")
    arrays = tuple(s.array(spec.schema.name) for s in inputs.storages)
    # every result fresh: out= arguments take them below, once their size is known
    as_fresh = replace(spec, targets=tuple(None for _ in spec.targets))
    program = _program(as_fresh, layout, None, ())
    dynamic = tuple(jnp.asarray(v) for v in inputs.dynamic)  # run outside jit
    with lowering_errors(spec.schema.name):
        take_result_prefix()
        fresh, _ = program(arrays, dynamic, _key_inputs(spec))
        prefix = take_result_prefix()
    tensors = [_wrap(_meta_of(f), f) for f in fresh]
    if prefix is not None:  # (a view of a bucket-sized result: ops/registry.result_prefix)
        axis, length = prefix
        tensors[0] = tensors[0].narrow(axis, 0, length)
    results = []
    for target, tensor in zip(spec.targets, tensors):
        if target is None:
            results.append(tensor)
        elif values[target] is not None:
            _write_out(spec, values[target], tensor)
    return _returns(spec, values, results)


def _write_out(spec: OpSpec, out: torch.Tensor, result: torch.Tensor) -> None:
    """A data-dependent result into its out= argument: resized as PyTorch resizes it."""
    if out.dtype != result.dtype:
        raise RuntimeError(
            f"{spec.schema.name.partition('.')[0]}: Expected out tensor to have scalar type "
            f"{scalar_type_name(result.dtype)} but got scalar type {scalar_type_name(out.dtype)}"
        )
    if tuple(out.shape) != tuple(result.shape):
        _warn_resized(spec, out, result.shape)
        out.resize_(tuple(result.shape))  # (as `_run`'s out= resizing)
    out.copy_(result)


# ------------------------------------------------------------- host copies


def upload(cpu: torch.Tensor) -> torch.Tensor:
    """A tpu copy of a CPU tensor (contiguous)."""
    # A private host copy (numpy_from_cpu's): XLA:CPU may wrap the buffer it is given
    # (and other platforms read it asynchronously), so a later in-place change to the
    # CPU tensor must not reach the buffer the device reads.
    host = dtypes.numpy_from_cpu(cpu)  # (of cpu's shape: see tensor.py)
    return new_tensor(tuple(cpu.shape), cpu.dtype, platform.put(host))


_READERS: dict = {}
cache.on_clear(_READERS.clear)


def device_value(t: torch.Tensor, reason: str = "value needed"):
    """The tensor's value as a JAX array of its shape (dispatched, not waited for)."""
    storage = storage_of(t)
    view = view_of(t, storage)
    flat = storage.array(reason)
    # an offset at run time, as for ops: `x[i].item()` in a loop reads with one program
    offset = view.offset if strided.offset_may_vary(view) else None
    if offset is not None:
        view = view._replace(offset=strided.Offset(0))
    reader = _READERS.get(view)
    if reader is None:
        reader = _READERS[view] = cache.compile(
            lambda flat, offset, view=view: strided.read_with(flat, view, (offset,)),
            (flat, offset),
            kind="op",
            name="read",
            signature=[("storage", flat.shape, str(flat.dtype))],
        )
    return reader(flat, offset)


def download(t: torch.Tensor, reason: str):
    """The tensor's value on the host as a numpy array (waits for the device)."""
    import numpy as np

    metrics.count("host_syncs")
    metrics.count(f"host sync: {reason}")
    collectives = sys.modules.get("torch_tpu.distributed.work")
    if collectives is not None:
        collectives.settle(t)  # the host reads what an unfinished collective writes
    storage = storage_of(t)
    view = view_of(t, storage)
    try:
        if strided.host_readable(view):
            # the whole storage, once: no read program to compile for this shape
            array = storage.array(reason)
            device_asserts.prefetch()
            host = strided.host_read(np.asarray(array), view)
        else:
            array = device_value(t, reason)
            device_asserts.prefetch()
            host = np.asarray(array)
    except jax.errors.JaxRuntimeError as error:  # (a computation's error surfaces here)
        memory_errors.raise_if_out_of_memory(error)
        raise
    device_asserts.raise_if_failed()
    return host
