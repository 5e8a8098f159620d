"""Matrix products, decompositions, solvers, distances and FFTs against the CPU."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_same, assert_same_error, assert_same_grad

import torch_tpu

F32 = {"atol": 1e-4, "rtol": 1e-4}
# torch.cholesky and torch.triangular_solve are deprecated but still dispatch to backend ops.
pytestmark = pytest.mark.filterwarnings("ignore:.*(deprecated|will be removed):UserWarning")


@pytest.fixture
def no_fallback():
    torch_tpu.metrics.reset()
    yield
    assert not torch_tpu.metrics.snapshot()["fallback_ops"]


def _well_conditioned(*shape, dtype=torch.float64):
    n = shape[-1]
    return torch.randn(*shape, dtype=dtype) + n * torch.eye(n, dtype=dtype)


def _spd(*shape, dtype=torch.float64):
    a = torch.randn(*shape, dtype=dtype)
    return a @ a.mT + shape[-1] * torch.eye(shape[-1], dtype=dtype)


# ----------------------------------------------------------------- products


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.complex64])
def test_mm_bmm(dtype):
    a = torch.randn(5, 7).to(dtype) if dtype != torch.int64 else torch.randint(-9, 9, (5, 7))
    b = torch.randn(7, 3).to(dtype) if dtype != torch.int64 else torch.randint(-9, 9, (7, 3))
    assert_same(torch.mm, a, b, **F32)
    assert_same(torch.bmm, a.expand(2, 5, 7), b.expand(2, 7, 3), **F32)


def test_bfloat16_mm_accumulates_wide():
    a, b = torch.randn(16, 64).bfloat16(), torch.randn(64, 8).bfloat16()
    assert_same(torch.mm, a, b, atol=2e-2, rtol=2e-2)


def test_matrix_vector_products(no_fallback):
    m, v, w = torch.randn(4, 3), torch.randn(3), torch.randn(4)
    assert_same(torch.mv, m, v, **F32)
    assert_same(torch.dot, v, v, **F32)
    c = torch.randn(3, dtype=torch.complex64)
    assert_same(torch.vdot, c, c * 2j, **F32)
    assert_same(lambda s, a, x: torch.addmv(s, a, x, beta=0.5, alpha=2), w, m, v, **F32)


def test_addmm_family_beta_alpha(no_fallback):
    s, a, b = torch.randn(4, 5), torch.randn(4, 3), torch.randn(3, 5)
    assert_same(lambda s, a, b: torch.addmm(s, a, b, beta=0.5, alpha=-2), s, a, b, **F32)
    nan = torch.full((4, 5), float("nan"))
    assert_same(lambda s, a, b: torch.addmm(s, a, b, beta=0), nan, a, b, **F32)
    b1, b2 = torch.randn(2, 4, 3), torch.randn(2, 3, 5)
    assert_same(lambda s, x, y: torch.baddbmm(s, x, y, beta=2, alpha=0.5), s, b1, b2, **F32)
    assert_same(lambda s, x, y: torch.addbmm(s, x, y, beta=2, alpha=0.5), s, b1, b2, **F32)


def test_composites_matmul_linear_einsum():
    x, w, bias = torch.randn(2, 3, 4), torch.randn(5, 4), torch.randn(5)
    assert_same(lambda x, w: x @ w.t(), x, w, **F32)
    assert_same(torch.nn.functional.linear, x, w, bias, **F32)
    assert_same(lambda x, w: torch.einsum("bij,kj->bik", x, w), x, w, **F32)
    assert_same(torch.matmul, torch.randn(4), torch.randn(4, 2), **F32)


@pytest.mark.parametrize(
    "fn,shapes",
    [
        (torch.mm, [(4, 3), (3, 5)]),
        (torch.bmm, [(2, 4, 3), (2, 3, 5)]),
        (torch.mv, [(4, 3), (3,)]),
        (torch.dot, [(3,), (3,)]),
        (lambda s, a, b: torch.addmm(s, a, b, beta=0.5, alpha=2), [(5,), (4, 3), (3, 5)]),
        (lambda s, a, b: torch.baddbmm(s, a, b, alpha=2), [(4, 5), (2, 4, 3), (2, 3, 5)]),
        (lambda s, a, b: torch.addbmm(s, a, b, alpha=2), [(4, 5), (2, 4, 3), (2, 3, 5)]),
        (lambda s, a, b: torch.addmv(s, a, b, beta=2), [(4,), (4, 3), (3,)]),
        (lambda x, w: torch.nn.functional.linear(x, w), [(2, 3, 4), (5, 4)]),
    ],
)
def test_product_gradients(fn, shapes):
    assert_same_grad(fn, *[torch.randn(*s) for s in shapes], **F32)


def test_trace_and_cross():
    a = torch.randn(4, 4)
    assert_same(torch.trace, a, **F32)
    assert_same(torch.trace, torch.randint(0, 100, (3, 3), dtype=torch.int8))
    x, y = torch.randn(5, 3), torch.randn(5, 3)
    assert_same(torch.linalg.cross, x, y, **F32)
    assert_same(lambda x, y: torch.linalg.cross(x, y, dim=0), x.t(), y[:1].t(), **F32)
    assert_same_grad(torch.linalg.cross, x, y, **F32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_cross_rounds_each_product_as_cpu(dtype):
    """CPU rounds each product of a half-precision cross product to the half type before
    subtracting (in float32); XLA computed it all in float32 and rounded once, so a
    quarter of float16 results differed, by up to 8 units at a cancellation. Bit-equal
    now, overflow to inf included."""
    torch.manual_seed(0)
    x, y = (torch.randn(3000, 3) * 3).to(dtype), (torch.randn(3000, 3) * 3).to(dtype)
    assert torch.equal(torch.linalg.cross(x.to("tpu"), y.to("tpu")).cpu(), torch.linalg.cross(x, y))
    big = torch.tensor([[6e4, 2.0, 1.0]], dtype=dtype), torch.tensor([[1.0, 6e4, 3.0]], dtype=dtype)
    expected = torch.linalg.cross(*big)
    assert torch.equal(torch.linalg.cross(*(t.to("tpu") for t in big)).cpu(), expected)


def test_half_cross_keeps_float16_subnormal_products():
    """A float16 product below 6.1e-5 is a subnormal on CPU; reduce_precision alone
    flushed it to 0 (8967 of 9000 results differed at this scale)."""
    torch.manual_seed(0)
    x, y = (torch.randn(3000, 3) * 3e-3).half(), (torch.randn(3000, 3) * 3e-3).half()
    assert torch.equal(torch.linalg.cross(x.to("tpu"), y.to("tpu")).cpu(), torch.linalg.cross(x, y))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("beta", "alpha"), [(1, 1), (0.6, 0.2), (0, 0.3), (1e-9, 2)])
@pytest.mark.parametrize("scale", [3.0, 3e-3])
def test_half_addr_rounds_each_step_as_cpu(dtype, beta, alpha, scale, no_fallback):
    """CPU's kernel converts beta and alpha to the half type and rounds (alpha * vec1),
    then its product with vec2, beta * self and the sum; PyTorch's composite rounded
    vec1 * vec2 first and kept alpha in float32: 10 of 50 float16 elements of an OpInfo
    sample differed. Bit-equal now, float16 subnormals (the 3e-3 scale) included."""
    torch.manual_seed(0)
    s, v1, v2 = (torch.randn(*shape) * scale for shape in ((64, 96), (64,), (96,)))
    s[0, 0] = float("nan")  # (beta == 0, also after rounding 1e-9, must not leak it)
    args = [t.to(dtype) for t in (s, v1, v2)]
    expected = torch.addr(*args, beta=beta, alpha=alpha)
    actual = torch.addr(*(t.to("tpu") for t in args), beta=beta, alpha=alpha).cpu()
    assert torch.equal(actual.nan_to_num(), expected.nan_to_num())
    assert torch.equal(actual.isnan(), expected.isnan())


def test_addr_dtypes_and_broadcast_self(no_fallback):
    """bool is (beta and self) or (alpha and vec1 and vec2); integers truncate beta and
    alpha; mixed dtypes promote; a 0-d or row self broadcasts."""
    b1, b2 = torch.tensor([True, False, True]), torch.tensor([True, False])
    assert_same(lambda *t: torch.addr(*t, beta=False), torch.ones(3, 2, dtype=torch.bool), b1, b2)
    assert_same(torch.addr, torch.zeros(3, 2, dtype=torch.bool), b1, b2)
    i1, i2 = torch.randint(-9, 9, (3,)), torch.randint(-9, 9, (4,))
    assert_same(lambda *t: torch.addr(*t, beta=2, alpha=3), torch.randint(-9, 9, (3, 4)), i1, i2)
    b, h = torch.randn(3).bfloat16(), torch.randn(4).half()
    assert_same(lambda *t: torch.addr(*t, beta=0.5), torch.tensor(2.0), b, h)
    assert_same(torch.addr, torch.randn(4), i1.float(), torch.randn(4, dtype=torch.float64))


def test_kron_and_outer():
    a, b = torch.randn(2, 3), torch.randn(3, 2)
    assert_same(torch.kron, a, b)
    assert_same(torch.outer, torch.randn(3), torch.randn(4))


# ------------------------------------------------------------ decompositions


def test_inverse_and_solve(no_fallback):
    a = _well_conditioned(2, 4, 4)
    b = torch.randn(2, 4, 3, dtype=torch.float64)
    assert_same(torch.linalg.inv, a)
    assert_same(torch.linalg.solve, a, b)
    assert_same(torch.linalg.solve, a, b[..., 0])
    assert_same(lambda a, b: torch.linalg.solve(a, b, left=False), a, b.mT)
    assert_same(torch.linalg.solve, a[0], torch.randn(4, dtype=torch.float64))


def test_inverse_reports_singular():
    a = torch.zeros(3, 3, device="tpu")
    assert torch.linalg.inv_ex(a).info.item() > 0
    with pytest.raises(torch.linalg.LinAlgError):
        torch.linalg.inv(a)


_SINGULAR = torch.tensor([[1.0, 2.0], [2.0, 4.0]])


@pytest.mark.parametrize("a", [_SINGULAR, torch.stack([torch.eye(2), _SINGULAR])],
                         ids=["matrix", "batch"])  # fmt: skip
@pytest.mark.parametrize("call", [
    lambda a: torch.linalg.inv_ex(a, check_errors=True),
    lambda a: torch.linalg.lu_factor_ex(a, check_errors=True),
    lambda a: torch.linalg.solve_ex(a, torch.ones(*a.shape[:-1], 1, device=a.device),
                                    check_errors=True),
    lambda a: torch.linalg.inv_ex(a, check_errors=True, out=(
        torch.empty(0, device=a.device), torch.empty(0, dtype=torch.int32, device=a.device))),
], ids=["inv_ex", "lu_factor_ex", "solve_ex", "inv_ex_out"])  # fmt: skip
def test_ex_forms_with_check_errors_raise_as_cpu(call, a, eager_mode):
    """tpu returned `info` without raising: a program asking for the error went on with a
    singular matrix's inverse."""
    assert_same_error(lambda d: call(a.to(d)))


