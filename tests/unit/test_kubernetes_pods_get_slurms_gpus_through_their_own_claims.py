"""GPUs of Kubernetes-submitted pods: each pod asks by a DRA claim of its own (made from a
ResourceClaimTemplate); the gang's job asks Slurm for that many GPUs per task; once Slurm allocates,
each pod's claim gets exactly the devices behind its share of Slurm's indices on its node, written
before the pod is bound. What a claim asks that Slurm's choice cannot honour is refused, and a device
another claim still holds is never given twice."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from bridge.clients.kube.dra import ClaimCache, SliceCache
from bridge.clients.kube.workload_pods import WorkloadPodCache
from bridge.controller.device_claims import DeviceClaims
from bridge.controller.jobstore import JobStore
from bridge.controller.kube_workloads import KubeWorkloads
from bridge.controller.metrics import Metrics
from bridge.controller.sessions import SessionRegistry
from bridge.core.config import BridgeConfig
from bridge.core.device_claims import ClaimView, trim_claim
from bridge.core.errors import WorkloadError
from bridge.core.model import JobAllocation, JobPayload, NodeAllocation
from bridge.core.workload_placement import ClaimsNotReady, claim_gpus, place, task_shape
from bridge.core.workloads import WorkloadPod, gang_comment, job_request, trim_pod

from .builders import workloads_config

KEY = b"a-step-key-of-at-least-16-bytes"
DRIVER = "gpu.example.com"


def claim(name: str, owner_uid: str, *, count: int = 1, device_class: str = DRIVER,
          extra: dict[str, Any] | None = None, request: dict[str, Any] | None = None,
          held: list[str] | None = None, node: str = "kreal1",
          namespace: str = "team-alice") -> dict[str, Any]:
    exactly = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}
    status: dict[str, Any] = {}
    if held:
        status = {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": DRIVER, "pool": node, "device": d} for d in held]}}}
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": f"c-{name}",
                     "ownerReferences": [{"kind": "Pod", "name": "x", "uid": owner_uid, "controller": True}]},
        "spec": {"devices": {"requests": [request or {"name": "gpu", "exactly": exactly}], **(extra or {})}},
        "status": status,
    }


def pod(name: str, *, claims: int = 1, template: bool = True, made: bool = True, gang: str = "g",
        node: str = "", namespace: str = "team-alice") -> dict[str, Any]:
    entries = [{"name": f"gpu{i}", **({"resourceClaimTemplateName": "one-gpu"} if template
                                     else {"resourceClaimName": "shared"})} for i in range(claims)]
    statuses = [{"name": f"gpu{i}", "resourceClaimName": f"{name}-gpu{i}"} for i in range(claims)
                if made]
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": f"u-{name}",
                     "labels": {"slurm-k8s-bridge/gang": gang},
                     "annotations": {"slurm-k8s-bridge/gang-size": "2", "slurm-k8s-bridge/partition": "dra"},
                     "creationTimestamp": "2026-12-05T05:00:00Z"},
        "spec": {"schedulerName": "slurm-k8s-bridge", "nodeName": node, "resourceClaims": entries,
                 "securityContext": {"runAsUser": 2001, "runAsGroup": 2001},
                 "containers": [{"name": "c", "image": "busybox",
                                 "securityContext": {"allowPrivilegeEscalation": False},
                                 "resources": {"limits": {"cpu": "1", "memory": "64Mi"},
                                               "claims": [{"name": e["name"]} for e in entries]}}]},
        "status": {"phase": "Pending", "resourceClaimStatuses": statuses},
    }


def asking(**exactly: Any) -> dict[str, Any]:
    return {"name": "gpu", "exactly": {"deviceClassName": DRIVER, **exactly}}


def lookup(*claims: dict[str, Any]) -> Any:
    views = {f"{c['metadata']['namespace']}/{c['metadata']['name']}": trim_claim(c) for c in claims}
    return lambda namespace, name: views.get(f"{namespace}/{name}")


def test_a_pods_gpus_are_the_counts_of_its_own_claims() -> None:
    p = trim_pod(pod("w0", claims=2))
    found = lookup(claim("w0-gpu0", "u-w0", count=2), claim("w0-gpu1", "u-w0"))
    assert claim_gpus(p, found, DRIVER, "dra") == 3
    assert claim_gpus(trim_pod({**pod("w1"), "spec": {**pod("w1")["spec"], "resourceClaims": []}}),
                      found, DRIVER, "dra") == 0


@pytest.mark.parametrize(("the_claim", "words"), [
    (claim("w0-gpu0", "u-someone-else"), "not pod w0's own"),
    (claim("w0-gpu0", "u-w0", device_class="other.example.com"), "class other.example.com"),
    (claim("w0-gpu0", "u-w0", request=asking(adminAccess=True)), "admin access"),
    (claim("w0-gpu0", "u-w0", request=asking(allocationMode="All")), "all devices"),
    (claim("w0-gpu0", "u-w0", request={"name": "gpu", "firstAvailable": [{"name": "a"}]}), "alternatives"),
    (claim("w0-gpu0", "u-w0", extra={"constraints": [{"matchAttribute": "x"}]}), "constraints"),
    (claim("w0-gpu0", "u-w0", request=asking(selectors=[{"cel": {"expression": "true"}}])), "selectors"),
    (claim("w0-gpu0", "u-w0", held=["gpu-0"]), "allocated before Slurm"),
])
def test_a_claim_that_slurms_choice_cannot_honour_is_refused(the_claim: dict[str, Any], words: str) -> None:
    with pytest.raises(WorkloadError, match=words):
        claim_gpus(trim_pod(pod("w0")), lookup(the_claim), DRIVER, "dra")


def test_a_shared_claim_or_a_partition_without_dra_is_refused_and_an_unmade_one_waited_for() -> None:
    with pytest.raises(WorkloadError, match="shared ResourceClaim"):
        claim_gpus(trim_pod(pod("w0", template=False)), lookup(), DRIVER, "dra")
    with pytest.raises(WorkloadError, match="does not give GPUs by DRA"):
        claim_gpus(trim_pod(pod("w0")), lookup(claim("w0-gpu0", "u-w0")), None, "k8s")
    with pytest.raises(ClaimsNotReady):
        claim_gpus(trim_pod(pod("w0", made=False)), lookup(), DRIVER, "dra")
    with pytest.raises(ClaimsNotReady):
        claim_gpus(trim_pod(pod("w0")), lookup(), DRIVER, "dra")


def test_each_pod_gets_its_own_share_of_the_nodes_gpu_indices() -> None:
    pods = [trim_pod(pod(f"w{i}")) for i in range(3)]
    alloc = JobAllocation(job_id=7, state="RUNNING", nodes=(
        NodeAllocation("n1", 4, 0, gpu_indices=(2, 3)), NodeAllocation("n2", 4, 0, gpu_indices=(0,))))
    placed = place(pods, alloc, task_shape(pods), {"w0": 1, "w1": 1, "w2": 1})
    assert not isinstance(placed, str)
    assert [(placed[n].node, placed[n].gpus) for n in ("w0", "w1", "w2")] == [("n1", (2,)), ("n1", (3,)),
                                                                             ("n2", (0,))]
    # The CPUs would hold all three on n1; its GPUs do not, and none is given twice.
    too_few = JobAllocation(job_id=7, state="RUNNING",
                            nodes=(NodeAllocation("n1", 8, 0, gpu_indices=(2, 3)),))
    assert "2 GPUs" in str(place(pods, too_few, task_shape(pods), {"w0": 2, "w1": 1, "w2": 1}))


def test_the_gangs_job_asks_slurm_for_the_gpus_per_task(cfg: BridgeConfig) -> None:
    pods = [trim_pod(pod("w0")), trim_pod(pod("w1"))]
    assert job_request(pods, cfg.workloads, KEY, 2)["tres_per_task"] == "gres/gpu:2"
    assert "tres_per_task" not in job_request(pods, cfg.workloads, KEY, 0)
    limit = pod("w2")
    limit["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "1"
    with pytest.raises(WorkloadError, match="resourceClaimTemplateName"):
        job_request([trim_pod(limit)], cfg.workloads, KEY, 0)


# -- the controller, with fake verbs -----------------------------------------------------------------
@pytest.fixture
def cfg(tmp_path: Path) -> BridgeConfig:
    return workloads_config(tmp_path, KEY, f"""[partitions.k8s]
