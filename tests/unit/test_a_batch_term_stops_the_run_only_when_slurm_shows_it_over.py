"""slurmstepd sends the batch step SIGTERM when the run ends (scancel, the time limit, a requeue)
and for a mere signal (`scancel -b -s TERM`, `--signal=B:TERM@T`). Natively a script that traps
TERM goes on after the signal, and only the end kills it. The waiter cannot tell the two apart;
the daemon took every TERM for a cancel and deleted the run's pods. Now it stops the run only once
Slurm's view shows it over (slurmctld changes the job's state before it has it signalled), and
otherwise delivers the TERM to the script as it does any other batch signal."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

from bridge.clients.kube.cache import PodCache
from bridge.controller import facade
from bridge.controller.metrics import Metrics
from bridge.controller.reconcile import Reconciler
from bridge.core import agent_protocol, wellknown
from bridge.core.model import JobAllocation
from bridge.core.pod_identity import pod_name

from .builders import RecordedExecs, allocation, config

STOP = agent_protocol.signal_command(wellknown.AGENT_RUN_PIDFILE, 15)


class SlurmSays:
    """Slurm's one-job read answers `alloc`; the reads are counted."""

    def __init__(self, alloc: JobAllocation | None) -> None:
        self.alloc = alloc
        self.reads = 0

    async def job(self, job_id: int) -> JobAllocation | None:
        self.reads += 1
        return self.alloc


def _pod() -> dict[str, Any]:
    return {
        "metadata": {
            "name": pod_name(42, 0, 0), "namespace": "slurm-jobs", "uid": "u0",
            "labels": {wellknown.LABEL_JOB_ID: "42", wellknown.LABEL_RUN: "0"},
            "annotations": {wellknown.ANNOTATION_NODE_INDEX: "0",
                            wellknown.ANNOTATION_OUTPUT: wellknown.OUTPUT_FRAMED},
        },
        "spec": {"nodeName": "kube1"},
        "status": {"phase": "Running", "containerStatuses": [
            {"name": "job", "state": {"running": {"startedAt": "2026-12-06T10:00:00Z"}}}]},
    }


def _reconciler(cached: str, read: str | None) -> tuple[Reconciler, RecordedExecs, SlurmSays, list[int]]:
    """The store shows the job `cached`; a read of it finds it `read` (None: Slurm knows no job)."""
    kube, cache, woken = RecordedExecs(), PodCache(), []
    cache.apply("ADDED", _pod())
    slurm = SlurmSays(None if read is None else allocation(state=read))
    reconciler = Reconciler(config(), slurm, kube, cache, Metrics(), woken.append)  # type: ignore[arg-type]
    reconciler.jobs.record(allocation(state=cached))
    return reconciler, kube, slurm, woken


async def _term(cached: str, read: str | None, *, wait_s: float = 0.05, times: int = 1,
                ) -> tuple[Reconciler, RecordedExecs, SlurmSays, list[int]]:
    reconciler, kube, slurm, woken = _reconciler(cached, read)
    reconciler.sessions.open(42, 0)
    original = facade.TERM_VIEW_WAIT_S
    facade.TERM_VIEW_WAIT_S = wait_s
    try:
        for _ in range(times):
            reconciler.request_cancel(42)
        await asyncio.sleep(wait_s + 0.1)
    finally:
        facade.TERM_VIEW_WAIT_S = original
    return reconciler, kube, slurm, woken


def test_a_term_for_a_job_slurm_shows_cancelled_stops_the_run_without_a_read() -> None:
    reconciler, kube, slurm, woken = asyncio.run(_term("CANCELLED", "CANCELLED"))
    session = reconciler.sessions.get(42, 0)
    assert session is not None and session.cancel_requested
    assert kube.execs == [("slurm-42-0", STOP)]
    assert slurm.reads == 0 and woken == [42]


def test_a_term_for_a_job_still_running_is_the_scripts_signal() -> None:
    # `scancel -b -s TERM`: the job goes on in Slurm; the script gets its TERM and may trap it.
    reconciler, kube, slurm, woken = asyncio.run(_term("RUNNING", "RUNNING"))
    session = reconciler.sessions.get(42, 0)
    assert session is not None and not session.cancel_requested
    assert session.signals.pending == [15]
    assert kube.execs == []  # no stop of the agent: delivered to the script by the next reconcile
    assert slurm.reads == 1 and woken == [42]


def test_a_stop_the_store_has_not_seen_yet_is_confirmed_by_one_read() -> None:
    reconciler, kube, slurm, _ = asyncio.run(_term("RUNNING", "TIMEOUT"))
    session = reconciler.sessions.get(42, 0)
    assert session is not None and session.cancel_requested and not session.signals.pending
    assert kube.execs == [("slurm-42-0", STOP)] and slurm.reads == 1


