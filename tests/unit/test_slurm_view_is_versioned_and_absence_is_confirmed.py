"""Issue 8, cause 1: a stale Slurm snapshot must never undo a fresher view, and a job merely missing
from a poll must be confirmed gone by Slurm (GET /job/{id}) before its pods are deleted.

The poller, the job store and the reconciler run for real; Slurm and Kubernetes are in-memory.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import replace

from bridge.clients.kube.cache import PodCache
from bridge.clients.slurm import JobListing
from bridge.controller.jobstore import JobStore
from bridge.controller.metrics import Metrics
from bridge.controller.reconcile import Reconciler
from bridge.controller.sources import SlurmPoller
from bridge.core.config import PartitionConfig
from bridge.core.model import JobAllocation

from .builders import RecordingKube, allocation, config, payload


class Slurm:
    """A Slurm whose poll answers are scripted, and whose GET /job/{id} tells the truth."""

    def __init__(self) -> None:
        self.truth: dict[int, JobAllocation] = {}
        self.listings: list[JobListing] = []
        self.reads: list[int] = []

    async def changed_jobs(self, partitions: Collection[str] | None = None) -> JobListing | None:
        return self.listings.pop(0) if self.listings else None

    async def job(self, job_id: int) -> JobAllocation | None:
        self.reads.append(job_id)
        found = self.truth.get(job_id)
        return None if found is None else replace(found, read_at=time.monotonic())

    async def set_comment(self, job_id: int, comment: str) -> None:
        pass


Kube = RecordingKube


def world() -> tuple[Reconciler, SlurmPoller, Slurm, Kube, list[int]]:
    cache = PodCache()
    slurm, kube = Slurm(), Kube(cache)
    queued: list[int] = []
    cfg = config(partitions={"k8s": PartitionConfig(default_image="img:1", resolve_first_node=False)})
    reconciler = Reconciler(cfg, slurm, kube, cache, Metrics(), queued.append)  # type: ignore[arg-type]
    poller = SlurmPoller(reconciler, queued.append, Metrics(), interval_s=0.2)
    return reconciler, poller, slurm, kube, queued


async def attach_and_start(reconciler: Reconciler, slurm: Slurm, kube: Kube) -> None:
    """What api.attach does: a fresh read of the job is recorded, the waiter's session opened."""
    slurm.truth[42] = allocation()
    alloc = await slurm.job(42)
    assert alloc is not None
    reconciler.jobs.record(alloc)
    session = reconciler.attach_session(42, payload())
    session.payload = payload()
    session.attach({})
    await reconciler.reconcile(42)
    assert kube.created == ["slurm-42-0", "slurm-42-1"]


async def test_a_poll_sent_before_the_attach_and_answered_after_it_changes_nothing() -> None:
    reconciler, poller, slurm, kube, _ = world()
    poll_sent = time.monotonic()  # slurmctld answers this poll before job 42 exists ...
    await attach_and_start(reconciler, slurm, kube)
    # ... and the answer arrives after the attach.
    slurm.listings.append(JobListing(read_at=poll_sent, jobs=()))

    await poller.poll_once()
    await reconciler.reconcile(42)

    assert kube.deleted == [], "the stale poll made the job read as gone and its pods were deleted"
    view = reconciler.jobs.get(42)
    assert view is not None and view.alloc is not None and view.alloc.state == "RUNNING"


async def test_an_older_record_never_replaces_a_newer_one() -> None:
    store = JobStore(Slurm())  # type: ignore[arg-type]
    newer = replace(allocation(state="COMPLETED"), read_at=2.0)
    store.record(newer)

    assert store.record(replace(allocation(state="RUNNING"), read_at=1.0)) is False
    store.apply_listing(JobListing(read_at=1.5, jobs=(replace(allocation(state="RUNNING"), read_at=1.5),)))

    view = store.get(42)
    assert view is not None and view.alloc == newer and view.listed


