"""Lowerings by op family; importing this package fills the registry."""

from . import amp, factory, indexing, linalg, nn, pointwise, random, reduction, shape  # noqa: F401
