"""The eager-mode API, debug-mode diagnostics, fused-mode flush points and caching."""

import os
import subprocess
import sys

import pytest
import torch
from conftest import hold_executables

import torch_tpu
from torch_tpu.engine import fuse
from torch_tpu.training import mlp

Mode = torch.tpu.EagerMode


def test_default_is_strict_and_property_is_settable():
    assert torch.tpu.eager_mode is Mode.DEFER_NEVER
    torch.tpu.eager_mode = Mode.DEFER_AND_FUSE
    try:
        assert torch.tpu.eager_mode is Mode.DEFER_AND_FUSE
    finally:
        torch.tpu.eager_mode = Mode.DEFER_NEVER


def test_context_manager_nests_and_restores_on_exception():
    with torch.tpu.set_eager_mode(Mode.DEFER_AND_FUSE):
        with pytest.raises(ValueError):
            with torch.tpu.set_eager_mode(Mode.DEFER_NEVER_AND_LAUNCH_BLOCKING):
                assert torch.tpu.eager_mode is Mode.DEFER_NEVER_AND_LAUNCH_BLOCKING
                raise ValueError("boom")
        assert torch.tpu.eager_mode is Mode.DEFER_AND_FUSE
    assert torch.tpu.eager_mode is Mode.DEFER_NEVER


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"TORCH_TPU_EAGER_MODE": "fused"}, "DEFER_AND_FUSE"),
        ({"TORCH_TPU_EAGER_MODE": "debug"}, "DEFER_NEVER_AND_LAUNCH_BLOCKING"),
        ({"TORCH_TPU_DEFER_AND_FUSE": "1"}, "DEFER_AND_FUSE"),
        ({"TORCH_TPU_LAUNCH_BLOCKING": "1"}, "DEFER_NEVER_AND_LAUNCH_BLOCKING"),
        ({}, "DEFER_NEVER"),
    ],
)
def test_environment_chooses_the_starting_mode(env, expected):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_TPU_")}
    out = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.tpu.eager_mode.name)"],
        capture_output=True, text=True, timeout=300, env={**clean, **env},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == expected


def test_switching_mode_flushes_pending_work():
    x = torch.ones(3, device="tpu")
    torch.tpu.eager_mode = Mode.DEFER_AND_FUSE
    y = x * 2 + 1
    assert fuse.pending_ops() == 2
    torch.tpu.eager_mode = Mode.DEFER_NEVER
    assert fuse.pending_ops() == 0
    assert y.cpu().tolist() == [3.0, 3.0, 3.0]


@pytest.mark.parametrize(
    ("action", "reason"),
    [
        (lambda t: t.sum().item(), "item()"),
        (lambda t: t.tolist(), "copy to host"),
        (lambda t: print(t), None),  # printing reads several values; any read flushes
        (lambda t: t.cpu(), "copy to host"),
        (lambda t: torch.nonzero(t), "aten::nonzero.default"),
        (lambda t: torch.tpu.synchronize(), "synchronize()"),
    ],
    ids=["item", "tolist", "print", "cpu", "nonzero", "synchronize"],
)
def test_fused_mode_flush_points(action, reason):
    x = torch.arange(4.0, device="tpu")
    with torch.tpu.set_eager_mode(Mode.DEFER_AND_FUSE):
        y = torch.relu(x - 1) * 3
        assert fuse.pending_ops() == 3
        torch_tpu.metrics.reset()
        action(y)
        assert fuse.pending_ops() == 0
        flushes = {k: v for k, v in torch_tpu.metrics.snapshot().items() if k.startswith("flush")}
        if reason is None:
            assert flushes
        else:
            assert flushes.get(f"flush: {reason}") == 1, flushes
    assert y.cpu().tolist() == [0.0, 0.0, 3.0, 6.0]


def test_fused_segment_keeps_only_live_values():
    x = torch.randn(8, 8, device="tpu")
    with torch.tpu.set_eager_mode(Mode.DEFER_AND_FUSE):
        a = x + 1
        b = a * 2  # a and b die before the flush: never materialised
        c = b.sum()
        del a, b
        live = [w() for w in fuse._segment.pendings if w() is not None]
        assert len(live) == 1  # only c's value leaves the segment
        torch.testing.assert_close(c.cpu(), ((x.cpu() + 1) * 2).sum())


def test_fused_training_loop_compiles_nothing_after_warmup():
    torch.manual_seed(0)
    model = mlp().to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(16, 64).to("tpu"), torch.randint(0, 10, (16,)).to("tpu")

    def step():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    with torch.tpu.set_eager_mode(Mode.DEFER_AND_FUSE):
        for _ in range(3):
            step()
        torch_tpu.metrics.reset()
        for _ in range(5):
            step()
        snap = torch_tpu.metrics.snapshot()
    assert snap.get("compiles", 0) == 0, snap
    assert snap["segments_run"] >= 5 and snap["ops_deferred"] > 5 * 20  # foreach: one op a call


