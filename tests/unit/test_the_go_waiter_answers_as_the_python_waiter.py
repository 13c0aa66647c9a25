"""The Go waiter (agent/cmd/waiter) is a port of the Python one (bridge/waiter): both run here, as
a slurmd starts them, against the same fake daemon, and must leave the same bytes in the job's
output files, end with the same exit status or signal, and send the daemon the same requests,
byte for byte (the digest their credentials carry is over those bytes)."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from .waiter_runs import (
    Exchange,
    FakeDaemon,
    Handler,
    Run,
    answering,
    batch_script,
    fakes,
    go_waiter,
    lines_after,
    namespaces_work,
    python_waiter,
    run_waiter,
    signal_when,
    streaming,
)

# Not a skip: CI runs as root, and a machine that cannot must not pass these quietly.
if not namespaces_work():
    pytest.fail("needs mount namespaces (root) for the fake munge", pytrace=False)

ENV = {"SLURM_JOB_ID": "42", "HOME": "/home/alice", "LC_ALL": "C.UTF-8", "PATH": "/usr/bin:/bin"}
USER_SCRIPT = b"#!/bin/bash\r\necho caf\xc3\xa9 \xff\n"


@pytest.fixture(scope="module")
def waiters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    directory = tmp_path_factory.mktemp("waiters")
    return {"python": python_waiter(directory), "go": go_waiter(directory)}


Scenario = Callable[[], tuple[FakeDaemon, Callable[..., None] | None]]


def both(
    waiters: dict[str, list[str]], tmp_path: Path, scenario: Scenario, *, args: list[str] | None = None,
    env: dict[str, str] | None = None, script: bytes = USER_SCRIPT, merged: bool = False,
) -> dict[str, Run]:
    """Each waiter's run of a fresh `scenario` (its daemon and what the test does meanwhile)."""
    runs = {}
    directory = tmp_path / "submit"  # one for both: its path is the job's work_dir
    directory.mkdir()
    for name, command in waiters.items():
        daemon, during = scenario()
        try:
            arguments = [str(batch_script(directory, script))] if args is None else args
            runs[name] = run_waiter(command, daemon, args=arguments, env=env or ENV, cwd=directory,
                                    opt=fakes(directory), during=during, merged=merged)
        finally:
            daemon.close()
    return runs


def assert_same(runs: dict[str, Run], *, requests: bool = True) -> Run:
    python, go = runs["python"], runs["go"]
    assert (go.returncode, go.stdout, go.stderr) == (python.returncode, python.stdout, python.stderr)
    if requests:
        assert go.requests == python.requests
    return python


def test_output_and_the_exit_code_are_the_pods(waiters: dict[str, list[str]], tmp_path: Path) -> None:
    events: list[dict[str, object]] = [
        {"type": "log", "pod": 0, "ts": "t1", "line": "caf\u00e9 \udcff"},
        {"type": "out", "pod": 0, "ts": "t2", "fd": 1, "data": "aGVsbG8K"},
        {"type": "out", "pod": 1, "ts": "t3", "fd": 2, "data": "/3dhcm4K"},
        {"type": "heartbeat"},
        {"type": "message", "text": "the pod was rescheduled"},
        {"type": "usage", "pod": 0, "ts": "t4", "data": "MSAyIDMgNCA1IDYgNyA4IDk="},
        {"type": "exit", "code": 3, "signal": None, "reason": None},
    ]
    run = assert_same(both(waiters, tmp_path, lambda: (FakeDaemon([streaming(*events)]), None),
                           args=None))
    assert run.returncode == 3
    assert run.stdout == "café \udcff\nhello\n".encode("utf-8", "surrogateescape")
    assert run.stderr == b"\xffwarn\nslurm-k8s-bridge: the pod was rescheduled\n"


