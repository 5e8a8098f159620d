"""Random sampling on tpu: distributions, ranges, seeding, and no CPU fallback."""

from __future__ import annotations

import math
import re
import warnings

import pytest
import torch
from conftest import assert_same_error, count_compiles, hold_executables

import torch_tpu
from torch_tpu.engine import predrawn

N = 20_000


@pytest.fixture(autouse=True)
def no_fallback():
    torch_tpu.metrics.reset()
    yield
    assert not torch_tpu.metrics.snapshot()["fallback_ops"]


def _stats(t):
    t = t.cpu().double()
    return t.mean().item(), t.std().item()


def test_manual_seed_repeats_and_calls_differ():
    torch.manual_seed(123)
    a, b = torch.rand(8, device="tpu").cpu(), torch.rand(8, device="tpu").cpu()
    torch.manual_seed(123)
    assert torch.equal(torch.rand(8, device="tpu").cpu(), a)
    assert not torch.equal(a, b)
    assert torch_tpu.rng.initial_seed() == 123


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_rand_uniform(dtype):
    x = torch.rand(N, device="tpu", dtype=dtype)
    assert x.dtype == dtype and x.device.type == "tpu"
    cpu = x.cpu().double()
    assert 0 <= cpu.min() and cpu.max() < 1
    mean, std = _stats(x)
    assert abs(mean - 0.5) < 0.02 and abs(std - math.sqrt(1 / 12)) < 0.02
    y = torch.empty(N, device="tpu").uniform_(-3, 5).cpu()
    assert -3 <= y.min() and y.max() < 5 and abs(y.mean() - 1) < 0.1


def test_randn_normal_and_like():
    mean, std = _stats(torch.randn(N, device="tpu"))
    assert abs(mean) < 0.05 and abs(std - 1) < 0.05
    mean, std = _stats(torch.empty(N, device="tpu").normal_(3, 2))
    assert abs(mean - 3) < 0.1 and abs(std - 2) < 0.1
    base = torch.zeros(3, 5, device="tpu")
    like = torch.randn_like(base)
    assert like.shape == (3, 5) and like.device.type == "tpu"
    assert torch.rand_like(base).cpu().lt(1).all()
    c = torch.randn(N, device="tpu", dtype=torch.complex64).cpu()
    assert abs(c.real.var() - 0.5) < 0.05 and abs(c.imag.var() - 0.5) < 0.05


def test_normal_tensor_overloads():
    means = torch.arange(4.0, device="tpu").repeat(N // 4)
    for out in (torch.normal(means, 0.5), torch.normal(means, torch.full_like(means, 0.5))):
        assert out.shape == means.shape
        diff = (out - means).cpu()
        assert abs(diff.mean()) < 0.05 and abs(diff.std() - 0.5) < 0.05
    mean, std = _stats(torch.normal(2.0, torch.full((N,), 3.0, device="tpu")))
    assert abs(mean - 2) < 0.15 and abs(std - 3) < 0.15
    mean, std = _stats(torch.normal(1.0, 2.0, (N,), device="tpu"))
    assert abs(mean - 1) < 0.1 and abs(std - 2) < 0.1


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
def test_randint_ranges(dtype):
    low = -5 if dtype != torch.uint8 else 0
    x = torch.randint(low, 7, (N,), device="tpu", dtype=dtype)
    assert x.dtype == dtype
    values = x.cpu()
    assert values.min() == low and values.max() == 6
    counts = torch.bincount(values.long() - low)
    assert counts.min() > N / len(counts) * 0.8
    assert torch.randint(3, (5,), device="tpu").cpu().lt(3).all()
    assert torch.randint_like(x, 10).cpu().lt(10).all()


def test_random_defaults_follow_dtype():
    assert torch.empty(N, device="tpu", dtype=torch.uint8).random_().cpu().max() > 250
    floats = torch.empty(N, device="tpu").random_().cpu()
    assert floats.min() >= 0 and floats.max() <= 2**24 and floats.max() > 2**23
    assert torch.equal(floats, floats.round())
    wide = torch.empty(N, device="tpu", dtype=torch.int64).random_().cpu()
    assert wide.min() >= 0 and wide.max() > 2**62
    full = torch.empty(N, device="tpu", dtype=torch.int64).random_(-(2**63), None).cpu()
    assert full.min() < -(2**62) and full.max() > 2**62
    bools = torch.empty(N, device="tpu", dtype=torch.bool).random_().cpu()
    assert 0.45 < bools.float().mean() < 0.55
    to = torch.empty(N, device="tpu", dtype=torch.int16).random_(9).cpu()
    assert to.min() == 0 and to.max() == 8


def test_randperm():
    for n, dtype in ((1, torch.int64), (100, torch.int64), (50, torch.int32), (30, torch.float32)):
        p = torch.randperm(n, device="tpu", dtype=dtype)
        assert p.dtype == dtype
        assert torch.equal(p.cpu().sort().values, torch.arange(n, dtype=dtype))
    assert not torch.equal(torch.randperm(100, device="tpu").cpu(), torch.arange(100))


def test_bernoulli_and_dropout():
    p = torch.rand(N, device="tpu")
    draws = torch.bernoulli(p).cpu()
    assert set(draws.unique().tolist()) <= {0.0, 1.0}
    assert abs(draws.mean() - p.cpu().mean()) < 0.02
    assert abs(torch.bernoulli(p, 0.3).cpu().mean() - 0.3) < 0.02
    mask = torch.empty(N, device="tpu").bernoulli_(0.25).cpu()
    assert abs(mask.mean() - 0.25) < 0.02
    assert abs(torch.empty(N, device="tpu").bernoulli_(p).cpu().mean() - p.cpu().mean()) < 0.02
    dropped = torch.nn.functional.dropout(torch.ones(N, device="tpu"), 0.4).cpu()
    kept = dropped[dropped != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 1 / 0.6))
    assert abs((dropped == 0).double().mean() - 0.4) < 0.02


