"""CTC loss (ops/ctc.py) against CPU: losses and gradients over padded and concatenated
targets, repeated labels, empty targets and inputs, impossible alignments with and
without zero_infinity, every reduction; CPU's refusals. A test in which a tpu op ran
on the CPU fallback fails (`no_cpu_fallback`)."""

import itertools

import pytest
import torch
import torch.nn.functional as F

# (steps, batch, classes, input lengths, target lengths): uneven lengths; an empty input
# with an empty target; an empty target; a target too long for its input (impossible);
# a single step; a longer batch
CASES = [
    (12, 3, 6, [12, 10, 7], [4, 2, 3]),
    (5, 2, 4, [5, 0], [2, 0]),
    (6, 3, 5, [6, 2, 6], [0, 3, 6]),
    (1, 1, 3, [1], [1]),
    (30, 4, 20, [30, 25, 30, 11], [10, 5, 12, 3]),
]


pytestmark = pytest.mark.usefixtures("no_cpu_fallback")


def _inputs(case, concatenated, blank, dtype, seed=0):
    steps, batch, classes, inputs, targets = case
    g = torch.Generator().manual_seed(seed)
    log_probs = torch.randn(steps, batch, classes, dtype=dtype, generator=g).log_softmax(2)
    shape = (sum(targets),) if concatenated else (batch, max(targets) + 2)
    labels = torch.randint(0, classes - 1, shape, generator=g)
    labels[labels >= blank] += 1  # (any label but the blank; repeats happen)
    return log_probs, labels, torch.tensor(inputs), torch.tensor(targets)


@pytest.mark.parametrize(
    ("dtype", "concatenated", "reduction", "zero_infinity"),
    [
        (torch.float32, False, "none", False),
        (torch.float64, True, "mean", True),
        (torch.float32, True, "sum", False),
        (torch.float64, False, "none", True),
    ],
)
def test_loss_and_gradient_match_cpu(dtype, concatenated, reduction, zero_infinity):
    tolerance = 1e-5 if dtype == torch.float32 else 1e-10
    for case, blank in itertools.product(CASES, [0, 2]):
        log_probs, labels, inputs, targets = _inputs(case, concatenated, blank, dtype)
        out_grad = torch.randn(case[1] if reduction == "none" else (), dtype=dtype)
        results = []
        for device in ("cpu", "tpu"):
            leaf = log_probs.detach().to(device).requires_grad_()
            loss = F.ctc_loss(
                leaf, labels.to(device), inputs, targets, blank=blank,
                reduction=reduction, zero_infinity=zero_infinity,
            )
            loss.backward(out_grad.to(device))
            results.append((loss.detach().cpu(), leaf.grad.cpu()))
        (cpu_loss, cpu_grad), (tpu_loss, tpu_grad) = results
        torch.testing.assert_close(tpu_loss, cpu_loss, rtol=tolerance, atol=tolerance,
                                   equal_nan=True, msg=f"loss {case} blank {blank}")
        torch.testing.assert_close(tpu_grad, cpu_grad, rtol=tolerance, atol=tolerance,
                                   equal_nan=True, msg=f"gradient {case} blank {blank}")


def test_backward_from_cpus_forward_outputs_matches_cpu():
    """_ctc_loss_backward reads the alphas it is given (CPU's, here), as CPU's does."""
    log_probs, labels, inputs, targets = _inputs(CASES[0], False, 0, torch.float64)
    inputs, targets = inputs.tolist(), targets.tolist()
    nll, alphas = torch.ops.aten._ctc_loss(log_probs, labels, inputs, targets, 0, False)
    grad = torch.rand(3, dtype=torch.float64)
    expected = torch.ops.aten._ctc_loss_backward(
        grad, log_probs, labels, inputs, targets, nll, alphas, 0, False
    )
    got = torch.ops.aten._ctc_loss_backward(
        grad.to("tpu"), log_probs.to("tpu"), labels.to("tpu"), inputs, targets,
        nll.to("tpu"), alphas.to("tpu"), 0, False,
    )
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-10, atol=1e-12)


def test_unbatched_input_matches_cpu():
    log_probs, labels, _, _ = _inputs(CASES[0], False, 0, torch.float32)
    args = (torch.tensor(12), torch.tensor(4))
    expected = F.ctc_loss(log_probs[:, 0], labels[0, :4], *args)
    got = F.ctc_loss(log_probs[:, 0].to("tpu"), labels[0, :4].to("tpu"), *args)
    torch.testing.assert_close(got.cpu(), expected)


def test_refuses_as_cpu():
    log_probs = torch.randn(5, 2, 4).log_softmax(2)
    labels = torch.tensor([[1, 2], [3, 1]])
    cases = [
        (log_probs.half(), labels, [5, 5], [2, 2], 0),
        (log_probs, labels.float(), [5, 5], [2, 2], 0),
        (log_probs, labels, [5, 5], [2, 2], 4),
        (log_probs, labels, [5, 6], [2, 2], 0),
        (log_probs, labels, [5], [2, 2], 0),
        (log_probs[:, 0], labels, [5, 5], [2, 2], 0),
        (log_probs, labels, [5, 5], [3, 2], 0),
        (log_probs, labels, [5, 5], [-1, 2], 0),
    ]
    for log_probs, labels, inputs, targets, blank in cases:
        with pytest.raises((RuntimeError, NotImplementedError)) as on_cpu:
            torch.ops.aten._ctc_loss(log_probs, labels, inputs, targets, blank, False)
        with pytest.raises(on_cpu.type) as on_tpu:
            torch.ops.aten._ctc_loss(
                log_probs.to("tpu"), labels.to("tpu"), inputs, targets, blank, False
            )
        assert str(on_tpu.value) == str(on_cpu.value)
