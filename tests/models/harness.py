"""Run one zoo case in one mode on tpu against the CPU, and say how it went.

A cell (case x mode) is training steps with `torch.optim.AdamW` (defaults: what a
user gets) compared with the CPU's: the first step, and the fourth, after the first
steps with optimizer state (fused mode's segments settle only after them: the fourth
runs the programs a loop that reads its loss every step repeats). Each compared step is checked
against the CPU's step from the state the tpu's step started from (`_oracle_step`):
the loss, the outputs, every gradient, every parameter's update, the buffers and the
optimizer's state. Two more steps after it give the steady time (llama, fused: the third step
still ran one program the second had not; each new one is a compile or a disk-cache
load, which timing counted as steady time: 190 ms a step against 16 ms once
settled). Language models also `generate()` a few tokens greedily, which must be the
CPU's tokens. The CPU's own run is computed once per case (its times, its tokens, a
check that the case computes something); the tpu run starts from a deep copy of the
same initial model moved with `.to("tpu")`.

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
WARMUP_STEPS = 2  # untimed, between the first compared step and the second
# (1-based) the steps compared with the CPU: the first, and one after the first steps
# with optimizer state, once fused mode's segments have settled
COMPARED_STEPS = (1, WARMUP_STEPS + 2)
RTOL, ATOL = 1e-3, 1e-4
# Differences below NOISE times the largest value of the tensor's group (gradients,
# updates, outputs) are float noise: key-projection biases' gradients are zero in exact
# arithmetic and came out as 1e-13..1e-11, differently on CPU and tpu, in models whose
# largest gradient is 0.1-1.
NOISE = 1e-6
# Rounding of the parameter itself when the step adds its update: float32 `p - lr * u`
# can differ by a few ulps of |p| from the same update rounded differently.
UPDATE_ULPS = 4
AFTER_STEP = " after step"
UPDATE = " update"
LR = 1e-3


@dataclass
class Cell:
    case: str
    mode: str
    status: str = "error"  # pass | mismatch | error
    max_error: float | None = None  # largest max|tpu - cpu| / max|cpu| at a tensor's own scale
    tolerance_used: float | None = None  # largest |tpu - cpu| / allowed, of any element
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
class Taken:
    """One compared step: the state it started from and what it gave, as CPU copies."""

    model_before: dict  # the model's state_dict
    optimizer_before: dict | None  # the optimizer's state_dict (None: a forward only)
    tensors: list  # (name, tensor): loss, outputs, gradients, and after the step the
    # parameters, buffers and optimizer state


@dataclass
class Reference:
    """What the CPU computed: its first step, the tokens, the times."""

    initial: torch.nn.Module
    built: Built
    taken: Taken
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
        taken, first, steady = _run(case, built.model, built, sync=lambda: None)
        _check_not_degenerate(taken[0].tensors)
        _references[case.name] = Reference(initial, built, taken[0], tokens, first, steady)
    return _references[case.name]


class DegenerateCase(Exception):
    """The CPU's run of a case computes nothing a wrong tpu answer could differ from."""


