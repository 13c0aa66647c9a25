"""The compiled waiter's task proxies (`waiter task KEY`, a task of a step of the script; `waiter
step -- ARGV`, a task of a step the user started) answer as the protocol says (as the retired
Python waiter's did): the requests to the daemon byte for byte, the output, the end (an exit
code, or the task's signal)."""

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
    assert_request,
    fakes,
    go_waiter,
    require_namespaces,
    run_waiter,
    signal_when,
    start_limits,
    streaming,
)

require_namespaces()

TASK_ENV = {"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "node-1", "SLURM_PROCID": "1", "SLURM_STEP_ID": "0",
            "SLURM_K8S_BRIDGE_STEP_TOKEN": "secret", "HOME": "/home/alice", "LC_ALL": "C.UTF-8"}
USER_STEP_ENV = {**TASK_ENV, "SLURM_K8S_BRIDGE_ENV_HELD": "1", "SLURM_K8S_BRIDGE_HELD_HOME": "/home/alice",
                 "SLURM_K8S_BRIDGE_HELD_EDITOR": "vi"}


# What each request says of the task: the job's SLURM_ variables less the step's token (the
# held ones, under their own names, for a user's step), where it runs.
TASK_REQUEST: dict[str, object] = {
    "key": "7", "node": "node-1",
    "env": {"SLURM_PROCID": "1", "SLURM_JOB_ID": "42", "SLURMD_NODENAME": "node-1", "SLURM_STEP_ID": "0",
            **start_limits()}}


def user_task_request(argv: list[str], cwd: Path) -> dict[str, object]:
    return {"step": "0", "node": "node-1", "argv": argv, "cwd": str(cwd),
            "env": {"SLURM_PROCID": "1", "SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0", "HOME": "/home/alice",
                    "EDITOR": "vi", "SLURMD_NODENAME": "node-1", **start_limits()}, "tty": False}


@pytest.fixture(scope="module")
def waiter(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return go_waiter(tmp_path_factory.mktemp("waiter"))


def output(fd: int, data: bytes) -> dict[str, object]:
    return {"fd": fd, "data": base64.b64encode(data).decode()}


def task_answer(*events: dict[str, object]) -> Handler:
    """What controller.tasks streams for a task: its output, then its exit code."""
    return streaming(*events)


Scenario = Callable[[], tuple[FakeDaemon, Callable[..., None] | None]]


def run(
    waiter: list[str], tmp_path: Path, scenario: Scenario, args: list[str],
    env: dict[str, str] = TASK_ENV, stdin: bytes | None = None,
) -> Run:
    """The proxy's run in tmp_path/step; its first request is checked to be its task's."""
    directory = tmp_path / "step"
    directory.mkdir()
    daemon, during = scenario()
    try:
        ran = run_waiter(waiter, daemon, args=args, env=env, cwd=directory, opt=fakes(directory),
                         during=during, stdin=stdin)
    finally:
        daemon.close()
    if args[0] == "task":
        expected = {**TASK_REQUEST, **({} if stdin is None else {"stdin": base64.b64encode(stdin).decode()})}
        assert ran.requests[0][0] == "/v1/jobs/42/task"
    else:
        expected = user_task_request(args[2:], directory)
        assert ran.requests[0][0] == "/v1/jobs/42/user-task"
    assert_request(ran.requests[0][1], expected)
    return ran


def task_daemon(task: Handler, **handlers: Handler) -> Scenario:
    return lambda: (FakeDaemon([], {"task": task, "user-task": task, **handlers}), None)


@pytest.mark.parametrize("command", [["task", "7"], ["step", "--", "hostname", "-f"]])
def test_the_tasks_output_and_exit_code_come_through(
    waiter: list[str], tmp_path: Path, command: list[str],
) -> None:
    answer = task_answer(output(1, b"node-1\n"), output(2, b"\xffwarn\n"),
                         {"fd": 3, "data": base64.b64encode(b"1 2 3 4 5 6 7 8 9").decode()},
                         output(5, b"not the job's"), {"exit": 3})
    env = TASK_ENV if command[0] == "task" else USER_STEP_ENV
    ran = run(waiter, tmp_path, task_daemon(answer), command, env)
    assert (ran.returncode, ran.stdout, ran.stderr) == (3, b"node-1\n", b"\xffwarn\n")
    assert len(ran.requests) == 1 and b"SLURM_K8S_BRIDGE_STEP_TOKEN" not in ran.requests[0][1]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1, signal.SIGSEGV])
def test_a_task_ended_by_a_signal_ends_its_proxy_by_it(
    waiter: list[str], tmp_path: Path, signum: signal.Signals,
) -> None:
    ran = run(waiter, tmp_path, task_daemon(task_answer({"exit": 128 + signum})), ["task", "7"])
    assert (ran.returncode, ran.stdout, ran.stderr, len(ran.requests)) == (-signum, b"", b"", 1)


def test_the_tasks_input_goes_along(waiter: list[str], tmp_path: Path) -> None:
    ran = run(waiter, tmp_path, task_daemon(task_answer({"exit": 0})), ["task", "7"], stdin=b"a\x00b\n")
    assert (ran.returncode, ran.stdout, ran.stderr, len(ran.requests)) == (0, b"", b"", 1)
    assert json.loads(ran.requests[0][1])["stdin"] == base64.b64encode(b"a\x00b\n").decode()


