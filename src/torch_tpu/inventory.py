"""What the registry covers: which ATen overloads run on XLA, and how."""

from __future__ import annotations

import torch

from .engine.kernels import KERNELS

_NATIVE = {"lowered", "derived", "decomposed", "metadata", "special"}


def native_ops() -> dict:
    """Counts of overloads with a tpu kernel that never leaves the device."""
    by = {k: sorted(n for n, c in KERNELS.items() if c == k) for k in _NATIVE}
    lowered = by["lowered"] + by["derived"] + by["special"]
    return {
        "lowered": len(lowered),
        "decomposed": len(by["decomposed"]),
        "metadata": len(by["metadata"]),
        "total": len(lowered) + len(by["decomposed"]) + len(by["metadata"]),
        "operators": len({n.split(".")[0] for n in KERNELS}),
    }


def status(overload: str) -> str:
    """How one aten overload ('add.Tensor') runs on tpu."""
    name = overload.removeprefix("aten::")
    if "." not in name:
        name += ".default"
    category = KERNELS.get(name)
    if category in ("lowered", "special"):
        return "lowered (runs on XLA)"
    if category == "derived":
        return "lowered (in-place/out= variant of a lowering; runs on XLA)"
    if category == "decomposed":
        return "decomposed (a PyTorch decomposition into ops that run on XLA)"
    if category == "metadata":
        return "view (PyTorch's own stride arithmetic; no computation)"
    packet, _, ovl = name.partition(".")
    full = f"aten::{packet}" + ("" if ovl == "default" else f".{ovl}")
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    if has(full, "CompositeImplicitAutograd"):
        return "composite (PyTorch decomposes it before it reaches the device)"
    explicit = ("CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional")
    if any(has(full, key) for key in explicit):
        return "composite (PyTorch's generic kernel runs it as other ops)"
    return "cpu fallback (no lowering: runs on the host)"


def overloads(op: str) -> list[str]:
    """'add' -> ['add.Tensor', 'add.Scalar', ...]; an overload name is returned as is."""
    name = op.removeprefix("aten::")
    if "." in name:
        return [name]
    packet = getattr(torch.ops.aten, name, None)
    if packet is None:
        raise ValueError(f"aten has no operator named {op!r}")
    return [f"{name}.{o}" for o in packet.overloads() if _in_dispatcher(name, o)]


def _in_dispatcher(packet: str, overload: str) -> bool:
    """TorchScript-only overloads (add.t on lists) have no dispatcher entry."""
    full = f"aten::{packet}" + ("" if overload == "default" else f".{overload}")
    try:
        torch._C._dispatch_has_kernel_for_dispatch_key(full, "CPU")
    except RuntimeError:
        return False
    return True


def table() -> list[tuple[str, str]]:
    """(overload, status) for every aten overload with a tpu kernel, then the backend
    ops (with CPU kernels) that would fall back."""
    rows = [(name, status(name)) for name in sorted(KERNELS)]
    for full in sorted(torch._C._dispatch_get_all_op_names()):
        if not full.startswith("aten::"):
            continue
        name = full.removeprefix("aten::")
        name = name if "." in name else f"{name}.default"
        if name in KERNELS or not torch._C._dispatch_has_kernel_for_dispatch_key(full, "CPU"):
            continue
        rows.append((name, status(name)))
    return rows
