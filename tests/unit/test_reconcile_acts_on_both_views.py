"""reconcile(job_id) against in-memory stand-ins for the two clients (the real PodCache):
what it creates, deletes and tells the waiter for each combination of Slurm view and pods."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from bridge.clients.kube.cache import PodCache
from bridge.controller.metrics import Metrics
from bridge.controller.reconcile import Reconciler
from bridge.core.config import PartitionConfig
from bridge.core.model import JobAllocation

from .builders import SecretStore, allocation, config, payload


class FakeSlurm:
    def __init__(self) -> None:
        self.comments: dict[int, str] = {}
        self.jobs: dict[int, JobAllocation] = {}
        """What GET /job/{id} answers (absent: Slurm does not know the job)."""
        self.reads: list[int] = []

    async def job(self, job_id: int) -> JobAllocation | None:
        self.reads.append(job_id)
        return self.jobs.get(job_id)

    async def set_comment(self, job_id: int, comment: str) -> None:
        self.comments[job_id] = comment


class FakeKube(SecretStore):
    def __init__(self, cache: PodCache) -> None:
        self.cache = cache
        self.created: list[dict[str, Any]] = []
        self.deleted: list[tuple[str, int | None]] = []
        self.labels: dict[str, str] = {}
        self.log_lines: dict[str, list[tuple[str, str]]] = {}

    async def create_pod(self, manifest: dict[str, Any]) -> bool:
        if self.cache.get(manifest["metadata"]["name"]):
            return False
        self.created.append(manifest)
        return True

    async def delete_pod(self, name: str, grace_seconds: int | None = None) -> bool:
        self.deleted.append((name, grace_seconds))
        return True

    async def nodes_by_label(self, label: str) -> dict[str, str]:
        return self.labels

    async def stream_logs(
        self, pod_name: str, since_time: str | None = None
    ) -> AsyncIterator[tuple[str, str]]:
        for item in self.log_lines.get(pod_name, []):
            yield item


def _pod(manifest: dict[str, Any], **status: Any) -> dict[str, Any]:
    return {"metadata": dict(manifest["metadata"]), "spec": manifest["spec"], "status": status}


def _terminated(code: int) -> dict[str, Any]:
    return {
        "phase": "Failed" if code else "Succeeded",
        "containerStatuses": [
            {
                "name": "job",
                "state": {"terminated": {"exitCode": code, "reason": "Error" if code else "Completed"}},
            }
        ],
    }


@pytest.fixture
def world() -> tuple[Reconciler, FakeKube, FakeSlurm, PodCache, list[int]]:
    cache = PodCache()
    kube, slurm = FakeKube(cache), FakeSlurm()
    requeued: list[int] = []
    cfg = config(partitions={"k8s": PartitionConfig(default_image="img:1", resolve_first_node=False)})
    reconciler = Reconciler(cfg, slurm, kube, cache, Metrics(), requeued.append)  # type: ignore[arg-type]
    return reconciler, kube, slurm, cache, requeued


def _see(reconciler: Reconciler, alloc: JobAllocation) -> None:
    """Slurm's view as a fresh read gives it (what the poller or an attach records)."""
    reconciler.jobs.record(replace(alloc, read_at=time.monotonic()))


def _attach(reconciler: Reconciler, job_id: int = 42) -> asyncio.Queue[dict[str, Any]]:
    session = reconciler.attach_session(job_id, payload())
    session.payload = payload()
    return session.attach({})


async def test_a_running_job_with_its_waiter_gets_one_pod_per_node(world: Any) -> None:
    reconciler, kube, _slurm, _cache, _ = world
    _see(reconciler, allocation())
    _attach(reconciler)

    await reconciler.reconcile(42)

    assert [(m["metadata"]["name"], m["spec"]["nodeName"]) for m in kube.created] == [
        ("slurm-42-0", "kube1"),
        ("slurm-42-1", "kube2"),
    ]


async def test_pods_already_there_are_not_created_again(world: Any) -> None:
    reconciler, kube, _slurm, cache, _ = world
    _see(reconciler, allocation())
    _attach(reconciler)
    await reconciler.reconcile(42)
    for manifest in kube.created:
        cache.apply("ADDED", _pod(manifest, phase="Pending"))
    kube.created.clear()

    await reconciler.reconcile(42)
    await reconciler.reconcile(42)

    assert kube.created == []


async def test_without_a_waiter_nothing_is_created(world: Any) -> None:
    reconciler, kube, *_ = world
    _see(reconciler, allocation())

    await reconciler.reconcile(42)

    assert kube.created == []


