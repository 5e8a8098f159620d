"""One rank of a tpu_dist test job: runs a scenario's checks and writes their results.

Usage: worker.py SCENARIO RESULT_FILE (rank, world size and rendezvous come from the
environment, as torchrun sets them, or from TPU_DIST_INIT=tcp://... for explicit init).
Each check records "ok" or its error, so one launch of the processes serves many
checks (importing torch and JAX costs seconds per process).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist

RANK = int(os.environ.get("RANK") or os.environ["TPU_DIST_RANK"])
WORLD = int(os.environ.get("WORLD_SIZE") or os.environ["TPU_DIST_WORLD_SIZE"])
TIMEOUT = datetime.timedelta(seconds=float(os.environ.get("TPU_DIST_TIMEOUT", "60")))
results: dict[str, str] = {}
seconds: dict[str, float] = {}


def check(name: str):
    def run(fn):
        begin = time.perf_counter()
        try:
            fn()
            results[name] = "ok"
        except Exception:
            results[name] = traceback.format_exc(limit=6)
        seconds[name] = round(time.perf_counter() - begin, 1)
        return fn

    return run


def init() -> None:
    method = os.environ.get("TPU_DIST_INIT")
    if method:  # explicit init_method, rank and world size
        dist.init_process_group(
            "tpu_dist", init_method=method, rank=RANK, world_size=WORLD, timeout=TIMEOUT
        )
    else:  # torchrun's environment
        dist.init_process_group("tpu_dist", timeout=TIMEOUT)


def tpu(values, dtype=torch.float32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype).to("tpu")


def same(actual: torch.Tensor, expected: torch.Tensor, **kw) -> None:
    assert actual.device.type == "tpu", actual.device
    torch.testing.assert_close(actual.cpu(), expected, **kw)


def main() -> None:
    scenario, out = sys.argv[1], sys.argv[2]
    start = time.perf_counter()
    try:
        SCENARIOS[scenario]()
    finally:
        results["_seconds"] = f"{time.perf_counter() - start:.1f} {seconds}"
        with open(f"{out}.{RANK}", "w") as f:
            json.dump(results, f)
    if results.pop("_abandoned", None):  # a collective that may never end: do not wait
        os._exit(0)
    if dist.is_initialized():
        dist.destroy_process_group()


def _collectives() -> None:
    import collective_checks

    init()
    collective_checks.run(check, RANK, WORLD)


def _training() -> None:
    import training_checks

    init()
    training_checks.run(check, RANK, WORLD)


def _compile() -> None:
    import compile_checks

    init()
    compile_checks.run(check, RANK, WORLD)


def _mesh4() -> None:
    import collective_checks

    init()
    _local_device_checks()
    collective_checks.run_subgroups(check, RANK, WORLD)


def _late_init() -> None:
    """The migration guide's order: a sanity batch on one device, then init_process_group.
    Tensors made before it keep their values, views, optimizer state and pending fused
    work; DDP and collectives then run on them."""
    import copy

    import training_checks
    from torch.nn.parallel import DistributedDataParallel as DDP

    from torch_tpu.training import mlp

    torch.manual_seed(0)
    model = mlp().to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = (t.to("tpu") for t in training_checks._mlp_batch())
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    params = [p.detach().cpu().clone() for p in model.parameters()]
    momenta = [opt.state[p]["momentum_buffer"].cpu().clone() for p in model.parameters()]
    base = torch.arange(12.0).reshape(3, 4).to("tpu")
    view = base.t()
    with torch.tpu.set_eager_mode("fused"):
        pending = torch.arange(6.0, device="tpu") * (RANK + 1)  # still unrun at init
    assert torch.tpu.memory_allocated() > 0  # the backend is up, with data on it

    init()

    @check("tensors_made_before_init_keep_their_values")
    def _():
        for p, expected in zip(model.parameters(), params):
            torch.testing.assert_close(p.detach().cpu(), expected, rtol=0, atol=0)
        for p, expected in zip(model.parameters(), momenta):
            torch.testing.assert_close(opt.state[p]["momentum_buffer"].cpu(), expected)
        view.mul_(2)  # still a view of base
        same(base, torch.arange(12.0).reshape(3, 4) * 2)
        same(pending, torch.arange(6.0) * (RANK + 1))

    @check("all_reduce_of_a_tensor_made_before_init")
    def _():
        dist.all_reduce(pending)
        same(pending, torch.arange(6.0) * sum(r + 1 for r in range(WORLD)))

    @check("ddp_after_a_sanity_batch_matches_single_process")
    def _():
        reference = training_checks._mlp_params(copy.deepcopy(model), RANK, WORLD, False)
        got = training_checks._mlp_params(DDP(model), RANK, WORLD, parallel=True)
        for step, (g, r) in enumerate(zip(got, reference)):
            for p_got, p_ref in zip(g, r):
                torch.testing.assert_close(
                    p_got, p_ref, rtol=1e-5, atol=1e-5, msg=lambda m, s=step: f"step {s}: {m}"
                )


def _local_device_checks() -> None:
    """Each process sees several XLA:CPU devices (JAX_NUM_CPU_DEVICES); rank r must
    compute on device LOCAL_RANK of its process, and collectives run between those."""
    import jax

    from torch_tpu import platform
    from torch_tpu.distributed import mesh
    from torch_tpu.distributed.tensors import flat_value

    local = int(os.environ["LOCAL_RANK"])

    @check("rank_computes_on_its_local_rank_device")
    def _():
        devices = jax.local_devices()
        assert len(devices) == int(os.environ["JAX_NUM_CPU_DEVICES"]), devices
        assert platform.device() == devices[local], (platform.device(), devices)
        y = torch.arange(6.0, device="tpu") * (RANK + 1) + 1
        with torch.tpu.set_eager_mode("fused"):
            z = (y * 2).sum()
        assert flat_value(y).devices() == {devices[local]}, flat_value(y).devices()
        assert flat_value(z).devices() == {devices[local]}, flat_value(z).devices()
        same(z, (torch.arange(6.0) * (RANK + 1) + 1).mul(2).sum())

    @check("collectives_between_local_rank_devices")
    def _():
        chosen = [None] * WORLD
        dist.all_gather_object(chosen, (platform.device().id, local))
        mine = mesh.rank_devices()
        assert [d.id for d in mine] == [c[0] for c in chosen], (mine, chosen)
        x = tpu([1.0, 2.0]) * (RANK + 1)
        dist.all_reduce(x)
        same(x, torch.tensor([1.0, 2.0]) * sum(r + 1 for r in range(WORLD)))
        assert flat_value(x).devices() == {platform.device()}


def _titan_train():
    """examples/titan_train.py as a module."""
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    import titan_train

    return titan_train


def _mesh_env(name: str) -> tuple[int, int]:
    dp, tp = os.environ[name].split("x")
    return int(dp), int(tp)


def _titan() -> None:
    """TorchTitan-style training on the mesh TITAN_MESH (dp x tp) against one process on
    the global batch; saves at step TITAN_SAVE_AT, then (TITAN_RESUME_MESH) resumes that
    checkpoint on another mesh shape and continues the single-process curve."""
    tt = _titan_train()
    init()
    c = tt.Config()
    steps, save_at = int(os.environ["TITAN_STEPS"]), int(os.environ["TITAN_SAVE_AT"])
    ckpt, bf16 = os.environ["TITAN_CKPT"], os.environ.get("TITAN_BF16") == "1"
    compile = os.environ.get("TITAN_COMPILE") == "1"
    bound = float(os.environ.get("TITAN_BOUND", "1e-5"))
    reference = [tt.train_single(c, steps) if RANK == 0 else None]
    dist.broadcast_object_list(reference, src=0)
    reference = reference[0]
    dp, tp = _mesh_env("TITAN_MESH")

    @check("parity")
    def _():
        losses = tt.train_parallel(
            c, dp, tp, steps, bf16=bf16, compile=compile, save_at=save_at, ckpt=ckpt
        )
        error = tt.max_relative_error(losses, reference)
        results["parity_error"] = f"{error:.3e}"
        assert error <= bound, (error, losses, reference)

    if os.environ.get("TITAN_RESUME_MESH"):
        rdp, rtp = _mesh_env("TITAN_RESUME_MESH")

        @check("resume_on_another_mesh")
        def _():
            losses = tt.train_parallel(
                c, rdp, rtp, steps, start=save_at, resume=f"{ckpt}/step{save_at}"
            )
            error = tt.max_relative_error(losses, reference[save_at:])
            results["resume_error"] = f"{error:.3e}"
            assert error <= 1e-5, (error, losses, reference[save_at:])


def _titan_dies() -> None:
    """Rank 1 dies in the forward pass of step 2, after the checkpoint of step 1: the
    others must raise within the timeout; the checkpoint must stay loadable."""
    tt = _titan_train()
    init()
    ckpt = os.environ["TITAN_CKPT"]
    seen = {"steps": 0}

    def on_step(step, loss):
        seen["steps"] = step + 1

    def die_mid_step(module, args, output):
        if RANK == 1 and seen["steps"] == 2:
            os._exit(17)

    torch.nn.modules.module.register_module_forward_hook(die_mid_step)

    @check("peer_died_mid_step")
    def _():
        begin = time.monotonic()
        try:
            tt.train_parallel(
                tt.Config(), WORLD, 1, 4, save_at=1, ckpt=ckpt, ac=False, on_step=on_step
            )
            raise AssertionError("training went on without rank 1")
        except dist.DistBackendError as e:
            results["peer_died_error"] = str(e)
            results["peer_died_seconds"] = f"{time.monotonic() - begin:.1f}"
            results["_abandoned"] = "yes"
        assert seen["steps"] == 2, seen


def _dies() -> None:
    """One rank (TPU_DIST_DYING_RANK, default 1) dies after the first collective; the
    other's next one must raise."""
    init()
    x = tpu([1.0, 2.0])
    dist.all_reduce(x)
    if RANK == int(os.environ.get("TPU_DIST_DYING_RANK", "1")):
        os._exit(17)
    time.sleep(1.0)

    @check("peer_died")
    def _():
        begin = time.monotonic()
        try:
            dist.all_reduce(x)
            raise AssertionError("all_reduce with a dead peer returned")
        except dist.DistBackendError as e:
            results["peer_died_error"] = str(e)
            results["peer_died_seconds"] = f"{time.monotonic() - begin:.1f}"


