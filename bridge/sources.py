"""Event sources that feed job ids into the work queue.

Slurm has no watch: the poller asks for changes since the last poll (cheap when
nothing changed) and queues every job whose view changed or vanished. The pod
watch (bridge.kube.watch) queues the job of every pod event.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

from bridge.errors import BridgeError
from bridge.metrics import Metrics
from bridge.reconcile import Reconciler

log = structlog.get_logger(__name__)


class SlurmPoller:
    def __init__(
        self, reconciler: Reconciler, enqueue: Callable[[int], None], metrics: Metrics, interval_s: float
    ) -> None:
        self.reconciler = reconciler
        self.enqueue = enqueue
        self.metrics = metrics
        self.interval_s = interval_s
        self.synced = asyncio.Event()

    async def poll_once(self) -> None:
        self.metrics.inc("slurm_polls_total")
        jobs = await self.reconciler.slurm.changed_jobs()
        if jobs is None:
            return
        self.metrics.inc("slurm_poll_changes_total")
        current = {job.job_id: job for job in jobs if self.reconciler.is_bridged(job)}
        previous = self.reconciler.slurm_jobs
        self.reconciler.slurm_jobs = current
        for job_id, job in current.items():
            if previous.get(job_id) != job:
                self.enqueue(job_id)
        for job_id in previous.keys() - current.keys():
            self.enqueue(job_id)
        # Pods whose job Slurm does not list at all (purged, or from before a restart).
        for job_id in self.reconciler.cache.job_ids() - current.keys():
            self.enqueue(job_id)
        self.synced.set()

    async def run(self) -> None:
        failures = 0
        while True:
            try:
                await self.poll_once()
                failures = 0
            except asyncio.CancelledError:
                raise
            except BridgeError as error:
                failures += 1
                self.metrics.inc("slurm_errors_total")
                if failures in (1, 10) or failures % 100 == 0:
                    log.warning("slurm.poll_failed", error=str(error), failures=failures)
                await asyncio.sleep(min(5.0, self.interval_s * 2**min(failures, 5)))
                continue
            await asyncio.sleep(self.interval_s)
