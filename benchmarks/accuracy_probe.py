"""How far tpu's results are from exact, beside CPU's, op by op: the platform's own
arithmetic (a TPU's float32 transcendentals, its float64 support) rather than our
lowerings, which the parity tests cover.

Per op and dtype: the largest relative error of tpu's result against a float64 (for
float64: a float64 on CPU, i.e. CPU's own) reference computed on the host, and CPU's
error in the same terms. On XLA:CPU the two columns agree to a few ulps; on a TPU they
show what docs/on_tpu.md and differences.md record. An op the platform refuses prints
its error instead of a figure.

Run: python benchmarks/accuracy_probe.py [--mode strict|fused]
"""

from __future__ import annotations

import argparse

import torch

import torch_tpu


def _inputs(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 64, generator=g, dtype=torch.float64)
    return {
        "x": x.to(dtype),
        "positive": (x.abs() + 0.1).to(dtype),
        "w": torch.randn(64, 64, generator=g, dtype=torch.float64).to(dtype),
        "image": torch.randn(2, 3, 16, 16, generator=g, dtype=torch.float64).to(dtype),
        "kernel": torch.randn(4, 3, 3, 3, generator=g, dtype=torch.float64).to(dtype),
    }


OPS = {
    "exp": lambda t: t["x"].exp(),
    "log": lambda t: t["positive"].log(),
    "tanh": lambda t: t["x"].tanh(),
    "sigmoid": lambda t: t["x"].sigmoid(),
    "erf": lambda t: t["x"].erf(),
    "sqrt": lambda t: t["positive"].sqrt(),
    "reciprocal": lambda t: t["positive"].reciprocal(),
    "pow 1.5": lambda t: t["positive"].pow(1.5),
    "log_softmax": lambda t: t["x"].log_softmax(-1),
    "gelu": lambda t: torch.nn.functional.gelu(t["x"]),
    "sum": lambda t: t["x"].sum(-1),
    "matmul": lambda t: t["x"] @ t["w"],
    "conv2d": lambda t: torch.nn.functional.conv2d(t["image"], t["kernel"]),
}


def _relative_error(value: torch.Tensor, exact: torch.Tensor) -> float:
    """Largest error relative to the result's own scale (so results near 0 of a function
    of order 1 do not dominate)."""
    scale = exact.abs().clamp_min(exact.abs().max().item() * 1e-3)
    return ((value.double() - exact) / scale).abs().max().item()


def probe(dtypes: list[torch.dtype]) -> None:
    print(f"{'op':<12} {'dtype':<8} {'tpu':>10} {'cpu':>10}")
    for dtype in dtypes:
        inputs = _inputs(dtype)
        exact_inputs = {k: v.double() for k, v in inputs.items()}
        on_tpu = {k: v.to("tpu") for k, v in inputs.items()}
        for name, op in OPS.items():
            exact = op(exact_inputs)
            cpu = _relative_error(op(inputs), exact)
            try:
                tpu = f"{_relative_error(op(on_tpu).cpu(), exact):10.2e}"
            except Exception as error:  # the platform refused it: say so
                tpu = f"{type(error).__name__}: {str(error).splitlines()[0][:80]}"
            print(f"{name:<12} {str(dtype).removeprefix('torch.'):<8} {tpu:>10} {cpu:10.2e}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", default="strict", choices=["strict", "fused"])
    args = parser.parse_args()
    print(
        f"platform: {torch_tpu.platform.platform()}, matmul precision "
        f"{torch.get_float32_matmul_precision()}, {args.mode} mode"
    )
    with torch.tpu.set_eager_mode(args.mode):
        probe([torch.float32, torch.float64, torch.bfloat16])


if __name__ == "__main__":
    main()
