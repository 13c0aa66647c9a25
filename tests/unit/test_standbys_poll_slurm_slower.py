"""Issue 11, item 3: a standby replica reads Slurm's whole job list every few seconds, not at the
leader's rate (each read is a full listing for slurmctld to build), and polls at the leader's
rate as soon as it takes the lead."""

from __future__ import annotations

import asyncio

from bridge.clients.kube.cache import PodCache
from bridge.controller.metrics import Metrics
from bridge.controller.reconcile import Reconciler
from bridge.controller.sources import SlurmPoller

from .builders import config


class CountingSlurm:
    def __init__(self) -> None:
        self.polls = 0

    async def changed_jobs(self, _partitions: object) -> None:
        self.polls += 1


async def _polls_in(seconds: float, leading: list[bool], flip_after_s: float | None = None) -> int:
    slurm = CountingSlurm()
    reconciler = Reconciler(config(), slurm, None, PodCache(), Metrics(), lambda _job: None)  # type: ignore[arg-type]
    poller = SlurmPoller(reconciler, lambda _job: None, Metrics(), interval_s=0.02,
                         leading=lambda: leading[0], standby_interval_s=5.0)
    task = asyncio.ensure_future(poller.run())
    try:
        if flip_after_s is not None:
            await asyncio.sleep(flip_after_s)
            leading[0] = True
            await asyncio.sleep(seconds - flip_after_s)
        else:
            await asyncio.sleep(seconds)
    finally:
        task.cancel()
    return slurm.polls


async def test_a_standby_polls_once_per_standby_interval() -> None:
    assert await _polls_in(1.0, [False]) == 1  # the first read, then none for 5 s


async def test_the_leader_polls_at_its_interval() -> None:
    assert await _polls_in(1.0, [True]) > 10


async def test_a_standby_that_takes_the_lead_polls_at_once() -> None:
    assert await _polls_in(1.0, [False], flip_after_s=0.5) > 5
