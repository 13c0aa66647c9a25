"""The compiled waiter (agent/cmd/waiter) runs here as a slurmd starts it, against a fake daemon:
the bytes it leaves in the job's output files, the exit status or signal it ends with, and the
requests it sends the daemon, byte for byte (the digest its credential carries is over those
bytes), are what the protocol says (what the retired Python waiter did)."""

from __future__ import annotations

import json
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
    assert_request,
    attach_body,
    batch_script,
    environ_order,
    fakes,
    go_waiter,
    lines_after,
    require_namespaces,
    run_waiter,
    signal_when,
    start_limits,
    streaming,
)

require_namespaces()

ENV = {"SLURM_JOB_ID": "42", "HOME": "/home/alice", "LC_ALL": "C.UTF-8", "PATH": "/usr/bin:/bin"}
USER_SCRIPT = b"#!/bin/bash\r\necho caf\xc3\xa9 \xff\n"
# The script as the attach request carries it: line ends made \n, undecodable bytes as surrogates.
SENT_SCRIPT = "#!/bin/bash\necho caf\u00e9 \udcff\n"


@pytest.fixture(scope="module")
def waiter(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return go_waiter(tmp_path_factory.mktemp("waiter"))


Scenario = Callable[[], tuple[FakeDaemon, Callable[..., None] | None]]


def run(
    waiter: list[str], tmp_path: Path, scenario: Scenario, *, env: dict[str, str] | None = None,
    script: bytes = USER_SCRIPT, merged: bool = False, arguments: tuple[str, ...] = (),
) -> Run:
    """The waiter's run of `scenario` (its daemon and what the test does meanwhile)."""
    directory = tmp_path / "submit"  # its path is the job's work_dir
    directory.mkdir()
    daemon, during = scenario()
    try:
        return run_waiter(waiter, daemon, args=[str(batch_script(directory, script)), *arguments],
                          env=env or ENV, cwd=directory, opt=fakes(directory), during=during, merged=merged)
    finally:
        daemon.close()


HELD = "SLURM_K8S_BRIDGE_HELD_"


def sent_environment(tmp_path: Path, values: dict[str, str], env: dict[str, str] = ENV) -> dict[str, str]:
    """`values` in the order the waiter was given them (in `env`; a held one under its held name)."""
    directory = tmp_path / "submit"
    given = [name.removeprefix(HELD) for name in environ_order(fakes(directory), env, directory)]
    assert sorted(values) == sorted(name for name in given if name in values)
    return {**{name: values[name] for name in given if name in values}, **start_limits()}


def assert_attaches(run: Run, tmp_path: Path, **fields: object) -> None:
    """Each attach request of `run` is the job's, with `fields` (the last_log, signals, ...)."""
    environment = sent_environment(tmp_path, {**ENV, "PWD": str(tmp_path / "submit")})
    expected = attach_body(SENT_SCRIPT, environment, tmp_path / "submit", **fields)  # type: ignore[arg-type]
    for path, body in run.requests:
        if path == "/v1/jobs/42/attach":
            assert_request(body, expected)


def test_output_and_the_exit_code_are_the_pods(waiter: list[str], tmp_path: Path) -> None:
    events: list[dict[str, object]] = [
        {"type": "log", "pod": 0, "ts": "t1", "line": "caf\u00e9 \udcff"},
        {"type": "out", "pod": 0, "ts": "t2", "fd": 1, "data": "aGVsbG8K"},
        {"type": "out", "pod": 1, "ts": "t3", "fd": 2, "data": "/3dhcm4K"},
        {"type": "heartbeat"},
        {"type": "message", "text": "the pod was rescheduled"},
        {"type": "usage", "pod": 0, "ts": "t4", "data": "MSAyIDMgNCA1IDYgNyA4IDk="},
        {"type": "exit", "code": 3, "signal": None, "reason": None},
    ]
    ran = run(waiter, tmp_path, lambda: (FakeDaemon([streaming(*events)]), None))
    assert [path for path, _ in ran.requests] == ["/v1/jobs/42/attach"]
    assert_attaches(ran, tmp_path)
    assert ran.returncode == 3
    assert ran.stdout == "café \udcff\nhello\n".encode("utf-8", "surrogateescape")
    assert ran.stderr == b"\xffwarn\nslurm-k8s-bridge: the pod was rescheduled\n"


def test_the_held_environment_reaches_the_daemon_under_its_own_names(
    waiter: list[str], tmp_path: Path,
) -> None:
    """Where the SPANK guard held the environment: only the held and SLURM_ variables count (no
    PWD, no LC_CTYPE), and no script arguments are sent."""
    env = {"SLURM_JOB_ID": "42", "SLURM_K8S_BRIDGE_ENV_HELD": "1", "SLURM_NNODES": "2",
           "SLURM_K8S_BRIDGE_HELD_HOME": "/home/al\u00efce", "SLURM_K8S_BRIDGE_HELD_LD_PRELOAD": "/x.so",
           "LC_CTYPE": "C.UTF-8"}
    exit_0 = streaming({"type": "exit", "code": 0, "signal": None})
    ran = run(waiter, tmp_path, lambda: (FakeDaemon([exit_0]), None), env=env, merged=True)
    assert (ran.returncode, ran.stdout, ran.stderr) == (0, b"", b"")
    (path, body), = ran.requests
    held = {"SLURM_JOB_ID": "42", "SLURM_NNODES": "2", "LD_PRELOAD": "/x.so", "HOME": "/home/al\u00efce"}
    environment = sent_environment(tmp_path, held, env)
    assert path == "/v1/jobs/42/attach"
    assert_request(body, attach_body(SENT_SCRIPT, environment, tmp_path / "submit", output_merged=True))
    assert body.count(b'"arguments"') == 0


def test_the_scripts_arguments_go_to_the_daemon_as_sbatch_gave_them(
    waiter: list[str], tmp_path: Path
) -> None:
    """`sbatch job.sh a 'b c' '' '$(HOME)'`: slurmd starts the wrapper with them, and it hands them to
    the waiter ("$@"); the attach request carries them, unexpanded, after output_merged."""
    arguments = ("a", "b c", "", "$(HOME)", "caf\u00e9")
    exit_0 = streaming({"type": "exit", "code": 0, "signal": None})
    ran = run(waiter, tmp_path, lambda: (FakeDaemon([exit_0]), None), arguments=arguments)
    assert (ran.returncode, ran.stderr) == (0, b"")
    (path, body), = ran.requests
    environment = sent_environment(tmp_path, {**ENV, "PWD": str(tmp_path / "submit")})
    expected = attach_body(SENT_SCRIPT, environment, tmp_path / "submit")
    fields = list(expected.items())
    at = [name for name, _ in fields].index("output_merged") + 1
    assert path == "/v1/jobs/42/attach"
    assert_request(body, dict([*fields[:at], ("arguments", list(arguments)), *fields[at:]]))


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGUSR1])
def test_a_death_by_signal_is_the_waiters_too(
    waiter: list[str], tmp_path: Path, signum: signal.Signals,
) -> None:
    killed = streaming({"type": "exit", "code": 128 + signum, "signal": int(signum),
                        "reason": "the pod's script was killed"})
    ran = run(waiter, tmp_path, lambda: (FakeDaemon([killed]), None))
    assert (ran.returncode, ran.stdout) == (-signum, b"")
    assert ran.stderr == b"slurm-k8s-bridge: the pod's script was killed\n"
    assert [path for path, _ in ran.requests] == ["/v1/jobs/42/attach"]
    assert_attaches(ran, tmp_path)


