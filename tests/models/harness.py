"""Run one zoo case in one mode on tpu against the CPU, and say how it went.

A cell (case x mode) is one training step compared with the CPU's: the
forward's outputs and loss, every parameter's gradient, and every parameter
after one `torch.optim.AdamW` step (defaults: what a user gets). Two more
steps give the steady time, after two untimed steps: the second step is the
first with optimizer state, and fused mode's segments settle only after it
(llama, fused: the third step still ran one program the second had not; each
new one is a compile or a disk-cache load, which timing counted as steady
time: 190 ms a step against 16 ms once settled). Language models
also `generate()` a few tokens greedily, which must be the CPU's tokens. The CPU
run is the oracle and is computed once per case; the tpu run starts from a deep
copy of the same initial model moved with `.to("tpu")`.

Modes: `strict` and `fused` eager (`torch.tpu.set_eager_mode`) and
`compiled` (`model.forward = torch.compile(model.forward, backend="tpu")`,
which serves both the training step and `generate()`; the optimizer step
stays eager).

A failure never escapes `run_cell`: it becomes a cell with status `error`
and the exception's first line, so one broken model cannot stop a report.
"""

from __future__ import annotations

import copy
import time
import traceback
from dataclasses import dataclass, field

import torch
from zoo import Built, Case, flat_tensors, loss_of

import torch_tpu

MODES = ("strict", "fused", "compiled")
NEW_TOKENS = 4
STEADY_STEPS = 2
WARMUP_STEPS = 2  # untimed, between the compared step and the steady ones
RTOL, ATOL = 1e-3, 1e-4
AFTER_STEP = " after step"
LR = 1e-3


@dataclass
class Cell:
    case: str
    mode: str
    status: str = "error"  # pass | mismatch | error
    max_error: float | None = None  # largest max|tpu - cpu| / max|cpu| of a compared tensor
    detail: str = ""  # the worst tensor on a mismatch; phase and first line on an error
    generate: str = ""  # "" (not an LM) | same | differs ... | error ...
    fallbacks: dict[str, int] = field(default_factory=dict)
    first_s: float | None = None
    steady_s: float | None = None
    cpu_first_s: float | None = None
    cpu_steady_s: float | None = None
    trace: str = ""  # the tracebacks of errors, for the report's appendix

    @property
    def passed(self) -> bool:
        return self.status == "pass"


@dataclass
class Reference:
    """What the CPU computed: the tensors to match, the tokens, the times."""

    initial: torch.nn.Module
    built: Built
    compared: list[tuple[str, torch.Tensor]]
    tokens: torch.Tensor | None
    first_s: float
    steady_s: float


_references: dict[str, Reference] = {}


def reference(case: Case) -> Reference:
    """The CPU run of a case, computed once per process."""
    if case.name not in _references:
        torch.manual_seed(0)
        built = case.build()
        initial = copy.deepcopy(built.model)
        tokens = _generate(built.model, built) if case.generate else None
        compared, first, steady = _run(case, built.model, built, sync=lambda: None)
        _references[case.name] = Reference(initial, built, compared, tokens, first, steady)
    return _references[case.name]


def run_cell(case: Case, mode: str) -> Cell:
    cell = Cell(case.name, mode)
    phase = "cpu reference"
    try:
        ref = reference(case)
        cell.cpu_first_s, cell.cpu_steady_s = ref.first_s, ref.steady_s
        phase = "model.to('tpu')"
        torch_tpu.metrics.reset()
        eager = "strict" if mode == "compiled" else mode
        with torch.tpu.set_eager_mode(eager):
            model = copy.deepcopy(ref.initial).to("tpu")
            built = Built(model, _to_tpu(ref.built.args), _to_tpu(ref.built.kwargs))
            if mode == "compiled":
                phase = "torch.compile"
                torch._dynamo.reset()
                model.forward = torch.compile(model.forward, backend="tpu")
            if case.generate:
                try:
                    cell.generate = _compare_tokens(ref.tokens, _generate(model, built))
                except Exception as error:  # noqa: BLE001
                    cell.generate = f"error: {first_line(error)}"
                    cell.trace += traceback.format_exc()
            phase = "training step" if case.train else "forward"
            compared, cell.first_s, cell.steady_s = _run(
                case, model, built, sync=torch.tpu.synchronize
            )
            phase = "comparison with the CPU"
            expected = ref.compared
            if case.train:
                expected = [c for c in ref.compared if not c[0].endswith(AFTER_STEP)]
                expected += _adamw_oracle(ref.initial, compared)
            cell.max_error, worst = _compare(expected, compared)
        cell.status = "mismatch" if worst or cell.generate.startswith("differs") else "pass"
        cell.detail = worst
        if cell.generate.startswith("error"):
            cell.status = "error"
            cell.detail = cell.generate
    except Exception as error:  # noqa: BLE001 (every failure is a report entry)
        cell.status = "error"
        cell.detail = f"{phase}: {first_line(error)}"
        cell.trace += traceback.format_exc()
    finally:
        cell.fallbacks = dict(torch_tpu.metrics.snapshot()["fallback_ops"])
    return cell


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def _run(case: Case, model, built: Built, sync) -> tuple[list, float, float]:
    """One compared step, then the steady steps; returns (compared tensors, first s, steady s)."""
    if not case.train:
        with torch.no_grad():
            start = time.perf_counter()
            out = model(*built.args, **built.kwargs)
            sync()
            first = time.perf_counter() - start
            compared = [(f"output[{i}]", t) for i, t in enumerate(flat_tensors(out))]
            compared = [(name, t.detach().cpu()) for name, t in compared]
            start = time.perf_counter()
            for _ in range(STEADY_STEPS):
                model(*built.args, **built.kwargs)
            sync()
        return compared, first, (time.perf_counter() - start) / STEADY_STEPS

    params = dict(model.named_parameters())
    optimizer = torch.optim.AdamW(params.values(), lr=LR)

    def step():
        optimizer.zero_grad(set_to_none=True)
        out = model(*built.args, **built.kwargs)
        loss = loss_of(out)
        loss.backward()
        optimizer.step()
        return out, loss

    start = time.perf_counter()
    out, loss = step()
    sync()
    first = time.perf_counter() - start
    compared = [("loss", loss)]
    compared += [(f"output[{i}]", t) for i, t in enumerate(flat_tensors(out))]
    compared += [(f"grad {name}", p.grad) for name, p in params.items()]
    compared += [(f"{name}{AFTER_STEP}", p) for name, p in params.items()]
    compared = [(name, None if t is None else t.detach().cpu()) for name, t in compared]
    for _ in range(WARMUP_STEPS):  # the first steps with optimizer state: not steady yet
        step()
    sync()
    start = time.perf_counter()
    for _ in range(STEADY_STEPS):
        step()
    sync()
    return compared, first, (time.perf_counter() - start) / STEADY_STEPS


