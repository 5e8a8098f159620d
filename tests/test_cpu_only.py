"""Programs that never use tpu are unaffected by the autoloaded backend: the same CPU idioms
print exactly the same bytes (values, dtypes, errors) with TORCH_DEVICE_BACKEND_AUTOLOAD on
and off, and with it on JAX is never loaded."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

# name -> code run in a fresh process; `show(value)` prints tensors as exact bytes.
CPU_IDIOMS: dict[str, str] = {
    "tensor math": """
        torch.manual_seed(0)
        a, b = torch.randn(5, 7), torch.randn(7, 3)
        show(a @ b, (a.exp() + 1).log().sum(0), torch.softmax(a, 1), a.sort(1).values,
             torch.linalg.qr(a).R, (a > 0).sum(), a.to(torch.float64).cumsum(1))
        """,
    "seeded random numbers": """
        torch.manual_seed(1234)
        show(torch.rand(4), torch.randn(3, 2), torch.randint(0, 10, (6,)), torch.randperm(8),
             torch.empty(5).normal_(2.0, 0.5), torch.bernoulli(torch.full((6,), 0.3)))
        g = torch.Generator().manual_seed(7)
        show(torch.rand(3, generator=g), torch.initial_seed())
        with torch.random.fork_rng():
            torch.rand(100)
        show(torch.rand(2))
        """,
    "nn training step (SGD, Adam)": """
        torch.manual_seed(0)
        for opt_cls in (torch.optim.SGD, torch.optim.Adam):
            model = torch.nn.Sequential(
                torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                torch.nn.Linear(16, 3))
            opt = opt_cls(model.parameters(), lr=0.01)
            x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
            for _ in range(3):
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                show(loss)
            show(*model.state_dict().values())
        """,
    "torch.save / torch.load round trip": """
        import io, tempfile, os
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        state = {"model": model.state_dict(), "step": 3, "t": torch.arange(6).view(2, 3).t()}
        buf = io.BytesIO()
        torch.save(state, buf)
        buf.seek(0)
        back = torch.load(buf)
        show(back["step"], back["t"], back["t"].stride(), *back["model"].values())
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "m.pt")
            torch.save(model, path)
            show(*torch.load(path, weights_only=False).state_dict().values())
        """,
    "autocast cpu": """
        torch.manual_seed(0)
        a, b = torch.randn(4, 4), torch.randn(4, 4)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            c = a @ b
            show(c.dtype, c, torch.is_autocast_enabled("cpu"))
        show((a @ b).dtype)
        """,
    "DataLoader with workers": """
        from torch.utils.data import DataLoader, TensorDataset
        data = TensorDataset(torch.arange(40.0).view(20, 2), torch.arange(20))
        loader = DataLoader(data, batch_size=4, shuffle=True, num_workers=2,
                            generator=torch.Generator().manual_seed(3))
        for x, y in loader:
            show(x, y)
        """,
    "device queries a CPU program may make": """
        show(torch.device("cpu"), torch.get_default_device(), torch.ones(2).device.type,
             torch.cuda.is_available(), torch.get_default_dtype())
        """,
}

# With the backend, tpu is the accelerator and DataLoader pins its batches; without it, the
# loader warns and does not. The values must be the same either way (is_pinned() is not:
# tests/test_pinned.py checks it against what a CUDA machine does).
PINNED_MEMORY_IDIOMS: dict[str, str] = {
    "DataLoader(pin_memory=True) with workers": """
        import warnings
        from torch.utils.data import DataLoader, TensorDataset
        warnings.simplefilter("ignore")
        data = TensorDataset(torch.arange(24.0).view(12, 2), torch.arange(12))
        loader = DataLoader(data, batch_size=5, shuffle=True, num_workers=2, pin_memory=True,
                            generator=torch.Generator().manual_seed(5))
        for x, y in loader:
            show(x, y)
        """,
}

_PRELUDE = """
import sys
import torch

def show(*values):
    for v in values:
        if isinstance(v, torch.Tensor):
            v = v.detach().contiguous()
            print(" ", v.dtype, tuple(v.shape), v.view(torch.uint8).numpy().tobytes().hex()
                  if v.numel() else "empty")
        else:
            print(" ", repr(v))
"""

_IDIOM = """
print({name!r})
try:
{body}
except Exception as e:  # the same error on both sides is the same behaviour
    print("  raised", type(e).__name__, e)
"""


def _program(idioms: dict[str, str]) -> str:
    parts = [_PRELUDE]
    for name, code in idioms.items():
        body = textwrap.indent(textwrap.dedent(code).strip(), "    ")
        parts.append(_IDIOM.format(name=name, body=body))
    parts.append('print("jax loaded:", "jax" in sys.modules)')
    return "\n".join(parts)


def _run(program: str, autoload: str) -> dict[str, list[str]]:
    out = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": autoload},
    )
    assert out.returncode == 0, out.stderr
    sections: dict[str, list[str]] = {}
    current = None
    for line in out.stdout.splitlines():
        if line.startswith("  "):
            sections[current].append(line)
        else:
            current = line
            sections[current] = []
    return sections


@pytest.fixture(scope="module")
def outputs() -> dict[str, dict[str, list[str]]]:
    program = _program({**CPU_IDIOMS, **PINNED_MEMORY_IDIOMS})
    return {autoload: _run(program, autoload) for autoload in ("1", "0")}


@pytest.mark.parametrize("name", [*CPU_IDIOMS, *PINNED_MEMORY_IDIOMS])
def test_idiom_prints_the_same_bytes_with_and_without_the_backend(outputs, name):
    with_backend, without = outputs["1"][name], outputs["0"][name]
    assert without, f"{name} printed nothing"
    assert with_backend == without


def test_cpu_program_never_loads_jax(outputs):
    assert "jax loaded: True" not in outputs["1"] and "jax loaded: False" in outputs["1"]
