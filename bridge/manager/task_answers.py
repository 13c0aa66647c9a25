"""What the API answers a task proxy, for a script's step (api.py) and a user's step
(user_steps_api.py) alike: the task's output as NDJSON lines, then its exit code
(`TaskStream`), and a signal passed to the task in its pod or kept for its start (`pass_signal`);
and the notes a step-output stream gets of the script's srun (`StreamNotes`)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json

import structlog
from aiohttp import web

from bridge.controller.tasks import TaskId, Tasks
from bridge.core import agent_protocol
from bridge.core.errors import BridgeError, ExecOutcomeUnknown

log = structlog.get_logger(__name__)


class TaskStream:
    """The streamed answer to a task proxy: `{"fd", "data"}` lines of the task's output, then
    `{"exit": code}` as the last line."""

    def __init__(self, response: web.StreamResponse) -> None:
        self.response = response

    @classmethod
    async def open(cls, request: web.Request) -> TaskStream:
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        return cls(response)

    async def write(self, fd: int, data: bytes) -> None:
        line = {"fd": fd, "data": base64.b64encode(data).decode()}
        await self.response.write(json.dumps(line).encode() + b"\n")

    async def finish(self, code: int) -> web.StreamResponse:
        await self.response.write(json.dumps({"exit": int(code)}).encode() + b"\n")
        await self.response.write_eof()
        return self.response


async def pass_signal(tasks: Tasks, task_id: TaskId, signum: int, uid: int) -> web.Response:
    """Signal `signum` (from a proxy of job user `uid`) to task `task_id` in the pod it runs in;
    kept for the task's start while its proxy has not asked to run it yet (natively the task would
    exist and get it). The answer for the proxy."""
    job_id, key, procid = task_id
    name = f"{key}.{procid}"
    pod = tasks.running_in(task_id)
    if pod is None:
        if not tasks.keep_early_signal(task_id, signum, uid):
            raise web.HTTPServiceUnavailable(text="too many signals waiting for tasks to start")
        log.info("task.signal_kept", job_id=job_id, step_key=key, procid=procid, signal=signum)
        return web.json_response({"kept": name}, status=202)
    try:
        await tasks.signal(pod, agent_protocol.task_pidfile(key, procid), signum)
    except ExecOutcomeUnknown as error:
        # It may have been sent: the proxy must not ask again (a 503 would make it).
        log.warning("task.signal_unknown", job_id=job_id, pod=pod, signal=signum, error=str(error))
        return web.json_response({"unknown": name})
    except BridgeError as error:
        raise web.HTTPServiceUnavailable(text=f"cannot signal the task: {error}") from None
    return web.json_response({"signalled": name})


MAX_NOTE_LINE = 64
"""A line of the agent's step-output relay ("from N", "k N") is short; anything longer is not it."""


class StreamNotes:
    """What the agent's relay says of the script's srun (its stdout, `take`), passed to the waiter
    as chunks before the stream's last word: {"from": N}, the frames the script's srun wrote
    before this stream (the waiter sends the rest again), and {"delivered": N}, the latest count
    (the waiter lets those frames go). Counts that come faster than they go are merged."""

    def __init__(self, response: web.StreamResponse) -> None:
        self._response = response
        self._partial = b""
        self._from: int | None = None
        self._delivered = self._sent = 0
        self._wake = asyncio.Event()
        self._writer = asyncio.ensure_future(self._write())

    def take(self, data: bytes) -> None:
        *lines, self._partial = (self._partial + data).split(b"\n")
        if len(self._partial) > MAX_NOTE_LINE:
            self._partial = b""
        for line in lines:
            word, _, number = line.partition(b" ")
            if not (number.isdigit() and len(number) <= 19):
                continue
            if word == b"from":
                self._from = int(number)
            elif word == b"k":
                self._delivered = max(self._delivered, int(number))
        self._wake.set()

    async def _write(self) -> None:
        with contextlib.suppress(ConnectionResetError, RuntimeError):
            while True:
                await self._wake.wait()
                self._wake.clear()
                if self._from is not None:
                    note, self._from = {"from": self._from}, None
                    await self._response.write(json.dumps(note).encode() + b"\n")
                if self._delivered > self._sent:
                    self._sent = self._delivered
                    await self._response.write(json.dumps({"delivered": self._sent}).encode() + b"\n")

    async def close(self) -> None:
        """Before the last word: no note may follow it."""
        self._writer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._writer
