"""What the daemon says to the in-pod agent (agent/), and how the agent answers. Pure.

The daemon runs the agent's verbs by exec in the job container; the agent answers by its exit
code. Codes are named once here and once in agent/exitcodes.go, which must agree: outcomes are told
apart by code, never by the agent's message text. Used by the controller's batch signals, steps,
tasks and step streams.
"""

from __future__ import annotations

from typing import Final

from bridge.core import wellknown

AGENT: Final = f"{wellknown.AGENT_DIR}/{wellknown.AGENT_BINARY}"
"""The agent's path in the job container."""

EXIT_FAILED: Final = 2
"""Anything else went wrong (bad arguments, an I/O error); the agent's message says what."""
EXIT_SRUN_GONE: Final = 3
"""`step-output`: the script's srun closed its end (killed, `timeout 5 srun ...`)."""
EXIT_NOT_STARTED: Final = 4
"""`signal`: no pid file yet: the script (or the task) has not started."""
EXIT_NO_SUCH_PROCESS: Final = 5
"""`signal`: the process is gone: the script (or the task) has ended."""


def signal_command(pidfile: str, signum: int, *, group: bool = False) -> list[str]:
    """`signal`: send `signum` to the process whose pid is in `pidfile` (`group`: to its process
    group, a step's task, waiting a little for its pid file)."""
    return [AGENT, "signal", pidfile, str(signum), *(["group"] if group else [])]


def signal_all_command(signum: int) -> list[str]:
    """`signal-all`: SIGSTOP or SIGCONT to every process of the job in the pod (suspend, resume)."""
    return [AGENT, "signal-all", str(signum)]


def step_done_command(key: str, code: int) -> list[str]:
    """`step-done`: tell the script's srun of step `key` that it ended with `code`."""
    return [AGENT, "step-done", key, str(code)]


def step_output_command(key: str) -> list[str]:
    """`step-output`: relay Slurm's srun output, framed on stdin, to the script's srun of `key`."""
    return [AGENT, "step-output", key]


def receive_script_command(size: int) -> list[str]:
    """`receive-script`: write `size` bytes of stdin to the script's place (too big for a Secret)."""
    return [AGENT, "receive-script", wellknown.AGENT_SCRIPT, str(size)]


def task_command(pidfile: str, encoded_env: str, argv: list[str]) -> list[str]:
    """`task`: run one task of a step with its environment (base64 JSON), writing its pid."""
    return [AGENT, "task", pidfile, encoded_env, "--", *argv]


def task_pidfile(key: str, procid: str) -> str:
    """Where `task` keeps a task's pid. `key` is a script step's key (digits) or a user step's
    (`u` and its Slurm step id); procid is digits. Both checked by the callers; int() refuses
    anything else here too."""
    prefix = "u" if key.startswith("u") else ""
    return f"{wellknown.AGENT_DIR}/tasks/{prefix}{int(key.removeprefix('u'))}-{int(procid)}.pid"
