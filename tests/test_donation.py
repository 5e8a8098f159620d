"""Strict- and debug-mode buffer donation (engine/donation.py): an in-place op reuses
the buffer it overwrites only when nothing else can still read the old value.

Every case checks values against CPU; the `buffers_donated` counter says whether a
buffer was donated where that is the point. Fused-mode and compiled cases live in
their own files (marked `donation` too).
"""

from __future__ import annotations

import copy
import weakref

import numpy as np
import pytest
import torch

from torch_tpu import metrics
from torch_tpu.engine.executor import device_value
from torch_tpu.tensor import storage_of

pytestmark = pytest.mark.donation


def _donated(fn) -> int:
    """Buffers donated while fn runs and its ops complete (a first call compiling on a
    worker thread is recorded and runs, donating, at the synchronize)."""
    before = metrics.snapshot().get("buffers_donated", 0)
    fn()
    torch.tpu.synchronize()
    return metrics.snapshot().get("buffers_donated", 0) - before


@pytest.fixture(
    params=[
        "strict",
        # debug mode runs the same executables, blocking: the full suite covers it
        pytest.param("debug", marks=pytest.mark.slow),
    ]
)
def mode(request):
    with torch.tpu.set_eager_mode(request.param):
        yield request.param


def test_inplace_donates_and_old_array_is_gone(mode):
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    x, y = a.to("tpu"), b.to("tpu")
    old = weakref.ref(storage_of(x).array())
    assert _donated(lambda: x.add_(y)) == 1
    assert old() is None or old().is_deleted()
    torch.testing.assert_close(x.cpu(), a + b)
    x.mul_(2).sub_(y, alpha=3)  # a chain: every step donates the previous result
    torch.testing.assert_close(x.cpu(), (a + b) * 2 - 3 * b)


def test_donation_survives_a_failed_torch_compile(mode):
    """After a backend raises, every Python call in the process holds its arguments once
    more (Dynamo's frame hook, presumably, left in place); a reference count read through
    a function argument then never allowed donation again (CI's failures of this file)."""

    def failing_backend(gm, example_inputs):
        raise ValueError("this backend fails on purpose")

    with pytest.raises(Exception, match="fails on purpose"):
        torch.compile(lambda t: t + 1, backend=failing_backend)(torch.ones(2))
    torch._dynamo.reset()
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    x, y = a.to("tpu"), b.to("tpu")
    assert _donated(lambda: x.add_(y)) == 1
    torch.testing.assert_close(x.cpu(), a + b)


def test_array_held_elsewhere_is_not_donated(mode):
    """A holder of the storage's own jax.Array (a user, a kernel that handed it out)
    keeps its value: the reference count forbids donation."""
    a = torch.randn(8)
    x = a.to("tpu")
    held = storage_of(x).array()
    assert _donated(lambda: x.add_(1)) == 0
    assert not held.is_deleted()
    np.testing.assert_allclose(np.asarray(held), a.numpy())
    torch.testing.assert_close(x.cpu(), a + 1)


def test_views_written_in_place(mode):
    base_cpu = torch.randn(6, 8)
    base = base_cpu.to("tpu")
    row, col, t = base[2:4], base[:, 1], base.t()
    for view, ref in ((row, base_cpu[2:4]), (col, base_cpu[:, 1]), (t, base_cpu.t())):
        view.mul_(2)
        ref.mul_(2)
    view_cpu = base_cpu[1:5, ::2]
    view = base[1:5, ::2]
    view.add_(torch.ones(4, 4).to("tpu"))
    view_cpu.add_(torch.ones(4, 4))
    torch.testing.assert_close(base.cpu(), base_cpu)
    torch.testing.assert_close(row.cpu(), base_cpu[2:4])
    torch.testing.assert_close(col.cpu(), base_cpu[:, 1])


def test_deepcopy_then_inplace_on_one_copy(mode):
    """clone_storage shares the array: neither copy may donate it while both live."""
    a = torch.randn(32)
    x = a.to("tpu")
    y = copy.deepcopy(x)
    assert _donated(lambda: x.add_(1)) == 0
    torch.testing.assert_close(y.cpu(), a)
    torch.testing.assert_close(x.cpu(), a + 1)
    assert _donated(lambda: y.mul_(3)) == 1  # x moved on: y's array is its own now
    torch.testing.assert_close(y.cpu(), a * 3)
    torch.testing.assert_close(x.cpu(), a + 1)


