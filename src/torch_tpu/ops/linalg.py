"""Lowerings: matrix products, decompositions and solvers, distances, FFTs.

Every contraction runs at HIGHEST precision: XLA:CPU computes float32 dots
exactly, but a TPU would otherwise round the operands to bfloat16, and
results must match PyTorch's CPU to float32 tolerance on both. Half-precision
operands accumulate in float32, as PyTorch's CPU kernels do.

LU factors and pivots follow LAPACK's conventions (1-based int32 pivots of
sequential row swaps), since PyTorch's backward formulas feed them back into
linalg_lu_solve.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from .. import dtypes, precision
from .pointwise import scalar_type_name
from .registry import lower

_tri_solve = jax.lax.linalg.triangular_solve


def _accumulator(*arrays):
    """float32 for half-precision operands (accumulate wider, as PyTorch's CPU does)."""
    if any(a.dtype in (jnp.float16, jnp.bfloat16) for a in arrays):
        return jnp.float32
    return None


def _einsum(spec: str, a, b):
    return jnp.einsum(
        spec, a, b, precision=precision.matmul(), preferred_element_type=_accumulator(a, b)
    )


def _matmul(a, b):
    return jnp.matmul(
        a, b, precision=precision.matmul(), preferred_element_type=_accumulator(a, b)
    )


def _scale_add(self, product, beta, alpha):
    """beta * self + alpha * product; beta == 0 ignores self, so its NaNs do not leak.

    As PyTorch's CPU kernels: half-precision self joins the float32 product before
    rounding once, and integer results truncate beta and alpha to integers first."""
    if jnp.issubdtype(product.dtype, jnp.integer):
        beta, alpha = (jnp.asarray(s).astype(product.dtype) for s in (beta, alpha))
    scaled = product * alpha
    return jnp.where(beta == 0, scaled, scaled + beta * self.astype(product.dtype))


# ------------------------------------------------------------------ products


@lower("mm.default", "bmm.default", "mv.default", "dot.default")
def matmul(self, other):
    return _matmul(self, other)


@lower("vdot.default")
def vdot(self, other):
    return _matmul(jnp.conj(self), other)


@lower("addmm.default", "baddbmm.default", "addmv.default")
def addmm(self, left, right, beta=1, alpha=1):
    return _scale_add(self, _matmul(left, right), beta, alpha)


def _check_grouped_mm(values: list) -> bool:
    """CPU's refusals, here: PyTorch's meta kernel (CUDA's checks) refuses every float32
    call, so the lowering gives the shapes (skip_meta)."""
    self, mat2, offs, bias = values[:4]
    if self.dim() not in (2, 3) or mat2.dim() not in (2, 3):
        raise RuntimeError("Multiplicands must be 2D or 3D")
    if (self.dim() == 3 and mat2.dim() == 3) == (offs is not None):
        raise RuntimeError(
            "Have to provide offsets if there is a 2d matrix, or no offset if both matrices are 3d"
        )
    if offs is not None and offs.dtype != torch.int32:
        raise RuntimeError("Offsets have to be int32")
    if (self.dim() == 3 or mat2.dim() == 3) and self.shape[-1] != mat2.shape[-2]:
        raise RuntimeError("contraction dimension of mat_a and mat_b must match")
    if bias is not None:
        raise RuntimeError("Bias not supported yet")
    return False  # (ranks, dtypes and bias are part of the key: repeat calls keep the fast path)


@lower("_grouped_mm.default", skip_meta=True, check=_check_grouped_mm)
def grouped_mm(self, mat2, offs=None, bias=None, out_dtype=None):
    """One program whatever the groups' sizes (PyTorch's kernel for devices without
    one of their own read `offs` to the host and multiplied group by group: a sync and,
    in fused mode, a new segment whenever a mixture of experts routed differently).
    Rows or columns past the last offset are zero (CPU's are left uninitialised)."""
    dtype = dtypes.TORCH_TO_JAX[out_dtype] if out_dtype is not None else self.dtype
    if offs is None:  # 3d x 3d: one product per group
        return _matmul(self, mat2).astype(dtype)
    if self.ndim == 3:  # groups of mat2's columns: the transposed product's rows
        return grouped_mm(mat2.T, self.transpose(0, 2, 1), offs, None, out_dtype).T
    if mat2.ndim == 2:  # groups of the contraction: (groups, m, n)
        numbers = (([1], [0]), ([], [])), [1], []
    else:  # groups of self's rows, each with its own matrix of mat2
        numbers = (([1], [1]), ([], [])), [0], [0]
    product = lax.ragged_dot_general(
        self, mat2, jnp.diff(offs, prepend=0), lax.RaggedDotDimensionNumbers(*numbers),
        precision=precision.matmul(), preferred_element_type=_accumulator(self, mat2),
    )  # fmt: skip
    return product.astype(dtype)


@lower("addbmm.default")
def addbmm(self, batch1, batch2, beta=1, alpha=1):
    """Half precision adds one batch at a time, rounding after each as PyTorch's CPU
    does (its addbmm is a loop of addmm_); wider dtypes sum in one contraction."""
    if _accumulator(batch1, batch2) is None:
        return _scale_add(self, _einsum("bij,bjk->ik", batch1, batch2), beta, alpha)
    start = jnp.broadcast_to(self, (batch1.shape[1], batch2.shape[2]))
    if batch1.shape[0] == 0:
        return jnp.where(beta == 0, jnp.zeros_like(start), beta * start)

    def add_one(acc, step):
        left, right, first = step
        acc = _scale_add(acc, _matmul(left, right), jnp.where(first, beta, 1), alpha)
        return acc.astype(self.dtype), None

    first = jnp.arange(batch1.shape[0]) == 0
    return jax.lax.scan(add_one, start, (batch1, batch2, first))[0]


@lower("addr.default")
def addr(self, vec1, vec2, beta=1, alpha=1):
    """CPU's kernel (and CUDA's): beta * self + alpha * vec1 * vec2, left to right in the
    result dtype, beta and alpha converted to it first; beta == 0 ignores self and its
    NaNs. A half type rounds beta, alpha, each product and the sum to itself (PyTorch's
    generic composite, which ran before, rounded vec1 * vec2 and kept alpha in float32)."""
    dtype = jnp.result_type(self.dtype, vec1.dtype, vec2.dtype)
    if dtype == jnp.bool_:
        b, a = (jnp.asarray(s).astype(bool) for s in (beta, alpha))
        return (b & self) | (a & vec1[:, None] & vec2)
    if dtype in (jnp.float16, jnp.bfloat16):
        wide, step = jnp.float32, functools.partial(dtypes.rounded_to, dtype=dtype)
    else:
        wide, step = dtype, lambda x: x
    b, a, x, v1, v2 = (step(jnp.asarray(v).astype(wide)) for v in (beta, alpha, self, vec1, vec2))
    product = step(step(a * v1[:, None]) * v2)
    return jnp.where(b == 0, product, step(b * x) + product).astype(dtype)


@lower("trace.default")
def trace(self):
    wide = jnp.int64 if jnp.issubdtype(self.dtype, jnp.integer) or self.dtype == jnp.bool_ else None
    return jnp.trace(self, dtype=wide)


@lower("linalg_cross.default")
def linalg_cross(self, other, dim=-1):
    shape = jnp.broadcast_shapes(self.shape, other.shape)
    a, b = jnp.broadcast_to(self, shape), jnp.broadcast_to(other, shape)

    def rolled(x, order):
        return jnp.take(x, jnp.array(order), axis=dim)

    first = rolled(a, (1, 2, 0)), rolled(b, (2, 0, 1))
    second = rolled(a, (2, 0, 1)), rolled(b, (1, 2, 0))
    if self.dtype not in (jnp.float16, jnp.bfloat16):
        return first[0] * first[1] - second[0] * second[1]
    # CPU's kernel rounds each product to the half type, then subtracts in float32 and
    # rounds again; XLA would compute it all in float32 and round once

    def product(x, y):
        return dtypes.rounded_to(x.astype(jnp.float32) * y.astype(jnp.float32), self.dtype)

    return (product(*first) - product(*second)).astype(self.dtype)


# ----------------------------------------------------------- LU and solvers


def _batch_broadcast(*arrays):
    """Broadcast the batch dims (all but the last two) of matrix stacks."""
    batch = jnp.broadcast_shapes(*(a.shape[:-2] for a in arrays))
    return [jnp.broadcast_to(a, batch + a.shape[-2:]) for a in arrays]


def _vector_rhs(a_shape, b_shape) -> bool:
    """PyTorch's rule for a right-hand side that is a vector (or a batch of them): one
    dim, or A's shape without its last dim; anything else is a matrix."""
    return len(b_shape) == 1 or tuple(b_shape) == tuple(a_shape[:-1])


def _lu(a):
    """(LU, 1-based int32 pivots, row permutation with a[perm] == L @ U)."""
    lu, pivots, perm = jax.lax.linalg.lu(a)
    return lu, (pivots + 1).astype(jnp.int32), perm


def _first_failure(failed):
    """LAPACK's info from a per-pivot failure mask: 1 + the first failure, else 0."""
    if failed.shape[-1] == 0:  # 0x0 matrices never fail (argmax rejects empty axes)
        return jnp.zeros(failed.shape[:-1], jnp.int32)
    return jnp.where(failed.any(-1), jnp.argmax(failed, axis=-1) + 1, 0).astype(jnp.int32)


def _adjoint(a):
    """The conjugate transpose of a batch of matrices."""
    return jnp.conj(jnp.swapaxes(a, -1, -2))


def _singular_info(lu):
    """LAPACK's info: 1 + the first zero pivot of U, or 0 when A is invertible."""
    return _first_failure(jnp.diagonal(lu, axis1=-2, axis2=-1) == 0)


def _rows(b, perm):
    return jnp.take_along_axis(b, perm[..., :, None], axis=-2)


def _lu_solve(lu, perm, b, trans="N"):
    """Solve op(A) X = B for A[perm] = L U; op is identity, transpose ("T") or adjoint ("C")."""
    if trans == "N":
        y = _tri_solve(lu, _rows(b, perm), left_side=True, lower=True, unit_diagonal=True)
        return _tri_solve(lu, y, left_side=True, lower=False)
    conj = trans == "C"
    y = _tri_solve(lu, b, left_side=True, lower=False, transpose_a=True, conjugate_a=conj)
    y = _tri_solve(
        lu, y, left_side=True, lower=True, transpose_a=True, conjugate_a=conj, unit_diagonal=True
    )
    return _rows(y, jnp.argsort(perm, axis=-1))


def _solve_sided(lu, perm, b, left, adjoint):
    """A X = B (left) or X A = B, with A or its adjoint, from A's LU factors."""
    if left:
        return _lu_solve(lu, perm, b, "C" if adjoint else "N")
    bt = jnp.swapaxes(b, -1, -2)
    if adjoint:  # X A^H = B  <=>  A X^H = B^H
        return _adjoint(_lu_solve(lu, perm, jnp.conj(bt)))
    return jnp.swapaxes(_lu_solve(lu, perm, bt, "T"), -1, -2)


def _pivots_to_perm(pivots, n):
    return jax.lax.linalg.lu_pivots_to_permutation(pivots - 1, n)


def _unpack(lu, perm):
    """(P, L, U) with A = P @ L @ U, from A[perm] = L @ U."""
    m, n = lu.shape[-2:]
    k = min(m, n)
    p = (jnp.arange(m)[:, None] == perm[..., None, :]).astype(lu.dtype)
    lower_part = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=lu.dtype)
    return p, lower_part, jnp.triu(lu[..., :k, :])


