"""Pinned host memory and non_blocking copies (torch_tpu.pinned), in tpu programs and in
CPU-only programs of an environment where the backend is autoloaded."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.complex64]


def _sample(dtype, shape=(4, 6)):
    return (torch.randn(shape) * 5).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_pin_memory_is_a_pinned_copy_with_the_same_geometry(dtype):
    x = _sample(dtype)
    for src in (x, x.t(), x[1:, ::2]):
        pinned = src.pin_memory()
        assert pinned.is_pinned() and not src.is_pinned()
        assert pinned.untyped_storage().data_ptr() != src.untyped_storage().data_ptr()
        assert pinned.stride() == src.stride() and pinned.dtype == src.dtype
        torch.testing.assert_close(pinned, src, rtol=0, atol=0)
        assert pinned.pin_memory() is pinned  # already pinned: returned as is
        assert pinned[1:].is_pinned() and pinned.unsqueeze(0).is_pinned()  # views share it


def test_only_host_tensors_are_pinned():
    assert not torch.ones(3, device="tpu").is_pinned()
    assert not torch.ones(3).is_pinned()
    with pytest.raises(RuntimeError, match="only dense CPU tensors can be pinned"):
        torch.ones(3, device="tpu").pin_memory()


@pytest.mark.parametrize("dtype", DTYPES)
def test_non_blocking_round_trip(eager_mode, dtype):
    x = _sample(dtype)
    on_device = x.pin_memory().to("tpu", non_blocking=True)
    result = (on_device + on_device) if dtype != torch.bool else ~on_device
    back = result.to("cpu", non_blocking=True)
    expected = (x + x) if dtype != torch.bool else ~x
    assert back.is_pinned()  # as on CUDA: a non_blocking copy to the host lands in pinned memory
    torch.testing.assert_close(back, expected, rtol=0, atol=0)
    out = torch.empty_like(x).pin_memory()
    out.copy_(result, non_blocking=True)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_refilling_a_pinned_staging_buffer_keeps_values_already_on_the_device(eager_mode):
    """The usual double-buffering pattern: one pinned buffer refilled every step right
    after its non_blocking copy was issued."""
    staging = torch.empty(64, 32).pin_memory()
    batches = [torch.randn(64, 32) for _ in range(4)]
    on_device = []
    for batch in batches:
        staging.copy_(batch)
        on_device.append(torch.empty(64, 32, device="tpu").copy_(staging, non_blocking=True))
    staging.zero_()
    torch.tpu.synchronize()
    for batch, value in zip(batches, on_device):
        torch.testing.assert_close(value.cpu(), batch, rtol=0, atol=0)


def test_device_argument_is_deprecated_and_other_devices_keep_pytorchs_behaviour():
    x = torch.ones(3)
    with pytest.warns(DeprecationWarning, match="device"):
        assert x.pin_memory("tpu").is_pinned("tpu")
    with pytest.warns(DeprecationWarning):
        assert x.is_pinned("meta") is False
    with pytest.warns(DeprecationWarning), pytest.raises(RuntimeError, match="not an accelerator"):
        x.pin_memory("meta")


def _loss_trajectory(device: str, loader: DataLoader) -> list[float]:
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _epoch in range(2):
        for x, y in loader:
            if device == "tpu":
                assert x.is_pinned() and y.is_pinned()
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses


def test_training_over_a_pinning_dataloader_with_workers_matches_cpu():
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(96, 8), torch.randn(96, 1))
    pinned = DataLoader(data, batch_size=16, pin_memory=True, num_workers=2)
    plain = DataLoader(data, batch_size=16)
    expected = _loss_trajectory("cpu", plain)
    actual = _loss_trajectory("tpu", pinned)
    assert len(actual) == 12
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)


_CPU_ONLY_PROGRAM = """
import json, sys
import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
x = torch.randn(10, 3)
result = {"accelerator": str(torch.accelerator.current_accelerator())}
try:
    p = x.pin_memory()
    result["pin_memory"] = p.tolist()
    result["pinned"] = p.is_pinned()
except RuntimeError as e:  # no accelerator at all: PyTorch's own refusal
    result["pin_memory"] = x.tolist()
    result["pin_error"] = str(e)
result["is_pinned"] = x.is_pinned()
tpu = sys.modules.get("torch_tpu")
if tpu is not None:
    from torch_tpu import platform
    result["backend_started"] = platform.backend_started()
for workers in (0, 2):
    loader = DataLoader(TensorDataset(x, x * 2), batch_size=4, pin_memory=True,
                        num_workers=workers)
    result[f"batches_{workers}"] = [[a.tolist(), b.tolist()] for a, b in loader]
print(json.dumps(result))
"""


def _run_cpu_only(autoload: str) -> dict:
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": autoload}
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", textwrap.dedent(_CPU_ONLY_PROGRAM)],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_cpu_only_program_pins_as_without_the_backend():
    with_tpu = _run_cpu_only("1")
    without = _run_cpu_only("0")
    assert with_tpu["accelerator"] == "tpu" and without["accelerator"] == "None"
    assert with_tpu["pinned"] is True and "pin_error" not in with_tpu
    assert with_tpu["backend_started"] is False  # pinning does not start JAX's backend
    for key in ("pin_memory", "is_pinned", "batches_0", "batches_2"):
        assert with_tpu[key] == without[key], key