def test_the_scripts_arguments_and_held_environment_reach_the_daemon_alike(
    waiters: dict[str, list[str]], tmp_path: Path,
) -> None:
    env = {"SLURM_JOB_ID": "42", "SLURM_K8S_BRIDGE_ENV_HELD": "1", "SLURM_NNODES": "2",
           "SLURM_K8S_BRIDGE_HELD_HOME": "/home/al\u00efce", "SLURM_K8S_BRIDGE_HELD_LD_PRELOAD": "/x.so",
           "LC_CTYPE": "C.UTF-8"}
    exit_0 = streaming({"type": "exit", "code": 0, "signal": None})
    runs = both(waiters, tmp_path, lambda: (FakeDaemon([exit_0]), None), env=env, merged=True,
                args=None)
    for name, run in runs.items():
        assert run.requests[0][1].count(b'"arguments"') == 0, name
    assert_same(runs)


def test_a_death_by_signal_is_the_waiters_too(waiters: dict[str, list[str]], tmp_path: Path) -> None:
    for signum in (signal.SIGKILL, signal.SIGUSR1):
        directory = tmp_path / signum.name
        directory.mkdir()
        killed = streaming({"type": "exit", "code": 128 + signum, "signal": int(signum),
                            "reason": "the pod's script was killed"})
        run = assert_same(both(waiters, directory, lambda: (FakeDaemon([killed]), None)))  # noqa: B023
        assert run.returncode == -signum
        assert run.stderr == b"slurm-k8s-bridge: the pod's script was killed\n"


def test_a_refused_attach_fails_the_job_with_the_daemons_words(
    waiters: dict[str, list[str]], tmp_path: Path,
) -> None:
    refused = answering(403, "payload uid differs from the caller's uid\n")
    run = assert_same(both(waiters, tmp_path, lambda: (FakeDaemon([refused]), None)))
    assert run.returncode == 1
    assert run.stderr == b"slurm-k8s-bridge: payload uid differs from the caller's uid\n"


def test_a_cancel_asks_for_the_pods_end_and_waits_for_it(
    waiters: dict[str, list[str]], tmp_path: Path,
) -> None:
    sent_exit: dict[str, float] = {}

    def scenario() -> tuple[FakeDaemon, Callable[..., None]]:
        daemon: FakeDaemon

        def attach(exchange: Exchange) -> None:
            exchange.stream()
            exchange.send({"type": "log", "pod": 0, "ts": "t1", "line": "running"})
            daemon.event("streaming").set()
            assert daemon.event("cancel").wait(20)
            time.sleep(0.5)  # the pods take their time to go
            sent_exit[str(daemon.port)] = time.monotonic()
            exchange.send({"type": "exit", "code": 0, "signal": 15, "reason": None})

        daemon = FakeDaemon([attach])
        return daemon, signal_when(daemon.event("streaming"), signal.SIGTERM)

    runs = both(waiters, tmp_path, scenario)
    run = assert_same(runs)
    assert run.returncode == -signal.SIGTERM and run.stdout == b"running\n"
    assert [path.rsplit("/", 1)[1] for path, _ in run.requests] == ["attach", "cancel"]
    assert all(run.ended_at > at for run, at in zip(runs.values(), sent_exit.values(), strict=True))


def test_an_outage_is_waited_out_and_the_logs_resume_where_they_stopped(
    waiters: dict[str, list[str]], tmp_path: Path,
) -> None:
    lines = [("t1", "one"), ("t2", "two"), ("t3", "three")]

    def resumed(exchange: Exchange) -> None:
        last = exchange.json["last_log"]
        assert isinstance(last, dict)
        exchange.stream()
        for ts, line in lines_after(last.get("0"), lines):
            exchange.send({"type": "log", "pod": 0, "ts": ts, "line": line})
        exchange.send({"type": "exit", "code": 0, "signal": None})

    def cut_off(exchange: Exchange) -> None:
        exchange.stream()
        for ts, line in lines[:2]:
            exchange.send({"type": "log", "pod": 0, "ts": ts, "line": line})
        exchange.send_raw(b'{"type": "log", "pod": 0, "ts": "t3", "li')  # the daemon went away

    quiet = streaming({"type": "heartbeat"})
    garbled = streaming(raw=b"not json\n")
    daemon_plan: list[Handler] = [answering(503, "Slurm unavailable"), quiet, cut_off, garbled, resumed]
    run = assert_same(both(waiters, tmp_path, lambda: (FakeDaemon(list(daemon_plan)), None)))
    assert run.stdout == b"one\ntwo\nthree\n" and run.returncode == 0
    assert [path.rsplit("/", 1)[1] for path, _ in run.requests] == ["attach"] * 5