def test_cholesky_ex_with_check_errors_raises():
    """(Its message names XLA's failing minor, not always LAPACK's: docs/differences.md.)"""
    with pytest.raises(torch.linalg.LinAlgError, match="not positive-definite"):
        torch.linalg.cholesky_ex(_SINGULAR.to("tpu"), check_errors=True)
    assert torch.linalg.cholesky_ex(_SINGULAR.to("tpu")).info.item() > 0


@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.filterwarnings("ignore:torch.cholesky is deprecated")
def test_deprecated_cholesky_of_a_matrix_that_is_not_positive_definite_raises(upper, eager_mode):
    """torch.cholesky (deprecated, still in older code) returned NaNs on tpu where CPU
    raises; a positive-definite batch still factors as CPU's, strides included."""
    assert_same_error(lambda d: torch.cholesky(_SINGULAR.to(d), upper=upper))
    a = _well_conditioned(3, 3)
    batch = torch.stack([a @ a.mT, a.mT @ a])
    got, want = torch.cholesky(batch.to("tpu"), upper=upper), torch.cholesky(batch, upper=upper)
    torch.testing.assert_close(got.cpu(), want)
    assert got.stride() == want.stride()
    # the out= form too (it returned NaNs in `out` without an error)
    assert_same_error(
        lambda d: torch.cholesky(_SINGULAR.to(d), upper=upper, out=torch.empty(0, device=d))
    )
    for out_strides in ((3, 1), (1, 3)):
        outs = {d: torch.empty_strided((3, 3), out_strides, dtype=a.dtype, device=d)
                for d in ("cpu", "tpu")}  # fmt: skip
        for d, out in outs.items():
            assert torch.cholesky(batch[0].to(d), upper=upper, out=out) is out
        torch.testing.assert_close(outs["tpu"].cpu(), outs["cpu"])
        assert outs["tpu"].stride() == outs["cpu"].stride() == out_strides


