"""Slurm access: one small interface, two backends (slurmrestd, pyslurm)."""

from __future__ import annotations

from typing import Protocol

from bridge.model import JobAllocation

# slurmctld's "Job can not be altered now, try again later" (a job in a transition, e.g. still
# configuring right after a controller restart): worth a few retries for a signal.
ESLURM_TRANSITION_STATE_NO_UPDATE = 2020
SIGNAL_RETRY_DELAYS_S = (0.1, 0.2, 0.5, 1.0, 2.0, 3.0)


class SlurmClient(Protocol):
    """The few verbs the reconciler needs from Slurm."""

    async def changed_jobs(self) -> list[JobAllocation] | None:
        """All jobs if anything changed since the previous call, else None (cheap when idle)."""

    async def job(self, job_id: int) -> JobAllocation | None:
        """One job's current view, or None when slurmctld no longer knows it."""

    async def signal_job(self, job_id: int, signal: str) -> None:
        """Send a signal to the job's batch step (e.g. to stop a stuck waiter)."""

    async def set_comment(self, job_id: int, comment: str) -> None:
        """Record a short message in the job's comment (visible in `scontrol show job`)."""

    async def close(self) -> None: ...
