"""Optimizers and the `_foreach_*` family on tpu against the CPU: every optimizer and
variant in strict, fused and compiled mode, GradScaler's arguments of the fused
steps, and the foreach ops one by one. Nothing here may take the CPU fallback."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import assert_same, to_cpu, to_tpu

import torch_tpu
from torch_tpu import metrics

SHAPES = [(3, 4), (3,), (2, 3), (), (5,)]
STEPS = 3


@pytest.fixture(autouse=True)
def _nothing_falls_back():
    torch._dynamo.reset()  # compiled steps of earlier tests must not count toward limits
    metrics.reset()
    yield
    fell = metrics.snapshot()["fallback_ops"]
    assert not fell, f"ops fell back to the CPU: {sorted(fell)}"


# ------------------------------------------------------------------ optimizers

CONFIGS = {
    "adam": (torch.optim.Adam, {"lr": 0.1}),
    "adam_amsgrad_weight_decay": (
        torch.optim.Adam,
        {"lr": 0.1, "amsgrad": True, "weight_decay": 0.1},
    ),
    "adam_maximize_small_beta1": (  # beta1 < 0.5: lerp's other formula
        torch.optim.Adam,
        {"lr": 0.1, "maximize": True, "betas": (0.3, 0.9)},
    ),
    "adamw": (torch.optim.AdamW, {"lr": 0.1, "weight_decay": 0.1}),
    "adamw_amsgrad_maximize": (
        torch.optim.AdamW,
        {"lr": 0.1, "amsgrad": True, "maximize": True},
    ),
    "sgd": (torch.optim.SGD, {"lr": 0.1}),
    "sgd_momentum_dampening_weight_decay": (
        torch.optim.SGD,
        {"lr": 0.1, "momentum": 0.9, "dampening": 0.2, "weight_decay": 0.01},
    ),
    "sgd_nesterov_maximize": (
        torch.optim.SGD,
        {"lr": 0.1, "momentum": 0.9, "nesterov": True, "maximize": True},
    ),
    "adagrad": (torch.optim.Adagrad, {"lr": 0.1, "lr_decay": 0.01, "weight_decay": 0.1}),
    "adagrad_maximize": (
        torch.optim.Adagrad,
        {"lr": 0.1, "maximize": True, "initial_accumulator_value": 0.1},
    ),
    "rmsprop": (torch.optim.RMSprop, {"lr": 0.01}),
    "rmsprop_centered_momentum": (
        torch.optim.RMSprop,
        {"lr": 0.01, "centered": True, "momentum": 0.9, "weight_decay": 0.1, "maximize": True},
    ),
}
# PyTorch has fused kernels (CPU ones too: the oracle) for these
FUSED = (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD, torch.optim.Adagrad)
CASES = [(name, impl) for name in CONFIGS for impl in ("foreach", "fused")]
CASES = [(n, i) for n, i in CASES if i == "foreach" or CONFIGS[n][0] in FUSED]


def _params(device, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return [
        torch.randn(s, generator=g, dtype=torch.float32).to(dtype).to(device).requires_grad_()
        for s in SHAPES
    ]


def _grads(step: int, dtype=torch.float32):
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(s, generator=g).to(dtype) for s in SHAPES]


def _train(device, cls, kwargs, mode="strict", steps=STEPS, dtype=torch.float32, before=None):
    """Parameters after each step and the optimizer, with fixed gradients per step."""
    params = _params(device, dtype)
    opt = cls(params, **kwargs)
    step = torch.compile(lambda: opt.step(), backend="tpu") if mode == "compiled" else opt.step
    history = []
    eager = "fused" if mode == "fused" else "strict"
    with torch.tpu.set_eager_mode(eager):
        for k in range(steps):
            for p, g in zip(params, _grads(k, dtype)):
                p.grad = g.to(device)
            if before is not None:
                before(opt, k)
            step()
            history.append([p.detach().cpu().clone() for p in params])  # (a CPU copy)
    return history, opt


def _assert_state_same(opt, cpu_opt, **tol):
    for p, q in zip(opt.param_groups[0]["params"], cpu_opt.param_groups[0]["params"]):
        state, expected = opt.state[p], cpu_opt.state[q]
        assert state.keys() == expected.keys()
        for key, value in expected.items():
            if isinstance(value, torch.Tensor):
                torch.testing.assert_close(state[key].cpu(), value, **tol, msg=key)
            else:
                assert state[key] == value, key


# compiled: one Dynamo trace per optimizer variant (slow on 2 cores); CI keeps compiled
# optimizer steps through the compiled-step tests below, the full run compiles every case
@pytest.mark.parametrize(
    "mode", ["strict", "fused", pytest.param("compiled", marks=pytest.mark.slow)]
)
@pytest.mark.parametrize("name,impl", CASES, ids=[f"{n}-{i}" for n, i in CASES])
def test_optimizer_matches_cpu(name, impl, mode):
    if mode == "compiled" and impl == "fused" and name != "adamw":
        pytest.skip("PyTorch keeps Dynamo out of fused steps (they run eagerly): adamw shows it")
    cls, kwargs = CONFIGS[name]
    kwargs = {**kwargs, impl: True}
    expected, cpu_opt = _train("cpu", cls, kwargs)
    metrics.reset()
    actual, opt = _train("tpu", cls, kwargs, mode)
    snapshot = metrics.snapshot()
    for k, (ours, theirs) in enumerate(zip(actual, expected)):
        torch.testing.assert_close(ours, theirs, msg=lambda m, k=k: f"step {k + 1}: {m}")
    _assert_state_same(opt, cpu_opt)
    assert snapshot.get("cpu_fallbacks", 0) == 0
    assert snapshot.get("compiled_graphs_run_eagerly", 0) == 0
    if mode == "compiled" and impl == "foreach":
        assert snapshot.get("compiled_graph_calls", 0) >= STEPS


def test_foreach_optimizer_step_runs_one_op_per_foreach_call():
    """The point of lowering the family: one dispatch per foreach call, not one per
    parameter (PyTorch's generic kernel loops over the tensors)."""
    params = _params("tpu")
    opt = torch.optim.SGD(params, lr=0.1, foreach=True)
    for p, g in zip(params, _grads(0)):
        p.grad = g.to("tpu")
    metrics.reset()
    opt.step()
    assert metrics.snapshot()["ops_dispatched"] == 1  # _foreach_add_(params, grads, alpha)


def test_compiled_foreach_step_runs_no_eager_op():
    params = _params("tpu")
    opt = torch.optim.Adam(params, lr=0.1, foreach=True)
    step = torch.compile(lambda: opt.step(), backend="tpu")
    for k in range(STEPS):
        for p, g in zip(params, _grads(k)):
            p.grad = g.to("tpu")
        metrics.reset()
        step()
    snapshot = metrics.snapshot()
    assert snapshot.get("ops_dispatched", 0) == 0, snapshot
    assert snapshot["compiled_graph_calls"] >= 1


@pytest.mark.parametrize("impl", ["foreach", "fused"])
def test_changing_hyperparameters_do_not_recompile(impl):
    """lr, betas and the bias corrections change every step (a scheduler, Adam's own
    step count); they are run-time values of the executables, not constants."""

    def schedule(opt, k):
        opt.param_groups[0]["lr"] = 0.1 / (k + 1)
        opt.param_groups[0]["betas"] = (0.9 - 0.01 * k, 0.999)

    kwargs = {"lr": 0.1, "weight_decay": 0.1, impl: True}
    expected, _ = _train("cpu", torch.optim.AdamW, kwargs, steps=5, before=schedule)

    compiles = []

    def schedule_and_count(opt, k):
        schedule(opt, k)
        compiles.append(metrics.snapshot().get("compiles", 0))

    actual, _ = _train(
        "tpu", torch.optim.AdamW, kwargs, steps=5, before=schedule_and_count
    )
    torch.testing.assert_close(actual, expected)
    assert compiles[2:] == [compiles[2]] * 3, compiles  # nothing compiled after step 2


@pytest.mark.parametrize("cls", FUSED, ids=lambda c: c.__name__)
@pytest.mark.parametrize("found_inf", [0.0, 1.0])
def test_fused_step_with_grad_scaler_arguments(cls, found_inf):
    """GradScaler hands fused optimizers grad_scale and found_inf: the gradients are
    unscaled in place, and found_inf == 1 skips the step (steps counted back)."""

    def scaler(device):
        def before(opt, k):
            opt.grad_scale = torch.tensor(4.0, device=device)
            opt.found_inf = torch.tensor(found_inf if k == 1 else 0.0, device=device)

        return before

    kwargs = {"lr": 0.1, "weight_decay": 0.1, "fused": True}
    if cls is torch.optim.SGD:
        kwargs["momentum"] = 0.9
    expected, cpu_opt = _train("cpu", cls, kwargs, before=scaler("cpu"))
    actual, opt = _train("tpu", cls, kwargs, before=scaler("tpu"))
    torch.testing.assert_close(actual, expected)
    _assert_state_same(opt, cpu_opt)
    for p, q in zip(opt.param_groups[0]["params"], cpu_opt.param_groups[0]["params"]):
        torch.testing.assert_close(p.grad.cpu(), q.grad)  # unscaled (or not) alike
    if found_inf:
        assert torch.equal(actual[1][0], actual[0][0])  # the skipped step changed nothing


@pytest.mark.parametrize("shape", [(), (1,), (1, 1)], ids=["0d", "1d", "2d"])
@pytest.mark.parametrize("cls", FUSED, ids=lambda c: c.__name__)
def test_fused_step_with_tensor_lr(cls, shape):
    """A CPU tensor lr of one element, which torch.optim leaves on the CPU for a fused
    step and CUDA's fused kernels read as a number (shapes [1] and [1, 1] raised the
    mixed-device error on tpu; PyTorch's test_optim test_tensor_lr)."""
    kwargs = {"lr": torch.tensor(0.05).reshape(shape), "fused": True}
    expected, _ = _train("cpu", cls, kwargs)
    actual, _ = _train("tpu", cls, {**kwargs, "lr": torch.tensor(0.05).reshape(shape)})
    torch.testing.assert_close(actual, expected)


@pytest.mark.parametrize("cls", FUSED, ids=lambda c: c.__name__)
def test_fused_step_in_bfloat16(cls):
    """Half-precision parameters step in float32 (the CPU kernel's op-math) and are
    stored rounded."""
    kwargs = {"lr": 0.1, "fused": True}
    expected, _ = _train("cpu", cls, kwargs, dtype=torch.bfloat16)
    actual, _ = _train("tpu", cls, kwargs, dtype=torch.bfloat16)
    torch.testing.assert_close(actual, expected, atol=1e-2, rtol=1e-2)


def _fused_adam_args(device, amsgrad):
    g = torch.Generator().manual_seed(3)
    lists = [[torch.randn(s, generator=g).to(device) for s in SHAPES] for _ in range(4)]
    params, grads, avgs, sqs = lists
    sqs = [s.abs() for s in sqs]
    maxes = [s * 1.5 for s in sqs] if amsgrad else []
    steps = [torch.tensor(2.0).to(device) for _ in SHAPES]
    return params, grads, avgs, sqs, maxes, steps


def test_fused_adam_op_checks_list_lengths():
    args = list(_fused_adam_args("tpu", True))
    args[3] = args[3][:-1]
    with pytest.raises(RuntimeError):
        torch._fused_adam_(
            *args, lr=0.1, beta1=0.9, beta2=0.99, weight_decay=0.0, eps=1e-8,
            amsgrad=True, maximize=False,
        )  # fmt: skip


def test_compiled_graph_with_the_fused_op_lowers_it():
    """PyTorch keeps Dynamo out of its own fused optimizers (they run eagerly, as one
    op); code calling the op itself gets the functional `_fused_adamw` in its graph."""

    def step(params, grads, avgs, sqs, maxes, steps):
        torch._fused_adamw_(
            params, grads, avgs, sqs, maxes, steps, lr=0.1, beta1=0.9, beta2=0.99,
            weight_decay=0.1, eps=1e-8, amsgrad=True, maximize=False,
        )  # fmt: skip

    expected = _fused_adam_args("cpu", True)
    step(*expected)
    actual = _fused_adam_args("tpu", True)
    torch.compile(step, backend="tpu")(*actual)
    assert metrics.snapshot().get("compiled_graph_calls", 0) == 1
    assert metrics.snapshot().get("compiled_graphs_run_eagerly", 0) == 0
    torch.testing.assert_close([[t.cpu() for t in ts] for ts in actual], list(expected))


def _mlp(device):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    return model.to(device)


@pytest.mark.parametrize("impl", ["foreach", "fused"])
def test_compiled_training_step_forward_backward_and_step(impl):
    def run(device, compiled):
        model = _mlp(device)
        opt = torch.optim.AdamW(model.parameters(), lr=0.05, **{impl: True})
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(1)).to(device)

        def train_step():
            opt.zero_grad()
            loss = model(x).square().mean()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5, foreach=True)
            opt.step()
            return loss

        step = torch.compile(train_step, backend="tpu") if compiled else train_step
        losses = [step().item() for _ in range(STEPS)]
        return losses, [p.detach().cpu() for p in model.parameters()]

    expected_losses, expected = run("cpu", False)
    losses, actual = run("tpu", True)
    assert losses == pytest.approx(expected_losses, rel=1e-5)
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-4)
    assert metrics.snapshot().get("compiled_graphs_run_eagerly", 0) == 0