@pytest.mark.parametrize("left", [True, False])
def test_solve_and_inverse_gradients(left):
    a = _well_conditioned(3, 3)
    b = torch.randn(3, 2, dtype=torch.float64)
    assert_same_grad(lambda a, b: torch.linalg.solve(a, b if left else b.mT, left=left), a, b)
    assert_same_grad(torch.linalg.inv, a)


def test_lu_family():
    a = _well_conditioned(2, 4, 4)
    assert_same(torch.linalg.lu_factor, a)
    assert_same(torch.linalg.lu, a)
    assert_same(torch.linalg.lu, torch.randn(5, 3, dtype=torch.float64))
    lu, piv = torch.linalg.lu_factor(a)
    assert_same(torch.lu_unpack, lu, piv)
    b = torch.randn(2, 4, 2, dtype=torch.float64)
    for left in (True, False):
        for adjoint in (True, False):
            rhs = b if left else b.mT

            def solve(lu, piv, rhs, left=left, adjoint=adjoint):
                return torch.linalg.lu_solve(lu, piv, rhs, left=left, adjoint=adjoint)

            assert_same(solve, lu, piv, rhs)


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_det_slogdet(dtype):
    a = _well_conditioned(2, 4, 4, dtype=dtype)
    assert_same(torch.linalg.det, a)
    assert_same(torch.linalg.slogdet, a)
    assert_same_grad(lambda a: torch.linalg.det(a).abs(), a)
    assert_same_grad(lambda a: torch.linalg.slogdet(a).logabsdet, a)
    singular = torch.ones(3, 3, dtype=dtype)
    assert_same(torch.linalg.det, singular)


