"""The srun steps of a script (the attach stream's "step" events) run Slurm's srun alike from the
Go waiter and the Python one: same srun command line less the waiter's own command, same
environment, same output relayed in signed frames (or written to the job's files when the
daemon does not take it), same step-done."""

from __future__ import annotations

import base64
import json
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
    namespaces_work,
    python_waiter,
    relayed_frames,
    run_waiter,
)

# Not a skip: CI runs as root, and a machine that cannot must not pass these quietly.
if not namespaces_work():
    pytest.fail("needs mount namespaces (root) for the fake munge and srun", pytrace=False)

ENV = {"SLURM_JOB_ID": "42", "SLURM_NNODES": "1", "SLURM_EXPORT_ENV": "ALL", "HOME": "/home/alice",
       "LC_ALL": "C.UTF-8", "PATH": "/usr/bin:/bin"}
# Prints its options (the waiter's own command is the one part that differs, and not printed),
# the task's key and its environment, then ends with 3.
FAKE_SRUN = """#!/bin/sh
for word in "$@"; do
  case "$word" in --api) ;; --*) printf 'option %s\\n' "$word" ;; esac
  last="$word"
done
printf 'task key %s\\n' "$last"
env | sort
printf 'srun: error: task 0: Exited with exit code 3\\n' >&2
exit 3
"""


@pytest.fixture(scope="module")
def waiters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    directory = tmp_path_factory.mktemp("waiters")
    return {"python": python_waiter(directory), "go": go_waiter(directory)}


def step_event(argv: list[str], io: list[str]) -> dict[str, object]:
    request = base64.b64encode(json.dumps({"key": 5, "argv": argv}).encode()).decode()
    return {"type": "step", "pod": 0, "ts": "t1", "data": request, "token": "signed", "io": io}


def both(waiters: dict[str, list[str]], tmp_path: Path, scenario: Callable[[], FakeDaemon]) -> Run:
    runs = {}
    directory = tmp_path / "submit"
    directory.mkdir()
    for name, command in waiters.items():
        daemon = scenario()
        try:
            runs[name] = run_waiter(command, daemon, args=[str(batch_script(directory, b"srun hostname\n"))],
                                    env=ENV, cwd=directory, opt=fakes(directory, FAKE_SRUN))
        finally:
            daemon.close()
    python, go = runs["python"], runs["go"]
    assert (go.returncode, go.stdout, go.stderr) == (python.returncode, python.stdout, python.stderr)
    assert sorted(go.requests) == sorted(python.requests)
    return python


def stepping(
    argv: list[str], step_output: Callable[[FakeDaemon], Handler], until: str,
) -> Callable[[], FakeDaemon]:
    def scenario() -> FakeDaemon:
        daemon: FakeDaemon

        def attach(exchange: Exchange) -> None:
            exchange.stream()
            exchange.send(step_event(argv, ["--output=/tmp/slurm-%j.out"]))
            assert daemon.event(until).wait(20)
            exchange.send({"type": "exit", "code": 0, "signal": None})

        daemon = FakeDaemon([attach])
        daemon.handlers["step-output"] = step_output(daemon)
        return daemon
    return scenario


def test_a_steps_output_and_end_go_back_through_the_relay(
    waiters: dict[str, list[str]], tmp_path: Path,
) -> None:
    frames: dict[str, list[tuple[int, bytes]]] = {"python": [], "go": []}
    order = iter(frames)

    def relay(daemon: FakeDaemon) -> Handler:
        return relayed_frames(frames[next(order)], daemon.event("relayed").set)

    def scenario() -> FakeDaemon:
        return stepping(["-N1", "--label", "hostname"], relay, "relayed")()

    run = both(waiters, tmp_path, scenario)
    assert "step-done" not in " ".join(path for path, _ in run.requests)
    joined = {name: (b"".join(d for fd, d in got if fd == 1), b"".join(d for fd, d in got if fd == 2),
                     [d for fd, d in got if fd == 0]) for name, got in frames.items()}
    assert joined["go"] == joined["python"]
    out, err, end = joined["go"]
    assert b"option --nodes=1\noption --label\noption --output=/tmp/slurm-%j.out\noption --chdir=/\n" in out
    assert b"SLURM_K8S_BRIDGE_STEP_TOKEN=signed\n" in out and b"SLURM_EXPORT_ENV" not in out
    assert err == b"srun: error: task 0: Exited with exit code 3\n" and end == [b"3"]


def test_without_a_relay_the_output_goes_to_the_jobs_files(
    waiters: dict[str, list[str]], tmp_path: Path,
) -> None:
    refused = answering(404, "no open step 5")
    run = both(waiters, tmp_path, stepping(["hostname"], lambda _: refused, "step-done"))
    assert b"task key 5\n" in run.stdout and run.stderr == b"srun: error: task 0: Exited with exit code 3\n"
    assert (run.requests[-1][0], json.loads(run.requests[-1][1])) == ("/v1/jobs/42/step-done",
                                                                      {"key": "5", "code": 3})


@pytest.mark.parametrize(("argv", "said", "code"), [
    (["--pty", "bash"], b"srun: error: option --pty is not available in a job that runs in Kubernetes: "
                        b"a terminal for a step's task is not available in a bridged job yet\n", 255),
    (["-N"], b"srun: error: option -N requires an argument\n", 255),
    (["--label"], b"srun: fatal: No command given to execute.\n", 1),
])
def test_a_refused_step_is_told_as_srun_would(
    waiters: dict[str, list[str]], tmp_path: Path, argv: list[str], said: bytes, code: int,
) -> None:
    never = answering(404, "never asked")
    run = both(waiters, tmp_path, stepping(argv, lambda _: never, "step-done"))
    assert run.stderr == said
    assert json.loads(run.requests[-1][1]) == {"key": "5", "code": code}
