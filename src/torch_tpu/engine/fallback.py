"""The CPU fallback: an op with no lowering and no decomposition copies its tpu
inputs to the host, runs PyTorch's CPU kernel, and copies results back.

Counted per op in torch_tpu.metrics and warned once per op; with
`torch.tpu.enable_cpu_fallback = False` it raises NotImplementedError naming
the op instead.
"""

from __future__ import annotations

import warnings

import torch

from .. import metrics

DEVICE_TYPE = "tpu"  # the renamed PrivateUse1 (engine.executor uses the same name)
enabled: bool = True
_warned: set[str] = set()


def _op_name(op) -> str:
    return f"{op._schema.name}.{op._overloadname}"


def reads_host(t: torch.Tensor, host_ok: bool = False, written: bool = False) -> bool:
    """Whether a tpu op may take CPU tensor t, as CUDA's take one: read when it is a
    scalar (0-dim) or host_ok (an index, copied over); never written (the op would write
    a copy, leaving t as it was). Any other tensor not on tpu is `device_mismatch`."""
    return t.is_cpu and not written and (host_ok or t.dim() == 0)


def device_mismatch(other: torch.device, device: object = f"{DEVICE_TYPE}:0") -> RuntimeError:
    """CUDA's error for a tensor on another device among a tpu op's tensors."""
    return RuntimeError(
        "Expected all tensors to be on the same device, but found at least two "
        f"devices, {device} and {other}!"
    )


_HOST_ARGS: dict = {}  # op -> per schema arg: (name, index list, written)


def device_error(op, args: tuple, kwargs: dict) -> RuntimeError | None:
    """The executor's device rule (`reads_host`) for an op with no lowering: for a call
    holding a tpu tensor and a tensor elsewhere (an out= on the CPU, a CPU matrix),
    CUDA's error, where the CPU kernel would have read that tensor or written into it."""
    per_arg = _HOST_ARGS.get(op)
    if per_arg is None:
        per_arg = _HOST_ARGS[op] = tuple(
            (a.name, str(a.type) == "List[Optional[Tensor]]", _is_written(a))
            for a in op._schema.arguments
        )
    device = other = None
    for i, (name, host_ok, written) in enumerate(per_arg):
        value = args[i] if i < len(args) else kwargs.get(name)
        for t in value if isinstance(value, (list, tuple)) else (value,):
            if not isinstance(t, torch.Tensor):
                continue
            if t.device.type == DEVICE_TYPE:
                device = device or t.device
            elif other is None and not reads_host(t, host_ok, written):
                other = t.device
    return device_mismatch(other, device) if device and other else None


def _is_written(arg) -> bool:
    return bool(arg.alias_info and arg.alias_info.is_write)


def _to_cpu(value):
    if isinstance(value, torch.Tensor) and value.device.type == DEVICE_TYPE:
        return value.cpu()
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    if isinstance(value, torch.device) and value.type == DEVICE_TYPE:
        return torch.device("cpu")
    return value


def _to_tpu(value):
    if isinstance(value, torch.Tensor) and value.device.type == "cpu":
        return value.to(DEVICE_TYPE)
    if isinstance(value, (list, tuple)):
        return type(value)(_to_tpu(v) for v in value)
    return value


_LARGEST_RETRIED = 1 << 18  # elements: beyond, an error is left as the decomposition's


def cpus_error(op, args: tuple, kwargs: dict) -> Exception | None:
    """CPU's error for this call, run on host copies (calls of at most `_LARGEST_RETRIED`
    elements), or None when CPU computes it: a PyTorch decomposition checks less than
    CPU's kernel and fails in its own words (grid_sampler_2d of a 5-D input: "too many
    values to unpack")."""
    mismatch = device_error(op, args, kwargs)  # (a decomposition's out= wrapper raised
    if mismatch is not None:  # "cross-device copies are not allowed": CUDA's words instead)
        return mismatch
    values = [v for a in (*args, *kwargs.values()) for v in (a if isinstance(a, list) else [a])]
    if sum(v.numel() for v in values if isinstance(v, torch.Tensor)) > _LARGEST_RETRIED:
        return None
    with warnings.catch_warnings(), torch.random.fork_rng(devices=[]):
        warnings.simplefilter("ignore")
        try:
            op(*_to_cpu(args), **{k: _to_cpu(v) for k, v in kwargs.items()})
        except Exception as e:
            return e
    return None


def run_on_cpu(op, args: tuple, kwargs: dict):
    """Run op's CPU kernel on host copies; write mutated arguments back."""
    name = _op_name(op)
    if not enabled:
        raise NotImplementedError(
            f"{name} has no tpu lowering and the CPU fallback is disabled "
            "(torch.tpu.enable_cpu_fallback = False)"
        )
    mismatch = device_error(op, args, kwargs)
    if mismatch is not None:
        raise mismatch
    if metrics.locate_fallbacks:
        from .debug import user_line

        metrics.record_fallback(name, user_line())
    else:
        metrics.record_fallback(name)
    if name not in _warned:
        _warned.add(name)
        warnings.warn(
            f"{name} has no tpu lowering: running it on the CPU (copies to host and back)",
            stacklevel=3,
        )
    cpu_args = _to_cpu(args)
    cpu_kwargs = {k: _to_cpu(v) for k, v in kwargs.items()}
    result = op(*cpu_args, **cpu_kwargs)
    _refuse_other_layouts(name, result)
    schema = op._schema
    written = {}
    for i, arg in enumerate(schema.arguments):
        if not _is_written(arg):
            continue
        if i < len(args):
            original, host = args[i], cpu_args[i]
        elif arg.name in kwargs:
            original, host = kwargs[arg.name], cpu_kwargs[arg.name]
        else:
            continue
        pairs = zip(original, host) if isinstance(original, (list, tuple)) else [(original, host)]
        for tpu_t, cpu_t in pairs:
            if isinstance(tpu_t, torch.Tensor) and tpu_t.device.type == DEVICE_TYPE:
                if tpu_t.shape != cpu_t.shape:
                    tpu_t.resize_(cpu_t.shape)
                    if tpu_t.stride() != cpu_t.stride():  # (CPU restrided its resized out)
                        tpu_t.as_strided_(cpu_t.shape, cpu_t.stride())
                tpu_t.copy_(cpu_t)
                written[id(cpu_t)] = tpu_t
    return _map_result(result, written)


def _refuse_other_layouts(name: str, result) -> None:
    """A sparse (or other non-strided) or quantized result cannot live on tpu: say so by
    the op's name (moving it back failed inside a constructor the user never called)."""
    for value in result if isinstance(result, (list, tuple)) else [result]:
        if isinstance(value, torch.Tensor) and value.layout != torch.strided:
            raise NotImplementedError(
                f"{name} returns a tensor of layout {value.layout}: tpu tensors are dense "
                "(torch.strided) only; keep this part of the program on the CPU"
            )
        if isinstance(value, torch.Tensor) and value.is_quantized:
            raise NotImplementedError(
                f"{name} returns a quantized tensor: quantized tensors are not supported "
                "on tpu; keep quantized work on the CPU"
            )


def _map_result(result, written):
    if isinstance(result, torch.Tensor):
        target = written.get(id(result))
        return target if target is not None else _to_tpu(result)
    if isinstance(result, (list, tuple)):
        return type(result)(_map_result(r, written) for r in result)
    return result