def test_cholesky(no_fallback):
    s = _spd(2, 4, 4)
    assert_same(torch.linalg.cholesky, s)
    assert_same(lambda s: torch.linalg.cholesky(s, upper=True), s)
    assert_same_grad(torch.linalg.cholesky, s)
    assert torch.linalg.cholesky_ex(-s.to("tpu")).info.cpu().ne(0).all()
    l_factor = torch.linalg.cholesky(s)
    b = torch.randn(2, 4, 3, dtype=torch.float64)
    assert_same(torch.cholesky_solve, b, l_factor)
    assert_same(lambda b, u: torch.cholesky_solve(b, u, upper=True), b, l_factor.mT)
    assert_same(torch.cholesky_inverse, l_factor[0])
    assert_same(lambda s: torch.cholesky(s, upper=True), s[0])


def test_matrix_exp_and_householder():
    a = torch.randn(2, 3, 3, dtype=torch.float64)
    assert_same(torch.linalg.matrix_exp, a)
    reflectors, tau = torch.geqrf(torch.randn(4, 3, dtype=torch.float64))
    assert_same(torch.linalg.householder_product, reflectors, tau)


def test_triangular_solves():
    l_factor = torch.linalg.cholesky(_spd(2, 4, 4))
    b = torch.randn(2, 4, 3, dtype=torch.float64)
    assert_same(lambda a, b: torch.linalg.solve_triangular(a, b, upper=False), l_factor, b)
    assert_same(
        lambda a, b: torch.linalg.solve_triangular(a, b, upper=True, left=False),
        l_factor.mT,
        b.mT,
    )
    assert_same(
        lambda a, b: torch.linalg.solve_triangular(a, b, upper=False, unitriangular=True),
        l_factor,
        b,
    )
    assert_same(lambda b, a: torch.triangular_solve(b, a, upper=False), b, l_factor)
    assert_same(lambda b, a: torch.triangular_solve(b, a, transpose=True), b, l_factor.mT)
    assert_same_grad(lambda a, b: torch.linalg.solve_triangular(a, b, upper=False), l_factor, b)


def _check_qr(q, r, a):
    torch.testing.assert_close((q @ r).cpu(), a)


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 4)])
def test_qr(shape):
    a = torch.randn(*shape, dtype=torch.float64)
    assert_same(torch.linalg.qr, a)
    assert_same(lambda a: torch.linalg.qr(a, mode="complete"), a)
    assert_same(lambda a: torch.linalg.qr(a, mode="r"), a)
    assert_same_grad(lambda a: torch.linalg.qr(a), a)


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5)])
def test_svd(shape):
    a = torch.randn(*shape, dtype=torch.float64)
    u, s, vh = torch.linalg.svd(a.to("tpu"), full_matrices=False)
    torch.testing.assert_close((u * s[..., None, :] @ vh).cpu(), a)
    assert_same(torch.linalg.svdvals, a)
    u, s, vh = torch.linalg.svd(a.to("tpu"))
    assert u.shape[-1] == shape[-2] and vh.shape[-1] == shape[-1]
    assert_same_grad(torch.linalg.svdvals, a)


def test_eigh():
    s = _spd(2, 4, 4)
    values, vectors = torch.linalg.eigh(s.to("tpu"))
    torch.testing.assert_close(values.cpu(), torch.linalg.eigvalsh(s))
    torch.testing.assert_close((vectors * values[..., None, :] @ vectors.mT).cpu(), s)
    assert_same(lambda s: torch.linalg.eigvalsh(s, UPLO="U"), s)
    assert_same_grad(torch.linalg.eigvalsh, s)


@pytest.mark.parametrize("shape", [(6, 3), (2, 3, 3)])
def test_lstsq(shape):
    a = torch.randn(*shape, dtype=torch.float64)
    b = torch.randn(*shape[:-1], 2, dtype=torch.float64)
    assert_same(lambda a, b: torch.linalg.lstsq(a, b), a, b)
    assert_same(lambda a, b: torch.linalg.lstsq(a, b, driver="gelsd"), a, b)


