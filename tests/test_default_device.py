"""Programs that set tpu as the default device (`torch.set_default_device("tpu")`, or
`with torch.device("tpu"):`) get the same results and errors as without it: torch_tpu's
own host-side helpers (stand-in tensors for CPU's checks, a checkpoint's storages on
their way to the device, the RNG state, pinned copies) name the CPU, where they followed
the default device and failed (torch.load raised "Attempted to set the storage of a
tensor on device tpu:0 to a storage on different device cpu")."""

import io

import pytest
import torch

from torch_tpu import bucketing


def _checkpoint() -> io.BytesIO:
    buffer = io.BytesIO()
    torch.save({"a": torch.arange(4.0, device="tpu")}, buffer)
    return buffer


def _load(buffer: io.BytesIO):
    buffer.seek(0)
    return torch.load(buffer)["a"]


CASES = {
    "torch.load of tpu tensors": lambda: _load(_checkpoint()),
    "rng state is a CPU byte tensor": lambda: torch.tpu.get_rng_state(),
    "storage from a list": lambda: torch.UntypedStorage([1, 2, 3], device="tpu").tolist(),
    "complex max refused as on CPU": lambda: torch.max(torch.tensor([1 + 1j], device="tpu")),
    "fill_ of a complex into float": lambda: torch.zeros(2, device="tpu").fill_(1 + 1j),
    "addcmul with a complex value": lambda: torch.addcmul(
        torch.zeros(2, device="tpu"), torch.ones(2, device="tpu"), torch.ones(2, device="tpu"),
        value=1j,
    ),
    "pin_memory": lambda: torch.ones(3, device="cpu").pin_memory().is_pinned(),
    "index_put_ of a CPU value through a mask": lambda: torch.zeros(3, device="tpu").index_put_(
        (torch.tensor([True, False, True], device="tpu"),), torch.tensor(5, device="cpu")
    ),
    "pad_sequences": lambda: bucketing.pad_sequences([[1, 2], [3]], device="tpu"),
}  # fmt: skip


def _outcome(fn):
    try:
        value = fn()
    except Exception as error:
        return type(error), str(error)
    values = value if isinstance(value, tuple) else (value,)
    return [
        (v.device.type, v.dtype, v.cpu().tolist()) if isinstance(v, torch.Tensor) else v
        for v in values
    ]


@pytest.mark.parametrize("name", list(CASES))
def test_tpu_as_default_device_changes_no_outcome(name):
    expected = _outcome(CASES[name])
    torch.set_default_device("tpu")
    try:
        got = _outcome(CASES[name])
    finally:
        torch.set_default_device(None)
    assert got == expected