def _check_not_degenerate(compared: list) -> None:
    """A case must exercise what it compares: a nonzero loss, a nonzero gradient for most
    parameters, and outputs that are not one repeated value. torchvision's ViT starts its
    classifier at zero (a zero loss, every gradient zero) and the random detection model's
    features vanished (every score the same): both cells passed comparing nothing."""
    by_name = dict(compared)
    loss = by_name.get("loss")
    if loss is not None and not (loss != 0 and loss.isfinite()).all():
        raise DegenerateCase(f"the CPU's loss is {loss.item()}")
    grads = [t for name, t in compared if name.startswith("grad ")]
    zero = sum(1 for g in grads if g is None or not g.any())
    if grads and zero > len(grads) / 2:
        raise DegenerateCase(f"{zero} of {len(grads)} gradients are zero or None on the CPU")
    for name, t in compared:
        if name.startswith("output") and t.is_floating_point() and t.numel() > 1:
            if (t == t.flatten()[0]).all():
                raise DegenerateCase(f"{name} is one repeated value on the CPU")


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
            taken, cell.first_s, cell.steady_s = _run(
                case, model, built, sync=torch.tpu.synchronize
            )
            phase = "comparison with the CPU"
            cell.max_error, cell.tolerance_used, worst, notes = 0.0, 0.0, "", []
            for number, one in zip(COMPARED_STEPS, taken):
                if case.train:
                    results, note = _compare_step(ref, one)
                    notes += [f"step {number}: {note}"] if note else []
                else:
                    results = _compare(ref.taken.tensors, one.tensors)
                cell.max_error = max(cell.max_error, results[0])
                cell.tolerance_used = max(cell.tolerance_used, results[1])
                if results[2] and not worst:
                    worst = f"{'step' if case.train else 'call'} {number}: {results[2]}"
        cell.status = "mismatch" if worst or cell.generate.startswith("differs") else "pass"
        cell.detail = worst or "; ".join(notes)
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
    """The compared steps among the steady ones; returns ([Taken per compared step],
    first step's seconds, steady step's seconds)."""
    if not case.train:
        with torch.no_grad():
            start = time.perf_counter()
            out = model(*built.args, **built.kwargs)
            sync()
            first = time.perf_counter() - start
            taken = [Taken({}, None, _cpu_copies(_results(out, None, {})))]
            # the same calls as a training case's steps: compiled mode runs a graph's
            # first calls eagerly and its executable from then on, which only the
            # fourth call's outputs compare (and only after them are the calls steady)
            for _ in range(WARMUP_STEPS):
                model(*built.args, **built.kwargs)
            out = model(*built.args, **built.kwargs)
            taken.append(Taken({}, None, _cpu_copies(_results(out, None, {}))))
            start = time.perf_counter()
            for _ in range(STEADY_STEPS):
                model(*built.args, **built.kwargs)
            sync()
        return taken, first, (time.perf_counter() - start) / STEADY_STEPS

    params = dict(model.named_parameters())
    optimizer = torch.optim.AdamW(params.values(), lr=LR)

    def step():
        optimizer.zero_grad(set_to_none=True)
        out = model(*built.args, **built.kwargs)
        loss = loss_of(out)
        loss.backward()
        optimizer.step()
        return out, loss

    def taken_step() -> tuple[Taken, float]:
        before = _snapshot(model, optimizer)
        start = time.perf_counter()
        out, loss = step()
        sync()
        seconds = time.perf_counter() - start
        tensors = _results(out, loss, params) + _after(model, optimizer)
        return Taken(*before, _cpu_copies(tensors)), seconds

    taken, first = taken_step()
    for _ in range(WARMUP_STEPS):  # the first steps with optimizer state: not steady yet
        step()
    settled, _ = taken_step()
    start = time.perf_counter()
    for _ in range(STEADY_STEPS):
        step()
    sync()
    return [taken, settled], first, (time.perf_counter() - start) / STEADY_STEPS


def _results(out, loss, params: dict) -> list:
    """What a step computed: the loss, every output, every gradient."""
    tensors = [] if loss is None else [("loss", loss)]
    tensors += [(f"output[{i}]", t) for i, t in enumerate(flat_tensors(out))]
    return tensors + [(f"grad {name}", p.grad) for name, p in params.items()]


def _after(model, optimizer) -> list:
    """The state a step leaves: parameters, buffers (BatchNorm's running statistics) and
    the optimizer's state, each under its parameter's name."""
    params = dict(model.named_parameters())
    tensors = [(f"{name}{AFTER_STEP}", p) for name, p in params.items()]
    tensors += [(f"buffer {name}", b) for name, b in model.named_buffers()]
    for name, p in params.items():
        for key, value in sorted(optimizer.state.get(p, {}).items()):
            if isinstance(value, torch.Tensor):
                tensors.append((f"state {key} of {name}", value))
    return tensors


def _cpu_copies(tensors: list) -> list:
    # (copies even of CPU tensors: the reference's parameters change in place)
    return [(name, None if t is None else t.detach().to("cpu", copy=True)) for name, t in tensors]


def _snapshot(model, optimizer) -> tuple[dict, dict]:
    """CPU copies of the model's and the optimizer's state_dicts."""
    state = optimizer.state_dict()
    copied = {
        index: {k: v.detach().to("cpu", copy=True) if isinstance(v, torch.Tensor) else v
                for k, v in entry.items()}
        for index, entry in state["state"].items()
    }  # fmt: skip
    return (
        {name: t.detach().to("cpu", copy=True) for name, t in model.state_dict().items()},
        {"state": copied, "param_groups": copy.deepcopy(state["param_groups"])},
    )


def _oracle_step(ref: Reference, taken: Taken) -> tuple[list, list, dict]:
    """(expected, actual, rounding) for a compared step: the CPU's step from the state
    the tpu's step started from.

    The CPU model gets the tpu's parameters, buffers and optimizer state from before
    the step, and computes the loss, outputs and gradients to match. Its AdamW step
    then takes the tpu's gradients: AdamW's update is about lr * sign(grad), so float
    noise in a gradient near zero (already compared on its own) would otherwise show
    as a 2 * lr difference. Starting each compared step from the tpu's state keeps
    later steps comparable (the two runs do not drift apart), so a step after the
    first, whose programs read the optimizer's state, is checked as the first is.
    """
    model, out, loss = _cpu_backward_from(ref, taken)
    params = dict(model.named_parameters())
    optimizer = torch.optim.AdamW(params.values(), lr=LR)
    optimizer.load_state_dict(taken.optimizer_before)
    expected = _results(out, loss, params)
    actual = dict(taken.tensors)
    for name, p in params.items():
        grad = actual.get(f"grad {name}")
        p.grad = None if grad is None else grad.clone()
    optimizer.step()
    expected = _cpu_copies(expected + _after(model, optimizer))
    before = taken.model_before
    return (
        _updates(before, expected),
        _updates(before, taken.tensors),
        _update_rounding({name: before[name] for name in params}),
    )


