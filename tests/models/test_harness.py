"""The zoo's comparison with the CPU catches wrong answers at every scale and passes
float noise: a lenient oracle would let a silent wrong answer through every cell."""

import copy

import harness  # pytest puts this folder on sys.path (rootdir-relative imports)
import pytest
import torch


def _grads(**tensors) -> list:
    return [(f"grad {name}", t) for name, t in tensors.items()]


def _mismatch(expected: list, actual: list, rounding: dict | None = None) -> str:
    return harness._compare(expected, actual, rounding)[2]


def test_a_small_gradient_set_to_zero_is_a_mismatch():
    """bert's LayerNorm biases have gradients of about 5e-5 beside others near 0.1: an
    absolute tolerance of 1e-4 passed such a gradient as all zeros."""
    torch.manual_seed(0)
    big, small = torch.randn(64) * 0.1, torch.rand(64) * 5e-5
    expected = _grads(big=big, small=small)
    assert _mismatch(expected, _grads(big=big, small=small * (1 + 1e-5))) == ""
    found = _mismatch(expected, _grads(big=big, small=torch.zeros(64)))
    assert found.startswith("grad small:"), found


def test_gradients_at_the_noise_floor_pass_whatever_their_own_relative_error():
    """A gradient that is zero in exact arithmetic (a key projection's bias) is float
    noise on both sides, 1e-10 of the largest gradient: its relative error can exceed 1."""
    big = torch.ones(8)
    noise_cpu, noise_tpu = torch.full((8,), 3e-11), torch.full((8,), -4e-11)
    max_error, used, found = harness._compare(
        _grads(big=big, key_bias=noise_cpu), _grads(big=big, key_bias=noise_tpu)
    )
    assert found == ""
    assert max_error == 0.0  # the noise tensor is not counted as an error of the model
    assert 0 < used < 1


def test_a_missing_update_of_a_weight_near_one_is_a_mismatch():
    """AdamW's first update is about lr = 1e-3: against a LayerNorm weight of 1.0, rtol
    1e-3 on the weight itself could not see it. Updates are compared instead."""
    before = {"weight": torch.ones(16)}
    after = f"weight{harness.AFTER_STEP}"
    stepped = before["weight"] - 1e-3
    expected = harness._updates(before, [(after, stepped)])
    rounding = harness._update_rounding(before)
    assert _mismatch(expected, harness._updates(before, [(after, stepped.clone())]), rounding) == ""
    one_ulp_off = stepped.nextafter(torch.full_like(stepped, 2.0))
    rounded = harness._updates(before, [(after, one_ulp_off)])
    assert _mismatch(expected, rounded, rounding) == ""  # the weight's own rounding
    unchanged = harness._updates(before, [(after, before["weight"].clone())])
    found = _mismatch(expected, unchanged, rounding)
    assert found.startswith(f"weight{harness.UPDATE}:"), found


def _linear_step(grad_scale: float = 1.0, state_scale: float = 1.0):
    """A Reference and a Taken for one AdamW step of a small smooth model, the Taken
    being the CPU's own step with its gradients scaled by grad_scale and its optimizer
    state by state_scale."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    built = harness.Built(model, args=(torch.randn(4, 6),))
    ref = harness.Reference(model, built, None, None, 0.0, 0.0)
    trained = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(trained.parameters(), lr=harness.LR)
    before = harness._snapshot(trained, optimizer)
    out = trained(*built.args)
    loss = harness.loss_of(out)
    loss.backward()
    for p in trained.parameters():
        p.grad *= grad_scale
    optimizer.step()
    for state in optimizer.state.values():
        state["exp_avg"] *= state_scale
    params = dict(trained.named_parameters())
    tensors = harness._results(out, loss, params) + harness._after(trained, optimizer)
    return ref, harness.Taken(*before, harness._cpu_copies(tensors))


def test_a_step_is_checked_against_the_cpus_step_from_the_same_state():
    (max_error, used, found), note = harness._compare_step(*_linear_step())
    assert (found, note) == ("", "") and used < 1
    (_, _, found), note = harness._compare_step(*_linear_step(state_scale=1.01))
    assert found.startswith("state exp_avg of 0.weight:"), found


def test_a_gradient_mismatch_stands_where_cpu_float32_meets_float64():
    """The norm fallback is only for steps whose gradients float32 cannot settle: a smooth
    model's float32 gradients meet float64, so a 1% error is a mismatch."""
    (_, _, found), note = harness._compare_step(*_linear_step(grad_scale=1.01))
    assert found.startswith("grad "), found
    assert note == ""


def test_gradients_judged_by_norm_allow_a_jump_and_not_a_scaled_gradient():
    e = torch.linspace(-1, 1, 1000)
    jumped = e.clone()
    jumped[500] += 0.3  # one unit across a kink: 1.6% of the norm
    assert harness._compare_norms([("grad w", e)], {"grad w": jumped})[1] == ""
    found = harness._compare_norms([("grad w", e)], {"grad w": e * 1.1})[1]
    assert found.startswith("grad w: |tpu - cpu| / |cpu| = 0.1"), found


def test_gradients_judged_by_norm_keep_the_noise_floor():
    """A gradient zero in exact arithmetic (a BatchNorm bias before a 1x1 convolution and
    another BatchNorm) is float noise on either side: judged against the largest
    gradient's noise floor, as elementwise, not its own norm."""
    e, noise = torch.linspace(-1, 1, 1000), torch.full((16,), 1e-9)
    expected = [("grad w", e), ("grad b", noise)]
    assert harness._compare_norms(expected, {"grad w": e, "grad b": -noise})[1] == ""
    found = harness._compare_norms(expected, {"grad w": e, "grad b": noise + 1e-5})[1]
    assert found.startswith("grad b:"), found


def test_dtype_shape_and_nan_differences_are_mismatches():
    x = torch.tensor([1.0, float("nan"), 3.0])
    assert _mismatch([("output[0]", x)], [("output[0]", x.double())]).endswith(
        "torch.float64[3] on tpu, torch.float32[3] on cpu"
    )
    assert _mismatch([("output[0]", x)], [("output[0]", x[:2])]) != ""
    assert _mismatch([("output[0]", x)], [("output[0]", torch.tensor([1.0, 2.0, 3.0]))]) != ""
    assert _mismatch([("output[0]", x)], [("output[0]", x.clone())]) == ""


def test_a_case_that_computes_nothing_is_refused():
    """torchvision's ViT with its zero-initialised classifier (a zero loss and zero
    gradients) and the detection model with vanished features (one score for every box)
    passed every cell while comparing nothing."""
    grads = _grads(a=torch.ones(3), b=torch.ones(3))
    harness._check_not_degenerate([("loss", torch.tensor(0.5)), *grads])
    with pytest.raises(harness.DegenerateCase, match="loss is 0.0"):
        harness._check_not_degenerate([("loss", torch.tensor(0.0)), *grads])
    zeroed = _grads(a=torch.zeros(3), b=None, c=torch.ones(3))
    with pytest.raises(harness.DegenerateCase, match="2 of 3 gradients"):
        harness._check_not_degenerate([("loss", torch.tensor(0.5)), *zeroed])
    with pytest.raises(harness.DegenerateCase, match=r"output\[2\] is one repeated value"):
        harness._check_not_degenerate([("output[2]", torch.full((40,), 0.2066))])
    harness._check_not_degenerate([("output[2]", torch.tensor([0.2, 0.3]))])
