"""Training parity: the same seed and model on CPU and on tpu give the same loss at
every step (float32, 1e-4 relative), for an MLP and a small CNN, with SGD and AdamW,
on the optimizers' default (foreach) path and with foreach=False."""

import pytest
import torch

import torch_tpu
from torch_tpu.training import cnn, mlp, train_losses

STEPS = 20

# Every test runs in debug, strict and fused eager mode (conftest.eager_mode).
pytestmark = pytest.mark.usefixtures("eager_mode")


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
@pytest.mark.parametrize("model_fn", [mlp, cnn], ids=["mlp", "cnn"])
@pytest.mark.parametrize("foreach", [None, False], ids=["default", "foreach_false"])
def test_losses_match_cpu_every_step(model_fn, optimizer, foreach):
    cpu = train_losses(model_fn, "cpu", STEPS, optimizer, foreach=foreach)
    torch_tpu.metrics.reset()
    tpu = train_losses(model_fn, "tpu", STEPS, optimizer, foreach=foreach)
    torch.testing.assert_close(torch.tensor(tpu), torch.tensor(cpu), rtol=1e-4, atol=1e-6)
    assert cpu[-1] < cpu[0]  # the model really trains
    assert not torch_tpu.metrics.snapshot()["fallback_ops"], "training fell back to the CPU"


def test_module_moves_between_devices_and_clip_grad_norm():
    torch.manual_seed(0)
    model = mlp()
    moved = model.to("tpu")
    assert all(p.device.type == "tpu" for p in moved.parameters())
    x = torch.randn(8, 64)
    moved(x.to("tpu")).sum().backward()
    model_cpu = mlp()
    model_cpu.load_state_dict({k: v.cpu() for k, v in moved.state_dict().items()})
    model_cpu(x).sum().backward()
    norm_tpu = torch.nn.utils.clip_grad_norm_(moved.parameters(), 0.5)
    norm_cpu = torch.nn.utils.clip_grad_norm_(model_cpu.parameters(), 0.5)
    torch.testing.assert_close(norm_tpu.cpu(), norm_cpu, rtol=1e-5, atol=1e-6)
    for p_tpu, p_cpu in zip(moved.parameters(), model_cpu.parameters()):
        torch.testing.assert_close(p_tpu.grad.cpu(), p_cpu.grad, rtol=1e-5, atol=1e-6)
    assert all(p.device.type == "cpu" for p in moved.cpu().parameters())
