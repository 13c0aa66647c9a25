"""Step output streams: Slurm's srun output for a step, relayed into the first node's pod to the
script's srun, which writes it where its own stdout and stderr go.

The path: the waiter runs Slurm's srun for the step and streams its output to the API (signed
frames, the last carrying srun's exit code); the API checks each frame and hands it to the relay
made here, `agent step-output KEY` in the batch pod, whose exit code says how it ended.

Owns the streams open now (one per step of a run: the pod's srun takes one relay, and each holds
daemon memory). Called by the API.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

import structlog

from bridge.clients.kube.actions import KubeActions
from bridge.controller.tasks import until_started
from bridge.core import agent_protocol

log = structlog.get_logger(__name__)

STEP_OUTPUT_FEED_FRAMES = 8
"""Frames (each at most the waiter's MAX_OUTPUT_FRAME) waiting for the pod, per step: a slow reader
there holds Slurm's srun, not the daemon's memory."""

StreamId = tuple[int, int, str]
"""(job id, run, step key)."""
Feed = asyncio.Queue[bytes | None]
Answer = dict[str, object]
FrameReader = Callable[[Feed, "asyncio.Future[int]"], Awaitable[Answer]]
"""Reads the waiter's frames into the feed until the end frame, or until the relay ends first."""


class OpenSteps(Protocol):
    def step_run(self, job_id: int, key: str) -> int | None: ...

    def close_step(self, job_id: int, key: str) -> None: ...


class AlreadyStreaming(Exception):
    """The step's output streams already."""


class StepStreams:
    def __init__(self, kube: KubeActions, steps: OpenSteps) -> None:
        self._kube = kube
        self._steps = steps
        self._open: set[StreamId] = set()

    @contextmanager
    def claim(self, job_id: int, run: int, key: str) -> Iterator[None]:
        """Hold the one stream of run `run`'s step `key`; AlreadyStreaming if it is held."""
        stream_id = (job_id, run, key)
        if stream_id in self._open:
            raise AlreadyStreaming(f"step {key} of job {job_id} already streams its output")
        self._open.add(stream_id)
        try:
            yield
        finally:
            self._open.discard(stream_id)

    def streaming(self) -> set[StreamId]:
        """The streams open now (a copy)."""
        return set(self._open)

    async def relay(
        self, job_id: int, run: int, key: str, pod: str, read_frames: FrameReader,
        notes: Callable[[bytes], None] | None = None,
    ) -> Answer:
        """{"done": true} once the script's srun took every frame and the end; {"gone": ...} when
        it is gone (the waiter then ends the step); {"failed": ...} when the relay broke (the
        waiter writes the rest to the job's files and reports the end by step-done). `notes` gets
        what the agent's relay says of the script's srun: "from N" (the frames it wrote before
        this stream) and "k N" (after each frame)."""
        feed: Feed = asyncio.Queue(maxsize=STEP_OUTPUT_FEED_FRAMES)
        relay = asyncio.ensure_future(self._feed(job_id, run, key, pod, feed, notes))
        try:
            answer = await read_frames(feed, relay)
            if answer.get("done"):
                # The end frame is in: the agent passes it on and exits; its exit tells whether
                # the script's srun took it. A slow reader in the pod takes its time, as natively.
                put = asyncio.ensure_future(feed.put(None))
                try:
                    # The relay's end decides: should it end without taking what is queued (the
                    # script's srun killed, the pod gone), the put never completes.
                    await asyncio.wait({relay})
                finally:
                    put.cancel()
                answer = relay_ended(relay)
                if answer.get("done"):
                    self._steps.close_step(job_id, key)
            return answer
        except (asyncio.IncompleteReadError, ConnectionResetError, TimeoutError):
            return {"failed": "the waiter went away"}
        finally:
            relay.cancel()

    async def _feed(
        self, job_id: int, run: int, key: str, pod: str, feed: Feed, notes: Callable[[bytes], None] | None,
    ) -> int:
        """`agent step-output KEY` in the batch pod, fed from `feed`; its exit code. An exec
        refused before it opened took nothing from the feed, so it is tried again (as a task's)."""
        command = agent_protocol.step_output_command(key)
        return await until_started(
            lambda: (self._kube.exec_feeding(pod, command, feed) if notes is None
                     else self._kube.exec_feeding(pod, command, feed, on_output=notes)),
            lambda: self._steps.step_run(job_id, key) == run,
            log.bind(job_id=job_id, pod=pod, step_key=key, what="step-output"))


def relay_ended(relay: asyncio.Future[int]) -> Answer:
    """How the agent's relay ended: 0, it passed the end on; EXIT_SRUN_GONE, the script's srun is
    gone (its connection closed); anything else (the exec broke, the pod went away) is a failed
    relay, which must not end a step that still runs."""
    if not relay.done() or relay.cancelled():
        return {"failed": "the relay into the pod did not end"}
    error = relay.exception()
    if error is not None:
        return {"failed": f"cannot relay into the pod: {error}"}
    code = relay.result()
    if code == 0:
        return {"done": True}
    if code == agent_protocol.EXIT_SRUN_GONE:
        return {"gone": "the script's srun is gone"}
    return {"failed": f"the relay into the pod ended with exit code {code}"}
