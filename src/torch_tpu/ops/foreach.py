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

from . import linalg, pointwise, reduction  # noqa: F401  (the per-tensor lowerings mapped here)
from .registry import LOWERINGS, canonical, lower

# How each foreach argument reaches the per-tensor op for tensor i:
#   "L" a tensor list (its i-th tensor), "S" a scalar list (its i-th scalar),
#   "=" the same value for every tensor (a Scalar, a 0-dim tensor, alpha).


def _mapped(target: str, roles: str):
    """A foreach lowering applying `target`'s lowering to the i-th element of each list."""
    fn = LOWERINGS[canonical(target)].fn
    lead = roles.index("L")

    def lowering(*args):
        def pick(value, role, i):
            return value[i] if role in "LS" else value

        return [
            fn(*(pick(value, role, i) for value, role in zip(args, roles)))
            for i in range(len(args[lead]))
        ]

    lowering.__name__ = f"foreach_{target.split('.')[0]}"
    return lowering


_UNARY = (
    "abs acos asin atan ceil cos cosh erf erfc exp expm1 floor frac lgamma log log10 "
    "log1p log2 neg reciprocal round rsqrt sigmoid sign sin sinh sqrt tan tanh trunc"
).split()
for _name in _UNARY:
    lower(f"_foreach_{_name}.default")(_mapped(f"{_name}.default", "L"))

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
    lower(f"_foreach_{_name}.List")(_mapped(_list, "LL" + alpha))
    lower(f"_foreach_{_name}.Scalar")(_mapped(_scalar, "L="))
    lower(f"_foreach_{_name}.ScalarList")(_mapped(_scalar, "LS"))
    if _tensor is not None:
        lower(f"_foreach_{_name}.Tensor")(_mapped(_tensor, "L=" + alpha))

lower("_foreach_pow.ScalarAndTensor")(_mapped("pow.Scalar", "=L"))
for _name in ("addcmul", "addcdiv"):
    lower(f"_foreach_{_name}.Scalar")(_mapped(f"{_name}.default", "LLL="))
    lower(f"_foreach_{_name}.ScalarList")(_mapped(f"{_name}.default", "LLLS"))
lower("_foreach_lerp.List")(_mapped("lerp.Tensor", "LLL"))
lower("_foreach_lerp.Scalar")(_mapped("lerp.Scalar", "LL="))
lower("_foreach_lerp.ScalarList")(_mapped("lerp.Scalar", "LLS"))
lower("_foreach_max.default")(_mapped("max.default", "L"))
lower("_foreach_mm.default")(_mapped("mm.default", "LL"))


@lower("_foreach_zero.default")
def foreach_zero(self):
    return [jnp.zeros_like(t) for t in self]


@lower("_foreach_clone.default")
def foreach_clone(self, memory_format=None):
    """Values only: the engine lays each result out with the strides PyTorch's meta
    kernel gives for the memory format."""
    return list(self)
