"""Event sources that feed job ids into the work queue.

Slurm has no watch: the poller asks for changes since the last poll (cheap when
nothing changed), hands the listing to the job store (which keeps the newest view of
each job: a listing older than what an attach saw changes nothing) and queues every job
whose view changed or vanished. The listing is cut to the bridged partitions and parsed
record by record inside the Slurm client, so a malformed job is skipped, never fatal.
The pod watch (bridge.clients.kube.watch) queues the job of every pod event.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog

from bridge.controller.metrics import Metrics
from bridge.controller.reconcile import Reconciler
from bridge.core.errors import BridgeError

log = structlog.get_logger(__name__)


STANDBY_POLL_S = 5.0
"""How often a standby replica reads Slurm's job list (the leader: [slurm] poll_interval_s)."""


class SlurmPoller:
    def __init__(
        self, reconciler: Reconciler, enqueue: Callable[[int], None], metrics: Metrics, interval_s: float,
        *, leading: Callable[[], bool] | None = None, standby_interval_s: float = STANDBY_POLL_S,
    ) -> None:
        self.reconciler = reconciler
        self.enqueue = enqueue
        self.metrics = metrics
        self.interval_s = interval_s
        self.leading = leading or (lambda: True)
        self.standby_interval_s = standby_interval_s
        self.synced = asyncio.Event()

    async def poll_once(self) -> None:
        self.metrics.inc("slurm_polls_total")
        listing = await self.reconciler.slurm.changed_jobs(self.reconciler.cfg.partitions.keys())
        if listing is None:
            return
        self.metrics.inc("slurm_poll_changes_total")
        if listing.unreadable:
            self.metrics.inc("slurm_records_skipped_total", len(listing.unreadable))
        for job_id in sorted(self.reconciler.jobs.apply_listing(listing)):
            self.enqueue(job_id)
        # Pods whose job Slurm does not list at all (purged, or from before a restart): reconcile
        # asks Slurm about each before it deletes anything.
        listed = {job.job_id for job in listing.jobs} | listing.unreadable
        for job_id in sorted(self.reconciler.cache.job_ids() - listed):
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
            await self._pause()

    async def _pause(self) -> None:
        """The poll interval; a standby polls every standby_interval_s (a full listing of a big
        cluster is slurmctld's work too), yet at once when it takes the lead."""
        if self.leading():
            await asyncio.sleep(self.interval_s)
            return
        deadline = time.monotonic() + self.standby_interval_s
        while time.monotonic() < deadline and not self.leading():
            await asyncio.sleep(self.interval_s)