[partitions.dra]
gpu_mode = "dra"
dra_driver = "{DRIVER}"
[workloads.namespaces.team-alice]
user = "alice"
account = "lab_alice"
partition = "k8s"
partitions = ["dra"]
""")


class Verbs:
    def __init__(self) -> None:
        self.log: list[tuple[Any, ...]] = []

    async def mark_job(self, pod: WorkloadPod, job_id: int) -> bool:
        self.log.append(("mark", pod.name))
        return True

    async def bind(self, pod: WorkloadPod, node: str) -> bool:
        self.log.append(("bind", pod.name, node))
        return True

    async def record_gpus(self, pod: WorkloadPod, indices: tuple[int, ...]) -> bool:
        self.log.append(("record", pod.name, indices))
        return True

    async def allocate_claim(self, claim: ClaimView, status: dict[str, Any]) -> bool:
        results = status["allocation"]["devices"]["results"]
        reserved = [r["uid"] for r in status["reservedFor"]]
        self.log.append(("allocate", claim.name, tuple(r["device"] for r in results), tuple(reserved)))
        return True

    async def event(self, pod: WorkloadPod, kind: str, reason: str, message: str) -> None:
        self.log.append(("event", pod.name, reason, message))

    async def condition(self, pod: WorkloadPod, reason: str, message: str) -> None:
        pass

    async def delete(self, pod: WorkloadPod, grace_seconds: int | None = None) -> bool:
        self.log.append(("delete", pod.name, grace_seconds))
        return True


class Slurm:
    def __init__(self) -> None:
        self.jobs: list[dict[str, Any]] = []

    async def submit_job(self, user: str, job: dict[str, Any]) -> int:
        self.jobs.append(job)
        return 40

    async def cancel_job(self, job_id: int) -> None:
        self.jobs.append({"cancelled": job_id})


def a_slice(node: str, count: int = 4) -> dict[str, Any]:
    return {"metadata": {"name": f"{node}-slice"},
            "spec": {"driver": DRIVER, "nodeName": node, "pool": {"name": node, "generation": 1},
                     "devices": [{"name": f"gpu-{n}", "attributes": {"index": {"int": n}}}
                                 for n in range(count)]}}


class World:
    def __init__(self, cfg: BridgeConfig, pods: list[dict[str, Any]], claims: list[dict[str, Any]]) -> None:
        self.jobs = JobStore(None)  # type: ignore[arg-type]
        self.sessions = SessionRegistry()
        self.verbs = Verbs()
        self.slurm = Slurm()
        self.cache = WorkloadPodCache(cfg.workloads.namespaces, cfg.namespace)
        self.cache.replace_all([self.cache.trim(p) for p in pods])
        slices, claim_cache = SliceCache(), ClaimCache(cfg.namespace, cfg.cluster)
        slices.replace_all([slices.trim(a_slice("kreal1"))])
        claim_cache.replace_all([claim_cache.trim(c) for c in claims])
        devices = DeviceClaims(cfg, None, None, Metrics(), slices, claim_cache)  # type: ignore[arg-type]

        async def same_names(_partition: str) -> None:
            return None

        self.workloads = KubeWorkloads(cfg, self.slurm, self.jobs, self.sessions, self.cache,  # type: ignore[arg-type]
                                       self.verbs, Metrics(), same_names, devices)  # type: ignore[arg-type]

    def running(self, gpus: tuple[int, ...], tasks: int = 2) -> JobAllocation:
        comment = gang_comment(trim_pod(pod("w0")), "alice", KEY)
        alloc = JobAllocation(job_id=40, user="alice", uid=2001, gid=2001, partition="dra", state="RUNNING",
                              nodes=(NodeAllocation("kreal1", 8, 0, gpu_indices=gpus),), comment=comment,
                              tasks=tasks, start_time=int(time.time()))
        self.jobs.record(alloc)
        self.sessions.open(40, 0).attach({}, JobPayload(script="#!/bin/sh\n", environment={}, work_dir="/tmp",
                                                        uid=2001, gid=2001))
        return alloc


def marked(name: str) -> dict[str, Any]:
    p = pod(name)
    p["metadata"]["annotations"]["slurm-k8s-bridge/slurm-job-id"] = "40"
    return p


def test_a_gang_with_claims_is_submitted_with_its_gpus_per_task(cfg: BridgeConfig) -> None:
    world = World(cfg, [pod("w0"), pod("w1")], [claim("w0-gpu0", "u-w0"), claim("w1-gpu0", "u-w1", count=2)])
    asyncio.run(world.workloads.reconcile_gang("team-alice/group/g"))
    asked = [(j["tres_per_task"], j["partition"], j["tasks"]) for j in world.slurm.jobs]
    assert asked == [("gres/gpu:2", "dra", 2)]


def test_a_gang_whose_claims_are_not_made_yet_waits_without_submitting(cfg: BridgeConfig) -> None:
    world = World(cfg, [pod("w0"), pod("w1")], [claim("w0-gpu0", "u-w0")])
    asyncio.run(world.workloads.reconcile_gang("team-alice/group/g"))
    assert world.slurm.jobs == []


def test_each_pods_claim_gets_its_slurm_gpus_before_the_pod_is_bound(cfg: BridgeConfig) -> None:
    world = World(cfg, [marked("w0"), marked("w1")], [claim("w0-gpu0", "u-w0"), claim("w1-gpu0", "u-w1")])
    alloc = world.running((2, 3))
    asyncio.run(world.workloads.reconcile_job(40, alloc))
    assert world.verbs.log == [
        ("record", "w0", (2,)), ("allocate", "w0-gpu0", ("gpu-2",), ("u-w0",)), ("bind", "w0", "kreal1"),
        ("record", "w1", (3,)), ("allocate", "w1-gpu0", ("gpu-3",), ("u-w1",)), ("bind", "w1", "kreal1"),
    ]


def test_a_gpu_another_claim_still_holds_is_never_given_and_the_pod_not_bound(cfg: BridgeConfig) -> None:
    sbatch_jobs_claim = claim("slurm-9-0-gpu", "u-other", held=["gpu-3"], namespace="slurm-jobs")
    world = World(cfg, [marked("w0"), marked("w1")],
                  [claim("w0-gpu0", "u-w0"), claim("w1-gpu0", "u-w1"), sbatch_jobs_claim])
    alloc = world.running((2, 3))
    asyncio.run(world.workloads.reconcile_job(40, alloc))
    assert ("bind", "w1", "kreal1") not in world.verbs.log
    assert not any(entry[0] == "allocate" and entry[1] == "w1-gpu0" for entry in world.verbs.log)
    # Past the wait, the job fails with the reason, and the pods say it.
    world.jobs.record(JobAllocation(**{**alloc.__dict__, "start_time": int(time.time()) - 600}))
    asyncio.run(world.workloads.reconcile_job(40, world.jobs.get(40).alloc))  # type: ignore[union-attr]
    failed = [entry for entry in world.verbs.log if entry[0] == "event" and entry[2] == "SlurmJobFailed"]
    assert failed and "still held by ResourceClaim slurm-jobs/slurm-9-0-gpu" in failed[0][3]


def bound(name: str, gpus: str | None, *, job: str = "40", phase: str = "Running",
          deleting: bool = False) -> dict[str, Any]:
    p = marked(name)
    p["metadata"]["annotations"]["slurm-k8s-bridge/slurm-job-id"] = job
    if gpus is not None:
        p["metadata"]["annotations"]["slurm-k8s-bridge/slurm-gpus"] = gpus
    if deleting:
        p["metadata"]["deletionTimestamp"] = "2026-12-05T06:00:00Z"
    p["spec"]["nodeName"] = "kreal1"
    p["status"]["phase"] = phase
    return p


def test_a_bound_pod_keeps_its_gpus_even_when_its_claim_is_deleted(cfg: BridgeConfig) -> None:
    """w0 runs with Slurm's GPU 2 (its record); alice deletes its claim: w1 still gets GPU 3, never 2."""
    world = World(cfg, [bound("w0", "2"), marked("w1")], [claim("w1-gpu0", "u-w1")])
    asyncio.run(world.workloads.reconcile_job(40, world.running((2, 3))))
    assert ("allocate", "w1-gpu0", ("gpu-3",), ("u-w1",)) in world.verbs.log, world.verbs.log
    assert not any(e[0] == "allocate" and "gpu-2" in e[2] for e in world.verbs.log)