def _compare(expected: list, actual: list) -> tuple[float, str]:
    """(largest max|actual - expected| / max|expected|, the first mismatch described or "").

    A tensor matches when allclose(rtol=RTOL, atol=ATOL * max(1, max|expected|)) holds,
    with the same dtype and shape; NaN must be NaN on both sides.
    """
    worst_error, mismatch = 0.0, ""
    actual_by_name = dict(actual)
    missing = [name for name, _ in expected if name not in actual_by_name]
    extra = [name for name in actual_by_name if name not in dict(expected)]
    if missing or extra:
        mismatch = f"tensors only on cpu: {missing[:3]}, only on tpu: {extra[:3]}"
    for name, e in expected:
        if name not in actual_by_name:
            continue
        a, problem = actual_by_name[name], ""
        if (e is None) != (a is None):
            problem = f"{name}: {'missing' if a is None else 'unexpected'} on tpu"
        elif e is None:
            continue
        elif e.shape != a.shape or e.dtype != a.dtype:
            problem = f"{name}: {a.dtype}{list(a.shape)} on tpu, {e.dtype}{list(e.shape)} on cpu"
        elif e.numel():
            a, e = a.double(), e.double()
            finite = torch.isfinite(e)
            scale = e[finite].abs().max().item() if finite.any() else 0.0
            error = (a - e).abs()[finite].max().item() if finite.any() else 0.0
            worst_error = max(worst_error, error / max(scale, 1e-30))
            if not torch.allclose(a, e, rtol=RTOL, atol=ATOL * max(1.0, scale), equal_nan=True):
                problem = f"{name}: max |tpu - cpu| = {error:.3g} (max |cpu| = {scale:.3g})"
        if problem and not mismatch:
            mismatch = problem
    return worst_error, mismatch


def _adamw_oracle(initial: torch.nn.Module, compared: list) -> list:
    """The parameters after one CPU AdamW step taken with the tpu's gradients.

    This, not the CPU's own step, is the step's oracle: AdamW's first update is
    about lr * sign(grad), so float noise in a gradient near zero (already
    compared on its own) would otherwise show as a 2 * lr difference.
    """
    grads = {name.removeprefix("grad "): t for name, t in compared if name.startswith("grad ")}
    params = {name: p.detach().clone() for name, p in initial.named_parameters()}
    for name, p in params.items():
        p.grad = None if grads.get(name) is None else grads[name].clone()
    torch.optim.AdamW(params.values(), lr=LR).step()
    return [(f"{name}{AFTER_STEP}", p) for name, p in params.items()]


def _generate(model, built: Built) -> torch.Tensor:
    inputs = {k: v for k, v in built.kwargs.items() if k in ("input_ids", "attention_mask")}
    with torch.no_grad():
        tokens = model.generate(
            **inputs, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0
        )
    return tokens.cpu()


def _compare_tokens(expected: torch.Tensor, actual: torch.Tensor) -> str:
    if actual.shape == expected.shape and torch.equal(actual, expected):
        return "same"
    return f"differs: tpu {actual.tolist()}, cpu {expected.tolist()}"


def _to_tpu(value):
    if isinstance(value, torch.Tensor):
        return value.to("tpu")
    if isinstance(value, (list, tuple)):
        return type(value)(_to_tpu(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_tpu(v) for k, v in value.items()}
    return value