@pytest.mark.parametrize("mode", ["strict", "fused", "compiled"])
def test_clip_grad_norm_foreach(mode):
    def clip(*grads):
        params = [torch.zeros_like(g, requires_grad=True) for g in grads]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        norm = torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        return norm, [p.grad for p in params]

    grads = _grads(0)
    if mode == "compiled":
        assert_same(torch.compile(clip, backend="tpu"), *grads)
        assert metrics.snapshot().get("compiled_graphs_run_eagerly", 0) == 0
    else:
        with torch.tpu.set_eager_mode(mode):
            assert_same(clip, *grads)


class Lion(torch.optim.Optimizer):
    """A user optimizer written with `_foreach_*` calls (the Lion update)."""

    def __init__(self, params, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1):
        super().__init__(params, {"lr": lr, "betas": betas, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            grads = [p.grad for p in params]
            avgs = [self.state[p].setdefault("exp_avg", torch.zeros_like(p)) for p in params]
            beta1, beta2 = group["betas"]
            torch._foreach_mul_(params, 1 - group["lr"] * group["weight_decay"])
            update = torch._foreach_lerp(avgs, grads, 1 - beta1)
            torch._foreach_sign_(update)
            torch._foreach_add_(params, update, alpha=-group["lr"])
            torch._foreach_lerp_(avgs, grads, 1 - beta2)


@pytest.mark.parametrize("mode", ["strict", "fused", "compiled"])
def test_user_optimizer_written_with_foreach_ops(mode):
    expected, cpu_opt = _train("cpu", Lion, {})
    actual, opt = _train("tpu", Lion, {}, mode)
    torch.testing.assert_close(actual, expected)
    _assert_state_same(opt, cpu_opt)
    assert metrics.snapshot().get("compiled_graphs_run_eagerly", 0) == 0


# ------------------------------------------------------------- foreach ops


def _tensors(dtype=torch.float32, low=None, seed=0):
    """A list of mixed shapes (a scalar tensor, an empty one among them)."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(3, 4), (), (0,), (5,)]
    if dtype.is_floating_point:
        out = [torch.randn(s, generator=g, dtype=dtype) for s in shapes]
        return [t.abs() + low for t in out] if low is not None else out
    return [torch.randint(-5, 6, s, generator=g, dtype=dtype) for s in shapes]


def _inplace(op):
    """The in-place op on copies, returning them: what an in-place call leaves behind."""

    def fn(*lists_and_args):
        lists = [
            [t.clone() if isinstance(t, torch.Tensor) else t for t in x]
            if isinstance(x, list)
            else x
            for x in lists_and_args
        ]
        op(*lists)
        return lists[0]

    return fn


UNARY = {
    "abs": None, "acos": "unit", "asin": "unit", "atan": None, "ceil": None, "cos": None,
    "cosh": None, "erf": None, "erfc": None, "exp": None, "expm1": None, "floor": None,
    "frac": None, "lgamma": "positive", "log": "positive", "log10": "positive",
    "log1p": "positive", "log2": "positive", "neg": None, "reciprocal": "positive",
    "round": None, "rsqrt": "positive", "sigmoid": None, "sign": None, "sin": None,
    "sinh": None, "sqrt": "positive", "tan": None, "tanh": None, "trunc": None, "zero": None,
}  # fmt: skip


def _unary_input(domain):
    if domain == "positive":
        return _tensors(low=0.1)
    if domain == "unit":
        return [t.clamp(-0.9, 0.9) for t in _tensors()]
    return _tensors()


@pytest.mark.parametrize("name", sorted(UNARY))
def test_foreach_unary(name):
    tensors = _unary_input(UNARY[name])
    if name != "zero":
        functional = getattr(torch, f"_foreach_{name}")
        assert_same(lambda ts: functional(ts), tensors)
    assert_same(_inplace(getattr(torch, f"_foreach_{name}_")), tensors)


BINARY = ["add", "sub", "mul", "div", "maximum", "minimum", "clamp_min", "clamp_max", "pow"]


def _other_kinds(name):
    """(label, second argument) for each overload: Scalar (int and float), ScalarList,
    List, 0-dim Tensor where the op has one."""
    positive = name == "pow"
    others = _tensors(low=0.5 if positive else None, seed=1)
    out = [
        ("int", 2),
        ("float", 1.5),
        ("scalar_list", [2, -0.5, 3.0, 1]),
        ("list", others),
    ]
    if name in ("add", "mul", "div"):
        out.append(("tensor", torch.tensor(2.5)))
    return out


@pytest.mark.parametrize("name", BINARY)
def test_foreach_binary(name, eager_mode):
    functional = getattr(torch, f"_foreach_{name}")
    inplace = getattr(torch, f"_foreach_{name}_")
    base = _tensors(low=0.5) if name == "pow" else _tensors()
    for label, other in _other_kinds(name):
        assert_same(lambda ts, o: functional(ts, o), base, other)
        assert_same(_inplace(inplace), base, other)
        if name in ("add", "sub") and label in ("list", "tensor"):
            assert_same(lambda ts, o: functional(ts, o, alpha=-2), base, other)


def test_foreach_binary_promotes_like_cpu():
    """Integer lists with float scalars, mixed-dtype lists, int and float scalar lists."""
    ints = _tensors(torch.int64)
    mixed = [torch.randn(3), torch.arange(4), torch.randn(2, dtype=torch.float64), torch.ones(2)]
    mixed[-1] = mixed[-1].to(torch.bfloat16)
    assert_same(lambda ts: torch._foreach_add(ts, 1.5), ints)
    assert_same(lambda ts: torch._foreach_div(ts, 2), ints)
    assert_same(lambda ts: torch._foreach_mul(ts, [1, 2.5, 3, True]), ints)
    assert_same(lambda ts: torch._foreach_mul(ts, torch.tensor(0.5)), ints)
    assert_same(lambda ts: torch._foreach_mul(ts, 2.5), mixed)
    assert_same(lambda ts: torch._foreach_add(ts, ts), mixed)
    assert_same(_inplace(torch._foreach_add_), ints, 3)
    assert_same(lambda ts: torch._foreach_pow(2, ts), ints[:1] + [t.abs() for t in ints[1:]])


def test_foreach_in_place_keeps_cpu_errors():
    ints = to_tpu(_tensors(torch.int64))
    with pytest.raises(RuntimeError):
        torch._foreach_add_(_tensors(torch.int64), 1.5)  # the CPU refuses too
    with pytest.raises(RuntimeError):
        torch._foreach_add_(ints, 1.5)
    with pytest.raises(RuntimeError):
        torch._foreach_add(ints, ints[:2])
    with pytest.raises(RuntimeError):
        torch._foreach_mul(ints, [1.0, 2.0])


@pytest.mark.parametrize("name", ["addcmul", "addcdiv"])
def test_foreach_ternary(name, eager_mode):
    functional = getattr(torch, f"_foreach_{name}")
    inplace = getattr(torch, f"_foreach_{name}_")
    a, b, c = _tensors(), _tensors(seed=1), _tensors(low=0.5, seed=2)
    for value in (2, -0.5, [1, 2.0, -3, 0.5]):
        assert_same(lambda x, y, z, v: functional(x, y, z, v), a, b, c, value)
        assert_same(_inplace(inplace), a, b, c, value)


def test_foreach_lerp(eager_mode):
    a, b = _tensors(), _tensors(seed=1)
    weights = [torch.rand(t.shape, generator=torch.Generator().manual_seed(2)) for t in a]
    for weight in (0.3, 0.7, [0.1, 0.9, 0.5, 0.6], weights):
        assert_same(lambda x, y, w: torch._foreach_lerp(x, y, w), a, b, weight)
        assert_same(_inplace(torch._foreach_lerp_), a, b, weight)


def test_foreach_nan_propagation():
    nan = [torch.tensor([math.nan, 1.0, -2.0]), torch.tensor([3.0, math.nan])]
    other = [torch.tensor([0.0, math.nan, 5.0]), torch.tensor([math.nan, 1.0])]
    for name in ("maximum", "minimum", "clamp_min", "clamp_max"):
        op = getattr(torch, f"_foreach_{name}")
        assert_same(op, nan, other)
        assert_same(op, nan, 0.5)
        assert_same(op, other, math.nan)


def test_foreach_reductions_and_others(eager_mode):
    tensors = [t for t in _tensors() if t.numel()]  # max of an empty tensor is an error
    assert_same(lambda ts: torch._foreach_max(ts), tensors)
    assert_same(lambda ts: torch._foreach_norm(ts, 1), tensors)
    assert_same(lambda ts: torch._foreach_clone(ts), tensors)
    mats = [torch.randn(2, 3), torch.randn(4, 1)]
    assert_same(lambda a, b: torch._foreach_mm(a, b), mats, [torch.randn(3, 2), torch.randn(1, 3)])
    assert_same(_inplace(torch._foreach_copy_), tensors, [t * 2 for t in tensors])


def _outcome(fn):
    try:
        return [t.cpu() for t in fn()]
    except Exception as error:  # noqa: BLE001  (the CPU's exception type is the oracle)
        return type(error)


def test_foreach_empty_lists_behave_as_on_cpu():
    """PyTorch refuses empty tensor lists; a 0-dim tensor routes the call to tpu."""
    for fn in (
        lambda two: torch._foreach_add([], two),
        lambda two: torch._foreach_mul_([], two) or [],
        lambda two: torch._foreach_add([two], []),
        lambda two: torch._foreach_add([two], [2.0, 3.0]),
    ):
        expected = _outcome(lambda fn=fn: fn(torch.tensor(2.0)))
        actual = _outcome(lambda fn=fn: fn(torch.tensor(2.0, device="tpu")))
        if isinstance(expected, type):
            assert actual is expected
        else:
            torch.testing.assert_close(actual, expected)


def test_foreach_op_is_one_dispatch():
    tensors = to_tpu(_tensors())
    metrics.reset()
    torch._foreach_addcmul_(tensors, tensors, tensors, [1.0, 2.0, 3.0, 4.0])
    assert metrics.snapshot()["ops_dispatched"] == 1


def test_foreach_ops_in_a_compiled_graph():
    def fn(a, b):
        x = torch._foreach_add(a, b, alpha=0.5)
        torch._foreach_mul_(x, [1.0, 2.0, 3.0, 4.0])
        y = torch._foreach_addcdiv(x, a, torch._foreach_add(torch._foreach_abs(b), 1), 0.1)
        torch._foreach_copy_(a, y)
        torch._foreach_zero_(b)
        return y, torch._foreach_sqrt(torch._foreach_abs(a)), torch._foreach_norm(y)

    a, b = _tensors(), _tensors(seed=1)
    tpu_a, tpu_b = to_tpu(a), to_tpu(b)
    expected = fn(a, b)
    actual = torch.compile(fn, backend="tpu")(tpu_a, tpu_b)
    torch.testing.assert_close(to_cpu(actual), expected)
    torch.testing.assert_close(to_cpu([tpu_a, tpu_b]), [a, b])  # the mutated inputs
    snapshot = metrics.snapshot()
    assert snapshot.get("compiled_graphs_run_eagerly", 0) == 0
    assert snapshot.get("compiled_graph_calls", 0) == 1


def test_inventory_reports_foreach_and_fused_as_lowered():
    from torch_tpu.engine.kernels import KERNELS

    for name in (
        "_foreach_add_.Scalar", "_foreach_addcdiv_.ScalarList", "_foreach_lerp_.List",
        "_foreach_sqrt_.default", "_foreach_pow.ScalarAndTensor", "_fused_adam_.default",
        "_fused_adamw_.tensor_lr", "_fused_sgd_.default", "_fused_adagrad_.default",
    ):  # fmt: skip
        assert KERNELS.get(name) in ("lowered", "derived"), name
    assert torch_tpu.ops.registry.LOWERINGS["_fused_adam.default"].runtime_floats


_FOREACH_REFUSALS = {
    "sub_true": lambda ts: torch._foreach_sub(ts, True),
    "sub_scalar_list_with_true": lambda ts: torch._foreach_sub(ts, [1.0, True]),
    "sub_in_place_true": lambda ts: torch._foreach_sub_([t.clone() for t in ts], True),
    "add_bool_alpha": lambda ts: torch._foreach_add(ts, ts, alpha=True),
    "add_complex_alpha": lambda ts: torch._foreach_add(ts, ts, alpha=1j),
    "add_ints_float_alpha": lambda ts: torch._foreach_add(*[[t.long() for t in ts]] * 2, alpha=0.5),
    "clamp_min_complex": lambda ts: torch._foreach_clamp_min(ts, 1j),
    "maximum_complex_list": lambda ts: torch._foreach_maximum(ts, [1.0, 2j]),
}


@pytest.mark.parametrize("case", list(_FOREACH_REFUSALS), ids=str)
def test_foreach_refuses_what_the_per_tensor_op_refuses(case):
    """CPU's foreach kernels call the per-tensor op, whose argument checks (alpha's type,
    subtracting a bool) tpu's foreach lowerings skipped: they computed an answer."""
    fn = _FOREACH_REFUSALS[case]
    tensors = [torch.ones(3), torch.ones(2, 2)]
    with pytest.raises(RuntimeError) as cpu_error:
        fn(tensors)
    with pytest.raises(RuntimeError) as tpu_error:
        fn(to_tpu(tensors))
    assert type(tpu_error.value) is type(cpu_error.value)
    assert str(tpu_error.value) == str(cpu_error.value)


_FOREACH_IN_PLACE_CASTS = {
    "ints_mul_float": lambda d: torch._foreach_mul_([torch.tensor([3, 5], device=d)], 0.5),
    "ints_mul_float_list": lambda d: torch._foreach_mul_([torch.tensor([3, 5], device=d)], [0.5]),
    "floats_add_complex": lambda d: torch._foreach_add_([torch.ones(2, device=d)], 1 + 2j),
    "mixed_mul_float": lambda d: torch._foreach_mul_(
        [torch.ones(2, device=d), torch.tensor([3, 5], device=d)], 0.5
    ),
    "ints_div_ints": lambda d: torch._foreach_div_(
        [torch.tensor([3, 5], device=d)], [torch.tensor([2, 2], device=d)]
    ),
}


@pytest.mark.parametrize("case", list(_FOREACH_IN_PLACE_CASTS))
def test_foreach_in_place_result_must_cast_to_each_target(case):
    """CPU's rule that an in-place result must cast to self, for each tensor of a foreach
    list (tpu truncated `_foreach_mul_(ints, 0.5)` and dropped imaginary parts)."""
    fn = _FOREACH_IN_PLACE_CASTS[case]
    with pytest.raises(RuntimeError) as cpu_error:
        fn("cpu")
    with pytest.raises(RuntimeError) as tpu_error:
        fn("tpu")
    assert str(tpu_error.value) == str(cpu_error.value)