def test_a_forwarded_signal_reaches_the_daemon_until_it_is_taken(
    waiters: dict[str, list[str]], tmp_path: Path,
) -> None:
    def scenario() -> tuple[FakeDaemon, Callable[..., None]]:
        daemon: FakeDaemon
        answers = iter([409, 200])

        def signal_endpoint(exchange: Exchange) -> None:
            status = next(answers)
            daemon.event(f"signal-{status}").set()
            exchange.answer(status, '{"taken": true}' if status == 200 else "not attached yet")

        def attach(exchange: Exchange) -> None:
            exchange.stream()
            daemon.event("streaming").set()
            assert daemon.event("signal-409").wait(20)
            exchange.send({"type": "heartbeat"})  # the waiter tries again with the next event
            assert daemon.event("signal-200").wait(20)
            exchange.send({"type": "signal-done", "signal": int(signal.SIGUSR1), "seq": 1})
            exchange.send({"type": "exit", "code": 0, "signal": None})

        daemon = FakeDaemon([attach], {"signal": signal_endpoint})
        return daemon, signal_when(daemon.event("streaming"), signal.SIGUSR1)

    run = assert_same(both(waiters, tmp_path, scenario))
    assert [path.rsplit("/", 1)[1] for path, _ in run.requests] == ["attach", "signal", "signal"]
    assert run.requests[1][1] == b'{"signal": 10, "seq": 1}'


def test_a_signal_before_the_attach_is_carried_by_the_next_one(
    waiters: dict[str, list[str]], tmp_path: Path,
) -> None:
    def scenario() -> tuple[FakeDaemon, Callable[..., None]]:
        daemon: FakeDaemon

        def slow_refusal(exchange: Exchange) -> None:
            assert daemon.event("signal").wait(20)
            exchange.answer(503, "caches syncing")

        def carried(exchange: Exchange) -> None:
            assert exchange.json["signals"] == [[1, int(signal.SIGHUP)]]
            streaming({"type": "signal-done", "signal": int(signal.SIGHUP), "seq": 1},
                      {"type": "exit", "code": 0, "signal": None})(exchange)

        daemon = FakeDaemon([slow_refusal, carried], {"signal": answering(409, "not attached")})
        return daemon, signal_when(daemon.event("attach-0"), signal.SIGHUP)

    run = assert_same(both(waiters, tmp_path, scenario))
    assert [path.rsplit("/", 1)[1] for path, _ in run.requests] == ["attach", "signal", "attach"]


@pytest.mark.parametrize(("args", "env", "script"), [
    ([], ENV, b""),
    (["--api"], ENV, b""),
    (None, ENV, b"never rewritten"),
    (None, {"HOME": "/"}, b"#!/bin/sh\n"),
    (["/nonexistent/slurm_script"], ENV, b""),
])
def test_a_bad_invocation_ends_alike(
    waiters: dict[str, list[str]], tmp_path: Path, args: list[str] | None, env: dict[str, str],
    script: bytes,
) -> None:
    runs = {}
    directory = tmp_path / "submit"
    directory.mkdir()
    for name, command in waiters.items():
        daemon = FakeDaemon([streaming({"type": "exit", "code": 0, "signal": None})])
        path = directory / "slurm_script"
        path.write_bytes(script)
        runs[name] = run_waiter(command, daemon, args=[str(path)] if args is None else args, env=env,
                                cwd=directory, opt=fakes(directory))
        daemon.close()
    python, go = runs["python"], runs["go"]
    assert go.returncode == python.returncode and go.stdout == python.stdout
    # Where Python dies of an exception, the Go waiter prints its last line alone, not a traceback.
    assert go.stderr.splitlines()[-1:] == python.stderr.splitlines()[-1:]
    assert go.requests == python.requests == []

