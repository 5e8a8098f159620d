"""Our compiled programs on a machine without torch: export here, run on a TPU VM.

`export DIR` (here, with torch): runs `compile_step` of gpt_small, gpt and a wide MLP
with AdamW, and the decode step of
examples/generate.py under torch.compile on tpu, catches the JAX function each compiled
graph lowers to and the arrays of one steady call, and writes, per program, a
`jax.export` artifact lowered for CPU and TPU, its inputs, and its outputs on this
machine's CPU (the MLP's arrays are too big to carry: only their shapes are written,
and `run` fills them with small random values). Beside each, the same computation
written by hand in JAX
(bench_step's AdamW step, benchmarks/jax_decoder.py), at PyTorch's matmul precision
(HIGHEST, as our lowerings use) and at JAX's default.

`run DIR` (JAX only, e.g. on a TPU VM): per program, whether it compiles, how far its
outputs are from the CPU's, its time per call (waited for) against the hand-written
JAX, and its temporaries (XLA's memory analysis).

Run: python benchmarks/tpu_programs.py export DIR; python benchmarks/tpu_programs.py run DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)  # torch_tpu's programs take int64/float64 inputs


# ------------------------------------------------------------------ export side


def _caught_programs(run) -> dict:
    """name -> (jax function, the arrays of its last call), for every compiled graph
    `run()` calls (graphs without random ops: those also take a seed and a counter)."""
    from torch_tpu.compile import runtime

    functions, calls = {}, {}
    compile_graph, call_graph = runtime.CompiledGraph._cache_compile, runtime.CompiledGraph.__call__

    def catch_compile(self, fn, example, donate=()):
        functions[self.name] = fn
        return compile_graph(self, fn, example, donate)

    def catch_call(self, args):
        tensors = list(args) + self.constants
        _, storages, _ = self._describe(tensors)
        calls[self.name] = [np.asarray(s.array("export")) for s in storages]
        return call_graph(self, args)

    runtime.CompiledGraph._cache_compile = catch_compile
    runtime.CompiledGraph.__call__ = catch_call
    try:
        run()
    finally:
        runtime.CompiledGraph._cache_compile = compile_graph
        runtime.CompiledGraph.__call__ = call_graph
    return {name: (functions[name], calls[name]) for name in calls if name in functions}


_OUTPUTS_KEPT = 8 << 20  # bytes of outputs kept for the comparison (the first ones)


def _write(out: Path, name: str, fn, args: list, inputs: str, check: bool) -> None:
    """fn exported for CPU and TPU as `name`; its arguments as `inputs` (programs of one
    family share them; with check=False and a name ending in `shapes`, their shapes
    only); with check, its first outputs here (up to _OUTPUTS_KEPT bytes)."""
    from jax import export

    exported = export.export(jax.jit(fn), platforms=("cpu", "tpu"))(*args)
    (out / f"{name}.bin").write_bytes(exported.serialize())
    if inputs.endswith("shapes"):
        shapes = [(list(np.shape(a)), str(np.asarray(a).dtype)) for a in args]
        (out / f"{inputs}.json").write_text(json.dumps(shapes))
    elif not (out / f"{inputs}.inputs.npz").exists():
        np.savez(out / f"{inputs}.inputs.npz", *args)
    (out / f"{name}.inputs").write_text(inputs)
    if check:
        kept, size = [], 0
        for x in jax.tree.leaves(exported.call(*args)):
            size += x.nbytes
            if kept and size > _OUTPUTS_KEPT:
                break
            kept.append(np.asarray(x))
        np.savez(out / f"{name}.outputs.npz", *kept)


def _gpt_step(size: str):
    import bench_step

    import torch_tpu

    model, opt, inputs, targets, loss_fn = bench_step.gpt_parts(size, "tpu")
    step = torch_tpu.compile_step(model, opt, loss_fn)

    def run():
        for _ in range(4):
            step(inputs, targets).item()

    (fn, args), *_ = _caught_programs(run).values()
    return fn, args


def _jax_gpt_step(size: str):
    """bench_step's hand-written step and its arguments, flattened."""
    import bench_step

    train_step, state, x, y = bench_step.jax_train_step(size)
    leaves, tree = jax.tree.flatten(state)

    def flat_step(*flat):
        *state, x, y = flat
        return train_step(jax.tree.unflatten(tree, state), x, y)

    return flat_step, [*(np.asarray(v) for v in leaves), np.asarray(x), np.asarray(y)]


