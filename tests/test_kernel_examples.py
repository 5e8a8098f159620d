"""The custom-kernel examples run (tiny settings) and match their PyTorch references."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # trains two models for three steps, compiling every op (~15-40 s shared)
def test_moe_ragged_dot_trains_like_the_expert_loop():
    tpu, cpu = _example("moe_ragged_dot").main(steps=3, dim=8)
    assert tpu == pytest.approx(cpu, rel=1e-5)
    assert tpu[-1] < tpu[0]


@pytest.mark.slow  # compiles a whole Llama-style training step (~20 s on 2 shared cores)
def test_pallas_rmsnorm_llama_trains_compiled_to_the_pytorch_loss():
    tpu, cpu = _example("pallas_rmsnorm_llama").main(steps=3, dim=16)
    assert tpu == pytest.approx(cpu, rel=1e-5)
    assert tpu[-1] < tpu[0]


@pytest.mark.slow  # compiles expm and its vjp in float64 (~10-20 s on 2 shared cores)
def test_jax_library_in_loop_trains_like_torch_matrix_exp():
    tpu, cpu = _example("jax_library_in_loop").main(steps=3, n=4)
    assert tpu == pytest.approx(cpu, rel=1e-9)
    assert tpu[-1] < tpu[0]