def test_other_distributions():
    mean, _ = _stats(torch.empty(N, device="tpu").exponential_(2.0))
    assert abs(mean - 0.5) < 0.03
    geo = torch.empty(N, device="tpu").geometric_(0.25).cpu()
    assert geo.min() >= 1 and torch.equal(geo, geo.round()) and abs(geo.mean() - 4) < 0.2
    logn = torch.empty(N, device="tpu").log_normal_(0.0, 0.5).cpu()
    assert abs(logn.log().mean()) < 0.03 and abs(logn.log().std() - 0.5) < 0.03
    cauchy = torch.empty(N, device="tpu").cauchy_(1.0, 2.0).cpu()
    assert abs(cauchy.median() - 1) < 0.15
    assert abs(((cauchy - 1).abs() < 2).double().mean() - 0.5) < 0.03


def test_multinomial():
    probs = torch.tensor([[0.1, 0.0, 0.5, 0.4], [0.0, 1.0, 1.0, 0.0]], device="tpu")
    draws = torch.multinomial(probs, 2).cpu()
    assert draws.shape == (2, 2) and draws.dtype == torch.int64
    assert all(len(set(row.tolist())) == 2 for row in draws)
    assert set(draws[1].tolist()) == {1, 2} and 1 not in draws[0].tolist()
    many = torch.multinomial(probs[0], N, replacement=True).cpu()
    freq = torch.bincount(many, minlength=4).double() / N
    torch.testing.assert_close(freq, probs[0].cpu().double(), atol=0.02, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gamma_dirichlet_and_poisson_draw_cpus_distributions(dtype):
    """torch.distributions' Gamma, Beta, Chi2, StudentT, Dirichlet and Poisson sample
    through these three ops; they ran on the CPU (with the CPU's generator) and were
    copied over. Moments within 4 standard errors, CPU's floors and clamps, dtypes kept."""
    alpha = torch.tensor([0.3, 1.0, 4.0, 50.0], dtype=dtype)
    gamma = torch._standard_gamma(alpha.to("tpu").expand(N, 4).contiguous()).cpu()
    assert gamma.dtype == dtype and (gamma > 0).all()
    mean, var = gamma.double().mean(0), gamma.double().var(0)
    assert ((mean - alpha) / (alpha / N) ** 0.5).abs().max() < 4
    assert ((var / alpha) - 1).abs().max() < 0.1
    tiny = torch.finfo(dtype).tiny  # CPU's answer for a concentration <= 0 or NaN, too
    edge = torch.tensor([-1.0, 0.0, 1e-30, math.nan, math.inf], dtype=dtype)
    expected = torch.tensor([tiny] * 4 + [math.inf], dtype=dtype)
    assert torch.equal(torch._standard_gamma(edge.to("tpu")).cpu(), expected)
    assert torch.equal(torch._standard_gamma(edge), expected)

    concentration = torch.tensor([0.5, 1.0, 3.0], dtype=dtype)
    rows = torch._sample_dirichlet(concentration.to("tpu").expand(N, 3).contiguous()).cpu()
    assert rows.dtype == dtype
    torch.testing.assert_close(rows.double().sum(1), torch.ones(N, dtype=torch.double))
    expected_mean = concentration.double() / concentration.sum()
    assert (rows.double().mean(0) - expected_mean).abs().max() < 0.01
    small = torch._sample_dirichlet(torch.full((64, 3), 1e-3, dtype=dtype, device="tpu")).cpu()
    below_one = torch.nextafter(torch.tensor(1.0, dtype=dtype), torch.tensor(0.0, dtype=dtype))
    assert small.min() >= tiny and small.max() <= below_one  # no underflow to 0, as CPU
    # a concentration <= 0 or NaN draws the float64 floor, so its share is that floor over
    # the row's other draws: float32's floor where it underflows, a random ~1e-307 in
    # float64 (on CPU too); a row reaching NaN (an infinite concentration) gets the floor
    bad = torch.tensor([[-1.0, 1.0], [math.nan, 1.0], [math.inf, 1.0]], dtype=dtype)
    for out in (torch._sample_dirichlet(bad.to("tpu")).cpu(), torch._sample_dirichlet(bad)):
        assert (out[:2, 0] >= tiny).all() and (out[:2, 0] <= max(tiny, 1e-290)).all()
        assert (out[:2, 1] == below_one).all() and (out[2] == tiny).all()

    rate = torch.tensor([0.0, 0.5, 40.0, 1e12], dtype=dtype)
    counts = torch.poisson(rate.to("tpu").expand(N, 4).contiguous()).cpu()
    assert counts.dtype == dtype and torch.equal(counts, counts.round())
    assert (counts[:, 0] == 0).all()
    error = (counts.double().mean(0) - rate) / (rate.clamp_min(1e-9) / N) ** 0.5
    assert error[1:].abs().max() < 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_binomial_draws_cpus_distribution_and_edges(dtype):
    """torch.distributions.Binomial samples through aten::binomial, which ran on the CPU."""
    count = torch.tensor([5.0, 40.0, 1000.0, 1e6], dtype=dtype)
    prob = torch.tensor([0.3, 0.5, 0.01, 0.7], dtype=dtype)
    draws = torch.binomial(
        count.to("tpu").expand(N, 4).contiguous(), prob.to("tpu").expand(N, 4).contiguous()
    ).cpu()
    assert draws.dtype == dtype and torch.equal(draws, draws.round())
    mean, var = draws.double().mean(0), (count * prob * (1 - prob)).double()
    assert ((mean - count * prob) / (var / N) ** 0.5).abs().max() < 4
    assert ((draws.double().var(0) / var) - 1).abs().max() < 0.1
    # CPU: a negative count has no successes, p above 1 succeeds every time, NaN p gives NaN
    edge = torch.tensor([-1.0, 7.0, 7.0, 7.0, 3.0], dtype=dtype)
    p = torch.tensor([0.5, 1.0, 0.0, 1.5, math.nan], dtype=dtype)
    expected = torch.binomial(edge, p)
    assert torch.equal(expected[:4], torch.tensor([0.0, 7.0, 0.0, 7.0], dtype=dtype))
    got = torch.binomial(edge.to("tpu"), p.to("tpu")).cpu()
    assert torch.equal(got[:4], expected[:4]) and got[4].isnan() and expected[4].isnan()


def test_binomial_refuses_what_cpu_refuses():
    for count, prob in (
        (torch.tensor([3]), torch.tensor([1])),  # integer counts
        (torch.tensor([3.0]), torch.tensor([0.5], dtype=torch.float64)),  # mixed dtypes
    ):
        with pytest.raises(Exception) as on_cpu:
            torch.binomial(count, prob)
        with pytest.raises(type(on_cpu.value), match=str(on_cpu.value)[:40]):
            torch.binomial(count.to("tpu"), prob.to("tpu"))


@pytest.mark.parametrize("p", [1.5, -0.25, float("nan")])
def test_bernoulli_probability_numbers_outside_0_1_raise_as_on_cpu(eager_mode, p):
    """A probability given as a number is judged at the call, as CPU does; tpu drew with
    it (all ones for 1.5) until 2026-12-07. The same number again still raises (a
    repeat call takes the fast path)."""
    for call in (lambda t: t.bernoulli_(p), lambda t: torch.bernoulli(t, p)):
        with pytest.raises(RuntimeError) as on_cpu:
            call(torch.zeros(3))
        for _ in range(2):
            with pytest.raises(RuntimeError, match=re.escape(str(on_cpu.value))):
                call(torch.zeros(3, device="tpu"))
    torch.testing.assert_close(torch.zeros(3, device="tpu").bernoulli_(1.0).cpu(), torch.ones(3))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.complex64])