# ------------------------------------------------------------ cdist and FFT


@pytest.mark.parametrize("p", [0.0, 0.5, 1.0, 2.0, 3.0, float("inf")])
def test_cdist(p, no_fallback):
    x1, x2 = torch.randn(2, 5, 3), torch.randn(2, 6, 3)
    x2[0, 0] = x1[0, 0]  # a zero distance: its gradient must be 0, not NaN
    assert_same(lambda a, b: torch.cdist(a, b, p=p), x1, x2, **F32)
    assert_same_grad(lambda a, b: torch.cdist(a, b, p=p), x1, x2, **F32)


def test_cdist_matrix_product_path():
    x1, x2 = torch.randn(30, 4), torch.randn(27, 4)
    assert_same(torch.cdist, x1, x2, **F32)
    assert_same_grad(torch.cdist, x1, x2, **F32)


@pytest.mark.parametrize("p", [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, float("inf")])
def test_pdist_and_its_gradient(p, no_fallback):
    """Row pairs in CPU's order, from differences (no matrix product at p = 2); a zero
    distance (two equal rows) has gradient 0, not NaN. It ran on the CPU before."""
    x = torch.randn(7, 4)
    x[3] = x[1]
    weights = torch.randn(21)  # (so each distance's gradient counts, not only their sum)
    assert_same(lambda t: torch.pdist(t, p), x, **F32)
    assert_same_grad(lambda t: torch.pdist(t, p) * weights.to(t.device), x, **F32)


@pytest.mark.parametrize("shape", [(1, 4), (0, 3), (5, 0)])
def test_pdist_of_fewer_than_two_rows_or_no_columns(shape, no_fallback):
    x = torch.randn(*shape)
    assert_same(torch.pdist, x)
    if shape[0] > 1:
        assert_same_grad(torch.pdist, x)


def test_pdist_refuses_as_cpu():
    assert_same_error(lambda d: torch.pdist(torch.randn(2, 3, 4, device=d)))
    assert_same_error(lambda d: torch.pdist(torch.randn(4, 3, device=d), -1.0))
    assert_same_error(lambda d: torch.pdist(torch.randint(0, 3, (4, 3), device=d)))


def test_fft_forward(no_fallback):
    x = torch.randn(4, 6)
    c = torch.randn(4, 6, dtype=torch.complex64)
    assert_same(torch.fft.rfft, x, **F32)
    assert_same(lambda x: torch.fft.rfftn(x, norm="ortho"), x, **F32)
    assert_same(lambda x: torch.fft.irfft(x, n=7, norm="forward"), c, **F32)
    assert_same(lambda x: torch.fft.irfft2(x, norm="ortho"), c, **F32)
    assert_same(lambda x: torch.fft.fft2(x, norm="forward"), c, **F32)
    assert_same(torch.fft.ifft, c, **F32)
    assert_same(torch.fft.fft, x, **F32)


def test_fft_gradients():
    x = torch.randn(8)
    assert_same_grad(lambda x: torch.fft.rfft(x).abs(), x, **F32)
    assert_same_grad(lambda x: torch.fft.irfft(x.to(torch.complex64)), x, **F32)
    assert_same_grad(lambda x: torch.fft.fft(x).real, x, **F32)


@pytest.mark.parametrize("fn", ["det", "slogdet"])
def test_det_gradient_follows_input_layout(fn):
    """PyTorch's det backward reads LU factors of A^T or of A depending on whether A
    is contiguous; both layouts must give CPU's gradient."""
    a = torch.randn(4, 4, dtype=torch.float64)
    op = torch.linalg.det if fn == "det" else (lambda m: torch.linalg.slogdet(m)[1])
    for view in (lambda m: m, lambda m: m.mT):
        assert_same_grad(lambda m, v=view: op(v(m)), a)


@pytest.mark.parametrize("shape", [(0, 0), (0, 0, 0), (2, 0, 0)])
def test_empty_matrices_inverse_and_cholesky(shape, no_fallback):
    a = torch.randn(shape)
    assert_same(torch.linalg.inv, a)
    assert_same(torch.linalg.inv_ex, a)
    assert_same(torch.linalg.cholesky_ex, a)
    assert_same(torch.linalg.cholesky, a.bfloat16())  # CPU has no bf16 kernel, nor needs one


