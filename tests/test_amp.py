"""Automatic mixed precision on tpu: `torch.autocast("tpu")` and `torch.amp.GradScaler("tpu")`.

tpu autocast applies CUDA's casting policy; CPU autocast has other op lists
(softmax, sums, norms and several losses stay in bfloat16 there). So:
- per op, the oracle is PyTorch CPU computing the op with its inputs cast as
  CUDA's policy says (same dtype, same values within the result dtype's
  tolerance), and the op lists are checked against the AutocastCUDA
  registrations of the installed PyTorch;
- whole training runs are compared with stock CPU autocast
  (`torch.autocast("cpu", ...)`) with a documented tolerance: the two policies
  round different intermediates, which moves a 5-step loss by about 1e-3
  relative in bfloat16 (measured: MLP/CNN <= 1.3e-3, GPT <= 3e-4) and 1e-4 in
  float16; the tests allow 5e-3 (bfloat16) and 1e-3 (float16) relative.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from conftest import to_cpu, to_tpu
from torch import nn

import torch_tpu
from torch_tpu import amp, training

BF16_RTOL = 5e-3
FP16_RTOL = 1e-3
STEPS = 5


# ------------------------------------------------------------ the switch


def test_tpu_autocast_defaults_to_bfloat16():
    assert torch.get_autocast_dtype("tpu") == torch.bfloat16
    assert torch.amp.is_autocast_available("tpu")
    assert torch.tpu.get_amp_supported_dtype() == [torch.bfloat16, torch.float16]
    assert torch.tpu.is_bf16_supported()
    a = torch.randn(4, 4, device="tpu")
    with torch.autocast("tpu"):
        assert torch.is_autocast_enabled("tpu")
        assert (a @ a).dtype == torch.bfloat16
    assert not torch.is_autocast_enabled("tpu")


def test_unsupported_dtype_warns_and_disables_like_other_devices():
    a = torch.randn(4, 4, device="tpu")
    with pytest.warns(UserWarning, match="tpu Autocast only supports"):
        region = torch.autocast("tpu", dtype=torch.float64)
    with region:
        assert not torch.is_autocast_enabled("tpu")
        assert (a @ a).dtype == torch.float32


@pytest.mark.parametrize("dtype", [None, torch.bfloat16, torch.float16])
def test_disabled_autocast_is_a_no_op(dtype):
    x, w = torch.randn(4, 8), torch.randn(8, 3)

    def fn(x, w):
        with torch.autocast(x.device.type, dtype=dtype, enabled=False):
            assert not torch.is_autocast_enabled(x.device.type)
            y = x @ w
            return y, torch.softmax(y, -1), y.sum()

    out = fn(to_tpu(x), to_tpu(w))
    for got, want in zip(out, fn(x, w)):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.cpu(), want)


def test_nested_regions_restore_state():
    a = torch.randn(4, 4, device="tpu")
    with torch.autocast("tpu"):
        assert (a @ a).dtype == torch.bfloat16
        with torch.autocast("tpu", enabled=False):
            assert not torch.is_autocast_enabled("tpu")
            assert (a @ a).dtype == torch.float32
            with torch.autocast("tpu", dtype=torch.float16):
                assert torch.get_autocast_dtype("tpu") == torch.float16
                assert (a @ a).dtype == torch.float16
            assert (a @ a).dtype == torch.float32
        assert torch.is_autocast_enabled("tpu")
        assert torch.get_autocast_dtype("tpu") == torch.bfloat16
        assert (a @ a).dtype == torch.bfloat16
    assert not torch.is_autocast_enabled("tpu")
    assert torch.get_autocast_dtype("tpu") == torch.bfloat16


def test_cpu_autocast_leaves_tpu_ops_alone_and_vice_versa():
    a_cpu, a_tpu = torch.randn(4, 4), torch.randn(4, 4, device="tpu")
    with torch.autocast("cpu"):
        assert (a_tpu @ a_tpu).dtype == torch.float32
    with torch.autocast("tpu"):
        assert (a_cpu @ a_cpu).dtype == torch.float32


def test_autocast_decorator_form():
    @torch.autocast("tpu")
    def f(a):
        return a @ a

    assert f(torch.randn(4, 4, device="tpu")).dtype == torch.bfloat16


def test_cast_kernels_are_registered_at_first_autocast_not_at_import():
    code = (
        "import torch\n"
        "has = lambda: torch._C._dispatch_has_kernel_for_dispatch_key("
        "'aten::mm', 'AutocastPrivateUse1')\n"
        "before = has()\n"
        "with torch.autocast('tpu', enabled=False):\n"
        "    pass\n"
        "print(before, has())\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["False", "True"]


def test_op_lists_are_cudas():
    """Every op with an AutocastCUDA kernel in this PyTorch, except cuDNN's own, has a
    tpu autocast kernel, and no other op has one."""
    amp.install_kernels()
    cuda, tpu = set(), set()
    for name in torch._C._dispatch_get_all_op_names():
        if not name.startswith("aten::"):
            continue
        if torch._C._dispatch_has_kernel_for_dispatch_key(name, "AutocastCUDA"):
            cuda.add(name)
        if torch._C._dispatch_has_kernel_for_dispatch_key(name, "AutocastPrivateUse1"):
            tpu.add(name)
    assert tpu == {n for n in cuda if not n.startswith("aten::cudnn_")}


# ------------------------------------------------------------ op by op

LP, FP32, OPT, PROMOTE, NONE = "lower", "fp32", "fp32_set_opt_dtype", "promote", "none"


# (id, policy, function, input shapes). Inputs are float32, except that float32 and
# reduction ops get them in the autocast dtype (so the policy, not the input, decides the
# result dtype) and "_mixed" ops get their first input in it (promotion decides).
OPS = [
    ("mm", LP, torch.mm, [(4, 8), (8, 5)]),
    ("matmul", LP, torch.matmul, [(2, 4, 8), (8, 5)]),
    ("linear", LP, F.linear, [(3, 8), (5, 8), (5,)]),
    ("addmm", LP, torch.addmm, [(4, 5), (4, 8), (8, 5)]),
    ("bmm", LP, torch.bmm, [(2, 4, 8), (2, 8, 5)]),
    ("baddbmm", LP, torch.baddbmm, [(2, 4, 5), (2, 4, 8), (2, 8, 5)]),
    ("mv", LP, torch.mv, [(4, 8), (8,)]),
    ("addr", LP, torch.addr, [(4, 5), (4,), (5,)]),
    ("einsum", LP, lambda a, b: torch.einsum("ij,jk->ik", a, b), [(4, 8), (8, 5)]),
    ("conv1d", LP, F.conv1d, [(2, 3, 9), (4, 3, 3), (4,)]),
    ("conv2d", LP, F.conv2d, [(2, 3, 8, 8), (4, 3, 3, 3), (4,)]),
    ("conv_transpose2d", LP, F.conv_transpose2d, [(2, 3, 5, 5), (3, 4, 3, 3)]),
    ("prelu", LP, F.prelu, [(2, 3, 4), (3,)]),
    (
        "sdpa",
        LP,
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        [(2, 2, 6, 8), (2, 2, 6, 8), (2, 2, 6, 8)],
    ),
    ("exp", FP32, torch.exp, [(4, 5)]),
    ("log", FP32, torch.log, [(4, 5)]),
    ("pow", FP32, lambda x: torch.pow(x, 2), [(4, 5)]),
    ("rsqrt", FP32, torch.rsqrt, [(4, 5)]),
    ("softplus", FP32, F.softplus, [(4, 5)]),
    ("layer_norm", FP32, lambda x, w, b: F.layer_norm(x, (5,), w, b), [(4, 5), (5,), (5,)]),
    ("group_norm", FP32, lambda x: F.group_norm(x, 2), [(2, 4, 3)]),
    ("mse_loss", FP32, F.mse_loss, [(4, 5), (4, 5)]),
    ("l1_loss", FP32, F.l1_loss, [(4, 5), (4, 5)]),
    ("bce_logits", FP32, F.binary_cross_entropy_with_logits, [(4, 5), (4, 5)]),
    ("logsumexp", FP32, lambda x: torch.logsumexp(x, -1), [(4, 5)]),
    ("cdist", FP32, torch.cdist, [(4, 3), (5, 3)]),
    ("cosine_similarity", FP32, F.cosine_similarity, [(4, 5), (4, 5)]),
    (
        "interpolate",
        FP32,
        lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"),
        [(1, 2, 3, 3)],
    ),
    ("softmax", OPT, lambda x: torch.softmax(x, -1), [(4, 5)]),
    ("log_softmax", OPT, lambda x: F.log_softmax(x, -1), [(4, 5)]),
    ("sum", OPT, torch.sum, [(4, 5)]),
    ("sum_dim", OPT, lambda x: x.sum(1), [(4, 5)]),
    ("prod", OPT, lambda x: x.prod(1), [(4, 5)]),
    ("cumsum", OPT, lambda x: x.cumsum(1), [(4, 5)]),
    ("vector_norm", OPT, torch.linalg.vector_norm, [(4, 5)]),
    ("norm", OPT, lambda x: torch.ops.aten.norm.Scalar(x, 2), [(4, 5)]),
    ("norm_dim", OPT, lambda x: torch.ops.aten.norm.ScalarOpt_dim(x, 2, [1]), [(4, 5)]),
    ("addcmul_mixed", PROMOTE, torch.addcmul, [(4, 5), (4, 5), (4, 5)]),
    ("atan2_mixed", PROMOTE, torch.atan2, [(4, 5), (4, 5)]),
    ("dot_mixed", PROMOTE, torch.dot, [(5,), (5,)]),
    ("cat_mixed", NONE, lambda a, b: torch.cat([a, b]), [(4, 5), (4, 5)]),
    ("relu_mixed", NONE, torch.relu, [(4, 5)]),
    ("add_mixed", NONE, torch.add, [(4, 5), (4, 5)]),
]


def _policy_inputs(policy: str, inputs: list, lower: torch.dtype) -> list:
    """The inputs as CUDA's policy casts them before the op runs."""
    if policy == LP:
        return [x.to(lower) for x in inputs]
    if policy == FP32:
        return [x.float() for x in inputs]
    if policy == PROMOTE:
        widest = torch.float32 if any(x.dtype == torch.float32 for x in inputs) else lower
        return [x.to(widest) for x in inputs]
    return inputs