def test_a_gpu_another_jobs_live_pod_was_given_is_waited_for_whatever_its_claims(cfg: BridgeConfig) -> None:
    """Job 39's pod still runs on GPU 3 (its grace), its claim deleted by its user: job 40's pod waits
    for it, and the sbatch path does too; an ended pod, or a managed namespace's claim alone, holds
    nothing."""
    stale = claim("old-gpu0", "u-gone", held=["gpu-2"])  # kept allocated by its user, its pod gone
    world = World(cfg, [bound("old", "3", job="39"), marked("w0"), marked("w1")],
                  [claim("w0-gpu0", "u-w0"), claim("w1-gpu0", "u-w1"), stale])
    asyncio.run(world.workloads.reconcile_job(40, world.running((2, 3))))
    assert ("bind", "w0", "kreal1") in world.verbs.log  # GPU 2: only a stale claim of alice's holds it
    assert ("bind", "w1", "kreal1") not in world.verbs.log
    assert world.workloads.devices.workload_user_of("kreal1", 3) == "pod team-alice/old of Slurm job 39"
    assert world.workloads.devices.workload_user_of("kreal1", 2) is None
    ended = World(cfg, [bound("old", "3", job="39", phase="Succeeded")], [])
    assert ended.workloads.devices.workload_user_of("kreal1", 3) is None