@pytest.mark.parametrize(("beta", "alpha"), [(0.2, 0.6), (2, 3), (1.7, 2.5)])
def test_integer_products_truncate_scalars(beta, alpha, no_fallback):
    """Integer addmm-family results cast beta and alpha to integers first (0.6 -> 0)."""
    s, v = torch.randint(-9, 9, (5,)), torch.randint(-9, 9, (10,))
    m = torch.randint(-9, 9, (5, 10))
    b1, b2 = torch.randint(-9, 9, (2, 5, 3)), torch.randint(-9, 9, (2, 3, 4))
    bs = torch.randint(-9, 9, (2, 5, 4))
    assert_same(lambda *t: torch.addmv(*t, beta=beta, alpha=alpha), s, m, v)
    assert_same(lambda *t: torch.baddbmm(*t, beta=beta, alpha=alpha), bs, b1, b2)
    assert_same(lambda *t: torch.addbmm(*t, beta=beta, alpha=alpha), bs[0], b1, b2)


@pytest.mark.parametrize("fn", [torch.baddbmm, torch.addbmm])
def test_half_precision_batched_products_round_like_cpu(fn, no_fallback):
    """beta * self joins the float32 product before one rounding; addbmm rounds after
    each batch, as PyTorch's CPU loop of addmm_ does."""
    b1 = (torch.randn(5, 5, 5) * 5).bfloat16()
    b2 = (torch.randn(5, 5, 10) * 5).bfloat16()
    s = (torch.randn(5, 5, 10) * 5).bfloat16()
    s = s if fn is torch.baddbmm else s[0]
    assert_same(lambda *t: fn(*t, beta=0.7, alpha=1.3), s, b1, b2)
    assert_same(lambda *t: fn(*t), s, b1, b2)


@pytest.mark.parametrize("uplo", ["L", "U"])
def test_eigh_reads_the_requested_triangle(uplo, no_fallback):
    assert_same(lambda t: torch.linalg.eigvalsh(t, UPLO=uplo), torch.randn(2, 4, 4), **F32)


@pytest.mark.parametrize("uplo", ["L", "l", "U", "u"])
def test_eigh_reads_the_triangle_uplo_names_in_either_case(uplo, eager_mode):
    """CPU takes 'l' as 'L'; tpu read the upper triangle for anything but 'L' (a
    non-symmetric input shows which triangle was read; helper-42's test_linalg run)."""
    a = torch.randn(4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    expected = torch.linalg.eigvalsh(a, UPLO=uplo)
    torch.testing.assert_close(torch.linalg.eigvalsh(a.to("tpu"), UPLO=uplo).cpu(), expected)


def test_cdist_p0_gradient_has_the_broadcast_batch_shape(eager_mode):
    """p=0's gradient is zero; its lowering returned x1's own shape, not the batch shape
    x1 and x2 broadcast to, and failed the result-shape check (helper-44, test_ops)."""
    x1 = torch.randn(2, 1, 1, 2, dtype=torch.float64)
    x2 = torch.randn(1, 2, 2, dtype=torch.float64)
    grads = []
    for device in ("cpu", "tpu"):
        a, b = (x.detach().to(device).requires_grad_() for x in (x1, x2))
        torch.cdist(a, b, p=0).sum().backward()
        grads.append((a.grad.cpu(), b.grad.cpu()))
    for expected, actual in zip(*grads):
        assert torch.equal(actual, expected)


@pytest.mark.parametrize(("shape1", "shape2"), [((4, 5), (0, 3, 5)), ((0, 4, 5), (1, 3, 5))])
def test_cdist_gradient_of_an_empty_batch_has_the_input_shape(shape1, shape2, eager_mode):
    """With no distances (a batch dim broadcast to 0) PyTorch's gradient is zeros of each
    input's own shape; the lowering returned the broadcast shape and failed the result-shape
    check (PyTorch's cdist OpInfo samples)."""
    x1, x2 = torch.randn(shape1), torch.randn(shape2)
    assert_same_grad(torch.cdist, x1, x2)


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "left"),
    [
        ((4, 4), (2, 1, 3, 4, 2), True),  # A broadcast over B's batch
        ((1, 3, 1, 4, 4), (2, 1, 3, 4, 5), True),  # both broadcast
        ((5, 5), (2, 0, 5, 3), True),  # an empty batch
        ((4, 4), (2, 3, 5, 4), False),  # X A = B
        ((3, 4, 4), (4,), True),  # a vector right-hand side
    ],
)
def test_solve_broadcasts_a_against_b_as_on_cpu(a_shape, b_shape, left):
    """linalg.solve factors A itself (the LU, pivots and info it returns have A's batch
    shape) and broadcasts the factors against B: tpu factored A broadcast to B's batch and
    raised "lowering of _linalg_solve_ex produced shape (2, 1, 3, 4, 4), PyTorch expects
    (4, 4)". Found by PyTorch's test_linalg on tpu. Values and gradients as CPU's."""
    g = torch.Generator().manual_seed(0)
    A = torch.randn(a_shape, generator=g, dtype=torch.float64) + 4 * torch.eye(a_shape[-1])
    B = torch.randn(b_shape, generator=g, dtype=torch.float64)
    results = {}
    for device in ("cpu", "tpu"):
        a, b = (t.to(device).detach().clone().requires_grad_() for t in (A, B))
        x = torch.linalg.solve(a, b, left=left)
        x.sum().backward()
        results[device] = [x.detach().cpu(), a.grad.cpu(), b.grad.cpu()]
    for cpu, tpu in zip(results["cpu"], results["tpu"]):
        torch.testing.assert_close(tpu, cpu)