async def _running_with_a_waiter(world: Any) -> Any:
    """Job 42 running in its pods, its waiter attached: the waiter's event queue."""
    reconciler, kube, _slurm, cache, _ = world
    _see(reconciler, allocation())
    queue = _attach(reconciler)
    await reconciler.reconcile(42)
    for manifest in kube.created:
        cache.apply("ADDED", _pod(manifest, phase="Running"))
    return queue


async def test_a_job_slurm_ended_loses_its_pods_and_its_session(world: Any) -> None:
    reconciler, kube, _slurm, cache, _ = world
    await _running_with_a_waiter(world)
    _see(reconciler, replace(allocation(), state="COMPLETED"))

    await reconciler.reconcile(42)
    assert sorted(kube.deleted) == [("slurm-42-0", None), ("slurm-42-1", None)]
    for manifest in kube.created:
        cache.apply("DELETED", _pod(manifest))
    await reconciler.reconcile(42)

    assert reconciler.sessions.of_job(42) == []


async def test_cancel_gives_the_pods_their_grace_then_tells_the_waiter_once_they_are_gone(world: Any) -> None:
    reconciler, kube, _slurm, cache, _ = world
    queue = await _running_with_a_waiter(world)
    reconciler.sessions.of_job(42)[0].cancel_requested = True

    await reconciler.reconcile(42)
    # None: the pod's own terminationGracePeriodSeconds (termination_grace_s), like KillWait; a
    # script's TERM trap gets that long to clean up.
    assert {grace for _, grace in kube.deleted} == {None}
    told = []
    while not queue.empty():
        told.append(queue.get_nowait()["type"])
    assert told == ["stopping"], "the waiter must not leave while pods still run, only hear they stop"
    for manifest in kube.created:
        cache.apply("DELETED", _pod(manifest))
    await reconciler.reconcile(42)

    event = queue.get_nowait()
    assert (event["type"], event["signal"]) == ("exit", 15)


