"""The incremental job listing (bridge/clients/slurm/job_listing.py) against an in-memory slurmrestd:
what each poll asks for, and what it remembers for the next one.

A poll reads the job states and then only the jobs whose state changed; the states it remembers
advance only for jobs whose read succeeded, a read that fails for good commits nothing, and the
full listing (at the first poll and every FULL_RESYNC_S) replaces everything remembered.
(The client over HTTP: test_slurm_rest_client_polls_and_retries.py.)
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from bridge.clients.slurm import job_listing
from bridge.clients.slurm.job_listing import IncrementalJobListing
from bridge.controller.jobstore import JobStore
from bridge.core.errors import PermanentError, SlurmAuthError, SlurmUnavailable
from bridge.core.model import BASE_STATES, JobAllocation, ModelError, allocation_from_rest

RUNNING = json.loads((Path(__file__).parent / "data" / "rest_job_running.json").read_text())  # 4242, in sim


def record(job_id: int, state: str = "RUNNING", printed: str | None = None, **fields: Any) -> dict[str, Any]:
    """A slurmrestd job record; `printed` is its id in /jobs/state/ (default: the job id)."""
    return {**RUNNING, "job_id": job_id, "job_state": [state], "_printed": printed or str(job_id), **fields}


class FakeRest:
    """The REST client as the listing sees it: `get` of the two listings and `job`."""

    def __init__(self, *records: dict[str, Any]) -> None:
        self.records = list(records)
        self.extra_states: list[Any] = []
        self.asked: list[str] = []
        self.asked_at: dict[str, float] = {}
        self.listing_errors: list[dict[str, Any]] = []
        self.listing_only: list[dict[str, Any]] = []
        """Records the full listing has and the states had not (a job submitted between the two)."""
        self.job_errors: dict[int, BaseException] = {}
        self.unknown: set[int] = set()
        """Jobs still in the states whose own read no longer finds them."""
        self.in_flight = self.most_in_flight = 0

    def set_state(self, job_id: int, state: str) -> None:
        self.records = [{**r, "job_state": [state]} if r["job_id"] == job_id else r for r in self.records]

    async def get(self, path: str) -> dict[str, Any]:
        self.asked.append(path)
        self.asked_at[path] = time.monotonic()
        if path == "/jobs/state/":
            states = [{"job_id": r["_printed"], "state": r["job_state"]} for r in self.records]
            return {"jobs": [*states, *self.extra_states]}
        assert path == "/jobs/"
        if self.listing_errors:
            return {"jobs": [], "errors": self.listing_errors}
        return {"jobs": [*self.records, *self.listing_only]}

    async def job(self, job_id: int) -> JobAllocation | None:
        self.asked.append(f"/job/{job_id}")
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.01)
            if job_id in self.job_errors:
                raise self.job_errors[job_id]
            found = [r for r in self.records if r["job_id"] == job_id and job_id not in self.unknown]
            return allocation_from_rest(found[0], time.monotonic()) if found else None
        finally:
            self.in_flight -= 1

    def take_asked(self) -> list[str]:
        asked, self.asked = self.asked, []
        return asked


def states_of(listing: Any) -> dict[int, str]:
    assert listing is not None
    return {job.job_id: job.state for job in listing.jobs}


async def test_the_first_poll_reads_states_then_everything_and_an_idle_one_only_states() -> None:
    rest = FakeRest(record(4242), record(77))
    listing = IncrementalJobListing(rest)

    first = await listing.changed_jobs({"sim"})
    asked_first = rest.take_asked()
    idle = await listing.changed_jobs({"sim"})

    assert asked_first == ["/jobs/state/", "/jobs/"]
    assert states_of(first) == {4242: "RUNNING", 77: "RUNNING"}
    assert idle is None and rest.asked == ["/jobs/state/"]


async def test_each_listing_is_versioned_so_a_change_between_two_reads_is_never_missed() -> None:
    """The full listing is versioned after its states were read (a change in between is newer in
    the listing, read again next poll); a poll's listing before its states were asked for."""
    rest = FakeRest(record(4242))
    listing = IncrementalJobListing(rest)

    full = await listing.changed_jobs({"sim"})
    assert full is not None
    assert rest.asked_at["/jobs/state/"] <= full.read_at <= rest.asked_at["/jobs/"]
    rest.set_state(4242, "SUSPENDED")
    before = time.monotonic()
    polled = await listing.changed_jobs({"sim"})

    assert polled is not None and before <= polled.read_at <= rest.asked_at["/jobs/state/"]
    assert polled.jobs[0].read_at >= rest.asked_at["/jobs/state/"], "the job's own read is newer"


