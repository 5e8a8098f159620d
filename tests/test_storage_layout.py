"""Storage arrays keep the shape of the contiguous tensor they were made for, so whole
tensors reach programs without a reshape, and donated state is updated in place."""

from __future__ import annotations

import pytest
import torch
from conftest import hold_executables

from torch_tpu.compile import runtime
from torch_tpu.tensor import storage_of


def _shape(t: torch.Tensor) -> tuple:
    return tuple(storage_of(t).shape)


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_outputs_are_shaped_and_writes_keep_the_shape(mode):
    x = torch.randn(4, 6)
    with torch.tpu.set_eager_mode(mode):
        a = x.to("tpu")
        b = a * 2 + 1
        t = b.t().contiguous()
        b.add_(1)  # an in-place op over the whole storage
        b.view(-1)[3:9].mul_(2)  # through a view of another shape
        b[:, 1].zero_()
        zeros = torch.zeros(3, 5, device="tpu")
        zeros[1:].fill_(2)
        shapes = (_shape(a), _shape(b), _shape(t), _shape(zeros))
        values = (b.cpu(), t.cpu(), zeros.cpu())
    assert shapes == ((4, 6), (4, 6), (6, 4), (3, 5))
    expected = x * 2 + 2
    expected.view(-1)[3:9].mul_(2)
    expected[:, 1] = 0
    torch.testing.assert_close(values[0], expected)
    torch.testing.assert_close(values[1], (x * 2 + 1).t())
    torch.testing.assert_close(values[2], torch.tensor([[0.0] * 5, [2.0] * 5, [2.0] * 5]))


def test_zero_dim_tensors_have_zero_dim_arrays_however_made():
    made = [
        torch.empty((), device="tpu"),
        torch.tensor(2.0).to("tpu"),
        torch.ones(3).to("tpu").sum(),
    ]
    assert [_shape(t) for t in made] == [(), (), ()]


def test_a_strided_output_is_flat():
    """An output PyTorch lays out transposed (its strides kept) has a flat storage."""
    x = torch.randn(5, 3).to("tpu")
    y = torch.empty_strided((5, 3), (1, 5), device="tpu")
    torch.add(x, 1, out=y)
    assert y.stride() == (1, 5) and _shape(y) == (15,)
    torch.testing.assert_close(y.cpu(), x.cpu() + 1)


def _optimizer_temporaries(width: int, steps: int = 2) -> tuple[int, int]:
    """(bytes of temporaries of the compiled optimizer.step program, parameter bytes)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(3)]).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(4, width).to("tpu"), torch.randn(4, width).to("tpu")

    def step():
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    compiled = torch.compile(step, backend="tpu")
    for _ in range(steps):
        compiled()
    params = {id(p) for p in model.parameters()}
    temps = []
    for graph in list(runtime._LIVE):
        for executable, written, _ in graph.executables.values():
            if len(written) >= 3 * len(params):  # the step: parameters and two moments
                temps.append(executable.memory_analysis().temp_size_in_bytes)
    assert temps, "no compiled optimizer step found"
    return max(temps), sum(p.numel() * 4 for p in model.parameters())


def test_compiled_adamw_updates_its_state_in_place():
    """With flat storages, XLA:CPU copied every donated moment before updating it (the
    reshape between the flat buffer and the 2-D value stood in the way): temporaries
    of about twice the parameters. Shaped storages keep the update in place."""
    temp, param_bytes = _optimizer_temporaries(512)
    assert temp < 0.05 * param_bytes, (temp, param_bytes)


@pytest.mark.parametrize("shape", [(5, 5, 10), (8, 8, 8), (2, 3, 4, 5)])
def test_full_sums_of_short_dims_match_the_cpu(shape):
    """XLA:CPU sums short dims one element after another (less exact than PyTorch's
    pairwise sums); the sum lowerings reduce such arrays flattened, as one long dim."""
    x = torch.full(shape, 0.2)
    t = x.to("tpu")
    for got, expected in [
        (t.sum(), x.sum()),
        (t.sum(tuple(range(len(shape))), keepdim=True), x.sum(tuple(range(len(shape))), True)),
        (t.mean(), x.mean()),
    ]:
        assert got.shape == expected.shape
        torch.testing.assert_close(got.cpu(), expected)


def test_a_tensor_made_any_way_reuses_the_same_program(monkeypatch):
    """A storage's array shape is part of every program's key, so every way of making a
    contiguous tensor must give the same shape: else the same op at the same geometry
    compiles again (a bucketed prompt that needed no padding did)."""
    import jax.numpy as jnp

    from torch_tpu import bucketing, metrics
    from torch_tpu.interop import exchange

    hold_executables(monkeypatch)
    x = torch.randn(3, 8)
    made = {
        "upload": lambda: x.to("tpu"),
        "op output": lambda: torch.zeros(3, 8, device="tpu") + x.to("tpu"),
        "empty, then filled": lambda: torch.empty(3, 8, device="tpu").copy_(x),
        "from_jax": lambda: exchange.from_jax(jnp.asarray(x.numpy())),
        "bucket padding": lambda: bucketing.pad_to_bucket(x[:, :5].to("tpu"), bucket_size=8)[0],
        "clone": lambda: x.to("tpu").clone(),
    }
    compiles = {}
    for name, make in made.items():
        t = make()
        torch.tpu.synchronize()
        before = metrics.snapshot().get("compiles", 0)
        (t * 3 - 1.5).cpu()
        compiles[name] = metrics.snapshot().get("compiles", 0) - before
    first = next(iter(compiles))
    assert all(n == 0 for name, n in compiles.items() if name != first), compiles
