"""Exchange with JAX: to_jax / from_jax (zero-copy where the layout allows), DLPack, aliasing."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch_tpu
from torch_tpu import from_jax, to_jax


def test_to_jax_of_a_whole_1d_storage_is_the_storage_array_itself():
    t = torch.arange(6.0, device="tpu") * 2
    a = to_jax(t)
    assert isinstance(a, jax.Array) and a.shape == (6,) and a.dtype == jnp.float32
    assert a is torch_tpu.tensor.storage_of(t).array()  # no copy
    np.testing.assert_array_equal(np.asarray(a), (torch.arange(6.0) * 2).numpy())


@pytest.mark.parametrize("make", [
    lambda t: t,                      # whole, 2-D: a reshape
    lambda t: t.t(),                  # transposed view
    lambda t: t[1:, ::2],             # strided slice
    lambda t: t.to(torch.bfloat16),   # another dtype
])
def test_to_jax_values_match_the_tensor(make):
    base = torch.randn(4, 6)
    t = make(base.to("tpu"))
    expected = make(base)
    a = to_jax(t)
    assert a.shape == tuple(expected.shape)
    np.testing.assert_array_equal(np.asarray(a.astype(jnp.float32)), expected.float().numpy())


def test_to_jax_runs_pending_fused_work():
    with torch.tpu.set_eager_mode("fused"):
        t = torch.ones(5, device="tpu") + 4
        a = to_jax(t)
        np.testing.assert_array_equal(np.asarray(a), np.full(5, 5.0, np.float32))


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_exported_array_keeps_its_value_after_a_torch_inplace_op(mode):
    # arrays are immutable: an in-place op gives the storage a new array; the one handed
    # out is referenced by the caller and must never be donated
    with torch.tpu.set_eager_mode(mode):
        t = torch.arange(4.0, device="tpu") + 0
        a = to_jax(t)
        t.add_(1)
        t.mul_(3)
        torch.tpu.synchronize()
        np.testing.assert_array_equal(np.asarray(a), np.arange(4.0, dtype=np.float32))
        torch.testing.assert_close(t.cpu(), (torch.arange(4.0) + 1) * 3)


def test_from_jax_wraps_without_copy_and_torch_writes_do_not_reach_jax():
    a = jnp.arange(5, dtype=jnp.int32) * 3
    t = from_jax(a)
    assert t.device.type == "tpu" and t.dtype == torch.int32 and t.shape == (5,)
    assert torch_tpu.tensor.storage_of(t).array() is a  # the same array: no copy
    t.add_(1)
    np.testing.assert_array_equal(np.asarray(a), np.arange(5) * 3)
    torch.testing.assert_close(t.cpu(), torch.arange(5, dtype=torch.int32) * 3 + 1)
    m = jnp.ones((2, 3), jnp.bfloat16)
    tm = from_jax(m)
    assert tm.shape == (2, 3) and tm.dtype == torch.bfloat16
    torch.testing.assert_close(tm.cpu(), torch.ones(2, 3, dtype=torch.bfloat16))


def test_round_trip_through_a_jitted_jax_function():
    x = torch.randn(3, 4)
    out = from_jax(jax.jit(lambda v: jnp.tanh(v) @ v.T)(to_jax(x.to("tpu"))))
    torch.testing.assert_close(out.cpu(), torch.tanh(x) @ x.T, rtol=1e-5, atol=1e-5)


def test_dlpack_export_is_a_private_copy_and_import_works():
    t = torch.arange(6.0, device="tpu").reshape(2, 3)
    n = np.from_dlpack(t)
    np.testing.assert_array_equal(n, np.arange(6.0, dtype=np.float32).reshape(2, 3))
    j = jax.dlpack.from_dlpack(t)
    np.testing.assert_array_equal(np.asarray(j), n)
    host = torch.from_dlpack(t)  # a consumer that writes: must not reach the tpu tensor
    host.fill_(-1)
    torch.testing.assert_close(t.cpu(), torch.arange(6.0).reshape(2, 3))
    with pytest.raises(BufferError, match="to_jax"):
        t.__dlpack__(copy=False)
    with pytest.raises(BufferError, match="require gradient"):
        t.clone().requires_grad_().__dlpack__()
    # JAX -> torch through DLPack: PyTorch's own path (a host tensor on XLA:CPU)
    back = torch.from_dlpack(jnp.arange(3.0, dtype=jnp.float32))
    torch.testing.assert_close(back, torch.arange(3.0))
    # CPU tensors keep PyTorch's own export
    np.testing.assert_array_equal(np.from_dlpack(torch.arange(3)), np.arange(3))


def test_bad_arguments():
    with pytest.raises(RuntimeError, match="to_jax expects a tpu tensor"):
        to_jax(torch.ones(2))
    with pytest.raises(TypeError, match="from_jax expects a jax.Array"):
        from_jax(np.ones(2))