async def test_a_read_that_fails_for_now_is_listed_without_a_view_and_read_again_next_poll() -> None:
    rest = FakeRest(record(4242))
    listing = IncrementalJobListing(rest)
    await listing.changed_jobs({"sim"})
    rest.set_state(4242, "SUSPENDED")
    rest.records.append(record(600, "PENDING"))
    rest.job_errors = {4242: SlurmUnavailable("timeout"), 600: SlurmUnavailable("timeout")}
    rest.take_asked()

    failed = await listing.changed_jobs({"sim"})
    rest.job_errors = {}
    rest.take_asked()
    again = await listing.changed_jobs({"sim"})
    asked_again = rest.take_asked()
    settled = await listing.changed_jobs({"sim"})

    assert failed is not None and failed.jobs == () and failed.unreadable == {4242, 600}
    assert sorted(asked_again) == ["/job/4242", "/job/600", "/jobs/state/"], "both read again"
    assert again is not None and again.unreadable == frozenset()
    assert states_of(again) == {4242: "SUSPENDED", 600: "PENDING"}
    assert settled is None, "once read, the new states are remembered"


@pytest.mark.parametrize("error", [SlurmAuthError("token refused"), PermanentError("for good")])
async def test_a_read_that_fails_for_good_commits_nothing_and_the_next_poll_reads_everything(
    error: Exception,
) -> None:
    rest = FakeRest(record(4242), record(77))
    listing = IncrementalJobListing(rest)
    await listing.changed_jobs({"sim"})
    rest.set_state(4242, "SUSPENDED")
    rest.set_state(77, "SUSPENDED")
    rest.job_errors = {77: error}

    with pytest.raises(type(error)):
        await listing.changed_jobs({"sim"})
    rest.job_errors = {}
    rest.take_asked()
    after = await listing.changed_jobs({"sim"})

    assert rest.asked == ["/jobs/state/", "/jobs/"]
    assert states_of(after) == {4242: "SUSPENDED", 77: "SUSPENDED"}


async def test_the_periodic_full_listing_replaces_everything_remembered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Between two full listings only states decide: a change of another field (here the name)
    shows at the next full listing, which also replaces the views and the unreadable marks."""
    rest = FakeRest(record(4242), record(77))
    listing = IncrementalJobListing(rest)
    await listing.changed_jobs({"sim"})
    rest.set_state(77, "SUSPENDED")
    rest.job_errors = {77: SlurmUnavailable("timeout")}
    unread = await listing.changed_jobs({"sim"})
    rest.job_errors = {}
    rest.records = [{**r, "name": "renamed"} if r["job_id"] == 4242 else r for r in rest.records]
    rest.set_state(77, "RUNNING")  # as remembered: no change, so 77 is not read again
    unnoticed = await listing.changed_jobs({"sim"})
    monkeypatch.setattr(job_listing, "FULL_RESYNC_S", 0.0)
    rest.take_asked()
    full = await listing.changed_jobs({"sim"})

    assert unread is not None and unread.unreadable == {77}
    assert unnoticed is None, "a change of the name alone is no change of state"
    assert rest.asked == ["/jobs/state/", "/jobs/"]
    assert full is not None and full.unreadable == frozenset()
    assert {job.job_id: job.name for job in full.jobs} == {4242: "renamed", 77: "train"}
    monkeypatch.setattr(job_listing, "FULL_RESYNC_S", 300.0)
    rest.records.append(record(600, "PENDING"))
    after = await listing.changed_jobs({"sim"})
    assert after is not None and after.unreadable == frozenset(), "the old marks are gone for good"
    assert {job.job_id: job.name for job in after.jobs} == {4242: "renamed", 77: "train", 600: "train"}


async def test_a_pending_job_moved_to_another_partition_leaves_at_the_full_listing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`scontrol update Partition=` leaves the state as it was: only the full listing sees it."""
    rest = FakeRest(record(4242), record(300, "PENDING"))
    listing = IncrementalJobListing(rest)
    await listing.changed_jobs({"sim"})
    rest.records = [{**r, "partition": "cpu"} if r["job_id"] == 300 else r for r in rest.records]
    unnoticed = await listing.changed_jobs({"sim"})
    monkeypatch.setattr(job_listing, "FULL_RESYNC_S", 0.0)
    full = await listing.changed_jobs({"sim"})
    monkeypatch.setattr(job_listing, "FULL_RESYNC_S", 300.0)
    rest.set_state(4242, "SUSPENDED")
    after = await listing.changed_jobs({"sim"})

    assert unnoticed is None
    assert states_of(full) == {4242: "RUNNING"}
    assert states_of(after) == {4242: "SUSPENDED"}, "its old view does not come back"


