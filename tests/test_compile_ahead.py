"""Strict mode's first calls compiled on worker threads (TORCH_TPU_COMPILE_THREADS).

A strict op whose executable is not compiled yet is recorded while XLA compiles it on
a worker thread, and so are the ops after it that read its pending results; the next
read runs them in order, each by its own executable (engine/fuse.py `open_window`).
That must change nothing a program can see but the time its first calls take: the same
bits as compiling each first call before it runs, errors PyTorch raises at the call
still raised at the call, random ops run at once, a failed window gives back what it
wrote, a read or a mode switch runs what is pending, and the per-op programs are
compiled once and then reused.
"""

from __future__ import annotations

import jax
import pytest
import torch
from conftest import count_compiles

from torch_tpu import cache, metrics
from torch_tpu.engine import fuse, modes
from torch_tpu.tensor import storage_of


@pytest.fixture(autouse=True)
def _fresh_programs(monkeypatch):
    """Every test starts with no executable in memory or on disk (its first calls
    compile) and two compile threads, whatever the environment says."""
    assert modes.current is modes.EagerMode.DEFER_NEVER
    monkeypatch.setenv("TORCH_TPU_COMPILE_THREADS", "2")
    torch.tpu.synchronize()
    cache.clear()
    yield
    torch.tpu.synchronize()


def _pending(t: torch.Tensor) -> bool:
    """Whether t's value is recorded and not computed yet."""
    value = storage_of(t).value
    return type(value) is fuse.Pending and value.value is None


def _program(x, w):
    """Forward-shaped work: a matmul, transcendental pointwise ops, reductions, a scan."""
    y = torch.tanh(x @ w) * 2 + 1
    z = y.softmax(-1).sum(0)
    return (z.exp() - y.mean()).cumsum(0), torch.nn.functional.gelu(y).amax(1)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().view(torch.int32)