def test_a_task_refused_fails_with_a_word(waiter: list[str], tmp_path: Path) -> None:
    ran = run(waiter, tmp_path, task_daemon(answering(404, "job 42 has no open step 7")), ["task", "7"])
    assert (ran.returncode, ran.stdout, ran.stderr, len(ran.requests)) == (
        1, b"", b"slurm-k8s-bridge: job 42 has no open step 7\n", 1)


def answers_in_turn(*handlers: Handler) -> Scenario:
    def scenario() -> tuple[FakeDaemon, None]:
        answers = iter(handlers)
        return FakeDaemon([], {"task": lambda exchange: next(answers)(exchange)}), None
    return scenario


def test_a_stream_cut_off_is_asked_again_for_the_rest(waiter: list[str], tmp_path: Path) -> None:
    """The daemon that streamed the task went away (kill -9, a restart): the task runs on in its
    pod, and the next daemon is asked for the rest from the bytes of each stream written; a frame
    cut in half was not written."""
    def cut_mid_frame(exchange: Exchange) -> None:
        exchange.stream()
        exchange.send(output(1, b"half"))
        exchange.send(output(2, b"err"))
        exchange.send_raw(b'{"fd": 1, "data": "cm')  # a frame the daemon's death cut

    ran = run(waiter, tmp_path, answers_in_turn(
        cut_mid_frame, task_answer(output(1, b" rest\n"), output(2, b"!"), {"exit": 4})), ["task", "7"])
    assert (ran.returncode, ran.stdout, ran.stderr) == (4, b"half rest\n", b"err!")
    assert len(ran.requests) == 2
    assert_request(ran.requests[1][1], {**TASK_REQUEST, "resume": [4, 3]})


def test_a_task_the_pod_never_started_is_asked_for_again_once(waiter: list[str], tmp_path: Path) -> None:
    """The daemon died before the pod started the task: the next one's follower finds no task
    (its usage frame says "unknown"), and the proxy has it run after all; a second such answer
    fails with a word."""
    unknown = {"fd": 3, "data": base64.b64encode(b"unknown\n").decode()}
    ran = run(waiter, tmp_path, answers_in_turn(
        task_answer(), task_answer(unknown, {"exit": 1}), task_answer(output(1, b"ran\n"), {"exit": 0})),
        ["task", "7"])
    assert (ran.returncode, ran.stdout, ran.stderr) == (0, b"ran\n", b"")
    assert [json.loads(body).get("resume") for _, body in ran.requests] == [None, [0, 0], None]


def test_a_busy_daemon_is_asked_again(waiter: list[str], tmp_path: Path) -> None:
    def scenario() -> tuple[FakeDaemon, None]:
        answers = iter([answering(503, "no pod on node node-1 (yet)"), task_answer({"exit": 0})])
        return FakeDaemon([], {"task": lambda exchange: next(answers)(exchange)}), None

    ran = run(waiter, tmp_path, scenario, ["task", "7"])
    assert (ran.returncode, ran.stdout, ran.stderr) == (0, b"", b"")
    assert ran.requests[1] == ran.requests[0] and len(ran.requests) == 2


@pytest.mark.parametrize("command", [["task", "7"], ["step", "--", "sleep", "60"]])
def test_a_signal_of_the_task_reaches_the_daemon(
    waiter: list[str], tmp_path: Path, command: list[str],
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
    ran = run(waiter, tmp_path, scenario, command, env)
    assert (ran.returncode, ran.stdout, ran.stderr) == (-signal.SIGUSR1, b"", b"")
    signalled = ({"key": "7"} if command[0] == "task" else {"step": "0"}) | {
        "procid": "1", "node": "node-1", "signal": int(signal.SIGUSR1)}
    assert ran.requests[1][0] == ("/v1/jobs/42/task-signal" if command[0] == "task"
                                  else "/v1/jobs/42/user-task-signal")
    assert_request(ran.requests[1][1], signalled)
    assert len(ran.requests) == 2


def test_a_task_sends_slurms_variables_the_guard_held_under_their_own_names(
    waiter: list[str], tmp_path: Path,
) -> None:
    """The SPANK guard holds every variable but SLURM_* of a task proxy: slurmstepd's SLURMD_DEBUG
    and srun's SRUN_DEBUG, which a native task has, go to the task under their own names; the
    user's own held ones (EDITOR) come from the script's srun, not from here."""
    env = {**TASK_ENV, "SLURM_K8S_BRIDGE_ENV_HELD": "1", "SLURM_K8S_BRIDGE_HELD_SLURMD_DEBUG": "2",
           "SLURM_K8S_BRIDGE_HELD_SRUN_DEBUG": "3", "SLURM_K8S_BRIDGE_HELD_EDITOR": "vi"}
    directory = tmp_path / "step"
    directory.mkdir()
    daemon = FakeDaemon([], {"task": task_answer({"exit": 0})})
    try:
        ran = run_waiter(waiter, daemon, args=["task", "7"], env=env, cwd=directory, opt=fakes(directory))
    finally:
        daemon.close()
    assert ran.returncode == 0
    expected_env = {**TASK_REQUEST["env"], "SLURMD_DEBUG": "2", "SRUN_DEBUG": "3"}  # type: ignore[dict-item]
    assert_request(ran.requests[0][1], {**TASK_REQUEST, "env": expected_env})