def _check_pivot(pivot, name):
    if not pivot:
        raise RuntimeError(f"{name}: LU without pivoting is not implemented on tpu")


@lower("linalg_lu_factor_ex.default")
def linalg_lu_factor_ex(A, pivot=True, check_errors=False):
    _check_pivot(pivot, "linalg.lu_factor")
    lu, pivots, _ = _lu(A)
    return lu, pivots, _singular_info(lu)


@lower("linalg_lu.default")
def linalg_lu(A, pivot=True):
    _check_pivot(pivot, "linalg.lu")
    lu, _, perm = _lu(A)
    return _unpack(lu, perm)


@lower("lu_unpack.default")
def lu_unpack(LU_data, LU_pivots, unpack_data=True, unpack_pivots=True):
    p, lower_part, upper_part = _unpack(LU_data, _pivots_to_perm(LU_pivots, LU_data.shape[-2]))
    empty = jnp.zeros((0,), LU_data.dtype)
    if not unpack_pivots:
        p = empty
    if not unpack_data:
        lower_part = upper_part = empty
    return p, lower_part, upper_part


@lower("linalg_lu_solve.default")
def linalg_lu_solve(LU, pivots, B, left=True, adjoint=False):
    LU, B = _batch_broadcast(LU, B)
    perm = jnp.broadcast_to(_pivots_to_perm(pivots, LU.shape[-1]), LU.shape[:-1])
    return _solve_sided(LU, perm, B, left, adjoint)


