"""A step's task runs on in its pod when the daemon that streamed its output goes away: the agent
spools the output beside the task's pid file (agent/task_spool.go), and `agent task-follow`, which
the next daemon execs for the task's proxy, forwards the rest from the bytes the proxy has and
ends as the task did. The exec's stdin carries the daemon's acknowledgements ("a OUT ERR"): bytes
the exec wrote after its daemon died went nowhere, so only those decide what the spool drops."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from pathlib import Path
from typing import IO

from bridge.core.agent_protocol import USAGE_TRAILER, UsageTrailer

from .test_agent_keeps_output_byte_exact_and_passes_signals_on import agent  # noqa: F401

NO_ENV = base64.b64encode(json.dumps({}).encode()).decode()


def wait_for(path: Path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def read_exactly(pipe: IO[bytes], size: int) -> bytes:
    """`size` bytes off the pipe, none more: a buffered read may take what follows, which a later
    communicate() (reading the file descriptor) would then never see."""
    data = b""
    while len(data) < size:
        chunk = os.read(pipe.fileno(), size - len(data))
        assert chunk, f"the stream ended after {data!r}"
        data += chunk
    return data


def test_the_rest_of_a_task_whose_daemon_died_comes_through_its_follower(
    agent: Path, tmp_path: Path,  # noqa: F811
) -> None:
    pidfile, go = tmp_path / "tasks" / "1-0.pid", tmp_path / "go"
    task = (f"echo one; echo warn >&2; while [ ! -e {go} ]; do sleep 0.02; done; "
            "echo two; echo three; echo err >&2; exit 5")
    first = subprocess.Popen([str(agent), "task", str(pidfile), NO_ENV, "--", "/bin/sh", "-c", task],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert first.stdin is not None and first.stdout is not None and first.stderr is not None
    first.stdin.write(b"a 0 0\n")
    first.stdin.flush()
    assert read_exactly(first.stdout, 4) == b"one\n"
    assert read_exactly(first.stderr, 5) == b"warn\n"
    # The daemon dies: the exec's streams and stdin go with it. The task goes on regardless.
    for pipe in (first.stdin, first.stdout, first.stderr):
        pipe.close()
    go.touch()
    assert first.wait(timeout=20) == 5
    run = (tmp_path / "tasks" / "1-0.pid.run").read_text()
    assert run.startswith("end 5 14 9\n"), "the end, and how long each stream was"
    assert (tmp_path / "tasks" / "1-0.pid.1").exists(), "nobody said the rest was passed on: kept"

    follower = subprocess.Popen([str(agent), "task-follow", str(pidfile), "4", "5"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert follower.stdin is not None and follower.stdout is not None and follower.stderr is not None
    follower.stdin.write(b"a 0 0\n")
    follower.stdin.flush()
    assert read_exactly(follower.stdout, 10) == b"two\nthree\n"
    assert read_exactly(follower.stderr, 4) == b"err\n"
    follower.stdin.write(b"a 10 4\n")  # the next daemon passed it all on
    follower.stdin.flush()
    out, err = follower.communicate(timeout=20)
    assert follower.returncode == 5
    assert out == b"" and err.startswith(USAGE_TRAILER)
    assert UsageTrailer().feed(err)[0] == b"", "only the usage line"
    assert not (tmp_path / "tasks" / "1-0.pid.1").exists(), "all passed on: the spool's output went"
    assert (tmp_path / "tasks" / "1-0.pid.run").exists(), "the end stays for a proxy that asks again"


def test_a_task_whose_daemon_acknowledged_everything_leaves_no_output_behind(
    agent: Path, tmp_path: Path,  # noqa: F811
) -> None:
    pidfile = tmp_path / "tasks" / "2-0.pid"
    task = ["/bin/sh", "-c", "echo hi; exit 2"]
    with subprocess.Popen([str(agent), "task", str(pidfile), NO_ENV, "--", *task],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as done:
        assert done.stdin is not None and done.stdout is not None
        done.stdin.write(b"a 0 0\n")
        done.stdin.flush()
        assert read_exactly(done.stdout, 3) == b"hi\n"
        wait_for(Path(f"{pidfile}.run"))
        time.sleep(0.2)
        assert done.poll() is None, "the agent waits for the daemon's word that it passed all on"
        done.stdin.write(b"a 3 0\n")
        done.stdin.flush()
        assert done.wait(timeout=20) == 2
    assert sorted(p.name for p in pidfile.parent.iterdir()) == ["2-0.pid", "2-0.pid.run"]


def test_a_follower_of_a_task_the_pod_never_started_says_so(agent: Path, tmp_path: Path) -> None:  # noqa: F811
    result = subprocess.run([str(agent), "task-follow", str(tmp_path / "tasks" / "3-0.pid"), "0", "0"],
                            stdin=subprocess.DEVNULL, capture_output=True, timeout=30, check=False)
    assert result.returncode != 0
    assert result.stdout == b""
    assert UsageTrailer().feed(result.stderr) == (b"", ["unknown"])


def test_the_tasks_input_is_not_the_daemons_acknowledgements(agent: Path, tmp_path: Path) -> None:  # noqa: F811
    pidfile = tmp_path / "tasks" / "4-0.pid"
    task = ["/bin/sh", "-c", "cat; echo end"]
    result = subprocess.run([str(agent), "task", str(pidfile), NO_ENV, "--", *task],
                            input=b"a 0 0\na 4 0\n", capture_output=True, timeout=30, check=False)
    assert (result.returncode, result.stdout) == (0, b"end\n")
