"""tpu_dist: collectives, DDP and FSDP2 across processes on XLA:CPU over loopback.

Each test launches its ranks once (tests/distributed_workers/worker.py) and the
worker runs a scenario's checks, writing one result per check: importing torch and
JAX costs seconds per process, so checks share launches.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).parent / "distributed_workers" / "worker.py"
REPO = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(
    scenario: str,
    world: int,
    tmp_path,
    *,
    ranks=None,
    timeout_s=60,
    explicit=False,
    deadline=240,
    extra_env=None,
) -> list[dict]:
    """Run `scenario` on ranks 0..world-1 (or only `ranks`); each rank's results."""
    port = _free_port()
    out = tmp_path / scenario
    procs = []
    for rank in ranks if ranks is not None else range(world):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "TPU_DIST_TIMEOUT": str(timeout_s),
            "TORCH_TPU_PLATFORM": "cpu",
            **(extra_env or {}),
        }
        if explicit:  # init_method, rank and world size passed to init_process_group
            for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
                env[f"TPU_DIST_{name}"] = env.pop(name)
            env["TPU_DIST_INIT"] = f"tcp://127.0.0.1:{port}"
        procs.append(
            subprocess.Popen(
                [sys.executable, str(WORKER), scenario, str(out)],
                env=env,
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=deadline)[0] + f"\n[exit code {p.returncode}]")
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError(f"{scenario}: ranks still running after {deadline}s") from None
    for log in logs:  # ranks share the suite's cache directory, each under its own keys
        assert "is corrupt" not in log, log[-3000:]
    results = []
    for rank, log in zip(ranks if ranks is not None else range(world), logs):
        path = Path(f"{out}.{rank}")
        if not path.exists():
            results.append({"_log": log[-3000:]})
            continue
        data = json.loads(path.read_text())
        data["_log"] = log[-3000:]
        data["_exit"] = procs[len(results)].returncode
        results.append(data)
    return results


def assert_ok(results: list[dict], names) -> None:
    for rank, result in enumerate(results):
        for name in names:
            assert result.get(name) == "ok", (
                f"rank {rank} {name}: {result.get(name, 'not run')}\n{result['_log']}"
            )


COLLECTIVES = [
    *(f"all_reduce_{op}" for op in ("SUM", "AVG", "MAX", "MIN", "PRODUCT")),
    *(f"all_reduce_torch.{t}" for t in ("int64", "bfloat16", "bool", "float64")),
    "all_reduce_async_and_view",
    "broadcast_bit_exact",
    "broadcast_complex",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    *(f"reduce_scatter_tensor_{op}" for op in ("SUM", "AVG", "MAX")),
    "all_to_all_single_even",
    "all_to_all_single_uneven",
    "all_to_all_list",
    "gather",
    "scatter",
    "send_recv",
    "barrier_and_objects",
    "mismatched_shapes_raise_then_group_works",
    "mismatched_dtypes_raise",
    "collectives_on_both_sides_of_the_envelope",
    "mismatch_across_the_envelope_raises_then_group_works",
    "async_collectives_do_not_wait_for_late_peers",
    "every_program_is_above_xla_cpus_inline_threshold",
    "collectives_on_one_tensor_keep_their_order",
    "wrong_device_raises",
    "functional_collectives",
    "dtensor",
]


def test_collectives_with_explicit_init_method(tmp_path):
    """Every collective, sync and async, against CPU references; bad input errors."""
    results = launch("collectives", 2, tmp_path, explicit=True)
    assert_ok(results, COLLECTIVES)
    assert all(r["_exit"] == 0 for r in results)


def test_ddp_and_fsdp2_match_single_process_training(tmp_path):
    """torchrun-style env init; DDP parameters (1e-5) and FSDP2 GPT losses step by step
    against single-process training on the global batch, in strict and fused eager."""
    results = launch("training", 2, tmp_path)
    assert_ok(
        results,
        [
            f"{kind}_matches_single_process_{mode}"
            for kind in ("ddp", "fsdp2_gpt")
            for mode in ("strict", "fused")
        ],
    )


