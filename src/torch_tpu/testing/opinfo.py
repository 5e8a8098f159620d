"""Run PyTorch's OpInfo database on tpu and compare every sample with CPU.

Used by the CI subset (tests/test_opinfo.py) and by the full sweep that
writes the coverage report (`python -m torch_tpu opinfo-report`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch

from .. import metrics

# Samples compared per (entry, dtype): the CI subset and the full sweep use the same
# number, so the known-failures list means the same thing to both.
SAMPLES_PER_CELL = 6
FORWARD_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool)
# Dtypes whose refusal by CPU tpu must match (`refusals`)
REFUSED_DTYPES = (torch.bool, torch.uint8, torch.int32, torch.int64, torch.complex64)
# Ops whose values are random or uninitialised: only shape and dtype can be compared.
_UNCOMPARABLE = (
    "rand",
    "bernoulli",
    "normal",
    "dropout",
    "multinomial",
    "uniform",
    "exponential",
    "cauchy",
    "geometric",
    "log_normal",
    "empty",
)


def op_db() -> list:
    from torch.testing._internal.common_methods_invocations import op_db as db

    return db


def entry_name(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


@dataclass
class Outcome:
    """One (entry, dtype, forward|grad) run."""

    status: str  # passed | failed | fallback | error | skipped
    message: str = ""
    samples: int = 0
    skipped_samples: int = 0
    fallback_ops: dict = field(default_factory=dict)


def _map(value, fn):
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_map(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: _map(v, fn) for k, v in value.items()}
    return value


def _to_tpu(t: torch.Tensor) -> torch.Tensor:
    out = t.detach().to("tpu")
    return out.requires_grad_(t.requires_grad)


# Entries whose tensor arguments PyTorch's kernel takes from the host on every device
# (tensor_split's indices: ATen raises for a device tensor, CUDA's too); the samples
# build them on the CPU for any device, so only the input moves.
_HOST_ARGUMENTS = ("tensor_split",)


def _moved(op, sample) -> tuple:
    """The sample's tensors as tpu tensors, where PyTorch's tests would put them."""
    if op.name in _HOST_ARGUMENTS:
        return _to_tpu(sample.input), sample.args, sample.kwargs
    return _map((sample.input, sample.args, sample.kwargs), _to_tpu)


def _to_cpu(value):
    return _map(value, lambda t: t.detach().cpu())


def _compare(actual, expected, shape_only: bool) -> None:
    actual = _to_cpu(actual)
    if shape_only:
        a = [x for x in _leaves(actual) if isinstance(x, torch.Tensor)]
        e = [x for x in _leaves(expected) if isinstance(x, torch.Tensor)]
        assert [(x.shape, x.dtype) for x in a] == [(x.shape, x.dtype) for x in e], "shape/dtype"
        return
    torch.testing.assert_close(actual, expected, equal_nan=True)


def _leaves(value):
    if isinstance(value, (list, tuple)):
        for v in value:
            yield from _leaves(v)
    else:
        yield value


def _samples(op, dtype, requires_grad: bool, limit: int | None):
    torch.manual_seed(0)
    for i, sample in enumerate(op.sample_inputs("cpu", dtype, requires_grad=requires_grad)):
        if limit is not None and i >= limit:
            return
        yield sample


def _grad_inputs(sample) -> list[torch.Tensor]:
    found = []
    _map((sample.input, sample.args, sample.kwargs), lambda t: found.append(t) or t)
    return [t for t in found if t.requires_grad]


def _differentiable(outputs) -> list[torch.Tensor]:
    return [
        o
        for o in _leaves(outputs)
        if isinstance(o, torch.Tensor) and o.requires_grad and o.dtype.is_floating_point
    ]


def run(op, dtype: torch.dtype, grad: bool = False, limit: int | None = None) -> Outcome:
    """Run every sample of one OpInfo entry on CPU and tpu and compare."""
    shape_only = any(word in op.name for word in _UNCOMPARABLE)
    outcome = Outcome("passed")
    metrics.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            samples = list(_samples(op, dtype, grad, limit))
        except Exception as e:  # the CPU side cannot even build samples for this dtype
            return Outcome("skipped", f"sample_inputs raised {type(e).__name__}: {e}")
        for sample in samples:
            try:
                expected = op(sample.input, *sample.args, **sample.kwargs)
                process = sample.output_process_fn_grad
                cpu_grads = _grads(process(expected), _grad_inputs(sample)) if grad else None
            except Exception as e:  # CPU itself rejects this sample: so must tpu
                outcome.skipped_samples += 1
                if not grad and not _tpu_refuses(op, sample, dtype, e, outcome):
                    break
                continue
            if grad and not cpu_grads:
                outcome.skipped_samples += 1
                continue
            # dropout inside an op (attention's dropout_p) makes its values random too
            random_sample = shape_only or sample.kwargs.get("dropout_p", 0) > 0
            moved = _moved(op, sample)
            outcome.samples += 1
            try:
                actual = op(moved[0], *moved[1], **moved[2])
                if grad:
                    tpu_grads = _grads(process(actual), _grad_inputs_of(moved))
                    _compare(tpu_grads, cpu_grads, random_sample)
                else:
                    # As PyTorch's own tests do: outputs defined only up to a convention
                    # (eigenvector signs, ...) are normalised by the sample first.
                    _compare(process(actual), process(expected), random_sample)
            except AssertionError as e:
                outcome.status, outcome.message = "failed", _first_line(e)
                break
            except Exception as e:
                outcome.status = "error"
                outcome.message = f"{type(e).__name__}: {_first_line(e)}"
                break
    outcome.fallback_ops = dict(metrics.snapshot()["fallback_ops"])
    if outcome.status == "passed" and outcome.fallback_ops:
        outcome.status = "fallback"
    if outcome.status == "passed" and outcome.samples == 0:
        outcome.status, outcome.message = "skipped", "every sample raised on CPU"
    return outcome


def refusals(op, limit: int | None = None) -> Outcome:
    """The dtypes CPU refuses (REFUSED_DTYPES outside the entry's CPU dtypes): every
    sample CPU rejects, tpu must reject too."""
    outcome = Outcome("passed")
    supported = op.supported_dtypes("cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for dtype in (d for d in REFUSED_DTYPES if d not in supported):
            try:
                samples = list(_samples(op, dtype, False, limit))
            except Exception:
                continue  # no samples of this dtype: nothing to refuse
            for sample in samples:
                try:
                    op(sample.input, *sample.args, **sample.kwargs)
                except Exception as e:
                    if not _tpu_refuses(op, sample, dtype, e, outcome):
                        return outcome
    if outcome.samples == 0:
        outcome.status, outcome.message = "skipped", "CPU refuses no sample"
    return outcome


VARIANTS = ("noncontiguous", "out", "out_strided", "inplace", "inplace_strided")


def variant(op, kind: str, dtype: torch.dtype = torch.float32, limit: int | None = None) -> Outcome:
    """One way of calling the entry's samples on tpu that `run` does not take, against
    CPU: "noncontiguous" (every input a strided view of a buffer twice its size, on
    both devices), "out" and "out_strided" (the out= form into a fresh contiguous or
    strided tpu tensor), "inplace" and "inplace_strided" (the in-place form on a
    contiguous or strided copy of the input, on both devices). For the out= forms the
    oracle is CPU's plain call: CPU's own out= into a strided tensor returns garbage for
    some ops (gelu, avg_pool3d, narrow_copy in torch 2.13). A form CPU refuses, tpu
    must refuse too."""
    outcome = Outcome("passed")
    if any(word in op.name for word in _UNCOMPARABLE):
        return Outcome("skipped", "random values")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            samples = list(_samples(op, dtype, False, limit))
        except Exception as e:
            return Outcome("skipped", f"sample_inputs raised {type(e).__name__}: {e}")
        for sample in samples:
            if sample.kwargs.get("dropout_p", 0) > 0 or "device" in sample.kwargs:
                continue  # (random values; a factory told to make a CPU tensor)
            call = _variant_call(op, kind, sample)
            if call is None:
                continue
            try:
                expected = call(sample.input, sample.args, sample.kwargs, "cpu")
            except Exception as e:
                if not _variant_refused(call, op, sample, e, outcome):
                    break
                continue
            outcome.samples += 1
            moved = _moved(op, sample)
            try:
                _compare(call(*moved, "tpu"), expected, False)
            except AssertionError as e:
                outcome.status, outcome.message = "failed", _first_line(e)
                break
            except Exception as e:
                outcome.status, outcome.message = "error", f"{type(e).__name__}: {_first_line(e)}"
                break
    if outcome.status == "passed" and outcome.samples == 0:
        outcome.status, outcome.message = "skipped", f"no sample has a {kind} form"
    return outcome


def _strided(t: torch.Tensor) -> torch.Tensor:
    """t's values in a strided view (every other element of a buffer twice its size)."""
    from torch.testing._internal.common_utils import noncontiguous_like

    return noncontiguous_like(t) if t.numel() > 1 else t


def _variant_call(op, kind: str, sample):
    """call(input, args, kwargs, device) -> what to compare, for this kind of variant;
    None when the sample has no such form."""
    plain = sample.output_process_fn_grad
    if kind == "noncontiguous":

        def call(x, args, kwargs, device):  # (strided on both: as_strided reads storage)
            x, args, kwargs = _map((x, args, kwargs), _strided)
            return plain(op(x, *args, **kwargs))

        return call
    if kind.startswith("out"):
        if not op.supports_out:
            return None
        try:  # (the out= tensor is made like CPU's result)
            expected = op(sample.input, *sample.args, **sample.kwargs)
        except Exception:
            return None  # (CPU refuses the plain call: `run` and `refusals` judge that)
        if not isinstance(expected, torch.Tensor):
            return None
        strided = kind == "out_strided"

        def call(x, args, kwargs, device):
            if device == "cpu":
                return op(x, *args, **kwargs)
            out = torch.empty_like(expected, device="tpu", memory_format=torch.contiguous_format)
            out = _strided(out) if strided else out
            returned = op(x, *args, out=out, **kwargs)
            assert returned is out, "the out= form returned another tensor than out"
            return out

        return call
    inplace = op.inplace_variant
    if inplace is None or not isinstance(sample.input, torch.Tensor):
        return None
    strided = kind == "inplace_strided"

    def call(x, args, kwargs, device):  # (strided on both: resize_ keeps the storage)
        target = _strided(x.clone()) if strided else x.clone()
        returned = inplace(target, *args, **kwargs)
        assert returned is target, "the in-place form returned another tensor than its input"
        return target

    return call


def _variant_refused(call, op, sample, cpu_error: Exception, outcome) -> bool:
    """A form CPU refused (an in-place result of another shape or dtype, a strided input
    a kernel requires contiguous): `_refused_on_tpu` with the form's call."""
    return _refused_on_tpu(
        lambda moved: call(*moved, "tpu"), _moved(op, sample), cpu_error, outcome, ""
    )


def _tpu_refuses(op, sample, dtype: torch.dtype, cpu_error: Exception, outcome) -> bool:
    """A sample CPU rejected (`_refused_on_tpu`). Half-float kernels CPU lacks are not
    refusals (tpu computes what CUDA does: engine/refusals.py)."""
    if dtype in (torch.float16, torch.bfloat16) and isinstance(cpu_error, NotImplementedError):
        return True
    return _refused_on_tpu(
        lambda moved: op(moved[0], *moved[1], **moved[2]),
        _moved(op, sample),
        cpu_error,
        outcome,
        f"{dtype}: ",
    )


def _refused_on_tpu(run, moved: tuple, cpu_error: Exception, outcome, label: str) -> bool:
    """Run on tpu (the sample `moved` there) what CPU refused: False (and the outcome
    failed) if tpu returns a result."""
    outcome.samples += 1
    try:
        _to_cpu(run(moved))
    except Exception:
        return True
    outcome.status = "failed"
    outcome.message = (
        f"{label}CPU raised {type(cpu_error).__name__}: {_first_line(cpu_error)}; "
        "tpu returned a result"
    )
    return False


def _grad_inputs_of(moved) -> list[torch.Tensor]:
    found = []
    _map(moved, lambda t: found.append(t) or t)
    return [t for t in found if t.requires_grad]


def _grads(outputs, inputs: list[torch.Tensor]):
    outs = _differentiable(outputs)
    if not outs or not inputs:
        return None
    grads = torch.autograd.grad(
        outs, inputs, grad_outputs=[torch.ones_like(o) for o in outs], allow_unused=True
    )
    return [g for g in grads if g is not None]


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return " ".join(text[:3])[:300] if text else type(e).__name__