def test_a_refused_attach_fails_the_job_with_the_daemons_words(waiter: list[str], tmp_path: Path) -> None:
    refused = answering(403, "payload uid differs from the caller's uid\n")
    ran = run(waiter, tmp_path, lambda: (FakeDaemon([refused]), None))
    assert (ran.returncode, ran.stdout) == (1, b"")
    assert ran.stderr == b"slurm-k8s-bridge: payload uid differs from the caller's uid\n"
    assert [path for path, _ in ran.requests] == ["/v1/jobs/42/attach"]
    assert_attaches(ran, tmp_path)


def test_a_cancel_asks_for_the_pods_end_and_waits_for_it(waiter: list[str], tmp_path: Path) -> None:
    sent_exit: list[float] = []

    def scenario() -> tuple[FakeDaemon, Callable[..., None]]:
        daemon: FakeDaemon

        def attach(exchange: Exchange) -> None:
            exchange.stream()
            exchange.send({"type": "log", "pod": 0, "ts": "t1", "line": "running"})
            daemon.event("streaming").set()
            assert daemon.event("cancel").wait(20)
            time.sleep(0.5)  # the pods take their time to go
            sent_exit.append(time.monotonic())
            exchange.send({"type": "exit", "code": 0, "signal": 15, "reason": None})

        daemon = FakeDaemon([attach])
        return daemon, signal_when(daemon.event("streaming"), signal.SIGTERM)

    ran = run(waiter, tmp_path, scenario)
    assert (ran.returncode, ran.stdout, ran.stderr) == (-signal.SIGTERM, b"running\n", b"")
    assert [path.rsplit("/", 1)[1] for path, _ in ran.requests] == ["attach", "cancel"]
    assert ran.requests[1][1] == b'{"run": 0, "forwards": true}'
    assert_attaches(ran, tmp_path)
    assert ran.ended_at > sent_exit[0]


