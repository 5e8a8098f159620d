"""Shared test helpers: run the same function on CPU and on tpu and compare."""

from __future__ import annotations

import contextlib
import os

import pytest
import torch

import torch_tpu  # noqa: F401  (explicit, so tests also pass with autoload disabled)


def to_tpu(value):
    if isinstance(value, torch.Tensor):
        out = value.detach().to("tpu")
        return out.requires_grad_(value.requires_grad) if value.is_floating_point() else out
    if isinstance(value, (list, tuple)):
        return type(value)(to_tpu(v) for v in value)
    if isinstance(value, dict):
        return {k: to_tpu(v) for k, v in value.items()}
    return value


def to_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, (list, tuple)):
        return type(value)(to_cpu(v) for v in value)
    return value


def assert_same(fn, *args, atol=None, rtol=None, check_dtype=True, **kwargs):
    """fn on CPU inputs and on tpu copies of them give the same result (values, dtype, shape)."""
    expected = fn(*args, **kwargs)
    actual = fn(*to_tpu(args), **to_tpu(kwargs))
    _check_device(actual)
    torch.testing.assert_close(
        to_cpu(actual), expected, atol=atol, rtol=rtol, check_dtype=check_dtype, equal_nan=True
    )
    return actual


def _outcome(fn, device):
    try:
        result = fn(device)
    except Exception as e:  # the outcome under test
        return e
    return to_cpu(result)


def assert_same_error(fn):
    """fn(device) raises on CPU; on tpu it raises an instance of CPU's type carrying CPU's
    message (debug mode adds the op and the user's line around it)."""
    expected = _outcome(fn, "cpu")
    assert isinstance(expected, Exception), "the CPU oracle did not raise"
    actual = _outcome(fn, "tpu")
    assert isinstance(actual, type(expected)), f"{type(actual).__name__}: {actual}"
    assert str(expected) in str(actual)


def assert_same_outcome(fn):
    """fn(device) gives CPU's result on tpu, or raises as CPU does."""
    expected = _outcome(fn, "cpu")
    if isinstance(expected, Exception):
        assert_same_error(fn)
    else:
        torch.testing.assert_close(_outcome(fn, "tpu"), expected, equal_nan=True)


def hold_executables(monkeypatch) -> None:
    """No memory reset (`cache._make_room`) for the rest of the test: a reset forgets which
    calls came first, so counts of compiles or bucket draws a test asserts would change
    with the tests that ran before it in the process (CI saw it). Room is made now, when
    the process has used half its memory mappings."""
    from torch_tpu import cache, mappings

    limit, used = mappings.cap(), mappings.in_use()
    if limit is not None and used is not None and used > limit // 2:
        cache.clear(disk=False)
    monkeypatch.setattr(cache, "_make_room", lambda: None)


@pytest.fixture
def compile_first_calls(monkeypatch) -> None:
    """Strict mode compiles at a signature's first call, as with TORCH_TPU_HOSTED_CALLS=0:
    for tests of what a warm-up compiles, or of what the compiled executable does
    (donation), which the first calls served on the host (engine/host_moves.py) defer."""
    from torch_tpu.engine import host_moves

    monkeypatch.setattr(host_moves, "calls_before_compile", lambda: 0)


def count_compiles(monkeypatch) -> list:
    """From now on, the name of every program the compilation cache is asked for."""
    from torch_tpu import cache

    hold_executables(monkeypatch)
    programs = []

    def counted(compile_program):
        def counting(*args, **kwargs):
            programs.append(kwargs.get("name"))
            return compile_program(*args, **kwargs)

        return counting

    # (strict mode's first calls start their compile with compile_soon)
    monkeypatch.setattr(cache, "compile", counted(cache.compile))
    monkeypatch.setattr(cache, "compile_soon", counted(cache.compile_soon))
    return programs


def _check_device(value):
    if isinstance(value, torch.Tensor):
        assert value.device.type == "tpu", f"result is on {value.device}, not tpu"
    elif isinstance(value, (list, tuple)):
        for v in value:
            _check_device(v)


def assert_same_grad(fn, *args, atol=None, rtol=None):
    """Gradients of fn(*args).sum() w.r.t. every float tensor arg agree between CPU and tpu."""
    cpu_args = [a.detach().clone().requires_grad_(True) if _float(a) else a for a in args]
    tpu_args = [
        a.detach().to("tpu").requires_grad_(True) if _float(a) else to_tpu(a) for a in args
    ]
    _sum(fn(*cpu_args)).backward()
    _sum(fn(*tpu_args)).backward()
    for c, t in zip(cpu_args, tpu_args):
        if _float(c):
            assert t.grad is not None, "tpu gradient missing"
            assert t.grad.device.type == "tpu"
            torch.testing.assert_close(t.grad.cpu(), c.grad, atol=atol, rtol=rtol)


def _float(a):
    return isinstance(a, torch.Tensor) and (a.is_floating_point() or a.is_complex())


def _sum(out):
    if isinstance(out, (list, tuple)):
        return sum(o.float().sum() for o in out if isinstance(o, torch.Tensor) and _float(o))
    return out.sum()


@pytest.fixture(scope="session", autouse=True)
def _private_compilation_cache(tmp_path_factory):
    """The suite compiles into its own fresh cache directory: results never depend on
    what an earlier run left in the user's cache, and the user's cache is not filled.
    Subprocesses the tests start share it through the environment."""
    # Under pytest-xdist the workers share one directory (each has its own basetemp
    # below a common parent): an executable compiled by one is loaded by the other.
    # Entries are written to a temporary file and renamed, so sharing is safe.
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    root = base / "compilation_cache"
    root.mkdir(mode=0o700, exist_ok=True)
    os.environ["TORCH_TPU_CACHE_DIR"] = str(root)
    torch_tpu.cache.set_directory(root)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(params=["debug", "strict", "fused"])
def eager_mode(request):
    """Run the test in each eager mode; the mode is restored afterwards."""
    with torch.tpu.set_eager_mode(request.param):
        yield request.param


def packet(op_name: str) -> str:
    """'aten::add_.Tensor' -> 'add': the op whatever its in-place or out= form."""
    return op_name.removeprefix("aten::").split(".")[0].rstrip("_")


def lowered_packets(module: str) -> set[str]:
    """The ATen packets whose lowerings live in torch_tpu.ops.<module>."""
    from torch_tpu.ops.registry import LOWERINGS

    return {
        packet(name)
        for name, lowering in LOWERINGS.items()
        if lowering.fn.__module__ == f"torch_tpu.ops.{module}"
    }


@contextlib.contextmanager
def no_fallback(family: str, ours):
    """Fail if, inside the block, an op for which ours(op_name) holds ran on the CPU."""
    torch_tpu.metrics.reset()
    yield
    fell = [op for op in torch_tpu.metrics.snapshot()["fallback_ops"] if ours(op)]
    assert not fell, f"{family} ops fell back to the CPU: {sorted(fell)}"


@pytest.fixture
def no_cpu_fallback():
    """Nothing at all runs on the CPU inside the test."""
    torch_tpu.metrics.reset()
    yield
    torch.tpu.synchronize()
    fell = torch_tpu.metrics.snapshot()["fallback_ops"]
    assert not fell, f"ops fell back to the CPU: {sorted(fell)}"
