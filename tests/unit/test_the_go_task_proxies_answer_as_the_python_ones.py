"""The Go waiter's task proxies (`waiter task KEY`, a task of a step of the script; `waiter step --
ARGV`, a task of a step the user started) answer as the Python waiter's: same requests to the
daemon byte for byte, same output, same end (an exit code, or the task's signal)."""

from __future__ import annotations

import base64
import json
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from .waiter_runs import (
    Exchange,
    FakeDaemon,
    Handler,
    Run,
    answering,
    fakes,
    go_waiter,
    namespaces_work,
    python_waiter,
    run_waiter,
    signal_when,
    streaming,
)

# Not a skip: CI runs as root, and a machine that cannot must not pass these quietly.
if not namespaces_work():
    pytest.fail("needs mount namespaces (root) for the fake munge", pytrace=False)

TASK_ENV = {"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "node-1", "SLURM_PROCID": "1", "SLURM_STEP_ID": "0",
            "SLURM_K8S_BRIDGE_STEP_TOKEN": "secret", "HOME": "/home/alice", "LC_ALL": "C.UTF-8"}
USER_STEP_ENV = {**TASK_ENV, "SLURM_K8S_BRIDGE_ENV_HELD": "1", "SLURM_K8S_BRIDGE_HELD_HOME": "/home/alice",
                 "SLURM_K8S_BRIDGE_HELD_EDITOR": "vi"}


@pytest.fixture(scope="module")
def waiters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    directory = tmp_path_factory.mktemp("waiters")
    return {"python": python_waiter(directory), "go": go_waiter(directory)}


def output(fd: int, data: bytes) -> dict[str, object]:
    return {"fd": fd, "data": base64.b64encode(data).decode()}


def task_answer(*events: dict[str, object]) -> Handler:
    """What controller.tasks streams for a task: its output, then its exit code."""
    return streaming(*events)


Scenario = Callable[[], tuple[FakeDaemon, Callable[..., None] | None]]


def both(
    waiters: dict[str, list[str]], tmp_path: Path, scenario: Scenario, args: list[str],
    env: dict[str, str] = TASK_ENV, stdin: bytes | None = None,
) -> Run:
    runs = {}
    directory = tmp_path / "step"
    directory.mkdir()
    for name, command in waiters.items():
        daemon, during = scenario()
        try:
            runs[name] = run_waiter(command, daemon, args=args, env=env, cwd=directory, opt=fakes(directory),
                                    during=during, stdin=stdin)
        finally:
            daemon.close()
    python, go = runs["python"], runs["go"]
    assert (go.returncode, go.stdout, go.stderr) == (python.returncode, python.stdout, python.stderr)
    assert go.requests == python.requests
    return python


def task_daemon(task: Handler, **handlers: Handler) -> Scenario:
    return lambda: (FakeDaemon([], {"task": task, "user-task": task, **handlers}), None)


@pytest.mark.parametrize("command", [["task", "7"], ["step", "--", "hostname", "-f"]])
def test_the_tasks_output_and_exit_code_come_through(
    waiters: dict[str, list[str]], tmp_path: Path, command: list[str],
) -> None:
    answer = task_answer(output(1, b"node-1\n"), output(2, b"\xffwarn\n"),
                         {"fd": 3, "data": base64.b64encode(b"1 2 3 4 5 6 7 8 9").decode()},
                         output(5, b"not the job's"), {"exit": 3})
    env = TASK_ENV if command[0] == "task" else USER_STEP_ENV
    run = both(waiters, tmp_path, task_daemon(answer), command, env)
    assert (run.returncode, run.stdout, run.stderr) == (3, b"node-1\n", b"\xffwarn\n")
    body = json.loads(run.requests[0][1])
    assert "SLURM_K8S_BRIDGE_STEP_TOKEN" not in body["env"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1, signal.SIGSEGV])
def test_a_task_ended_by_a_signal_ends_its_proxy_by_it(
    waiters: dict[str, list[str]], tmp_path: Path, signum: signal.Signals,
) -> None:
    run = both(waiters, tmp_path, task_daemon(task_answer({"exit": 128 + signum})), ["task", "7"])
    assert run.returncode == -signum


def test_the_tasks_input_goes_along(waiters: dict[str, list[str]], tmp_path: Path) -> None:
    run = both(waiters, tmp_path, task_daemon(task_answer({"exit": 0})), ["task", "7"], stdin=b"a\x00b\n")
    assert json.loads(run.requests[0][1])["stdin"] == base64.b64encode(b"a\x00b\n").decode()


@pytest.mark.parametrize(("first", "expected"), [
    (answering(404, "job 42 has no open step 7"), b"slurm-k8s-bridge: job 42 has no open step 7\n"),
    (task_answer(output(1, b"half")),
     b"slurm-k8s-bridge: the bridge stopped streaming this task before it ended\n"),
])
def test_a_task_refused_or_cut_off_fails_with_a_word(
    waiters: dict[str, list[str]], tmp_path: Path, first: Handler, expected: bytes,
) -> None:
    run = both(waiters, tmp_path, task_daemon(first), ["task", "7"])
    assert (run.returncode, run.stderr) == (1, expected)


def test_a_busy_daemon_is_asked_again(waiters: dict[str, list[str]], tmp_path: Path) -> None:
    def scenario() -> tuple[FakeDaemon, None]:
        answers = iter([answering(503, "no pod on node node-1 (yet)"), task_answer({"exit": 0})])
        return FakeDaemon([], {"task": lambda exchange: next(answers)(exchange)}), None

    run = both(waiters, tmp_path, scenario, ["task", "7"])
    assert [path for path, _ in run.requests] == ["/v1/jobs/42/task"] * 2 and run.returncode == 0


@pytest.mark.parametrize("command", [["task", "7"], ["step", "--", "sleep", "60"]])
def test_a_signal_of_the_task_reaches_the_daemon(
    waiters: dict[str, list[str]], tmp_path: Path, command: list[str],
) -> None:
    def scenario() -> tuple[FakeDaemon, Callable[..., None]]:
        daemon: FakeDaemon

        def task(exchange: Exchange) -> None:
            exchange.stream()
            daemon.event("running").set()
            signalled = "task-signal" if command[0] == "task" else "user-task-signal"
            assert daemon.event(signalled).wait(20)
            exchange.send({"exit": 128 + signal.SIGUSR1})

        kept = answering(202, '{"kept": "7.1"}')
        handlers = {"task": task, "user-task": task, "task-signal": kept, "user-task-signal": kept}
        daemon = FakeDaemon([], handlers)
        return daemon, signal_when(daemon.event("running"), signal.SIGUSR1)

    env = TASK_ENV if command[0] == "task" else USER_STEP_ENV
    run = both(waiters, tmp_path, scenario, command, env)
    assert run.returncode == -signal.SIGUSR1
    assert json.loads(run.requests[1][1])["signal"] == signal.SIGUSR1
