"""CPU's dtype refusals, which PyTorch's meta kernels do not know.

A CPU kernel is written for a list of dtypes and refuses the rest (`"abs_cpu" not
implemented for 'Bool'`, `Sort does not support complex dtypes`, `clamp is not
supported for complex types`). The meta kernels that give tpu its shapes and
input checks accept every dtype, and XLA computes most of them, so tpu returned
results where CPU raises: a complex max, sort or clamp in an order CPU does not
define, the abs of a bool, the frac of an int. A program that runs on tpu and
then fails on CPU or CUDA is not a port, so tpu refuses them too. The same run
tells whether CPU refuses to write an out= or in-place target whose elements
share memory, with each other (an expanded tensor: most ops refuse, fill_ and
index_put_ do not) or with an input (`add(x[1:4], 1, out=x[0:3])`, `cat` into one
of its parts): the stand-ins of tensors sharing a storage share one too.

On the first call of a new executable key holding a bool, integer or complex
tensor (for calls no executable key remembers, ops run by a PyTorch
decomposition and ops with data-dependent shapes: of a new call signature), the op
runs once on CPU with stand-ins: zeros of the same dtypes, of the same shapes
where the call is small (`_SMALL` elements in and out), otherwise of one element
per dimension. Half floats become float32: CPU lacks half kernels CUDA has (avg_pool3d's,
the special functions'), and tpu computes those. If CPU refuses the stand-ins'
dtypes, tpu raises CPU's own error. Any other error from the stand-ins (their
sizes or values, not their dtypes) is not CPU's verdict on the real call and is
ignored; so a large call whose shrunk stand-ins CPU rejects for their sizes (a
convolution's kernel larger than one element) is not checked.
"""

from __future__ import annotations

import re
import warnings

import torch

from ..strided import storage_span
from . import arguments

_HALF = (torch.float16, torch.bfloat16)
# words of CPU's dtype refusals raised as RuntimeError (NotImplementedError is the
# dispatch lists' own: "... not implemented for 'Bool'")
_DTYPE_WORDS = re.compile(
    r"[Cc]omplex|[Bb]ool|[Ii]nteger|floating point|dtype|scalar_type|"
    r"'(Long|Int|Short|Char|Byte)'|can't be cast to the desired output type"
)  # (the last: an in-place result of another type, `int_tensor.ldexp_(e)`)
# and, judging an out= target of another dtype, its words for that (mode's, kthvalue's,
# median's); not in general: a stand-in run of a backward fed our forward's index dtypes
# says "expected scalar type Long but found Int" where CPU's own forward gave it Longs
_OUT_DTYPE_WORDS = re.compile(r"scalar type|same type")
# CPU's words for a write into memory another element or an input also uses
_OVERLAP_WORDS = re.compile(r"written-to tensor refers? to a single memory location")
_SMALL = 1 << 18  # elements, inputs and outputs together: stand-ins of the real shapes
# integer kernels CUDA has and CPU lacks, which tpu computes as it does CUDA's half kernels:
# transformers' mixture-of-experts layers count tokens per expert with an integer histc on
# every device but the CPU (their stand-ins' integers become float32)
_CUDA_INTEGER_KERNELS = {"aten::histc"}
_LARGEST_ALIASED = 4 * _SMALL  # storage elements a shared stand-in may copy
_ACCEPTED: set = set()  # call signatures CPU accepted (`check_per_signature`)
_ACCEPTED_LIMIT = 4096


def check(
    op: torch._ops.OpOverload,
    args: list,
    kwargs: dict,
    meta_result=None,
    aliased: tuple = (),
    casts_target: bool = False,
) -> None:
    """Raise CPU's error if CPU's kernel refuses these dtypes; meta_result, the op's
    result on meta tensors where known, tells how large the call is. aliased: tensors
    whose memory matters (`written_memory_overlaps`): their stand-ins share storages as
    they do, and CPU's refusal to write such memory is raised too. casts_target: an
    out= target of another dtype than the result's, which some CPU kernels refuse
    (logcumsumexp's: "expected scalar_type Double but found Float")."""
    if op.namespace != "aten":
        return
    if not aliased and not casts_target and not _has_refusable_dtype((args, kwargs)):
        return
    real = bool(aliased) or _numel((args, kwargs)) + _numel(meta_result) <= _SMALL
    aliased_ids = {id(t) for t in aliased}
    buffers: dict = {}
    as_float = op._schema.name in _CUDA_INTEGER_KERNELS
    stand_in_args = _stand_in(args, real, aliased_ids, buffers, as_float)
    stand_in_kwargs = {
        k: _stand_in(v, real, aliased_ids, buffers, as_float) for k, v in kwargs.items()
    }
    with warnings.catch_warnings(), torch.random.fork_rng(devices=[]):
        warnings.simplefilter("ignore")
        try:
            op(*stand_in_args, **stand_in_kwargs)
        except Exception as e:  # (the stand-ins' sizes and values raise all kinds)
            if _is_refusal(e) or (casts_target and _OUT_DTYPE_WORDS.search(str(e))):
                raise type(e)(str(e)) from None