def test_a_run_slurm_no_longer_knows_is_over() -> None:
    reconciler, kube, _, _ = asyncio.run(_term("RUNNING", None))
    session = reconciler.sessions.get(42, 0)
    assert session is not None and session.cancel_requested
    assert kube.execs == [("slurm-42-0", STOP)]


def test_a_requeued_run_is_over_although_the_job_is_pending_again() -> None:
    async def scenario() -> tuple[bool, int]:
        reconciler, _, slurm, _ = _reconciler("RUNNING", "RUNNING")
        reconciler.jobs.record(replace(allocation(state="PENDING", run=1), read_at=1.0))
        session = reconciler.sessions.open(42, 0)
        reconciler.term_from_slurm(session)
        await asyncio.sleep(0.05)
        return session.cancel_requested, slurm.reads

    cancelled, reads = asyncio.run(scenario())
    assert cancelled and reads == 0


def test_the_poll_after_the_term_decides_without_a_read() -> None:
    async def scenario() -> tuple[bool, bool, int]:
        reconciler, kube, slurm, _ = _reconciler("RUNNING", "RUNNING")
        session = reconciler.sessions.open(42, 0)
        reconciler.request_cancel(42)
        await asyncio.sleep(0.01)
        # The poller's next listing, sent after the TERM, shows the cancel.
        sent = time.monotonic()
        reconciler.jobs.record(replace(allocation(state="CANCELLED"), read_at=sent))
        reconciler.jobs.mark_polled(sent)
        await asyncio.sleep(0.05)
        return session.cancel_requested, bool(kube.execs), slurm.reads

    cancelled, stopped, reads = asyncio.run(scenario())
    assert cancelled and stopped and reads == 0


def test_a_poll_sent_before_the_term_does_not_decide() -> None:
    async def scenario() -> tuple[bool, int]:
        reconciler, _, slurm, _ = _reconciler("RUNNING", "RUNNING")
        session = reconciler.sessions.open(42, 0)
        before = time.monotonic()
        reconciler.request_cancel(42)
        reconciler.jobs.mark_polled(before)  # answered now, but sent before the TERM
        await asyncio.sleep(0.05)
        decided_early = bool(session.signals.pending) or session.cancel_requested
        return decided_early, slurm.reads

    original = facade.TERM_VIEW_WAIT_S
    facade.TERM_VIEW_WAIT_S = 0.5
    try:
        decided_early, reads = asyncio.run(scenario())
    finally:
        facade.TERM_VIEW_WAIT_S = original
    assert not decided_early and reads == 0


def test_each_term_of_a_running_job_is_the_scripts_pending_once() -> None:
    # Natively each `scancel -s TERM -b` reaches the script; TERMs not delivered yet are one, as a
    # pending signal is in the kernel.
    reconciler, kube, slurm, _ = asyncio.run(_term("RUNNING", "RUNNING", times=3))
    session = reconciler.sessions.get(42, 0)
    assert session is not None and session.signals.pending == [15] and not session.cancel_requested
    assert kube.execs == [] and slurm.reads == 3


def test_a_stop_told_again_stops_once() -> None:
    _, kube, _, _ = asyncio.run(_term("CANCELLED", "CANCELLED", times=3))
    assert kube.execs == [("slurm-42-0", STOP)]


def test_a_waiter_that_re_attaches_with_a_term_this_daemon_took_adds_nothing() -> None:
    async def scenario() -> tuple[list[int], int]:
        reconciler, _, slurm, _ = _reconciler("RUNNING", "RUNNING")
        original = facade.TERM_VIEW_WAIT_S
        facade.TERM_VIEW_WAIT_S = 0.05
        try:
            from .builders import payload
            session = reconciler.attach_session(42, payload())
            reconciler.request_cancel(42)
            await asyncio.sleep(0.2)
            session.signals.pending.clear()  # delivered
            reconciler.attach_waiter(42, payload(), last_log={}, cancel=True, signals=[])
            await asyncio.sleep(0.2)
        finally:
            facade.TERM_VIEW_WAIT_S = original
        return session.signals.pending, slurm.reads

    pending, reads = asyncio.run(scenario())
    assert pending == [] and reads == 1


def test_a_waiter_that_attaches_with_its_term_gets_the_same_decision() -> None:
    async def scenario() -> tuple[list[int], bool]:
        reconciler, _, _, _ = _reconciler("RUNNING", "RUNNING")
        original = facade.TERM_VIEW_WAIT_S
        facade.TERM_VIEW_WAIT_S = 0.05
        try:
            from .builders import payload
            attached = reconciler.attach_waiter(42, payload(), last_log={}, cancel=True, signals=[])
            assert attached is not None
            await asyncio.sleep(0.2)
        finally:
            facade.TERM_VIEW_WAIT_S = original
        session = attached[0]
        return session.signals.pending, session.cancel_requested

    pending, cancelled = asyncio.run(scenario())
    assert pending == [15] and not cancelled
