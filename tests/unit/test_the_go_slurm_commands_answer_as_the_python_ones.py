"""Slurm's commands from the pod (the attach stream's "command" events) are checked and run alike
by the Go waiter and the Python one: the same tables (bridge/core/slurm_commands.py and
agent/internal/waiter/slurm_command_tables.go), the same argv, script and export file for each
request, and, run against one fake daemon with fake Slurm binaries in /opt/slurm/bin, the same
output relayed or written, the same environment for the binary, the same step-done."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

import bridge.core.slurm_commands as slurm_commands
import bridge.waiter.commands as waiter_commands
from bridge.core.slurm_commands import Refused

from .waiter_runs import (
    GO_CANDIDATES,
    ROOT,
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

GO = next((c for c in GO_CANDIDATES if os.access(c, os.X_OK)), None)
# Not skips: CI has Go and runs as root; a machine without them must not pass these quietly.
if GO is None:
    pytest.fail("Go is not installed: the compiled waiter cannot be tested", pytrace=False)
if not namespaces_work():
    pytest.fail("needs mount namespaces (root) for the fake munge and Slurm", pytrace=False)


def go_test(name: str, env: dict[str, str]) -> None:
    assert GO is not None
    subprocess.run([GO, "test", "-count=1", "-run", f"^{name}$", "./internal/waiter/"], cwd=ROOT / "agent",
                   env={**os.environ, **env}, check=True, capture_output=True, timeout=600)


def jsonable(value: object) -> object:
    """The Python tables as JSON has them: sets sorted, tuples as lists."""
    if isinstance(value, frozenset | set):
        return sorted(value)
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [jsonable(v) for v in value]
    return value


def test_the_tables_are_the_python_ones(tmp_path: Path) -> None:
    out = tmp_path / "tables.json"
    go_test("TestSlurmCommandTablesDump", {"WAITER_SLURM_TABLES_OUT": str(out)})
    go_tables = json.loads(out.read_text())
    waiter_side = ("MAX_CONCURRENT_COMMANDS", "OUTPUT_LIMIT", "TIME_LIMIT_S")
    python_tables = {name: jsonable(getattr(waiter_commands if name in waiter_side else slurm_commands, name))
                     for name in go_tables}
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
ENV = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node-[1-2]", "SLURM_CONF": "/nonexistent/slurm.conf",
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


def both(waiters: dict[str, list[str]], tmp_path: Path, scenario: Callable[[], FakeDaemon]) -> Run:
    runs = {}
    directory = tmp_path / "submit"
    directory.mkdir()
    for name, command in waiters.items():
        daemon = scenario()
        try:
            runs[name] = run_waiter(command, daemon, args=[str(batch_script(directory, b"sbatch job.sh\n"))],
                                    env=ENV, cwd=directory, opt=fakes(directory, slurm=FAKES))
        finally:
            daemon.close()
    python, go = runs["python"], runs["go"]
    assert (go.returncode, go.stdout, go.stderr) == (python.returncode, python.stdout, python.stderr)
    assert sorted(go.requests) == sorted(python.requests)
    return python


@pytest.fixture(scope="module")
def waiters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    directory = tmp_path_factory.mktemp("waiters")
    return {"python": python_waiter(directory), "go": go_waiter(directory)}


def test_sbatchs_output_script_and_exports_go_back_through_the_relay(
    waiters: dict[str, list[str]], tmp_path: Path,
) -> None:
    frames: dict[str, list[tuple[int, bytes]]] = {"python": [], "go": []}
    order = iter(frames)

    def relay(daemon: FakeDaemon) -> Handler:
        return relayed_frames(frames[next(order)], daemon.event("relayed").set)

    data = encoded("sbatch", ("--export=A,C", "-J", "named", "job.sh", "arg"))
    run = both(waiters, tmp_path, commanding({"key": 5, "data": data}, relay, "relayed"))
    assert "step-done" not in " ".join(path for path, _ in run.requests)
    joined = {name: (b"".join(d for fd, d in got if fd == 1), b"".join(d for fd, d in got if fd == 2),
                     [d for fd, d in got if fd == 0]) for name, got in frames.items()}
    assert joined["go"] == joined["python"]
    out, err, end = joined["go"]
    head = "export file: A=1;C=caf\u00e9;\narg --chdir=/home/alice/run\narg --job-name=job.sh\n"
    assert out.startswith((head + "arg --export=A,C\narg -Jnamed\narg /dev/stdin\narg arg\n").encode())
    assert b"LC_ALL=C\nPATH=/usr/sbin:/usr/bin:/sbin:/bin\n" in out and b"SQUEUE_FORMAT" not in out
    assert out.endswith(b"stdin: #!/bin/sh\necho hi\n") and err == b"sbatch: warning\n" and end == [b"4"]


@pytest.mark.parametrize(("event", "stdout", "stderr", "code"), [
    ({"key": 5, "data": encoded("scontrol", ("show", "hostnames"))},
     b"arg --\narg show\narg hostnames\nLC_ALL=C\nPATH=/usr/sbin:/usr/bin:/sbin:/bin\n"
     b"PWD=/\nSLURM_JOB_NODELIST=node-[1-2]\nstdin: ", b"scontrol: warning\n", 4),
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
    waiters: dict[str, list[str]], tmp_path: Path, event: dict[str, object], stdout: bytes, stderr: bytes,
    code: int,
) -> None:
    refused = answering(404, "no open step 5")
    run = both(waiters, tmp_path, commanding(event, lambda _: refused, "step-done"))
    assert (run.stdout, run.stderr) == (stdout, stderr)
    assert (run.requests[-1][0], json.loads(run.requests[-1][1])) == ("/v1/jobs/42/step-done",
                                                                      {"key": "5", "code": code})
