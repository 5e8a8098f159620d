"""torch.compile(backend="tpu") against eager, Inductor and hand-written JAX; ratios from one run.

Workloads (torch_tpu.training.GPT_SIZES):
- gpt: 2 blocks, d=256, 4 heads, seq 128, batch 8, vocab 1024, AdamW(foreach=False);
- gpt_small: d=64, seq 32, batch 4, vocab 256.

For each: a training step (training.gpt_step_fn's) with the model and the
optimizer step compiled by `tpu`, in strict eager, compiled the same way by
Inductor on CPU, and in PyTorch CPU eager; then forward+backward alone, compiled by `tpu`, next
to the same model written directly in JAX (weights copied from the torch model)
under jax.jit. Last, the compiled first step in a fresh process with an empty
compilation cache directory (cold) and again in a second process on the same
directory (warm).

Targets (issue): compiled >= 2x faster than strict eager on both workloads;
compiled forward+backward within 1.15x of hand-written JAX; warm first step
<= 1/5 of cold. The ratio to Inductor is reported.

Run: python benchmarks/bench_compile.py [--steps N] [--workloads gpt gpt_small]
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import torch
from torch import nn

import torch_tpu
from torch_tpu.training import GPT_SIZES, TinyGPT


def best_time(fn, steps: int, sync) -> float:
    """Best seconds per call after two warm-up calls; sync() waits for the device."""
    for _ in range(2):
        fn()
        sync()
    best = float("inf")
    for _ in range(steps):
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def make_training_step(size: str, device: str, backend: str | None):
    """gpt_step_fn's training step (same seed, data, AdamW(foreach=False)), with the model
    and the optimizer step compiled by backend when one is given; returns the loss."""
    cfg = GPT_SIZES[size]
    torch.manual_seed(0)
    model = TinyGPT(cfg["vocab"], cfg["d"], cfg["heads"], cfg["seq"]).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"] + 1), generator=g).to(device)
    inputs, targets = idx[:, :-1], idx[:, 1:]
    forward, opt_step = model, opt.step
    if backend is not None:
        forward = torch.compile(model, backend=backend)
        opt_step = torch.compile(lambda: opt.step(), backend=backend)

    def step() -> torch.Tensor:
        opt.zero_grad()
        logits = forward(inputs)
        loss = nn.functional.cross_entropy(logits.reshape(-1, cfg["vocab"]), targets.reshape(-1))
        loss.backward()
        opt_step()
        return loss

    return step


def training_step(size: str, device: str, backend: str | None) -> float:
    step = make_training_step(size, device, backend)
    return best_time(lambda: step().item(), STEPS, lambda: None)


# ------------------------------------------------------- forward + backward


def _batch(size: str):
    cfg = GPT_SIZES[size]
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"] + 1), generator=g)
    return idx[:, :-1].contiguous(), idx[:, 1:].contiguous()


def _model(size: str) -> TinyGPT:
    cfg = GPT_SIZES[size]
    torch.manual_seed(0)
    return TinyGPT(cfg["vocab"], cfg["d"], cfg["heads"], cfg["seq"])


def compiled_forward_backward(size: str) -> tuple[float, float]:
    """(seconds, loss) of loss + backward with the whole loss function compiled by tpu."""
    vocab = GPT_SIZES[size]["vocab"]
    model = _model(size).to("tpu")
    x, y = (t.to("tpu") for t in _batch(size))

    @torch.compile(backend="tpu")
    def loss_fn(x, y):
        return nn.functional.cross_entropy(model(x).reshape(-1, vocab), y.reshape(-1))

    def step():
        model.zero_grad(set_to_none=True)
        loss = loss_fn(x, y)
        loss.backward()
        return loss

    seconds = best_time(step, STEPS, torch.tpu.synchronize)
    return seconds, step().item()


def matched_matmul_precision() -> str:
    """JAX's name for the matmul precision torch_tpu's lowerings use under PyTorch's
    current float32 setting ("highest" by default: full float32). JAX's own default is
    one bfloat16 pass on a TPU, so an anchor left at it computes a less exact step (on
    the v5e gpt's JAX step took 1.67 ms at JAX's default and 2.04 ms at "highest");
    XLA:CPU computes float32 exactly either way."""
    from torch_tpu import precision

    precision.sync()
    return precision.matmul().name.lower()


def jax_gpt_loss(size: str):
    """TinyGPT's cross-entropy loss written directly in JAX: loss(params, x, y), params
    keyed like the torch model's state_dict; its products at torch_tpu's precision
    (`matched_matmul_precision`, read when the loss is made)."""
    cfg = GPT_SIZES[size]
    heads, n_layers = cfg["heads"], 2

    def linear(p, name, h):
        return h @ p[name + ".weight"].T + p[name + ".bias"]

    def layer_norm(p, name, h):
        mean = h.mean(-1, keepdims=True)
        var = ((h - mean) ** 2).mean(-1, keepdims=True)
        return (h - mean) / jnp.sqrt(var + 1e-5) * p[name + ".weight"] + p[name + ".bias"]

    def attention(q, k, v):
        b, t, d = q.shape
        split = lambda z: z.reshape(b, t, heads, d // heads).transpose(0, 2, 1, 3)  # noqa: E731
        q, k, v = split(q), split(k), split(v)
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d // heads)
        scores = jnp.where(jnp.tril(jnp.ones((t, t), bool)), scores, -jnp.inf)
        out = jax.nn.softmax(scores, axis=-1) @ v
        return out.transpose(0, 2, 1, 3).reshape(b, t, d)

    matmul_precision = matched_matmul_precision()

    def loss(p, x, y):
        with jax.default_matmul_precision(matmul_precision):
            return unmatched_loss(p, x, y)

    def unmatched_loss(p, x, y):
        h = p["tok.weight"][x] + p["pos.weight"][jnp.arange(x.shape[1])]
        for i in range(n_layers):
            pre = f"blocks.{i}."
            q, k, v = jnp.split(linear(p, pre + "qkv", layer_norm(p, pre + "ln1", h)), 3, -1)
            h = h + linear(p, pre + "proj", attention(q, k, v))
            m = jax.nn.gelu(linear(p, pre + "mlp.0", layer_norm(p, pre + "ln2", h)), False)
            h = h + linear(p, pre + "mlp.2", m)
        logits = linear(p, "head", layer_norm(p, "ln", h))
        logp = jax.nn.log_softmax(logits.reshape(-1, cfg["vocab"]), -1)
        return -jnp.take_along_axis(logp, y.reshape(-1, 1), 1).mean()

    return loss


def jax_forward_backward(size: str) -> tuple[float, float]:
    """(seconds, loss) of the same model written in JAX: jit(value_and_grad(loss))."""
    params = {k: jnp.asarray(v.detach().numpy()) for k, v in _model(size).state_dict().items()}
    x, y = (jnp.asarray(t.numpy()) for t in _batch(size))
    loss = jax_gpt_loss(size)
    grad_fn = jax.jit(jax.value_and_grad(loss))
    result = []

    def step():
        result[:] = [grad_fn(params, x, y)]

    seconds = best_time(step, STEPS, lambda: jax.block_until_ready(result))
    return seconds, float(result[0][0])


# ------------------------------------------------------------- first step

_FIRST_STEP = """
import time
from benchmarks.bench_compile import make_training_step
step = make_training_step("{size}", "tpu", "tpu")
start = time.perf_counter()
step().item()
print(time.perf_counter() - start)
"""


def first_step(size: str, cache_dir: str) -> float:
    env = dict(os.environ, TORCH_TPU_CACHE_DIR=cache_dir)
    out = subprocess.run(
        [sys.executable, "-c", _FIRST_STEP.format(size=size)],
        capture_output=True,
        text=True,
        check=True,
        timeout=900,
        env=env,
    )
    return float(out.stdout.strip().splitlines()[-1])


STEPS = 5


def main() -> None:
    global STEPS
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--workloads", nargs="*", default=["gpt", "gpt_small"])
    parser.add_argument("--no-inductor", action="store_true", help="skip Inductor (slow compile)")
    args = parser.parse_args()
    STEPS = args.steps
    print(f"platform: {torch_tpu.platform.platform()}  ({torch.get_num_threads()} CPU threads)")
    for size in args.workloads:
        times = {
            "tpu compiled": training_step(size, "tpu", "tpu"),
            "tpu strict eager": training_step(size, "tpu", None),
            "cpu eager": training_step(size, "cpu", None),
        }
        if not args.no_inductor:
            times["cpu inductor"] = training_step(size, "cpu", "inductor")
        shown = "  ".join(f"{k} {v * 1e3:.1f} ms" for k, v in times.items())
        print(f"{size} training step: {shown}")
        compiled = times["tpu compiled"]
        line = f"  compiled vs strict eager: {times['tpu strict eager'] / compiled:.2f}x faster"
        line += f"; vs cpu eager: {times['cpu eager'] / compiled:.2f}x"
        if "cpu inductor" in times:
            line += f"; vs cpu inductor: {times['cpu inductor'] / compiled:.2f}x"
        print(line)
        ours, our_loss = compiled_forward_backward(size)
        theirs, their_loss = jax_forward_backward(size)
        print(
            f"{size} forward+backward: tpu compiled {ours * 1e3:.1f} ms, hand-written JAX "
            f"{theirs * 1e3:.1f} ms, ratio {ours / theirs:.2f}x "
            f"(losses {our_loss:.5f} / {their_loss:.5f})"
        )
    with tempfile.TemporaryDirectory(prefix="torch_tpu_bench_cache_") as cache_dir:
        cold = first_step("gpt_small", cache_dir)
        warm = first_step("gpt_small", cache_dir)
    print(
        f"first compiled step, gpt_small (fresh process): cold cache {cold:.2f} s, "
        f"warm cache {warm:.2f} s, warm/cold {warm / cold:.2f}"
    )


if __name__ == "__main__":
    main()