def test_two_storages_one_array_as_inputs_of_one_op(mode):
    a = torch.randn(16)
    x = a.to("tpu")
    y = copy.deepcopy(x)  # another storage, the same array
    x.add_(y)  # donating x's array would delete y's input of the same call
    torch.testing.assert_close(x.cpu(), a + a)
    torch.testing.assert_close(y.cpu(), a)


def test_one_storage_read_and_written_by_one_op(mode):
    a = torch.randn(8, 8)
    cpu, x = a.clone(), a.to("tpu")
    for t in (cpu, x):
        t.mul_(t)
        torch.add(t, t, out=t)
        t[0].add_(t[1])  # two views of one storage, one written
        t[:, :4].copy_(t[:, 4:])
    torch.testing.assert_close(x.cpu(), cpu)


def test_reads_dispatched_before_the_inplace_op_see_the_old_value(mode):
    a = torch.randn(64)
    x = a.to("tpu")
    pending = device_value(x)  # a reader dispatched, not waited for
    host = x.to("cpu", non_blocking=True)
    snapshot = x.cpu()
    x.add_(5)
    x.mul_(2)
    np.testing.assert_allclose(np.asarray(pending), a.numpy())
    torch.testing.assert_close(host, a)
    torch.testing.assert_close(snapshot, a)
    torch.testing.assert_close(x.cpu(), (a + 5) * 2)


def test_tensor_saved_for_backward_then_modified(mode):
    """Autograd's version counter still catches the modification, as on CPU; a tensor
    saved by a formula that does not need its value may be modified freely."""
    results = {}
    for device in ("cpu", "tpu"):
        w = torch.ones(4, device=device, requires_grad=True)
        h = (w * 3).exp()  # exp saves its result
        h.add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            h.sum().backward()
        w2 = torch.full((4,), 2.0, device=device, requires_grad=True)
        z = w2 * 2
        out = z * 5  # mul by a constant saves nothing of z
        z.add_(1)
        out.sum().backward()
        results[device] = (w2.grad.cpu(), z.detach().cpu())
    torch.testing.assert_close(results["tpu"], results["cpu"])


def test_out_index_put_and_copy_donate(mode, compile_first_calls):
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    ta, tb = a.to("tpu"), b.to("tpu")
    out_cpu, out = torch.empty(8, 8), torch.zeros(8, 8).to("tpu")
    assert _donated(lambda: torch.mul(ta, tb, out=out)) == 1
    torch.mul(a, b, out=out_cpu)
    idx = torch.tensor([1, 5])
    assert _donated(lambda: out.index_put_((idx.to("tpu"),), torch.tensor(7.0).to("tpu"))) == 1
    out_cpu.index_put_((idx,), torch.tensor(7.0))
    assert _donated(lambda: ta.copy_(tb)) == 1
    torch.testing.assert_close(out.cpu(), out_cpu)
    torch.testing.assert_close(ta.cpu(), b)


@pytest.mark.parametrize("make", ["sgd", "adamw"])
def test_optimizer_steps_donate_and_match_cpu(mode, make):
    torch.manual_seed(0)
    model_cpu = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    model = copy.deepcopy(model_cpu).to("tpu")
    models = {"cpu": model_cpu, "tpu": model}
    opts = {
        k: (
            torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
            if make == "sgd"
            else torch.optim.AdamW(m.parameters(), lr=0.01)
        )
        for k, m in models.items()
    }
    x, y = torch.randn(4, 8), torch.randn(4, 2)
    donated = 0
    for _ in range(3):
        for device, m in models.items():
            opts[device].zero_grad()
            loss = torch.nn.functional.mse_loss(m(x.to(device)), y.to(device))
            loss.backward()
            if device == "tpu":
                donated += _donated(opts[device].step)
            else:
                opts[device].step()
    assert donated > 0
    for p_cpu, p in zip(model_cpu.parameters(), model.parameters()):
        torch.testing.assert_close(p.cpu(), p_cpu, atol=1e-5, rtol=1e-5)


