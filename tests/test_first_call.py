"""Cheaper first calls: what a new shape costs must change nothing a user can see.

- Small per-op programs of exactly rounded arithmetic and data movement compile
  with XLA:CPU's LLVM fusion emitters at LLVM optimization level 1 (faster to
  compile); their results must be bit-identical to XLA's default emitters and
  level, and nothing else may use them.
- Reading back a tensor that spans its whole storage needs no read program; the
  values, dtype and shape must equal CPU's, and other views still compile one.
"""

from __future__ import annotations

import jax
import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from torch_tpu import cache
from torch_tpu.engine import executor

pytestmark = pytest.mark.skipif(
    torch_tpu.platform.platform() != "cpu", reason="XLA:CPU compile options and host reads"
)


def _ops():
    return {
        "add": lambda a, b: a + b * 0.5,
        "addcmul": lambda a, b: torch.addcmul(a, a, b, value=0.7),
        "float64 mul add": lambda a, b: a.double() * 1.1 + b.double(),
        "div": lambda a, b: a / (b.abs() + 0.1),
        "addcdiv": lambda a, b: torch.addcdiv(a, b, b.abs() + 1, value=0.3),
        "lerp": lambda a, b: torch.lerp(a, b, 0.1),
        "sqrt": lambda a, b: torch.sqrt(a.abs()),
        "clamp where": lambda a, b: torch.where(a > 0, a.clamp(max=0.5), b),
        "int": lambda a, b: (a * 100).long() // 7 + 3,
        "transpose": lambda a, b: a.t().contiguous() - 1,
        "tan": lambda a, b: torch.tan(a),
        "atan": lambda a, b: torch.atan(a.double()),
        "exp": lambda a, b: torch.exp(a),
        "tanh": lambda a, b: torch.tanh(a),
        "gelu": lambda a, b: F.gelu(a),
        "erf": lambda a, b: torch.erf(a),
        "pow": lambda a, b: a.abs() ** b,
        "log_softmax": lambda a, b: a.log_softmax(-1),
        "layer_norm": lambda a, b: F.layer_norm(a, a.shape[-1:]),
        "sum": lambda a, b: a.sum(0),
        "mm": lambda a, b: a @ b.t(),
        "half": lambda a, b: (a * 3).half(),
    }


@pytest.mark.parametrize("shape", [(7, 9), (61, 67)])  # tiny; just under the size limit
def test_small_programs_give_xla_default_results_bit_for_bit(shape):
    a = torch.randn(shape).to("tpu")
    b = torch.randn(shape).to("tpu")
    ops = _ops()
    fast = {name: fn(a, b).cpu() for name, fn in ops.items()}
    # the block's options override the small-program default: XLA's own emitters, at
    # XLA's own optimization level
    with cache.compiler_options(
        xla_cpu_use_fusion_emitters=True, xla_backend_optimization_level=3
    ):
        reference = {name: fn(a, b).cpu() for name, fn in ops.items()}
    for name in ops:
        assert fast[name].dtype == reference[name].dtype, name
        assert torch.equal(fast[name], reference[name]), name


def test_fast_compile_options_only_for_small_exact_per_op_programs(monkeypatch):
    seen = {}
    compile_ = cache._xla_compile

    def spy(lowered, options, kind, name):
        inputs = jax.tree.leaves(lowered.in_avals)
        if inputs:
            seen[(name, tuple(inputs[0].shape))] = dict(options)
        return compile_(lowered, options, kind, name)

    monkeypatch.setattr(cache, "_xla_compile", spy)
    small = torch.randn(11, 13).to("tpu")
    big = torch.randn(129, 131).to("tpu")  # above the small-program size
    for t in (small, big):
        torch.sub(t, 3)
        torch.tan(t)
    torch.tpu.synchronize()
    # (the inputs are the storage arrays: of the uploaded tensors' shapes)
    assert seen[("aten::sub.Tensor", (11, 13))] == cache._SMALL_PROGRAM_OPTIONS
    assert seen[("aten::sub.Tensor", (129, 131))] == {}
    assert seen[("aten::tan.default", (11, 13))] == {}  # the emitters' tan differ


@pytest.fixture
def programs_asked_for(monkeypatch):
    """The names of the programs asked of the cache (compiled or found) in the test."""
    names = []
    compile_ = cache.compile

    def spy(fn, example_args, **kwargs):
        names.append(kwargs["name"])
        return compile_(fn, example_args, **kwargs)

    monkeypatch.setattr(cache, "compile", spy)
    return names


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.complex64]
)
def test_whole_storage_reads_need_no_program_and_match_cpu(dtype, programs_asked_for):
    base = (torch.randn(3, 4, 5) * 10).to(dtype)
    views = {
        "contiguous": lambda x: x,
        "permuted": lambda x: x.permute(2, 0, 1),
        "transposed": lambda x: x.transpose(0, 1),
        "size-1 dim": lambda x: x.unsqueeze(1),
    }
    t = base.to("tpu")
    for name, view in views.items():
        got = view(t).cpu()
        expected = view(base)
        assert got.dtype == expected.dtype and got.shape == expected.shape, name
        assert torch.equal(got, expected), name
    scalar = base[1, 2, 3].clone()  # a 0-d tensor spans its one-element storage
    assert scalar.to("tpu").item() == scalar.item()
    assert "read" not in programs_asked_for


def test_partial_views_read_through_a_program_unless_the_storage_is_tiny(
    programs_asked_for, monkeypatch
):
    """A part of a storage larger than strided.HOST_READ_WHOLE_ELEMENTS is read by a
    program (the rest of the storage never moves); any view of a smaller one is read
    whole and sliced on the host, with no program to compile."""
    monkeypatch.setattr(executor, "_READERS", {})  # readers made by earlier tests forgotten
    views = (
        lambda x: x[2:4], lambda x: x[:, 1], lambda x: x.expand(2, *x.shape), lambda x: x[1, 1]
    )
    for rows, reads in ((16, len(views)), (6, 0)):  # 80 elements, then 30
        base = torch.randn(rows, 5)
        t = base.to("tpu")
        programs_asked_for.clear()
        for view in views:
            assert torch.equal(view(t).cpu(), view(base))
        assert programs_asked_for.count("read") == reads


def test_a_read_copy_does_not_alias_the_device_buffer():
    t = torch.arange(6.0).to("tpu")
    host = t.cpu()
    t.add_(1)  # the storage gets a new value; the host copy keeps the old one
    host.mul_(2)  # and writing the host copy leaves the device alone
    assert torch.equal(host, torch.arange(6.0) * 2)
    assert torch.equal(t.cpu(), torch.arange(6.0) + 1)
