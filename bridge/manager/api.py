"""The daemon's HTTP API: health, metrics, and the waiters' calls (attach, cancel, batch signals,
and the srun steps' tasks, signals, output and ends).

It only authenticates (manager.auth), parses (manager.bodies) and delegates to the controller,
through the reconciler's narrow methods (controller.facade) and the subsystems that own the job
state: controller.tasks (tasks and their early signals) and controller.step_streams. It keeps no
job state of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import signal
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import structlog
from aiohttp import web

from bridge.controller.metrics import Metrics
from bridge.controller.reconcile import Reconciler
from bridge.controller.step_streams import AlreadyStreaming, Answer, Feed, relay_ended
from bridge.core.errors import BridgeError
from bridge.core.model import ModelError, payload_from_json
from bridge.core.waiter_protocol import FORWARDED, MAX_OUTPUT_FRAME, request_digest, sign_output_frame
from bridge.manager import auth
from bridge.manager.bodies import (
    AttachBody,
    CancelBody,
    SignalBody,
    StepDoneBody,
    StepOutputHeader,
    parse,
)
from bridge.manager.step_tasks_api import ScriptStepTasksApi
from bridge.manager.task_answers import StreamNotes
from bridge.manager.user_steps_api import UserStepsApi

log = structlog.get_logger(__name__)

HEARTBEAT_S = 10.0
"""Attach streams carry a heartbeat this often (the waiter's read timeout is 45 s)."""
HEARTBEAT = {"type": "heartbeat"}
FORWARDED_SIGNALS = frozenset(int(s) for s in FORWARDED)
"""What a waiter forwards to its script from the start (its TERM goes to /cancel first)."""
BATCH_SIGNALS = FORWARDED_SIGNALS | {int(signal.SIGTERM)}
"""What /signal and an attach take for the batch script: the forwarded signals, and a TERM the
daemon answered is only the script's signal (the waiter then numbers and keeps it as any other)."""
MAX_SIGNALS_PER_ATTACH = 64
"""A waiter keeps the signals the daemon has not taken; more than this many is not a waiter's."""
STREAM_HEADER_TIMEOUT_S = 30.0
FRAME_BODY_TIMEOUT_S = 60.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
NOT_ACTING = auth.NOT_ACTING


class Api:
    def __init__(
        self,
        reconciler: Reconciler,
        metrics: Metrics,
        enqueue: Callable[[int], None],
        ready: Callable[[], bool],
        unmunge_command: Sequence[str],
        synced: Callable[[], bool] | None = None,
    ) -> None:
        self.reconciler = reconciler
        self.metrics = metrics
        self.enqueue = enqueue
        self.ready = ready
        self.synced = synced or ready
        self.auth = auth.Authenticator(reconciler, reconciler.cfg.waiter.slurmd_hosts, unmunge_command,
                                       ready, request_digest)
        self.tasks = reconciler.tasks
        self.step_streams = reconciler.step_streams

    @web.middleware
    async def _turn_away_early(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Refuse what authentication would refuse anyway before the handler reads a body of up to
        8 MB: hundreds of requests queued for unmunge must not each hold one."""
        if request.path.startswith("/v1/"):
            self.auth.turn_away_early()
        return await handler(request)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=8 * 1024 * 1024, middlewares=[self._turn_away_early])
        app.add_routes([
            web.get("/healthz", self.healthz),
            web.get("/readyz", self.readyz),
            web.get("/metrics", self.metrics_text),
            web.post("/v1/jobs/{job_id:\\d+}/attach", self.attach),
            web.post("/v1/jobs/{job_id:\\d+}/cancel", self.cancel),
            web.post("/v1/jobs/{job_id:\\d+}/signal", self.signal),
            web.post("/v1/jobs/{job_id:\\d+}/step-done", self.step_done),
            web.post("/v1/jobs/{job_id:\\d+}/step-output", self.step_output),
            *ScriptStepTasksApi(self).routes(),
            *UserStepsApi(self).routes(),
        ])
        return app

    async def healthz(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(self, request: web.Request) -> web.Response:
        """200 when this replica acts. With ?role=any, 200 once its caches are synced, leader or
        standby: a Deployment's readiness (rollouts wait for every replica to be Ready; waiters
        find the leader by its pod label, not by readiness)."""
        if request.query.get("role") == "any":
            if self.synced():
                return web.Response(text="ready (synced)\n")
            return web.Response(status=503, text="not ready: caches syncing\n")
        if self.ready():
            return web.Response(text="ready\n")
        return web.Response(status=503, text="not ready: caches syncing or not the leader\n")

    async def metrics_text(self, _request: web.Request) -> web.Response:
        return web.Response(text=self.metrics.render(), content_type="text/plain", charset="utf-8")

    # -- waiters -------------------------------------------------------------------
    async def attach(self, request: web.Request) -> web.StreamResponse:
        job_id = int(request.match_info["job_id"])
        bound = log.bind(job_id=job_id)
        try:
            raw = await request.read()
            uid = await self.auth.identify(request, job_id, raw)
            body = parse(AttachBody, raw)
            payload = payload_from_json(body.model_dump(exclude={"last_log", "cancel", "signals"},
                                                        exclude_unset=True))
            signals = _attach_signals(body.signals)
        except web.HTTPException as error:
            self.metrics.inc("attach_rejected_total")
            bound.warning("attach.rejected", status=error.status, reason=error.text)
            raise
        except (ModelError, ValueError) as error:
            self.metrics.inc("attach_rejected_total")
            raise web.HTTPBadRequest(text=f"bad attach request: {error}") from None
        if payload.uid != uid:
            raise web.HTTPForbidden(text="payload uid differs from the caller's uid")
        self.metrics.inc("attach_requests_total")

        attached = self.reconciler.attach_waiter(
            job_id, payload, last_log=body.last_log or {}, cancel=body.cancel, signals=signals)
        if attached is None:
            # One waiter per run: a second attach (another host of the same user) must not take
            # over the stream (and the step tokens in it). A waiter whose stream broke retries
            # until this one's next heartbeat write fails and it is detached.
            raise web.HTTPServiceUnavailable(text=f"another waiter of job {job_id} is attached")
        session, queue = attached
        self.enqueue(job_id)
        bound.info("attach.accepted")

        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        try:
            while True:
                try:
                    event = await asyncio.wait_for(queue.get(), HEARTBEAT_S)
                except TimeoutError:
                    # Lets the waiter tell a quiet job from a half-open connection, and lets us
                    # find a waiter that went away (the write fails).
                    event = HEARTBEAT
                await response.write(json.dumps(event).encode() + b"\n")
                if event["type"] == "exit":
                    break
        finally:
            session.detach(queue)
        await response.write_eof()
        return response

    async def signal(self, request: web.Request) -> web.Response:
        """The waiter got a signal for the batch script (scancel -s SIG --batch, --signal=B:...):
        pass it on to the script in the job's pods."""
        job_id = int(request.match_info["job_id"])
        raw = await request.read()
        await self.auth.identify(request, job_id, raw)
        try:
            body = parse(SignalBody, raw)
            signum, seq = _batch_signal(body.signal, body.seq)
        except ValueError:
            raise web.HTTPBadRequest(text=f"signal must be one of {sorted(BATCH_SIGNALS)}, "
                                          "seq a positive integer") from None
        # The current run's session (identify just read the job).
        wake = self.reconciler.signal_batch_script(job_id, signum, seq)
        if wake is None:
            # The waiter keeps it and sends it with its attach, which opens the session.
            raise web.HTTPConflict(text=f"job {job_id}'s waiter has not attached yet")
        if wake:
            self.enqueue(job_id)
        log.info("signal.taken", job_id=job_id, signal=signum, seq=seq)
        return web.json_response({"taken": True})

    async def finish_background(self, timeout_s: float) -> int:
        """controller.tasks' background work (kills of tasks whose proxies went away) ends, or is
        cancelled after `timeout_s`; how many were cancelled."""
        return await self.tasks.finish_background(timeout_s)

    async def step_done(self, request: web.Request) -> web.Response:
        """The waiter's srun for a step ended: the script's srun gets its exit code."""
        job_id = int(request.match_info["job_id"])
        raw = await request.read()
        await self.auth.identify(request, job_id, raw)
        try:
            body = parse(StepDoneBody, raw)
        except ValueError:
            raise web.HTTPBadRequest(text="step-done needs key and code") from None
        try:
            await self.reconciler.finish_step(job_id, body.key, body.code, body.run)
        except BridgeError as error:
            raise web.HTTPServiceUnavailable(text=f"cannot tell the pod the step ended: {error}") from None
        return web.json_response({"step": body.key, "code": body.code})

    async def step_output(self, request: web.Request) -> web.StreamResponse:
        """Slurm's srun output for a step, streamed by the waiter as it comes (a first line naming
        the step, then signed frames, the last carrying srun's exit code): relayed into the first
        node's pod to the script's srun, which writes it where its own stdout and stderr go."""
        job_id = int(request.match_info["job_id"])
        try:
            header = await asyncio.wait_for(request.content.readline(), timeout=STREAM_HEADER_TIMEOUT_S)
        except (ValueError, TimeoutError):
            raise web.HTTPBadRequest(text="step-output needs a first line naming the step") from None
        _, stream_key = await self.auth.authorise(request, job_id, header, keyed=True)
        try:
            head = parse(StepOutputHeader, header)
        except ValueError:
            raise web.HTTPBadRequest(text="step-output needs the step's key") from None
        key = head.key
        run = self.reconciler.step_run(job_id, key)
        resumed = head.resumable and head.run is not None
        if run is None and resumed and head.run == self.reconciler.current_run(job_id):
            # A stream that goes on after the daemon before this one went away: the step is open
            # in the waiter and in the pod, though this daemon never heard of it.
            run = head.run
        if run is None:
            raise web.HTTPNotFound(text=f"job {job_id} has no open step {key}")
        try:
            with self.step_streams.claim(job_id, run, key):
                pod = self.reconciler.task_pod_of_index(job_id, 0, run)
                if pod is None:
                    raise web.HTTPServiceUnavailable(text=f"job {job_id} has no pod for its script")
                response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
                await response.prepare(request)
                await response.write(b'{"accepted": true}\n')
                notes = StreamNotes(response) if head.resumable else None
                try:
                    answer = await self.step_streams.relay(job_id, run, key, pod, lambda feed, relay: (
                        self._relay_frames(request, stream_key, feed, relay)), notes.take if notes else None)
                finally:
                    if notes is not None:
                        await notes.close()
        except AlreadyStreaming as error:
            # One stream per step: the pod's srun takes one relay, and each holds daemon memory.
            raise web.HTTPConflict(text=str(error)) from None
        log.info("step.output_relayed", job_id=job_id, pod=pod, step_key=key,
                 **{k: str(v) for k, v in answer.items()})
        with contextlib.suppress(ConnectionResetError):
            await response.write(json.dumps(answer).encode() + b"\n")
            await response.write_eof()
        return response

    async def _relay_frames(
        self, request: web.Request, stream_key: bytes, feed: Feed, relay: asyncio.Future[int],
    ) -> Answer:
        """Check each frame's signature and pass it on, until the end frame; or stop early when
        the relay into the pod ended (the script's srun is gone, the pod unreachable)."""
        seq = 0
        while True:
            # Waiting for srun's next output, the relay may end first: the script's srun is gone
            # (killed, `timeout 5 srun ...`), and the waiter must end the step now.
            next_head = asyncio.ensure_future(request.content.readexactly(5))
            await asyncio.wait(_either(next_head, relay), return_when=asyncio.FIRST_COMPLETED)
            if not next_head.done():
                next_head.cancel()
                return relay_ended(relay)
            head = next_head.result()
            fd, size = head[0], int.from_bytes(head[1:], "big")
            if fd > 2 or size > MAX_OUTPUT_FRAME:
                return {"failed": f"bad output frame (fd {fd}, {size} bytes)"}
            # The waiter sends a frame whole: a body that does not follow its head is a stalled
            # or hostile client, which must not hold the handler and its exec.
            body = await asyncio.wait_for(request.content.readexactly(size + 32), FRAME_BODY_TIMEOUT_S)
            data, mac = body[:size], body[size:]
            if not hmac.compare_digest(sign_output_frame(stream_key, seq, fd, data)[-32:], mac):
                return {"failed": "an output frame's signature does not match its stream"}
            seq += 1
            put = asyncio.ensure_future(feed.put(head + data))
            await asyncio.wait(_either(put, relay), return_when=asyncio.FIRST_COMPLETED)
            if not put.done():
                put.cancel()
            if relay.done():
                return relay_ended(relay)
            if fd == 0:
                return {"done": True}

    async def cancel(self, request: web.Request) -> web.Response:
        """The waiter got SIGTERM from slurmstepd: it stops the run, or is the script's signal
        (ApiFacade.term_from_slurm decides on the view identify has just read)."""
        job_id = int(request.match_info["job_id"])
        raw = await request.read()
        await self.auth.identify(request, job_id, raw)
        try:
            body = parse(CancelBody, raw or b"{}")
        except ValueError as error:
            raise web.HTTPBadRequest(text=str(error)) from None
        # A waiter that `forwards` a TERM that is only a signal sends it through /signal itself,
        # numbered and kept until delivered (a daemon restart does not lose it, a retried cancel
        # does not take it twice); an older waiter's is taken here.
        decision = self.reconciler.term_from_slurm(job_id, body.run, take_signal=not body.forwards)
        # Always: identify recorded the new state, and the poller's next listing may see no change.
        self.enqueue(job_id)
        log.info("cancel.requested", job_id=job_id, run=body.run, decision=decision)
        signal_only = decision == "signal"
        return web.json_response({"cancelling": job_id, "stops": not signal_only,
                                  "forward": signal_only and body.forwards})


def _either(first: asyncio.Future[Any], second: asyncio.Future[Any]) -> set[asyncio.Future[Any]]:
    """Two futures of different results, for asyncio.wait."""
    return {first, second}


def _batch_signal(signum: int, seq: int | None) -> tuple[int, int | None]:
    """A signal for the batch script and the waiter's sequence number for it (None from a waiter
    older than sequence numbers); ValueError when either is not one."""
    if not isinstance(signum, int) or isinstance(signum, bool) or signum not in BATCH_SIGNALS:
        raise ValueError(f"not a forwarded signal: {signum!r}")
    if seq is not None and (not isinstance(seq, int) or isinstance(seq, bool) or seq < 1):
        raise ValueError(f"not a sequence number: {seq!r}")
    return signum, seq


def _attach_signals(raw: object) -> list[tuple[int, int]]:
    """The attach's signals the daemon has not taken yet: [[seq, signal], ...], oldest first."""
    if raw is None:
        return []
    if not isinstance(raw, list) or len(raw) > MAX_SIGNALS_PER_ATTACH:
        raise ValueError(f"signals must be a list of at most {MAX_SIGNALS_PER_ATTACH} [seq, signal] pairs")
    taken: list[tuple[int, int]] = []
    for item in raw:
        if not isinstance(item, list) or len(item) != 2:
            raise ValueError("each signal must be a [seq, signal] pair")
        signum, seq = _batch_signal(item[1], item[0])
        if seq is None:
            raise ValueError("each kept signal needs its sequence number")
        taken.append((seq, signum))
    return sorted(taken)