class Clock:
    """job_listing's `time`: a monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


async def test_a_failed_full_listing_falls_back_to_states_and_is_tried_again_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every FULL_RESYNC_S; after a failed one, the states alone for FULL_RESYNC_RETRY_S."""
    clock = Clock()
    monkeypatch.setattr(job_listing, "time", clock)
    rest = FakeRest(record(4242))
    listing = IncrementalJobListing(rest)
    await listing.changed_jobs({"sim"})
    clock.now += job_listing.FULL_RESYNC_S - 1
    rest.take_asked()
    not_due = await listing.changed_jobs({"sim"})
    asked_not_due = rest.take_asked()
    clock.now += 1
    rest.listing_errors = [{"error": "busy"}]
    rest.set_state(4242, "SUSPENDED")

    with capture_logs() as logs:
        fallback = await listing.changed_jobs({"sim"})
    asked_fallback = rest.take_asked()
    clock.now += job_listing.FULL_RESYNC_RETRY_S - 1
    not_yet = await listing.changed_jobs({"sim"})
    asked_not_yet = rest.take_asked()
    rest.listing_errors = []
    clock.now += 1
    await listing.changed_jobs({"sim"})

    assert not_due is None and asked_not_due == ["/jobs/state/"]
    assert [e["event"] for e in logs] == ["slurm.full_listing_failed"]
    assert asked_fallback == ["/jobs/state/", "/jobs/", "/jobs/state/", "/job/4242"]
    assert states_of(fallback) == {4242: "SUSPENDED"}, "the states poll goes on"
    assert not_yet is None and asked_not_yet == ["/jobs/state/"]
    assert rest.asked == ["/jobs/state/", "/jobs/"], "tried again once FULL_RESYNC_RETRY_S is over"


async def test_a_failed_first_listing_is_not_swallowed_and_is_read_again() -> None:
    rest = FakeRest(record(4242))
    rest.listing_errors = [{"error": "busy"}]
    listing = IncrementalJobListing(rest)

    with pytest.raises(SlurmUnavailable):
        await listing.changed_jobs({"sim"})
    rest.listing_errors = []
    rest.take_asked()
    first = await listing.changed_jobs({"sim"})

    assert rest.asked == ["/jobs/state/", "/jobs/"] and states_of(first) == {4242: "RUNNING"}


async def test_a_job_that_vanished_leaves_the_listing_and_its_unreadable_mark_without_a_read() -> None:
    array = (record(408, "PENDING", "408_0"), record(408, "PENDING", "408_1"))
    rest = FakeRest(record(4242), record(77), *array)
    listing = IncrementalJobListing(rest)
    await listing.changed_jobs({"sim"})
    rest.set_state(77, "SUSPENDED")
    rest.job_errors = {77: SlurmUnavailable("timeout")}
    unread = await listing.changed_jobs({"sim"})
    rest.records = [r for r in rest.records if r["job_id"] not in (4242, 77) and r["_printed"] != "408_0"]
    rest.take_asked()
    after = await listing.changed_jobs({"sim"})

    assert unread is not None and unread.unreadable == {77}
    assert rest.asked == ["/jobs/state/"], "nothing to read for jobs that are gone"
    assert states_of(after) == {408: "PENDING"}, "408 is still listed by its other task"
    assert after is not None and after.unreadable == frozenset()


