"""Issue 8, cause 3: a session lives as long as its run. Cancelled and timed-out jobs drop theirs
(they leaked), and a requeued job (same id, next restart count) gets a clean session and fresh
pods: the old run's pods are deleted, never adopted, and its exit is never replayed."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

import pytest

from bridge.clients.kube.cache import PodCache
from bridge.controller.metrics import Metrics
from bridge.controller.reconcile import Reconciler
from bridge.core.config import PartitionConfig
from bridge.core.model import JobAllocation

from .builders import RecordingKube, allocation, config, payload


class Slurm:
    async def set_comment(self, job_id: int, comment: str) -> None:
        pass


class Kube(RecordingKube):
    def __init__(self, cache: PodCache) -> None:
        super().__init__(cache, container_running=True)

    async def stream_logs(self, pod_name: str, since_time: str | None = None) -> Any:
        return
        yield

    def end(self, job_id: int, code: int) -> None:
        """Every container of the job's cached pods exits with `code`."""
        for pod in self.cache.pods_of(job_id):
            self.cache.apply("MODIFIED", {**pod, "status": {
                "phase": "Failed" if code else "Succeeded",
                "containerStatuses": [{"name": "job", "state": {"terminated": {"exitCode": code}}}],
            }})

    def vanish(self, job_id: int) -> None:
        for pod in self.cache.pods_of(job_id):
            self.cache.apply("DELETED", pod)


@pytest.fixture
def world() -> tuple[Reconciler, Kube]:
    cache = PodCache()
    kube = Kube(cache)
    cfg = config(partitions={"k8s": PartitionConfig(default_image="img:1", resolve_first_node=False)})
    return Reconciler(cfg, Slurm(), kube, cache, Metrics(), lambda _job: None), kube  # type: ignore[arg-type]


def see(reconciler: Reconciler, alloc: JobAllocation) -> None:
    reconciler.jobs.record(replace(alloc, read_at=time.monotonic()))


def attach(reconciler: Reconciler, **env: str) -> asyncio.Queue[dict[str, Any]]:
    """What api.attach does for a waiter (its environment as Slurm gave it)."""
    sent = payload(environment={**payload().environment, **env})
    session = reconciler.attach_session(42, sent)
    session.payload = sent
    return session.attach({})


def drain(queue: asyncio.Queue[dict[str, Any]]) -> list[dict[str, Any]]:
    return [queue.get_nowait() for _ in range(queue.qsize())]


@pytest.mark.parametrize("ended", ["CANCELLED", "TIMEOUT"])
async def test_the_session_of_a_cancelled_or_timed_out_job_is_ended_and_dropped(
    world: tuple[Reconciler, Kube], ended: str
) -> None:
    reconciler, kube = world
    see(reconciler, allocation())
    queue = attach(reconciler)
    await reconciler.reconcile(42)
    reconciler.sessions.of_job(42)[0].cancel_requested = True  # the waiter got SIGTERM
    await reconciler.reconcile(42)
    kube.vanish(42)
    await reconciler.reconcile(42)
    assert drain(queue)[-1]["signal"] == 15

    see(reconciler, allocation(state=ended))
    await reconciler.reconcile(42)

    assert reconciler.sessions.of_job(42) == [], "the session leaks"
    assert len(reconciler.sessions) == 0


async def test_a_waiter_still_connected_when_slurm_ends_its_run_is_told_and_released(
    world: tuple[Reconciler, Kube],
) -> None:
    reconciler, kube = world
    see(reconciler, allocation())
    queue = attach(reconciler)
    await reconciler.reconcile(42)

    see(reconciler, allocation(state="FAILED"))  # e.g. NODE_FAIL, or ended behind our back
    await reconciler.reconcile(42)
    kube.vanish(42)
    await reconciler.reconcile(42)

    events = drain(queue)
    assert events and events[-1]["type"] == "exit", "the attach stream would wait for ever"
    assert reconciler.sessions.of_job(42) == []


async def test_a_requeued_job_runs_in_fresh_pods_and_never_replays_the_old_exit(
    world: tuple[Reconciler, Kube],
) -> None:
    reconciler, kube = world
    see(reconciler, allocation())
    first = attach(reconciler)
    await reconciler.reconcile(42)
    kube.end(42, 3)
    await reconciler.reconcile(42)
    await asyncio.sleep(0.01)  # the log relays drain
    await reconciler.reconcile(42)
    assert drain(first)[-1]["code"] == 3

    # scontrol requeue: the same job id, the next restart count; the old pods are still cached.
    see(reconciler, allocation(state="PENDING", state_flags=frozenset({"COMPLETING", "REQUEUED"}), run=1))
    await reconciler.reconcile(42)
    assert set(kube.deleted) == {"slurm-42-0", "slurm-42-1"}, "the previous run's pods must go"
    kube.vanish(42)
    await reconciler.reconcile(42)
    assert reconciler.sessions.of_job(42) == [], "the old run's session must end with its pods"
    see(reconciler, allocation(run=1))
    second = attach(reconciler, SLURM_RESTART_COUNT="1")
    await reconciler.reconcile(42)

    assert kube.created[2:] == ["slurm-42-r1-0", "slurm-42-r1-1"], "the new run adopted the old pods"
    assert all(e["type"] != "exit" for e in drain(second)), "the old run's exit was replayed"
    assert [s.run for s in reconciler.sessions.of_job(42)] == [1]


async def test_a_waiter_of_the_previous_run_never_joins_the_new_run() -> None:
    cache = PodCache()
    reconciler = Reconciler(config(), Slurm(), Kube(cache), cache, Metrics(), lambda _job: None)  # type: ignore[arg-type]
    see(reconciler, allocation(run=2))

    late = reconciler.attach_session(42, payload(environment={"SLURM_RESTART_COUNT": "1"}))
    current = reconciler.attach_session(42, payload(environment={"SLURM_RESTART_COUNT": "2"}))
    inherited = reconciler.attach_session(43, payload(environment={"SLURM_RESTART_COUNT": "5"}))

    assert (late.run, current.run) == (1, 2)
    assert inherited.run == 0, "a value inherited from the submitting shell cannot exceed Slurm's run"