def _group(name: str) -> str:
    """Tensors that share a noise floor: a gradient's is the largest gradient's, an
    optimizer state's or a buffer's the largest of the same kind (exp_avg, running_mean;
    a BatchNorm after another normalises a batch whose mean is zero in exact arithmetic:
    mobilenet's running_mean of 1e-10 came out as 5e-10 on tpu)."""
    if name.startswith("grad "):
        return "gradients"
    if name.startswith("state "):
        return name.split(" of ", 1)[0]
    if name.startswith("buffer "):  # a kind: BatchNorm's running_mean, running_var
        return "buffer " + name.rsplit(".", 1)[-1]
    return "updates" if name.endswith(UPDATE) else "outputs"


def _compare(expected: list, actual: list, rounding: dict | None = None) -> tuple:
    """(largest max|actual - expected| / max|expected| of a tensor whose own scale sets its
    tolerance,
    largest |actual - expected| / allowed of any element, the first mismatch or "").

    A tensor matches when it has the expected dtype and shape, NaN where the CPU has NaN,
    and every element within `RTOL * |expected| + max(ATOL * max|expected|, NOISE *
    group's max|expected|) + rounding[name]`. The absolute part follows the tensor's own
    scale: a fixed 1e-4 let a whole gradient of scale 5e-5 (bert's LayerNorm biases) be
    zero and still match, and an update of 1e-3 vanish against a weight near 1.
    """
    rounding = rounding or {}
    worst_error, worst_used, mismatch = 0.0, 0.0, ""
    actual_by_name = dict(actual)
    missing = [name for name, _ in expected if name not in actual_by_name]
    extra = [name for name in actual_by_name if name not in dict(expected)]
    if missing or extra:
        mismatch = f"tensors only on cpu: {missing[:3]}, only on tpu: {extra[:3]}"
    scales = {name: _finite_max(e) for name, e in expected if e is not None and e.numel()}
    group_scale: dict[str, float] = {}
    for name, scale in scales.items():
        group_scale[_group(name)] = max(group_scale.get(_group(name), 0.0), scale)
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
            scale, floor = scales[name], NOISE * group_scale[_group(name)]
            atol = max(ATOL * scale, floor) + rounding.get(name, 0.0)
            finite = torch.isfinite(e)
            difference = (a - e).abs()[finite]
            error = difference.max().item() if finite.any() else 0.0
            if ATOL * scale >= floor:  # (a tensor compared at its own scale)
                worst_error = max(worst_error, error / max(scale, 1e-30))
            if finite.any():
                allowed = RTOL * e[finite].abs() + atol
                worst_used = max(worst_used, (difference / allowed.clamp_min(1e-300)).max().item())
            if not torch.allclose(a, e, rtol=RTOL, atol=atol, equal_nan=True):
                problem = (
                    f"{name}: max |tpu - cpu| = {error:.3g} (max |cpu| = {scale:.3g}, "
                    f"atol {atol:.3g})"
                )
        if problem and not mismatch:
            mismatch = problem
    return worst_error, worst_used, mismatch


def _finite_max(t: torch.Tensor) -> float:
    t = t.double()
    finite = torch.isfinite(t)
    return t[finite].abs().max().item() if finite.any() else 0.0


def _compare_step(ref: Reference, taken: Taken) -> tuple[tuple, str]:
    """`_compare`'s results for one training step, and a note when its gradients were
    judged by norm.

    ReLU's kink and max-pooling's ties make a gradient jump where rounding moves a
    value across them, and near such a point two float32 computations of one gradient
    can differ by far more than rounding: resnet18's fourth step (batch 2, BatchNorm in
    training mode) gave one BatchNorm channel's gradient 4% off on tpu and a different
    layer's 9.6% off on CPU, each against float64 from the same state, while in float64
    tpu and CPU agreed to 1e-13. So when a gradient mismatches, the CPU's own float32
    gradients are checked against float64: if they too miss the tolerance, float32
    cannot settle that step's gradients elementwise, and each is held to a relative
    norm error of GRAD_NORM_RTOL instead (everything else of the step still
    elementwise). If the CPU's float32 meets float64, the mismatch stands.
    """
    expected, actual, rounding = _oracle_step(ref, taken)
    results = _compare(expected, actual, rounding)
    if not results[2].startswith("grad "):
        return results, ""
    conditioning = _float32_gradients_missed(ref, taken, expected)
    if not conditioning:
        return results, ""
    other = [(name, t) for name, t in expected if not name.startswith("grad ")]
    rest = _compare(other, [(name, t) for name, t in actual if not name.startswith("grad ")],
                    rounding)  # fmt: skip
    worst_norm, problem = _compare_norms(expected, dict(actual))
    note = (
        f"gradients compared by norm (largest relative error {worst_norm:.1e}): the CPU's "
        f"float32 itself misses float64 here ({conditioning})"
    )
    return (rest[0], rest[1], rest[2] or problem), note


