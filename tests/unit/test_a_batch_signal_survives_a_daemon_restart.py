"""A batch signal the daemon took lived only in its memory until it reached the script: a daemon
killed (or failed over) before the pod ran lost it. The waiter now keeps each signal until the
daemon reports it delivered ("signal-done"), and offers it again with every attach, so the next
daemon delivers it; a daemon that delivered it already says so again instead of sending it
twice."""

from __future__ import annotations

import signal
from typing import Any

from .test_a_batch_signal_is_kept_until_the_script_got_it import _attached, _world
from .waiter_runs import go_test

USR1, USR2 = int(signal.SIGUSR1), int(signal.SIGUSR2)


# The waiter's side: agent/internal/waiter/script_signals_test.go, whose fake daemon takes every
# /signal and gives each attach the next scripted stream (a stream without an exit is a daemon
# that went away, and the waiter attaches again).


def test_a_taken_signal_goes_with_every_attach_until_the_daemon_reports_it_delivered() -> None:
    go_test("TestATakenSignalGoesWithEveryAttachUntilTheDaemonReportsItDelivered")


def test_a_report_for_an_older_signal_keeps_the_newer_one_of_its_kind() -> None:
    go_test("TestAReportForAnOlderSignalKeepsTheNewerOneOfItsKind")


def test_what_a_waiter_keeps_stays_one_signal_per_kind_under_a_flood() -> None:
    go_test("TestWhatAWaiterKeepsStaysOneSignalPerKindUnderAFlood")


def _events(session: Any) -> list[dict[str, Any]]:
    found = []
    while not session.listener.empty():
        found.append(session.listener.get_nowait())
    return [event for event in found if event["type"] == "signal-done"]


async def test_the_daemon_reports_a_delivered_signal_with_the_newest_seq_it_stood_for() -> None:
    reconciler, kube, _ = _world(failures=1)
    session = _attached(reconciler)
    await reconciler.reconcile(42)  # creates the pods
    reconciler.take_batch_signal(session, USR1, seq=1)
    await reconciler.reconcile(42)  # the exec fails: kept
    reconciler.take_batch_signal(session, USR1, seq=2)  # pending once: one delivery for both
    assert _events(session) == []

    await reconciler.reconcile(42)

    assert kube.signalled == [("slurm-42-0", USR1)]
    assert _events(session) == [{"type": "signal-done", "signal": USR1, "seq": 2}]


async def _usr1_delivered() -> tuple[Any, Any, Any]:
    """A reconciler whose attached session took USR1 as seq 1 and delivered it (its report read)."""
    reconciler, kube, _ = _world(failures=0)
    session = _attached(reconciler)
    await reconciler.reconcile(42)
    reconciler.take_batch_signal(session, USR1, seq=1)
    await reconciler.reconcile(42)
    _events(session)
    return reconciler, kube, session


async def test_an_offered_signal_already_delivered_is_reported_again_not_sent_twice() -> None:
    reconciler, kube, session = await _usr1_delivered()

    # The waiter's stream broke before it read the report: its next attach offers seq 1 again.
    reconciler.take_batch_signal(session, USR1, seq=1, offered=True)
    await reconciler.reconcile(42)

    assert kube.signalled == [("slurm-42-0", USR1)]
    assert _events(session) == [{"type": "signal-done", "signal": USR1, "seq": 1}]


async def test_a_replayed_signal_request_queues_nothing_for_a_waiter_that_does_not_read() -> None:
    """A user may stop their own waiter (SIGSTOP) and replay /signal with old sequence numbers:
    only an attach, whose new stream replaces the old, is told again."""
    reconciler, _kube, session = await _usr1_delivered()

    for _ in range(1000):
        reconciler.take_batch_signal(session, USR1, seq=1)

    assert session.listener.qsize() == 0


async def test_a_signal_that_comes_while_its_kind_is_being_sent_is_sent_again() -> None:
    """The first USR1's exec may already have signalled the script when the second is taken:
    merged into it, the second would be lost (natively the script gets both, if it handled the
    first in between)."""
    reconciler, kube, _ = _world(failures=0)
    session = _attached(reconciler)
    await reconciler.reconcile(42)
    sent = kube.exec_in_pod

    async def exec_during_which_another_comes(pod: str, command: list[str]) -> str:
        answer = await sent(pod, command)
        if len(kube.signalled) == 1:
            reconciler.take_batch_signal(session, USR1, seq=2)
        return answer

    kube.exec_in_pod = exec_during_which_another_comes  # type: ignore[method-assign]
    reconciler.take_batch_signal(session, USR1, seq=1)
    await reconciler.reconcile(42)

    assert kube.signalled == [("slurm-42-0", USR1), ("slurm-42-0", USR1)]
    assert _events(session) == [{"type": "signal-done", "signal": USR1, "seq": 1},
                                {"type": "signal-done", "signal": USR1, "seq": 2}]
