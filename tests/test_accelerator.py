"""Device-agnostic code on tpu: torch.accelerator and torch.tpu (devices, synchronize,
streams, events, memory statistics, generators)."""

import gc
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import torch_tpu

A = torch.accelerator


def test_current_accelerator_and_device_index():
    assert A.current_accelerator() == torch.device("tpu")
    assert A.is_available() and A.device_count() == torch.tpu.device_count() == 1
    assert A.current_device_index() == torch.tpu.current_device() == 0
    A.set_device_index(0)
    with A.device_index(0):
        assert A.current_device_index() == 0
    with pytest.raises(RuntimeError, match="tpu:1 is not available"):
        torch.tpu.set_device(1)


@pytest.mark.parametrize("device", [None, 0, "tpu", "tpu:0", torch.device("tpu")])
def test_synchronize_waits_for_recorded_and_dispatched_work(eager_mode, device):
    x = torch.randn(64, 64, device="tpu")
    y = x @ x
    A.synchronize(device)
    value = torch_tpu.tensor.storage_of(y).current()  # an array once fused work has run
    assert not isinstance(value, torch_tpu.engine.fuse.Pending) and value.is_ready()
    torch.testing.assert_close(y.cpu(), x.cpu() @ x.cpu(), rtol=1e-4, atol=1e-4)


def test_streams_are_torch_streams_and_synchronize():
    stream = A.current_stream()
    assert isinstance(stream, torch.Stream) and stream.device == torch.device("tpu:0")
    assert stream is torch.tpu.current_stream() is torch.tpu.default_stream()
    other = torch.tpu.Stream()
    with other:
        assert A.current_stream() is other
        y = torch.randn(32, 32, device="tpu").sum()
        other.synchronize()
        assert other.query()
    assert A.current_stream() is stream
    A.set_stream(other)
    try:
        assert torch.tpu.current_stream() is other
    finally:
        A.set_stream(stream)
    with torch.tpu.stream(other):
        assert A.current_stream() is other
    stream.wait_stream(other)
    assert y.item() == y.cpu().item()


def test_events_time_device_work():
    start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    assert isinstance(start, torch.Event)
    start.record()
    time.sleep(0.05)
    A.current_stream().record_event(end)
    assert end.query()
    assert start.elapsed_time(end) >= 50.0
    with pytest.raises(RuntimeError, match="enable_timing"):
        torch.tpu.Event().elapsed_time(end)


def _allocated():
    return A.memory_allocated()


