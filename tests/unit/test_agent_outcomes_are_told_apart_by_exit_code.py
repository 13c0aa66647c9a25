"""The daemon tells the agent's outcomes apart by exit code, never by its message text: `signal`
for a script that has not started exits EXIT_NOT_STARTED (the signal is kept for later), one for a
script that has ended EXIT_NO_SUCH_PROCESS (dropped), anything else EXIT_FAILED (tried again). The
codes are named once in Go (agent/exitcodes.go) and once in Python (core/agent_protocol.py)."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

from bridge.core import agent_protocol

from .test_agent_keeps_output_byte_exact_and_passes_signals_on import AGENT_SOURCE, agent  # noqa: F401

GO_NAMES = {
    "exitFailed": "EXIT_FAILED",
    "exitSrunGone": "EXIT_SRUN_GONE",
    "exitNotStarted": "EXIT_NOT_STARTED",
    "exitNoSuchProcess": "EXIT_NO_SUCH_PROCESS",
}


def test_go_and_python_name_the_same_codes() -> None:
    source = (AGENT_SOURCE / "exitcodes.go").read_text()
    go = {name: int(value) for name, value in re.findall(r"^\s*(exit[A-Za-z]+)\s*=\s*(\d+)", source, re.M)}

    assert set(go) == set(GO_NAMES), "a code named on one side only"
    for go_name, python_name in GO_NAMES.items():
        assert go[go_name] == getattr(agent_protocol, python_name), go_name
    assert len(set(go.values())) == len(go), "two outcomes share a code"


def _signal(agent_binary: Path, pidfile: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(agent_binary), "signal", str(pidfile), "10"], capture_output=True, text=True,
                          timeout=30, check=False)


def _written_seconds_ago(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_a_signal_for_a_script_not_started_exits_not_started(agent: Path, tmp_path: Path) -> None:  # noqa: F811
    result = _signal(agent, tmp_path / "script.pid")

    assert result.returncode == agent_protocol.EXIT_NOT_STARTED, result.stderr


def test_a_signal_for_a_script_that_ended_exits_no_such_process(agent: Path, tmp_path: Path) -> None:  # noqa: F811
    ended = subprocess.Popen(["/bin/true"])
    ended.wait()
    pidfile = tmp_path / "script.pid"
    pidfile.write_text(f"{ended.pid}\n")
    _written_seconds_ago(pidfile, 5)  # a script that ran (a younger one is "not started" yet)

    result = _signal(agent, pidfile)

    assert result.returncode == agent_protocol.EXIT_NO_SUCH_PROCESS, result.stderr


def test_a_torn_pid_file_is_another_failure(agent: Path, tmp_path: Path) -> None:  # noqa: F811
    pidfile = tmp_path / "script.pid"
    pidfile.write_text("12ab")

    result = _signal(agent, pidfile)

    assert result.returncode == agent_protocol.EXIT_FAILED, result.stderr


def test_the_usage_names_every_verb(agent: Path) -> None:  # noqa: F811
    result = subprocess.run([str(agent)], capture_output=True, text=True, timeout=30, check=False)

    assert result.returncode == agent_protocol.EXIT_FAILED
    for verb in ("install", "run", "signal", "wait", "receive-script", "step-output", "step-done", "task"):
        assert re.search(rf"\b{verb}\b", result.stderr), verb