def test_first_calls_are_recorded_while_they_compile_and_run_at_the_read(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_COMPILE_THREADS", "2")
    x, w = torch.randn(37, 19).to("tpu"), torch.randn(19, 23).to("tpu")
    deferred = metrics.snapshot().get("ops_deferred", 0)
    out, peak = _program(x, w)
    assert fuse.window and _pending(out) and _pending(peak)
    assert metrics.snapshot().get("ops_deferred", 0) > deferred
    expected = _program(x.cpu(), w.cpu())
    torch.testing.assert_close(out.cpu(), expected[0], atol=1e-5, rtol=1e-5)
    assert not fuse.window and not _pending(out)
    torch.testing.assert_close(peak.cpu(), expected[1], atol=1e-5, rtol=1e-5)


def test_results_are_the_bits_of_compiling_each_first_call_before_it_runs(monkeypatch):
    x, w = torch.randn(41, 13), torch.randn(13, 29)
    results = {}
    for threads in ("0", "3"):
        cache.clear()
        monkeypatch.setenv("TORCH_TPU_COMPILE_THREADS", threads)
        results[threads] = [_bits(t) for t in _program(x.to("tpu"), w.to("tpu"))]
    for before, ahead in zip(results["0"], results["3"]):
        assert torch.equal(before, ahead)


def test_with_no_threads_a_first_call_runs_before_it_returns(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_COMPILE_THREADS", "0")
    x = torch.randn(11, 7).to("tpu")
    y = torch.tanh(x) + 3
    assert not fuse.window and not _pending(y)
    torch.testing.assert_close(y.cpu(), torch.tanh(x.cpu()) + 3)


def test_each_program_compiles_once_and_later_calls_reuse_it(monkeypatch):
    compiled = count_compiles(monkeypatch)
    x = torch.randn(9, 31).to("tpu")
    for _ in range(3):
        y = torch.sigmoid(x) * x
        assert torch.allclose(y.cpu(), torch.sigmoid(x.cpu()) * x.cpu())
    assert compiled.count("aten::sigmoid.default") == 1
    assert compiled.count("aten::mul.Tensor") == 1
    before = len(compiled)
    y = torch.sigmoid(x) * x  # all compiled: nothing recorded, nothing pending
    assert not fuse.window and not _pending(y) and len(compiled) == before


def test_an_error_pytorch_raises_at_the_call_is_raised_at_the_call():
    x = torch.randn(6, 5).to("tpu")
    y = torch.exp(x)  # recorded: pending
    assert _pending(y)
    with pytest.raises(RuntimeError, match=r"\[6, 5\] X \[4, 3\]"):
        torch.mm(y, torch.randn(4, 3).to("tpu"))
    assert _pending(y)  # (raised before anything ran)
    torch.testing.assert_close(y.cpu(), torch.exp(x.cpu()))


def test_writes_are_recorded_and_draws_run_at_once_in_program_order():
    """In-place ops are recorded, of values the window computes (backward's gradient
    accumulation) and of tensors that held a value before it (an optimizer's updates);
    a random op runs at once, drawing in program order."""
    torch.manual_seed(3)
    x = torch.randn(8, 12).to("tpu")
    w = torch.ones(8, 12).to("tpu")
    y = torch.cos(x)  # pending
    assert _pending(y)
    y.add_(1)  # writes a pending value
    y.mul_(x)
    w.add_(y)  # writes a tensor with a value
    assert _pending(y) and _pending(w)
    z = torch.sin(y)
    noise = torch.rand_like(x)  # random: runs now
    assert not _pending(noise)
    expected = (torch.cos(x.cpu()) + 1) * x.cpu()
    torch.testing.assert_close(z.cpu(), torch.sin(expected))
    torch.testing.assert_close(w.cpu(), expected + 1)
    torch.manual_seed(3)
    torch.randn(8, 12).to("tpu")
    assert torch.equal(torch.rand_like(x).cpu(), noise.cpu())


def _failing_compiles_of(monkeypatch, op: str) -> None:
    """Make XLA fail to compile the programs of `op` (the name compile is given)."""
    compile_for_real = cache._xla_compile

    def failing(lowered, options, kind, name):
        if name == op:
            raise RuntimeError("XLA failed on purpose")
        return compile_for_real(lowered, options, kind, name)

    monkeypatch.setattr(cache, "_xla_compile", failing)


def test_a_failed_window_gives_back_what_it_wrote(monkeypatch):
    """A window whose op fails raises at the read; every tensor it wrote then reads as
    it was after the last op that ran (a tensor from before the window: its old value),
    as if strict mode had raised at that op; tensors it created in the ops not run have
    no value."""
    _failing_compiles_of(monkeypatch, "aten::erf.default")
    x = torch.randn(6, 7).to("tpu")
    param = torch.ones(6, 7).to("tpu")
    before = param.cpu()
    param.mul_(2)  # runs (recorded, then run)
    y = torch.tanh(x)
    param.add_(y)  # runs
    z = torch.erf(param)  # fails
    param.sub_(z)  # not run
    assert _pending(param)
    with pytest.raises(RuntimeError, match="XLA failed on purpose"):
        param.cpu()
    torch.testing.assert_close(param.cpu(), before * 2 + torch.tanh(x.cpu()))
    torch.testing.assert_close(y.cpu(), torch.tanh(x.cpu()))
    with pytest.raises(RuntimeError, match="has no value"):
        z.cpu()


def test_a_window_failing_at_its_first_write_leaves_the_tensor_as_it_was(monkeypatch):
    _failing_compiles_of(monkeypatch, "aten::addcmul_.default")
    x = torch.randn(5, 3).to("tpu")
    state = torch.randn(5, 3).to("tpu")
    before = state.cpu()
    g = torch.tanh(x)
    state.addcmul_(g, g, value=0.1)  # fails: nothing of it ran
    state.mul_(0.9)
    with pytest.raises(RuntimeError, match="XLA failed on purpose"):
        torch.tpu.synchronize()
    assert torch.equal(state.cpu(), before)
    monkeypatch.undo()
    monkeypatch.setenv("TORCH_TPU_COMPILE_THREADS", "2")
    state.addcmul_(g, g, value=0.1)  # (compiles again)
    torch.testing.assert_close(state.cpu(), before + 0.1 * torch.tanh(x.cpu()) ** 2)


def test_a_recorded_write_donates_the_buffer_it_overwrites_and_keeps_the_bits(monkeypatch):
    """At the run, a recorded in-place op takes the donating executable its later
    calls use when nothing else holds the old value, and a held old value is kept
    (the op then runs without donating); the bits are those of running each op at its
    call."""
    x0 = torch.randn(33, 17)
    results = {}
    for threads in ("0", "2"):
        cache.clear()
        monkeypatch.setenv("TORCH_TPU_COMPILE_THREADS", threads)
        x = x0.to("tpu")
        donated = metrics.snapshot().get("buffers_donated", 0)
        y = torch.tanh(x)
        y.mul_(3)  # the old value of y: no one else holds it
        kept = torch.exp(x)
        alias = kept.view(-1)  # (a view: the same storage, so the same value)
        held = kept.untyped_storage()._tpu.value  # the old value, held from outside
        kept.add_(y)
        assert (threads == "2") == _pending(kept)
        results[threads] = [_bits(y), _bits(kept), _bits(alias)]
        assert metrics.snapshot().get("buffers_donated", 0) - donated >= 1
        if type(held) is fuse.Pending:  # (threads 2: the recorded exp's result)
            held = held.value
        torch.testing.assert_close(
            torch.as_tensor(jax.device_get(held)), torch.exp(x0), atol=1e-6, rtol=1e-6
        )  # (still readable: not donated)
        del held
    for before, ahead in zip(results["0"], results["2"]):
        assert torch.equal(before, ahead)


def test_a_first_backward_accumulates_gradients_in_the_window_with_strict_bits(monkeypatch):
    """Backward's in-place accumulation into gradient buffers (a weight used twice) is
    recorded with the rest of the first backward: the gradients are the bits of
    compiling each first call before it runs."""
    torch.manual_seed(0)
    w0, x0 = torch.randn(16, 16), torch.randn(4, 16)
    grads = {}
    deferred = {}
    for threads in ("0", "2"):
        cache.clear()
        monkeypatch.setenv("TORCH_TPU_COMPILE_THREADS", threads)
        w = w0.to("tpu").requires_grad_()
        x = x0.to("tpu")
        before = metrics.snapshot().get("ops_deferred", 0)
        loss = torch.tanh(torch.tanh(x @ w) @ w).pow(2).sum()  # w used twice
        loss.backward()
        deferred[threads] = metrics.snapshot().get("ops_deferred", 0) - before
        grads[threads] = _bits(w.grad)
    assert torch.equal(grads["0"], grads["2"])
    assert deferred["0"] == 0 and deferred["2"] > 0
    w = w0.clone().requires_grad_()
    torch.tanh(torch.tanh(x0 @ w) @ w).pow(2).sum().backward()
    torch.testing.assert_close(grads["2"].view(torch.float32), w.grad, atol=1e-5, rtol=1e-5)


def test_a_mode_switch_runs_the_pending_ops_op_by_op():
    x = torch.randn(10, 3).to("tpu")
    y = torch.log1p(x.abs())
    assert _pending(y)
    with torch.tpu.set_eager_mode("fused"):
        assert not _pending(y)  # run before fused mode records anything
        z = y * 2
    torch.testing.assert_close(z.cpu(), torch.log1p(x.cpu().abs()) * 2)


def test_values_no_tensor_holds_are_freed_as_strict_mode_frees_them(monkeypatch):
    """After the read, the device holds what it holds when each first call compiles
    before it runs: the recorded intermediates whose tensors died are gone."""
    x0 = torch.randn(96, 96).to("tpu")
    live = {}
    for threads in ("0", "2"):
        cache.clear()
        monkeypatch.setenv("TORCH_TPU_COMPILE_THREADS", threads)
        torch.tpu.synchronize()
        before = {id(a) for a in jax.live_arrays()}
        x = x0
        for _ in range(6):
            x = torch.tanh(x) * x0  # each x dies at the next step
        result = x.cpu()
        live[threads] = [a.shape for a in jax.live_arrays() if id(a) not in before]
        del x
    assert live["2"] == live["0"] == [(96, 96)], live  # the last x alone
    assert torch.isfinite(result).all()


def test_a_compile_that_fails_raises_at_the_read_and_leaves_no_silent_value(monkeypatch):
    def failing(*args, **kwargs):
        raise RuntimeError("XLA failed on purpose")

    x = torch.randn(5, 17).to("tpu")
    monkeypatch.setattr(cache, "_xla_compile", failing)
    y = torch.erf(x)
    assert _pending(y)
    with pytest.raises(RuntimeError, match="XLA failed on purpose"):
        y.cpu()
    with pytest.raises(RuntimeError, match="has no value"):
        y.cpu()  # (not zeros: the storage was never computed)
    monkeypatch.undo()
    monkeypatch.setenv("TORCH_TPU_COMPILE_THREADS", "1")
    torch.testing.assert_close(torch.erf(x).cpu(), torch.erf(x.cpu()))  # compiles again


def test_a_program_lowered_with_or_without_its_placement_is_one_cache_entry():
    """An op compiled from pending inputs (abstract, placed on the device) and the same op
    from uncommitted arrays (a factory's results) lower to texts that differ only in the
    single-device placement: one key, one executable, which runs either kind of input."""
    import jax.numpy as jnp

    from torch_tpu import platform

    def program(a, b):
        return (a * 2 + b, a.sum())

    placed = jax.sharding.SingleDeviceSharding(platform.device())
    texts = []
    for sharding in (placed, None):
        avals = [jax.ShapeDtypeStruct((4, 5), jnp.float32, sharding=sharding)] * 2
        texts.append(cache._program_text(cache._lower(cache._trace(program, tuple(avals)))))
    assert texts[0] != texts[1]
    assert cache._placement_free(texts[0]) == cache._placement_free(texts[1])
    committed = jax.device_put(jnp.ones((4, 5)), platform.device())
    uncommitted = jnp.ones((4, 5))
    before = metrics.snapshot().get("compiles", 0)
    first = cache.compile(program, (committed, committed), kind="op", name="placement test")
    again = cache.compile(program, (uncommitted, uncommitted), kind="op", name="placement test")
    assert again is first and metrics.snapshot().get("compiles", 0) == before + 1
    assert jnp.array_equal(again(uncommitted, uncommitted)[0], first(committed, committed)[0])


def test_a_data_move_of_a_pending_value_is_served_on_the_host_as_without_a_window(
    monkeypatch,
):
    compiled = count_compiles(monkeypatch)
    x = torch.randn(6, 4).to("tpu")
    y = torch.exp(x)
    assert _pending(y)
    hosted = metrics.snapshot().get("first_calls_on_host", 0)
    flipped = y.flip(0)  # runs the window, then moves on the host: no compile
    assert metrics.snapshot().get("first_calls_on_host", 0) == hosted + 1
    assert "aten::flip.default" not in compiled and not _pending(flipped)
    assert torch.equal(flipped.cpu(), y.cpu().flip(0))


def test_a_fork_runs_the_window_first():
    """A forked child has none of the parent's compile threads: the parent runs the
    window before it forks (the child only looks at Python state, then exits)."""
    import os

    x = torch.randn(7, 5).to("tpu")
    y = torch.expm1(x)
    assert fuse.window and _pending(y)
    pid = os.fork()
    if pid == 0:  # the child
        os._exit(0 if not fuse.window and not _pending(y) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert not fuse.window and not _pending(y)
    torch.testing.assert_close(y.cpu(), torch.expm1(x.cpu()))


_AT_EXIT = """
import atexit, sys, torch
import torch_tpu
from torch_tpu import cache
inputs = [torch.randn(n, 3) for n in range(1, 61)]
outs = [torch.tanh(x.to("tpu")) * 3 for x in inputs]  # first calls: compiles queued
expected = [torch.tanh(x) * 3 for x in inputs]

def at_exit():  # (runs after the interpreter's threading shutdown: workers gone)
    cancelled = sum(f.cancelled() for f in cache._in_flight.values())
    same = all(torch.allclose(o.cpu(), e) for o, e in zip(outs, expected))
    late = torch.sinh(inputs[0].to("tpu") + 1).cpu()  # a first call after shutdown
    same = same and torch.allclose(late, torch.sinh(inputs[0] + 1))
    print("cancelled", cancelled, "same", same, flush=True)

atexit.register(at_exit)
"""


def test_an_exit_drops_queued_compiles_and_an_atexit_read_still_computes(tmp_path):
    """At interpreter exit the compiles not yet started are cancelled (the exit waited
    for every queued one), and a read in an atexit handler (a last checkpoint, a log)
    compiles what it needs on its own thread: CPU's values, where it raised "cannot
    schedule new futures after shutdown" before."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TORCH_TPU_COMPILE_THREADS": "1", "TORCH_TPU_CACHE_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", _AT_EXIT], capture_output=True, text=True, timeout=600, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    words = done.stdout.split()
    assert words[:1] == ["cancelled"] and words[-1] == "True", done.stdout + done.stderr[-2000:]
    assert int(words[1]) > 0  # (60 compiles queued behind one thread: most still waiting)
