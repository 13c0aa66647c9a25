"""Issue 8, cause 2: between a create and its ADDED event the cache has no pod. A reconcile in that
gap must neither fail the job ("deleted outside Slurm") nor create again; once the expectation
times out without the pod ever showing, the absence is believed."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

from bridge.clients.kube.cache import PodCache
from bridge.controller.expectations import CreateExpectations
from bridge.controller.metrics import Metrics
from bridge.controller.reconcile import Reconciler
from bridge.core.config import PartitionConfig

from .builders import SecretStore, allocation, config, payload


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Kube(SecretStore):
    """Creates succeed at once; the cache only hears of them when the test delivers the event."""

    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []
        self.deleted: list[str] = []

    async def create_pod(self, manifest: dict[str, Any]) -> bool:
        self.created.append(manifest)
        return True

    async def delete_pod(self, name: str, grace_seconds: int | None = None) -> bool:
        self.deleted.append(name)
        return True


class Slurm:
    async def set_comment(self, job_id: int, comment: str) -> None:
        pass


World = tuple[Reconciler, Kube, PodCache, Clock, asyncio.Queue[dict[str, Any]]]


def world() -> World:
    cache, kube, clock = PodCache(), Kube(), Clock()
    cfg = config(partitions={"k8s": PartitionConfig(default_image="img:1", resolve_first_node=False)})
    reconciler = Reconciler(
        cfg, Slurm(), kube, cache, Metrics(), lambda _job: None,  # type: ignore[arg-type]
        expectations=CreateExpectations(timeout_s=30.0, clock=clock),
    )
    reconciler.jobs.record(replace(allocation(), read_at=time.monotonic()))
    session = reconciler.attach_session(42, payload())
    session.payload = payload()
    return reconciler, kube, cache, clock, session.attach({})


def added(cache: PodCache, manifest: dict[str, Any]) -> None:
    pod = {"metadata": manifest["metadata"], "spec": manifest["spec"], "status": {"phase": "Pending"}}
    cache.apply("ADDED", pod)


async def test_a_reconcile_before_the_added_event_neither_fails_nor_creates_again() -> None:
    reconciler, kube, cache, _clock, queue = world()
    await reconciler.reconcile(42)
    assert len(kube.created) == 2

    result = await reconciler.reconcile(42)  # the pod watch has not delivered ADDED yet

    assert queue.empty(), f"the job was failed while its pods were being created: {queue.get_nowait()}"
    assert len(kube.created) == 2, "created twice"
    assert result.requeue_after is not None and 0 < result.requeue_after <= 30.1, \
        "the expiry of the expectation must be looked at"
    for manifest in kube.created:
        added(cache, manifest)
    await reconciler.reconcile(42)
    assert queue.empty() and len(kube.created) == 2
    assert len(reconciler.expectations) == 0, "the cache seeing the pods satisfies the expectations"


async def test_a_pod_the_cache_never_shows_is_believed_gone_once_the_expectation_expires() -> None:
    reconciler, _kube, _cache, clock, queue = world()
    await reconciler.reconcile(42)

    clock.now += 31
    await reconciler.reconcile(42)

    event = queue.get_nowait()
    assert (event["type"], event["code"]) == ("exit", 1)
    assert "deleted outside Slurm" in event["reason"]


async def test_a_pod_seen_and_then_deleted_fails_the_job_at_once() -> None:
    reconciler, kube, cache, _clock, queue = world()
    await reconciler.reconcile(42)
    for manifest in kube.created:
        added(cache, manifest)
    await reconciler.reconcile(42)
    for manifest in kube.created:
        cache.apply("DELETED", {"metadata": manifest["metadata"]})

    await reconciler.reconcile(42)

    event = queue.get_nowait()
    assert "deleted outside Slurm" in event["reason"]