@lower("linalg_inv_ex.default")
def linalg_inv_ex(A, check_errors=False):
    lu, _, perm = _lu(A)
    eye = jnp.broadcast_to(jnp.eye(A.shape[-1], dtype=A.dtype), A.shape)
    return _lu_solve(lu, perm, eye), _singular_info(lu)


@lower("_linalg_solve_ex.default")
def linalg_solve_ex(A, B, left=True, check_errors=False):
    vector = _vector_rhs(A.shape, B.shape)
    rhs = B[..., None] if vector else B
    # A's own factors (the LU, pivots and info CPU returns have A's batch shape), then
    # the solve with them broadcast against B's batch
    lu, pivots, perm = _lu(A)
    lu_b, rhs = _batch_broadcast(lu, rhs)
    perm_b = jnp.broadcast_to(perm, lu_b.shape[:-1])
    x = _solve_sided(lu_b, perm_b, rhs, left, False)
    return (x[..., 0] if vector else x), lu, pivots, _singular_info(lu)


def _lu_for_det(A, contiguous: bool):
    """The LU factors PyTorch's det backward expects: of A^T when A is real and
    contiguous (the CPU kernel's shortcut, det(A^T) = det(A)), else of A."""
    real = not jnp.issubdtype(A.dtype, jnp.complexfloating)
    return _lu(jnp.swapaxes(A, -1, -2) if real and contiguous else A)


def _permutation_sign(pivots):
    swaps = jnp.sum(pivots != jnp.arange(1, pivots.shape[-1] + 1, dtype=pivots.dtype), axis=-1)
    return 1 - 2 * (swaps % 2)