@pytest.mark.parametrize("driver", [None, "gels", "gelsy", "gelsd", "gelss"])
@pytest.mark.parametrize("batch", [(), (2,)])
def test_lstsq_of_a_vector_right_hand_side_matches_cpu(driver, batch):
    """b with one dim fewer than A is a vector: its solution has no column dim. tpu read
    it as a matrix's last row and returned a (3, 3) solution of other numbers, without
    an error (found by PyTorch's test_linalg on tpu)."""
    g = torch.Generator().manual_seed(0)
    A = torch.randn(*batch, 4, 3, generator=g, dtype=torch.float64)
    b = torch.randn(*batch, 4, generator=g, dtype=torch.float64)
    cpu = torch.linalg.lstsq(A, b, driver=driver)
    tpu = torch.linalg.lstsq(A.to("tpu"), b.to("tpu"), driver=driver)
    for name in ("solution", "residuals", "rank", "singular_values"):
        got, expected = getattr(tpu, name).cpu(), getattr(cpu, name)
        torch.testing.assert_close(got, expected, msg=name)


def test_lstsq_gels_solves_without_a_rank_cutoff_as_on_cpu():
    """gels is LAPACK's QR solve, which assumes full rank: it has no rcond. tpu solved
    every driver through the SVD with gelsy's cutoff, so a singular value of 1e-8 (below
    float32's 3 eps) was dropped: x[1] was 0 where CPU's is 1e8, and the residuals
    were missing."""
    A = torch.tensor([[1.0, 0.0], [0.0, 1e-8], [0.0, 0.0]])
    b = torch.ones(3, 1)
    assert_same(lambda a, b: torch.linalg.lstsq(a, b, driver="gels")[:2], A, b)


def test_lstsq_gels_of_a_matrix_without_columns_has_zero_residuals_as_on_cpu():
    """LAPACK's gels zeroes B when A is empty: CPU's residuals are 0 (tpu gave |b|^2)."""
    b = torch.randn(3, 2, generator=torch.Generator().manual_seed(0))
    assert_same(lambda a, b: torch.linalg.lstsq(a, b, driver="gels")[:2], torch.zeros(3, 0), b)


