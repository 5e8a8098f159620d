"""Batch greedy generation with a static KV cache: tpu (compiled, fused) against PyTorch
CPU eager, CPU Inductor and the same decoder hand-written in JAX, in one run.

The model and the decode loop are examples/generate.py's (a small Llama-style
decoder from random weights, a preallocated cache written with index_copy_).
Each variant first runs warm-up batches whose longest prompts land in every
bucket, then measured batches of new mixed prompt lengths (no longest length
repeats a warm-up's); every variant runs each measured batch in turn, so that
the machine's drift hits them alike. Per variant: prefill time per batch,
decode tokens per second (batch x decoded tokens / decode seconds), and what
compiled during the measured batches: XLA programs for tpu
(`torch_tpu.metrics`) and JAX, Dynamo graphs for Inductor. Last, whether a
compiled decode step writes the cache into the buffer it read (donation) or
into a new one (a copy of the cache per step and layer).

- tpu compiled: torch.compile(step, backend="tpu", options={"bucket_size": B})
  with the prompt length marked dynamic: padded to its bucket in the graph.
- tpu fused: fused eager; the host pads the prompt batch to its bucket.
- CPU eager: PyTorch on the CPU, prompts at their own length.
- CPU Inductor: torch.compile(step) on the CPU (automatic dynamic shapes).
- JAX jit: the same decoder and loop written by hand in JAX (benchmarks/jax_decoder.py),
  one jitted step with the cache donated: what XLA itself reaches here, with no
  PyTorch in the loop (prompts padded to their bucket on the host, as fused mode's).

Run: python benchmarks/bench_generate.py [--batch 8] [--new-tokens 32] [--no-inductor]
     [--threads N]
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import statistics
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import jax_decoder  # (a script: its own folder is sys.path[0])
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


@dataclass
class Variant:
    """One way to generate: generate(lengths, seed) -> (tokens, (prefill s, decode s))."""

    name: str
    generate: Callable
    counts: str = "dynamo"  # which compiles to report: "dynamo", "xla" or "both"
    prefill: list = field(default_factory=list)
    decode: list = field(default_factory=list)
    tokens: list = field(default_factory=list)
    compiles: Counter = field(default_factory=Counter)


def torch_variant(name, step_fn, device, host_bucket, args, eager="strict", counts="dynamo"):
    model = example.build(0, example.Config()).to(device)

    def generate(lengths, seed):
        prompts = example.prompts_of(lengths, model.c.vocab, seed=seed)
        with torch.no_grad(), torch.tpu.set_eager_mode(eager):
            return example.generate(step_fn, model, prompts, args.new_tokens, device, host_bucket)

    return Variant(name, generate, counts)


def jax_variant(args) -> Variant:
    """The hand-written JAX decoder on the same weights, prompts and loop."""
    config = example.Config()
    params = jax_decoder.params_of(example.build(0, config))
    step = jax_decoder.make_step(config)

    def generate(lengths, seed):
        prompts = example.prompts_of(lengths, config.vocab, seed=seed)
        return jax_decoder.generate(
            step, params, config, prompts, args.new_tokens, args.bucket_size
        )

    generate.step = step
    return Variant("jax jit", generate, "jax")


def compile_counts(variants) -> Counter:
    counts = Counter(xla=metrics.snapshot().get("compiles", 0), dynamo=dynamo_graphs())
    for v in variants:
        if v.counts == "jax":
            counts["jax"] += v.generate.step._cache_size()
    return counts


def measure(variants: list[Variant], args) -> None:
    """Warm-up batches (one per bucket) for every variant, then each measured batch run by
    every variant in turn, so that the machine's drift hits them alike."""
    warmup = [[args.bucket_size - 1] * args.batch, [2 * args.bucket_size - 1] * args.batch]
    for v in variants:
        for lengths in warmup:
            v.generate(lengths, 1)
    for k, lengths in enumerate(batches(args.batch, args.bucket_size, args.rounds, seed=1)):
        for v in variants:
            before = compile_counts(variants)
            out, (p, d) = v.generate(lengths, k)
            v.compiles.update(compile_counts(variants))
            v.compiles.subtract(before)
            v.prefill.append(p)
            v.decode.append(d)
            v.tokens.append(out)
    for v in variants:
        rate = args.batch * (args.new_tokens - 1) / statistics.median(v.decode)
        counts = {
            "dynamo": f"{v.compiles['dynamo']} Dynamo graphs",
            "jax": f"{v.compiles['jax']} XLA",
            "xla": f"{v.compiles['xla']} XLA",
            "both": f"{v.compiles['xla']} XLA, {v.compiles['dynamo']} Dynamo graphs",
        }[v.counts]
        print(f"{v.name:<14}{statistics.median(v.prefill) * 1e3:>12.1f}{rate:>14.0f}   {counts}")


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
    variants = [
        torch_variant("cpu eager", example.step, "cpu", None, args),
        torch_variant(
            "tpu compiled",
            example.compiled_step(args.bucket_size),
            "tpu",
            None,
            args,
            counts="both",
        ),  # fmt: skip
        torch_variant("tpu fused", example.step, "tpu", args.bucket_size, args, "fused", "xla"),
        jax_variant(args),
    ]
    if not args.no_inductor:
        inductor = torch.compile(example.step, backend="inductor")
        variants.append(torch_variant("cpu inductor", inductor, "cpu", None, args))
    measure(variants, args)
    for v in variants[1:]:
        same = all(torch.equal(a, b) for a, b in zip(v.tokens, variants[0].tokens))
        print(f"{v.name}: greedy tokens {'equal' if same else 'DIFFER from'} CPU eager's")
    print(cache_donated(args))


if __name__ == "__main__":
    main()