@lower("_linalg_det.default", contiguity=True)
def linalg_det(A, contiguous):
    lu, pivots, _ = _lu_for_det(A, contiguous[0])
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    return jnp.prod(diag, axis=-1) * _permutation_sign(pivots).astype(A.dtype), lu, pivots


@lower("_linalg_slogdet.default", contiguity=True)
def linalg_slogdet(A, contiguous):
    lu, pivots, _ = _lu_for_det(A, contiguous[0])
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    size = jnp.abs(diag)
    phase = jnp.prod(jnp.where(size == 0, 0, diag / jnp.where(size == 0, 1, size)), axis=-1)
    sign = phase * _permutation_sign(pivots).astype(A.dtype)
    return sign, jnp.sum(jnp.log(size), axis=-1), lu, pivots


@lower("linalg_solve_triangular.default")
def linalg_solve_triangular(self, B, upper, left=True, unitriangular=False):
    A, B = _batch_broadcast(self, B)
    return _tri_solve(A, B, left_side=left, lower=not upper, unit_diagonal=unitriangular)


@lower("triangular_solve.default")
def triangular_solve(self, A, upper=True, transpose=False, unitriangular=False):
    B, A = _batch_broadcast(self, A)
    x = _tri_solve(
        A, B, left_side=True, lower=not upper, transpose_a=transpose, unit_diagonal=unitriangular
    )
    return x, A


def _cholesky_solve(L, B, upper):
    """Solve (L L^H) X = B, or (U^H U) X = B when upper."""
    y = _tri_solve(L, B, left_side=True, lower=not upper, transpose_a=upper, conjugate_a=upper)
    return _tri_solve(
        L, y, left_side=True, lower=not upper, transpose_a=not upper, conjugate_a=not upper
    )


@lower("_cholesky_solve_helper.default")
def cholesky_solve_helper(self, A, upper):
    B, A = _batch_broadcast(self, A)
    return _cholesky_solve(A, B, upper)


@lower("cholesky_inverse.default")
def cholesky_inverse(self, upper=False):
    eye = jnp.broadcast_to(jnp.eye(self.shape[-1], dtype=self.dtype), self.shape)
    return _cholesky_solve(self, eye, upper)


def _cholesky(a, upper):
    """The factor from a's lower triangle (NaN where a is not positive-definite)."""
    if a.size == 0:  # nothing to factor; LAPACK has no half-precision kernel to call
        return a
    L = jax.lax.linalg.cholesky(a, symmetrize_input=False)
    return _adjoint(L) if upper else L


def _cholesky_info(a):
    """LAPACK's potrf info for each matrix: 1 + the first k whose pivot
    a_kk - sum_{j<k} |L_kj|^2 is not positive (or is NaN), else 0. XLA's factor is NaN
    throughout once any pivot fails, so this runs an unblocked factorisation of a's
    lower triangle, only carrying on past a failed pivot to reach the rest."""
    n = a.shape[-1]
    strict = jnp.tril(a, -1)
    work = strict + _adjoint(strict) + jnp.tril(jnp.triu(a))
    rows = jnp.arange(n)

    def step(k, state):
        work, info = state
        pivot = jnp.real(work[..., k, k])
        bad = ~(pivot > 0)
        info = jnp.where((info == 0) & bad, k + 1, info)
        column = work[..., :, k] / jnp.sqrt(jnp.where(bad, 1, pivot))[..., None]
        column = jnp.where(rows > k, column, 0)
        return work - column[..., :, None] * jnp.conj(column[..., None, :]), info

    info = jnp.zeros(a.shape[:-2], jnp.int32)
    return lax.fori_loop(0, n, step, (work, info))[1]


@lower("linalg_cholesky_ex.default")
def linalg_cholesky_ex(self, upper=False, check_errors=False):
    """info is LAPACK's (the failing leading minor), worked out only when XLA's factor
    failed somewhere in the batch."""
    factor = _cholesky(self, upper)
    failed = jnp.isnan(jnp.real(jnp.diagonal(factor, axis1=-2, axis2=-1))).any(-1)
    if self.shape[-1] == 0:
        return factor, jnp.zeros(self.shape[:-2], jnp.int32)
    info = lax.cond(
        jnp.any(failed),
        lambda: jnp.where(failed, _cholesky_info(self), 0).astype(jnp.int32),
        lambda: jnp.zeros(self.shape[:-2], jnp.int32),
    )
    return factor, info


@lower("cholesky.default")
def cholesky(self, upper=False):
    return _cholesky(self, upper)


