"""Issue 21: a step's task sees in its pod the GPUs slurmstepd gave that task (--gpus-per-task,
--gres of a step, --gpu-bind), numbered as the pod numbers its own; never another of the pod's."""

from __future__ import annotations

import pytest

from bridge.core.job_environment import GPU_ORDINAL_VARIABLES, task_gpu_environment
from bridge.core.step_request import TASK_UNSET, set_task_gpus


@pytest.mark.parametrize(
    ("step_gpus", "pod_gpus", "ordinals"),
    [
        ("0", (0, 1), "0"),  # -n 2 --gpus-per-task=1 on an idle node: rank 0
        ("1", (0, 1), "1"),  # rank 1
        ("3", (2, 3), "1"),  # the job holds physical 2 and 3: 3 is the pod's second GPU
        ("2,3", (0, 2, 3), "1,2"),  # a step of two of the job's three
        ("7,2", (2, 7), "1,0"),  # in Slurm's order, each to its place in the pod
    ],
)
def test_a_task_gets_its_own_gpus_as_the_pods_ordinals(step_gpus: str, pod_gpus: tuple[int, ...],
                                                       ordinals: str) -> None:
    settings, unset = task_gpu_environment(step_gpus, pod_gpus)
    assert settings == dict.fromkeys(GPU_ORDINAL_VARIABLES, ordinals)
    assert unset == []


def test_a_gpu_the_pod_does_not_hold_is_never_named() -> None:
    # A planted or stale SLURM_STEP_GPUS cannot widen what the task sees: 5 is not the pod's.
    settings, _ = task_gpu_environment("1,5", (0, 1))
    assert settings["CUDA_VISIBLE_DEVICES"] == "1"


@pytest.mark.parametrize("step_gpus", [None, "", "9", "x"])
def test_a_step_without_gpus_of_the_pod_has_the_ordinals_unset_as_slurm_does(step_gpus: str | None) -> None:
    # srun --gres=none in a GPU job: slurmstepd unsets CUDA_VISIBLE_DEVICES & co for the task.
    settings, unset = task_gpu_environment(step_gpus, (0, 1))
    assert settings == {}
    assert unset == list(GPU_ORDINAL_VARIABLES)


def test_a_pod_without_gpus_is_left_as_it_is() -> None:
    assert task_gpu_environment("0", ()) == ({}, [])


def test_set_task_gpus_overrides_the_step_env_and_tells_the_agent_what_to_unset() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_STEP_GPUS": "1"}
    set_task_gpus(env, "1", (0, 1))
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and env["GPU_DEVICE_ORDINAL"] == "1"
    assert TASK_UNSET not in env

    env = {"CUDA_VISIBLE_DEVICES": "0,1"}
    set_task_gpus(env, None, (0, 1))
    assert "CUDA_VISIBLE_DEVICES" not in env
    assert env[TASK_UNSET].split(",") == list(GPU_ORDINAL_VARIABLES)


def test_an_allocation_not_yet_known_leaves_the_pods_own_variables() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "0,1"}
    set_task_gpus(env, "1", None)
    assert env == {"CUDA_VISIBLE_DEVICES": "0,1"}
