"""srun --pty's task reads its terminal's size as its first instruction, natively the user's (slurmstepd
sizes the pty before the task exists). In a pod the exec's resize message may come after the task
started, so the agent sizes the task's terminal first (SLURM_K8S_BRIDGE_TASK_TTY_SIZE)."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import struct
import subprocess
import termios
from pathlib import Path

import pytest

from bridge.core.step_request import TASK_TTY_SIZE

from .test_agent_keeps_output_byte_exact_and_passes_signals_on import agent  # noqa: F401

PROBE = f'stty size; echo "[${{{TASK_TTY_SIZE}-unset}}]"'


def size_seen_by_the_task(agent_binary: Path, tmp_path: Path, task_env: dict[str, str],
                          sized: tuple[int, int] | None = None) -> list[str]:
    """What the task prints on a fresh pty (0 rows, 0 columns until someone sizes it; `sized`:
    as the runtime sized it before the agent started)."""
    encoded = base64.b64encode(json.dumps(task_env).encode()).decode()
    master, slave = os.openpty()
    try:
        if sized is not None:
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", *sized, 0, 0))
        # As the runtime starts an exec with a terminal: in a session of its own, whose
        # controlling terminal the pty is.
        result = subprocess.run([str(agent_binary), "task", str(tmp_path / "t.pid"), encoded, "--",
                                 "/bin/sh", "-c", PROBE], stdin=slave, capture_output=True, timeout=60,
                                check=False, start_new_session=True,
                                preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))
    finally:
        os.close(slave)
        os.close(master)
    assert result.returncode == 0, result.stderr
    return result.stdout.decode().splitlines()


def test_the_task_starts_on_a_terminal_of_the_users_size(agent: Path, tmp_path: Path) -> None:  # noqa: F811
    assert size_seen_by_the_task(agent, tmp_path, {TASK_TTY_SIZE: "33 101"}) == ["33 101", "[unset]"]


@pytest.mark.parametrize("size", ["0 80", "24 0", "70000 80", "24", "24 80 1", "-1 80", "a b", ""])
def test_a_size_that_is_not_one_leaves_the_terminal_as_it_was(
    agent: Path, tmp_path: Path, size: str,  # noqa: F811
) -> None:
    assert size_seen_by_the_task(agent, tmp_path, {TASK_TTY_SIZE: size}) == ["0 0", "[unset]"]


def test_a_terminal_the_runtime_gave_its_default_size_gets_the_users(agent: Path, tmp_path: Path) -> None:  # noqa: F811
    """Whatever size the terminal had before the agent started, the task starts at the user's."""
    assert size_seen_by_the_task(agent, tmp_path, {TASK_TTY_SIZE: "33 101"}, sized=(24, 80)) == [
        "33 101", "[unset]"]