@pytest.mark.parametrize("bounds", [(0.0, float("nan")), (float("-inf"), 0.0), (0.0, 1e39)])
def test_uniform_bounds_the_dtype_cannot_hold_raise_as_on_cpu(eager_mode, dtype, bounds):
    """A NaN or infinite bound filled the tensor with NaN or inf on tpu; CPU refuses it,
    naming the bound and its C++ type ("to is out of bounds for c10::Half")."""
    assert_same_error(lambda d: torch.zeros(3, dtype=dtype, device=d).uniform_(*bounds))


def test_multinomial_of_no_samples_raises_as_on_cpu(eager_mode):
    for n in (0, -1):
        assert_same_error(lambda d, n=n: torch.multinomial(torch.tensor([0.5, 0.5], device=d), n))


def test_poisson_negative_rate_is_reported_as_on_cpu():
    with pytest.raises(RuntimeError, match="invalid Poisson rate"):
        torch.poisson(torch.tensor([1.0, -1.0]))
    with pytest.raises(RuntimeError, match="invalid Poisson rate"):
        torch.poisson(torch.tensor([1.0, -1.0], device="tpu")).cpu()  # at the next read


def test_gamma_rsample_gradient_matches_cpu():
    """Gamma.rsample's backward (`_standard_gamma_grad`) is deterministic given the draw.
    CPU's series is 2e-5 from exact at alpha 2 and 30 (against the derivative of SciPy's
    CDF); tpu's (JAX's) within 1e-9 there (differences.md)."""
    alpha = torch.tensor([0.2, 0.5, 2.0, 30.0], dtype=torch.float64)
    sample = torch.tensor([0.01, 0.3, 1.5, 28.0], dtype=torch.float64)
    ours = torch.ops.aten._standard_gamma_grad(alpha.to("tpu"), sample.to("tpu")).cpu()
    cpu = torch.ops.aten._standard_gamma_grad(alpha, sample)
    torch.testing.assert_close(ours, cpu, rtol=5e-5, atol=0)
    concentration = torch.tensor([2.0, 0.5], device="tpu", requires_grad=True)
    torch.distributions.Gamma(concentration, 1.0).rsample((100,)).sum().backward()
    assert concentration.grad.device.type == "tpu" and torch.isfinite(concentration.grad).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_float_random_stays_below_to(dtype):
    """A float16 draw of 2999 rounds to 3000: CPU draws below `to` moved to a value the
    dtype holds; tpu gave `to` itself."""
    for args in ((3000,), (-3000, 3000), (100, 32752)):
        expected = torch.empty(N, dtype=dtype).random_(*args)
        values = torch.empty(N, dtype=dtype, device="tpu").random_(*args).cpu()
        assert values.max() < args[-1]
        assert values.max() <= expected.max() + 0 and values.min() >= expected.min()
        assert torch.equal(values, values.round())