# The casting policy is mode-independent (one set of kernels): CI checks it in strict
# mode; debug and fused repeat all 88 cells and run in the full suite only.
@pytest.fixture(
    params=[
        "strict",
        pytest.param("debug", marks=pytest.mark.slow),
        pytest.param("fused", marks=pytest.mark.slow),
    ]
)
def policy_mode(request):
    with torch.tpu.set_eager_mode(request.param):
        yield request.param


@pytest.mark.usefixtures("policy_mode")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name,policy,fn,shapes", OPS, ids=[o[0] for o in OPS])
def test_op_output_matches_cuda_policy(name, policy, fn, shapes, dtype):
    """Result dtype as PyTorch CPU gives for the inputs cast by CUDA's policy; values
    within one rounding of that dtype from the float64 result (CPU's own half kernels,
    conv_transpose2d's among them, round more often than once, so they are no oracle)."""
    inputs = [torch.randn(s) for s in shapes]
    if name in ("log", "rsqrt"):
        inputs = [x.abs() + 0.5 for x in inputs]
    if policy in (FP32, OPT):
        inputs = [x.to(dtype) for x in inputs]
    if name.endswith("_mixed"):
        inputs[0] = inputs[0].to(dtype)
    with torch.autocast("tpu", dtype=dtype):
        got = fn(*to_tpu(inputs))
    if policy == OPT:  # dtype=float32: the reduction reads its input as float32
        cast = [x.float() for x in inputs]
    else:
        cast = _policy_inputs(policy, inputs, dtype)
    want_dtype = fn(*cast).dtype
    assert want_dtype == {LP: dtype, FP32: torch.float32, OPT: torch.float32}.get(
        policy, want_dtype
    )
    assert got.device.type == "tpu"
    assert got.dtype == want_dtype
    exact = fn(*[x.double() for x in cast])
    rtol, atol = {torch.bfloat16: (1.6e-2, 1e-2), torch.float16: (1e-3, 1e-3)}.get(
        got.dtype, (1e-5, 1e-5)
    )
    torch.testing.assert_close(got.cpu().double(), exact, atol=atol, rtol=rtol)


