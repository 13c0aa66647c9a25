"""A pod's log relay starts once the pod is placed on a node, not when the pod watch shows its
container started (the kubelet reports that at its next relist, up to a second later): a short
script's output and end reach the waiter that much sooner. While the container is still being made,
the log endpoint refuses (400 "waiting to start", or 404 from a kubelet that has not seen the pod);
the relay asks again a bounded number of times, then waits for the watch, and no line is lost.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest

from bridge.clients.kube.cache import PodCache
from bridge.clients.kube.errors import KubeNotFound, LogsNotReady
from bridge.controller import log_relay
from bridge.controller.metrics import Metrics
from bridge.controller.reconcile import Reconciler
from bridge.controller.sessions import JobSession
from bridge.core.config import PartitionConfig

from .builders import SecretStore, allocation, config, payload

PENDING = {"phase": "Pending", "containerStatuses": [
    {"name": "job", "state": {"waiting": {"reason": "ContainerCreating"}}}]}
RUNNING = {"phase": "Running", "containerStatuses": [{"name": "job", "state": {"running": {}}}]}
EXITED = {"phase": "Succeeded",
          "containerStatuses": [{"name": "job", "state": {"terminated": {"exitCode": 0}}}]}


class Kube(SecretStore):
    """One pod, placed and still being made; its container starts when the test says so, which
    the pod watch (the cache) does not show until the test says that too."""

    def __init__(self, cache: PodCache) -> None:
        self.cache = cache
        self.started = False
        self.refusal = "not-ready"
        """What a read of a container not started yet meets: "not-ready" (400) or "not-found" (404)."""
        self.log: list[tuple[str, str]] = [("2026-12-01T10:00:01Z", "early line")]
        self.reads = 0

    async def create_pod(self, manifest: dict[str, Any]) -> bool:
        assert manifest["spec"].get("nodeName"), "the bridge places its pods itself"
        self.cache.apply("ADDED", {**manifest, "status": PENDING})
        return True

    async def delete_pod(self, name: str, grace_seconds: int | None = None) -> bool:
        return True

    async def stream_logs(
            self, pod_name: str, since_time: str | None = None) -> AsyncIterator[tuple[str, str]]:
        self.reads += 1
        if not self.started:
            if self.refusal == "not-found":
                raise KubeNotFound(f"cannot read the log of pod {pod_name}: HTTP 404 NotFound", status=404,
                                   reason="NotFound", what=f"read the log of pod {pod_name}")
            raise LogsNotReady(f'container "job" in pod "{pod_name}" is waiting to start: ContainerCreating')
        for stamp, line in list(self.log):
            if since_time is None or stamp > since_time:
                yield stamp, line

    def set_status(self, status: dict[str, Any]) -> None:
        for pod in self.cache.pods_of(42):
            self.cache.apply("MODIFIED", {**pod, "status": status})


class Slurm:
    async def set_comment(self, job_id: int, comment: str) -> None:
        pass


async def until(probe: Any, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not probe():
            await asyncio.sleep(0.01)


async def _attached(
        kube: Kube, cache: PodCache) -> tuple[Reconciler, JobSession, asyncio.Queue[dict[str, Any]]]:
    cfg = config(partitions={"k8s": PartitionConfig(default_image="img:1")})
    reconciler = Reconciler(cfg, Slurm(), kube, cache, Metrics(), lambda _job: None)  # type: ignore[arg-type]
    reconciler.jobs.record(replace(allocation(nodes=allocation().nodes[:1]), read_at=time.monotonic()))
    session = reconciler.attach_session(42, payload())
    session.payload = payload()
    queue = session.attach({})
    await reconciler.reconcile(42)  # creates the pod
    await reconciler.reconcile(42)  # sees it placed: starts its relay
    return reconciler, session, queue


def _lines(queue: asyncio.Queue[dict[str, Any]]) -> list[str]:
    return [e["line"] for e in (queue.get_nowait() for _ in range(queue.qsize())) if e["type"] == "log"]


@pytest.fixture
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(log_relay, "EARLY_LOG_RETRY_S", 0.01, raising=False)


@pytest.mark.parametrize("refusal", ["not-ready", "not-found"])
async def test_output_arrives_before_the_watch_shows_the_container_started(
        refusal: str, quick_retries: None) -> None:
    cache = PodCache()
    kube = Kube(cache)
    kube.refusal = refusal
    _, session, queue = await _attached(kube, cache)
    await until(lambda: kube.reads >= 2)  # refused while the container is being made
    kube.started = True
    await until(lambda: queue.qsize() > 0)
    assert _lines(queue) == ["early line"]
    assert cache.pods_of(42)[0]["status"] == PENDING, "the watch was not what started the relay"
    kube.set_status(EXITED)
    await until(lambda: "slurm-42-0" in session.logs.done)


@pytest.mark.parametrize("refusal", ["not-ready", "not-found"])
async def test_a_container_slow_to_start_is_asked_for_a_bounded_number_of_times_then_waits_for_the_watch(
        refusal: str, quick_retries: None) -> None:
    cache = PodCache()
    kube = Kube(cache)
    kube.refusal = refusal
    reconciler, session, queue = await _attached(kube, cache)
    await until(lambda: "slurm-42-0" in session.logs.await_start)
    assert kube.reads == log_relay.EARLY_LOG_ATTEMPTS + 1
    await reconciler.reconcile(42)  # the watch shows nothing new: no relay, no read
    await asyncio.sleep(0.1)
    assert kube.reads == log_relay.EARLY_LOG_ATTEMPTS + 1 and "slurm-42-0" not in session.logs.tasks
    # More 404s than a started pod's relay would bear (LOG_NOT_FOUND_ATTEMPTS): nothing given up.
    assert "slurm-42-0" not in session.logs.done

    kube.started = True
    kube.set_status(RUNNING)
    await reconciler.reconcile(42)
    await until(lambda: queue.qsize() > 0)
    assert _lines(queue) == ["early line"]
