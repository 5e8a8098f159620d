"""Executables take no host scalars where a device array or one packed array serves: on
a TPU host each host scalar input cost an executable call about 175 us, one small host
array about 45 us and a cached device scalar about 5 us (docs/on_tpu.md). Results are
checked too: a changed input form must not change a value."""

from __future__ import annotations

import copy

import jax
import numpy as np
import torch
from torch import nn

import torch_tpu
from torch_tpu import cache
from torch_tpu.engine import fuse


def _host_inputs(args) -> list:
    return [a for a in jax.tree.leaves(args) if not isinstance(a, jax.Array)]


def test_compiled_step_passes_offsets_as_device_scalars_and_rng_as_one_array():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.25), nn.Linear(16, 4))
    tpu = copy.deepcopy(model).to("tpu")
    opt = torch.optim.SGD(tpu.parameters(), lr=0.1)
    step = torch_tpu.compile_step(tpu, opt, nn.functional.mse_loss)
    data = torch.randn(6, 12).to("tpu")
    x, y = data[:, :8], data[:, 8:]  # y starts at storage offset 8: a run-time offset
    for _ in range(2):
        step(x, y)
    graph = list(step._programs.values())[-1].graph
    seen = []
    for key, (executable, written, donated) in list(graph.executables.items()):

        def recording(*args, _executable=executable):
            seen.append(args)
            return _executable(*args)

        graph.executables[key] = (recording, written, donated)
    losses = [step(x, y).item() for _ in range(2)]
    assert len(seen) == 2 and all(np.isfinite(losses))
    for args in seen:
        hosts = _host_inputs(args)  # the dropout's (seed, counter), nothing else
        assert [(type(a), a.shape, a.dtype) for a in hosts] == [(np.ndarray, (2,), np.uint64)]
    assert seen[0][-1][1] + 1 == seen[1][-1][1]  # one random node: the counter moves by one
    offsets = [k for k, a in enumerate(seen[0]) if isinstance(a, jax.Array) and a.ndim == 0
               and a.dtype == np.int64]  # fmt: skip
    assert offsets, "the sliced target's offset is a run-time input"
    assert all(seen[0][k] is seen[1][k] for k in offsets)  # cached, not uploaded per call
    assert [int(seen[0][k]) for k in offsets].count(8) == 1


def test_fused_segment_packs_int_scalars_into_one_array(monkeypatch):
    monkeypatch.setattr(fuse, "_compiled", {})  # (compile this test's segment afresh)
    calls = []
    compile_ = cache.compile

    def recording_compile(fn, example, **kwargs):
        executable = compile_(fn, example, **kwargs)
        if kwargs.get("kind") != "segment":
            return executable

        def recording(*args):
            calls.append(args)
            return executable(*args)

        return recording

    monkeypatch.setattr(cache, "compile", recording_compile)
    base = torch.arange(40.0).reshape(4, 10)
    expected = [base[1:, 2:7] * 2 + 1, base[2:, 5:] - 0.5]
    tpu = base.to("tpu")
    with torch.tpu.set_eager_mode("fused"):
        got = [tpu[1:, 2:7] * 2 + 1, tpu[2:, 5:] - 0.5]
        torch.tpu.synchronize()
    for g, e in zip(got, expected):
        torch.testing.assert_close(g.cpu(), e, rtol=0, atol=0)
    assert calls, "the segment ran"
    for _given, kept, (floats, ints) in calls:
        assert not [a for a in kept if isinstance(a, (int, float))]  # no host scalar leaf
        # the views' offsets and the ints the ops take (`* 2`, `+ 1`), in one array
        assert ints.dtype == np.int64 and sorted(ints.tolist()) == [1, 2, 12, 25]
        assert floats.dtype == np.float64 and floats.tolist() == [0.5]
