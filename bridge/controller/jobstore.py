"""The versioned Slurm view: the newest thing Slurm said about each job of a bridged partition.

One owner writes: this store, fed through its methods by the poller's listings, by attaches (the
fresh read that identified the waiter) and by `refresh`, the one-job read that confirms an absence.
The reconciler only reads it (and asks for a `refresh`).

Every piece of information carries the moment its request was sent (JobAllocation.read_at,
JobListing.read_at; an answer reflects Slurm at some moment after that, never before). Older
information never replaces newer: a poll that started before an attach but answered after it
cannot undo, or delete, what the attach saw. And absence from a listing is recorded, never
believed: before anything is deleted for a job that is merely missing, `refresh` asks Slurm
(GET /job/{id}) whether it is really gone or over.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import structlog

from bridge.clients.slurm import JobListing, SlurmClient
from bridge.core.model import JobAllocation

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class JobView:
    """What the store knows about one job."""

    job_id: int
    alloc: JobAllocation | None
    """The newest record Slurm gave; None when the newest read found that Slurm no longer knows it."""
    listed: bool = True
    """False when a listing newer than `alloc` did not include the job: a hint that it is gone, to be
    confirmed by `JobStore.refresh` before it is acted on."""


@dataclass
class _Entry:
    alloc: JobAllocation | None
    version: float
    """read_at of the request behind `alloc` (or behind the read that found the job unknown)."""
    unlisted_at: float | None = None
    """read_at of a listing newer than `version` that did not include the job."""


class JobStore:
    """Jobs of bridged partitions by id, each with the newest view Slurm gave of it."""

    def __init__(self, slurm: SlurmClient, clock: Callable[[], float] = time.monotonic) -> None:
        self._slurm = slurm
        self._clock = clock
        self._entries: dict[int, _Entry] = {}
        self._listed_at = float("-inf")
        """read_at of the newest listing applied: a job absent from the store was not in it."""

    # -- reads ----------------------------------------------------------------------------------
    def get(self, job_id: int) -> JobView | None:
        entry = self._entries.get(job_id)
        if entry is None:
            return None
        return JobView(job_id, entry.alloc, listed=entry.unlisted_at is None)

    def job_ids(self) -> set[int]:
        return set(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    # -- writes ---------------------------------------------------------------------------------
    def record(self, alloc: JobAllocation) -> bool:
        """One job's record (an attach's read, a confirming read); True if the view changed."""
        return self._apply(alloc.job_id, alloc, alloc.read_at)

    def apply_listing(self, listing: JobListing) -> set[int]:
        """A full listing of the bridged partitions; returns the ids whose view changed.

        Jobs it lacks are marked unlisted (if the listing is newer than what we know of them), not
        dropped; an entry unlisted twice in a row, or known gone and unlisted, is forgotten (with
        nothing stored, `get` is None, which callers treat exactly like an unconfirmed absence).
        """
        changed: set[int] = set()
        listed: set[int] = set(listing.unreadable)  # listed, only unreadable: no news about them
        for alloc in listing.jobs:
            listed.add(alloc.job_id)
            if alloc.job_id in listing.state_only:
                alloc = self._on_newest_allocation(alloc)
            # Versioned by when the record itself was read: a listing may carry views read
            # before it (slurmrestd's poll reads only changed jobs), which must not undo a newer
            # read of one job (a refresh, an attach).
            if self._apply(alloc.job_id, alloc, alloc.read_at or listing.read_at):
                changed.add(alloc.job_id)
        for job_id, entry in list(self._entries.items()):
            if job_id in listed or entry.version >= listing.read_at:
                continue
            if entry.alloc is None or entry.unlisted_at is not None:
                del self._entries[job_id]  # consistently gone: nothing left to remember
                continue
            entry.unlisted_at = listing.read_at
            changed.add(job_id)
        self._listed_at = max(self._listed_at, listing.read_at)
        return changed

    def _on_newest_allocation(self, ended: JobAllocation) -> JobAllocation:
        """An end the listing took from the job states alone, on the newest started view here: an
        attach or a refresh may have read the job since the listing last did (a later run, after
        a requeue and a start between two polls that the states never showed)."""
        entry = self._entries.get(ended.job_id)
        if entry is None or entry.alloc is None or entry.version > ended.read_at:
            return ended
        known = entry.alloc
        if known.state == "PENDING" or not known.nodes:
            return ended
        return replace(known, state=ended.state, state_flags=ended.state_flags, read_at=ended.read_at)

    async def refresh(self, job_id: int) -> JobView:
        """Ask Slurm about this one job now and record the answer (the newest view there is)."""
        started = self._clock()
        alloc = await self._slurm.job(job_id)
        if alloc is None:
            self._apply(job_id, None, started)
        else:
            # Versioned by our own clock: the read is fresher than anything stored before it.
            self._apply(job_id, replace(alloc, read_at=started), started)
        view = self.get(job_id)
        assert view is not None
        return view

    def _apply(self, job_id: int, alloc: JobAllocation | None, version: float) -> bool:
        entry = self._entries.get(job_id)
        if entry is None:
            # A job unknown here although a newer listing was applied: that listing did not have it.
            unlisted = self._listed_at if version < self._listed_at and alloc is not None else None
            self._entries[job_id] = _Entry(alloc, version, unlisted)
            return True
        if version < entry.version:
            log.debug("slurm.view_older_ignored", job_id=job_id, behind_s=round(entry.version - version, 3))
            return False
        before = (entry.alloc, entry.unlisted_at)
        entry.alloc, entry.version = alloc, version
        if entry.unlisted_at is not None and entry.unlisted_at <= version:
            entry.unlisted_at = None
        return (entry.alloc, entry.unlisted_at) != before
