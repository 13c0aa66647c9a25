"""The `dra` GPU mode's decisions (controller.device_claims), on in-memory caches and a recording
Kubernetes: a pod waiting for its GPUs gets its claim created, allocated to exactly Slurm's devices
and reserved for it, then is bound, each only for the incarnation seen; a device another workload
holds fails the job with the claim's name (a forged label changes nothing); a claim of ours whose
pod is gone is deleted and waited for; and no wait lasts past its limit."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import structlog

from bridge.clients.kube.cache import PodCache
from bridge.clients.kube.dra import ClaimCache, SliceCache
from bridge.controller.device_claims import CLAIM_WAIT_S, RETRY_S, DeviceClaims
from bridge.controller.metrics import Metrics
from bridge.controller.sessions import JobSession
from bridge.core import wellknown
from bridge.core.config import PartitionConfig
from bridge.core.model import NodeAllocation
from bridge.core.pod_view import PodView, pod_view

from .builders import allocation, config

LOG = structlog.get_logger("test")
DRIVER = "gpu.example.com"
PART = PartitionConfig(gpu_mode="dra", dra_driver=DRIVER)
ALLOC = allocation(
    partition="dra", nodes=(NodeAllocation("kreal1", cpus=1, memory_mb=1, gpu_indices=(1, 3)),)
)
POD = "slurm-42-0"


class RecordingKube:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    async def create_claim(self, manifest: dict[str, Any]) -> str | None:
        self.calls.append(
            ("create", manifest["metadata"]["name"], manifest["metadata"]["ownerReferences"][0]["uid"])
        )
        return "claim-uid"

    async def allocate_claim(self, name: str, uid: str, status: dict[str, Any]) -> None:
        devices = [r["device"] for r in status["allocation"]["devices"]["results"]]
        self.calls.append(("allocate", name, uid, devices, status["reservedFor"][0]["uid"]))

    async def delete_claim(self, name: str, *, uid: str | None = None) -> bool:
        self.calls.append(("delete", name, uid))
        return True

    async def bind_pod(self, name: str, uid: str, node: str) -> bool:
        self.calls.append(("bind", name, uid, node))
        return True


def _world(age_s: float = 1.0) -> tuple[DeviceClaims, RecordingKube, PodCache, PodView]:
    pods = PodCache()
    created = (datetime.now(UTC) - timedelta(seconds=age_s)).strftime("%Y-%m-%dT%H:%M:%SZ")
    pod = {
        "metadata": {
            "name": POD,
            "uid": "pod-uid",
            "creationTimestamp": created,
            "labels": {wellknown.LABEL_JOB_ID: "42"},
            "annotations": {wellknown.ANNOTATION_NODE_INDEX: "0", wellknown.ANNOTATION_KUBE_NODE: "kreal1"},
        },
        "spec": {},
        "status": {"phase": "Pending"},
    }
    pods.replace_all([pod])
    slices = SliceCache()
    slices.replace_all(
        [
            slices.trim(
                {
                    "metadata": {"name": "s"},
                    "spec": {
                        "driver": DRIVER,
                        "nodeName": "kreal1",
                        "pool": {"name": "kreal1", "generation": 1},
                        "devices": [
                            {"name": f"gpu-{n}", "attributes": {"index": {"int": n}}} for n in range(4)
                        ],
                    },
                }
            )
        ]
    )
    claims = ClaimCache("slurm-jobs", "sandbox")
    claims.replace_all([])
    kube = RecordingKube()
    owner = DeviceClaims(config(namespace="slurm-jobs"), kube, pods, Metrics(), slices, claims)  # type: ignore[arg-type]
    return owner, kube, pods, pod_view(pod)


def _holding(
    namespace: str, name: str, device: str, *, labels: dict[str, str], owner_uid: str = ""
) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": namespace, "name": name, "uid": f"uid-of-{name}", "labels": labels}
    if owner_uid:
        meta["ownerReferences"] = [
            {"kind": "Pod", "name": name.removesuffix("-gpus"), "uid": owner_uid, "controller": True}
        ]
    return {
        "metadata": meta,
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"request": "gpus", "driver": DRIVER, "pool": "kreal1", "device": device}]
                }
            }
        },
    }


OURS = {wellknown.LABEL_MANAGED_BY: wellknown.MANAGER, wellknown.LABEL_CLUSTER: "sandbox"}


async def test_the_claim_is_made_allocated_and_reserved_before_the_pod_is_bound() -> None:
    owner, kube, _pods, view = _world()
    assert await owner.prepare(JobSession(job_id=42), ALLOC, PART, [view], LOG) is None
    assert kube.calls == [
        ("create", "slurm-42-0-gpus", "pod-uid"),
        ("allocate", "slurm-42-0-gpus", "claim-uid", ["gpu-1", "gpu-3"], "pod-uid"),
        ("bind", POD, "pod-uid", "kreal1"),
    ]


async def test_a_device_another_workload_holds_fails_the_job_even_under_our_label() -> None:
    owner, kube, _pods, view = _world()
    # Someone else's claim, in their namespace, wearing the bridge's label.
    owner.claims.apply("ADDED", _holding("ml-team", "theirs", "gpu-3", labels=OURS))
    reason = await owner.prepare(JobSession(job_id=42), ALLOC, PART, [view], LOG)
    assert isinstance(reason, str) and "held by ResourceClaim ml-team/theirs" in reason
    assert "GPU index 3 on kreal1" in reason
    assert kube.calls == []


async def test_a_claim_of_ours_whose_pod_is_gone_is_deleted_and_waited_for() -> None:
    owner, kube, _pods, view = _world()
    owner.claims.apply(
        "ADDED", _holding("slurm-jobs", "slurm-41-0-gpus", "gpu-1", labels=OURS, owner_uid="gone")
    )
    assert await owner.prepare(JobSession(job_id=42), ALLOC, PART, [view], LOG) == RETRY_S
    assert kube.calls == [("delete", "slurm-41-0-gpus", "uid-of-slurm-41-0-gpus")]


async def test_a_claim_of_this_name_from_an_earlier_pod_is_replaced() -> None:
    owner, kube, _pods, view = _world()
    owner.claims.apply(
        "ADDED", _holding("slurm-jobs", "slurm-42-0-gpus", "gpu-0", labels=OURS, owner_uid="old")
    )
    assert await owner.prepare(JobSession(job_id=42), ALLOC, PART, [view], LOG) == RETRY_S
    assert kube.calls == [("delete", "slurm-42-0-gpus", "uid-of-slurm-42-0-gpus")]


async def test_no_wait_outlasts_its_limit() -> None:
    limit = max(CLAIM_WAIT_S, config().start_failure_grace_s)
    owner, kube, _pods, view = _world(age_s=limit + 1)
    owner.slices.synced.clear()  # never listed: the mapping would be a guess
    reason = await owner.prepare(JobSession(job_id=42), ALLOC, PART, [view], LOG)
    assert reason == (
        f"the pod on kreal1 got no GPUs in {limit:.0f} s: the cluster's ResourceSlices "
        "and ResourceClaims are not listed yet"
    )
    short = _world(age_s=1)[0]
    short.slices.synced.clear()
    assert await short.prepare(JobSession(job_id=42), ALLOC, PART, [pod_view(_pod_of(short))], LOG) == RETRY_S
    assert kube.calls == []


def _pod_of(owner: DeviceClaims) -> dict[str, Any]:
    pod = owner._pods.get(POD)
    assert pod is not None
    return pod


async def test_bound_pods_and_other_partitions_are_left_alone() -> None:
    owner, kube, _pods, view = _world()
    bound = PodView(**{**view.__dict__, "node_name": "kreal1"})
    assert await owner.prepare(JobSession(job_id=42), ALLOC, PART, [bound], LOG) is None
    reason = await owner.prepare(JobSession(job_id=42), ALLOC, PartitionConfig(), [view], LOG)
    assert isinstance(reason, str) and 'no longer "dra"' in reason
    assert kube.calls == []


async def test_nothing_is_allocated_while_the_claim_watch_fails() -> None:
    owner, kube, _pods, view = _world()
    owner.claim_watch_failing = lambda: True
    assert await owner.prepare(JobSession(job_id=42), ALLOC, PART, [view], LOG) == RETRY_S
    assert kube.calls == []
    owner.claim_watch_failing = lambda: False
    assert await owner.prepare(JobSession(job_id=42), ALLOC, PART, [view], LOG) is None
    assert [call[0] for call in kube.calls] == ["create", "allocate", "bind"]


async def test_the_sweep_deletes_only_our_claims_whose_pod_is_gone() -> None:
    owner, kube, _pods, _view = _world()
    owner.claims.apply(
        "ADDED", _holding("slurm-jobs", "slurm-42-0-gpus", "gpu-1", labels=OURS, owner_uid="pod-uid")
    )
    owner.claims.apply(
        "ADDED", _holding("slurm-jobs", "slurm-40-0-gpus", "gpu-2", labels=OURS, owner_uid="gone")
    )
    other_cluster = {**OURS, wellknown.LABEL_CLUSTER: "elsewhere"}
    owner.claims.apply("ADDED", _holding("slurm-jobs", "slurm-39-0-gpus", "gpu-0", labels=other_cluster))
    owner.claims.apply("ADDED", _holding("ml-team", "slurm-38-0-gpus", "gpu-3", labels=OURS))
    assert await owner.sweep() == 1
    assert kube.calls == [("delete", "slurm-40-0-gpus", "uid-of-slurm-40-0-gpus")]
