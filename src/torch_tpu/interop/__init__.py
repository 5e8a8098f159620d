"""JAX interop: jax_op custom ops, zero-copy exchange, torch.tpu.ops (imports JAX: load lazily)."""