def _checkpointed_dropout_step(reentrant: bool, compiled: bool) -> tuple[torch.Tensor, ...]:
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    linear = torch.nn.Linear(16, 16).to("tpu")
    x = torch.randn(8, 16, device="tpu", requires_grad=True)

    def block(x):
        return torch.nn.functional.dropout(linear(x), 0.5, True).relu()

    def step(x):
        return checkpoint(block, x, use_reentrant=reentrant)

    if compiled:
        step = torch.compile(step, backend="tpu")
    torch.manual_seed(1)
    y = step(x)
    weights = torch.arange(16.0, device="tpu")
    (y * weights).sum().backward()
    return y.detach(), x.grad, linear.weight.detach(), weights


def _assert_follows_the_forwards_mask(reentrant: bool, compiled: bool) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the RNG-state graphs run op by op: a warning)
        y, grad, weight, weights = _checkpointed_dropout_step(reentrant, compiled)
    kept = (y != 0).float()
    assert 0 < kept.mean().item() < 1
    expected = (kept * weights * 2) @ weight  # dropout(p=0.5) scales what it keeps by 2
    torch.testing.assert_close(grad.cpu(), expected.cpu())


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non_reentrant"])
def test_checkpoint_recomputes_dropout_with_the_forwards_mask(eager_mode, reentrant):
    """torch.utils.checkpoint replays the forward in backward with the RNG state it
    saved: the gradient must follow the forward's dropout mask. It saved tpu's state
    only when `torch.tpu._initialized` said so (it was missing: a new mask, silently
    wrong gradients)."""
    _assert_follows_the_forwards_mask(reentrant, compiled=False)


