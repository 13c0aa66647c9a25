"""Slurm's commands inside a bridged pod (scontrol, squeue, sbatch, scancel, sacct, sinfo): the
allow-list parses arguments as the binaries' getopt_long does and refuses, with its reason,
whatever would read a file or run a program on the slurmd host; the daemon answers each request
key once and only from the first pod; the waiter runs Slurm's binary by absolute path with a
fixed environment; the agent frames the request and reads sbatch's script in the pod."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import structlog

from bridge.controller.commands import Commands
from bridge.controller.log_relay import output_event
from bridge.controller.sessions import JobSession
from bridge.core import slurm_commands
from bridge.core.slurm_commands import Refused, export_file_bytes, parse_request, prepare

from .test_agent_keeps_output_byte_exact_and_passes_signals_on import agent, installed_agent, output_frame
from .waiter_runs import go_test

__all__ = ["agent"]  # the module fixture, used below

STAMP = "2025-12-01T12:00:00.000000000Z"


# -- the allow-list --------------------------------------------------------------------------------
@pytest.mark.parametrize(("command", "argv", "want"), [
    ("scontrol", ["show", "hostnames", "kreal[1-2]"], ["--", "show", "hostnames", "kreal[1-2]"]),
    ("scontrol", ["-o", "SHOW", "job", "5"], ["-o", "--", "show", "job", "5"]),
    ("scontrol", ["--det", "show", "job"], ["--details", "--", "show", "job"]),
    ("squeue", ["-hj", "12", "-o", "%T"], ["-h", "-j12", "-o%T"]),
    ("squeue", ["--noh", "--job=12", "--format", "%i %T"], ["--noheader", "--job=12", "--format=%i %T"]),
    ("scancel", ["-s", "USR1", "12"], ["-sUSR1", "--", "12"]),
    ("scancel", ["12", "--batch"], ["--batch", "--", "12"]),
    ("sacct", ["-nXPj", "5", "-o", "State"], ["-n", "-X", "-P", "-j5", "-oState"]),
    ("sinfo", ["-h", "-p", "k8s", "-o", "%a"], ["-h", "-pk8s", "-o%a"]),
    ("sbatch", ["--help"], ["--help"]),
    ("sinfo", ["--json=v0.0.44"], ["--json=v0.0.44"]),
    # The pod's srun has its help, usage and version printed by Slurm's srun: nothing else of srun's.
    ("sstat", ["-j", "7", "-n", "-oJobID,MaxRSS"], ["-j7", "-n", "-oJobID,MaxRSS"]),
    ("sstat", ["--allsteps", "7"], ["--allsteps", "--", "7"]),
    ("srun", ["--vers"], ["--version"]), ("srun", ["--mpi=list"], ["--mpi=list"]),
    ("srun", ["-V"], ["-V"]), ("srun", ["--help", "x"], ["--help"]),
])
def test_arguments_are_given_back_canonical(command: str, argv: list[str], want: list[str]) -> None:
    assert prepare(command, argv, "/home/alice").argv == want


@pytest.mark.parametrize(("command", "argv", "reason"), [
    ("bash", ["-c", "id"], "'bash' is not one of the Slurm commands"),
    ("srun", ["hostname"], "only srun's help, usage, version and --mpi=list are asked this way"),
    ("srun", ["--mpi=pmi2"], "only srun's help, usage, version and --mpi=list are asked this way"),
    ("srun", ["--mpi=x", "--help"], "only srun's help, usage, version and --mpi=list are asked this way"),
    ("srun", ["-n1", "--version"], "option '-n' is not allowed"),
    ("srun", ["--pty", "bash"], "option '--pty' is not allowed"),
    ("sbatch", ["--get-user-env", "--wrap", "x"], "--get-user-env is not allowed inside a job that runs in "
     "Kubernetes: it runs the user's login shell"),
    ("sbatch", ["--get-user-env=10L", "--wrap", "x"], "--get-user-env is not allowed"),
    ("sbatch", ["--export-file=/etc/environment", "--wrap", "x"], "--export-file is not allowed"),
    ("sbatch", ["--export-f", "3", "--wrap", "x"], "--export-file is not allowed"),  # a prefix of it
    ("sbatch", ["--get", "--wrap", "x"], "--get-user-env is not allowed"),
    ("sbatch", ["-F", "/etc/hosts", "--wrap", "x"], "option -F is not allowed"),
    ("sbatch", ["--nodefile=/etc/hosts", "--wrap", "x"], "--nodefile is not allowed"),
    ("sbatch", ["--bbf=/etc/bb", "--wrap", "x"], "--bbf is not allowed"),
    ("sbatch", ["/etc/passwd"], "sbatch: error: Unable to open file /etc/passwd"),
    ("sbatch", ["-p", "native", ":", "-p", "k8s", "job.sh"], "heterogeneous jobs"),
    ("sbatch", ["--wrap", "x", "extra"], "script arguments not permitted with --wrap"),
    ("sbatch", ["--ex", "--wrap", "x"], "is ambiguous"),
    ("sacct", ["--file=/var/log/slurm/jobcomp"], "sacct: option --file is not allowed"),
    ("sacct", ["-f", "/var/log/slurm/jobcomp"], "sacct: option -f is not allowed"),
    ("scontrol", [], "interactive scontrol is not available"),
    ("scontrol", ["listpids"], "scontrol listpids is not available"),
    ("scontrol", ["write", "batch_script", "5", "/tmp/x"], "scontrol write is not available"),
    ("scontrol", ["reconfigure"], "scontrol reconfigure is not available"),
    ("scontrol", ["create", "res"], "scontrol create is not available"),
    ("squeue", ["--no-such-option"], "option '--no-such-option' is not allowed"),
    ("squeue", ["-Z"], "option '-Z' is not allowed"),
    ("squeue", ["-j"], "option requires an argument -- 'j'"),
    ("squeue", ["--format"], "option '--format' requires an argument"),
    ("squeue", ["--noheader=yes"], "doesn't allow an argument"),
    ("squeue", ["stray"], "Unrecognized option: stray"),
    ("squeue", ["-o", "bad\0byte"], "NUL byte"),
    ("squeue", ["--json=../../../dev/shm/x"], "not a data_parser plugin name"),
    ("squeue", ["-h"] * (slurm_commands.MAX_ARGS + 1), "more than"),
])
def test_what_would_touch_the_slurmd_host_is_refused_with_its_reason(
    command: str, argv: list[str], reason: str
) -> None:
    with pytest.raises(Refused) as refused:
        prepare(command, argv, "/home/alice", files={"job.sh": b"#!/bin/sh\n"})
    assert reason in str(refused.value)


def test_a_value_is_never_taken_for_an_option_nor_an_option_for_the_script() -> None:
    # The value of -J is not the script, whatever file the pod has by that name.
    prepared = prepare("sbatch", ["-J", "name", "job.sh", "a1"], "/w",
                       files={"name": b"#!/bin/sh\necho wrong\n", "job.sh": b"#!/bin/sh\necho right\n"})
    assert prepared.stdin == b"#!/bin/sh\necho right\n"
    assert prepared.argv == ["--chdir=/w", "--job-name=job.sh", "-Jname", "/dev/stdin", "a1"]
    # A value that looks like an option is the option's value, as getopt takes it.
    assert prepare("squeue", ["-o", "--json"], "/").argv == ["-o--json"]


def test_sbatch_gets_the_script_text_the_pods_cwd_and_no_path_of_the_users() -> None:
    prepared = prepare("sbatch", ["--parsable", "-D", "sub", "job.sh"], "/home/alice",
                       files={"job.sh": b"#!/bin/sh\n"})
    assert prepared.argv == ["--chdir=/home/alice", "--job-name=job.sh", "--parsable", "-D/home/alice/sub"]
    assert prepared.stdin == b"#!/bin/sh\n"
    from_stdin = prepare("sbatch", ["-p", "k8s"], "/w", stdin=b"#!/bin/sh\ntrue\n")
    assert (from_stdin.argv, from_stdin.stdin) == (["--chdir=/w", "-pk8s"], b"#!/bin/sh\ntrue\n")
    wrapped = prepare("sbatch", ["--wrap", "echo hi"], "/w")
    assert (wrapped.argv, wrapped.stdin) == (["--chdir=/w", "--wrap=echo hi"], None)
    with pytest.raises(Refused, match="exceeds"):
        prepare("sbatch", ["job.sh"], "/w", files={"job.sh": b"x" * (slurm_commands.MAX_SCRIPT_BYTES + 1)})


@pytest.mark.parametrize(("export", "want"), [
    (None, {"A": "1", "B": "2", "PATH": "/bin"}),
    ("ALL", {"A": "1", "B": "2", "PATH": "/bin"}),
    ("NONE", {}),
    ("A,C=3", {"A": "1"}),
    ("ALL,C=3", {"A": "1", "B": "2", "PATH": "/bin"}),
])
def test_sbatch_exports_the_pods_variables_as_its_export_asks(
    export: str | None, want: dict[str, str],
) -> None:
    argv = ([f"--export={export}"] if export else []) + ["--wrap", "true"]
    prepared = prepare("sbatch", argv, "/w", env={"A": "1", "B": "2", "PATH": "/bin"})
    assert prepared.export == want


def test_the_export_file_is_nul_separated_and_drops_what_cannot_be_one() -> None:
    assert export_file_bytes({"A": "x y\nz", "B=": "no", "C": "nul\0", "D": ""}) == b"A=x y\nz\0D=\0"


def test_a_request_frame_is_decoded_strictly() -> None:
    data = base64.b64encode(json.dumps({"key": "7", "command": "sbatch", "argv": ["job.sh"], "cwd": "/w",
                                        "files": {"job.sh": base64.b64encode(b"#!/bin/sh\n").decode()},
                                        "stdin": "", "env": {"A": "1"}}).encode()).decode()
    request = parse_request(data)
    assert request["key"] == "7" and request["files"] == {"job.sh": b"#!/bin/sh\n"}
    assert request["env"] == {"A": "1"}
    for bad in ("not base64!", base64.b64encode(b"[1]").decode(),
                base64.b64encode(b'{"key": "x", "command": "squeue"}').decode(),
                base64.b64encode(b'{"command": "squeue"}').decode()):
        with pytest.raises(ValueError):
            parse_request(bad)


# -- the daemon: one answer per key, from the first pod only ---------------------------------------
class FakeSteps:
    def __init__(self) -> None:
        self.answered_keys: set[str] = set()
        self.opened: dict[str, str] = {}

    def answered(self, _session: object, key: str) -> bool:
        return key in self.answered_keys

    def open_count(self, _session: object) -> int:
        return len(self.opened)

    def open_command(self, _session: object, key: str, command: str, _cwd: str) -> None:
        self.answered_keys.add(key)
        self.opened[key] = command


def _frame(key: str, command: str, argv: list[str]) -> str:
    request = {"key": key, "command": command, "argv": argv, "cwd": "/w"}
    return base64.b64encode(json.dumps(request).encode()).decode()


def _register(commands: Commands, data: str) -> dict[str, Any]:
    event = output_event(0, STAMP, f"c {data}")
    commands.register(JobSession(5, 0), event, structlog.get_logger())
    return event


def test_the_daemon_passes_an_allowed_request_on_and_books_its_key() -> None:
    steps = FakeSteps()
    event = _register(Commands(steps), _frame("1", "squeue", ["-h"]))  # type: ignore[arg-type]
    assert event["type"] == "command" and event["key"] == "1" and "refused" not in event
    assert parse_request(event["data"])["argv"] == ["-h"]
    assert steps.opened == {"1": "squeue"}


def test_a_refused_request_carries_its_reason_and_no_request() -> None:
    steps = FakeSteps()
    event = _register(Commands(steps), _frame("2", "sbatch", ["--get-user-env", "--wrap", "x"]))  # type: ignore[arg-type]
    assert event["type"] == "command" and "data" not in event
    assert "--get-user-env is not allowed" in event["refused"]
    assert steps.opened == {"2": "sbatch"}  # open, so the refusal reaches the command's stderr


def test_a_replayed_key_is_never_answered_again_whatever_it_asks() -> None:
    steps = FakeSteps()
    commands = Commands(steps)  # type: ignore[arg-type]
    assert _register(commands, _frame("3", "squeue", []))["type"] == "command"
    replay = _register(commands, _frame("3", "sbatch", ["--wrap", "touch /tmp/x"]))
    assert replay == {"type": "heartbeat"}


def test_a_frame_that_is_not_a_request_is_dropped() -> None:
    steps = FakeSteps()
    assert _register(Commands(steps), "bm90IGpzb24=") == {"type": "heartbeat"}  # type: ignore[arg-type]
    assert steps.opened == {}


def test_only_the_batch_scripts_pod_may_ask() -> None:
    data = _frame("1", "squeue", [])
    assert output_event(0, STAMP, f"c {data}")["type"] == "command"
    other = output_event(1, STAMP, f"c {data}")
    assert other["type"] == "out" and other["fd"] == 2  # shown as the agent's complaint, not run


# -- the waiter: Slurm's binary, by absolute path, with a fixed environment ------------------------
# The compiled waiter's (agent/internal/waiter/commands.go), in Go tests (commands_test.go).
def test_the_binarys_environment_is_fixed_whatever_the_job_exported() -> None:
    go_test("TestTheBinarysEnvironmentIsFixedWhateverTheJobExported")


def test_the_waiter_runs_slurms_binary_with_the_script_on_stdin_and_the_export_on_a_memfd() -> None:
    go_test("TestTheWaiterRunsSlurmsBinaryWithTheScriptOnStdinAndTheExportOnAMemfd")


def test_the_waiter_checks_again_and_refuses_what_the_daemon_should_not_have_passed() -> None:
    go_test("TestTheWaiterChecksAgainAndRefusesWhatTheDaemonShouldNotHavePassed")


def test_slurms_binaries_are_found_by_absolute_path_only() -> None:
    """Where the Go test expects them is where the daemon's side says the waiter looks."""
    assert slurm_commands.BINARY_DIRS == ("/usr/bin", "/usr/local/bin", "/opt/slurm/bin")
    go_test("TestSlurmsBinariesAreFoundByAbsolutePathOnly")


