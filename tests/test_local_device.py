"""One rank per device on a multi-device host: the selection rules of local_device.py.

The rules are pure functions of the environment, so every platform's branch is checked
here; tests/test_distributed.py's four-rank test runs them for real on XLA:CPU (each
process seeing four devices). What only a GPU/TPU host could confirm (that the
plugins honour these settings) is listed in docs/distributed.md.
"""

from __future__ import annotations

import pytest

from torch_tpu import local_device

TORCHRUN_4 = {"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "4", "RANK": "2"}


def test_outside_torchrun_nothing_is_restricted_and_the_first_device_is_used():
    assert local_device.visibility(None, {}) == local_device.Visibility()
    assert local_device.index({}, 8) == 0


@pytest.mark.parametrize("count", [1, 4])
def test_the_device_of_local_rank_when_the_process_sees_several(count):
    # one visible device: visibility already hid the others; several: pick LOCAL_RANK's
    assert local_device.index(TORCHRUN_4, count) == (0 if count == 1 else 2)


def test_more_local_ranks_than_visible_devices_is_a_clear_error():
    with pytest.raises(RuntimeError, match="LOCAL_RANK=2 but this process sees only 2"):
        local_device.index(TORCHRUN_4, 2)


def test_bad_local_rank_is_a_clear_error():
    with pytest.raises(ValueError, match="LOCAL_RANK=4 is outside LOCAL_WORLD_SIZE=4"):
        local_device.local_rank({"LOCAL_RANK": "4", "LOCAL_WORLD_SIZE": "4"})


def test_gpu_hosts_restrict_jax_to_the_local_rank_gpu():
    v = local_device.visibility("gpu", TORCHRUN_4)
    assert v.jax_config == {"jax_cuda_visible_devices": "2", "jax_rocm_visible_devices": "2"}
    assert v.env == {}
    # the user's own CUDA_VISIBLE_DEVICES layout is theirs
    own = {**TORCHRUN_4, "CUDA_VISIBLE_DEVICES": "5"}
    assert local_device.visibility("gpu", own).jax_config == {}


def test_tpu_hosts_give_libtpu_one_chip_per_process():
    v = local_device.visibility("tpu", TORCHRUN_4)
    port = local_device.TPU_BASE_PORT
    assert v.env == {
        "TPU_VISIBLE_CHIPS": "2",
        "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1",
        "TPU_PROCESS_BOUNDS": "2,2,1",
        "TPU_PROCESS_ADDRESSES": ",".join(f"localhost:{port + i}" for i in range(4)),
        "TPU_PROCESS_PORT": str(port + 2),
        "CLOUD_TPU_TASK_ID": "2",
    }
    assert v.jax_config == {}


def test_tpu_settings_the_user_made_or_multi_host_jobs_are_left_alone():
    assert local_device.visibility("tpu", {**TORCHRUN_4, "TPU_VISIBLE_CHIPS": "0"}).env == {}
    assert local_device.visibility("tpu", {**TORCHRUN_4, "WORLD_SIZE": "8"}).env == {}


def test_unknown_platform_sets_both_and_forced_cpu_sets_nothing():
    both = local_device.visibility(None, TORCHRUN_4)
    assert both.env["TPU_VISIBLE_CHIPS"] == "2"
    assert both.jax_config["jax_cuda_visible_devices"] == "2"
    assert local_device.visibility("cpu", TORCHRUN_4) == local_device.Visibility()