# A gradient judged by norm (`_compare_step`) matches when |tpu - cpu| <= this * |cpu|
# (resnet18's ill-conditioned fourth step: 1.2e-2 at most).
GRAD_NORM_RTOL = 5e-2


def _compare_norms(expected: list, actual: dict) -> tuple[float, str]:
    """(largest |a - e| / |e| of a gradient whose own norm sets its tolerance, the first
    gradient out of tolerance or "").

    A gradient matches when |a - e| <= GRAD_NORM_RTOL * |e| + NOISE * (largest gradient
    element) * sqrt(numel): the elementwise noise floor (`_compare`), as a norm. Without
    it, a gradient that is zero in exact arithmetic was compared noise to noise: the bias
    of a BatchNorm followed by a 1x1 convolution and another BatchNorm in training mode
    (shufflenet's; the second removes any constant shift) came out as 1e-9 noise on
    either side, 131% apart."""
    grads = [(name, e) for name, e in expected
             if name.startswith("grad ") and e is not None and e.numel()]  # fmt: skip
    largest = max((_finite_max(e) for _, e in grads), default=0.0)
    worst, problem = 0.0, ""
    for name, e in grads:
        a, e = actual[name].double(), e.double()
        difference, own = (a - e).norm().item(), GRAD_NORM_RTOL * e.norm().item()
        floor = NOISE * largest * e.numel() ** 0.5
        if own >= floor:
            worst = max(worst, difference / max(e.norm().item(), 1e-300))
        if difference > own + floor and not problem:
            error = difference / max(e.norm().item(), 1e-300)
            problem = f"{name}: |tpu - cpu| / |cpu| = {error:.3g} (gradients compared by norm)"
    return worst, problem


def _float32_gradients_missed(ref: Reference, taken: Taken, expected: list) -> str:
    """The first of the CPU's float32 gradients (`expected`) that misses the gradients
    the CPU computes in float64 from the same state, or ""."""
    model, _, _ = _cpu_backward_from(ref, taken, float64=True)
    exact = [(f"grad {name}", None if p.grad is None else p.grad.float())
             for name, p in model.named_parameters()]  # fmt: skip
    return _compare(exact, [(name, t) for name, t in expected if name.startswith("grad ")])[2]


def _cpu_backward_from(ref: Reference, taken: Taken, float64: bool = False) -> tuple:
    """(model, outputs, loss) of the CPU's forward and backward from the state the tpu's
    step started from; with float64, model and floating inputs in float64."""
    model = copy.deepcopy(ref.initial)
    args, kwargs = ref.built.args, ref.built.kwargs
    if float64:
        model = model.double()
        args, kwargs = _map_tensors((args, kwargs), _as_float64)
    model.load_state_dict(taken.model_before)
    out = model(*args, **kwargs)
    loss = loss_of(out)
    loss.backward()
    return model, out, loss


def _as_float64(t: torch.Tensor) -> torch.Tensor:
    return t.double() if t.is_floating_point() else t


def _updates(before: dict, tensors: list) -> list:
    """`tensors` with each parameter after the step replaced by its change over the
    step, `after - before`: compared instead of the parameter itself, whose size would
    hide a missing or wrong update. (The subtraction is exact where the step is small
    against the weight, and keeps the dtype, which `_compare` checks.)"""
    return [
        (name.removesuffix(AFTER_STEP) + UPDATE, t - before[name.removesuffix(AFTER_STEP)])
        if name.endswith(AFTER_STEP) else (name, t)
        for name, t in tensors
    ]  # fmt: skip


def _update_rounding(before: dict) -> dict[str, float]:
    """Per update, the rounding its parameter's own dtype allows: UPDATE_ULPS ulps of the
    largest |p| before the step."""
    return {
        name + UPDATE: UPDATE_ULPS * torch.finfo(p.dtype).eps * _finite_max(p)
        for name, p in before.items()
        if p.is_floating_point()
    }


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
    return _map_tensors(value, lambda t: t.to("tpu"))


def _map_tensors(value, fn):
    """value (tensors in nested lists, tuples and dicts) with fn applied to each tensor."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_map_tensors(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: _map_tensors(v, fn) for k, v in value.items()}
    return value
