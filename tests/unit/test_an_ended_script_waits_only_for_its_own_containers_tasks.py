"""Once its script ended, the batch agent stays while its container's step tasks (`agent task`)
run (agent/tasks_left.go). It knew them by name in /proc: outside a container, where the unit
tests run, every agent's tasks on the machine held it up to 30 s (a flaky unit test when another
test's task ran beside it). It now counts only its own binary's execs."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import time
from pathlib import Path

from .test_agent_keeps_output_byte_exact_and_passes_signals_on import agent  # noqa: F401

NO_ENV = base64.b64encode(json.dumps({}).encode()).decode()


def test_another_agents_task_does_not_hold_an_ended_script(agent: Path, tmp_path: Path) -> None:  # noqa: F811
    other = tmp_path / "other" / "slurm-k8s-bridge-agent"
    other.parent.mkdir()
    shutil.copy2(agent, other)
    with subprocess.Popen([str(other), "task", str(tmp_path / "t.pid"), NO_ENV, "--", "sleep", "60"],
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL) as elsewhere:
        try:
            started = time.monotonic()
            result = subprocess.run([str(agent), "run", str(tmp_path / "script.pid"), "merged", "--", "true"],
                                    stdin=subprocess.DEVNULL, capture_output=True, timeout=60, check=False)
            took = time.monotonic() - started
        finally:
            elsewhere.kill()
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith(b"\n") and result.stdout.splitlines()[-1].startswith(b"x ")
    # 30 s when it waited for that task (tasksLeftLimit); well under that when it did not.
    assert took < 15, f"the agent stayed {took:.1f} s for another agent's task"


def test_a_task_agent_whose_task_ended_does_not_hold_an_ended_script(agent: Path, tmp_path: Path) -> None:  # noqa: F811
    """A task's agent stays a few seconds after its task ended, for the daemon's word that it
    passed all the output on (agent/task_spool.go): the task is over, and the script's agent
    does not wait for it (a cancelled job's batch step was killed by the pod's grace)."""
    pidfile = tmp_path / "tasks" / "1-0.pid"
    command = [str(agent), "task", str(pidfile), NO_ENV, "--", "echo", "out"]
    with subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL) as lingering:
        try:
            assert lingering.stdin is not None and lingering.stdout is not None
            lingering.stdin.write(b"a 0 0\n")  # a daemon that acknowledges, and then says no more
            lingering.stdin.flush()
            assert lingering.stdout.readline() == b"out\n"
            run = Path(f"{pidfile}.run")
            deadline = time.monotonic() + 20
            while not run.read_text().startswith("end "):
                assert time.monotonic() < deadline
                time.sleep(0.02)
            result = subprocess.run([str(agent), "run", str(tmp_path / "script.pid"), "merged", "--", "true"],
                                    stdin=subprocess.DEVNULL, capture_output=True, timeout=60, check=False)
            still_waiting = lingering.poll() is None
        finally:
            lingering.kill()
    assert result.returncode == 0, result.stderr
    assert still_waiting, "the task's agent was still waiting for the daemon's word"