async def test_a_job_missing_from_a_newer_poll_keeps_its_pods_while_slurm_still_runs_it() -> None:
    reconciler, poller, slurm, kube, queued = world()
    await attach_and_start(reconciler, slurm, kube)
    # A newer poll that lacks the job (a slurmctld hiccup, a record it could not list): only a hint.
    slurm.listings.append(JobListing(read_at=time.monotonic(), jobs=()))

    await poller.poll_once()
    assert 42 in queued
    await reconciler.reconcile(42)

    assert slurm.reads[-1] == 42, "absence must be confirmed with GET /job/42"
    assert kube.deleted == []
    view = reconciler.jobs.get(42)
    assert view is not None and view.listed, "the confirming read is the newest view"


async def test_a_job_slurm_confirms_gone_loses_its_pods() -> None:
    reconciler, poller, slurm, kube, _ = world()
    await attach_and_start(reconciler, slurm, kube)
    del slurm.truth[42]
    slurm.listings.append(JobListing(read_at=time.monotonic(), jobs=()))

    await poller.poll_once()
    await reconciler.reconcile(42)

    assert sorted(kube.deleted) == ["slurm-42-0", "slurm-42-1"]


async def test_pods_of_a_job_no_listing_ever_showed_are_only_deleted_once_slurm_says_so() -> None:
    reconciler, poller, slurm, kube, queued = world()
    slurm.truth[42] = allocation()  # running, but the first listing (a bad record?) lacks it
    reconciler.cache.apply("ADDED", {
        "metadata": {"name": "slurm-42-0", "labels": {"slurm-k8s-bridge/job-id": "42"}},
        "status": {"phase": "Running"},
    })
    slurm.listings.append(JobListing(read_at=time.monotonic(), jobs=()))

    await poller.poll_once()
    await reconciler.reconcile(42)
    assert 42 in queued and slurm.reads == [42]
    assert kube.deleted == []

    del slurm.truth[42]
    slurm.listings.append(JobListing(read_at=time.monotonic(), jobs=()))
    await poller.poll_once()
    await reconciler.reconcile(42)
    assert kube.deleted == ["slurm-42-0"]


async def test_a_listing_carrying_an_older_read_of_a_job_does_not_undo_a_newer_one() -> None:
    """slurmrestd's poll reads only the jobs whose state changed: the rest of its listing is
    views read at earlier polls. Such a view, older than a read of the job made since (the
    attach's), must not replace it, although the listing itself is newer."""
    reconciler, poller, slurm, kube, _ = world()
    earlier_read = replace(allocation(), read_at=time.monotonic(), state="PENDING", nodes=())
    await attach_and_start(reconciler, slurm, kube)  # the attach read it RUNNING, later
    slurm.listings.append(JobListing(read_at=time.monotonic(), jobs=(earlier_read,)))

    await poller.poll_once()

    view = reconciler.jobs.get(42)
    assert view is not None and view.alloc is not None
    assert view.alloc.state == "RUNNING"


async def test_an_end_from_the_job_states_lands_on_the_newest_run_read_since() -> None:
    """The listing took an end from the job states alone onto its last read (run 0); the waiter of
    run 1 attached since (a requeue and a start between two polls): the end is run 1's, with its
    nodes. A full read in the listing replaces the view as it is."""
    store = JobStore(Slurm())  # type: ignore[arg-type]
    run1 = replace(allocation(run=1, nodes=(allocation().nodes[1],)), read_at=2.0)
    store.record(run1)
    listed_run0 = replace(allocation(state="COMPLETED", state_flags=frozenset({"COMPLETING"})), read_at=3.0)

    store.apply_listing(JobListing(read_at=3.0, jobs=(listed_run0,), state_only=frozenset({42})))
    ended = store.get(42)
    store.apply_listing(JobListing(read_at=4.0, jobs=(replace(listed_run0, read_at=4.0),)))
    read = store.get(42)

    assert ended is not None and ended.alloc == replace(run1, state="COMPLETED",
                                                        state_flags=frozenset({"COMPLETING"}), read_at=3.0)
    assert read is not None and read.alloc is not None and read.alloc.run == 0, "a full read: as it is"
