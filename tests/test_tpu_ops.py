"""torch.tpu.ops: ragged_dot, optimization_barrier and attention in every mode, with gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import to_tpu
from test_jax_op import SWEEP, run_in_mode


def ragged_dot_reference(lhs, rhs, group_sizes):
    """PyTorch loop over groups (rows past the last group stay zero)."""
    out = lhs.new_zeros(lhs.shape[0], rhs.shape[2])
    start = 0
    for g, n in enumerate(group_sizes.tolist()):
        out[start : start + n] = lhs[start : start + n] @ rhs[g]
        start += n
    return out


# compiled runs in the full suite only (ragged_dot under compile: ~7 s on 2 shared cores)
FAST_EAGER = ["strict", "fused", pytest.param("compiled", marks=pytest.mark.slow)]


@pytest.mark.parametrize("mode", FAST_EAGER)
def test_ragged_dot_forward_and_gradients(mode):
    lhs, rhs = torch.randn(11, 4), torch.randn(3, 4, 5)
    group_sizes = torch.tensor([4, 0, 6])  # an empty group, and one row past the groups
    lc, rc = lhs.clone().requires_grad_(), rhs.clone().requires_grad_()
    expected = ragged_dot_reference(lc, rc, group_sizes)
    (expected * expected).sum().backward()
    lt, rt = to_tpu(lhs).requires_grad_(), to_tpu(rhs).requires_grad_()

    def f(a, b, g):
        out = torch.tpu.ops.ragged_dot(a, b, g)
        return out, (out * out).sum()

    out, loss = run_in_mode(mode, f, lt, rt, group_sizes.to("tpu"))
    torch.testing.assert_close(out.detach().cpu(), expected.detach(), rtol=1e-5, atol=1e-5)
    loss.backward()
    torch.testing.assert_close(lt.grad.cpu(), lc.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rt.grad.cpu(), rc.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # opcheck traces each op through AOTAutograd twice (~10-20 s per op)
@pytest.mark.parametrize("name", ["ragged_dot", "optimization_barrier", "attention"])
def test_opcheck(name):
    t = lambda *shape: torch.randn(*shape, device="tpu")  # noqa: E731
    args = {
        "ragged_dot": (t(6, 3), t(2, 3, 4), torch.tensor([2, 4], device="tpu")),
        "optimization_barrier": ([t(3), t(2, 2)],),
        "attention": (t(1, 2, 4, 8), t(1, 2, 4, 8), t(1, 2, 4, 8), t(4, 4)),
    }[name]
    torch.library.opcheck(getattr(torch.tpu.ops, name), args)


@pytest.mark.parametrize("mode", SWEEP)
def test_optimization_barrier_is_the_identity_with_gradients(mode):
    a, b = torch.randn(3), torch.randn(2, 2)
    at, bt = to_tpu(a).requires_grad_(), to_tpu(b).requires_grad_()

    def f(x, y):
        u, v = torch.tpu.ops.optimization_barrier([x * 2, y + 1])
        return u, v, (u * u).sum() + v.sum()

    u, v, loss = run_in_mode(mode, f, at, bt)
    torch.testing.assert_close(u.detach().cpu(), a * 2)
    torch.testing.assert_close(v.detach().cpu(), b + 1)
    loss.backward()
    torch.testing.assert_close(at.grad.cpu(), 8 * a)
    torch.testing.assert_close(bt.grad.cpu(), torch.ones(2, 2))


# every variant in strict mode; the mode sweep on the causal one (masks are mode-independent)
@pytest.mark.parametrize(
    "mode, variant",
    [("strict", v) for v in ("plain", "causal", "bool_mask", "float_mask")]
    + [pytest.param(m, "causal", marks=pytest.mark.slow) for m in ("fused", "compiled")],
)
def test_attention_matches_sdpa(mode, variant):
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 8)
    mask = None
    if variant == "bool_mask":
        mask = torch.rand(5, 5) > 0.3
        mask[:, 0] = True  # no fully masked row (SDPA gives NaN there)
    elif variant == "float_mask":
        mask = torch.randn(2, 1, 5, 5)
    causal = variant == "causal"
    qc, kc, vc = (x.clone().requires_grad_() for x in (q, k, v))
    expected = F.scaled_dot_product_attention(qc, kc, vc, attn_mask=mask, is_causal=causal)
    expected.sum().backward()
    qt, kt, vt = (to_tpu(x).requires_grad_() for x in (q, k, v))
    mt = None if mask is None else mask.to("tpu")

    def f(a, b, c, m):
        return torch.tpu.ops.attention(a, b, c, m, is_causal=causal)

    out = run_in_mode(mode, f, qt, kt, vt, mt)
    torch.testing.assert_close(out.detach().cpu(), expected.detach(), rtol=1e-5, atol=1e-5)
    out.sum().backward()
    for t, c in ((qt, qc), (kt, kc), (vt, vc)):
        torch.testing.assert_close(t.grad.cpu(), c.grad, rtol=1e-4, atol=1e-5)
