"""Slurm's commands from the pod (the attach stream's "command" events) are checked by the compiled
waiter with the daemon's own tables (bridge/core/slurm_commands.py, which
agent/internal/waiter/slurm_command_tables.go copies): the same argv, script and export file for
each request as the daemon's code gives; and, run against a fake daemon with fake Slurm binaries
in /opt/slurm/bin, the output relayed or written, the binary's environment and the step-done are
as the protocol says (as the retired Python waiter did)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import bridge.core.slurm_commands as slurm_commands
from bridge.core.slurm_commands import Refused

from .waiter_runs import (
    Exchange,
    FakeDaemon,
    Handler,
    Run,
    answering,
    batch_script,
    fakes,
    go_constants,
    go_test,
    go_waiter,
    relayed_frames,
    require_namespaces,
    run_waiter,
    start_limits,
)

# Not skips: CI has Go and runs as root; a machine without them must not pass these quietly.
require_namespaces()


def jsonable(value: object) -> object:
    """The Python tables as JSON has them: sets sorted, tuples as lists."""
    if isinstance(value, frozenset | set):
        return sorted(value)
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [jsonable(v) for v in value]
    return value


# The waiter's own limits on the commands it runs (the retired Python waiter's): at most 32 at
# once, 64 MiB of output each, an hour each.
WAITER_LIMITS = {"MAX_CONCURRENT_COMMANDS": 32, "OUTPUT_LIMIT": 64 * 1024 * 1024, "TIME_LIMIT_S": 3600.0}


def test_the_tables_are_the_daemons_and_the_limits_the_waiters(tmp_path: Path) -> None:
    go_tables: dict[str, Any] = go_constants(tmp_path, "TestSlurmCommandTablesDump",
                                             "WAITER_SLURM_TABLES_OUT")
    assert {name: go_tables.pop(name) for name in WAITER_LIMITS} == WAITER_LIMITS
    python_tables = {name: jsonable(getattr(slurm_commands, name)) for name in go_tables}
    python_tables["_INFO_ONLY"] = {c: sorted(v) for c, v in slurm_commands._INFO_ONLY.items()}
    python_tables["_PLUGIN_NAME"] = "".join(sorted(slurm_commands._PLUGIN_NAME))
    go_tables["_PLUGIN_NAME"] = "".join(sorted(go_tables["_PLUGIN_NAME"]))
    go_tables["_INFO_ONLY"] = {c: sorted(v) for c, v in go_tables["_INFO_ONLY"].items()}
    assert go_tables == python_tables


def encoded(command: object, argv: object = (), **fields: object) -> str:
    request = {"key": 5, "command": command, "argv": list(argv) if isinstance(argv, tuple) else argv,
               "cwd": "/home/alice/run", "files": {"job.sh": "IyEvYmluL3NoCmVjaG8gaGkK"},
               "env": {"A": "1", "B": "x=y", "C": "caf\u00e9"}, **fields}
    return base64.b64encode(json.dumps(request).encode()).decode()


CASES = [
    encoded("squeue", ("-u", "alice", "--me", "-hostate", "--st=R", "--json")),
    encoded("squeue", ("extra",)), encoded("squeue", ("--format",)), encoded("squeue", ("-o",)),
    encoded("squeue", ("--json=v0.0.41", "--yaml=../lib")), encoded("squeue", ("--noheader=1",)),
    encoded("sinfo", ("-Nel", "--", "x")), encoded("sinfo", ("-\u00e9",)), encoded("sinfo", ("-",)),
    encoded("sacct", ("-j", "5", "-f", "/etc/passwd")), encoded("sacct", ("--fi=x",)),
    encoded("sacct", ("-X", "--format=JobID,State", "--", "-x")),
    encoded("scancel", ("--sig", "USR1", "5", "-s9")), encoded("scancel", ("--s", "x")),
    encoded("scontrol", ()), encoded("scontrol", ("SHOW", "job", "5")), encoded("scontrol", ("-o", "show")),
    encoded("scontrol", ("ListPids",)), encoded("scontrol", ("reconfigure",)),
    encoded("scontrol", ("--help",)),
    encoded("sbatch", ("--parti=debug", "-J", "n", "job.sh", "a", "b")), encoded("sbatch", ("job.sh",)),
    encoded("sbatch", ("missing.sh",)), encoded("sbatch", ("--wrap", "hostname", "x")),
    encoded("sbatch", ("--wrap=hostname", "--export=A,NONE,D=4")), encoded("sbatch", ("--export=all",)),
    encoded("sbatch", ("--export", "--wrap=true")), encoded("sbatch", ("--export=NONE", "--wrap=true")),
    encoded("sbatch", ("-D", "sub", "--chdir=/abs", "--wrap=true")), encoded("sbatch", ("--ex=x",)),
    encoded("sbatch", ("-F", "nodes")), encoded("sbatch", ("--get-user-env",)),
    encoded("sbatch", ("--bbf=x",)),
    encoded("sbatch", ("--export-file=/x",)), encoded("sbatch", (":", "job.sh")), encoded("sbatch", ("-V",)),
    encoded("sbatch", (), stdin=base64.b64encode(b"#!/bin/sh\n").decode()), encoded("sbatch", (), cwd="rel"),
    encoded("sbatch", (), stdin=base64.b64encode(b"x" * (512 * 1024 + 1)).decode()),
    encoded("sbatch", ("--wrap=true",), env={"": "1", "X=Y": "2", "N": "a\u0000b", "OK": "1"}),
    encoded("srun", ("--version",)), encoded("srun", ("-V", "x")), encoded("srun", ("--mpi=list",)),
    encoded("srun", ("--mpi", "list")), encoded("srun", ("--mpi=pmi2",)), encoded("srun", ("hostname",)),
    encoded("srun", ("-n1", "--help")), encoded("srun", ("--mpi=x", "--help")), encoded("srun", ()),
    encoded("sstat", ("-j", "5", "-a", "--noheader")),
    encoded("sstat", ("5",)), encoded("sstat", ("--fields",)),
    encoded("bash", ("-c", "id")), encoded("squeue", ["a\u0000b"]), encoded("squeue", ["-v"] * 257),
    encoded("squeue", ["x" * 70000]), encoded("squeue", "-v"), encoded(7, [1, True, None]),
    base64.b64encode(b'{"command": "squeue"}').decode(), base64.b64encode(b"[1]").decode(), "not base64!",
]


def python_answer(data: str) -> dict[str, object]:
    try:
        prepared = slurm_commands.prepare_request(slurm_commands.parse_request(data))
    except Refused as error:
        return {"refused": str(error)}
    except ValueError as error:
        return {"error": f"slurm-k8s-bridge: {error}"}
    export = None if prepared.export is None else slurm_commands.export_file_bytes(prepared.export)
    return {"command": prepared.command, "argv": prepared.argv,
            "stdin": None if prepared.stdin is None else base64.b64encode(prepared.stdin).decode(),
            "export": None if export is None else base64.b64encode(export).decode()}


def test_each_request_is_prepared_alike(tmp_path: Path) -> None:
    (tmp_path / "cases.json").write_text(json.dumps(CASES))
    go_test("TestSlurmCommandCasesFromFile", {"WAITER_SLURM_CASES": str(tmp_path / "cases.json"),
                                              "WAITER_SLURM_CASES_OUT": str(tmp_path / "answers.json")})
    go_answers = json.loads((tmp_path / "answers.json").read_text())
    for data, go in zip(CASES, go_answers, strict=True):
        python = python_answer(data)
        if "error" in python:  # a request the daemon would not pass on: the exception's words differ
            assert "error" in go and go["error"].startswith("slurm-k8s-bridge: not a command request: "), data
        else:
            assert go == python, data


# Prints its arguments (the export file's content for our --export-file, whose fd number is
# whatever the waiter had free), its environment and its input, then ends with 4.
FAKE_SLURM_COMMAND = """#!/bin/sh
for word in "$@"; do
  case "$word" in
    --export-file=*) printf 'export file: '; tr '\\000' ';' < "/proc/self/fd/${word#--export-file=}"; echo ;;
    *) printf 'arg %s\\n' "$word" ;;
  esac
