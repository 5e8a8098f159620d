"""Strict-mode buffer donation: an in-place op reuses the buffer it overwrites.

Without donation an in-place update (`add_`, an optimizer's foreach step, an
`out=` write) allocates its result while the old array is still alive, so a
training step holds two copies of every parameter and optimizer moment at
its peak. When nothing but the written storage holds the old array, the op's
executable takes it as a donated argument and XLA writes the result into it.

Whether anything else holds it is read from the jax.Array object's reference
count (`sys.getrefcount`). What that relies on:

- Everything that may still need an old value holds the same Python object:
  another Storage sharing it (`tensor.clone_storage`, hence deepcopy), a fused
  segment's leaf list, the shared zeros table (`tensor._zeros`), an argument
  tuple of this very call naming it twice (two storages, one array), a user
  who took it out. Each adds a reference, and then nothing is donated.
- No code keeps a second jax.Array over the same buffer beside a storage.
  `jax.device_put(array, device)` and `array.addressable_data(0)` make such
  aliases (donating one deletes the other); torch_tpu makes none that outlive
  a statement, and code that hands storage arrays out (or takes user arrays
  in) must hand out or keep the storage's own object.
- PjRt orders a donation after the reads already dispatched on the buffer
  (a `.cpu()` copy, a reader, an earlier op), and a buffer exported to numpy
  (`np.asarray` on XLA:CPU shares memory) is copied instead of donated.

Debug mode donates too, except with NaN checks on: a check that raises after
the op ran must leave the tensor with its old value, as the plain path does.
"""

from __future__ import annotations

import sys
import warnings

from .. import cache

_DONATING: dict = {}  # _Executable -> its executable with the written storages donated
cache.on_clear(_DONATING.clear)


def held_only_by(container, index: int, holders: int) -> bool:
    """Whether nothing but the caller's `holders` known references (its storage, an
    argument tuple or leaf list) refers to container[index]: the one donation rule of
    strict ops, fused segments and compiled graphs (their tests assert that donation
    happens). The element is read and counted here, never passed to a Python function:
    an argument's count depends on how the interpreter made the call. After a failed
    torch.compile (torch 2.13, Python 3.11) every Python call holds its arguments once
    more, Dynamo's frame-evaluation hook presumably left in place, and a count read
    through an argument never allowed donation again in that process."""
    return sys.getrefcount(container[index]) <= holders + 1  # + getrefcount's argument


def not_held_only_by(container: list, indices: tuple, holders: int) -> list:
    """The indices whose elements `held_only_by` would refuse, counted in one C-level
    pass (a compiled training step checks a hundred): `map` hands getrefcount each
    element as the one reference its iteration holds, as container[index] does."""
    counts = list(map(sys.getrefcount, container))
    limit = holders + 1
    return [k for k in indices if counts[k] > limit]


def possible(arrays: tuple, written_slots: tuple, holders: int = 2) -> bool:
    """True when each written storage's array is held by its storage alone and the
    call's argument tuple (holders=1: by the tuple alone, the storage already holding
    the op's pending result: a strict window's run, fuse._run_each)."""
    return all(held_only_by(arrays, slot, holders) for slot in written_slots)


class _Donating:
    """The entry's program with its written storages passed apart and donated; called
    like the plain executable, (storage arrays, dynamic scalars, rng inputs). fn may
    still be compiling on a worker thread (`cache.Compiling`): the first call waits."""

    __slots__ = ("fn", "written", "kept", "entry", "errors")

    def __init__(self, fn, written: tuple, kept: tuple, entry, errors) -> None:
        self.fn = fn
        self.written = written
        self.kept = kept
        self.entry = entry
        self.errors = errors  # (executor.lowering_errors of the op: an XLA error names it)

    def __call__(self, arrays: tuple, dynamic: tuple, key_inputs: tuple):
        fn = self.fn
        if type(fn) is cache.Compiling:
            try:
                with self.errors:
                    fn = self.fn = fn.result()
            except BaseException:
                _DONATING.pop(self.entry, None)  # (the next call compiles again)
                raise
        donated = tuple([arrays[s] for s in self.written])
        kept = tuple([arrays[s] for s in self.kept])
        new_values, fresh = fn(donated, kept, dynamic, key_inputs)
        return fresh, new_values


def started(entry) -> bool:
    """Whether the entry's donating executable exists or is compiling."""
    return entry in _DONATING


def ready(entry) -> bool:
    """Whether the entry's donating executable is compiled (not absent, not compiling on
    a worker thread)."""
    found = _DONATING.get(entry)
    return found is not None and type(found.fn) is not cache.Compiling


def executable(
    entry, arrays: tuple, dynamic: tuple, key_inputs: tuple, lowering_errors, compile_with=None
):
    """The entry's donating executable, compiled at its first use (by `compile_with`,
    `cache.compile` unless given `cache.compile_soon`; arrays may then be avals)."""
    found = _DONATING.get(entry)
    if found is not None:
        return found
    written = entry.donated_slots
    kept = tuple(s for s in range(len(arrays)) if s not in written)
    program = entry.program

    def donating(donated, kept_arrays, dyn, keys):
        storages = [None] * (len(donated) + len(kept_arrays))
        for slot, array in zip(written, donated):
            storages[slot] = array
        for slot, array in zip(kept, kept_arrays):
            storages[slot] = array
        fresh, new_values = program(tuple(storages), dyn, keys)
        # new values first: JAX pairs each donated input with the first unpaired result of
        # its shape and dtype, so each is written in place with its own new value (first
        # came a fresh result, such as batch norm's save_mean beside running_mean)
        return new_values, fresh

    example = (
        tuple(arrays[s] for s in written),
        tuple(arrays[s] for s in kept),
        dynamic,
        key_inputs,
    )
    with lowering_errors, warnings.catch_warnings():
        # a written storage no result can reuse (none here: results are storage-shaped)
        warnings.filterwarnings("ignore", "Some donated buffers were not usable")
        fn = (compile_with or cache.compile)(
            donating,
            example,
            kind="op",
            name=entry.name,
            signature=entry.signature,
            donate_argnums=(0,),
        )
    found = _DONATING[entry] = _Donating(fn, written, kept, entry, lowering_errors)
    return found