MLP_WIDTH, MLP_LAYERS, MLP_BATCH = 2048, 4, 8


def _mlp_step():
    """compile_step of MLP_LAYERS x Linear(MLP_WIDTH) + ReLU, MSE, AdamW: the optimizer
    update dominates, as in a big model's step."""
    import torch

    import torch_tpu

    torch.manual_seed(0)
    layers = [torch.nn.Linear(MLP_WIDTH, MLP_WIDTH) for _ in range(MLP_LAYERS)]
    model = torch.nn.Sequential(*(m for layer in layers for m in (layer, torch.nn.ReLU())))
    model = model.to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    x, y = torch.randn(MLP_BATCH, MLP_WIDTH).to("tpu"), torch.randn(MLP_BATCH, MLP_WIDTH).to("tpu")
    step = torch_tpu.compile_step(model, opt, torch.nn.functional.mse_loss)

    def run():
        for _ in range(3):
            step(x, y).item()

    (fn, args), *_ = _caught_programs(run).values()
    return fn, args


def _jax_mlp_step():
    """The same step by hand in JAX (PyTorch's AdamW defaults), arguments flattened:
    weights and biases, their two moments, the step count, the batch."""
    import bench_step
    import jax.numpy as jnp

    def loss_fn(params, x, y):
        for w, b in zip(params[::2], params[1::2]):
            x = jax.nn.relu(x @ w.T + b)
        return jnp.mean((x - y) ** 2)

    def flat_step(*flat):
        n = 2 * MLP_LAYERS
        params, m, v, (count, x, y) = flat[:n], flat[n : 2 * n], flat[2 * n : 3 * n], flat[3 * n :]
        loss, grads = jax.value_and_grad(loss_fn)(list(params), x, y)
        return loss, *bench_step.adamw(list(params), grads, list(m), list(v), count, lr=1e-4)

    shapes = [(MLP_WIDTH, MLP_WIDTH), (MLP_WIDTH,)] * MLP_LAYERS
    arrays = [np.zeros(s, np.float32) for s in shapes] * 3
    batch = [np.zeros((MLP_BATCH, MLP_WIDTH), np.float32)] * 2
    return flat_step, [*arrays, np.float32(1), *batch]


def _decode_step():
    import torch
    from bench_generate import example

    model = example.build().to("tpu")
    step = example.compiled_step(16)
    batch = 8
    cache = model.new_cache(batch, 64, "tpu")
    valid = torch.ones(batch, 64, dtype=torch.bool).to("tpu")
    zero = torch.zeros(1, dtype=torch.long).to("tpu")

    def run():
        token = torch.ones(batch, dtype=torch.long).to("tpu")
        pos, ids = torch.tensor([3]).to("tpu"), torch.full((batch, 1), 3).to("tpu")
        with torch.no_grad():
            for _ in range(4):
                token, pos, ids = step(model, token[:, None], pos, ids, valid, zero, *cache)

    (fn, args), *_ = _caught_programs(run).values()
    return fn, args, example, model


def _jax_decode_step(example, model):
    import jax_decoder

    config = example.Config()
    params = jax_decoder.params_of(model.cpu())
    leaves, tree = jax.tree.flatten(params)
    step = jax_decoder.step_of(config)
    batch, d = 8, config.hidden // config.heads
    cache = [np.zeros((batch, config.kv_heads, 64, d), np.float32)] * (2 * config.layers)
    args = [np.ones((batch, 1), np.int64), np.array([3]), np.full((batch, 1), 3),
            np.ones((batch, 64), bool), np.zeros(1, np.int64)]  # fmt: skip

    def flat_step(*flat):
        p = jax.tree.unflatten(tree, flat[: len(leaves)])
        rest = flat[len(leaves) :]
        return step(p, *rest[:5], list(rest[5:]))

    return flat_step, [*(np.asarray(x) for x in leaves), *args, *cache]


