"""The `_foreach_*` family: one op over lists of tensors, lowered as one program.

PyTorch's generic kernel for these ops (CompositeExplicitAutograd) calls the
per-tensor op once per tensor, so an optimizer step cost one dispatch per
parameter per op. Each overload here maps the per-tensor op's own lowering
over the lists instead: one executable for the whole list, the same
per-element type promotion (the engine casts every result to the dtype
PyTorch's meta kernel gives), and the in-place (`_foreach_add_`) and out=
overloads derived from it as for any op. Compiled graphs, where
functionalization turns `_foreach_add_` into `_foreach_add`, use the same
lowerings. Scalar lists (`Scalar[]`: an optimizer's bias corrections) are
run-time values, so a changing list does not recompile.

Not lowered, on purpose: `_foreach_copy_` (sources may live on the host; its
generic kernel runs one tpu `copy_` per tensor), the `.Tensor` overloads of
`_foreach_addcmul`/`_foreach_addcdiv` (PyTorch wants their packed scalars on
the CPU, read on the host; again one tpu op per tensor).
"""

from __future__ import annotations

import jax.numpy as jnp
import torch

from . import linalg, pointwise, reduction  # noqa: F401  (the per-tensor lowerings mapped here)
from .registry import LOWERINGS, canonical, lower

# How each foreach argument reaches the per-tensor op for tensor i:
#   "L" a tensor list (its i-th tensor), "S" a scalar list (its i-th scalar),
#   "=" the same value for every tensor (a Scalar, a 0-dim tensor, alpha).


def _element_args(args, roles: str, i: int) -> list:
    """The per-tensor op's arguments for the i-th tensor."""
    return [value[i] if role in "LS" else value for value, role in zip(args, roles)]


def _mapped(target: str, roles: str):
    """A foreach lowering applying `target`'s lowering to the i-th element of each list."""
    fn = LOWERINGS[canonical(target)].fn
    lead = roles.index("L")

    def lowering(*args):
        return [fn(*_element_args(args, roles, i)) for i in range(len(args[lead]))]

    lowering.__name__ = f"foreach_{target.split('.')[0]}"
    return lowering


def _mapped_check(target: str, roles: str):
    """`target`'s argument checks run on each tensor's arguments (None if it has none):
    CPU's foreach kernels call the per-tensor op, so they refuse what it refuses (a
    float alpha on integers, subtracting True), where tpu computed an answer."""
    check = LOWERINGS[canonical(target)].check
    if check is None:
        return None
    op_name, _, overload = canonical(target).partition(".")
    schema = getattr(getattr(torch.ops.aten, op_name), overload)._schema
    defaults = [a.default_value for a in schema.arguments]

    def foreach_check(values: list) -> bool:
        lists = [v for v, role in zip(values, roles) if role in "LS"]
        count = min(len(v) for v in lists)  # (unequal lists: the meta kernel's error)
        verdicts = [
            check(_element_args(values, roles, i) + defaults[len(roles) :]) for i in range(count)
        ]
        return any(bool(v) for v in verdicts)

    return foreach_check


def _lower_mapped(name: str, target: str, roles: str) -> None:
    lower(name, check=_mapped_check(target, roles))(_mapped(target, roles))


_UNARY = (
    "abs acos asin atan ceil cos cosh erf erfc exp expm1 floor frac lgamma log log10 "
    "log1p log2 neg reciprocal round rsqrt sigmoid sign sin sinh sqrt tan tanh trunc"
).split()
for _name in _UNARY:
    _lower_mapped(f"_foreach_{_name}.default", f"{_name}.default", "L")

# (foreach packet, per-tensor op for .List, for .Scalar/.ScalarList, for .Tensor)
_BINARY = (
    ("add", "add.Tensor", "add.Tensor", "add.Tensor"),
    ("sub", "sub.Tensor", "sub.Tensor", None),
    ("mul", "mul.Tensor", "mul.Tensor", "mul.Tensor"),
    ("div", "div.Tensor", "div.Tensor", "div.Tensor"),
    # PyTorch's generic kernels run maximum/minimum as clamp_min/clamp_max
    ("maximum", "clamp_min.Tensor", "clamp_min.default", None),
    ("minimum", "clamp_max.Tensor", "clamp_max.default", None),
    ("clamp_min", "clamp_min.Tensor", "clamp_min.default", None),
    ("clamp_max", "clamp_max.Tensor", "clamp_max.default", None),
    ("pow", "pow.Tensor_Tensor", "pow.Tensor_Scalar", None),
)
for _name, _list, _scalar, _tensor in _BINARY:
    alpha = "=" if _name in ("add", "sub") else ""  # add/sub's alpha on .List and .Tensor
    _lower_mapped(f"_foreach_{_name}.List", _list, "LL" + alpha)
    _lower_mapped(f"_foreach_{_name}.Scalar", _scalar, "L=")
    _lower_mapped(f"_foreach_{_name}.ScalarList", _scalar, "LS")
    if _tensor is not None:
        _lower_mapped(f"_foreach_{_name}.Tensor", _tensor, "L=" + alpha)

_lower_mapped("_foreach_pow.ScalarAndTensor", "pow.Scalar", "=L")
for _name in ("addcmul", "addcdiv"):
    _lower_mapped(f"_foreach_{_name}.Scalar", f"{_name}.default", "LLL=")
    _lower_mapped(f"_foreach_{_name}.ScalarList", f"{_name}.default", "LLLS")
_lower_mapped("_foreach_lerp.List", "lerp.Tensor", "LLL")
_lower_mapped("_foreach_lerp.Scalar", "lerp.Scalar", "LL=")
_lower_mapped("_foreach_lerp.ScalarList", "lerp.Scalar", "LLS")
_lower_mapped("_foreach_max.default", "max.default", "L")
_lower_mapped("_foreach_mm.default", "mm.default", "LL")


@lower("_foreach_zero.default")
def foreach_zero(self):
    return [jnp.zeros_like(t) for t in self]


@lower("_foreach_clone.default")
def foreach_clone(self, memory_format=None):
    """Values only: the engine lays each result out with the strides PyTorch's meta
    kernel gives for the memory format."""
    return list(self)
