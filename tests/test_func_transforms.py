"""torch.func on tpu: per-sample gradients (vmap over grad of a functional_call),
jacrev, hessian, jvp and a vmapped matmul give CPU's values in every eager mode.
functorch's transforms wrap tpu tensors in their own batched and gradient tensors and
dispatch through PyTorch's functorch keys before tpu's kernels: a transform whose rule
fell through to a wrong kernel would give other numbers without an error."""

import copy

import pytest
import torch
from torch.func import functional_call, grad, hessian, jacrev, jvp, vmap

import torch_tpu

pytestmark = pytest.mark.usefixtures("eager_mode")


def _transforms(model: torch.nn.Module, x, y) -> dict[str, torch.Tensor]:
    device = x.device
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p, xi, yi):
        out = functional_call(model, p, (xi[None],))
        return torch.nn.functional.cross_entropy(out, yi[None])

    per_sample = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    v = torch.linspace(-1, 1, 6, device=device)

    def f(v):
        return v.sin() * v.cos().sum()

    _, tangent = jvp(f, (v,), (torch.ones(6, device=device),))
    batched = vmap(torch.mm, in_dims=(0, None))(
        torch.arange(24.0, device=device).reshape(3, 2, 4), torch.eye(4, device=device) * 2
    )
    return {
        **{f"per-sample grad {k}": g for k, g in per_sample.items()},
        "jacrev": jacrev(f)(v),
        "hessian": hessian(lambda v: (v.pow(3) * v.exp()).sum())(v),
        "jvp": tangent,
        "vmap(mm)": batched,
    }


def test_func_transforms_match_cpu():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    x, y = torch.randn(4, 5), torch.randint(0, 3, (4,))
    cpu = _transforms(model, x, y)
    moved, xt, yt = copy.deepcopy(model).to("tpu"), x.to("tpu"), y.to("tpu")
    torch_tpu.metrics.reset()
    tpu = _transforms(moved, xt, yt)
    # (jvp's and jacrev's zero tangents were made on the CPU and copied over)
    assert not torch_tpu.metrics.snapshot()["fallback_ops"]
    assert cpu.keys() == tpu.keys()
    for name, expected in cpu.items():
        assert tpu[name].device.type == "tpu", name
        torch.testing.assert_close(tpu[name].cpu(), expected, msg=name)