def test_new_python_scalars_are_run_time_arguments(monkeypatch, eager_mode):
    """Every step's new Python numbers (an optimizer's bias corrections) reach the same
    executables as arguments: no recompiles, and the values of CPU's arithmetic."""
    hold_executables(monkeypatch)
    x = torch.randn(64)
    on_tpu = x.to("tpu")
    torch.tpu.synchronize()  # the upload is not part of the steps' fused segment

    def step(scale: float, shift: int):
        return (on_tpu * scale).add(shift).div(scale + 1.5).cpu()

    step(0.5, 1)
    torch_tpu.metrics.reset()
    for scale, shift in [(0.25, 2), (3.0, -7), (1e-3, 0), (-2.5, 40000)]:
        torch.testing.assert_close(step(scale, shift), (x * scale).add(shift).div(scale + 1.5))
    assert torch_tpu.metrics.snapshot().get("compiles", 0) == 0


def test_fused_python_floats_act_as_python_scalars():
    """A fused segment takes its Python floats packed in one float64 array and reads each
    back weakly typed: each must still act as a Python scalar (no promotion of float16,
    bfloat16 or int operands to float64) with its exact value (NaN, -0.0, a float32
    subnormal, 1e300). One op alone gives strict mode's bits; two ops may differ from
    strict in the last place, where XLA fuses them (docs/differences.md)."""
    values = [2.5, -0.0, float("nan"), 1e-45, 1e300, 1 / 3]
    operands = [
        torch.randn(5, dtype=torch.float16),
        torch.randn(5, dtype=torch.bfloat16),
        torch.randn(5, dtype=torch.float32),
        torch.randn(5, dtype=torch.float64),
        torch.arange(-2, 3),
    ]

    def run(x, device, mode):
        single, double = [], []
        with torch.tpu.set_eager_mode(mode):
            for _ in range(2):  # the second round: the fast path's recorders
                t = x.to(device)
                for v in values:
                    single.append(t * v)
                    if t.is_floating_point():  # (an int tensor cannot take a float in place)
                        single.append(t.clone().mul_(v))
                    double.append((t * v).add(v, alpha=0.5))
            return [o.cpu() for o in single], [o.cpu() for o in double]

    for x in operands:
        fused = run(x, "tpu", Mode.DEFER_AND_FUSE)
        strict = run(x, "tpu", Mode.DEFER_NEVER)
        cpu = run(x, "cpu", Mode.DEFER_NEVER)
        for f, s, c in zip(fused[0], strict[0], cpu[0], strict=True):
            assert f.dtype == s.dtype == c.dtype
            torch.testing.assert_close(f, s, rtol=0, atol=0, equal_nan=True)
            assert torch.equal(f.signbit(), c.signbit())  # (-0.0 kept)
            torch.testing.assert_close(f, c, equal_nan=True)
        for f, s, c in zip(fused[1], strict[1], cpu[1], strict=True):
            assert f.dtype == s.dtype == c.dtype
            torch.testing.assert_close(f, s, equal_nan=True)
            torch.testing.assert_close(f, c, equal_nan=True)


def test_debug_mode_names_op_inputs_and_user_line():
    a = torch.ones(2, 3, device="tpu")
    b = torch.ones(4, 5, device="tpu")
    with torch.tpu.set_eager_mode(Mode.DEFER_NEVER_AND_LAUNCH_BLOCKING):
        with pytest.raises(RuntimeError) as info:
            a @ b  # the line the error must name
    message = str(info.value)
    assert "aten::mm" in message
    assert "Tensor[2, 3]:float32" in message and "Tensor[4, 5]:float32" in message
    assert "test_modes.py" in message and "a @ b" in message
    assert (a + 1).cpu().sum().item() == 12.0  # the device keeps working


def test_debug_mode_nan_check_names_first_bad_op():
    x = torch.tensor([1.0, 0.0, -1.0], device="tpu")
    torch.tpu.check_nans = True
    try:
        with torch.tpu.set_eager_mode(Mode.DEFER_NEVER_AND_LAUNCH_BLOCKING):
            y = x + 1  # finite: no error
            with pytest.raises(RuntimeError, match=r"aten::log.*NaN or Inf.*torch.log"):
                torch.log(x)
    finally:
        torch.tpu.check_nans = False
    assert y.cpu().tolist() == [2.0, 1.0, 0.0]


def test_metrics_report_prints_a_table(capsys):
    torch_tpu.metrics.reset()
    (torch.ones(2, device="tpu") * 2).cpu()
    assert torch_tpu.metrics.report() is None  # printed once, not also echoed at a prompt
    printed = capsys.readouterr().out
    assert "ops_dispatched" in printed and "host_syncs" in printed
    assert printed.strip() == torch_tpu.metrics.report_text()
