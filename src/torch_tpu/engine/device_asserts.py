"""Index values (and other values CPU refuses) checked on the device, reported at the
next host read.

CPU refuses an
out-of-range index at the call. Reading index values there would cost tpu a host sync
per indexing op, so strict and fused modes used to clamp or drop them silently: an
embedding fed a token id past the vocabulary, or a loss fed a class id past the classes,
trained on wrong numbers. Now the program of each op with a device check (a lowering's
`device_check`: gather, scatter, index_select, x[idx], embedding, nll_loss...) also
folds "was any index out of range" into one int32 flag on the device: a hidden storage
that every such op reads and writes, so strict ops, fused segments, compiled graphs and
donation carry it like any written tensor. The host reads the flag at its next read of a
device value (`.item()`, `.cpu()`, printing, `torch.tpu.synchronize()`), only when a
checked op ran since the last read, and raises CPU's error type naming the op: what
CUDA's device-side asserts do. The flag holds the first failure's code (an index into
`_ERRORS`, assigned when a program is traced) and is cleared when it is reported.
The same flag carries other values CPU refuses at the call: zeros in an integer divisor,
probabilities outside [0, 1], invalid distributions, margin-loss classes; a lowering's
`device_check_applies` leaves it off calls that cannot fail (float division).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch

from .. import platform
from ..tensor import new_tensor, storage_of

_CODES: dict[tuple, int] = {}  # (op, error type, message) -> code
_ERRORS: list[tuple] = [("", RuntimeError, "")]  # code -> (op, error type, message)
_flag: torch.Tensor | None = None  # 0-d int32 tpu tensor: the first failure's code, or 0
_unread = False  # a checked op ran since the flag was last read
# (array, flag value): a compiled training step's loss storage, [loss, that flag value]
_carrier: tuple | None = None


def checks(lowering, values: list) -> bool:
    """Whether a call of this lowering with these (bound) arguments checks values on
    the device: its lowering has a device check that applies to them. The answer depends
    only on what an executable is keyed by (argument kinds, dtypes), so every call of one
    executable carries the flag, or none does."""
    if lowering.device_check is None:
        return False
    applies = lowering.device_check_applies
    return applies is None or applies(values)


def flag_storage():
    """The flag's storage, appended to the storages of every checked op's call."""
    global _flag
    if _flag is None:
        _flag = new_tensor((), torch.int32, _zeros())
    return storage_of(_flag)


def _zeros():
    return platform.put(np.zeros((), np.int32))


def fold(flag, failures: list, op: str):
    """Inside a program: flag with the code of the first of `failures` ((bad, error
    type, message), bad a traced bool) that holds, unless it already holds a code."""
    for bad, error, message in failures:
        key = (op, error, message)
        code = _CODES.get(key)
        if code is None:
            code = _CODES[key] = len(_ERRORS)
            _ERRORS.append(key)
        flag = jnp.where((flag == 0) & bad, jnp.int32(code), flag)
    return flag


def noted() -> None:
    """A checked op ran (or was recorded): the next host read reads the flag."""
    global _unread
    _unread = True


def carried(array) -> None:
    """`array` (a compiled training step's loss storage) holds the loss and, after it,
    the flag value the step just wrote: a host read of the loss reads the flag with it.
    On a TPU v5e each array read after a step cost 0.3 ms and a second one, even with
    both copies started at once, 0.2 ms more: a loss read was two (`runtime.py`,
    `pack_flag`)."""
    global _carrier
    _carrier = (array, flag_storage().value)


def _carried_value():
    """The carrier's array while the flag still holds the value it carries, else None."""
    carrier = _carrier
    if carrier is not None and carrier[1] is flag_storage().value:
        return carrier[0]
    return None


def prefetch() -> None:
    """At a host read, once the value read is dispatched: start copying the flag to the
    host, so that its transfer overlaps the value's rather than following it (not on
    XLA:CPU, where there is no transfer and starting one costs more than the read)."""
    if _unread and platform.device().platform != "cpu":
        value = _carried_value()
        if value is None:
            value = flag_storage().value
        if value is not None and hasattr(value, "copy_to_host_async"):
            value.copy_to_host_async()


def raise_if_failed() -> None:
    """At a host read: raise the error of the first failed check since the last one."""
    global _unread, _carrier
    if not _unread:
        return
    _unread = False
    carried_value = _carried_value()
    _carrier = None
    storage = flag_storage()
    if carried_value is not None:  # (its host copy is cached when the loss was read)
        code = int(np.asarray(carried_value)[1])
    else:
        code = int(np.asarray(storage.array("device check")))
    if code:
        storage.value = _zeros()  # reported once; the device goes on
        op, error, message = _ERRORS[code]
        raise error(
            f"{message} (tpu: found in a call of {op} since the last host read; tpu "
            "checks such values on the device and reports them at the next read of a "
            "value, as CUDA's device-side asserts do; eager debug mode, "
            "torch.tpu.set_eager_mode('debug'), stops at the call itself)"
        )
