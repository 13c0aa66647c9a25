"""The Kubernetes-submitted path's controller (bridge.controller.kube_workloads) with fake Slurm and
Kubernetes verbs: whose job a pod joins, when it is bound, how the job ends. Each case is an attack
or a race found by the adversarial review or the load test with kill -9."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bridge.clients.kube.workload_pods import WorkloadPodCache
from bridge.controller.device_claims import DeviceClaims
from bridge.controller.jobstore import JobStore
from bridge.controller.kube_workloads import KubeWorkloads
from bridge.controller.metrics import Metrics
from bridge.controller.sessions import SessionRegistry
from bridge.core.config import BridgeConfig
from bridge.core.model import JobAllocation, JobPayload, NodeAllocation
from bridge.core.workloads import WorkloadPod, gang_comment, trim_pod

from .builders import workloads_config

KEY = b"a-step-key-of-at-least-16-bytes"


class Verbs:
    def __init__(self) -> None:
        self.log: list[tuple[str, ...]] = []

    async def mark_job(self, pod: WorkloadPod, job_id: int) -> bool:
        self.log.append(("mark", pod.name, str(job_id)))
        return True

    async def bind(self, pod: WorkloadPod, node: str) -> bool:
        self.log.append(("bind", pod.name, node))
        return True

    async def delete(self, pod: WorkloadPod, grace_seconds: int | None = None) -> bool:
        self.log.append(("delete", pod.name))
        return True

    async def event(self, pod: WorkloadPod, kind: str, reason: str, message: str) -> None:
        self.log.append(("event", pod.name, reason))

    async def condition(self, pod: WorkloadPod, reason: str, message: str) -> None:
        pass

    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return {"metadata": {"uid": "JUID"}, "spec": {"parallelism": 2, "completions": 2}, "status": {}}


class Slurm:
    def __init__(self) -> None:
        self.log: list[tuple[str, ...]] = []

    async def submit_job(self, user: str, job: dict[str, Any]) -> int:
        self.log.append(("submit", user))
        return 999

    async def cancel_job(self, job_id: int) -> None:
        self.log.append(("cancel", str(job_id)))


@pytest.fixture
def cfg(tmp_path: Path) -> BridgeConfig:
    return workloads_config(tmp_path, KEY, """[partitions.k8s]
[workloads.namespaces.team-alice]
user = "alice"
account = "lab_alice"
partition = "k8s"
[workloads.namespaces.team-bob]
user = "bob"
account = "lab_bob"
partition = "k8s"
""")


def pod(name: str, namespace: str = "team-alice", *, job: int | None = None, uid: int = 2001,
        gang: str | None = None, phase: str = "Pending", node: str = "", deleting: bool = False,
        code: int | None = None) -> dict[str, Any]:
    annotations = {"slurm-k8s-bridge/slurm-job-id": str(job)} if job else {}
    labels = {}
    if gang:
        labels["slurm-k8s-bridge/gang"] = gang
        annotations["slurm-k8s-bridge/gang-size"] = "2"
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"u-{name}", "labels": labels,
                            "annotations": annotations, "creationTimestamp": "2026-12-05T05:00:00Z"}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-05T05:01:00Z"
    statuses = [{"name": "c", "state": {"terminated": {"exitCode": code}}}] if code is not None else []
    return {"metadata": meta,
            "spec": {"schedulerName": "slurm-k8s-bridge", "nodeName": node,
                     "securityContext": {"runAsUser": uid, "runAsGroup": uid},
                     "containers": [{"name": "c", "image": "busybox",
                                     "securityContext": {"allowPrivilegeEscalation": False},
                                     "resources": {"limits": {"cpu": "1", "memory": "64Mi"}}}]},
            "status": {"phase": phase, "containerStatuses": statuses}}


class World:
    def __init__(self, cfg: BridgeConfig, *pods: dict[str, Any]) -> None:
        self.jobs = JobStore(None)  # type: ignore[arg-type]
        self.sessions = SessionRegistry()
        self.verbs = Verbs()
        self.slurm = Slurm()
        self.cache = WorkloadPodCache(cfg.workloads.namespaces, cfg.namespace)
        self.cache.replace_all([self.cache.trim(p) for p in pods])

        async def same_names(_partition: str) -> None:
            return None

        self.workloads = KubeWorkloads(
            cfg, self.slurm, self.jobs, self.sessions, self.cache,  # type: ignore[arg-type]
            self.verbs, Metrics(), same_names, DeviceClaims(cfg, None, None, Metrics()))  # type: ignore[arg-type]

    def running(self, job_id: int, user: str, uid: int, comment: str, tasks: int) -> JobAllocation:
        alloc = JobAllocation(job_id=job_id, user=user, uid=uid, gid=uid, partition="k8s", state="RUNNING",
                              nodes=(NodeAllocation("kreal1", 8, 8192),), comment=comment, tasks=tasks,
                              start_time=int(time.time()))
        self.jobs.record(alloc)
        session = self.sessions.open(job_id, 0)
        payload = JobPayload(script="#!/bin/sh\n", environment={}, work_dir="/tmp", uid=uid, gid=uid)
        session.attach({}, payload)
        return alloc

    def signed(self, name: str, namespace: str, user: str, **kw: Any) -> str:
        return gang_comment(trim_pod(pod(name, namespace, **kw)), user, KEY)


def test_a_mark_on_a_pod_never_takes_over_another_users_sbatch_job(cfg: BridgeConfig) -> None:
    """alice marks her pod with bob's sbatch job (where admission did not guard the mark): that job is
    not a gang's, so its own path runs it, and her pod is never bound into bob's allocation."""
    world = World(cfg, pod("evil", job=500, uid=2002))
    bob = world.running(500, "bob", 2002, comment="", tasks=1)
    assert not world.workloads.owns(500, bob)
    # Even with bob's job a gang's (his own signed comment), alice's pod is not of his gang.
    bobs = replace(bob, comment=world.signed("w0", "team-bob", "bob", gang="train"))
    assert world.workloads.owns(500, bobs) and world.workloads.members(500, bobs) == []


def test_a_comment_a_user_writes_adopts_no_gang(cfg: BridgeConfig) -> None:
    """alice's sbatch job with a comment naming bob's gang (unsigned, or signed for her) is never
    given bob's waiting pods; his gang gets a job of its own, submitted as bob."""
    world = World(cfg, pod("w0", "team-bob", gang="train", uid=2002),
                  pod("w1", "team-bob", gang="train", uid=2002))
    for comment in ("slurm-k8s-bridge workload team-bob/group/train x Group team-bob/train",
                    world.signed("w0", "team-bob", "alice", gang="train")):
        world.jobs.record(JobAllocation(job_id=600, user="alice", uid=2001, gid=2001, partition="k8s",
                                        state="PENDING", comment=comment, tasks=2))
        world.workloads._gang_index_at = float("-inf")
        asyncio.run(world.workloads.reconcile_gang("team-bob/group/train"))
        assert ("submit", "bob") in world.slurm.log
        assert not any(entry[0] == "mark" and entry[2] == "600" for entry in world.verbs.log), world.verbs.log
        world.slurm.log.clear()
        world.workloads.gangs._submitted.clear()