done
env | sort
printf 'stdin: '; cat
printf '%s: warning\\n' "${0##*/}" >&2
exit 4
"""
FAKES = {name: FAKE_SLURM_COMMAND for name in ("sbatch", "scontrol", "squeue")}
ENV = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node-[1-2]", "SLURM_NODELIST": "node-[1-2]",
       "SLURM_CONF": "/nonexistent/slurm.conf",
       "HOME": "/home/alice", "LC_ALL": "C.UTF-8", "PATH": "/usr/bin:/bin", "SQUEUE_FORMAT": "%i"}


def commanding(event: dict[str, object], step_output: Callable[[FakeDaemon], Handler], until: str,
               ) -> Callable[[], FakeDaemon]:
    def scenario() -> FakeDaemon:
        daemon: FakeDaemon

        def attach(exchange: Exchange) -> None:
            exchange.stream()
            exchange.send({"type": "command", "pod": 0, "ts": "t1", **event})
            assert daemon.event(until).wait(20)
            exchange.send({"type": "exit", "code": 0, "signal": None})

        daemon = FakeDaemon([attach])
        daemon.handlers["step-output"] = step_output(daemon)
        return daemon
    return scenario


def run(waiter: list[str], tmp_path: Path, scenario: Callable[[], FakeDaemon], *requests: str) -> Run:
    """The waiter's run of `scenario`: its job ends with 0, with nothing of its own in the job's
    files, after the attach and the command's `requests` (in any order: a command runs beside the
    attach stream)."""
    directory = tmp_path / "submit"
    directory.mkdir()
    daemon = scenario()
    try:
        ran = run_waiter(waiter, daemon, args=[str(batch_script(directory, b"sbatch job.sh\n"))],
                         env=ENV, cwd=directory, opt=fakes(directory, slurm=FAKES))
    finally:
        daemon.close()
    assert ran.returncode == 0
    (attach_path, attach), *commands = ran.requests
    environment = json.loads(attach)["environment"]
    expected = {**ENV, "PWD": str(directory), **start_limits()}
    assert (attach_path, environment) == ("/v1/jobs/42/attach", expected)
    assert sorted(commands) == sorted((f"/v1/jobs/42/{name}", body.encode()) for name, body in
                                      (request.split(" ", 1) for request in requests))
    return ran


@pytest.fixture(scope="module")
def waiter(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return go_waiter(tmp_path_factory.mktemp("waiter"))


def test_sbatchs_output_script_and_exports_go_back_through_the_relay(
    waiter: list[str], tmp_path: Path,
) -> None:
    frames: list[tuple[int, bytes]] = []

    def relay(daemon: FakeDaemon) -> Handler:
        return relayed_frames(frames, daemon.event("relayed").set)

    data = encoded("sbatch", ("--export=A,C", "-J", "named", "job.sh", "arg"))
    ran = run(waiter, tmp_path, commanding({"key": 5, "data": data}, relay, "relayed"),
              'step-output {"key": "5", "resumable": true}\n')
    assert (ran.stdout, ran.stderr) == (b"", b"")
    out, err = (b"".join(data for fd, data in frames if fd == wanted) for wanted in (1, 2))
    # sbatch runs with the exports in a file of its own, the script on its stdin, a fixed
    # environment (not the job's SQUEUE_FORMAT, SLURM_CONF, ...).
    assert out == ("export file: A=1;C=caf\u00e9;\narg --chdir=/home/alice/run\narg --job-name=job.sh\n"
                   "arg --export=A,C\narg -Jnamed\narg /dev/stdin\narg arg\n"
                   "LC_ALL=C\nPATH=/usr/sbin:/usr/bin:/sbin:/bin\nPWD=/\n"
                   "stdin: #!/bin/sh\necho hi\n").encode()
    assert err == b"sbatch: warning\n"
    assert [data for fd, data in frames if fd == 0] == [b"4"] and frames[-1] == (0, b"4")


@pytest.mark.parametrize(("event", "stdout", "stderr", "code"), [
    ({"key": 5, "data": encoded("scontrol", ("show", "hostnames"))},
     b"arg --\narg show\narg hostnames\nLC_ALL=C\nPATH=/usr/sbin:/usr/bin:/sbin:/bin\n"
     b"PWD=/\nSLURM_JOB_NODELIST=node-[1-2]\nSLURM_NODELIST=node-[1-2]\nstdin: ", b"scontrol: warning\n", 4),
    ({"key": 5, "data": encoded("squeue", ("--me",)), "refused": "squeue: refused by the daemon"},
     b"", b"squeue: refused by the daemon\n", 1),
    ({"key": 5, "data": encoded("scontrol", ("listpids",))}, b"",
     b"scontrol listpids is not available inside a job that runs in Kubernetes: it acts on the host "
     b"scontrol runs on, the slurmd host, not on the job's pods\n", 1),
    ({"key": 5, "data": encoded("sacct", ("-X",))}, b"",
     b"sacct: error: sacct is not installed on this host (looked in /usr/bin, /usr/local/bin, "
     b"/opt/slurm/bin)\n", 1),
])
def test_without_a_relay_the_output_goes_to_the_jobs_files(
    waiter: list[str], tmp_path: Path, event: dict[str, object], stdout: bytes, stderr: bytes, code: int,
) -> None:
    """The daemon takes no output (404): it goes to the job's files, the code in a step-done."""
    refused = answering(404, "no open step 5")
    ran = run(waiter, tmp_path, commanding(event, lambda _: refused, "step-done"),
              'step-output {"key": "5", "resumable": true}\n',
              f'step-done {{"key": "5", "code": {code}, "run": 0}}')
    assert (ran.stdout, ran.stderr) == (stdout, stderr)
    assert ran.requests[-1] == ("/v1/jobs/42/step-done", f'{{"key": "5", "code": {code}, "run": 0}}'.encode())
