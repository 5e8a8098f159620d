"""torch.tpu.pallas.jax_op: JAX functions as custom ops, in every mode, with autograd."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings

import jax
import jax.numpy as jnp
import pytest
import torch
from conftest import to_tpu

import torch_tpu
from torch_tpu import jax_op

MODES = ["strict", "fused", "compiled"]
# the CI subset runs a behaviour's mode sweep once (test_forward_and_gradients_match_pytorch);
# elsewhere strict only, the other modes in the full suite
SWEEP = ["strict"] + [pytest.param(m, marks=pytest.mark.slow) for m in ("fused", "compiled")]


@jax_op("jaxop_test::scale_add")
def scale_add(x: jax.Array, y: jax.Array, alpha: float = 2.0) -> jax.Array:
    return x * alpha + jnp.sin(y)


def scale_add_ref(x, y, alpha=2.0):
    return x * alpha + torch.sin(y)


@jax_op("jaxop_test::split_stats")
def split_stats(x: jax.Array, axis: int) -> tuple[jax.Array, jax.Array]:
    return jnp.mean(x, axis=axis), jnp.max(x, axis=axis)


def run_in_mode(mode, fn, *args):
    """fn(*args) on tpu in one of the eager modes or compiled (fullgraph: no graph break)."""
    if mode == "compiled":
        torch._dynamo.reset()
        return torch.compile(fn, backend="tpu", fullgraph=True)(*args)
    with torch.tpu.set_eager_mode(mode):
        out = fn(*args)
        torch.tpu.synchronize()
        return out


@pytest.mark.parametrize("mode", ["debug", *MODES])
def test_forward_and_gradients_match_pytorch(mode):
    x, y = torch.randn(5, 3), torch.randn(5, 3)

    def f(a, b):
        return scale_add(a, b, 3.0) * 2

    expected = scale_add_ref(x, y, 3.0) * 2
    xt, yt = to_tpu(x).requires_grad_(), to_tpu(y).requires_grad_()
    out = run_in_mode(mode, f, xt, yt)
    torch.testing.assert_close(out.detach().cpu(), expected)
    out.sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), torch.full_like(x, 6.0))
    torch.testing.assert_close(yt.grad.cpu(), 2 * torch.cos(y))


@pytest.mark.parametrize("mode", SWEEP)
def test_tuple_returns_and_static_int(mode):
    x = torch.randn(4, 6)
    mean, mx = run_in_mode(mode, lambda a: split_stats(a, 1), to_tpu(x))
    torch.testing.assert_close(mean.cpu(), x.mean(1))
    torch.testing.assert_close(mx.cpu(), x.amax(1))


@jax_op("jaxop_test::pad_scale")
def pad_scale(
    x: jax.Array,
    bias: jax.Array | None = None,
    *,
    pads: tuple[int, ...] = (1, 1),
    scale: float | None = None,
) -> jax.Array:
    y = jnp.pad(x, [tuple(pads)] * x.ndim)
    if bias is not None:
        y = y + bias.sum()
    return y * (1.0 if scale is None else scale)


def pad_scale_ref(x, bias=None, *, pads=(1, 1), scale=None):
    y = torch.nn.functional.pad(x, (pads[0], pads[1]) * x.dim())
    if bias is not None:
        y = y + bias.sum()
    return y * (1.0 if scale is None else scale)


@pytest.mark.parametrize("mode", SWEEP)
def test_optional_tensor_and_keyword_only_static_tuple(mode):
    x, b = torch.randn(3, 3), torch.randn(2)
    xt, bt = to_tpu(x).requires_grad_(), to_tpu(b).requires_grad_()
    xc, bc = x.clone().requires_grad_(), b.clone().requires_grad_()
    for bias, bias_ref in ((None, None), (bt, bc)):
        out = run_in_mode(mode, lambda a, c: pad_scale(a, c, pads=(0, 2), scale=3.0), xt, bias)
        expected = pad_scale_ref(xc, bias_ref, pads=(0, 2), scale=3.0)
        torch.testing.assert_close(out.detach().cpu(), expected.detach())
        (out * out).sum().backward()
        (expected * expected).sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), xc.grad)
    torch.testing.assert_close(bt.grad.cpu(), bc.grad)


def test_static_arguments_are_part_of_the_cache_key():
    x, y = torch.randn(3), torch.randn(3)
    xt, yt = to_tpu(x), to_tpu(y)
    for alpha in (1.0, 2.5, 1.0):
        torch.testing.assert_close(scale_add(xt, yt, alpha).cpu(), scale_add_ref(x, y, alpha))
    torch_tpu.metrics.reset()
    scale_add(xt, yt, 2.5)
    assert torch_tpu.metrics.snapshot().get("compiles", 0) == 0


def test_cpu_tensors_run_the_same_function_on_the_host():
    x, y = torch.randn(4, 2, dtype=torch.float64), torch.randn(4, 2, dtype=torch.float64)
    out = scale_add(x, y)
    assert out.device.type == "cpu" and out.dtype == torch.float64
    torch.testing.assert_close(out, scale_add_ref(x, y))


@pytest.mark.parametrize("device", ["cpu", "tpu"])
def test_opcheck(device):
    x, y = torch.randn(3, 4, device=device), torch.randn(3, 4, device=device)
    torch.library.opcheck(scale_add, (x, y), {"alpha": 0.5})


@pytest.mark.slow  # opcheck traces through AOTAutograd twice per op (~10 s each, 2 shared cores)
def test_opcheck_tuple_returns_optional_tensor_and_keyword_statics():
    x, b = torch.randn(3, 4, device="tpu"), torch.randn(2, device="tpu")
    torch.library.opcheck(split_stats, (x, 0))
    torch.library.opcheck(pad_scale, (x, b), {"pads": (1, 2), "scale": 0.5})
    torch.library.opcheck(pad_scale, (x,))


@pytest.mark.slow  # float64 finite differences, ~15 s on 2 shared cores; CI checks vs PyTorch
def test_gradcheck_against_finite_differences():
    x = torch.randn(3, 2, dtype=torch.float64, device="tpu", requires_grad=True)
    y = torch.randn(3, 2, dtype=torch.float64, device="tpu", requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: scale_add(a, b, 1.5), (x, y))


@jax.custom_vjp
def clip_st(x):
    return jnp.clip(x, -1.0, 1.0)


def _clip_fwd(x):
    return clip_st(x), None


def _clip_bwd(_, g):
    return (g * 10.0,)  # a straight-through estimator, scaled: nothing JAX would derive


clip_st.defvjp(_clip_fwd, _clip_bwd)


@jax_op("jaxop_test::clip_st")
def clip_op(x: jax.Array) -> jax.Array:
    return clip_st(x)


@pytest.mark.parametrize("mode", SWEEP)
def test_custom_vjp_keeps_its_rule(mode):
    x = to_tpu(torch.linspace(-3, 3, 7)).requires_grad_()
    run_in_mode(mode, lambda a: clip_op(a) * 1.0, x).sum().backward()
    torch.testing.assert_close(x.grad.cpu(), torch.full((7,), 10.0))


def test_register_autograd_overrides_the_derived_rule():
    @jax_op("jaxop_test::square")
    def square(x: jax.Array) -> jax.Array:
        return x * x

    x = to_tpu(torch.tensor([1.0, 2.0])).requires_grad_()
    square(x).sum().backward()
    torch.testing.assert_close(x.grad.cpu(), torch.tensor([2.0, 4.0]))
    square.register_autograd(lambda ctx, g: g * 7.0)
    x.grad = None
    square(x).sum().backward()
    torch.testing.assert_close(x.grad.cpu(), torch.tensor([7.0, 7.0]))


def test_pallas_kernel_runs_interpreted_with_one_note(recwarn):
    from jax.experimental import pallas as pl

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0 + 1.0

    @jax_op("jaxop_test::pallas_affine")
    def affine(x: jax.Array) -> jax.Array:
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    from torch_tpu.interop import jax_op as module

    module._InterpretPallas.noted = False
    x = torch.randn(8, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.testing.assert_close(affine(to_tpu(x)).cpu(), x * 2 + 1)
        torch.testing.assert_close(affine(to_tpu(x) + 1).cpu(), (x + 1) * 2 + 1)
    notes = [w for w in caught if "interpret mode" in str(w.message)]
    assert len(notes) == 1


def test_donated_argument_is_unusable_afterwards():
    @jax_op("jaxop_test::donating", donate_argnums=(0,))
    def donating(buf: jax.Array, x: jax.Array) -> jax.Array:
        return buf + x

    buf, x = torch.ones(4, device="tpu"), torch.arange(4.0, device="tpu")
    view = buf[1:]
    out = donating(buf, x)
    torch.testing.assert_close(out.cpu(), torch.arange(4.0) + 1)
    for use in (lambda: buf.cpu(), lambda: buf + 1, lambda: view.sum().item()):
        with pytest.raises(RuntimeError, match="donated to jaxop_test::donating"):
            use()
    torch.testing.assert_close(x.cpu(), torch.arange(4.0))  # not donated: still usable


def test_bad_definitions_and_calls_raise_naming_the_op():
    with pytest.raises(TypeError, match="jaxop_test::bad.*'n' has no type annotation"):

        @jax_op("jaxop_test::bad")
        def bad(x: jax.Array, n) -> jax.Array:
            return x

    @jax_op("jaxop_test::wrong_count")
    def wrong_count(x: jax.Array) -> tuple[jax.Array, jax.Array]:
        return x

    with pytest.raises(RuntimeError, match="jaxop_test::wrong_count: returned ArrayImpl|"
                       "jaxop_test::wrong_count: returned .*declares 2 arrays"):
        wrong_count(torch.ones(2, device="tpu"))

    @jax_op("jaxop_test::not_jax")
    def not_jax(x: jax.Array) -> jax.Array:
        return "oops"

    with pytest.raises(RuntimeError, match="jaxop_test::not_jax.*not a valid JAX type"):
        not_jax(torch.ones(2, device="tpu"))

    leaked = []

    @jax_op("jaxop_test::leaky")
    def leaky(x: jax.Array) -> jax.Array:
        leaked.append(x)
        return x + 1

    with pytest.raises(RuntimeError, match="jaxop_test::leaky: the function leaks a tracer"):
        leaky(torch.ones(2, device="tpu"))

    with pytest.raises(RuntimeError, match="scale_add: argument 'y' is a cpu tensor"):
        scale_add(torch.ones(2, 2, device="tpu"), torch.ones(2, 2))


@pytest.mark.slow  # a fresh interpreter (~5-20 s); tests/test_startup.py guards the import in CI
def test_lazy_names_do_not_import_jax_at_import_torch():
    code = """
        import sys, torch, torch_tpu
        names = dir(torch.tpu)
        print("jax" in sys.modules, "pallas" in names and "ops" in names and "to_jax" in names)
        print(torch.tpu.pallas.jax_op is torch_tpu.jax_op, "jax" in sys.modules)
    """
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True", "True", "True"]
