"""salloc and a bare srun in a bridged partition (issue 18): Slurm says the job has no batch script;
its first step's environment names the image; every pod only holds its node for the user's steps;
user-step tasks have keys and pid files of their own."""

from __future__ import annotations

import asyncio

import pytest

from bridge.clients.kube.cache import PodCache
from bridge.controller.jobstore import JobStore
from bridge.controller.run_pods import RunPods
from bridge.controller.sessions import SessionRegistry
from bridge.controller.user_steps import (
    UserStepRefused,
    UserSteps,
    allocation_payload,
    task_key,
)
from bridge.core import agent_protocol, wellknown
from bridge.core.config import BridgeConfig, PartitionConfig, PodsConfig
from bridge.core.directives import parse_directives
from bridge.core.model import allocation_from_rest
from bridge.core.translate import desired_pods
from tests.unit.builders import allocation, config

AGENT = "sandbox.local/agent:1"


def _agent_config() -> BridgeConfig:
    return config(pods=PodsConfig(supplemental_groups_policy="", agent_image=AGENT),
                  partitions={"k8s": PartitionConfig()})


def test_slurmrestds_batch_flag_tells_an_allocation_from_a_batch_job() -> None:
    record = {"job_id": 7, "job_state": ["RUNNING"], "nodes": "", "batch_flag": False}
    assert allocation_from_rest(record).batch is False
    assert allocation_from_rest({**record, "batch_flag": True}).batch is True
    # Records without the field (older servers) are batch jobs, as every bridged job was.
    assert allocation_from_rest({k: v for k, v in record.items() if k != "batch_flag"}).batch is True


def test_the_first_steps_image_becomes_the_allocations_directive() -> None:
    alloc = allocation(batch=False)
    made = allocation_payload(alloc, {"SLURM_K8S_IMAGE": "busybox:1.36", "HOME": "/h"}, "/home/alice")
    assert made.allocation and parse_directives(made.script).image == "busybox:1.36"
    assert (made.uid, made.gid, made.work_dir) == (alloc.uid, alloc.gid, alloc.work_dir)
    without = allocation_payload(alloc, {}, "/tmp")
    assert parse_directives(without.script).image is None  # the partition's default applies


@pytest.mark.parametrize("image", ["a b", "busybox\n#K8S workdir=/etc", "x" * 5000, "-rf"])
def test_an_image_that_is_not_an_image_name_is_refused_with_the_reason(image: str) -> None:
    with pytest.raises(UserStepRefused, match="SLURM_K8S_IMAGE"):
        allocation_payload(allocation(batch=False), {"SLURM_K8S_IMAGE": image}, "/tmp")


def test_every_pod_of_an_allocation_only_holds_its_node() -> None:
    alloc = allocation(batch=False)
    made = allocation_payload(alloc, {"SLURM_K8S_IMAGE": "busybox:1.36"}, "/home/alice")
    pods = desired_pods(alloc, made, parse_directives(made.script), PartitionConfig(), _agent_config())
    assert len(pods) == 2
    for pod in pods:
        (container,) = pod["spec"]["containers"]
        assert container["image"] == "busybox:1.36"
        assert container["command"][1:] == ["wait"], container["command"]
        assert wellknown.ANNOTATION_SCRIPT_DELIVERY not in pod["metadata"]["annotations"]


def test_a_batch_jobs_first_pod_still_runs_the_script() -> None:
    from tests.unit.builders import payload

    pods = desired_pods(allocation(), payload(), parse_directives(payload().script), PartitionConfig(),
                        _agent_config())
    assert pods[0]["spec"]["containers"][0]["command"][1] == "run"
    assert pods[1]["spec"]["containers"][0]["command"][1:] == ["wait"]


def test_user_step_keys_and_pid_files_stay_apart_from_the_scripts_steps() -> None:
    assert task_key("3") == "u3"
    assert agent_protocol.task_pidfile("u3", "1") != agent_protocol.task_pidfile("3", "1")
    assert agent_protocol.task_pidfile("u3", "1").endswith("/tasks/u3-1.pid")
    for bad in ("", "3;rm", "../3", "u3", "4294967296999"):
        with pytest.raises(UserStepRefused):
            task_key(bad)
    with pytest.raises(ValueError):
        agent_protocol.task_pidfile("u../x", "0")


class _Slurm:
    async def read_job(self, job_id: int) -> None:
        return None


def _user_steps(batch: bool, state: str = "RUNNING") -> tuple[UserSteps, SessionRegistry, list[int]]:
    jobs = JobStore(_Slurm())  # type: ignore[arg-type]
    jobs.record(allocation(batch=batch, state=state))
    sessions = SessionRegistry()
    woken: list[int] = []
    steps = UserSteps(config(), jobs, RunPods(jobs, PodCache()), sessions, woken.append)
    return steps, sessions, woken


def test_the_first_step_of_an_allocation_opens_its_session_and_wakes_the_job() -> None:
    steps, sessions, woken = _user_steps(batch=False)

    async def ask() -> None:
        with pytest.raises(UserStepRefused, match="cannot run steps: no image"):
            task = asyncio.ensure_future(steps.pod_for(42, "kube1", {"SLURM_K8S_IMAGE": "busybox:1"}, "/tmp"))
            await asyncio.sleep(0.05)
            session = sessions.get(42, 0)
            assert session is not None and session.payload is not None and session.payload.allocation
            assert woken == [42]
            # The pods could not start: the step hears why, at once.
            session.finish({"type": "exit", "code": 1, "reason": "no image"})
            await task

    asyncio.run(ask())


def test_a_batch_jobs_user_step_opens_nothing() -> None:
    steps, sessions, woken = _user_steps(batch=True)

    async def ask() -> None:
        task = asyncio.ensure_future(steps.pod_for(42, "kube1", {}, "/tmp"))
        await asyncio.sleep(0.05)
        assert sessions.get(42, 0) is None and woken == []
        task.cancel()

    asyncio.run(ask())


@pytest.mark.parametrize(("node", "state", "why"), [
    ("kube9", "RUNNING", "not one of job 42's"),
    ("kube1", "PENDING", "not running"),
    ("kube1", "COMPLETED", "not running"),
])
def test_a_step_on_a_node_or_job_it_does_not_hold_is_refused(node: str, state: str, why: str) -> None:
    steps, _, _ = _user_steps(batch=False, state=state)
    with pytest.raises(UserStepRefused, match=why):
        asyncio.run(steps.pod_for(42, node, {}, "/tmp"))