@pytest.mark.parametrize(("shape", "batch"), [((4, 3), ()), ((3, 4), ()), ((4, 3), (2,))])
def test_lstsq_gels_of_a_singular_matrix_raises_cpu_error(shape, batch):
    """An exactly zero diagonal entry of gels's triangular factor is CPU's error (its
    LAPACK info, a LinAlgError), naming the batch element; tpu returned a minimum-norm
    solution."""
    A = torch.zeros(*batch, *shape)
    A[..., 0, :] = 1  # one nonzero row: the second diagonal entry of R (or L) is 0
    b = torch.ones(*batch, shape[0], 1)
    assert_same_error(
        lambda device: torch.linalg.lstsq(A.to(device), b.to(device), driver="gels")
    )


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "driver"),
    [((4,), (4,), None), ((4, 3), (), None), ((4, 3), (5,), None), ((4, 3), (5, 2), None),
     ((2, 4, 3), (4,), None), ((4, 3), (4,), "fictitious"),
     ((1, 1, 1), (3, 1), None)],  # one dim fewer but not A's shape less a dim: a matrix
)  # fmt: skip
def test_lstsq_bad_arguments_raise_as_on_cpu(a_shape, b_shape, driver):
    assert_same_error(
        lambda device: torch.linalg.lstsq(
            torch.ones(a_shape, device=device), torch.ones(b_shape, device=device), driver=driver
        )
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex128])
def test_cholesky_info_names_the_failing_leading_minor_as_on_cpu(dtype):
    """cholesky_ex's info is LAPACK's: the order of the first leading minor that is not
    positive-definite. XLA's factor is NaN throughout on failure, and tpu reported 1 for
    every failure (so linalg.cholesky's error named "the leading minor of order 1")."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 5, 5, generator=g, dtype=dtype)
    a = x @ x.mH + 0.1 * torch.eye(5, dtype=dtype)
    for b, k in ((0, 4), (2, 2), (3, 0), (5, 1)):  # a negative pivot at order k + 1
        a[b, k, k] = -10 * a[b, k, k].abs()
    expected = torch.linalg.cholesky_ex(a).info
    assert expected.tolist() == [5, 0, 3, 1, 0, 2]  # (the cases are what they claim)
    assert torch.equal(torch.linalg.cholesky_ex(a.to("tpu")).info.cpu(), expected)
    assert_same_error(lambda device: torch.linalg.cholesky(a[2].to(device)))


def test_matrix_exp_takes_cpus_taylor_approximants():
    """CPU's algorithm (a Taylor approximant of degree 1 to 18 chosen by each matrix's
    1-norm, the largest norms scaled and squared back): float64 agrees with CPU to
    rounding at every degree (a batch mixes them), where JAX's Pade approximant was
    3e-13 apart at degree 8's norms and 6x CPU's error in float32."""
    torch.manual_seed(0)
    scales = (1e-8, 1e-5, 1e-3, 0.02, 0.2, 0.5, 1.0, 1.4, 5.0, 30.0)
    batch = torch.cat([torch.randn(2, 5, 5, dtype=torch.float64) * s / 5 for s in scales])
    expected = torch.linalg.matrix_exp(batch)
    actual = torch.linalg.matrix_exp(batch.to("tpu")).cpu()
    torch.testing.assert_close(actual, expected, rtol=1e-14, atol=1e-14)
    single = batch.float()
    cpu_error = (torch.linalg.matrix_exp(single).double() - expected).abs().max()
    tpu_error = (torch.linalg.matrix_exp(single.to("tpu")).cpu().double() - expected).abs().max()
    assert tpu_error <= 2 * cpu_error
    x = batch[:6].clone().requires_grad_()
    torch.linalg.matrix_exp(x).pow(2).sum().backward()
    xt = batch[:6].to("tpu").requires_grad_()
    torch.linalg.matrix_exp(xt).pow(2).sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), x.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("value", [float("inf"), -float("inf"), float("nan"), 1e30, 3e38])
def test_matrix_exp_of_non_finite_and_huge_matrices_is_cpus(value):
    """An infinite 1-norm made the squaring count infinite, and casting it hung the loop;
    CPU answers NaN for these (as tpu now does)."""
    a = torch.tensor([[value, 0.0], [0.0, 1.0]])
    actual = torch.linalg.matrix_exp(a.to("tpu")).cpu()
    torch.testing.assert_close(actual, torch.linalg.matrix_exp(a), equal_nan=True)


# offsets with an empty group, covering every row (CPU leaves the rest uninitialised)
GROUPED_MM = {
    "rows": ((6, 8), (3, 8, 4), [2, 2, 6]),
    "contraction": ((8, 8), (8, 4), [3, 3, 8]),
    "columns": ((3, 6, 8), (8, 8), [3, 3, 8]),
    "batched": ((3, 6, 8), (3, 8, 4), None),
}


@pytest.mark.parametrize("mode", GROUPED_MM)
def test_grouped_mm_matches_cpu(mode, no_fallback):
    """torch._grouped_mm (F.grouped_mm: transformers' default mixture-of-experts layers),
    forward and backward (whose products are grouped_mm's other modes)."""
    a_shape, b_shape, ends = GROUPED_MM[mode]
    offs = None if ends is None else torch.tensor(ends, dtype=torch.int32)
    a, b = torch.randn(a_shape), torch.randn(b_shape)
    assert_same(lambda x, y, o: torch._grouped_mm(x, y, offs=o), a, b, offs, **F32)
    weight = torch.randn(torch._grouped_mm(a, b, offs=offs).shape)  # (CPU's backward
    # refuses the stride-0 gradient of a plain sum)
    fn = lambda x, y, o, w: torch._grouped_mm(x, y, offs=o) * w  # noqa: E731
    assert_same_grad(fn, a, b, offs, weight, **F32)


def test_grouped_mm_reads_no_offsets_on_the_host():
    """Other groups' sizes run the same program, without a host sync (PyTorch's kernel
    for devices without their own read the offsets and multiplied group by group)."""
    a, b = torch.randn(6, 8, device="tpu"), torch.randn(3, 8, 4, device="tpu")
    for ends in ([2, 2, 6], [1, 5, 6]):
        offs = torch.tensor(ends, dtype=torch.int32, device="tpu")
        torch_tpu.metrics.reset()
        got = torch._grouped_mm(a, b, offs=offs)
        assert torch_tpu.metrics.snapshot().get("host_syncs", 0) == 0
        cpu = torch._grouped_mm(a.cpu(), b.cpu(), offs=offs.cpu())
        torch.testing.assert_close(got.cpu(), cpu, **F32)
    assert torch_tpu.metrics.snapshot().get("compiles", 0) == 0
