"""A signal that is already pending when the waiter starts (the SPANK step guard blocks the
forwarded ones when it execs the waiter, so one Slurm sent meanwhile waits, pending, across the
exec) is acted on by the compiled waiter as the protocol says (as the retired Python waiter did):
TERM goes to the daemon as a cancel (which decides whether it stops the run); INT, HUP, QUIT,
USR1 (and the others) are forwarded to the script in the pods, in the order they are numbered,
and carried by the attach too. The Go runtime unblocks HUP, INT, TERM and QUIT before any Go
code runs, so the Go waiter takes those pending at its start before the runtime does
(agent/internal/earlysignals)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from .waiter_runs import (
    Exchange,
    FakeDaemon,
    Run,
    batch_script,
    fakes,
    go_waiter,
    require_namespaces,
    run_waiter,
)

require_namespaces()

ENV = {"SLURM_JOB_ID": "42", "HOME": "/home/alice", "LC_ALL": "C.UTF-8", "PATH": "/usr/bin:/bin"}
# Blocks the signals given, sends them to itself (they stay pending), then execs the waiter: as
# the guard's mask and a signal Slurm sent while slurmstepd started the task.
HOLD_THEN_EXEC = ("import os, signal, sys\n"
                  "signums = [int(s) for s in sys.argv[1].split(',')]\n"
                  "signal.pthread_sigmask(signal.SIG_BLOCK, signums)\n"
                  "for signum in signums:\n"
                  "    os.kill(os.getpid(), signum)\n"
                  "os.execv(sys.argv[2], sys.argv[2:])\n")
CANCELLING = {signal.SIGTERM}


@pytest.fixture(scope="module")
def waiter(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return go_waiter(tmp_path_factory.mktemp("waiter"))


def daemon_for(signums: list[signal.Signals]) -> Callable[[], FakeDaemon]:
    def scenario() -> FakeDaemon:
        daemon: FakeDaemon

        def attach(exchange: Exchange) -> None:
            exchange.stream()
            kept = exchange.json.get("signals") or []
            assert isinstance(kept, list)
            for seq, signum in kept:
                exchange.send({"type": "signal-done", "signal": signum, "seq": seq})
            if CANCELLING & set(signums):
                assert daemon.event("cancel").wait(20)
                exchange.send({"type": "exit", "code": 0, "signal": 15, "reason": None})
            else:
                exchange.send({"type": "exit", "code": 0, "signal": None})

        daemon = FakeDaemon([attach])
        return daemon
    return scenario


@pytest.mark.parametrize(("signums", "forwarded", "cancelled"), [
    ([signal.SIGHUP], [1], False),
    ([signal.SIGINT], [2], False),  # only `scancel -s INT -b` sends it: a signal, never a stop
    ([signal.SIGTERM], [], True),
    ([signal.SIGQUIT], [3], False),
    ([signal.SIGUSR1], [10], False),
    ([signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR2, signal.SIGALRM], [1, 3, 12, 14], False),
    ([signal.SIGUSR1, signal.SIGTERM], [10], True),
], ids=lambda value: "+".join(s.name for s in value) if isinstance(value, list) and value
   and isinstance(value[0], signal.Signals) else None)
def test_a_signal_pending_at_the_start_is_acted_on(
    waiter: list[str], tmp_path: Path, signums: list[signal.Signals], forwarded: list[int], cancelled: bool,
) -> None:
    """Each forwarded one is sent (and refused: no attach yet), then the job is cancelled if asked,
    then the attach carries the forwarded ones and the cancel; a cancelled job ends as by TERM."""
    directory = tmp_path / "submit"
    directory.mkdir()
    daemon = daemon_for(signums)()
    held = [sys.executable, "-I", "-c", HOLD_THEN_EXEC, ",".join(str(int(s)) for s in signums), *waiter]
    try:
        ran = run_waiter(held, daemon, args=[str(batch_script(directory, b"true\n"))], env=ENV, cwd=directory,
                         opt=fakes(directory))
    finally:
        daemon.close()
    assert (ran.returncode, ran.stdout, ran.stderr) == (-signal.SIGTERM if cancelled else 0, b"", b"")
    carried = [[seq, signum] for seq, signum in enumerate(forwarded, 1)]
    expected = [*(("/v1/jobs/42/signal", json.dumps({"signal": signum, "seq": seq}).encode())
                  for seq, signum in carried),
                *([("/v1/jobs/42/cancel", b'{"run": 0, "forwards": true}')] if cancelled else [])]
    assert ran.requests[:-1] == expected
    path, body = ran.requests[-1]
    attach = json.loads(body)
    assert (path, attach["cancel"], attach["signals"]) == ("/v1/jobs/42/attach", cancelled, carried)


def test_each_term_while_attached_reaches_the_daemon(waiter: list[str], tmp_path: Path) -> None:
    """A script that traps TERM natively gets every `scancel -s TERM -b`: the waiter tells the
    daemon of each, not only of the first (the daemon decides whether each stops the run)."""
    directory = tmp_path / "submit"
    directory.mkdir()
    cancels: list[bytes] = []
    both = threading.Event()

    def cancel(exchange: Exchange) -> None:
        cancels.append(exchange.body)
        exchange.answer(200, '{"cancelling": 42}')
        if len(cancels) == 2:
            both.set()

    def attach(exchange: Exchange) -> None:
        exchange.stream()
        assert both.wait(20), f"the daemon heard of {len(cancels)} TERM(s)"
        exchange.send({"type": "exit", "code": 0, "signal": None})

    daemon = FakeDaemon([attach], {"cancel": cancel})

    def twice(proc: subprocess.Popen[bytes]) -> None:
        assert daemon.event("attach-0").wait(20)
        proc.send_signal(signal.SIGTERM)
        assert daemon.event("cancel").wait(20)
        time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)

    try:
        ran = run_waiter(waiter, daemon, args=[str(batch_script(directory, b"true\n"))], env=ENV,
                         cwd=directory, opt=fakes(directory), during=twice)
    finally:
        daemon.close()
    assert (ran.returncode, ran.stderr) == (0, b"")
    assert cancels == [b'{"run": 0, "forwards": true}'] * 2


def _term_once_attached(
    waiter: list[str], directory: Path, daemon: FakeDaemon, env: dict[str, str] = ENV,
) -> Run:
    """The waiter of a script `true` against `daemon`, sent TERM once it has attached."""
    def term(proc: subprocess.Popen[bytes]) -> None:
        assert daemon.event("attach-0").wait(20)
        proc.send_signal(signal.SIGTERM)

    try:
        return run_waiter(waiter, daemon, args=[str(batch_script(directory, b"true\n"))], env=env,
                          cwd=directory, opt=fakes(directory), during=term)
    finally:
        daemon.close()


def _term_then_reattach(
    waiter: list[str], tmp_path: Path, answer: str, env: dict[str, str],
) -> list[dict[str, object]]:
    """TERM once attached; the daemon answers the cancel with `answer`, then drops the attach
    stream; the bodies of the cancel and of both attaches."""
    directory = tmp_path / "submit"
    directory.mkdir()
    bodies: list[dict[str, object]] = []

    def cancel(exchange: Exchange) -> None:
        bodies.append(json.loads(exchange.body))
        exchange.answer(200, answer)

    def first(exchange: Exchange) -> None:
        bodies.append(json.loads(exchange.body))
        exchange.stream()
        assert daemon.event("cancel").wait(20)
        time.sleep(0.2)  # its answer read; the stream then breaks

    def second(exchange: Exchange) -> None:
        bodies.append(json.loads(exchange.body))
        exchange.stream({"type": "exit", "code": 0, "signal": None})

    daemon = FakeDaemon([first, second], {"cancel": cancel})
    ran = _term_once_attached(waiter, directory, daemon, env)
    assert ran.returncode == 0, ran.stderr
    return bodies


def test_a_term_the_daemon_took_as_a_signal_is_not_carried_again(waiter: list[str], tmp_path: Path) -> None:
    # After a daemon restart the next attach would have it delivered a second time.
    env = {**ENV, "SLURM_RESTART_COUNT": "2"}
    attach, cancel, again = _term_then_reattach(waiter, tmp_path, '{"cancelling": 42, "stops": false}', env)
    assert (attach["cancel"], cancel, again["cancel"]) == (False, {"run": 2, "forwards": True}, False)


def test_a_term_that_stops_the_run_is_carried_until_an_attach_took_it(
    waiter: list[str], tmp_path: Path,
) -> None:
    attach, cancel, again = _term_then_reattach(waiter, tmp_path, '{"cancelling": 42, "stops": true}', ENV)
    assert (attach["cancel"], cancel, again["cancel"]) == (False, {"run": 0, "forwards": True}, True)


def test_a_term_that_is_only_a_signal_is_forwarded_numbered_and_kept_until_delivered(
    waiter: list[str], tmp_path: Path,
) -> None:
    """The daemon answers that the TERM is the script's signal and asks the waiter to forward it:
    the waiter sends it as it sends USR1, numbered, and keeps it until the daemon reports it
    delivered. A daemon that restarts before delivering it gets it again with the next attach
    (it took it with the cancel and held it unnumbered: lost to a restart, doubled by a retry)."""
    directory = tmp_path / "submit"
    directory.mkdir()
    signals: list[dict[str, object]] = []
    attaches: list[dict[str, object]] = []

    def cancel(exchange: Exchange) -> None:
        exchange.answer(200, '{"cancelling": 42, "stops": false, "forward": true}')

    def taken(exchange: Exchange) -> None:
        signals.append(json.loads(exchange.body))
        exchange.answer(200, '{"taken": true}')

    def first(exchange: Exchange) -> None:
        attaches.append(json.loads(exchange.body))
        exchange.stream()
        assert daemon.event("signal").wait(20), "the TERM was not forwarded"
        time.sleep(0.2)  # the daemon restarts before it delivered the TERM: the stream breaks

    def second(exchange: Exchange) -> None:
        attaches.append(json.loads(exchange.body))
        exchange.stream({"type": "signal-done", "signal": 15, "seq": 1},
                        {"type": "exit", "code": 0, "signal": None})

    daemon = FakeDaemon([first, second], {"cancel": cancel, "signal": taken})
    ran = _term_once_attached(waiter, directory, daemon)
    assert ran.returncode == 0, ran.stderr
    assert signals == [{"signal": 15, "seq": 1}]
    assert [(a["cancel"], a["signals"]) for a in attaches] == [(False, []), (False, [[1, 15]])]


def test_a_term_an_older_daemon_took_with_the_cancel_is_not_forwarded(
    waiter: list[str], tmp_path: Path,
) -> None:
    # Its answer has no "forward": it delivers the TERM itself, and a forwarded one would be a second.
    attach, _, again = _term_then_reattach(waiter, tmp_path, '{"cancelling": 42, "stops": false}', ENV)
    assert (attach["signals"], again["signals"]) == ([], [])


def test_a_daemon_that_refuses_forwards_is_asked_as_it_knows(waiter: list[str], tmp_path: Path) -> None:
    """A daemon older than `forwards` refuses the field (its bodies are strict: 400); the waiter
    asks again as that daemon knows, which keeps a TERM that is only a signal itself, and says
    nothing into the job's error file."""
    directory = tmp_path / "submit"
    directory.mkdir()
    cancels: list[dict[str, object]] = []

    def cancel(exchange: Exchange) -> None:
        cancels.append(json.loads(exchange.body))
        if "forwards" in cancels[-1]:
            exchange.answer(400, "forwards: Extra inputs are not permitted")
        else:
            exchange.answer(200, '{"cancelling": 42, "stops": false}')

    def attach(exchange: Exchange) -> None:
        exchange.stream()
        assert daemon.event("cancel").wait(20)
        time.sleep(0.5)
        exchange.send({"type": "exit", "code": 0, "signal": None})

    daemon = FakeDaemon([attach], {"cancel": cancel})
    ran = _term_once_attached(waiter, directory, daemon)
    assert (ran.returncode, ran.stderr) == (0, b"")
    assert cancels == [{"run": 0, "forwards": True}, {"run": 0}]
    assert [path for path, _ in ran.requests if path.endswith("/signal")] == [], "that daemon keeps the TERM"