def test_an_outage_is_waited_out_and_the_logs_resume_where_they_stopped(
    waiter: list[str], tmp_path: Path,
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
    ran = run(waiter, tmp_path, lambda: (FakeDaemon(list(daemon_plan)), None))
    assert (ran.returncode, ran.stdout, ran.stderr) == (0, b"one\ntwo\nthree\n", b"")
    assert [path.rsplit("/", 1)[1] for path, _ in ran.requests] == ["attach"] * 5
    # Each attach says which log lines it has: none until the cut-off stream gave two.
    last_logs = [json.loads(body)["last_log"] for _, body in ran.requests]
    assert last_logs == [{}, {}, {}, {"0": "t2"}, {"0": "t2"}]
    assert_attaches(Run(0, b"", b"", ran.requests[:3], 0), tmp_path)
    assert_attaches(Run(0, b"", b"", ran.requests[3:], 0), tmp_path, last_log={"0": "t2"})


def test_a_forwarded_signal_reaches_the_daemon_until_it_is_taken(waiter: list[str], tmp_path: Path) -> None:
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

    ran = run(waiter, tmp_path, scenario)
    assert (ran.returncode, ran.stdout, ran.stderr) == (0, b"", b"")
    assert [path.rsplit("/", 1)[1] for path, _ in ran.requests] == ["attach", "signal", "signal"]
    assert ran.requests[1][1] == ran.requests[2][1] == b'{"signal": 10, "seq": 1}'
    assert_attaches(ran, tmp_path)


def test_a_signal_before_the_attach_is_carried_by_the_next_one(waiter: list[str], tmp_path: Path) -> None:
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

    ran = run(waiter, tmp_path, scenario)
    assert (ran.returncode, ran.stdout, ran.stderr) == (0, b"", b"")
    assert [path.rsplit("/", 1)[1] for path, _ in ran.requests] == ["attach", "signal", "attach"]
    assert ran.requests[1][1] == b'{"signal": 1, "seq": 1}'
    assert_attaches(Run(0, b"", b"", ran.requests[:1], 0), tmp_path)
    assert_attaches(Run(0, b"", b"", ran.requests[2:], 0), tmp_path, signals=[[1, int(signal.SIGHUP)]])


USAGE = b"usage: waiter [--api URL] [--ca CA_FILE] BATCH_SCRIPT [ARG...] | task KEY | step -- ARGV..."


@pytest.mark.parametrize(("args", "env", "script", "code", "said"), [
    ([], ENV, b"", 2, b"slurm-k8s-bridge: " + USAGE),
    (["--api"], ENV, b"", 1, b"FileNotFoundError: [Errno 2] No such file or directory: '--api'"),
    (None, {"HOME": "/"}, b"#!/bin/sh\n", 1, b"KeyError: 'SLURM_JOB_ID'"),
    (["/nonexistent/slurm_script"], ENV, b"", 1,
     b"FileNotFoundError: [Errno 2] No such file or directory: '/nonexistent/slurm_script'"),
])
def test_a_bad_invocation_ends_with_a_word_and_asks_nothing(
    waiter: list[str], tmp_path: Path, args: list[str] | None, env: dict[str, str], script: bytes, code: int,
    said: bytes,
) -> None:
    """Where the Python waiter died of an exception, the Go waiter prints that traceback's last
    line alone (Slurm users and tools grep for it)."""
    daemon = FakeDaemon([streaming({"type": "exit", "code": 0, "signal": None})])
    path = tmp_path / "slurm_script"
    path.write_bytes(script)
    try:
        ran = run_waiter(waiter, daemon, args=[str(path)] if args is None else args, env=env, cwd=tmp_path,
                         opt=fakes(tmp_path))
    finally:
        daemon.close()
    assert (ran.returncode, ran.stdout, ran.stderr) == (code, b"", said + b"\n")
    assert ran.requests == []


@pytest.mark.parametrize("signum", [signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGILL,
                                    signal.SIGTRAP, signal.SIGFPE, signal.SIGSYS, signal.SIGXCPU])
def test_a_signal_whose_default_is_death_ends_the_waiter_by_it_and_prints_nothing(
    waiter: list[str], tmp_path: Path, signum: signal.Signals,
) -> None:
    """`scancel -s SEGV --batch` (the job's owner may send any signal) ends the waiter by that
    signal, as any process dies of it and as the Python waiter did: Slurm records it (0:11), and
    the job's stderr gets no dump of the Go runtime's state."""
    def scenario() -> tuple[FakeDaemon, Callable[..., None]]:
        daemon: FakeDaemon

        def attach(exchange: Exchange) -> None:
            # Nothing to print: a line sent now could still be on its way when the signal ends
            # the waiter (a full unit run saw that once).
            exchange.stream()
            daemon.event("streaming").set()
            time.sleep(30)  # the stream stays open however late the signal comes

        daemon = FakeDaemon([attach])
        return daemon, signal_when(daemon.event("streaming"), signum)

    ran = run(waiter, tmp_path, scenario)
    assert (ran.returncode, ran.stdout, ran.stderr) == (-signum, b"", b"")