# The matrix exponential as PyTorch's CPU kernel computes it (Bader, Blanes and Casas,
# "Computing the Matrix Exponential with an Optimized Taylor Polynomial Approximation",
# 2019): per matrix, the Taylor approximant of degree 1, 2, 4, 8, 12 or 18 that its 1-norm
# allows, the last after scaling by a power of two and squaring back. JAX's expm (a Pade
# approximant) was 6x further from float64 than CPU's in float32, and its gradients 10x.
# Largest 1-norm each degree serves, for float32 (and complex64) and float64 inputs.
_EXPM_THETAS = {
    4: (1.192092800768788e-07, 5.978858893805233e-04, 5.116619363445086e-02,
        5.800524627688768e-01, 1.461661507209034e00, 3.010066362817634e00),
    8: (2.220446049250313e-16, 2.580956802971767e-08, 3.397168839976962e-04,
        4.991228871115323e-02, 2.996158913811580e-01, 1.090863719290036e00),
}  # fmt: skip
# Rows: the coefficients of the degree-12 and degree-18 approximants' matrices in the
# powers {I, A, A^2, A^3} and {I, A, A^2, A^3, A^6} (the paper's tables).
_EXPM_T12 = (
    (9.0198e-16, 0.46932117595418237389, -0.20099424927047284052, -0.04623946134063071740),
    (5.31597895759871264183, 1.19926790417132231573, 0.01179296240992997031,
     0.01108844528519167989),
    (0.18188869982170434744, 0.05502798439925399070, 0.09351590770535414968,
     0.00610700528898058230),
    (-2.0861320e-13, -0.13181061013830184015, -0.02027855540589259079,
     -0.00675951846863086359),
)  # fmt: skip
_EXPM_T18 = (
    (0.0, -1.00365581030144618291e-01, -8.02924648241156932449e-03,
     -8.92138498045729985177e-04, 0.0),
    (0.0, 3.97849749499645077844e-01, 1.36783778460411720168e00, 4.98289622525382669416e-01,
     -6.37898194594723280150e-04),
    (-1.09676396052962061844e01, 1.68015813878906206114e00, 5.71779846478865511061e-02,
     -6.98210122488052056106e-03, 3.34975017086070470649e-05),
    (-9.04316832390810593223e-02, -6.76404519071381882256e-02, 6.75961301770459654925e-02,
     2.95552570429315521194e-02, -1.39180257516060693404e-05),
    (0.0, 0.0, -9.23364619367118555360e-02, -1.69364939002081722752e-02,
     -1.40086798182036094347e-05),
)  # fmt: skip


def _expm_t8_coefficients(real) -> tuple:
    """x1..x7 and y2 of the degree-8 approximant, rounded as CPU's kernel declares them
    (each a constant of the input's real type, computed from the others in double).
    x7 divides by x3 squared, as the paper has it (older PyTorch releases divided by x3
    alone, an error of about 1e-13 at degree 8's largest norms; torch 2.13's is exact)."""
    t = np.dtype(real).type
    sqrt_177 = t(0.1330413469565007072504e2)
    x3 = t(2.0 / 3.0)
    s = float(sqrt_177)
    x3d = float(x3)
    return tuple(
        t(v)
        for v in (
            x3d * ((1.0 + s) / 88.0),
            x3d * ((1.0 + s) / 352.0),
            x3d,
            (-271.0 + 29.0 * s) / (315.0 * x3d),
            (-11.0 + 11.0 * s) / (1260.0 * x3d),
            (-99.0 + 11.0 * s) / (5040.0 * x3d),
            (89.0 - s) / (5040.0 * x3d * x3d),
            (857.0 - 58.0 * s) / 630.0,
        )
    )


# (at full precision whatever torch's matmul precision says: CPU's matrix_exp turns
# reduced-precision products off for itself)
_exact_matmul = functools.partial(jnp.matmul, precision=jax.lax.Precision.HIGHEST)


def _combination(coefficients, matrices):
    """sum_j c_j M_j, accumulated in order, each c_j a constant of the matrices' dtype."""
    total = None
    for c, m in zip(coefficients, matrices):
        term = jnp.asarray(c, m.dtype) * m
        total = term if total is None else total + term
    return total


def _expm_taylor(a, degree: int):
    """The degree's Taylor approximant of exp(a), evaluated as CPU's kernel does."""
    mm = _exact_matmul
    eye = jnp.broadcast_to(jnp.eye(a.shape[-1], dtype=a.dtype), a.shape)
    if degree == 1:
        return eye + a
    a2 = mm(a, a)
    if degree == 2:
        return eye + a + a2 / 2
    if degree == 4:
        x = mm(a2, _combination((1 / 2.0, 1 / 6.0, 1 / 24.0), (eye, a, a2)))
        return _combination((1.0, 1.0, 0.0, 1.0), (eye, a, a2, x))
    if degree == 8:
        x1, x2, x3, x4, x5, x6, x7, y2 = _expm_t8_coefficients(jnp.finfo(a.dtype).dtype)
        a4 = mm(a2, _combination((x1, x2), (a, a2)))
        a8 = mm(_combination((x3, 1.0), (a2, a4)), _combination((x4, x5, x6, x7), (eye, a, a2, a4)))
        return _combination((1.0, 1.0, y2, 0.0, 1.0), (eye, a, a2, a4, a8))
    powers = [eye, a, a2, mm(a, a2)]
    if degree == 12:
        b = [_combination(row, powers) for row in _EXPM_T12]
        b[2] = b[2] + mm(b[3], b[3])
        return b[0] + mm(b[1] + b[2], b[2])
    powers.append(mm(powers[3], powers[3]))
    b = [_combination(row, powers) for row in _EXPM_T18]
    b[3] = b[3] + mm(b[0], b[4])
    return b[1] + mm(b[2] + b[3], b[3])


