"""Lowerings by op family; importing this package fills the registry."""

from . import (  # noqa: F401
    factory,
    foreach,
    indexing,
    linalg,
    nn,
    optim,
    pointwise,
    random,
    reduction,
    shape,
)
