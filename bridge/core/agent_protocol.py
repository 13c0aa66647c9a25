"""What the daemon says to the in-pod agent (agent/), and how the agent answers. Pure.

The daemon runs the agent's verbs by exec in the job container; the agent answers by its exit
code. Codes are named once here and once in agent/exitcodes.go, which must agree: outcomes are told
apart by code, never by the agent's message text. Used by the controller's batch signals, steps,
tasks and step streams.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Final

from bridge.core import wellknown

AGENT: Final = f"{wellknown.AGENT_DIR}/{wellknown.AGENT_BINARY}"
"""The agent's path in the job container."""

EXIT_FAILED: Final = 2
"""Anything else went wrong (bad arguments, an I/O error); the agent's message says what."""
EXIT_SRUN_GONE: Final = 3
"""`step-output`: the script's srun closed its end (killed, `timeout 5 srun ...`)."""
EXIT_NOT_STARTED: Final = 4
"""`signal`: no pid file yet, or the script has run less than a second: the script (or the task)
has not started, or not long enough to have set its traps (asked again later)."""
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


def task_follow_command(pidfile: str, resume: tuple[int, int]) -> list[str]:
    """`task-follow`: the rest of a task's output from these stdout and stderr offsets, then its
    usage line and its end, as `task` gives them (the task ran on while no daemon streamed it)."""
    return [AGENT, "task-follow", pidfile, str(resume[0]), str(resume[1])]


UNKNOWN_TASK_USAGE: Final = "unknown"
"""The usage figures `task-follow` gives for a task the pod never started."""


def task_pidfile(key: str, procid: str) -> str:
    """Where `task` keeps a task's pid. `key` is a script step's key (digits) or a user step's
    (`u` and its Slurm step id); procid is digits. Both checked by the callers; int() refuses
    anything else here too."""
    prefix = "u" if key.startswith("u") else ""
    return f"{wellknown.AGENT_DIR}/tasks/{prefix}{int(key.removeprefix('u'))}-{int(procid)}.pid"


USAGE_TRAILER: Final = b"\x00\x00slurm-k8s-bridge-usage "
"""Starts the line a step's task ends its stderr with: what it used (agent/task_wait.go)."""
MAX_USAGE_FIGURES: Final = 256
"""A longer "line" after the marker is not the agent's: it passes on as output."""


class UsageTrailer:
    """Takes a step task's usage line off its stderr as the exec's chunks come: `feed` gives the
    output to pass on and the usage lines found. Only bytes that could begin the marker wait for
    the next chunk (a few at most, and only when a chunk ends in NUL); the rest passes at once."""

    def __init__(self) -> None:
        self._held = b""

    def feed(self, data: bytes) -> tuple[bytes, list[str]]:
        data, self._held = self._held + data, b""
        out: list[bytes] = []
        found: list[str] = []
        passed = 0  # data[:passed] is decided: output, or a usage line taken off
        look = 0  # where the marker is looked for next
        while (start := data.find(USAGE_TRAILER, look)) >= 0:
            figures_at = start + len(USAGE_TRAILER)
            end = data.find(b"\n", figures_at, figures_at + MAX_USAGE_FIGURES + 1)
            if end < 0 and len(data) - figures_at <= MAX_USAGE_FIGURES:
                out.append(data[passed:start])
                self._held = data[start:]  # the rest of the line is still to come
                return b"".join(out), found
            figures = data[figures_at:end] if end >= 0 else b""
            if end < 0 or not figures.isascii():
                look = start + 1  # not the agent's: output, and look on after its first byte
                continue
            out.append(data[passed:start])
            found.append(figures.decode())
            passed = look = end + 1
        tail = data[max(passed, look):]
        keep = next((k for k in range(min(len(USAGE_TRAILER) - 1, len(tail)), 0, -1)
                     if tail.endswith(USAGE_TRAILER[:k])), 0)
        out.append(data[passed:len(data) - keep])
        self._held = data[len(data) - keep:]
        return b"".join(out), found

    def flush(self) -> bytes:
        """What was held back when the stream ended: output after all."""
        held, self._held = self._held, b""
        return held


@dataclass(frozen=True)
class ScriptEnding:
    """The agent's last log frame ("x"): how the batch script ended (agent/ending.go)."""

    exit_code: int | None
    """The script's exit status; None when a signal killed it."""
    signal: int | None
    oom_kills: int | None
    """OOM kills in the job container's cgroup until then; None when the agent could not read it."""
    stopped: bool
    """The agent was told to stop (the kubelet's SIGTERM: a deletion, an eviction, a shutdown)."""


MAX_ENDING_FIGURE: Final = 1 << 32


def parse_ending(data: str) -> ScriptEnding | None:
    """The "x" frame's payload (base64 of "exited CODE oom N stop S" or "signaled SIG oom N stop S",
    N may be "-", S is 0 or 1); None for anything else."""
    try:
        words = base64.b64decode(data, validate=True).decode("ascii").split(" ")
    except (ValueError, UnicodeDecodeError):
        return None
    if (len(words) != 6 or words[0] not in ("exited", "signaled") or words[2] != "oom"
            or words[4] != "stop" or words[5] not in ("0", "1")):
        return None
    figure, kills = words[1], words[3]
    if not figure.isdigit() or int(figure) > 255 or not (kills == "-" or kills.isdigit()):
        return None
    oom_kills = None if kills == "-" else min(int(kills), MAX_ENDING_FIGURE)
    stopped = words[5] == "1"
    if words[0] == "exited":
        return ScriptEnding(int(figure), None, oom_kills, stopped)
    if not 1 <= int(figure) <= 64:
        return None
    return ScriptEnding(None, int(figure), oom_kills, stopped)
