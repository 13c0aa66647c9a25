"""The incremental job listing over slurmrestd: what the last poll saw, so each poll reads little.

`GET /jobs/?update_time=T` returns the full list (not a delta) after any change, ~27 KB a job in
v0.0.45, so the poll reads `GET /jobs/state/` (~85 bytes a job) instead and then each job whose
state changed; the full list is read at start and as a periodic safety net (FULL_RESYNC_S).
Requests go through the REST client (rest.py), which owns the transport and the token.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import replace
from typing import Any, Protocol

import structlog

from bridge.clients.slurm import JobListing, parse_listing
from bridge.core.errors import PermanentError, SlurmAuthError, SlurmUnavailable
from bridge.core.model import BASE_STATES, JobAllocation, ModelError, allocation_from_rest

log = structlog.get_logger(__name__)


class RestReads(Protocol):
    """What the listing reads through: the REST client's GET and its one-job read."""

    async def get(self, path: str) -> dict[str, Any]:
        """One GET of slurmrestd's API (`path` under its version's root), retried through a blip."""

    async def job(self, job_id: int) -> JobAllocation | None:
        """One job's current view, or None when slurmctld no longer knows it."""


class IncrementalJobListing:
    """The job states of the last poll and the views they stand for, for `changed_jobs`."""

    def __init__(self, rest: RestReads) -> None:
        self._rest = rest
        self._states: dict[str, tuple[str, ...]] | None = None
        """The job states of the last poll, by slurmctld's printed id (None before the first)."""
        self._bridged: dict[int, JobAllocation] = {}
        """The last full view of every listed job of the wanted partitions."""
        self._unreadable: set[int] = set()
        self._foreign: dict[str, bool] = {}
        """Jobs of other partitions, by printed id: True while PENDING (may still become ours)."""
        self._full_read_at = 0.0
        self._reported: set[int] = set()
        self._state_only: set[int] = set()
        """Jobs whose view in _bridged took an end from the states (ended_view), not from a read."""

    async def changed_jobs(self, partitions: Collection[str] | None = None) -> JobListing | None:
        """The jobs of `partitions` if any job changed since the previous call, else None.

        Every call reads slurmctld's job states (`/jobs/state/`: ~85 bytes a job), and then the
        full record only of the jobs whose state changed or that are new; a full listing (~27 KB a
        job: 16 MB for 600 jobs, which held the event loop for seconds under load and cost the
        Lease) is read only at the first call and every FULL_RESYNC_S. A job of another partition
        is read once, and again only when it leaves PENDING (its partition may change until then).
        """
        wanted = None if partitions is None else frozenset(partitions)
        if self._states is None:
            return await self._read_everything(wanted)
        if time.monotonic() - self._full_read_at >= FULL_RESYNC_S:
            try:
                return await self._read_everything(wanted)
            except SlurmUnavailable as error:
                # The big read failing (under the load that makes it slow) must not stop the
                # small ones: try it again later, poll the states meanwhile.
                self._full_read_at = time.monotonic() - FULL_RESYNC_S + FULL_RESYNC_RETRY_S
                log.warning("slurm.full_listing_failed", error=str(error))
        read_at = time.monotonic()
        states = await self._job_states()
        # An end stays an end (a requeue is a new state, read): versioned by when the answer
        # came, it is newer than any read sent before then, which may have seen the job still
        # running (a waiter's request while the poll was under way).
        answered_at = time.monotonic()
        previous = self._states
        if states == previous:
            return None
        changed = [key for key, state in states.items() if previous.get(key) != state]
        ending = self._ending_started_jobs(changed, states)
        # A job of another partition that ran there can never become ours, unless it is pending
        # again (requeued), when `scontrol update Partition=` may move it.
        by_id: dict[int, list[str]] = {}
        for key in changed:
            if key not in ending and (self._foreign.get(key, True) or "PENDING" in states[key]):
                by_id.setdefault(_id_of(key), []).append(key)
        # One read per job: a pending array's tasks share its id until they start.
        reads = asyncio.Semaphore(READS_AT_ONCE)

        async def read(job_id: int) -> JobAllocation | BaseException | None:
            async with reads:
                try:
                    return await self._rest.job(job_id)
                except ModelError as error:
                    # This record alone is unparseable: as in the full listing, it is listed
                    # unreadable (and read again at its next state change). Failing the poll
                    # would read everything again at each of them.
                    return error
                except (SlurmAuthError, PermanentError):
                    raise
                except Exception as error:  # this job's read failed
                    return error

        try:
            async with asyncio.TaskGroup() as group:  # one failing for good cancels the others
                tasks = {job_id: group.create_task(read(job_id)) for job_id in by_id}
        except BaseExceptionGroup as failed:
            self._states = None  # nothing of this poll is committed: read everything next time
            raise failed.exceptions[0] from None
        # Commit only now, and only what was read: a key whose read failed keeps its old state,
        # so the next poll reads it again.
        unread = {job_id for job_id, task in tasks.items()
                  if not self._record_read(job_id, task.result(), by_id[job_id], states, wanted)}
        unparseable = {job_id for job_id, task in tasks.items() if isinstance(task.result(), ModelError)}
        committed = dict(states)
        for job_id in unread:
            for key in by_id[job_id]:
                if key in previous:
                    committed[key] = previous[key]
                else:
                    committed.pop(key, None)
        for key in changed:
            if _id_of(key) not in by_id and key not in ending:
                self._foreign[key] = False
        listed_ids = {_id_of(key) for key in states}
        for key in previous.keys() - states.keys():
            self._foreign.pop(key, None)
            job_id = _id_of(key)
            if job_id not in listed_ids:
                self._bridged.pop(job_id, None)
                self._unreadable.discard(job_id)
        for key in ending:
            job_id = _id_of(key)
            self._bridged[job_id] = ended_view(self._bridged[job_id], states[key], answered_at)
            self._state_only.add(job_id)
        self._states = committed
        self._unreadable = (self._unreadable - set(tasks)) | unread | unparseable
        self._unreadable &= listed_ids
        self._state_only &= self._bridged.keys()
        return JobListing(read_at=read_at, jobs=tuple(self._bridged.values()),
                          unreadable=frozenset(self._unreadable), state_only=frozenset(self._state_only))

    def _ending_started_jobs(self, changed: list[str], states: dict[str, tuple[str, ...]]) -> set[str]:
        """The changed keys whose new state only says a job that had started is ending or has ended:
        their record is not read again (two reads a job, at COMPLETING and at its end, and as many
        of slurmctld's RPCs), its last view takes the new state. Only for a job the listing holds a
        started view of, under one printed id, whose new state is an end (or RUNNING) with no flag
        but COMPLETING: a requeue (REQUEUED, then PENDING with a new run), a resize or anything
        else is read."""
        candidates = [key for key in changed if _id_of(key) in self._bridged and _only_an_end(states[key])]
        if not candidates:
            return set()
        printed = Counter(_id_of(key) for key in states)
        ending = set()
        for key in candidates:
            view = self._bridged[_id_of(key)]
            if (printed[view.job_id] == 1 and view.job_id not in self._unreadable
                    and view.state in STARTED_STATES and view.nodes):
                ending.add(key)
        return ending

    def _record_read(
        self, job_id: int, outcome: JobAllocation | BaseException | None, keys: list[str],
        states: dict[str, tuple[str, ...]], wanted: frozenset[str] | None,
    ) -> bool:
        """Keep what one job's read found; False if the read failed (then it is listed without
        a view: its old one must not come back stamped as new). An unparseable record was read:
        its state is kept, and the caller lists it unreadable until it changes."""
        if isinstance(outcome, BaseException):
            self._bridged.pop(job_id, None)
            if not isinstance(outcome, SlurmUnavailable) and job_id not in self._reported:
                self._reported.add(job_id)
                log.warning("slurm.record_skipped", job_id=job_id, error=repr(outcome))
            return isinstance(outcome, ModelError)
        self._reported.discard(job_id)
        self._state_only.discard(job_id)
        elsewhere = outcome is not None and wanted is not None and outcome.partition not in wanted
        if outcome is not None and not elsewhere:
            self._bridged[job_id] = outcome
        else:
            self._bridged.pop(job_id, None)
        for key in keys:
            if elsewhere:
                self._foreign[key] = "PENDING" in states[key]
            else:
                self._foreign.pop(key, None)
        return True

    async def _job_states(self) -> dict[str, tuple[str, ...]]:
        """slurmctld's job ids as it prints them ("408_3": task 3 of an array, job 408 while it
        is pending with its array, its own id once it started; "124+1": a heterogeneous job's
        component) and their states."""
        body = await self._rest.get("/jobs/state/")
        if body.get("errors") or not isinstance(body.get("jobs", []), list | None):
            raise SlurmUnavailable(f"slurmrestd could not list job states: {body.get('errors')}")
        states: dict[str, tuple[str, ...]] = {}
        for entry in body.get("jobs") or []:
            key = str(entry.get("job_id", "")) if isinstance(entry, Mapping) else ""
            if _LEADING_DIGITS.match(key):
                states[key] = tuple(str(part) for part in entry.get("state") or ())
        return states

    async def _read_everything(self, wanted: frozenset[str] | None) -> JobListing:
        """States first, then the full listing: a change between the two reads is newer in the
        listing than in the states, so the next poll reads that job again (never misses it)."""
        states = await self._job_states()
        read_at = time.monotonic()
        body = await self._rest.get("/jobs/")
        if body.get("errors"):
            raise SlurmUnavailable(f"slurmrestd could not list jobs: {body['errors']}")
        records = body.get("jobs") or []

        def parse() -> JobListing:
            return parse_listing(
                records, read_at=read_at, partitions=wanted,
                partition_of=lambda raw: str(_field(raw, "partition") or ""),
                job_id_of=lambda raw: _field(raw, "job_id"),
                parse=lambda raw: allocation_from_rest(raw, read_at), reported=self._reported,
            )

        # Thousands of records take seconds to parse: in a thread, whose Python code lets the
        # event loop (every attach, log relay and Lease renewal) run between its steps. (Only
        # this poll touches _reported: no race.)
        listing = await asyncio.to_thread(parse) if len(records) > OFF_LOOP_RECORDS else parse()
        self._bridged = {alloc.job_id: alloc for alloc in listing.jobs}
        self._state_only = set()
        self._unreadable = set(listing.unreadable)
        ours = set(self._bridged) | self._unreadable
        self._foreign = {key: "PENDING" in state for key, state in states.items() if _id_of(key) not in ours}
        self._states = states
        self._full_read_at = read_at
        return listing


