"""A whole training step compiled: torch_tpu.compile_step against its anchors, from one run.

Workloads: torch_tpu.training.gpt_parts (TinyGPT, AdamW(foreach=False),
cross-entropy on a fixed batch), sizes gpt_small and gpt.

Rows per workload (best step time after warm-up; each step waits for its loss):
- tpu compile_step: forward, backward and AdamW as one executable, state donated;
- tpu torch.compile(step): the same step function under torch.compile (Dynamo
  breaks it at backward; with --compiled-autograd, compiled autograd is on);
- JAX jit: the same model, loss and AdamW written in JAX, one jax.jit with the
  parameters and optimizer state donated (the substrate's limit);
- CPU Inductor: torch.compile of the same step function on CPU;
- CPU eager: PyTorch on the CPU.

Targets (issue 12): compile_step <= 1.15x the JAX step on both workloads, and
faster than CPU Inductor on gpt_small. Losses after the timed steps are printed
next to CPU eager's as a parity check (same seed, same number of steps).

Run: python benchmarks/bench_step.py [--steps N] [--workloads gpt_small gpt]
     [--no-inductor] [--compiled-autograd]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import torch

import torch_tpu
from benchmarks.bench_compile import jax_gpt_loss
from torch_tpu.training import GPT_SIZES, gpt_parts


def best_time(step, steps: int) -> float:
    """Best seconds per call of step() (which waits for its result) after two warm-ups."""
    for _ in range(2):
        step()
    best = float("inf")
    for _ in range(steps):
        start = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - start)
    return best


def run_torch(size: str, device: str, how: str, steps: int) -> tuple[float, float, int]:
    """(seconds per step, final loss, steps taken) for one way of running the step."""
    model, opt, inputs, targets, loss_fn = gpt_parts(size, device)
    if how == "compile_step":
        compiled = torch_tpu.compile_step(model, opt, loss_fn)

        def step():
            return compiled(inputs, targets)
    else:

        def step():
            opt.zero_grad()
            loss = loss_fn(model(inputs), targets)
            loss.backward()
            opt.step()
            return loss

        if how == "compile":
            step = torch.compile(step, backend="tpu" if device == "tpu" else "inductor")
    losses = []
    seconds = best_time(lambda: losses.append(step().item()), steps)
    return seconds, losses[-1], len(losses)


def run_cpu_eager_losses(size: str, n: int) -> float:
    """CPU eager's loss at step n: the parity oracle for every row."""
    model, opt, inputs, targets, loss_fn = gpt_parts(size, "cpu")
    for _ in range(n):
        opt.zero_grad()
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        opt.step()
    return loss.item()


def run_jax(size: str, steps: int) -> tuple[float, float]:
    """(seconds per step, final loss) of the step written in JAX, jitted whole, state
    donated; AdamW as torch.optim.AdamW (lr 1e-3, betas (0.9, 0.999), eps 1e-8, wd 1e-2)."""
    model, _, inputs, targets, _ = gpt_parts(size, "cpu")
    params = {k: jnp.asarray(v.detach().numpy()) for k, v in model.state_dict().items()}
    x, y = jnp.asarray(inputs.numpy()), jnp.asarray(targets.numpy())
    loss_fn = jax_gpt_loss(size)
    lr, b1, b2, eps, wd = 1e-3, 0.9, 0.999, 1e-8, 1e-2

    def train_step(state, x, y):
        params, m, v, t = state
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        t = t + 1
        bc1, bc2 = 1 - b1**t, 1 - b2**t
        m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, grads)
        v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, grads)
        params = jax.tree.map(
            lambda p, m, v: p * (1 - lr * wd) - lr / bc1 * m / (jnp.sqrt(v) / jnp.sqrt(bc2) + eps),
            params,
            m,
            v,
        )
        return (params, m, v, t), loss

    jitted = jax.jit(train_step, donate_argnums=0)
    zeros = jax.tree.map(jnp.zeros_like, params)
    state = [(params, zeros, jax.tree.map(jnp.zeros_like, params), jnp.float32(0))]
    losses = []

    def step():
        state[0], loss = jitted(state[0], x, y)
        losses.append(float(loss))

    return best_time(step, steps), losses[-1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--workloads", nargs="*", default=["gpt_small", "gpt"])
    parser.add_argument("--no-inductor", action="store_true", help="skip Inductor (slow compile)")
    parser.add_argument(
        "--compiled-autograd", action="store_true", help="torch.compile row with compiled autograd"
    )
    args = parser.parse_args()
    if args.compiled_autograd:
        torch._dynamo.config.compiled_autograd = True
    print(f"platform: {torch_tpu.platform.platform()}  ({torch.get_num_threads()} CPU threads)")
    for size in args.workloads:
        assert size in GPT_SIZES, size
        rows = {
            "tpu compile_step": run_torch(size, "tpu", "compile_step", args.steps),
            "tpu torch.compile(step)": run_torch(size, "tpu", "compile", args.steps),
            "JAX jit (donated)": (*run_jax(size, args.steps), 2 + args.steps),
            "CPU eager": run_torch(size, "cpu", "eager", args.steps),
        }
        if not args.no_inductor:
            rows["CPU Inductor"] = run_torch(size, "cpu", "compile", args.steps)
        oracle = run_cpu_eager_losses(size, 2 + args.steps)
        ours = rows["tpu compile_step"][0]
        print(f"{size} whole training step (CPU eager loss at step {2 + args.steps}: {oracle:.5f})")
        for name, (seconds, loss, _) in rows.items():
            print(
                f"  {name:<26} {seconds * 1e3:8.2f} ms   compile_step is {seconds / ours:5.2f}x "
                f"faster   loss {loss:.5f}"
            )
        jax_seconds = rows["JAX jit (donated)"][0]
        line = f"  compile_step / JAX: {ours / jax_seconds:.2f}x (target <= 1.15x)"
        if "CPU Inductor" in rows:
            line += f"; vs CPU Inductor: {rows['CPU Inductor'][0] / ours:.2f}x faster"
        line += f"; vs CPU eager: {rows['CPU eager'][0] / ours:.2f}x faster"
        print(line)


if __name__ == "__main__":
    main()