def test_tensors_made_before_init_process_group_stay_valid(tmp_path):
    """The guide's order: a tpu model and a sanity batch on one device, then
    init_process_group; values, views and optimizer state survive, DDP matches."""
    results = launch("late_init", 2, tmp_path)
    assert_ok(
        results,
        [
            "tensors_made_before_init_keep_their_values",
            "all_reduce_of_a_tensor_made_before_init",
            "ddp_after_a_sanity_batch_matches_single_process",
        ],
    )


def test_subgroups_and_2d_device_mesh_on_four_ranks(tmp_path):
    """Also one rank per device on a multi-device host: each process sees four XLA:CPU
    devices (as every process on a GPU/TPU host sees every accelerator), rank r must
    compute on device LOCAL_RANK, and the collectives run between the chosen devices."""
    results = launch(
        "mesh4", 4, tmp_path, extra_env={"JAX_NUM_CPU_DEVICES": "4", "LOCAL_WORLD_SIZE": "4"}
    )
    assert_ok(
        results,
        [
            "rank_computes_on_its_local_rank_device",
            "collectives_between_local_rank_devices",
            "new_group_all_reduce",
            "new_group_broadcast_group_src",
            "device_mesh_2x2",
            "world_all_reduce_4",
        ],
    )


@pytest.mark.parametrize("dying", [0, 1], ids=["coordinator_rank_dies", "other_rank_dies"])
def test_a_rank_that_dies_gives_a_clear_error_not_an_abort(tmp_path, monkeypatch, dying):
    monkeypatch.setenv("TPU_DIST_DYING_RANK", str(dying))
    results = launch("dies", 2, tmp_path, explicit=True, timeout_s=20)
    survivor = results[1 - dying]
    assert_ok([survivor], ["peer_died"])
    assert "peer process died" in survivor["peer_died_error"]
    assert float(survivor["peer_died_seconds"]) < 20
    assert survivor["_exit"] == 0, survivor["_log"]  # no LOG(FATAL) from JAX's client


def test_a_rank_that_hangs_times_out_with_a_clear_error(tmp_path):
    results = launch("hangs", 2, tmp_path, explicit=True, timeout_s=5)
    assert_ok(results[:1], ["peer_hangs"])
    assert "did not complete within the process group timeout" in results[0]["peer_hangs_error"]
    assert 4 < float(results[0]["peer_hangs_seconds"]) < 15


def test_a_rank_that_never_joins_fails_init_within_the_timeout(tmp_path):
    results = launch("never_joins", 2, tmp_path, ranks=[0], explicit=True, timeout_s=5)
    assert_ok(results, ["never_joins"])
    assert float(results[0]["never_joins_seconds"]) < 15, results[0]["never_joins_error"]


@pytest.mark.slow  # reason: torchrun's agent plus two training processes, ~40 s here
def test_ddp_example_under_torchrun():
    env = {**os.environ, "TORCH_TPU_PLATFORM": "cpu", "TORCH_TPU_PERSISTENT_CACHE": "0"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(REPO / "examples" / "ddp_train.py"),
            "--steps",
            "5",
        ],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "matches single-process training" in done.stdout, done.stdout[-3000:]


def test_compiled_graphs_with_functional_collectives_match_eager(tmp_path):
    """torch.compile graphs holding funcol collectives (compute -> all_reduce -> compute, a
    mix of five collectives, a backward through all_reduce, a DDP-like gradient average
    plus SGD step, a DTensor column/row-parallel MLP) give eager's values on the same
    ranks, and metrics show each graph ran as compiled segments with the collectives
    between them, none op by op."""
    results = launch("compile", 2, tmp_path)
    assert_ok(
        results,
        [
            "compiled_compute_all_reduce_compute",
            "compiled_collective_mix",
            "compiled_backward_through_all_reduce",
            "compiled_ddp_like_training_step",
            "compiled_tensor_parallel_block",
            "compute_written_after_a_collective_runs_while_it_is_in_flight",
        ],
    )


def test_jax_arrays_that_are_not_tpu_tensors_block_the_restart_with_a_clear_error():
    """Only tpu storages can be moved across the backend restart; a user's own JAX array
    on the device would silently stop working, so init refuses and says why."""
    import jax.numpy as jnp

    from torch_tpu.distributed import relocate

    own = jnp.arange(5.0) + 1
    with pytest.raises(RuntimeError, match=r"JAX array\(s\) that are not tpu tensors"):
        relocate.hold()
    del own
