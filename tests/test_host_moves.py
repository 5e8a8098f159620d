"""First calls served without a compile: what they compute must be what XLA computes.

- A strict op whose program only moves data (flip, cat, a copy through strides)
  runs its first calls of a signature on the host (engine/host_moves.py): the
  result must equal CPU's and the compiled program's bit for bit, NaN payloads,
  signed zeros and subnormals included (bfloat16 up to what XLA:CPU's compiled
  moves flush, docs/differences.md), and the third call compiles.
- An elementwise draw's first calls at a new shape draw into a flat tensor of
  their bucket's size and copy its prefix: the values must be those the op draws
  itself (fused mode, which draws inside its programs, is the oracle).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch
from conftest import count_compiles

from torch_tpu import cache, metrics
from torch_tpu.engine import host_moves, modes
from torch_tpu.engine.executor import device_value


def _count(name: str) -> int:
    return metrics.snapshot().get(name, 0)


def _bits(t: torch.Tensor, as_xla_cpu_bfloat16: bool = False) -> torch.Tensor:
    """The tensor's bytes as integers: equal bits compare equal, NaNs included. With
    as_xla_cpu_bfloat16, every NaN as one NaN and subnormals as signed zeros."""
    t = t.detach().cpu().contiguous()
    if as_xla_cpu_bfloat16:
        t = torch.where(t.isnan(), torch.full_like(t, float("nan")), t)
        t = torch.where(t.abs() < torch.finfo(t.dtype).smallest_normal, t * 0, t)
    if t.is_complex():
        t = torch.view_as_real(t).contiguous()
    if t.dtype == torch.bool:
        return t.to(torch.uint8)
    if t.is_floating_point():
        return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
    return t


def _special(dtype: torch.dtype) -> torch.Tensor:
    """A 4x6x5 tensor of dtype holding the values a careless move would change."""
    base = torch.randn(4, 6, 5, dtype=torch.float64) * 100
    if dtype == torch.bool:
        return base > 0
    if not (dtype.is_floating_point or dtype.is_complex):
        return base.to(dtype)
    t = base.to(dtype if dtype.is_floating_point else torch.float32)
    flat = t.view(-1)
    flat[:4] = torch.tensor([float("nan"), -0.0, float("inf"), -float("inf")])
    flat[4] = torch.finfo(t.dtype).smallest_normal / 4  # a subnormal
    if t.dtype == torch.float32:
        flat[5:6].view(torch.int32).fill_(0x7FC00ABC)  # a NaN with a payload
    if dtype.is_complex:
        t = torch.complex(t, t.flip(0))
    return t


_MOVES = {
    "flip": lambda x: x.flip(0, 2),
    "transpose copy": lambda x: x.transpose(0, 2).contiguous(),
    "cat": lambda x: torch.cat([x, x[:, :2]], 1),
    "stack": lambda x: torch.stack([x, x], 1),
    "roll": lambda x: x.roll(2, 1),
    "rot90": lambda x: x.rot90(1, [0, 2]),
    "repeat": lambda x: x[:2].repeat(2, 1, 2),
    "strided slice": lambda x: x[1:, ::2, 1:4].clone(),
    "copy_ into a view": lambda x: torch.zeros(6, 5, 8, dtype=x.dtype, device=x.device)[
        :, :, 2:6
    ].copy_(x.permute(1, 2, 0)),
    "expand": lambda x: x[:, :1].expand(4, 3, 5).contiguous(),
    "select where": lambda x: torch.where(torch.arange(5, device=x.device) % 2 == 0, x, x.flip(1)),
    "diagonal": lambda x: torch.diagonal(x, 0, 1, 2).clone(),
}
_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.complex64, torch.int64, torch.bool]


@pytest.fixture
def compiled_ops(monkeypatch):
    """The names of the programs asked of the cache in the test."""
    return count_compiles(monkeypatch)


@pytest.mark.parametrize("dtype", _DTYPES, ids=str)
def test_data_moves_served_on_the_host_match_cpu_and_the_compiled_program(dtype):
    assert modes.current is modes.EagerMode.DEFER_NEVER
    cpu = _special(dtype)
    tpu = cpu.to("tpu")
    for name, move in _MOVES.items():
        expected = _bits(move(cpu))
        cache.forget_lookups()  # (a first call again, whatever ran before)
        hosted = _count("first_calls_on_host")
        calls = [move(tpu) for _ in range(host_moves.calls_before_compile() + 2)]
        assert _count("first_calls_on_host") > hosted, name
        want = move(cpu)
        for i, got in enumerate(calls):
            assert got.shape == want.shape and got.dtype == want.dtype, (name, i)
            if dtype == torch.bfloat16:
                # XLA:CPU's compiled moves of bfloat16 (the calls after the served ones,
                # and reading back a partial view) flush subnormals and give every NaN
                # one payload; served calls keep both, as CPU does (docs/differences.md)
                assert torch.equal(_bits(got, True), _bits(want, True)), (name, i)
            else:
                assert torch.equal(_bits(got), expected), (name, i)


def test_the_call_after_the_served_ones_compiles_and_later_calls_take_the_fast_path(
    compiled_ops,
):
    x = torch.randn(3, 7, 2).to("tpu")
    results = [x.flip(1) for _ in range(host_moves.calls_before_compile())]
    assert "aten::flip.default" not in compiled_ops
    results += [x.flip(1), x.flip(-2), x.flip(1)]  # (-2 is the same flip)
    assert compiled_ops.count("aten::flip.default") == 1
    hits = _count("cache_hits")
    x.flip(1)
    assert _count("cache_hits") == hits + 1
    expected = x.cpu().flip(1)
    assert all(torch.equal(r.cpu(), expected) for r in results)


def test_programs_with_arithmetic_or_large_data_still_compile(compiled_ops, monkeypatch):
    hosted = _count("first_calls_on_host")
    x = torch.randn(5, 9).to("tpu")
    (x + 1).flip(0)  # add compiles; flip is served
    x.double()  # a float conversion rounds: numpy's may differ from XLA's
    assert "aten::add.Tensor" in compiled_ops and "aten::flip.default" not in compiled_ops
    assert _count("first_calls_on_host") == hosted + 1
    monkeypatch.setattr(host_moves, "_MAX_BYTES", 100)  # 5 x 9 float32 is 180 bytes
    x.flip(1)
    assert "aten::flip.default" in compiled_ops


def test_a_numpy_form_that_fails_falls_back_to_compiling(compiled_ops, monkeypatch):
    def failing(*args, **params):
        raise ValueError("a numpy form that fails")

    monkeypatch.setitem(host_moves._RULES, "rev", failing)
    cache.forget_lookups()
    x = torch.randn(3, 11, 2).to("tpu")
    failed = _count("first_calls_on_host_failed")
    assert torch.equal(x.flip(1).cpu(), x.cpu().flip(1))
    assert "aten::flip.default" in compiled_ops
    assert _count("first_calls_on_host_failed") == failed + 1


def test_only_strict_mode_serves_first_calls_on_the_host(compiled_ops):
    x = torch.randn(4, 3).to("tpu")
    with modes.set_eager_mode("defer_never_and_launch_blocking"):
        assert torch.equal(x.flip(0).cpu(), x.cpu().flip(0))
    assert "aten::flip.default" in compiled_ops


def test_integer_index_arithmetic_is_served_and_float_arithmetic_is_not():
    def program(a, i):
        return jax.lax.dynamic_slice(a, (i * 2 - 1, i * 0), (2, 3)), a + 1  # a + 1: float add

    a = np.arange(12, dtype=np.float32).reshape(4, 3)
    assert host_moves.plan(program, (a, np.int32(1)))[0] is None
    plan, _ = host_moves.plan(
        lambda a, i: jax.lax.dynamic_slice(a, (i * 2 - 1, i * 0), (2, 3)), (a, 7)
    )
    got = plan((a, 7))  # start 13, clamped to 2 as XLA clamps it
    assert np.array_equal(np.asarray(got), a[2:4])


@pytest.mark.parametrize(
    "config", [((1, 2, 0), (0, 0, 1)), ((-1, 1, 2), (2, -2, 0)), ((0, -3, 1), (-1, -1, 0))]
)
def test_pad_served_on_the_host_as_xla_pads(config):
    a = np.arange(12, dtype=np.float32).reshape(4, 3)

    def pad(a):
        return jax.lax.pad(a, np.float32(-7), config)

    plan, _ = host_moves.plan(pad, (a,))
    assert plan is not None
    assert np.array_equal(np.asarray(plan((a,))), np.asarray(jax.jit(pad)(a)))


def _draws(seed: int) -> list[torch.Tensor]:
    torch.tpu.manual_seed(seed)
    out = []
    for shape in [(3, 4), (5,), (2, 3, 4), (3, 4), (3, 4), (7, 9)]:
        out.append(torch.empty(shape, device="tpu").uniform_(-1, 2))
        out.append(torch.empty(shape, device="tpu").normal_(1, 3))
        out.append(torch.empty(shape, dtype=torch.int64, device="tpu").random_(0, 100))
        out.append(torch.empty(shape, dtype=torch.bfloat16, device="tpu").exponential_())
        out.append(
            torch.empty(shape[::-1], device="tpu").permute(*range(len(shape))[::-1]).bernoulli_(0.3)
        )
        out.append(torch.randn(shape, device="tpu", dtype=torch.float64))
        out.append(torch.randn(shape, device="tpu", dtype=torch.complex64))
    return [t.cpu() for t in out]


def test_draws_at_new_shapes_through_a_bucket_give_the_values_drawn_in_place(compiled_ops):
    strict = _draws(11)
    assert "aten::normal_.default" in compiled_ops  # (at the buckets' flat shapes)
    with modes.set_eager_mode("defer_and_fuse"):
        fused = _draws(11)
    assert len(strict) == len(fused)
    for i, (a, b) in enumerate(zip(strict, fused)):
        assert a.shape == b.shape and torch.equal(_bits(a), _bits(b)), i
    assert not torch.equal(_draws(12)[0], strict[0])  # (the seed reaches them)


def test_served_results_are_committed_to_the_device_as_the_compiled_ones():
    """JAX's jitted functions key on whether an array is committed; a served result that
    differed from the compiled program's made module-level jits compile twice."""
    uploaded = torch.randn(6, 4).to("tpu")
    calls = host_moves.calls_before_compile() + 1
    for make in (lambda: uploaded.flip(0), lambda: torch.arange(37, device="tpu") < 20):
        committed = [device_value(make())._committed for _ in range(calls)]
        assert len(set(committed)) == 1, committed
    assert device_value(uploaded.flip(0))._committed  # (an upload's results are)