def export_all(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for size in ("gpt_small", "gpt"):
        fn, args = _gpt_step(size)
        _write(out, f"{size}_step.torch_tpu", fn, args, f"{size}_step.torch_tpu", True)
        fn, args = _jax_gpt_step(size)
        with jax.default_matmul_precision("highest"):
            _write(out, f"{size}_step.jax_highest", fn, args, f"{size}_step.jax", False)
        _write(out, f"{size}_step.jax_default", fn, args, f"{size}_step.jax", False)
    fn, args = _mlp_step()
    _write(out, "mlp_step.torch_tpu", fn, args, "mlp_step.torch_tpu.shapes", False)
    fn, args = _jax_mlp_step()
    with jax.default_matmul_precision("highest"):
        _write(out, "mlp_step.jax_highest", fn, args, "mlp_step.jax.shapes", False)
    fn, args, example, model = _decode_step()
    _write(out, "decode_step.torch_tpu", fn, args, "decode_step.torch_tpu", True)
    fn, args = _jax_decode_step(example, model)
    with jax.default_matmul_precision("highest"):
        _write(out, "decode_step.jax_highest", fn, args, "decode_step.jax", False)
    _write(out, "decode_step.jax_default", fn, args, "decode_step.jax", False)
    print(f"wrote {len(list(out.glob('*.bin')))} programs to {out}")


# --------------------------------------------------------------------- run side


def _inputs(src: Path, name: str) -> list:
    """A program's saved arguments, or (shapes only) small random values of those shapes."""
    if not name.endswith("shapes"):
        return list(np.load(src / f"{name}.inputs.npz").values())
    rng = np.random.default_rng(0)
    shapes = json.loads((src / f"{name}.json").read_text())
    return [(rng.random(shape) * 0.01).astype(dtype) for shape, dtype in shapes]


def run_all(src: Path, repeats: int) -> None:
    from jax import export

    print(f"device: {jax.devices()[0].device_kind}")
    rows = []
    for path in sorted(src.glob("*.bin")):
        name = path.name.removesuffix(".bin")
        exported = export.deserialize(path.read_bytes())
        inputs_name = (src / f"{name}.inputs").read_text()
        inputs = _inputs(src, inputs_name)
        outputs = src / f"{name}.outputs.npz"
        expected = list(np.load(outputs).values()) if outputs.exists() else []
        fn = jax.jit(exported.call)
        args = [jax.device_put(x) for x in inputs]
        try:
            got = jax.tree.leaves(fn(*args))
        except Exception as e:  # noqa: BLE001 (report any failure to compile or run)
            rows.append(dict(program=name, error=f"{type(e).__name__}: {str(e)[:300]}"))
            continue
        errors = []
        for g, e in zip(got, expected):
            g, e = np.asarray(g, np.float64), np.asarray(e, np.float64)
            scale = max(float(np.max(np.abs(e))), 1e-30) if e.size else 1.0
            errors.append(float(np.max(np.abs(g - e))) / scale if e.size else 0.0)
        check = {}
        if errors:
            worst = int(np.argmax(errors))
            check = dict(
                max_rel_error=errors[worst], worst_output=worst, outputs_compared=len(errors),
                first_output_error=errors[0],
            )  # fmt: skip
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times.append(time.perf_counter() - start)
        memory = fn.lower(*args).compile().memory_analysis()
        temp = dict(temp_mib=round(memory.temp_size_in_bytes / 2**20, 1)) if memory else {}
        rows.append(dict(program=name, ms=statistics.median(times) * 1e3, **temp, **check))
    for row in rows:
        print(json.dumps(row))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=("export", "run"))
    parser.add_argument("dir", type=Path)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    if args.action == "export":
        sys.path.insert(0, str(Path(__file__).parent))
        export_all(args.dir)
    else:
        run_all(args.dir, args.repeats)


if __name__ == "__main__":
    main()
