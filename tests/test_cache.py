"""The compilation cache: shared by strict ops and fused segments, persistent across
processes, robust to corrupt entries and concurrent writers, capped in size."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch_tpu
from torch_tpu import cache, cache_trust, metrics

# One small program that uses both paths: strict ops, then a fused segment.
_PROGRAM = textwrap.dedent(
    """
    import json, torch, torch_tpu
    from torch_tpu import cache, cache_trust, metrics
    torch.manual_seed(0)
    x = torch.randn(16, 16, device="tpu")
    strict = (x @ x + 1).relu().sum().item()
    with torch.tpu.set_eager_mode("fused"):
        y = torch.tanh(x * 2 - x.t()).mean(dim=0)
        fused = y.cpu().tolist()
    snap = metrics.snapshot()
    print(json.dumps({"strict": strict, "fused": fused, "compiles": snap.get("compiles", 0),
                      "segments": snap.get("compiles: segment", 0), "stats": cache.stats()}))
    """
)


def _run_program(directory, extra_env=None) -> dict:
    env = dict(os.environ, TORCH_TPU_CACHE_DIR=str(directory), **(extra_env or {}))
    env.pop("TORCH_TPU_PERSISTENT_CACHE", None)
    env.update(extra_env or {})
    done = subprocess.run(
        [sys.executable, "-c", _PROGRAM], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_second_process_compiles_nothing(tmp_path):
    first = _run_program(tmp_path)
    second = _run_program(tmp_path)
    assert first["compiles"] > 0 and first["segments"] >= 1
    assert first["stats"]["disk_writes"] == first["compiles"]
    assert second["compiles"] == 0, second
    assert second["stats"]["disk_hits"] == first["stats"]["disk_writes"]
    assert second["strict"] == first["strict"] and second["fused"] == first["fused"]


def test_concurrent_processes_share_a_directory(tmp_path):
    env = dict(os.environ, TORCH_TPU_CACHE_DIR=str(tmp_path))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _PROGRAM], env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    outputs = [json.loads(p.communicate(timeout=300)[0].strip().splitlines()[-1]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert len({json.dumps([o["strict"], o["fused"]]) for o in outputs}) == 1
    entries = list(tmp_path.glob("*/*.xc"))
    assert entries and not [e for e in entries if e.name.startswith(".tmp-")]
    assert all(_authentic(e) for e in entries if e.name != "key")
    # and the result is a usable cache: a fourth process compiles nothing
    assert _run_program(tmp_path)["compiles"] == 0


def test_disabled_persistent_cache_writes_nothing(tmp_path):
    out = _run_program(tmp_path, {"TORCH_TPU_PERSISTENT_CACHE": "0"})
    assert out["stats"]["directory"] is None and out["compiles"] > 0
    assert not list(tmp_path.iterdir())


@pytest.fixture
def fresh_cache(tmp_path):
    """This process compiles into an empty directory, with nothing in memory."""
    saved = cache.directory()
    cache.set_directory(tmp_path)
    cache.clear(disk=False)
    metrics.reset()
    yield tmp_path
    cache.set_directory(saved)


def _work(n: int = 8) -> list[float]:
    x = torch.arange(n * n, dtype=torch.float32, device="tpu").reshape(n, n)
    return (torch.sin(x) @ x.t() - 3).cpu().flatten().tolist()


def _authentic(entry) -> bool:
    secret = (entry.parent.parent / cache_trust.KEY_NAME).read_bytes()
    payload = cache._verified(entry.read_bytes(), entry.stem, secret)
    return payload is not None and payload is not cache._REJECTED


def test_corrupt_and_truncated_entries_are_recompiled_and_replaced(fresh_cache):
    expected = _work()
    entries = sorted(fresh_cache.glob("*/*.xc"))
    assert len(entries) >= 2
    truncated, flipped = entries[0], entries[1]
    truncated.write_bytes(truncated.read_bytes()[:100])
    blob = bytearray(flipped.read_bytes())
    blob[-7] ^= 0x55
    flipped.write_bytes(bytes(blob))
    cache.clear(disk=False)  # forget the in-memory executables: the disk is read again
    metrics.reset()
    with pytest.warns(RuntimeWarning, match="corrupt"):
        assert _work() == expected
    assert metrics.snapshot()["compiles"] == 2  # exactly the two damaged entries
    stats = cache.stats()
    assert stats["corrupt_entries"] == 1  # the truncated one
    assert stats["rejected_entries"] == 1  # a changed byte: the MAC no longer verifies
    for entry in (truncated, flipped):
        assert _authentic(entry)  # replaced by a good one


def test_size_cap_evicts_least_recently_used(fresh_cache, monkeypatch):
    _work(4)
    kept = sorted(fresh_cache.glob("*/*.xc"))
    total = sum(p.stat().st_size for p in kept)
    for p in kept:  # the first program's entries are the most recently used
        os.utime(p, (2e9, 2e9))
    monkeypatch.setenv("TORCH_TPU_CACHE_MAX_BYTES", str(total + 1000))
    cache.set_directory(fresh_cache)  # re-scan the directory size on next write
    _work(5)
    _work(6)
    stats = cache.stats()
    assert stats["evictions"] > 0
    assert stats["disk_bytes"] <= total + 1000
    assert all(p.exists() for p in kept), "a recently used entry was evicted"


def test_stats_clear_and_cli(fresh_cache):
    _work()
    stats = cache.stats()
    assert stats["directory"] == str(fresh_cache)
    assert stats["disk_entries"] > 0 and stats["disk_bytes"] > 0
    env = dict(os.environ, TORCH_TPU_CACHE_DIR=str(fresh_cache))
    info = subprocess.run(
        [sys.executable, "-m", "torch_tpu", "cache", "info"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert info.returncode == 0 and f"entries     {stats['disk_entries']}" in info.stdout
    assert cache.clear() == stats["disk_entries"]
    assert cache.stats()["disk_entries"] == 0 and cache.stats()["memory_entries"] == 0
    metrics.reset()
    _work()  # everything forgotten: compiled again
    assert metrics.snapshot()["compiles"] > 0


def test_compiler_options_are_part_of_the_key(fresh_cache):
    x = torch.ones(3, 3, device="tpu")
    (x + 2).cpu()
    metrics.reset()
    with torch_tpu.cache.compiler_options(xla_cpu_enable_fast_math=False):
        assert torch.equal((x + 2).cpu(), torch.full((3, 3), 3.0))
    # same program, other options: the add is compiled anew (reading back a whole
    # storage needs no program)
    assert {e.name for e in metrics.compiles()} == {"aten::add.Tensor"}
    metrics.reset()
    (x + 2).cpu()
    assert "compiles" not in metrics.snapshot()  # outside the block: the first executables
    with torch_tpu.cache.compiler_options(xla_no_such_option=1):
        cache.clear(disk=False)
        with pytest.raises(RuntimeError, match="compiler options"):
            (x + 5).cpu()


def test_fused_recompiles_are_explained_and_warned(fresh_cache, monkeypatch):
    monkeypatch.setenv("TORCH_TPU_RECOMPILE_WARN_LIMIT", "3")
    inputs = [torch.ones(n, 4, device="tpu") for n in range(2, 7)]  # a length that keeps changing
    with torch.tpu.set_eager_mode("fused"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for x in inputs:
            (x * 2 + 1).sum().item()
    events = [e for e in metrics.compiles() if e.kind == "segment"]
    assert events[0].reason is None
    assert "'aten::mul.Tensor self': shape (2, 4) -> (3, 4)" in events[1].reason
    assert metrics.snapshot()["recompiles"] >= 4
    messages = [str(w.message) for w in caught if "recompiled" in str(w.message)]
    assert len(messages) == 1 and "'aten::mul.Tensor self' changed shape" in messages[0]
    assert "recompiles" in metrics.report_text()


def _reading(which: int):
    def segment(*args):  # (one name for both: as every fused segment is `segment`)
        return jnp.abs(args[which])

    return segment


@pytest.mark.parametrize("from_disk", [False, True])
def test_programs_reading_different_arguments_of_equal_avals_are_not_confused(from_disk):
    """The HLO omits unused arguments: two programs of one name reading the first or the
    second of two equal-aval arguments had equal text and one key, and the second loaded
    the first's executable (a fused clone then abs_ returned the zeros of the segment's
    other input). The key now says which arguments a program reads."""
    example = (jax.ShapeDtypeStruct((3,), jnp.float32),) * 2
    a = np.array([-1.0, -2.0, -3.0], np.float32)
    b = np.array([-10.0, -20.0, -30.0], np.float32)
    first = cache.compile(_reading(0), example, kind="segment", name="segment")
    np.testing.assert_array_equal(np.asarray(first(a, b)), np.abs(a))
    if from_disk:
        cache.clear(disk=False)  # (memory forgotten: the second compile looks on disk)
    second = cache.compile(_reading(1), example, kind="segment", name="segment")
    np.testing.assert_array_equal(np.asarray(second(a, b)), np.abs(b))