def test_no_donation_with_nan_checks_so_a_failed_op_leaves_the_old_value():
    """Debug mode with NaN checks raises after the op ran: the tensor must keep its
    old value (a donated buffer would be gone)."""
    a = torch.tensor([1.0, -1.0])
    x = a.to("tpu")
    with torch.tpu.set_eager_mode("debug"):
        torch.tpu.check_nans = True
        try:
            with pytest.raises(RuntimeError, match="NaN"):
                x.log_()
        finally:
            torch.tpu.check_nans = False
    torch.testing.assert_close(x.cpu(), a)


def test_strict_inplace_after_a_fused_segment():
    """Values a fused segment produced may still be held by its Pendings: strict mode
    donates only what nothing else holds, and the results match CPU."""
    a, b = torch.randn(16), torch.randn(16)
    x, y = a.to("tpu"), b.to("tpu")
    with torch.tpu.set_eager_mode("fused"):
        z = x * 2 + y
        w = z  # a second tensor object on the same storage
    z.add_(1)
    x.mul_(y)
    torch.testing.assert_close(w.cpu(), a * 2 + b + 1)
    torch.testing.assert_close(x.cpu(), a * b)


def _alias_pairs(hlo_text: str) -> dict[int, int]:
    """{output index: parameter index} from an executable's input_output_alias header."""
    import re

    header = hlo_text.split("input_output_alias={", 1)[1].split("\n", 1)[0]
    return {int(o): int(p) for o, p in re.findall(r"\{(\d+)\}: \((\d+), \{\}", header)}


def test_a_donated_storage_is_paired_with_its_own_new_value(mode):
    """Batch norm's running statistics are written in place beside fresh results of their
    shape (save_mean, save_invstd): each donated statistic must be paired with its own
    new value, not a fresh result XLA then writes into the old buffer (or copies for)."""
    from torch_tpu.engine import donation

    x = torch.randn(8, 4)
    mean, var = torch.zeros(4), torch.ones(4)
    xt, mean_t, var_t = x.to("tpu"), mean.to("tpu"), var.to("tpu")
    donation._DONATING.clear()
    assert _donated(lambda: torch.nn.functional.batch_norm(xt, mean_t, var_t, training=True)) == 2
    torch.nn.functional.batch_norm(x, mean, var, training=True)
    torch.testing.assert_close(mean_t.cpu(), mean)
    torch.testing.assert_close(var_t.cpu(), var)
    (found,) = [d for e, d in donation._DONATING.items() if "batch_norm" in e.name]
    # the donated statistics are the first parameters, their new values the first results
    assert _alias_pairs(found.fn.as_text()) == {0: 0, 1: 1}


def test_never_written_storage_an_op_overwrites_is_not_materialised(mode, monkeypatch):
    """`torch.ones` is `empty` and `fill_`: materialising the empty storage as zeros ran
    a zeros program and held a second buffer (on a TPU until the next op) for a value
    fill_ never reads. Repeat calls skip it; a partial write still sees zeros around it,
    and values match CPU."""
    from torch_tpu import tensor

    materialised = []
    zeros = tensor._zeros
    monkeypatch.setattr(
        tensor, "_zeros", lambda shape, dtype: materialised.append(shape) or zeros(shape, dtype)
    )
    n = 1 << 17  # (above the shared zeros' size: each would be a program and a buffer)

    def calls():
        x = torch.empty(3, n, device="tpu").fill_(2.5)
        y = torch.ones(n, device="tpu")
        z = torch.mul(y, 3, out=torch.empty(n, device="tpu"))
        partial = torch.empty(2, n, device="tpu")
        partial[0].fill_(1.0)  # (reads the storage: the rest stays zeros)
        return x, y, z, partial

    calls()
    calls()  # (first calls: served on the host, then compiled)
    materialised.clear()
    x, y, z, partial = calls()
    assert len(materialised) == 1  # the partially written storage's zeros only
    torch.testing.assert_close(x.cpu(), torch.full((3, n), 2.5), rtol=0, atol=0)
    torch.testing.assert_close(y.cpu(), torch.ones(n), rtol=0, atol=0)
    torch.testing.assert_close(z.cpu(), torch.full((n,), 3.0), rtol=0, atol=0)
    expected = torch.zeros(2, n)
    expected[0] = 1.0
    torch.testing.assert_close(partial.cpu(), expected, rtol=0, atol=0)