ENDED_STATES = BASE_STATES - {"PENDING", "RUNNING", "SUSPENDED"}
STARTED_STATES = BASE_STATES - {"PENDING"}
"""A view in one of these has its allocation: the job started."""


def _only_an_end(state: tuple[str, ...]) -> bool:
    """`state` (a /jobs/state/ entry) says a job ended or is ending, and nothing else."""
    bases = [part for part in state if part in BASE_STATES]
    flags = set(state) - set(bases)
    return (len(bases) == 1 and flags <= {"COMPLETING"}
            and (bases[0] in ENDED_STATES or (bases[0] == "RUNNING" and "COMPLETING" in flags)))


def ended_view(view: JobAllocation, state: tuple[str, ...], read_at: float) -> JobAllocation:
    """`view` with the ending `state` (_only_an_end) the states answered at `read_at` gave."""
    base = next(part for part in state if part in BASE_STATES)
    return replace(view, state=base, state_flags=frozenset(state) - {base}, read_at=read_at)


OFF_LOOP_RECORDS = 200
"""Listings with more records are parsed in a worker thread."""
FULL_RESYNC_S = 300.0
"""How often the whole job listing is read (a safety net: between two, job states decide)."""
FULL_RESYNC_RETRY_S = 30.0
"""After a failed full listing, how long the poll reads only states before trying it again."""
READS_AT_ONCE = 16
"""Single-job reads in flight at once after a poll found changed jobs."""
_LEADING_DIGITS = re.compile(r"[0-9]+")


def _id_of(printed: str) -> int:
    """The numeric job id in slurmctld's printed one ("408_3" is job 408, task 3 of its array;
    "123+1" is component 1 of heterogeneous job 123)."""
    match = _LEADING_DIGITS.match(printed)
    return int(match.group()) if match else 0


def _field(raw: object, key: str) -> object:
    return raw.get(key) if isinstance(raw, Mapping) else None