def test_a_gang_half_marked_before_a_restart_is_completed_not_split(cfg: BridgeConfig) -> None:
    """Killed between the marks: the restarted daemon marks the rest with the same job, and submits
    nothing (the load test with kill -9 saw gangs split into two Slurm jobs)."""
    world = World(cfg, pod("a", job=700, gang="g"), pod("b", gang="g"))
    comment = world.signed("a", "team-alice", "alice", gang="g")
    world.jobs.record(JobAllocation(job_id=700, user="alice", uid=2001, gid=2001, partition="k8s",
                                    state="PENDING", comment=comment, tasks=2))
    asyncio.run(world.workloads.reconcile_gang("team-alice/group/g"))
    assert world.slurm.log == []
    assert ("mark", "b", "700") in world.verbs.log


def test_no_pod_is_bound_before_every_task_is_marked(cfg: BridgeConfig) -> None:
    """The waiter attached before the cache saw the second mark: nothing is bound, nothing fails."""
    world = World(cfg, pod("a", job=800, gang="g"))
    alloc = world.running(800, "alice", 2001, world.signed("a", "team-alice", "alice", gang="g"), tasks=2)
    result = asyncio.run(world.workloads.reconcile_job(800, alloc))
    assert result.requeue_after is not None
    assert not [e for e in world.verbs.log if e[0] == "bind"]
    session = world.sessions.get(800, 0)
    assert session is not None and session.final is None
    world.cache.apply("ADDED", pod("b", job=800, gang="g"))
    asyncio.run(world.workloads.reconcile_job(800, alloc))
    assert {e[1] for e in world.verbs.log if e[0] == "bind"} == {"a", "b"}


def test_a_failed_pod_and_its_deleted_sibling_end_the_job_with_the_failures_code(cfg: BridgeConfig) -> None:
    """One pod exits 3; its Job controller deletes the other (backoffLimit 0): that is no owner's
    cancel, and once the deleted one has stopped the job ends 3 (not CANCELLED 0:0)."""
    comment_world = World(cfg)
    comment = comment_world.signed("a", "team-alice", "alice", gang="g")
    world = World(cfg, pod("a", job=900, gang="g", node="kreal1", phase="Failed", code=3),
                  pod("b", job=900, gang="g", node="kreal1", phase="Running", deleting=True))
    alloc = world.running(900, "alice", 2001, comment, tasks=2)
    asyncio.run(world.workloads.reconcile_job(900, alloc))
    assert world.slurm.log == []
    session = world.sessions.get(900, 0)
    assert session is not None and session.final is None  # b still stops
    world.cache.apply("DELETED", pod("b", job=900, gang="g"))
    asyncio.run(world.workloads.reconcile_job(900, alloc))
    assert session.final is not None and session.final["code"] == 3
