"""Batch greedy generation with a static KV cache: tpu (compiled, fused) against PyTorch
CPU eager and CPU Inductor, in one run.

The model and the decode loop are examples/generate.py's (a small Llama-style
decoder from random weights, a preallocated cache written with index_copy_).
Each variant first runs warm-up batches whose longest prompts land in every
bucket, then measured batches of new mixed prompt lengths (no longest length
repeats a warm-up's). Per variant: prefill time per batch, decode tokens per
second (batch x decoded tokens / decode seconds), and what compiled during the
measured batches: XLA programs for tpu (`torch_tpu.metrics`), Dynamo graphs for
Inductor. Last, whether a compiled decode step writes the cache into the buffer
it read (donation) or into a new one (a copy of the cache per step and layer).

- tpu compiled: torch.compile(step, backend="tpu", options={"bucket_size": B})
  with the prompt length marked dynamic: padded to its bucket in the graph.
- tpu fused: fused eager; the host pads the prompt batch to its bucket.
- CPU eager: PyTorch on the CPU, prompts at their own length.
- CPU Inductor: torch.compile(step) on the CPU (automatic dynamic shapes).

Run: python benchmarks/bench_generate.py [--batch 8] [--new-tokens 32] [--no-inductor]
     [--threads N]
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import statistics
import sys

import torch

import torch_tpu  # noqa: F401
from torch_tpu import metrics

_EXAMPLE = pathlib.Path(__file__).parents[1] / "examples" / "generate.py"
_spec = importlib.util.spec_from_file_location("generate_example", _EXAMPLE)
example = sys.modules["generate_example"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)


def batches(batch: int, bucket: int, rounds: int, seed: int) -> list[list[int]]:
    """Prompt lengths per batch: longest spread over two buckets (1..2*bucket)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for r in range(rounds):
        longest = 2 + (r * 7 + seed * 5) % (2 * bucket - 2)
        out.append(torch.randint(1, longest + 1, (batch - 1,), generator=g).tolist() + [longest])
    return out


def dynamo_graphs() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def run(name, step_fn, device, host_bucket, args, eager="strict"):
    model = example.build(0, example.Config()).to(device)
    warmup = [[args.bucket_size - 1] * args.batch, [2 * args.bucket_size - 1] * args.batch]
    measured = batches(args.batch, args.bucket_size, args.rounds, seed=1)
    prefill, decode, tokens = [], [], []
    with torch.no_grad(), torch.tpu.set_eager_mode(eager):
        for lengths in warmup:
            prompts = example.prompts_of(lengths, model.c.vocab)
            example.generate(step_fn, model, prompts, args.new_tokens, device, host_bucket)
        xla, graphs = metrics.snapshot().get("compiles", 0), dynamo_graphs()
        for k, lengths in enumerate(measured):
            prompts = example.prompts_of(lengths, model.c.vocab, seed=k)
            out, (p, d) = example.generate(
                step_fn, model, prompts, args.new_tokens, device, host_bucket
            )
            prefill.append(p)
            decode.append(d)
            tokens.append(out)
        xla = metrics.snapshot().get("compiles", 0) - xla
        graphs = dynamo_graphs() - graphs
    rate = args.batch * (args.new_tokens - 1) / statistics.median(decode)
    compiles = f"{xla} XLA" if device == "tpu" else f"{graphs} Dynamo graphs"
    if device == "tpu" and step_fn is not example.step:
        compiles += f", {graphs} Dynamo graphs"
    print(
        f"{name:<14}{statistics.median(prefill) * 1e3:>12.1f}{rate:>14.0f}   {compiles}",
        flush=True,
    )
    return tokens


def cache_donated(args) -> str:
    """Does a compiled decode step write the cache in place? Compares the cache's buffer
    before and after one step (XLA:CPU buffer pointers)."""
    from torch_tpu.tensor import storage_of

    model = example.build(0, example.Config()).to("tpu")
    step_fn = example.compiled_step(args.bucket_size)
    cache = model.new_cache(args.batch, 64, "tpu")
    ids = torch.ones(args.batch, 1, dtype=torch.long).to("tpu")
    valid = torch.ones(args.batch, 64, dtype=torch.bool).to("tpu")
    zero = torch.zeros(1, dtype=torch.long).to("tpu")

    def pointer():
        return storage_of(cache[0]).array().unsafe_buffer_pointer()

    with torch.no_grad():
        for t in range(3):
            before = pointer()
            step_fn(model, ids, torch.tensor([t]).to("tpu"), ids * t, valid, zero, *cache)
            after = pointer()
    nbytes = cache[0].numel() * cache[0].element_size() * len(cache)
    if before == after:
        return "cache written in place (same buffer before and after a step)"
    return f"cache copied per step: new buffers each step ({nbytes} bytes of cache per step)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=6, help="measured batches")
    parser.add_argument("--bucket-size", type=int, default=16)
    parser.add_argument("--no-inductor", action="store_true", help="skip CPU Inductor")
    parser.add_argument(
        "--threads", type=int, default=None,
        help="torch CPU threads (default: torch's); on a loaded machine 1 avoids OpenMP "
        "threads spinning against each other, which slowed CPU eager 10x here",
    )  # fmt: skip
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    c = example.Config()
    print(
        f"model: {c.layers} layers, hidden {c.hidden}, {c.heads} heads ({c.kv_heads} kv), "
        f"vocab {c.vocab}; batch {args.batch}, {args.new_tokens} new tokens, "
        f"{args.rounds} measured batches, buckets of {args.bucket_size}, "
        f"torch CPU threads {torch.get_num_threads()}"
    )
    print(f"{'variant':<14}{'prefill ms':>12}{'decode tok/s':>14}   compiles while measured")
    reference = run("cpu eager", example.step, "cpu", None, args)
    results = {
        "tpu compiled": run(
            "tpu compiled", example.compiled_step(args.bucket_size), "tpu", None, args
        ),
        "tpu fused": run("tpu fused", example.step, "tpu", args.bucket_size, args, "fused"),
    }
    if not args.no_inductor:
        inductor = torch.compile(example.step, backend="inductor")
        results["cpu inductor"] = run("cpu inductor", inductor, "cpu", None, args)
    for name, tokens in results.items():
        same = all(torch.equal(a, b) for a, b in zip(tokens, reference))
        print(f"{name}: greedy tokens {'equal' if same else 'DIFFER from'} CPU eager's")
    print(cache_donated(args))


if __name__ == "__main__":
    main()
