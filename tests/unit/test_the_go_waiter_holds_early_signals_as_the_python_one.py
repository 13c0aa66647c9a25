"""A signal that is already pending when the waiter starts (the SPANK step guard blocks the
forwarded ones when it execs the waiter, so one Slurm sent meanwhile waits, pending, across the
exec) is acted on alike by the Go waiter and the Python one: TERM and INT cancel the job, HUP,
QUIT, USR1 are forwarded to the script in the pods. The Go runtime unblocks HUP, INT, TERM and
QUIT before any Go code runs, so the Go waiter takes those pending at its start before the
runtime does (agent/internal/earlysignals)."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from .waiter_runs import (
    Exchange,
    FakeDaemon,
    batch_script,
    fakes,
    go_waiter,
    namespaces_work,
    python_waiter,
    run_waiter,
)

# Not a skip: CI runs as root, and a machine that cannot must not pass these quietly.
if not namespaces_work():
    pytest.fail("needs mount namespaces (root) for the fake munge", pytrace=False)

ENV = {"SLURM_JOB_ID": "42", "HOME": "/home/alice", "LC_ALL": "C.UTF-8", "PATH": "/usr/bin:/bin"}
# Blocks the signals given, sends them to itself (they stay pending), then execs the waiter: as
# the guard's mask and a signal Slurm sent while slurmstepd started the task.
HOLD_THEN_EXEC = ("import os, signal, sys\n"
                  "signums = [int(s) for s in sys.argv[1].split(',')]\n"
                  "signal.pthread_sigmask(signal.SIG_BLOCK, signums)\n"
                  "for signum in signums:\n"
                  "    os.kill(os.getpid(), signum)\n"
                  "os.execv(sys.argv[2], sys.argv[2:])\n")
CANCELLING = {signal.SIGTERM, signal.SIGINT}


@pytest.fixture(scope="module")
def waiters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    directory = tmp_path_factory.mktemp("waiters")
    return {"python": python_waiter(directory), "go": go_waiter(directory)}


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


@pytest.mark.parametrize("signums", [
    [signal.SIGHUP], [signal.SIGINT], [signal.SIGTERM], [signal.SIGQUIT], [signal.SIGUSR1],
    [signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR2, signal.SIGALRM], [signal.SIGUSR1, signal.SIGTERM],
], ids=lambda signums: "+".join(s.name for s in signums))
def test_a_signal_pending_at_the_start_is_acted_on_alike(
    waiters: dict[str, list[str]], tmp_path: Path, signums: list[signal.Signals],
) -> None:
    directory = tmp_path / "submit"
    directory.mkdir()
    runs = {}
    for name, command in waiters.items():
        daemon = daemon_for(signums)()
        held = [sys.executable, "-I", "-c", HOLD_THEN_EXEC, ",".join(str(int(s)) for s in signums), *command]
        try:
            runs[name] = run_waiter(held, daemon, args=[str(batch_script(directory, b"true\n"))], env=ENV,
                                    cwd=directory, opt=fakes(directory))
        finally:
            daemon.close()
    python, go = runs["python"], runs["go"]
    assert (go.returncode, go.stdout, go.stderr) == (python.returncode, python.stdout, python.stderr)
    assert go.requests == python.requests
    actions = [path.rsplit("/", 1)[1] for path, _ in python.requests]
    assert ("cancel" in actions) == bool(CANCELLING & set(signums))
