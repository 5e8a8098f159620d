"""Fused mode can split compute-heavy segments so the device works while Python records.

With `fuse.SPLIT_FLOPS` set (off by default), a segment whose recorded contractions
pass it runs at the next op (reason "compute split") without waiting for a value; the
tests set a line that small shapes cross.
"""

import pytest
import torch

import torch_tpu
from torch_tpu.engine import fuse

Mode = torch.tpu.EagerMode


@pytest.fixture
def small_split(monkeypatch):
    torch.tpu.synchronize()
    monkeypatch.setattr(fuse, "SPLIT_FLOPS", 2 * 8 * 16 * 16)  # one 8x16 @ 16x16 matmul
    with torch.tpu.set_eager_mode(Mode.DEFER_AND_FUSE):
        yield


def test_contraction_estimates(monkeypatch):
    monkeypatch.setattr(fuse, "SPLIT_FLOPS", 1 << 60)  # (estimated only when splitting is on)
    with torch.tpu.set_eager_mode(Mode.DEFER_AND_FUSE):
        a, b = torch.ones(8, 16, device="tpu"), torch.ones(16, 4, device="tpu")
        torch.tpu.synchronize()
        torch_tpu.metrics.reset()
        before = fuse._segment.flops
        a @ b
        assert fuse._segment.flops - before == 2 * 8 * 4 * 16
        (a + 1).relu()
        assert fuse._segment.flops - before == 2 * 8 * 4 * 16  # elementwise: 0
        torch.tpu.synchronize()


def test_matmul_chain_runs_in_compute_splits_and_matches_cpu(small_split):
    x_cpu, w_cpu = torch.randn(8, 16), torch.randn(16, 16)
    x, w = x_cpu.to("tpu"), w_cpu.to("tpu")
    torch.tpu.synchronize()
    torch_tpu.metrics.reset()
    y = x
    for _ in range(4):
        y = (y @ w).tanh()
    # each matmul crosses the line: its segment runs when the next op (tanh) is recorded
    assert torch_tpu.metrics.snapshot().get("flush: compute split") == 4
    expected = x_cpu
    for _ in range(4):
        expected = (expected @ w_cpu).tanh()
    torch.testing.assert_close(y.cpu(), expected)


def test_split_training_steps_compile_nothing_after_warmup_and_match_cpu(small_split):
    def run(device, steps):
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)
        ).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1)).to(device)
        losses = []
        for k in range(steps):
            if k == 3 and device == "tpu":
                torch_tpu.metrics.reset()
            opt.zero_grad()
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    losses = run("tpu", 6)
    snap = torch_tpu.metrics.snapshot()
    torch.testing.assert_close(losses, run("cpu", 6))
    assert snap.get("compiles", 0) == 0, snap
    assert snap.get("flush: compute split", 0) >= 3 * 2, snap
    assert snap.get("segment_donated_buffers", 0) > 0, snap
