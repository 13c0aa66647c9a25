"""Slurm access: one small interface, two backends (slurmrestd, pyslurm).

Wire records are parsed here, inside the client, one by one and only for the partitions the caller
wants: a malformed job elsewhere in the cluster (or a bad one among ours) is logged and skipped,
it never fails a whole listing.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import structlog

from bridge.core.model import JobAllocation
from bridge.core.nodehealth import SlurmNode

log = structlog.get_logger(__name__)

# slurmctld's "Job can not be altered now, try again later" (a job in a transition, e.g. still
# configuring right after a controller restart): worth a few retries for a signal.
ESLURM_TRANSITION_STATE_NO_UPDATE = 2020
SIGNAL_RETRY_DELAYS_S = (0.1, 0.2, 0.5, 1.0, 2.0, 3.0)

Record = TypeVar("Record")


@dataclass(frozen=True)
class JobListing:
    """One full answer of slurmctld, cut to the wanted partitions and parsed record by record."""

    read_at: float
    """`time.monotonic()` when the request was sent: the version of everything in the listing,
    including the absence of a job (see JobAllocation.read_at)."""
    jobs: tuple[JobAllocation, ...]
    unreadable: frozenset[int] = frozenset()
    """Ids of jobs in the wanted partitions whose record could not be parsed: listed, so not gone,
    but without a usable view (logged once per job and skipped)."""
    state_only: frozenset[int] = frozenset()
    """Ids of jobs whose view here only has a newer state than their last read (an end the job
    states said, job_listing.ended_view): its other fields may be older than a view read since."""


class SlurmClient(Protocol):
    """The few verbs the reconciler needs from Slurm."""

    async def changed_jobs(self, partitions: Collection[str] | None = None) -> JobListing | None:
        """All jobs (of `partitions` only, if given) if any job changed since the previous call,
        else None (cheap when idle). A change of state (with the nodes that come with RUNNING)
        shows at the next call; the REST backend may show other changes later (job_listing.FULL_RESYNC_S)."""

    async def job(self, job_id: int) -> JobAllocation | None:
        """One job's current view, or None when slurmctld no longer knows it."""

    async def signal_job(self, job_id: int, signal: str) -> None:
        """Send a signal to the job's batch step (e.g. to stop a stuck waiter)."""

    async def submit_job(self, user: str, job: Mapping[str, Any]) -> int:
        """Submit a batch job (slurmrestd's `job` description) as `user`; its id. SlurmRefused says
        why slurmctld refused it (its message is for the user)."""

    async def cancel_job(self, job_id: int) -> None:
        """`scancel <job_id>`; a job already over is no error."""

    async def set_comment(self, job_id: int, comment: str) -> None:
        """Record a short message in the job's comment (visible in `scontrol show job`)."""

    async def changed_nodes(self, partitions: Collection[str]) -> list[SlurmNode] | None:
        """The nodes of `partitions` if any node changed since the previous call, else None."""

    async def node(self, name: str) -> SlurmNode | None:
        """One node's current state (read before the bridge changes it), None if unknown."""

    async def update_node(self, name: str, state: str, reason: str = "") -> None:
        """`scontrol update nodename=<name> state=<state> [reason=<reason>]`."""

    async def close(self) -> None: ...


def slurm_node(name: str, states: Iterable[str], reason: str | None, partitions: Iterable[str]) -> SlurmNode:
    """A SlurmNode from either backend's fields (state names upper case, split on '+')."""
    flat = {part.strip().upper() for state in states for part in str(state).split("+") if part.strip()}
    return SlurmNode(name, frozenset(flat), reason or "", tuple(partitions))


def parse_listing(
    records: Iterable[Record],
    *,
    read_at: float,
    partitions: Collection[str] | None,
    partition_of: Callable[[Record], str],
    job_id_of: Callable[[Record], object],
    parse: Callable[[Record], JobAllocation],
    reported: set[int],
) -> JobListing:
    """Filter `records` by their raw partition field, then parse each one on its own.

    `reported` (owned by the client) holds the ids already logged as unreadable, so a bad record
    is logged once, not at every poll; an id that parses again is forgotten.
    """
    jobs: list[JobAllocation] = []
    unreadable: set[int] = set()
    for record in records:
        try:
            partition = partition_of(record)
        except Exception:  # cannot even tell its partition: not known to be ours
            partition = ""
        if partitions is not None and partition not in partitions:
            continue
        try:
            jobs.append(parse(record))
        except Exception as error:  # any one record's failure must not fail the listing
            job_id = _int_or_none(job_id_of, record)
            if job_id is not None:
                unreadable.add(job_id)
            if job_id is None or job_id not in reported:
                log.warning("slurm.record_skipped", job_id=job_id, partition=partition, error=repr(error))
                if job_id is not None:
                    reported.add(job_id)
    reported.difference_update({job.job_id for job in jobs})
    return JobListing(read_at=read_at, jobs=tuple(jobs), unreadable=frozenset(unreadable))


def _int_or_none(job_id_of: Callable[[Record], object], record: Record) -> int | None:
    try:
        value = job_id_of(record)
    except Exception:
        return None
    if isinstance(value, dict):  # slurmrestd's {set, number} form
        value = value.get("number")
    return value if isinstance(value, int) and not isinstance(value, bool) else None
