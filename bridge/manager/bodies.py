"""The JSON bodies the waiter sends to the API, as strict pydantic models.

Strict (no coercion: a number where text is meant is refused) and closed (a field no waiter ever
sent is refused): every waiter, old or new, sends a subset of these fields, as
agent/internal/waiter/attach.go does. The API answers each refusal with its own 400 message, as
before. Used by manager.api only.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError


class BadBody(ValueError):
    """A body that is not JSON, or not the shape its endpoint takes."""


def _as_int_text(value: object) -> object:
    """A step key or task id as the daemon keys it: the decimal text of the integer ("007" is 7).
    Anything but an integer or its text is left for the strict str check to refuse."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, str):
        return str(int(value))  # ValueError: refused
    return value


Decimal = Annotated[str, BeforeValidator(_as_int_text)]
"""An integer, sent as a number or as its decimal text; kept as canonical text."""


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


StreamOffset = Annotated[int, Field(ge=0, le=2**62)]
Resume = Annotated[list[StreamOffset], Field(min_length=2, max_length=2)]
"""How much of a task's stdout and stderr its proxy has: it lost the stream (the daemon that
streamed it went away) and asks for the rest of a task that runs on in its pod."""


class AttachBody(_Body):
    """POST /v1/jobs/{id}/attach. The payload's own fields are checked by core.model's
    payload_from_json (whose messages name them); `signals` by the API (it knows which signals
    a waiter forwards)."""

    script: Any = None
    environment: Any = None
    work_dir: Any = None
    uid: Any = None
    gid: Any = None
    output_merged: Any = None
    arguments: Any = None
    last_log: dict[str, str] | None = None
    """Timestamp of the last log line printed, by pod index."""
    cancel: bool = False
    signals: Any = None
    """[[seq, signal], ...]: the signals the waiter keeps (absent from waiters older than them)."""


class SignalBody(_Body):
    """POST /v1/jobs/{id}/signal: a signal for the batch script, and the waiter's sequence number
    for it (absent from waiters older than sequence numbers)."""

    signal: int
    seq: int | None = None


class CancelBody(_Body):
    """POST /v1/jobs/{id}/cancel: slurmstepd sent the batch step SIGTERM; `run` is the waiter's
    (SLURM_RESTART_COUNT; absent from waiters older than it)."""

    run: int | None = None
    forwards: bool = False
    """The waiter passes a TERM that is only a signal on through /signal itself (the answer's
    `forward`); absent from older waiters, whose TERM the daemon takes with the cancel."""


class StepDoneBody(_Body):
    """POST /v1/jobs/{id}/step-done: Slurm's srun of a step ended with `code`."""

    key: Decimal
    code: int
    run: int | None = None
    """The waiter's run (SLURM_RESTART_COUNT): whose pod to tell when this daemon never saw the
    step (started again since it began); absent from older waiters."""


class TaskBody(_Body):
    """POST /v1/jobs/{id}/task: run one task of step `key` in the pod of Slurm node `node`."""

    key: str
    node: str
    env: dict[str, str] | None = None
    """The task's SLURM* variables (others are dropped)."""
    stdin: str | None = None
    """The task's stdin, base64, when slurmstepd gave it a file (srun --input=FILE)."""
    resume: Resume | None = None


class TaskSignalBody(_Body):
    """POST /v1/jobs/{id}/task-signal: pass `signal` to task `procid` of step `key`."""

    key: Decimal
    procid: Decimal
    node: str
    signal: int


class UserTaskBody(_Body):
    """POST /v1/jobs/{id}/user-task: run one task of a step the user started (srun --jobid,
    salloc's srun) in the pod of Slurm node `node`: its argv, directory and environment."""

    step: Decimal
    node: str
    argv: list[str]
    cwd: str
    env: dict[str, str]
    tty: bool = False
    rows: int = 0
    cols: int = 0
    """The terminal's window size (`tty`: the user-task-tty endpoint)."""
    resume: Resume | None = None


class UserTaskSignalBody(_Body):
    """POST /v1/jobs/{id}/user-task-signal: pass `signal` to task `procid` of user step `step`."""

    step: Decimal
    procid: Decimal
    node: str
    signal: int


class StepOutputHeader(_Body):
    """The first line of POST /v1/jobs/{id}/step-output: the step whose output follows."""

    key: Decimal
    resumable: bool = False
    """The waiter keeps each frame until the script's srun wrote it, and takes notes of that
    ({"from": N} as the stream opens, {"delivered": N}) before the last word."""
    run: int | None = None
    """The waiter's run: a stream that goes on after a daemon went away names its step's run, which
    this daemon may not have heard of."""


B = TypeVar("B", bound=_Body)


def parse(model: type[B], raw: bytes) -> B:
    """`raw` as `model`; BadBody says what is wrong.

    Decoded by json, then validated: the waiter sends the bytes of a script, a path or a variable
    that are not UTF-8 as lone surrogates (surrogateescape, then json.dumps' \\udcXX), which
    json takes and pydantic's own JSON parser refuses; translate turns them into U+FFFD."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested too deep
        raise BadBody("not a JSON object") from None
    try:
        return model.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise BadBody(f"{where}: {first['msg']}" if where else first["msg"]) from None
