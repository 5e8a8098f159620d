"""The compilation cache forgets its executables before the process runs out of
memory mappings (vm.max_map_count), instead of letting the next compile crash, and
when they reach TORCH_TPU_MAX_EXECUTABLES, so that a program compiling for every new
shape does not grow by each executable's code (~1.35 MB on XLA:CPU) without bound."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from torch_tpu import cache, mappings


def test_mappings_are_counted():
    used, cap = mappings.in_use(), mappings.cap()
    if used is None or cap is None:
        pytest.skip("no /proc on this system: there is no mapping cap to watch")
    assert 0 < used < cap
    assert mappings.near_cap() is None  # a test process is far from the cap


def _forget_at_once(monkeypatch):
    """Make every new executable look like the one that reaches the cap."""
    monkeypatch.setattr(mappings, "near_cap", lambda: (99, 100))
    monkeypatch.setattr(cache, "_CHECK_EVERY", 1)
    monkeypatch.setattr(cache, "_FEWEST_TO_FORGET", 1)
    monkeypatch.setattr(cache, "_warned", set())


@pytest.mark.parametrize("mode", ["strict", "fused", "compiled"])
def test_results_stay_right_across_a_reset(monkeypatch, mode):
    x = torch.randn(37, 11)

    def step(t):
        return torch.tanh(t * 3 + 1).sum(dim=0) - t.mean()

    run = torch.compile(step, backend="tpu") if mode == "compiled" else step
    eager = "fused" if mode == "fused" else "strict"

    def on_tpu(t):
        with torch.tpu.set_eager_mode(eager):
            return run(t.to("tpu")).cpu()

    first = on_tpu(x)  # compiled before the reset; its lookups are forgotten by it
    before = cache.stats()["memory_resets"]
    _forget_at_once(monkeypatch)
    with pytest.warns(RuntimeWarning, match="max_map_count"):
        again = on_tpu(x + 0)
        other = on_tpu(torch.randn(5, 13))  # new shapes: new executables, more resets
    assert cache.stats()["memory_resets"] > before
    torch.testing.assert_close(first, step(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(again, step(x), rtol=1e-5, atol=1e-5)
    assert other.shape == (13,)


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_executables_in_memory_stay_under_their_bound(monkeypatch, mode):
    monkeypatch.setenv("TORCH_TPU_MAX_EXECUTABLES", "6")
    monkeypatch.setattr(cache, "_warned", set())
    cache.clear(disk=False)  # (earlier tests' executables: start from none in memory)
    before = cache.stats()["memory_resets"]
    most = 0
    with pytest.warns(RuntimeWarning, match="TORCH_TPU_MAX_EXECUTABLES=6"):
        with torch.tpu.set_eager_mode(mode):
            for n in range(1, 13):  # new shapes: new programs every step
                a = torch.full((n, 3), 2.0, device="tpu")
                assert (a * 3 + n).sum().item() == (6 + n) * 3 * n
                most = max(most, len(cache._memory))
    assert most <= 6
    assert cache.stats()["memory_resets"] > before


_MANY_PROGRAMS = textwrap.dedent(
    """
    import json, torch, torch_tpu
    from torch_tpu import cache, mappings
    start = mappings.in_use()
    cap = start + 1500  # a low cap: 800 executables would pass it
    mappings.cap = lambda: cap
    cache._CHECK_EVERY = 16
    peak = 0
    for n in range(1, 201):
        a = torch.full((n, 3), 2.0, device="tpu")
        assert (a * 3 + n).sum().item() == (6 + n) * 3 * n
        peak = max(peak, mappings.in_use())
    print(json.dumps({"start": start, "cap": cap, "peak": peak, "stats": cache.stats()}))
    """
)


def test_a_job_of_many_programs_stays_under_the_cap():
    """200 shapes x 4 programs would take the process past the (lowered) cap; the
    cache starts over when it nears it, and the mappings really are given back."""
    if mappings.cap() is None:
        pytest.skip("no /proc on this system: there is no mapping cap to watch")
    env = dict(os.environ, TORCH_TPU_PERSISTENT_CACHE="0")
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", _MANY_PROGRAMS],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["stats"]["memory_resets"] >= 1, out
    assert out["peak"] < out["cap"], out
