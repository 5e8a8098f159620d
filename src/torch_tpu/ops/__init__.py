"""Lowerings by op family; importing this package fills the registry."""

from . import factory, indexing, linalg, nn, pointwise, random, reduction, shape  # noqa: F401
