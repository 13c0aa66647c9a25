"""A step's task reports what it used, as slurmstepd's wait4 does natively: the agent stays its
parent, ends as it ended (exit code, or death by the same signal), and ends its stderr with a
usage line (agent/task_wait.go) that the daemon takes off the stream (UsageTrailer) and hands to
the task's proxy as a usage event, never as output."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bridge.core.agent_protocol import MAX_USAGE_FIGURES, USAGE_TRAILER, UsageTrailer

from .test_agent_keeps_output_byte_exact_and_passes_signals_on import agent  # noqa: F401

NO_ENV = base64.b64encode(json.dumps({}).encode()).decode()
BURN = ("import time\nheld = b'x' * (48 << 20)\nstart = time.process_time()\n"
        "while time.process_time() - start < 1.0:\n    pass\n")


def run_task(agent_binary: Path, tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([str(agent_binary), "task", str(tmp_path / "task.pid"), NO_ENV, "--", *argv],
                          capture_output=True, timeout=60, check=False)


def test_the_task_ends_its_stderr_with_what_it_used(agent: Path, tmp_path: Path) -> None:  # noqa: F811
    script = tmp_path / "burn.py"
    script.write_text(BURN)

    result = run_task(agent, tmp_path, "/bin/sh", "-c", f"{sys.executable} {script}; echo err >&2; exit 3")

    assert result.returncode == 3, "the task's exit code"
    assert result.stderr.startswith(b"err\n") and result.stderr.endswith(b"\n")
    output, found = UsageTrailer().feed(result.stderr)
    assert output == b"err\n", "nothing but the usage line is taken off"
    user_us, sys_us, rss, max_rss, *unknown, faults = found[0].split()
    assert int(user_us) + int(sys_us) >= 900_000, "the CPU of all it reaped"
    assert int(max_rss) >= 48 << 20 and rss == max_rss
    assert unknown == ["-"] * 4 and faults.isdigit()


@pytest.mark.parametrize(("signal_name", "code"), [("TERM", 143), ("SEGV", 139), ("KILL", 137)])
def test_a_task_killed_by_a_signal_ends_the_agent_as_the_exec_reports_it(
    agent: Path, tmp_path: Path, signal_name: str, code: int  # noqa: F811
) -> None:
    result = run_task(agent, tmp_path, "/bin/sh", "-c", f"kill -{signal_name} $$")

    # 128+N: what the pod's exec reports for a task a signal ended, and the proxy dies of N.
    assert result.returncode == code, result.stderr


def test_a_signal_to_the_tasks_group_reaches_the_task(agent: Path, tmp_path: Path) -> None:  # noqa: F811
    # The task traps TERM and exits 7; the agent ends as it did.
    with subprocess.Popen([str(agent), "task", str(tmp_path / "task.pid"), NO_ENV, "--", "/bin/sh",
                           "-c", "trap 'exit 7' TERM; echo ready; while :; do sleep 0.1; done"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        group = 0
        try:
            assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
            # The agent names the task in its pid file just after starting it: the task may print
            # first (under load, CI read the file before it was there).
            pid_file = tmp_path / "task.pid"
            for _ in range(200):
                if pid_file.exists():
                    break
                time.sleep(0.05)
            group = int(pid_file.read_text())
            assert group != proc.pid and os.getpgid(group) == group, "the pid file names the task's group"
            os.killpg(group, signal.SIGTERM)
            assert proc.wait(timeout=30) == 7
        finally:
            proc.kill()
            if group:  # a failure above would leave the task behind
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group, signal.SIGKILL)


def test_a_task_that_makes_its_own_group_is_still_reached(agent: Path, tmp_path: Path) -> None:  # noqa: F811
    # GNU timeout calls setpgid(0, 0), as many launchers do: the task is its group's leader
    # already, so a step's signal still reaches it (and timeout passes it on to sleep).
    with subprocess.Popen([str(agent), "task", str(tmp_path / "task.pid"), NO_ENV, "--", "timeout", "60",
                           "sleep", "50"], stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        try:
            for _ in range(100):
                if (tmp_path / "task.pid").exists():
                    break
                time.sleep(0.05)
            time.sleep(0.3)
            os.killpg(int((tmp_path / "task.pid").read_text()), signal.SIGTERM)
            assert proc.wait(timeout=30) != 0
        finally:
            proc.kill()


def test_with_one_file_for_both_streams_the_usage_line_stays_off_the_output(
    agent: Path, tmp_path: Path  # noqa: F811
) -> None:
    merged = base64.b64encode(json.dumps({"SLURM_K8S_BRIDGE_TASK_STDERR_TO_STDOUT": "1"}).encode()).decode()

    result = subprocess.run([str(agent), "task", str(tmp_path / "task.pid"), merged, "--", "/bin/sh", "-c",
                             "echo out; echo err >&2"], capture_output=True, timeout=60, check=False)

    assert result.stdout == b"out\nerr\n"
    assert result.stderr.startswith(USAGE_TRAILER)


def test_a_task_that_cannot_start_says_so_as_slurmstepd_does(agent: Path, tmp_path: Path) -> None:  # noqa: F811
    result = run_task(agent, tmp_path, "/no/such/program")

    assert result.returncode == 2
    assert b"slurmstepd: error: execve(): /no/such/program" in result.stderr


def feed_in_chunks(data: bytes, size: int) -> tuple[bytes, list[str]]:
    trailer = UsageTrailer()
    out, found = b"", []
    for start in range(0, len(data), size):
        chunk_out, chunk_found = trailer.feed(data[start:start + size])
        out += chunk_out
        found += chunk_found
    return out + trailer.flush(), found


@pytest.mark.parametrize("size", [1, 2, 7, 64, 4096])
def test_the_line_is_found_however_the_stream_is_cut(size: int) -> None:
    stream = b"some\x00output\x00\n" + USAGE_TRAILER + b"1 2 3 3 - - - - 0\n"

    assert feed_in_chunks(stream, size) == (b"some\x00output\x00\n", ["1 2 3 3 - - - - 0"])


@pytest.mark.parametrize("stream", [
    b"plain output\n",
    b"ends in NULs \x00\x00",
    USAGE_TRAILER[:-3],                                               # a start of the marker, then the end
    USAGE_TRAILER + b"x" * (MAX_USAGE_FIGURES + 10) + b"\n",          # too long to be the agent's
    USAGE_TRAILER + b"no end of line",
    USAGE_TRAILER + "\u00e9\n".encode(),                              # not ASCII
])
def test_anything_else_passes_on_as_output_byte_for_byte(stream: bytes) -> None:
    for size in (1, 5, 4096):
        assert feed_in_chunks(stream, size) == (stream, []), size


def test_many_markers_that_are_not_lines_pass_on_whole() -> None:
    stream = (USAGE_TRAILER + b"\xff\n") * 20_000  # 600 KB a hostile task could write, one chunk

    assert feed_in_chunks(stream, 1 << 20) == (stream, [])


def test_output_waits_only_while_it_could_begin_the_marker() -> None:
    trailer = UsageTrailer()

    assert trailer.feed(b"line\n") == (b"line\n", [])
    assert trailer.feed(b"abc\x00") == (b"abc", [])
    assert trailer.feed(b"z") == (b"\x00z", [])