def test_promote_refuses_mixed_half_dtypes():
    a = torch.randn(4, device="tpu", dtype=torch.float16)
    b = torch.randn(4, device="tpu", dtype=torch.bfloat16)
    with torch.autocast("tpu"), pytest.raises(RuntimeError, match="only torch.bfloat16 and"):
        torch.atan2(b, a)


def test_explicit_dtype_and_ineligible_inputs_are_respected():
    x = torch.randn(4, 5, device="tpu")
    with torch.autocast("tpu"):
        assert torch.softmax(x, -1, dtype=torch.bfloat16).dtype == torch.bfloat16
        assert torch.arange(6, device="tpu").sum().dtype == torch.int64
        assert (x.double() @ x.double().T).dtype == torch.float64  # float64 is never cast
        assert torch.ops.aten.norm.Scalar(x.double(), 2).dtype == torch.float64


def test_binary_cross_entropy_is_refused_as_on_cuda():
    p, t = torch.rand(4, device="tpu"), torch.rand(4, device="tpu")
    with torch.autocast("tpu"), pytest.raises(RuntimeError, match="binary_cross_entropy_with"):
        F.binary_cross_entropy(p, t)
    assert F.binary_cross_entropy(p, t).dtype == torch.float32  # outside autocast: fine


@pytest.mark.usefixtures("eager_mode")
def test_backward_through_casts_gives_float32_grads_like_cpu():
    """Casts are recorded by autograd: float32 leaves get float32 gradients."""
    x, w = torch.randn(4, 8), torch.randn(5, 8)

    def grads(device):
        xd = x.to(device).requires_grad_()
        wd = w.to(device).requires_grad_()
        with torch.autocast(device, dtype=torch.bfloat16):
            y = F.linear(xd, wd)
        y.float().square().sum().backward()
        return y, xd.grad, wd.grad

    for got, want in zip(grads("tpu"), grads("cpu")):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got.cpu(), want, rtol=1.6e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_half_convolution_backward(dtype):
    """conv2d's backward in bf16/fp16 (what autocast CNNs run) gives gradients within one
    rounding of the float64 ones (it used to fail: the cotangent's dtype was wrong)."""
    x, w = torch.randn(2, 3, 8, 8).to(dtype), torch.randn(4, 3, 3, 3).to(dtype)
    g = torch.randn(2, 4, 6, 6).to(dtype)

    def grads(x, w, g):
        x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
        F.conv2d(x, w).backward(g)
        return x.grad, w.grad

    got = grads(*to_tpu([x, w, g]))
    exact = grads(x.double(), w.double(), g.double())
    for a, e in zip(got, exact):
        assert a.dtype == dtype
        torch.testing.assert_close(a.cpu().double(), e, rtol=1.6e-2, atol=2e-2)