async def test_an_unreadable_job_the_states_never_listed_is_forgotten_at_the_next_poll() -> None:
    """A job submitted between the full listing's two reads, with a record it cannot parse, and
    gone before the next poll: listed as unreadable once, then no longer (not in the states)."""
    rest = FakeRest(record(4242))
    rest.listing_only = [record(99, gres_detail=["gpu:2"])]  # GPUs without indices: unparseable
    listing = IncrementalJobListing(rest)

    first = await listing.changed_jobs({"sim"})
    rest.listing_only = []
    rest.set_state(4242, "SUSPENDED")
    after = await listing.changed_jobs({"sim"})

    assert first is not None and first.unreadable == {99}
    assert after is not None and after.unreadable == frozenset()


async def test_a_job_gone_before_its_own_read_leaves_the_listing_and_counts_as_read() -> None:
    rest = FakeRest(record(4242), record(77))
    listing = IncrementalJobListing(rest)
    await listing.changed_jobs({"sim"})
    rest.set_state(77, "SUSPENDED")
    rest.unknown = {77}

    after = await listing.changed_jobs({"sim"})
    again = await listing.changed_jobs({"sim"})

    assert states_of(after) == {4242: "RUNNING"}
    assert after is not None and after.unreadable == frozenset()
    assert again is None, "its new state is remembered: not read again"


async def test_a_read_failing_otherwise_is_logged_once_until_it_reads_again_and_a_timeout_never() -> None:
    rest = FakeRest(record(4242), record(77))
    listing = IncrementalJobListing(rest)
    await listing.changed_jobs({"sim"})
    rest.set_state(4242, "SUSPENDED")
    rest.set_state(77, "SUSPENDED")
    rest.job_errors = {4242: ValueError("unparseable"), 77: SlurmUnavailable("timeout")}

    with capture_logs() as logs:
        await listing.changed_jobs({"sim"})
        await listing.changed_jobs({"sim"})  # both read again, both fail again
        rest.job_errors = {}
        healed = await listing.changed_jobs({"sim"})
        rest.set_state(4242, "RUNNING")
        rest.job_errors = {4242: ValueError("unparseable")}
        broken_again = await listing.changed_jobs({"sim"})

    skipped = [e["job_id"] for e in logs if e["event"] == "slurm.record_skipped"]
    assert skipped == [4242, 4242], "once per breakage, and a slurmrestd timeout is no bad record"
    assert states_of(healed) == {4242: "SUSPENDED", 77: "SUSPENDED"}
    assert broken_again is not None and broken_again.unreadable == {4242}


async def test_an_unparseable_record_is_listed_unreadable_and_the_poll_goes_on_without_a_full_read() -> None:
    """A ModelError is a PermanentError, but of one record: as in the full listing, that job alone
    is unreadable; the others' new states are committed and nothing is read again in full."""
    rest = FakeRest(record(4242), record(77))
    listing = IncrementalJobListing(rest)
    await listing.changed_jobs({"sim"})
    rest.set_state(4242, "SUSPENDED")
    rest.set_state(77, "SUSPENDED")
    rest.job_errors = {77: ModelError("job 77: a gres_detail allocation_from_rest refuses")}
    rest.take_asked()

    with capture_logs() as logs:
        polled = await listing.changed_jobs({"sim"})
        asked = rest.take_asked()
        quiet = await listing.changed_jobs({"sim"})
        asked_quiet = rest.take_asked()
        rest.set_state(77, "FAILED")
        again = await listing.changed_jobs({"sim"})

    assert polled is not None and polled.unreadable == {77}
    assert states_of(polled) == {4242: "SUSPENDED"}
    assert sorted(asked) == ["/job/4242", "/job/77", "/jobs/state/"], "no full listing"
    assert quiet is None and asked_quiet == ["/jobs/state/"], "no change, no read: its state was kept"
    assert [e["job_id"] for e in logs if e["event"] == "slurm.record_skipped"] == [77]
    assert rest.take_asked() == ["/jobs/state/", "/job/77"], "read again at its next state change"
    assert again is not None and again.unreadable == {77}
    rest.job_errors = {}
    rest.set_state(77, "SUSPENDED")
    healed = await listing.changed_jobs({"sim"})
    assert healed is not None and healed.unreadable == frozenset() and states_of(healed)[77] == "SUSPENDED"