def test_a_job_keeps_its_gpus_while_a_pod_its_owner_deleted_still_runs(cfg: BridgeConfig) -> None:
    """alice deletes a running pod (its grace is hers: the kubelet stops it within it, and nothing
    shortens that once begun): the job is not cancelled, so Slurm does not free its GPU, until the pod
    is gone; then it is."""
    world = World(cfg, [bound("w0", "2", deleting=True), bound("w1", "3")],
                  [claim("w0-gpu0", "u-w0", held=["gpu-2"]), claim("w1-gpu0", "u-w1", held=["gpu-3"])])
    alloc = world.running((2, 3))
    asyncio.run(world.workloads.reconcile_job(40, alloc))
    assert {"cancelled": 40} not in world.slurm.jobs
    world.cache.replace_all([world.cache.trim(bound("w1", "3"))])  # w0 is gone
    asyncio.run(world.workloads.reconcile_job(40, alloc))
    assert {"cancelled": 40} in world.slurm.jobs


def test_a_pod_joining_a_job_is_judged_as_a_submission_is(cfg: BridgeConfig) -> None:
    """A job of gang g lacks a pod (one was deleted before it ran); a privileged pod of the gang never
    completes it: refused, never marked."""
    bad = pod("w9")
    bad["spec"]["containers"][0]["securityContext"]["privileged"] = True
    world = World(cfg, [marked("w0"), bad], [claim("w0-gpu0", "u-w0"), claim("w9-gpu0", "u-w9")])
    comment = gang_comment(trim_pod(pod("w0")), "alice", KEY)
    world.jobs.record(JobAllocation(job_id=40, user="alice", uid=2001, gid=2001, partition="dra",
                                    state="PENDING", comment=comment, tasks=2))
    asyncio.run(world.workloads.reconcile_gang("team-alice/group/g"))
    assert ("mark", "w9") not in world.verbs.log
    assert any(e[0] == "event" and e[1] == "w9" and e[2] == "SlurmRefused" for e in world.verbs.log)