# ------------------------------------------------------------ training


def _gpt() -> nn.Module:
    cfg = training.GPT_SIZES["gpt_small"]
    return training.TinyGPT(cfg["vocab"], cfg["d"], cfg["heads"], cfg["seq"])


def _batch(model: str):
    g = torch.Generator().manual_seed(1000)
    if model == "cnn":
        return torch.randn(16, 3, 16, 16, generator=g), torch.randint(0, 10, (16,), generator=g)
    if model == "mlp":
        return torch.randn(16, 64, generator=g), torch.randint(0, 10, (16,), generator=g)
    cfg = training.GPT_SIZES["gpt_small"]
    idx = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"] + 1), generator=g)
    return idx[:, :-1], idx[:, 1:]


MODELS = {"mlp": training.mlp, "cnn": training.cnn, "gpt": _gpt}


def amp_losses(model: str, device: str, dtype, optimizer: str, scaled: bool = False):
    """Per-step losses (and the final scale) of a few autocast training steps."""
    torch.manual_seed(0)
    net = MODELS[model]().to(device)
    if optimizer == "sgd":
        opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    else:
        opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler(device) if scaled else None
    x, y = (t.to(device) for t in _batch(model))
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        with torch.autocast(device, dtype=dtype):
            logits = net(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        losses.append(loss.item())
    return losses, (scaler.get_scale() if scaler else None)


def _relative(tpu: list, cpu: list) -> float:
    return max(abs(a - b) / abs(b) for a, b in zip(tpu, cpu))


# Whole training runs in strict and fused mode. Debug mode runs strict's executables one
# at a time, blocking, with value checks: the op-level tests above run it, and the full
# suite (-m slow too) trains in it.
_TRAINING_MODES = pytest.mark.parametrize(
    "eager_mode", ["strict", "fused", pytest.param("debug", marks=pytest.mark.slow)], indirect=True
)


@_TRAINING_MODES
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
@pytest.mark.parametrize("model", ["mlp", "cnn", "gpt"])
def test_bf16_training_matches_cpu_autocast(model, optimizer, eager_mode):
    cpu, _ = amp_losses(model, "cpu", torch.bfloat16, optimizer)
    torch_tpu.metrics.reset()
    tpu, _ = amp_losses(model, "tpu", torch.bfloat16, optimizer)
    assert _relative(tpu, cpu) < BF16_RTOL, (tpu, cpu)
    assert tpu[-1] < tpu[0]  # it trains
    assert not torch_tpu.metrics.snapshot()["fallback_ops"], "autocast training fell back"


@_TRAINING_MODES
@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_fp16_training_with_grad_scaler_matches_cpu(model, eager_mode):
    cpu, cpu_scale = amp_losses(model, "cpu", torch.float16, "adamw", scaled=True)
    torch_tpu.metrics.reset()
    tpu, tpu_scale = amp_losses(model, "tpu", torch.float16, "adamw", scaled=True)
    assert _relative(tpu, cpu) < FP16_RTOL, (tpu, cpu)
    assert tpu_scale == cpu_scale
    assert not torch_tpu.metrics.snapshot()["fallback_ops"], "GradScaler fell back to the CPU"


# ------------------------------------------------------------ GradScaler


@pytest.mark.usefixtures("eager_mode")
def test_grad_scaler_skips_the_step_on_inf_and_nan_like_cpu():
    """A non-finite gradient skips optimizer.step and backs the scale off; finite steps
    run and, after growth_interval of them, grow it: scale, tracker and weights as on CPU."""

    def run(device):
        torch.manual_seed(0)
        net = nn.Linear(4, 3).to(device)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler(device, init_scale=8.0, growth_interval=2)
        x = torch.randn(5, 4).to(device)
        record = []
        for poison in [None, float("inf"), None, None, float("nan"), None]:
            opt.zero_grad()
            with torch.autocast(device, dtype=torch.float16):
                loss = net(x).float().square().mean()
            scaler.scale(loss).backward()
            if poison is not None:
                with torch.no_grad():
                    net.weight.grad[1, 2] = poison
            before = net.weight.detach().clone()
            scaler.step(opt)
            scaler.update()
            stepped = not torch.equal(net.weight.detach().cpu(), before.cpu())
            record.append((stepped, scaler.get_scale(), scaler._growth_tracker.item()))
        return record, to_cpu(net.weight)

    (tpu, w_tpu), (cpu, w_cpu) = run("tpu"), run("cpu")
    assert tpu == cpu
    assert [r[0] for r in tpu] == [True, False, True, True, False, True]
    torch.testing.assert_close(w_tpu, w_cpu)


@pytest.mark.usefixtures("eager_mode")
@pytest.mark.parametrize("inv_scale", [1.0, 0.25])
def test_unscale_kernel_matches_cpu(inv_scale):
    grads = [
        torch.randn(3, 4),
        torch.randn(5).half(),
        torch.tensor([1.0, float("inf"), -2.0]).bfloat16(),
        torch.randn(2).double(),
    ]

    def run(device, grads):
        gs = [g.to(device) for g in grads]
        found = torch.zeros((), device=device)
        torch._amp_foreach_non_finite_check_and_unscale_(
            gs, found, torch.full((), inv_scale, device=device)
        )
        return [g.cpu() for g in gs], found.item()

    got, want = run("tpu", grads), run("cpu", grads)
    assert got[1] == want[1] == 1.0
    for g, w in zip(got[0], want[0]):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    clean = run("tpu", grads[:2] + grads[3:])
    assert clean[1] == run("cpu", grads[:2] + grads[3:])[1] == 0.0


def test_grad_scaler_kernels_reject_bad_arguments_like_cpu():
    def error(device, fn):
        with pytest.raises(RuntimeError) as info:
            fn(device)
        return str(info.value)

    cases = [
        lambda d: torch._amp_foreach_non_finite_check_and_unscale_(
            [torch.ones(2, device=d)], torch.zeros(2, device=d), torch.ones((), device=d)
        ),
        lambda d: torch._amp_update_scale_(
            torch.ones((), device=d),
            torch.zeros((), device=d),  # a float growth tracker
            torch.zeros((), device=d),
            2.0,
            0.5,
            3,
        ),
    ]
    for fn in cases:
        assert error("cpu", fn) in error("tpu", fn)


# ------------------------------------------------------------ torch.compile


@pytest.fixture
def captured_graphs(monkeypatch):
    """The ATen graphs the tpu backend compiles."""
    from torch_tpu.compile import backend

    graphs = []
    compile_graph = backend._compile_graph

    def recording(gm, *args, **kwargs):
        graphs.append(gm)
        return compile_graph(gm, *args, **kwargs)

    monkeypatch.setattr(backend, "_compile_graph", recording)
    torch._dynamo.reset()
    yield graphs
    torch._dynamo.reset()


def _dtypes_of(gm, target) -> list:
    return [n.meta["val"].dtype for n in gm.graph.nodes if n.target == target]


def test_autocast_inside_a_compiled_function_matches_eager(captured_graphs):
    def fn(x, w, b):
        with torch.autocast("tpu"):
            y = F.linear(x, w, b)
            return torch.softmax(y, -1), y

    x, w, b = (torch.randn(*s, device="tpu") for s in [(4, 8), (5, 8), (5,)])
    compiled = torch.compile(fn, backend="tpu")(x, w, b)
    eager = fn(x, w, b)
    for got, want in zip(compiled, eager):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got.cpu(), want.cpu())
    assert [c.dtype for c in compiled] == [torch.float32, torch.bfloat16]
    (gm,) = captured_graphs
    casts = _dtypes_of(gm, torch.ops.aten._to_copy.default)
    assert casts.count(torch.bfloat16) == 3 and torch.float32 in casts  # x, w, b; softmax's
    assert _dtypes_of(gm, torch.ops.aten.addmm.default) == [torch.bfloat16]


def test_compiled_autocast_training_step_matches_eager(captured_graphs):
    def losses(compiled: bool):
        torch.manual_seed(0)
        net = training.mlp().to("tpu")
        opt = torch.optim.SGD(net.parameters(), lr=0.05)
        x, y = (t.to("tpu") for t in _batch("mlp"))

        def loss_fn(x, y):
            with torch.autocast("tpu"):
                return F.cross_entropy(net(x), y)

        step = torch.compile(loss_fn, backend="tpu") if compiled else loss_fn
        out = []
        for _ in range(3):
            opt.zero_grad()
            loss = step(x, y)
            loss.backward()
            opt.step()
            out.append(loss.item())
        return out

    compiled, eager = losses(True), losses(False)
    torch.testing.assert_close(torch.tensor(compiled), torch.tensor(eager), rtol=1e-3, atol=0)
    forward = captured_graphs[0]
    assert torch.bfloat16 in _dtypes_of(forward, torch.ops.aten.addmm.default)