def test_compiled_checkpoint_recomputes_dropout_with_the_forwards_mask():
    """Compiled, AOTAutograd wraps the recomputed dropout in PyTorch's RNG-state
    operators, which had no tpu kernel (AssertionError: Backend not supported)."""
    _assert_follows_the_forwards_mask(reentrant=False, compiled=True)


# (op, dtypes): every op that takes predrawn bits in strict and debug modes (engine/predrawn)
_ELEMENTWISE_DRAWS = [
    (lambda t: t.uniform_(-2, 3), (torch.float32, torch.float16, torch.bfloat16, torch.float64)),
    (lambda t: t.normal_(1, 2), (torch.float32, torch.bfloat16, torch.float64, torch.float16)),
    (lambda t: t.log_normal_(), (torch.float32,)),
    (lambda t: t.exponential_(2), (torch.float32, torch.float16)),
    (lambda t: t.cauchy_(), (torch.float32,)),
    (lambda t: t.geometric_(0.3), (torch.float32, torch.int64)),
    (lambda t: t.bernoulli_(0.4), (torch.float32, torch.bool)),
    (lambda t: t.random_(), (torch.int64, torch.uint8, torch.float16, torch.bool, torch.int8)),
    (lambda t: t.random_(-5, 100), (torch.int64, torch.int32, torch.float32)),
    (lambda t: t.random_(50), (torch.int16, torch.bfloat16)),
]


def _draws(fill, dtype, shapes) -> list[torch.Tensor]:
    torch.manual_seed(11)
    return [fill(torch.empty(shape, dtype=dtype, device="tpu")).cpu() for shape in shapes]


@pytest.mark.parametrize("case", range(len(_ELEMENTWISE_DRAWS)))
def test_predrawn_bits_keep_the_random_stream(monkeypatch, case):
    """In strict and debug modes an elementwise draw takes its bits from a program per
    size bucket: the values must be the bits its own draw gives (the fused mode's, and
    the strict mode's without predrawn bits), call after call; a changed stream would
    change every seeded program's results."""
    from torch_tpu import cache
    from torch_tpu.engine import predrawn

    hold_executables(monkeypatch)
    fill, dtypes = _ELEMENTWISE_DRAWS[case]
    shapes = [(3, 5, 2), (3, 5, 2), (7,), (1, 1), (2, 70), (150,), (0, 3)]
    served = []
    bits, serves = predrawn.bits, predrawn.serves
    monkeypatch.setattr(predrawn, "bits", lambda *a: served.append(1) or bits(*a))
    for dtype in dtypes:
        with torch.tpu.set_eager_mode("fused"):
            expected = _draws(fill, dtype, shapes)
        for mode in ("strict", "debug"):
            with torch.tpu.set_eager_mode(mode):
                served.clear()
                drawn = _draws(fill, dtype, shapes)
                assert len(served) == len(shapes) - 1  # (nothing to draw for no elements)
                monkeypatch.setattr(predrawn, "serves", lambda n: False)
                cache.forget_lookups()  # (each executable takes one kind of rng input)
                own = _draws(fill, dtype, shapes)
                monkeypatch.setattr(predrawn, "serves", serves)
                cache.forget_lookups()
            for a, b, c in zip(drawn, own, expected):
                assert torch.equal(a.view(-1).view(torch.uint8), c.view(-1).view(torch.uint8))
                assert torch.equal(b.view(-1).view(torch.uint8), c.view(-1).view(torch.uint8))
        assert not torch.equal(expected[0], expected[1])  # successive calls still differ