# -- the agent: the six names, the frame, sbatch's script read in the pod ---------------------------
def test_the_agent_answers_as_slurms_commands_and_reads_sbatchs_script_in_the_pod(
    agent: Path, tmp_path: Path,
) -> None:
    home, installed = installed_agent(agent, tmp_path)
    for name in ("srun", "scontrol", "squeue", "sbatch", "scancel", "sacct", "sinfo", "sstat"):
        assert os.readlink(home / "bin" / name) == str(installed)
    work = tmp_path / "work"
    work.mkdir()
    (work / "next.sh").write_bytes(b"#!/bin/sh\necho next\n")
    script = ('echo "[$(scontrol show hostnames kreal[1-2])] rc=$?"; sbatch -J x next.sh a1; '
              'echo "sbatch rc=$?"; '
              "printf '#!/bin/sh\\n' | sbatch; echo \"stdin rc=$?\"")
    replies = {"1": [output_frame(1, b"kreal1\nkreal2\n"), output_frame(0, b"0")],
               "2": [output_frame(2, b"sbatch: error: refused\n"), output_frame(0, b"1")],
               "3": [output_frame(0, b"0")]}
    env = {**os.environ, "PATH": f"{home / 'bin'}:/usr/bin:/bin", "MY_VAR": "mine"}
    proc = subprocess.Popen(
        [str(installed), "run", str(home / "script.pid"), "split", "--", "/bin/sh", "-c", script],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env, cwd=work)
    requests: dict[str, dict[str, Any]] = {}
    lines: list[bytes] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            tag, _, data = line.partition(b" ")
            assert tag != b"s", "a Slurm command framed as a step"
            if tag == b"c":
                request = json.loads(base64.b64decode(data))
                requests[request["key"]] = request
                relayed = subprocess.run([str(installed), "step-output", request["key"]],
                                         input=b"".join(replies[request["key"]]), capture_output=True,
                                         timeout=30, check=False)
                assert relayed.returncode == 0, relayed.stderr
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)
    out = b"".join(base64.b64decode(line[2:]) for line in lines if line.startswith(b"o "))
    err = b"".join(base64.b64decode(line[2:]) for line in lines if line.startswith(b"e "))
    assert out == b"[kreal1\nkreal2] rc=0\nsbatch rc=1\nstdin rc=0\n"
    assert err == b"sbatch: error: refused\n"
    assert requests["1"]["command"] == "scontrol"
    assert requests["1"]["argv"] == ["show", "hostnames", "kreal[1-2]"]
    assert "env" not in requests["1"] or not requests["1"]["env"]
    sbatch = requests["2"]
    assert sbatch["cwd"] == str(work) and sbatch["env"]["MY_VAR"] == "mine"
    # Every argument naming a file here comes along ("x" names none); the daemon picks the script.
    files = {k: base64.b64decode(v) for k, v in sbatch["files"].items()}
    assert files == {"next.sh": b"#!/bin/sh\necho next\n"}
    assert "stdin" not in sbatch
    assert base64.b64decode(requests["3"]["stdin"]) == b"#!/bin/sh\n"


