"""PyTorch's OpInfo samples called the ways tests/test_opinfo.py does not call them, on
tpu against CPU (`torch_tpu.testing.opinfo.variant`): on strided inputs, into out=
tensors (contiguous and strided) and in place (on contiguous and strided inputs). These
are the paths where a write lands in a view or a result in a caller's tensor, where a
wrong stride or a resize gives a wrong answer without an error. The first full runs
found floor_divide_ and addr_ resizing their input to the result's shape and, in fused
mode, a compilation-cache key collision (all fixed). CI runs the entries of
test_opinfo's subset in strict mode; `-m slow` runs every entry in strict and fused mode.
"""

import pytest
import torch
from test_opinfo import CI_ENTRIES

from torch_tpu.testing import opinfo

# Cells that fail, with the reason; a listed cell that passes fails the test (the list
# only shrinks).
KNOWN_FAILURES = {
    "addbmm|inplace": "CPU resizes a (1,) input to the (5, 10) result (its in-place form "
    "writes through addbmm.out, which resizes); tpu raises the broadcast error every other "
    "in-place op raises",
    "addbmm|inplace_strided": "as addbmm|inplace",
    "matrix_exp|noncontiguous": "float32 rounding, as opinfo_known_failures' matrix_exp|float32 "
    "(XLA's Pade approximant against CPU's Taylor polynomial)",
    "native_group_norm|noncontiguous": "CPU's internal kernel refuses a strided input; tpu "
    "computes it (F.group_norm passes a contiguous one to both)",
    "native_batch_norm|noncontiguous": "the saved statistics' shape in eval mode, as "
    "opinfo_known_failures' native_batch_norm|float32",
    "_native_batch_norm_legit|noncontiguous": "as native_batch_norm|noncontiguous",
    "nn.functional.fractional_max_pool3d|noncontiguous": "its samples draw the windows with "
    "torch.rand on each device (random values)",
    "nn.functional.rrelu|noncontiguous": "random slopes in training mode",
    "nn.functional.multi_head_attention_forward|noncontiguous": "dropout in training mode "
    "(random values)",
    "tensor_split|noncontiguous": "the sample's index tensor is moved to tpu, and "
    "tensor_split takes CPU indices only (PyTorch's own check)",
    "chalf|noncontiguous": "complex32 is not a tpu dtype (docs/differences.md)",
    "to_sparse|noncontiguous": "sparse layouts are not tpu layouts",
    "sparse.sampled_addmm|noncontiguous": "sparse layouts are not tpu layouts",
    "sparse.sampled_addmm|out": "sparse layouts are not tpu layouts",
    "sparse.sampled_addmm|out_strided": "sparse layouts are not tpu layouts",
    "fft.hfft2|noncontiguous": "2 of 360 float32 elements apart, as the plain call "
    "(opinfo_known_failures' fft.hfft2|float32)",
    "fft.hfft2|out": "as fft.hfft2|noncontiguous",
    "fft.hfft2|out_strided": "as fft.hfft2|noncontiguous",
    "fft.ihfft2|out": "PyTorch's out= form of a one-sided inverse FFT leaves part of out "
    "unwritten (CPU shows uninitialised memory there); tpu runs the same composite",
    "fft.ihfft2|out_strided": "as fft.ihfft2|out",
    "fft.ihfftn|out": "as fft.ihfft2|out",
    "fft.ihfftn|out_strided": "as fft.ihfft2|out",
}


def _cells():
    for op in opinfo.op_db():
        if torch.float32 not in op.supported_dtypes("cpu"):
            continue
        name = opinfo.entry_name(op)
        for mode in ("strict", "fused"):
            # (fused mode: the slow run; its in-place forms found the cache-key collision
            # tests/test_cache.py now guards)
            in_ci = name in CI_ENTRIES and mode == "strict"
            marks = () if in_ci else (pytest.mark.slow,)
            for kind in opinfo.VARIANTS:
                yield pytest.param(op, kind, mode, id=f"{mode}-{name}|{kind}", marks=marks)


@pytest.mark.parametrize(("op", "kind", "eager_mode"), list(_cells()))
def test_variant_matches_cpu(op, kind, eager_mode):
    key = f"{opinfo.entry_name(op)}|{kind}"
    with torch.tpu.set_eager_mode(eager_mode):
        outcome = opinfo.variant(op, kind, limit=opinfo.SAMPLES_PER_CELL)
    if key in KNOWN_FAILURES:
        assert outcome.status in ("failed", "error"), (
            f"{key} now passes: remove it from KNOWN_FAILURES"
        )
        return
    if outcome.status == "skipped":
        pytest.skip(outcome.message)  # reason: the entry has no such form (no out=, ...)
    assert outcome.status == "passed", f"{key}: {outcome.status}: {outcome.message}"