async def test_a_job_of_another_partition_is_read_while_pending_and_again_once_requeued() -> None:
    rest = FakeRest(record(4242), record(90, "PENDING", partition="cpu"))
    listing = IncrementalJobListing(rest)
    await listing.changed_jobs({"sim"})
    reads_of_90: list[int] = []
    for state in ("RUNNING", "COMPLETED", "PENDING", "RUNNING"):
        rest.set_state(90, state)
        rest.take_asked()
        polled = await listing.changed_jobs({"sim"})
        assert states_of(polled) == {4242: "RUNNING"}, "never ours"
        reads_of_90.append(rest.asked.count("/job/90"))

    assert reads_of_90 == [1, 0, 1, 1], "read when it leaves PENDING and when it is pending again"


async def test_one_read_per_job_for_its_many_printed_ids_and_at_most_reads_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rest = FakeRest(record(4242))
    listing = IncrementalJobListing(rest)
    await listing.changed_jobs({"sim"})
    monkeypatch.setattr(job_listing, "READS_AT_ONCE", 2)
    rest.records += [record(124, "PENDING", "124+0"), record(124, "PENDING", "124+1"),
                     *(record(500 + i, "PENDING") for i in range(5))]
    rest.take_asked()

    polled = await listing.changed_jobs({"sim"})

    assert sorted(rest.asked) == sorted(["/jobs/state/", "/job/124", *(f"/job/{500 + i}" for i in range(5))])
    assert rest.most_in_flight == 2
    assert set(states_of(polled)) == {4242, 124, 500, 501, 502, 503, 504}


async def test_state_entries_without_a_job_id_are_ignored_and_an_errors_answer_fails_the_poll() -> None:
    rest = FakeRest(record(4242))
    listing = IncrementalJobListing(rest)
    await listing.changed_jobs({"sim"})
    rest.extra_states = [
        "garbage", {"job_id": ""}, {"job_id": "abc", "state": ["RUNNING"]}, {"state": ["PENDING"]},
    ]

    idle = await listing.changed_jobs({"sim"})

    assert idle is None, "entries without a job id are no change"
    rest.extra_states = []

    async def refused(path: str) -> dict[str, Any]:
        return {"jobs": [], "errors": [{"error": "busy"}]}

    rest.get = refused  # type: ignore[method-assign]
    with pytest.raises(SlurmUnavailable, match="could not list job states"):
        await listing.changed_jobs({"sim"})


def set_states(rest: FakeRest, job_id: int, *state: str) -> None:
    rest.records = [{**r, "job_state": list(state)} if r["job_id"] == job_id else r for r in rest.records]