def test_a_command_in_a_pod_without_the_script_agent_fails_with_why(agent: Path, tmp_path: Path) -> None:
    home, _ = installed_agent(agent, tmp_path)
    proc = subprocess.run([str(home / "bin" / "squeue")], capture_output=True, timeout=30, check=False)
    assert proc.returncode == 1
    why = b"squeue: error: cannot reach the job's batch script agent (only the batch script's pod"
    assert why in proc.stderr


def test_a_request_too_big_for_one_log_line_is_refused_in_the_pod(agent: Path, tmp_path: Path) -> None:
    """The daemon reads a log line whole only up to 1 MiB: a bigger request would arrive in pieces,
    so the pod's command refuses it itself, without asking."""
    home, _ = installed_agent(agent, tmp_path)
    (tmp_path / "big.sh").write_bytes(b"#!/bin/sh\n" + b"#" * (400 << 10))
    env = {"PATH": "/usr/bin:/bin", **{f"BIG{i}": "x" * (100 << 10) for i in range(4)}}
    proc = subprocess.run([str(home / "bin" / "sbatch"), "big.sh"], capture_output=True, timeout=30,
                          check=False, cwd=tmp_path, env=env)
    assert proc.returncode == 1
    assert b"sbatch: error: the arguments, script and environment exceed 765 KiB" in proc.stderr


def test_the_agents_limits_are_the_daemons() -> None:
    source = (Path(__file__).resolve().parents[2] / "agent" / "commands.go").read_text()
    assert "const maxScriptBytes = 512 << 10" in source and slurm_commands.MAX_SCRIPT_BYTES == 512 << 10
    assert "const maxFrameData = 1<<20 - 4096" in source
    assert slurm_commands.MAX_REQUEST_BYTES == (1 << 20) - 4096
