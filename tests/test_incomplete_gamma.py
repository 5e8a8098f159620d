"""igamma / igammac against exact values (mpmath at 60 digits): JAX's gammainc drifted
for large a (float32 P(1e7, 1e7) was 3521.8, float64 Q(1e10, 1e10) 0.934) and never
returned near a = 1e30; tpu switches to Temme's expansion there
(src/torch_tpu/ops/incomplete_gamma.py)."""

from __future__ import annotations

import mpmath as mp
import numpy as np
import pytest
import torch

from torch_tpu.ops import incomplete_gamma

mp.mp.dps = 60


def _exact(a: float, x: float) -> tuple:
    """(P(a, x), Q(a, x)) at 60 digits: the smaller of the two from its own expansion
    (mpmath's gammainc gives up for large a), the other as 1 less it. Below a: P's
    power series x^a e^-x / Gamma(a + 1) * sum_k x^k / ((a + 1)...(a + k)); above:
    Q's continued fraction (Legendre's), by Lentz's method."""
    a, x = mp.mpf(a), mp.mpf(x)
    small = mp.mpf(10) ** -40
    if x <= a:
        term = total = mp.mpf(1)
        k = 1
        while term > total * small:
            term *= x / (a + k)
            total += term
            k += 1
        p = mp.exp(a * mp.log(x) - x - mp.loggamma(a + 1)) * total
        return p, 1 - p
    tiny = mp.mpf(10) ** -300
    b = x + 1 - a
    c, d = 1 / tiny, 1 / b
    f, k = d, 1
    while True:
        an = -k * (k - a)
        b += 2
        d = b + an * d
        d = 1 / (d if d else tiny)
        c = b + an / c
        c = c if c else tiny
        delta = c * d
        f *= delta
        k += 1
        if abs(delta - 1) < small:
            break
    q = mp.exp(a * mp.log(x) - x - mp.loggamma(a)) * f
    return 1 - q, q


def _relative(got: float, exact) -> float:
    return float(abs(mp.mpf(got) - exact) / exact) if exact else abs(got)


A64 = [1e5, 3e5, 1e6, 1e7, 1e8]
A32 = [20.0, 50.0, 1e3, 1e5, 1e6]
RATIOS = [0.5, 0.9, 0.999, 1.0, 1.001, 1.1, 2.0]


@pytest.mark.parametrize(
    "dtype, sizes, tolerance",
    # float32: 2e-5 in the far tails, where P or Q is about 1e-40 and below
    [(torch.float64, A64, 1e-12), (torch.float32, A32, 2e-5)],
)
def test_large_a_matches_exact_values(dtype, sizes, tolerance):
    a = torch.tensor([s for s in sizes for _ in RATIOS], dtype=dtype)
    x = torch.tensor([s * r for s in sizes for r in RATIOS], dtype=dtype)
    p = torch.igamma(a.to("tpu"), x.to("tpu")).cpu()
    q = torch.igammac(a.to("tpu"), x.to("tpu")).cpu()
    tiny = torch.finfo(dtype).tiny
    for k in range(len(a)):
        exact_p, exact_q = _exact(float(a[k]), float(x[k]))  # (the arguments as rounded)
        for got, exact, name in ((p[k], exact_p, "P"), (q[k], exact_q, "Q")):
            if exact < tiny:
                assert float(got) < 2 * tiny, (name, float(a[k]), float(x[k]))
                continue
            error = _relative(float(got), exact)
            assert error < tolerance, (name, float(a[k]), float(x[k]), float(got), exact)


def test_huge_a_returns_the_limit():
    """P(a, a) = 1/2 + 1/(3 sqrt(2 pi a)) + O(1/a^1.5): for a = 1e30 JAX's series never
    returned."""
    a = torch.tensor([1e30, 1e20, 1e16], dtype=torch.float64)
    p = torch.igamma(a.to("tpu"), a.to("tpu")).cpu()
    q = torch.igammac(a.to("tpu"), a.to("tpu")).cpu()
    expected = 0.5 + 1 / (3 * np.sqrt(2 * np.pi * a.numpy()))
    np.testing.assert_allclose(p.numpy(), expected, rtol=1e-15)
    np.testing.assert_allclose(q.numpy(), 1 - expected, rtol=1e-15)


def test_below_the_switch_values_still_match_cpu():
    """Small a keeps JAX's functions; the edges (a == 0, infinities, NaN) stay CPU's."""
    a = torch.tensor([0.5, 1.0, 3.0, 10.0, 19.0, 0.0, 0.0, float("inf"), 2.0, float("nan")])
    x = torch.tensor([0.3, 2.0, 2.5, 12.0, 18.0, 1.0, 0.0, 5.0, float("inf"), 1.0])
    for fn in (torch.igamma, torch.igammac):
        torch.testing.assert_close(
            fn(a.to("tpu"), x.to("tpu")).cpu(), fn(a, x), equal_nan=True, rtol=2e-6, atol=1e-7
        )


@pytest.mark.parametrize("eta", [-0.29, -0.2, -0.05, 0.0, 0.01, 0.1, 0.29])
def test_the_series_of_c0_and_c1_are_their_closed_forms(eta):
    """The Taylor coefficients against c0 and c1's closed forms, at 60 digits, where
    `_c0_c1` uses the series."""
    if eta == 0:
        c0, c1 = mp.mpf(-1) / 3, mp.mpf(-1) / 540
    else:
        e = mp.mpf(eta)
        # lam - 1 from eta^2 / 2 = lam - 1 - log(lam), on eta's side of 0
        d = mp.findroot(lambda m: m - mp.log1p(m) - e * e / 2, e)
        c0 = 1 / d - 1 / e
        c1 = 1 / e**3 - 1 / d**3 - 1 / d**2 - 1 / (12 * d)
    for coefficients, exact in ((incomplete_gamma._C0, c0), (incomplete_gamma._C1, c1)):
        series = sum(mp.mpf(c) * mp.mpf(eta) ** k for k, c in enumerate(coefficients))
        assert abs(series - exact) <= 1e-15 * abs(exact)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 2e-5), (torch.float64, 1e-11)])
def test_upper_of_small_a_and_x_has_no_cancellation(dtype, tolerance):
    """Q(a, x) for a small and x <= 1.1 is near 1 - x^a / Gamma(1 + a): JAX's 1 - P lost
    it (float32 Q(0.011, 0.987) 4.8e-4 relative off, 9% at worst in this grid; CPU
    1.5e-3); the series CPU takes there (DLMF 8.7.3) holds it to 5.6e-6 (2.8e-12 in
    float64), against mpmath."""
    g = torch.Generator().manual_seed(5)
    a = torch.exp(
        torch.empty(400, dtype=torch.float64).uniform_(np.log(1e-4), np.log(1.2), generator=g)
    )
    x = torch.exp(
        torch.empty(400, dtype=torch.float64).uniform_(np.log(1e-5), np.log(1.1), generator=g)
    )
    a, x = a.to(dtype), x.to(dtype)
    got = torch.special.gammaincc(a.to("tpu"), x.to("tpu")).cpu().double()
    exact = torch.tensor(
        [
            float(mp.gammainc(ai, xi, mp.inf, regularized=True))
            for ai, xi in zip(a.tolist(), x.tolist())
        ],
        dtype=torch.float64,
    )
    assert ((got - exact).abs() / exact).max() < tolerance