def test_new_sizes_share_one_generator_program(monkeypatch):
    """Sizes never seen before (a test's tensors, data-dependent sizes) each compile
    only what turns bits into values; threefry's generator, which XLA compiles 3-5x
    slower, is compiled once for all the sizes of its bucket and every op and dtype."""
    programs = count_compiles(monkeypatch)
    torch.manual_seed(0)
    sizes = [(33, 3), (101,), (7, 7, 2), (120,), (5, 21)]  # all in one bucket
    with torch.tpu.set_eager_mode("strict"):
        for size in sizes:
            values = torch.randint(3, 9, size, device="tpu").cpu()
            assert values.min() >= 3 and values.max() < 9
            assert values.unique().numel() == 6
            assert torch.rand(size, device="tpu", dtype=torch.float64).unique().numel() > 90
    generators = [name for name in programs if name.startswith("rng")]
    bucket = f"rng bits {predrawn.bucket_size(120)}"
    assert {predrawn.bucket_size(math.prod(size)) for size in sizes} == {predrawn.bucket_size(120)}
    assert set(generators) <= {bucket} and len(generators) <= 1, generators


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_rrelu_training_draws_slopes_and_keeps_them_for_backward(dtype):
    """Each input <= 0 (-0.0 and 0.0 included, as CPU) gets a slope from [lower, upper),
    recorded in noise; positive inputs pass with noise 1; the gradient is the noise."""
    x = torch.cat([-torch.rand(N) - 0.01, torch.tensor([0.0, -0.0]), torch.rand(100) + 0.01])
    x = x.to(dtype).to("tpu").requires_grad_()
    noise = torch.full_like(x, 7.0).detach()
    out = torch.ops.aten.rrelu_with_noise(x, noise, 0.1, 0.3, True)
    out.sum().backward()
    noise, out, x, grad = noise.cpu(), out.detach().cpu(), x.detach().cpu(), x.grad.cpu()
    down = x <= 0
    assert out.dtype == noise.dtype == dtype
    assert torch.equal(out[~down], x[~down]) and bool((noise[~down] == 1).all())
    slopes = noise[down].double()
    assert slopes.min() >= 0.1 - 1e-3 and slopes.max() <= 0.3 + 1e-3
    assert abs(slopes.mean().item() - 0.2) < 0.005 and abs(slopes.std().item() - 0.0577) < 0.005
    torch.testing.assert_close(out[down], (x[down].double() * slopes).to(dtype))
    assert torch.equal(grad, noise)


def test_rrelu_eval_is_leaky_relu_with_the_mean_slope_and_leaves_noise():
    x = torch.tensor([-2.0, -0.0, 0.0, 1.0, -1.0, float("-inf"), float("nan")])
    noise = torch.full((7,), 7.0)
    expected = torch.ops.aten.rrelu_with_noise(x, noise.clone(), 0.1, 0.3, False)
    tpu_noise = noise.to("tpu")
    got = torch.ops.aten.rrelu_with_noise(x.to("tpu"), tpu_noise, 0.1, 0.3, False)
    torch.testing.assert_close(got.cpu(), expected, equal_nan=True)
    assert torch.equal(got.cpu().signbit(), expected.signbit())
    assert torch.equal(tpu_noise.cpu(), noise)
    module = torch.nn.RReLU(0.05, 0.25).eval()
    torch.testing.assert_close(module(x.to("tpu")).cpu(), module(x), equal_nan=True)


def test_rrelu_refuses_as_cpu():
    x = torch.tensor([-2.0, 1.0, -1.0])
    cases = [
        (x.long(), torch.zeros(3, dtype=torch.long), 0.1, 0.3, True),
        (x.long(), torch.zeros(3, dtype=torch.long), 0.1, 0.3, False),
        (x, torch.zeros(3, dtype=torch.float64), 0.1, 0.3, True),
        (x, torch.zeros(3, 1), 0.1, 0.3, True),
        (x, torch.zeros(2), 0.1, 0.3, False),
        (x, torch.zeros(3), 0.5, 0.3, True),  # (after a call with other bounds, below)
    ]
    torch.ops.aten.rrelu_with_noise(x.to("tpu"), torch.zeros(3, device="tpu"), 0.1, 0.3, True)
    for args in cases:
        with pytest.raises((RuntimeError, NotImplementedError)) as on_cpu:
            torch.ops.aten.rrelu_with_noise(*args)
        on_tpu = [a.to("tpu") if isinstance(a, torch.Tensor) else a for a in args]
        with pytest.raises(on_cpu.type) as raised:
            torch.ops.aten.rrelu_with_noise(*on_tpu)
        assert str(raised.value) == str(on_cpu.value), args
