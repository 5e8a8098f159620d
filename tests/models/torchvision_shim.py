"""Make torchvision importable when its compiled ops cannot load (see docs/models.md).

The only torchvision on the package registry built for torch 2.13.0 (0.28.0)
is a CUDA build: its `_C.so` needs `libc10_cuda.so`, absent from the CPU
torch used here, so it never loads. torchvision then has no `torchvision::nms`
schema, and its own `_meta_registrations` (run by `import torchvision`, and so
by `import timm` and by transformers' image models) fails registering a fake
kernel for it.

`install()`, called before the first `import torchvision`, does nothing if the
compiled ops load. Otherwise it defines the two schemas torchvision registers
fake kernels for unconditionally (`nms`, `qnms`) and gives `nms` a CPU kernel
in plain PyTorch with the C++ kernel's semantics (boxes sorted by score,
stable; a box is dropped when its IoU with a kept box exceeds the threshold).
On a tpu tensor it runs like any op without a tpu lowering: through the CPU
fallback, counted in `torch_tpu.metrics` as `torchvision::nms`, exactly as the
real C++ op (CPU and CUDA kernels only) would. `roi_align` (the detection
models' pooler) is defined too, as a composite of torchvision's own
pure-PyTorch `_roi_align`, so it runs on any device as ordinary ops, with
autograd: torchvision calls the compiled op on devices it does not know (tpu).
The other compiled ops (`roi_pool`, ...) stay unavailable.
"""

from __future__ import annotations

import importlib.util
import pathlib

import torch

_library: torch.library.Library | None = None


def install() -> str:
    """Prepare for `import torchvision`; returns which way was taken ("native" or "shim")."""
    global _library
    if _library is not None or _compiled_ops_load():
        return "shim" if _library is not None else "native"
    _library = torch.library.Library("torchvision", "DEF")
    _library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _library.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _library.impl("nms", _nms_cpu, "CPU")
    _library.define(
        "roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
        "SymInt pooled_width, int sampling_ratio, bool aligned) -> Tensor"
    )
    _library.impl("roi_align", _roi_align, "CompositeImplicitAutograd")
    import torchvision.extension

    # torchvision's Python wrappers check this before calling a compiled op; nms now has one.
    torchvision.extension._has_ops = lambda: True
    return "shim"


def _compiled_ops_load() -> bool:
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        return False
    for path in pathlib.Path(spec.origin).parent.glob("_C*.so"):
        try:
            torch.ops.load_library(str(path))
            return True
        except OSError:
            return False
    return False


def _roi_align(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned):
    import inspect

    module = importlib.import_module("torchvision.ops.roi_align")

    # the plain function: torchvision wraps it in torch.compile, which cannot run
    # inside a kernel (and would compile for CPU's Inductor on tpu tensors)
    pure_pytorch = inspect.unwrap(module._roi_align)
    return pure_pytorch(
        input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned
    )


def _nms_cpu(dets: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Greedy non-maximum suppression; indices of kept boxes by decreasing score."""
    if dets.numel() == 0:
        return torch.empty(0, dtype=torch.long)
    order = scores.sort(stable=True, descending=True).indices
    boxes = dets[order]
    x1, y1, x2, y2 = boxes.unbind(1)
    areas = (x2 - x1) * (y2 - y1)
    suppressed = torch.zeros(len(order), dtype=torch.bool)
    keep = []
    for i in range(len(order)):
        if suppressed[i]:
            continue
        keep.append(i)
        rest = slice(i + 1, None)
        width = (torch.minimum(x2[i], x2[rest]) - torch.maximum(x1[i], x1[rest])).clamp(min=0)
        height = (torch.minimum(y2[i], y2[rest]) - torch.maximum(y1[i], y1[rest])).clamp(min=0)
        inter = width * height
        iou = inter / (areas[i] + areas[rest] - inter)
        suppressed[rest] |= iou > iou_threshold
    return order[torch.tensor(keep, dtype=torch.long)]
