"""Lowerings by op family; importing this package fills the registry."""

from . import (  # noqa: F401
    amp,
    attention,
    composites,
    ctc,
    embedding_bag,
    factory,
    foreach,
    fractional_pool,
    grid_sample,
    indexing,
    linalg,
    nn,
    optim,
    pointwise,
    random,
    reduction,
    resize_aa,
    rnn,
    shape,
    weight_norm,
)
