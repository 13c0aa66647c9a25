"""Issue 8, cause 5 (daemon half): a log stream that ends or breaks while its container still runs
is resumed after the last line relayed, until a read that began after the container terminated
has run to its end. No line is lost, none is printed twice, and the exit waits for the last one.
(The read deadline that turns a silent half-open stream into such a break is in test_kube_client.)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from bridge.clients.kube.cache import PodCache
from bridge.clients.kube.errors import KubeNotFound
from bridge.controller.metrics import Metrics
from bridge.controller.reconcile import Reconciler
from bridge.core.config import PartitionConfig
from bridge.core.errors import KubeUnavailable

from .builders import SecretStore, allocation, config, payload

RUNNING = {"phase": "Running", "containerStatuses": [{"name": "job", "state": {"running": {}}}]}
EXITED = {"phase": "Succeeded",
          "containerStatuses": [{"name": "job", "state": {"terminated": {"exitCode": 0}}}]}


class Kube(SecretStore):
    """One pod whose log the test writes; each stream_logs call plays the next scripted ending."""

    def __init__(self, cache: PodCache) -> None:
        self.cache = cache
        self.log: list[tuple[str, str]] = []
        self.endings: list[str] = []
        """How each read ends once it has sent what was written: "eof", "break" (KubeUnavailable),
        "not-found" (a 404 before anything is sent: the API server did not see the new pod yet)."""
        self.reads: list[str | None] = []

    async def create_pod(self, manifest: dict[str, Any]) -> bool:
        self.cache.apply("ADDED", {**manifest, "status": RUNNING})
        return True

    async def delete_pod(self, name: str, grace_seconds: int | None = None) -> bool:
        return True

    async def stream_logs(
        self, pod_name: str, since_time: str | None = None
    ) -> AsyncIterator[tuple[str, str]]:
        self.reads.append(since_time)
        if self.endings and self.endings[0] == "not-found":
            self.endings.pop(0)
            raise KubeNotFound(f"cannot read the log of pod {pod_name}: HTTP 404 NotFound", status=404,
                               reason="NotFound", what=f"read the log of pod {pod_name}")
        for stamp, line in list(self.log):
            if since_time is None or stamp > since_time:
                yield stamp, line
        if (self.endings.pop(0) if self.endings else "eof") == "break":
            raise KubeUnavailable("stream broke: ServerTimeoutError")

    def set_status(self, status: dict[str, Any]) -> None:
        for pod in self.cache.pods_of(42):
            self.cache.apply("MODIFIED", {**pod, "status": status})


class Slurm:
    async def set_comment(self, job_id: int, comment: str) -> None:
        pass


async def until(probe: Any, timeout: float = 3.0) -> None:
    async with asyncio.timeout(timeout):
        while not probe():
            await asyncio.sleep(0.01)


async def test_a_stream_that_breaks_while_the_container_runs_resumes_after_the_last_line() -> None:
    cache = PodCache()
    kube = Kube(cache)
    cfg = config(partitions={"k8s": PartitionConfig(default_image="img:1")})
    reconciler = Reconciler(cfg, Slurm(), kube, cache, Metrics(), lambda _job: None)  # type: ignore[arg-type]
    reconciler.jobs.record(replace(allocation(nodes=allocation().nodes[:1]), read_at=time.monotonic()))
    session = reconciler.attach_session(42, payload())
    session.payload = payload()
    queue = session.attach({})
    await reconciler.reconcile(42)

    kube.log = [("2026-12-01T10:00:01Z", "one")]
    kube.endings = ["break", "eof"]  # a half-open stream cut by the read deadline, then an early EOF
    await reconciler.reconcile(42)  # starts the relay
    await until(lambda: len(kube.reads) >= 3)
    kube.log.append(("2026-12-01T10:00:02Z", "two"))  # written while the relay reconnects
    kube.set_status(EXITED)
    await until(lambda: "slurm-42-0" in session.logs.done)
    await reconciler.reconcile(42)

    events = [queue.get_nowait() for _ in range(queue.qsize())]
    assert [e["line"] for e in events if e["type"] == "log"] == ["one", "two"], "lines lost or doubled"
    assert events[-1]["type"] == "exit" and events[-1]["code"] == 0
    assert kube.reads[0] is None and kube.reads[1] == "2026-12-01T10:00:01Z", "resumes after the last line"


async def test_a_404_for_a_pod_the_watch_still_has_is_asked_again() -> None:
    """A fresh pod's log read may meet an API server that does not see the pod yet (404): the
    relay asks again while the watch has the pod, or the job's output would be lost."""
    cache = PodCache()
    kube = Kube(cache)
    cfg = config(partitions={"k8s": PartitionConfig(default_image="img:1")})
    reconciler = Reconciler(cfg, Slurm(), kube, cache, Metrics(), lambda _job: None)  # type: ignore[arg-type]
    reconciler.jobs.record(replace(allocation(nodes=allocation().nodes[:1]), read_at=time.monotonic()))
    session = reconciler.attach_session(42, payload())
    session.payload = payload()
    queue = session.attach({})
    await reconciler.reconcile(42)

    kube.log = [("2026-12-01T10:00:01Z", "kept")]
    kube.endings = ["not-found", "not-found", "eof"]
    await reconciler.reconcile(42)
    await until(lambda: len(kube.reads) >= 3, timeout=10)
    kube.set_status(EXITED)
    await until(lambda: "slurm-42-0" in session.logs.done, timeout=10)
    await reconciler.reconcile(42)

    events = [queue.get_nowait() for _ in range(queue.qsize())]
    assert [e["line"] for e in events if e["type"] == "log"] == ["kept"]