async def test_a_started_jobs_end_is_taken_from_its_state_without_reading_it_again() -> None:
    """COMPLETING, then the end: two of slurmctld's RPCs a job saved, the view the one it ran with."""
    rest = FakeRest(record(4242), record(77))
    listing = IncrementalJobListing(rest)
    first = await listing.changed_jobs({"sim"})
    assert first is not None
    ran = {job.job_id: job for job in first.jobs}
    rest.take_asked()

    set_states(rest, 4242, "COMPLETED", "COMPLETING")
    set_states(rest, 77, "RUNNING", "COMPLETING")
    ending = await listing.changed_jobs({"sim"})
    asked_ending = rest.take_asked()
    set_states(rest, 4242, "COMPLETED")
    set_states(rest, 77, "TIMEOUT")
    ended = await listing.changed_jobs({"sim"})

    assert asked_ending == ["/jobs/state/"] and rest.asked == ["/jobs/state/"], "no job read again"
    assert ending is not None and ended is not None
    views = {job.job_id: job for job in ending.jobs}
    assert (views[4242].state, views[4242].state_flags) == ("COMPLETED", {"COMPLETING"})
    assert (views[77].state, views[77].state_flags) == ("RUNNING", {"COMPLETING"})
    views = {job.job_id: job for job in ended.jobs}
    assert (views[4242].state, views[4242].state_flags) == ("COMPLETED", frozenset())
    assert views[77].state == "TIMEOUT"
    assert views[4242].nodes == ran[4242].nodes and views[4242].run == ran[4242].run
    assert views[4242].read_at >= rest.asked_at["/jobs/state/"] > ran[4242].read_at, "the states' answer's"


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (("RUNNING",), ("PENDING", "REQUEUED")),  # a requeue: its next run is another
        (("RUNNING",), ("COMPLETED", "REQUEUED")),
        (("RUNNING",), ("RUNNING", "RESIZING")),  # its nodes change
        (("RUNNING",), ("SUSPENDED",)),  # not an end
        (("PENDING",), ("CANCELLED",)),  # never started: no allocation to keep
    ],
)
async def test_any_other_change_is_read(before: tuple[str, ...], after: tuple[str, ...]) -> None:
    rest = FakeRest(record(4242, before[0]))
    set_states(rest, 4242, *before)
    listing = IncrementalJobListing(rest)
    await listing.changed_jobs({"sim"})
    rest.take_asked()

    set_states(rest, 4242, *after)
    changed = await listing.changed_jobs({"sim"})

    assert rest.asked == ["/jobs/state/", "/job/4242"]
    assert changed is not None and changed.jobs[0].state == next(s for s in after if s in BASE_STATES)


async def test_an_end_under_a_printed_id_it_shares_is_read() -> None:
    """Two entries of the states under one job id (the listing allows for a pending array's rest
    printed as its first task's id): which record the end is, only a read says."""
    rest = FakeRest(record(408, printed="408_0"), record(408, "PENDING", printed="408_[1-7]"))
    listing = IncrementalJobListing(rest)
    await listing.changed_jobs({"sim"})
    rest.take_asked()

    rest.records[0] = {**rest.records[0], "job_state": ["COMPLETED"]}
    await listing.changed_jobs({"sim"})

    assert rest.asked == ["/jobs/state/", "/job/408"]


async def test_a_job_whose_end_came_from_its_state_is_read_at_its_next_change() -> None:
    """Requeued and started again between two polls, after an end the states told: the new run is
    read (the job is still ours, not a job of another partition left unread), and its view is a
    read one again."""
    rest = FakeRest(record(4242))
    listing = IncrementalJobListing(rest)
    await listing.changed_jobs({"sim"})
    set_states(rest, 4242, "COMPLETED")
    ended = await listing.changed_jobs({"sim"})
    rest.take_asked()

    rest.records = [{**record(4242), "restart_cnt": 1}]
    again = await listing.changed_jobs({"sim"})

    assert ended is not None and ended.state_only == {4242}
    assert rest.asked == ["/jobs/state/", "/job/4242"]
    assert again is not None and again.state_only == frozenset()
    assert [(job.state, job.run) for job in again.jobs] == [("RUNNING", 1)]


async def test_an_end_the_states_told_wins_over_a_read_sent_while_they_were_asked_for() -> None:
    """A waiter's request reads its job while the poll's states are on their way (sent after them,
    answered RUNNING just before the job ended); the states then say it ended. The end is newer:
    the job store must not keep the job running (nothing would read it again before the full
    resync, five minutes later)."""
    rest = FakeRest(record(4242))
    listing = IncrementalJobListing(rest)
    store = JobStore(rest)  # type: ignore[arg-type]
    first = await listing.changed_jobs({"sim"})
    assert first is not None
    store.apply_listing(first)
    states = rest.get

    async def the_job_ends_while_its_waiter_reads_it(path: str) -> dict[str, Any]:
        if path == "/jobs/state/":
            store.record(allocation_from_rest(rest.records[0], time.monotonic()))  # still RUNNING
            rest.set_state(4242, "COMPLETED")
        return await states(path)

    rest.get = the_job_ends_while_its_waiter_reads_it  # type: ignore[method-assign]
    ended = await listing.changed_jobs({"sim"})
    assert ended is not None
    store.apply_listing(ended)

    view = store.get(4242)
    assert view is not None and view.alloc is not None and view.alloc.state == "COMPLETED"
