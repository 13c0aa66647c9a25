"""A batch signal the daemon took lived only in its memory until it reached the script: a daemon
killed (or failed over) before the pod ran lost it. The waiter now keeps each signal until the
daemon reports it delivered ("signal-done"), and offers it again with every attach, so the next
daemon delivers it; a daemon that delivered it already says so again instead of sending it
twice."""

from __future__ import annotations

import json
import signal
from typing import Any

from bridge.waiter import attach as waiter

from .test_a_batch_signal_is_kept_until_the_script_got_it import _Answer, _attached, _world

USR1, USR2 = int(signal.SIGUSR1), int(signal.SIGUSR2)
EXIT = b'{"type": "exit", "code": 0, "signal": null}\n'


class RestartingDaemon:
    """Takes every /signal; each attach gets the next scripted stream (a stream without an exit
    is a daemon that went away, and the waiter attaches again)."""

    def __init__(self, streams: list[list[bytes]]) -> None:
        self.streams = streams
        self.attaches: list[list[list[int]]] = []
        self.signals: list[tuple[int, int]] = []

    def post(self, _url: Any, path: str, _job: int, body: dict[str, Any], *_args: Any) -> Any:
        body = json.loads(json.dumps(body))
        if path.endswith("/signal"):
            self.signals.append((body["seq"], body["signal"]))
            return _Answer([])
        self.attaches.append(body["signals"])
        return _Answer(self.streams.pop(0))


def _done(signum: int, seq: int) -> bytes:
    return json.dumps({"type": "signal-done", "signal": signum, "seq": seq}).encode() + b"\n"


def _waiter(monkeypatch: Any, daemon: RestartingDaemon) -> waiter.Waiter:
    monkeypatch.setattr(waiter, "post", daemon.post)
    monkeypatch.setattr(waiter, "output_merged", lambda: True)
    return waiter.Waiter("http://127.0.0.1:1", 42, "true\n", {"SLURM_JOB_ID": "42"}, "/tmp")


def test_a_taken_signal_goes_with_every_attach_until_the_daemon_reports_it_delivered(
    monkeypatch: Any,
) -> None:
    daemon = RestartingDaemon([
        [],                               # the daemon dies before the pod runs
        [_done(USR1, 1)],                 # the next one delivers it, then goes away too
        [EXIT],
    ])
    job = _waiter(monkeypatch, daemon)

    job.forward_signal(USR1)  # taken at once by the first daemon (its /signal)
    code = job.run()

    assert code == 0
    assert daemon.signals == [(1, USR1)]
    assert daemon.attaches == [[[1, USR1]], [[1, USR1]], []]


def test_a_report_for_an_older_signal_keeps_the_newer_one_of_its_kind(monkeypatch: Any) -> None:
    daemon = RestartingDaemon([[_done(USR1, 1)], [EXIT]])
    job = _waiter(monkeypatch, daemon)

    job.forward_signal(USR1)
    job.forward_signal(USR1)  # taken too (seq 2): the first may have been delivered meanwhile
    job.forward_signal(USR2)
    job.run()

    assert daemon.attaches == [[[2, USR1], [3, USR2]], [[2, USR1], [3, USR2]]]


def test_what_a_waiter_keeps_stays_one_signal_per_kind_under_a_flood(monkeypatch: Any) -> None:
    daemon = RestartingDaemon([[EXIT]])
    job = _waiter(monkeypatch, daemon)

    for _ in range(1000):
        job.forward_signal(USR1)
    job.run()

    assert daemon.attaches == [[[1000, USR1]]]


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