@pytest.mark.parametrize("n_bytes", [4 << 20, 12 << 20])
def test_memory_allocated_follows_device_buffers(eager_mode, n_bytes):
    gc.collect()
    before = _allocated()
    assert torch.tpu.memory_allocated() == before
    x = torch.ones(n_bytes // 4, device="tpu")  # float32
    grown = _allocated()
    assert grown - before >= n_bytes
    assert A.memory_stats()["allocated_bytes.all.current"] == grown
    assert A.memory_reserved() >= grown
    del x
    assert _allocated() <= grown - n_bytes


# PJRT's statistics on a TPU v5e with one 4 MiB tensor (read there, 2026-12-06): no pool,
# and `bytes_reserved` a small runtime region beside the tensors' bytes.
_TPU_V5E_STATS = {
    "num_allocs": 4, "bytes_in_use": 4421120, "peak_bytes_in_use": 8616448,
    "largest_alloc_size": 4194304, "bytes_limit": 16909336064, "bytes_reserved": 16384,
    "peak_bytes_reserved": 16384, "bytes_reservable_limit": 16900820480,
    "largest_free_block_bytes": 16900703232,
}  # fmt: skip


@pytest.mark.parametrize("pool", [None, 64 << 20], ids=["tpu", "gpu_bfc_pool"])
def test_reserved_covers_allocated_on_every_platforms_statistics(monkeypatch, pool):
    """memory_reserved() >= memory_allocated(), as PyTorch's callers assume: on a TPU it read
    16 KiB beside 4.4 MB allocated when it took PJRT's `bytes_reserved` for the pool."""
    stats = dict(_TPU_V5E_STATS, **({"pool_bytes": pool} if pool else {}))
    monkeypatch.setattr(torch_tpu.memory, "backend_started", lambda: True)
    monkeypatch.setattr(torch_tpu.memory, "_pjrt_stats", lambda: dict(stats))
    monkeypatch.setattr(torch_tpu.memory, "_cached_bytes", lambda: 4096)  # our zeros cache
    assert A.memory_allocated() == stats["bytes_in_use"] - 4096
    assert A.memory_reserved() == (pool or stats["bytes_in_use"] + stats["bytes_reserved"])
    assert A.max_memory_reserved() >= A.memory_reserved() >= A.memory_allocated()


def test_allocated_returns_to_its_level_after_new_sizes_come_and_go(eager_mode):
    """torch.ones of a size not seen before leaves a shared zeros array in torch_tpu's
    cache (the storage's first value): it counted as allocated after `del`, so
    memory_allocated() grew with every new size (PyTorch's autograd device tests compare
    it before and after). A tensor whose storage holds that array still counts."""
    torch.ones(1, device="tpu")
    gc.collect()
    base = _allocated()
    for n in (1013, 1019, 2027):
        t = torch.ones(n, device="tpu")
        assert _allocated() >= base + 4 * n
        del t
        gc.collect()
        assert _allocated() == base
    assert A.memory_reserved() >= base
    x = torch.empty(3001, device="tpu")
    x.sum().item()  # its storage's value: the shared zeros array of that size
    assert _allocated() >= base + 4 * 3001
    del x


def test_peak_tracking_and_reset(eager_mode):
    gc.collect()
    A.reset_peak_memory_stats()
    base = _allocated()
    assert A.max_memory_allocated() == base
    big = torch.zeros(8 << 20, dtype=torch.uint8, device="tpu") + 1
    torch.tpu.synchronize()
    del big
    after = _allocated()
    assert A.max_memory_allocated() >= base + (8 << 20)
    assert torch.tpu.max_memory_allocated() == A.max_memory_allocated()
    torch.tpu.reset_peak_memory_stats()
    assert A.max_memory_allocated() == after < base + (8 << 20)


def test_empty_cache_frees_buffers_held_by_reference_cycles():
    gc.collect()
    gc.disable()
    try:
        before = _allocated()
        holder = {"tensor": torch.ones(1 << 20, device="tpu")}
        holder["self"] = holder
        del holder
        assert _allocated() >= before + (4 << 20)  # the cycle still holds the buffer
        A.empty_cache()
        assert _allocated() <= before
    finally:
        gc.enable()


def test_memory_info_and_capability():
    free, total = A.get_memory_info()
    assert 0 < free <= total
    assert torch.tpu.mem_get_info()[1] == total
    dtypes = A.get_device_capability()["supported_dtypes"]
    assert {torch.float32, torch.bfloat16, torch.int64, torch.bool} <= dtypes
    for dtype in dtypes:
        ones = torch.ones(3, dtype=dtype)
        assert torch.equal(ones.to("tpu").cpu(), ones), dtype
        assert torch.equal(ones.to("tpu").to(torch.float32).cpu(), ones.to(torch.float32))


def test_tpu_generators_are_not_available_to_a_python_backend():
    # PyTorch 2.13 asks the backend's C++ hooks for a generator (getNewGenerator), which
    # torch._C._acc.PrivateUse1Hooks cannot provide: randomness on tpu comes from
    # torch.manual_seed / torch.tpu.manual_seed (see docs/architecture.md). This test
    # notices the day PyTorch offers it.
    with pytest.raises(NotImplementedError, match="getNewGenerator"):
        torch.Generator(device="tpu")


def test_queries_never_start_jax_before_the_first_device_use():
    """tpu_dist must initialise JAX's distributed runtime before its backend starts:
    device-agnostic set-up code (synchronize, memory queries) may run before that."""
    code = """
        import torch
        from torch_tpu import platform
        torch.accelerator.synchronize()
        torch.tpu.synchronize()
        assert torch.accelerator.memory_allocated() == 0
        assert torch.accelerator.max_memory_allocated() == 0
        torch.accelerator.reset_peak_memory_stats()
        torch.accelerator.empty_cache()
        print(platform.backend_started())
        """
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=300, env=dict(os.environ),
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_cpu_generator_on_a_tpu_random_op_raises_as_on_cuda():
    """A generator of another device cannot drive tpu randomness; ignoring it would
    silently break reproducibility, so it raises as CUDA does, naming what to do."""
    g = torch.Generator().manual_seed(0)
    with pytest.raises(RuntimeError, match="Expected a 'tpu' device type for generator"):
        torch.randn(3, generator=g, device="tpu")
    x = torch.empty(4, device="tpu")
    with pytest.raises(RuntimeError, match="draw on the CPU"):
        x.uniform_(generator=g)
    expected = torch.randn(3, generator=torch.Generator().manual_seed(0))
    assert torch.equal(torch.randn(3, generator=g.manual_seed(0)).to("tpu").cpu(), expected)