def written_memory_overlaps(targets: list, values) -> tuple:
    """The tensors to give `check` as aliased: targets (what the op writes) whose
    elements share memory (a stride 0 over more than one element), or whose memory
    meets another tensor's in values (the call's arguments); empty when none does, or
    when the shared storage is too large to stand in for (not checked then)."""
    by_storage: dict = {}
    for t in arguments.tensors(values):
        by_storage.setdefault(t.untyped_storage().data_ptr(), []).append(t)
    found = []
    for target in targets:
        if any(stride == 0 and size > 1 for size, stride in zip(target.shape, target.stride())):
            found.append(target)
        low, high = _span(target)
        sharing = by_storage.get(target.untyped_storage().data_ptr(), [])
        # (the target is among values once as itself; a second time, it is also an
        # input: `ind.index_add_(0, ind, src)`, which CPU refuses, `x.add_(x)` it allows)
        own = next((k for k, t in enumerate(sharing) if t is target), None)
        for k, other in enumerate(sharing):
            other_low, other_high = _span(other)
            if k != own and other_low <= high and low <= other_high:
                found.extend((target, other))
    if any(t.untyped_storage().nbytes() // t.element_size() > _LARGEST_ALIASED for t in found):
        return ()
    return tuple(found)


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The first and last storage element t reaches (empty tensors reach nothing)."""
    if t.numel() == 0:
        return (1, 0)
    offset = t.storage_offset()
    return (offset, storage_span(t.shape, t.stride(), offset) - 1)


def check_per_signature(op: torch._ops.OpOverload, args, kwargs: dict) -> None:
    """`check` for a call no executable key remembers (an op a decomposition runs, one
    with a data-dependent shape, which runs un-jitted at every call): the verdict is
    kept per call signature (only while CPU accepts: a refusal raises)."""
    mixed = _mixes_dtypes((args, kwargs))
    if not mixed and not _has_refusable_dtype((args, kwargs)):
        return
    key = (op, _signature(args), _signature(kwargs))
    if key in _ACCEPTED:
        return
    check(op, list(args), kwargs, casts_target=mixed)
    if len(_ACCEPTED) >= _ACCEPTED_LIMIT:
        _ACCEPTED.clear()
    _ACCEPTED.add(key)


def _signature(value):
    if isinstance(value, torch.Tensor):
        return (value.dtype, tuple(value.shape))
    if isinstance(value, (list, tuple)):
        return tuple(_signature(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _signature(v)) for k, v in value.items())
    return value if isinstance(value, (int, float, bool, str, type(None))) else repr(value)


def _has_refusable_dtype(value) -> bool:
    return any(not t.dtype.is_floating_point for t in arguments.tensors(value))


def _mixes_dtypes(value) -> bool:
    """Tensors of more than one dtype: for a decomposed call, perhaps an out= of another
    dtype than its input, which CPU's kernel may refuse where the decomposition's out=
    wrapper casts (`kthvalue(f32, out=(f64, i64))`)."""
    return len({t.dtype for t in arguments.tensors(value)}) > 1


def _numel(value) -> int:
    return sum(t.numel() for t in arguments.tensors(value))


def _stand_in(value, real_shape: bool, aliased: set = frozenset(), buffers=None,
              integers_as_float: bool = False):  # fmt: skip
    """Zeros for value's tensors; those in aliased are views, with their own sizes,
    strides and offsets, of one CPU buffer per storage and dtype (in buffers)."""

    def zeros(t: torch.Tensor) -> torch.Tensor:
        integer = not (t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool)
        dtype = torch.float32 if t.dtype in _HALF or (integers_as_float and integer) else t.dtype
        if id(t) in aliased:
            storage = t.untyped_storage()
            key = (storage.data_ptr(), dtype)
            if key not in buffers:
                count = storage.nbytes() // t.element_size()
                buffers[key] = torch.zeros(count, dtype=dtype, device="cpu")
            return buffers[key].as_strided(t.shape, t.stride(), t.storage_offset())
        shape = t.shape if real_shape else [min(n, 1) for n in t.shape]
        return torch.zeros(shape, dtype=dtype, device="cpu")

    return arguments.replace_tensors(value, zeros, "cpu")


def _is_refusal(error: Exception) -> bool:
    message = str(error)
    if "Could not run" in message:  # no CPU kernel at all (a CUDA-only op): not a refusal
        return False
    if isinstance(error, NotImplementedError):
        return True
    if not isinstance(error, RuntimeError):
        return False
    return bool(_DTYPE_WORDS.search(message) or _OVERLAP_WORDS.search(message))