async def test_stopped_pods_of_an_ended_job_are_removed_at_once(world: Any) -> None:
    reconciler, kube, _slurm, cache, _ = world
    _see(reconciler, replace(allocation(), state="CANCELLED"))
    manifest = {
        "metadata": {"name": "slurm-42-0", "labels": {"slurm-k8s-bridge/job-id": "42"}},
        "spec": {"nodeName": "kube1"},
    }
    cache.apply(
        "ADDED",
        _pod(manifest, **_terminated(143))
        | {"metadata": {**manifest["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}},
    )

    await reconciler.reconcile(42)

    assert kube.deleted == [("slurm-42-0", 0)]


async def test_the_exit_code_waits_for_the_logs_and_takes_the_highest_code(world: Any) -> None:
    reconciler, kube, _slurm, cache, requeued = world
    _see(reconciler, allocation())
    queue = _attach(reconciler)
    await reconciler.reconcile(42)
    kube.log_lines = {
        "slurm-42-0": [("2026-11-30T10:00:00.1Z", "zero")],
        "slurm-42-1": [("2026-11-30T10:00:00.2Z", "one")],
    }
    for manifest, code in zip(kube.created, (2, 5), strict=True):
        cache.apply("MODIFIED", _pod(manifest, **_terminated(code)))

    await reconciler.reconcile(42)  # starts the log relays; the exit must wait for them
    await asyncio.sleep(0.05)
    await reconciler.reconcile(42)

    events = [queue.get_nowait() for _ in range(queue.qsize())]
    assert sorted(e["line"] for e in events if e["type"] == "log") == ["one", "zero"]
    assert events[-1] == {"type": "exit", "code": 5, "signal": None, "reason": ""}
    assert 42 in requeued, "a drained log stream wakes the job up again"


async def test_a_bad_directive_fails_the_job_with_the_reason_in_its_comment(world: Any) -> None:
    reconciler, kube, slurm, *_ = world
    _see(reconciler, allocation())
    session = reconciler.attach_session(42, payload())
    session.payload = payload(script="#!/bin/sh\n#K8S colour=blue\necho hi\n")
    queue = session.attach({})

    await reconciler.reconcile(42)

    event = queue.get_nowait()
    assert (event["type"], event["code"]) == ("exit", 1)
    assert "colour" in event["reason"]
    assert "colour" in slurm.comments[42]
    assert kube.created == []


async def test_the_reason_is_the_jobs_comment_before_its_waiter_is_told(world: Any) -> None:
    """Once the waiter has the exit, the job ends, and a user (or a test) reading its record must
    find the reason there: in CI the comment landed after `scontrol show job` had been read."""
    reconciler, _, slurm, *_ = world
    _see(reconciler, allocation())
    session = reconciler.attach_session(42, payload())
    session.payload = payload(script="#!/bin/sh\n#K8S colour=blue\necho hi\n")
    queue = session.attach({})
    commented_before_told: list[bool] = []
    set_comment = slurm.set_comment

    async def noting(job_id: int, comment: str) -> None:
        commented_before_told.append(queue.empty())
        await set_comment(job_id, comment)

    slurm.set_comment = noting

    await reconciler.reconcile(42)

    assert queue.get_nowait()["type"] == "exit"
    assert commented_before_told == [True]


async def test_nodes_mapped_by_label_pin_pods_to_the_labelled_nodes(world: Any) -> None:
    reconciler, kube, *_ = world
    reconciler.cfg = reconciler.creation.cfg = config(
        partitions={"k8s": PartitionConfig(default_image="img:1", resolve_first_node=False,
                                           node_label="site/slurm")}
    )
    kube.labels = {"kube1": "k8s-node-a", "kube2": "k8s-node-b"}
    _see(reconciler, allocation())
    _attach(reconciler)

    await reconciler.reconcile(42)

    assert [m["spec"]["nodeName"] for m in kube.created] == ["k8s-node-a", "k8s-node-b"]


async def test_a_failed_rank_waits_for_the_ranks_still_starting(world: Any) -> None:
    reconciler, kube, _slurm, cache, _ = world
    _see(reconciler, allocation())
    queue = _attach(reconciler)
    await reconciler.reconcile(42)
    first, second = kube.created
    cache.apply("MODIFIED", _pod(first, **_terminated(2)))
    cache.apply("MODIFIED", _pod(second, phase="Pending"))

    await reconciler.reconcile(42)
    await asyncio.sleep(0.05)
    await reconciler.reconcile(42)
    assert all(e["type"] != "exit" for e in [queue.get_nowait() for _ in range(queue.qsize())])

    cache.apply("MODIFIED", _pod(second, **_terminated(5)))
    await reconciler.reconcile(42)
    await asyncio.sleep(0.05)
    await reconciler.reconcile(42)
    events = [queue.get_nowait() for _ in range(queue.qsize())]
    assert events[-1]["type"] == "exit"
    assert events[-1]["code"] == 5, "the highest code, as srun"


async def test_the_attach_to_pod_latency_is_measured_once_per_run(world: Any) -> None:
    reconciler, _kube, _slurm, _cache, _ = world
    _see(reconciler, allocation())
    _attach(reconciler)
    await reconciler.reconcile(42)
    await reconciler.reconcile(42)

    count = reconciler.metrics.registry.get_sample_value("slurm_k8s_bridge_attach_to_pod_seconds_count")
    assert count == 1.0


async def test_a_pass_asks_to_look_again_when_the_start_deadline_runs_out(world: Any) -> None:
    """No pod event comes when a pod's start deadline runs out: the pass asks for a look then (its
    Result), and one with nothing pending asks for none."""
    reconciler, kube, _slurm, cache, _ = world
    _see(reconciler, allocation())
    _attach(reconciler)
    await reconciler.reconcile(42)
    started = (datetime.now(UTC) - timedelta(seconds=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
    for manifest in kube.created:
        pending = _pod(manifest, phase="Pending")
        pending["metadata"]["creationTimestamp"] = started  # the cache keeps this, not startTime
        cache.apply("ADDED", pending)

    waiting = await reconciler.reconcile(42)

    grace = reconciler.cfg.start_failure_grace_s
    assert waiting.requeue_after == pytest.approx(grace - 10 + 0.1, abs=1.5)

    for manifest in kube.created:
        cache.apply("MODIFIED", _pod(manifest, phase="Running", containerStatuses=[
            {"name": "job", "state": {"running": {"startedAt": started}}}]))
    assert (await reconciler.reconcile(42)).requeue_after is None


@pytest.mark.parametrize(("state", "reason"), [
    ("CANCELLED", ""), ("TIMEOUT", ""), ("PREEMPTED", ""),
    ("NODE_FAIL", "this run of the job is over (NODE_FAIL)"),
])
async def test_slurms_own_end_seen_before_the_waiters_word_adds_no_line_to_the_output(
    world: Any, state: str, reason: str,
) -> None:
    """scancel, a time limit or a preemption: slurmstepd writes its own "*** JOB ... CANCELLED
    ***" line, natively too. Slurm's watch may show the run over before the waiter's cancel
    request arrives (CI saw it); a line of the bridge's own after slurmstepd's would differ from
    native output."""
    reconciler, kube, _slurm, cache, _ = world
    queue = await _running_with_a_waiter(world)
    _see(reconciler, replace(allocation(), state=state))
    await reconciler.reconcile(42)
    for manifest in kube.created:
        cache.apply("DELETED", _pod(manifest))
    await reconciler.reconcile(42)

    events = []
    while not queue.empty():
        events.append(queue.get_nowait())
    assert events[-1]["type"] == "exit"
    assert events[-1]["reason"] == reason