def _hangs() -> None:
    """Rank 1 never calls the collective; rank 0 must time out with a clear error."""
    init()
    x = tpu([1.0, 2.0])
    dist.all_reduce(x)
    if RANK == 1:
        time.sleep(TIMEOUT.total_seconds() + 10)
        os._exit(0)

    @check("peer_hangs")
    def _():
        begin = time.monotonic()
        try:
            dist.all_reduce(x)
            raise AssertionError("all_reduce without its peer returned")
        except dist.DistBackendError as e:
            results["peer_hangs_error"] = str(e)
            results["peer_hangs_seconds"] = f"{time.monotonic() - begin:.1f}"
            results["_abandoned"] = "yes"


def _never_joins() -> None:
    """Only rank 0 is launched: init_process_group must fail within the timeout."""

    @check("never_joins")
    def _():
        begin = time.monotonic()
        try:
            init()
            raise AssertionError("init_process_group returned without its peer")
        except (RuntimeError, dist.DistError) as e:
            results["never_joins_error"] = f"{type(e).__name__}: {e}"
            results["never_joins_seconds"] = f"{time.monotonic() - begin:.1f}"


SCENARIOS = {
    "collectives": _collectives,
    "training": _training,
    "compile": _compile,
    "mesh4": _mesh4,
    "late_init": _late_init,
    "titan": _titan,
    "titan_dies": _titan_dies,
    "dies": _dies,
    "hangs": _hangs,
    "never_joins": _never_joins,
}

if __name__ == "__main__":
    main()