@lower("linalg_matrix_exp.default")
def linalg_matrix_exp(self):
    if self.shape[-1] == 1:
        return jnp.exp(self)
    if self.dtype in (jnp.float16, jnp.bfloat16):  # (CPU's half kernel returns inf and
        # NaN for well-scaled inputs: it applies float64's degrees in half precision)
        return linalg_matrix_exp(self.astype(jnp.float32)).astype(self.dtype)
    thetas = _EXPM_THETAS[jnp.finfo(self.dtype).bits // 8]
    norm = jnp.abs(self).sum(-2).max(-1)[..., None, None]  # (the operator 1-norm)
    # the largest norms: scaled by 2^-s into the degree-18 range, then squared s times
    # (an inf or NaN norm gives 0: its own infs and NaNs then spread, where casting an
    # infinite count hung the loop; float64's largest norm needs 1024 squarings)
    s = jnp.ceil(jnp.log2(norm / thetas[5]))
    s = jnp.clip(jnp.where(jnp.isfinite(s), s, 0), 0, 1100).astype(jnp.int64)
    scaled = self / (2**s).astype(self.dtype)
    result = _expm_taylor(scaled, 18)

    def square(carry):
        k, m = carry
        return k + 1, jnp.where(k < s, _exact_matmul(m, m), m)

    _, result = jax.lax.while_loop(lambda c: c[0] < jnp.max(s, initial=0), square, (0, result))
    below = -1.0
    for degree, theta in zip((1, 2, 4, 8, 12), thetas):
        chosen = (below < norm) & (norm <= theta) & (norm < thetas[4])
        result = jnp.where(chosen, _expm_taylor(self, degree), result)
        below = theta
    return result


@lower("linalg_householder_product.default")
def linalg_householder_product(input, tau):
    return jax.lax.linalg.householder_product(input, tau)


# ------------------------------------------------------- spectral and QR


@lower("linalg_qr.default")
def linalg_qr(A, mode="reduced"):
    q, r = jax.lax.linalg.qr(A, full_matrices=mode == "complete")
    if mode == "r":
        return jnp.zeros((0,), A.dtype), r
    return q, r


@lower("_linalg_svd.default")
def linalg_svd(A, full_matrices=False, compute_uv=True, driver=None):
    if not compute_uv:
        s = jax.lax.linalg.svd(A, full_matrices=False, compute_uv=False)
        empty = jnp.zeros((0,), A.dtype)
        return empty, s, empty
    u, s, vh = jax.lax.linalg.svd(A, full_matrices=full_matrices)
    return u, s, vh


@lower("_linalg_eigh.default")
def linalg_eigh(A, UPLO="L", compute_v=True):
    vectors, values = jax.lax.linalg.eigh(A, lower=UPLO.upper() == "L", symmetrize_input=False)
    return values, (vectors if compute_v else jnp.zeros((0,), A.dtype))


_LSTSQ_DRIVERS = ("gels", "gelsy", "gelsd", "gelss")


def _check_lstsq(values: list) -> bool:
    """CPU's checks, in its order and words (its meta kernel lacks them: JAX's errors
    surfaced, and an unknown driver ran)."""
    A, B, driver = values[0], values[1], values[3] if len(values) > 3 else None

    def check(ok: bool, words: str) -> None:
        if not ok:
            raise RuntimeError(f"torch.linalg.lstsq: {words}")

    check(A.dim() >= 2, "input must have at least 2 dimensions.")
    check(B.dim() >= 1, "other must have at least 1 dimension.")
    check(
        A.dtype == B.dtype,
        f"Expected input and other to have the same dtype, but got input's dtype "
        f"{scalar_type_name(A.dtype)} and other's dtype {scalar_type_name(B.dtype)}",
    )
    difference = A.dim() - B.dim()
    check(
        0 <= difference <= 1,
        "input.dim() must be greater or equal to other.dim() and (input.dim() - other.dim()) <= 1",
    )
    vector = _vector_rhs(A.shape, B.shape)
    rows = B.shape[-1] if vector else B.shape[-2]
    check(
        A.shape[-2] == rows,
        f"input.size(-2) should match other.size({-1 if vector else -2})",
    )
    check(
        driver is None or driver in _LSTSQ_DRIVERS,
        f"parameter `driver` should be one of ({', '.join(_LSTSQ_DRIVERS)})",
    )
    return False


def _lstsq_svd(A, B, rcond):
    """The minimum-norm solution through the SVD, singular values at or below rcond
    times the largest dropped (gelsy's, gelsd's and gelss's rank cutoff)."""
    m, n = A.shape[-2:]
    u, s, vh = jnp.linalg.svd(A, full_matrices=False)
    eps = jnp.finfo(s.dtype).eps
    cutoff = (eps * max(m, n) if rcond is None or rcond < 0 else rcond) * s[..., :1]
    keep = s > cutoff
    inv_s = jnp.where(keep, 1 / jnp.where(keep, s, 1), 0).astype(A.dtype)
    x = _matmul(_adjoint(vh), _matmul(_adjoint(u), B) * inv_s[..., :, None])
    return x, keep.sum(-1).astype(jnp.int64), s


def _lstsq_qr(A, B):
    """LAPACK's gels, which assumes full rank and has no cutoff: QR of a tall A (the
    residuals are the rows of Q^H B past n, where gels leaves them), LQ of a wide one,
    as QR of A^H. Also its info: 1 + the first exactly zero diagonal entry of R."""
    m, n = A.shape[-2:]
    if m < n:
        q, r = jnp.linalg.qr(_adjoint(A))
        y = _tri_solve(r, B, left_side=True, lower=False, transpose_a=True, conjugate_a=True)
        return _matmul(q, y), None, _singular_info(r)
    q, r = jnp.linalg.qr(A, mode="complete")
    c = _matmul(_adjoint(q), B)
    r = r[..., :n, :]
    x = _tri_solve(r, c[..., :n, :], left_side=True, lower=False)
    return x, jnp.sum(jnp.abs(c[..., n:, :]) ** 2, axis=-2), _singular_info(r)


def _raise_on_info(info, is_matrix: bool) -> None:
    """CPU's error (LinAlgError, in its words) for a gels solve of a matrix without full
    rank: a host read, as CPU's."""
    if bool((info != 0).any()):
        check = torch.ops.aten._linalg_check_errors.default
        check(torch.tensor(np.asarray(info)), "torch.linalg.lstsq", is_matrix=is_matrix)


@lower("linalg_lstsq.default", dynamic_shape=True, check=_check_lstsq)
def linalg_lstsq(self, b, rcond=None, driver=None):
    """Least squares by the LAPACK driver PyTorch's CPU would use: gels's QR, else the
    minimum-norm solution through the SVD. Residuals exist only for tall matrices, and
    for gelsd and gelss only when every matrix is of full rank, so their shape depends
    on values. A vector b (one dim fewer than the input) is solved as a one-column
    matrix, its solution squeezed (the residuals keep that column, as CPU's do)."""
    vector = _vector_rhs(self.shape, b.shape)
    A, B = _batch_broadcast(self, b[..., None] if vector else b)
    m, n = A.shape[-2:]
    real = jnp.finfo(A.dtype).dtype
    residuals, rank, values = (jnp.zeros((0,), t) for t in (real, jnp.int64, real))
    driver = driver or "gelsy"  # the CPU default, which reports no residuals
    if driver == "gels":
        x, squares, info = _lstsq_qr(A, B)
        _raise_on_info(info, self.ndim == 2)
        if m > n:  # (zeros when A has no columns: LAPACK's gels then zeroes B)
            residuals = squares if n else jnp.zeros_like(squares)
    else:
        x, rank, s = _lstsq_svd(A, B, rcond)
        if m > n and driver != "gelsy" and bool((rank == n).all()):
            residuals = jnp.sum(jnp.abs(_matmul(A, x) - B) ** 2, axis=-2)
        values = s if driver in ("gelsd", "gelss") else values
    return (x[..., 0] if vector else x), residuals, rank, values


# ------------------------------------------------------------- distances


def _use_mm(p, compute_mode, rows1, rows2):
    """PyTorch's rule for computing Euclidean distances through a matrix product."""
    return p == 2 and (compute_mode == 1 or (compute_mode in (None, 0) and max(rows1, rows2) > 25))


@lower("_cdist_forward.default")
def cdist_forward(x1, x2, p, compute_mode=None):
    x1, x2 = _batch_broadcast(x1, x2)
    if _use_mm(p, compute_mode, x1.shape[-2], x2.shape[-2]):
        sq1 = jnp.sum(x1 * x1, axis=-1)[..., :, None]
        sq2 = jnp.sum(x2 * x2, axis=-1)[..., None, :]
        cross = _matmul(x1, jnp.swapaxes(x2, -1, -2))
        return jnp.sqrt(jnp.maximum(sq1 + sq2 - 2 * cross, 0))
    return _norms(jnp.abs(x1[..., :, None, :] - x2[..., None, :, :]), p)


def _norms(diff, p):
    """The p-norms of the absolute differences `diff` along the last axis."""
    if p == 0:
        return jnp.sum(diff != 0, axis=-1).astype(diff.dtype)
    if math.isinf(p):
        return jnp.max(diff, axis=-1, initial=0)
    if p == 1:
        return jnp.sum(diff, axis=-1)
    if p == 2:
        return jnp.sqrt(jnp.sum(diff * diff, axis=-1))
    return jnp.sum(diff**p, axis=-1) ** (1 / p)


def _norm_grads(diff, dist, g, p):
    """d dist / d x1 per difference x1 - x2 (`diff`), times the incoming gradient g:
    sign(diff) |diff|^(p-1) / dist^(p-1), zero where dist is zero (p > 0)."""
    if p == 1:
        terms = jnp.sign(diff) * g
    elif math.isinf(p):
        terms = jnp.sign(diff) * (jnp.abs(diff) == dist) * g
    elif p == 2:
        terms = diff * g / jnp.where(dist == 0, 1, dist)
    else:
        safe = jnp.where(dist == 0, 1, dist)
        terms = jnp.sign(diff) * jnp.abs(diff) ** (p - 1) * g / safe ** (p - 1)
        if p < 1:
            terms = jnp.where(diff == 0, 0, terms)
    return jnp.where(dist == 0, 0, terms)


def _no_distances(x1, x2):
    """True when there are no distances: an empty row, feature or broadcast batch dim."""
    batch = jnp.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
    return 0 in (*batch, x1.shape[-2], x2.shape[-2], x1.shape[-1])


@lower("_cdist_backward.default")
def cdist_backward(grad, x1, x2, p, cdist):
    """d cdist / d x1: sign(diff) |diff|^(p-1) / dist^(p-1), zero where dist is zero."""
    if _no_distances(x1, x2):  # PyTorch's zeros at x1's own shape, batch not broadcast
        return jnp.zeros_like(x1)
    diff = x1[..., :, None, :] - x2[..., None, :, :]
    if p == 0:  # (at the batch shape x1 and x2 broadcast to, as the other branches)
        return jnp.zeros(diff.shape[:-2] + diff.shape[-1:], diff.dtype)
    return jnp.sum(_norm_grads(diff, cdist[..., None], grad[..., None], p), axis=-2)


def _pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    """pdist's row pairs (i < j), in its order: (0, 1), (0, 2), ..., (1, 2), ..."""
    return np.triu_indices(n, 1)


@lower("_pdist_forward.default")
def pdist_forward(self, p=2.0):
    """The distances between the rows of self, pairwise, from the differences as CPU's
    kernel computes them (no matrix product, whatever p)."""
    first, second = _pairs(self.shape[0])
    return _norms(jnp.abs(self[first] - self[second]), p)


@lower("_pdist_backward.default")
def pdist_backward(grad, self, p, pdist):
    """Each pair's gradient goes to its first row and, negated, to its second."""
    first, second = _pairs(self.shape[0])
    if p == 0 or first.size == 0:
        return jnp.zeros_like(self)
    terms = _norm_grads(self[first] - self[second], pdist[:, None], grad[:, None], p)
    return jnp.zeros_like(self).at[first].add(terms).at[second].add(-terms)


# -------------------------------------------------------------------- FFT


def _fft_scale(x, sizes, normalization):
    """PyTorch's fft_norm_mode: 0 none, 1 by 1/sqrt(n), 2 by 1/n."""
    n = float(np.prod(sizes)) if sizes else 1.0
    if normalization == 1:
        return x * (1 / math.sqrt(n))
    if normalization == 2:
        return x * (1 / n)
    return x


def _fft_r2c_layout(values: list, result):
    """CPU's (MKL's) layout of a real-to-complex transform: the batch dims outermost, then
    the transformed dims but the last, each group in the input's stride order (largest
    first), then the last transformed (halved) dim: rfft over dim 0 of a matrix has
    strides (1, n). PyTorch's meta kernel transposes a transform over several dims, where
    CPU's result is contiguous."""
    self, dims = values[0], [d % values[0].ndim for d in values[1]]

    def by_stride(group):
        return sorted(group, key=lambda d: -self.stride(d))

    batch = by_stride(d for d in range(self.ndim) if d not in dims)
    order = batch + by_stride(dims[:-1]) + dims[-1:]
    strides, step = [0] * self.ndim, 1
    for d in reversed(order):
        strides[d] = step
        step *= result.shape[d]
    return torch.empty_strided(result.shape, strides, dtype=result.dtype, device=result.device)


@lower("_fft_r2c.default", result_layout=_fft_r2c_layout)
def fft_r2c(self, dim, normalization, onesided):
    sizes = [self.shape[d] for d in dim]
    out = jnp.fft.fftn(self, axes=dim) if not onesided else jnp.fft.rfftn(self, axes=dim)
    return _fft_scale(out, sizes, normalization)


@lower("_fft_c2r.default")
def fft_c2r(self, dim, normalization, last_dim_size):
    sizes = [self.shape[d] for d in dim[:-1]] + [last_dim_size]
    out = jnp.fft.irfftn(self, s=sizes, axes=dim, norm="forward")
    return _fft_scale(out, sizes, normalization)


@lower("_fft_c2c.default")
def fft_c2c(self, dim, normalization, forward):
    sizes = [self.shape[d] for d in dim]
    transform = jnp.fft.fftn if forward else jnp.fft.ifftn
    out = transform(self, axes=dim, norm="backward" if forward else "forward")
    return _fft_scale(out, sizes, normalization)
