"""CompositeImplicitAutograd ops lowered whole, from the lowerings of their parts.

PyTorch gives a backend such an op's decomposition, so in strict mode each of its
parts is a program of its own, and a new shape compiles every one: `isclose` is
eleven small ops, and it is what every `allclose`, `assert_close` and test
`assertEqual` calls. Only ops no gradient flows through qualify (their results are
bool), so the backend kernel cannot bypass autograd. Each lowering calls the
registry's lowerings of the ops PyTorch's decomposition calls, in its order, so the
values are those of the parts run one by one. PyTorch's argument checks still run:
the executor's meta call runs PyTorch's meta function.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch

from .. import dtypes
from .pointwise import convert
from .registry import LOWERINGS, lower

# (kernels.py registers these although PyTorch decomposes them: their results are bool)
GRADLESS = ("isclose.default",)


def _part(name: str):
    return LOWERINGS[name].fn


@lower("isclose.default")
def isclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    """As ATen's isclose (TensorCompare.cpp): |self - other| <= atol + |rtol * other|,
    or equal, or both NaN where asked; integer and bool operands compare in the default dtype."""
    close = _part("eq.Tensor")(self, other)
    floating = jnp.issubdtype(self.dtype, jnp.inexact)
    if equal_nan and floating:
        isnan = _part("isnan.default")
        close = close | (isnan(self) & isnan(other))
    if rtol == 0 and atol == 0:  # (the bare equality, as ATen short-circuits)
        return close
    if not floating:  # (so that a uint8 difference cannot wrap around)
        default = dtypes.to_jax(torch.get_default_dtype())
        self, other = convert(self, default), convert(other, default)
    abs_ = _part("abs.default")
    allowed = _part("add.Scalar")(abs_(_part("mul.Scalar")(other, rtol)), atol)
    actual = abs_(_part("sub.Tensor")(self, other))
    finite = jnp.isfinite(actual) if jnp.issubdtype(actual.dtype, jnp.inexact) else True
    return close | (finite & _part("le.Tensor")(actual, allowed))
