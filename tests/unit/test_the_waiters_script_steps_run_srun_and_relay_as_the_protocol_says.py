"""The srun steps of a script (the attach stream's "step" events) run Slurm's srun from the
compiled waiter as the protocol says (as the retired Python waiter did): its srun command line
less the waiter's own command, srun's environment, the output relayed in signed frames (or
written to the job's files when the daemon does not take it), the step-done."""

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
    relayed_frames,
    require_namespaces,
    run_waiter,
    start_limits,
)

require_namespaces()

ENV = {"SLURM_JOB_ID": "42", "SLURM_NNODES": "1", "SLURM_EXPORT_ENV": "ALL", "HOME": "/home/alice",
       "LC_ALL": "C.UTF-8", "PATH": "/usr/bin:/bin"}
# Prints its options (not the waiter's own command: its path is this test's),
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
def waiter(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return go_waiter(tmp_path_factory.mktemp("waiter"))


def step_event(argv: list[str], io: list[str], stdin: bytes | None = None) -> dict[str, object]:
    body: dict[str, object] = {"key": 5, "argv": argv}
    if stdin is not None:
        body["stdin"] = base64.b64encode(stdin).decode()  # as Go encodes []byte
    request = base64.b64encode(json.dumps(body).encode()).decode()
    return {"type": "step", "pod": 0, "ts": "t1", "data": request, "token": "signed", "io": io}


def run(waiter: list[str], tmp_path: Path, scenario: Callable[[], FakeDaemon], *requests: str,
        fake_srun: str = FAKE_SRUN) -> Run:
    """The waiter's run of `scenario`: its job ends with 0 once the step is done, after the attach
    and the steps' `requests` (in any order: a step runs beside the attach stream)."""
    directory = tmp_path / "submit"
    directory.mkdir()
    daemon = scenario()
    try:
        ran = run_waiter(waiter, daemon, args=[str(batch_script(directory, b"srun hostname\n"))],
                         env=ENV, cwd=directory, opt=fakes(directory, fake_srun))
    finally:
        daemon.close()
    assert ran.returncode == 0
    (attach_path, attach), *steps = ran.requests
    environment = {name: value for name, value in json.loads(attach)["environment"].items() if name != "PWD"}
    assert (attach_path, environment) == ("/v1/jobs/42/attach", {**ENV, **start_limits()})
    assert sorted(steps) == sorted((f"/v1/jobs/42/{name}", body.encode()) for name, body in
                                   (request.split(" ", 1) for request in requests))
    return ran


def stepping(
    argv: list[str], step_output: Callable[[FakeDaemon], Handler], until: str, stdin: bytes | None = None,
) -> Callable[[], FakeDaemon]:
    def scenario() -> FakeDaemon:
        daemon: FakeDaemon

        def attach(exchange: Exchange) -> None:
            exchange.stream()
            exchange.send(step_event(argv, ["--output=/tmp/slurm-%j.out"], stdin))
            assert daemon.event(until).wait(20)
            exchange.send({"type": "exit", "code": 0, "signal": None})

        daemon = FakeDaemon([attach])
        daemon.handlers["step-output"] = step_output(daemon)
        return daemon
    return scenario


# What the fake srun prints of a step run as `srun hostname` from the script: srun's options as
# the waiter passes them, the task's key, and srun's whole environment (a fixed one, the step's
# token, the job's SLURM_ variables; not SLURM_EXPORT_ENV, which would steer srun's export).
SRUN_ENVIRONMENT = (b"LC_ALL=C\nPATH=/usr/sbin:/usr/bin:/sbin:/bin\nPWD=/\nSLURM_JOB_ID=42\n"
                    b"SLURM_K8S_BRIDGE_STEP_TOKEN=signed\nSLURM_NNODES=1\n")
SRUN_FAILED = b"srun: error: task 0: Exited with exit code 3\n"


def test_a_steps_output_and_end_go_back_through_the_relay(waiter: list[str], tmp_path: Path) -> None:
    frames: list[tuple[int, bytes]] = []

    def relay(daemon: FakeDaemon) -> Handler:
        return relayed_frames(frames, daemon.event("relayed").set)

    ran = run(waiter, tmp_path, stepping(["-N1", "--label", "hostname"], relay, "relayed"),
              'step-output {"key": "5", "resumable": true, "run": 0}\n')
    assert (ran.stdout, ran.stderr) == (b"", b"")
    out, err = (b"".join(data for fd, data in frames if fd == wanted) for wanted in (1, 2))
    assert out == (b"option --jobid=42\noption --nodes=1\noption --label\noption --job-name=hostname\n"
                   b"option --output=/tmp/slurm-%j.out\noption --chdir=/\ntask key 5\n" + SRUN_ENVIRONMENT)
    assert err == SRUN_FAILED
    assert [data for fd, data in frames if fd == 0] == [b"3"] and frames[-1] == (0, b"3")


def test_without_a_relay_the_output_goes_to_the_jobs_files(waiter: list[str], tmp_path: Path) -> None:
    refused = answering(404, "no open step 5")
    ran = run(waiter, tmp_path, stepping(["hostname"], lambda _: refused, "step-done"),
              'step-output {"key": "5", "resumable": true, "run": 0}\n',
              'step-done {"key": "5", "code": 3, "run": 0}')
    assert ran.stdout == (b"option --jobid=42\noption --job-name=hostname\n"
                          b"option --output=/tmp/slurm-%j.out\noption --chdir=/\ntask key 5\n"
                          + SRUN_ENVIRONMENT)
    assert ran.stderr == SRUN_FAILED
    assert ran.requests[-1] == ("/v1/jobs/42/step-done", b'{"key": "5", "code": 3, "run": 0}')


READING_SRUN = """#!/bin/sh
printf 'stdin: '
cat
printf '[end]\\n'
"""


@pytest.mark.parametrize(("stdin", "read"), [(b"a\n\xffb", b"a\n\xffb"), (None, b"")])
def test_what_the_scripts_srun_read_of_its_stdin_is_slurms_sruns(
    waiter: list[str], tmp_path: Path, stdin: bytes | None, read: bytes,
) -> None:
    """`echo x | srun cat`: Slurm's srun forwards its stdin to the step's tasks as natively; a step
    without any gets /dev/null, as before."""
    refused = answering(404, "no open step 5")
    ran = run(waiter, tmp_path, stepping(["cat"], lambda _: refused, "step-done", stdin),
              'step-output {"key": "5", "resumable": true, "run": 0}\n',
              'step-done {"key": "5", "code": 0, "run": 0}',
              fake_srun=READING_SRUN)
    assert ran.stdout == b"stdin: " + read + b"[end]\n"


@pytest.mark.parametrize(("argv", "said", "code"), [
    (["--pty", "bash"], b"srun: error: option --pty is not available in a job that runs in Kubernetes: "
                        b"a terminal for a step's task is not available in a bridged job yet\n", 255),
    (["-N"], b"srun: option requires an argument -- 'N'\nTry \"srun --help\" for more information\n", 255),
    (["--label"], b"srun: fatal: No command given to execute.\n", 1),
])
def test_a_refused_step_is_told_as_srun_would(
    waiter: list[str], tmp_path: Path, argv: list[str], said: bytes, code: int,
) -> None:
    """No srun runs, no output is relayed: srun's words go to the job's error file, its code to
    the daemon."""
    never = answering(404, "never asked")
    ran = run(waiter, tmp_path, stepping(argv, lambda _: never, "step-done"),
              f'step-done {{"key": "5", "code": {code}, "run": 0}}')
    assert (ran.stdout, ran.stderr) == (b"", said)
