"""The daemon's HTTP API: health, metrics, and the waiters' attach/cancel calls."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import json
import random
import re
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import structlog
from aiohttp import web

from bridge.clients import munge
from bridge.controller.metrics import Metrics
from bridge.controller.reconcile import Reconciler
from bridge.controller.sessions import JobSession
from bridge.core import wellknown
from bridge.core.errors import (
    BridgeError,
    ExecCommandFailed,
    ExecNotStarted,
    ExecOutcomeUnknown,
    PermanentError,
    TemporaryError,
)
from bridge.core.model import ModelError, payload_from_json
from bridge.core.srun_options import split_srun_args
from bridge.core.waiter_protocol import FORWARDED, MAX_OUTPUT_FRAME, request_digest, sign_output_frame

log = structlog.get_logger(__name__)

MAX_CONCURRENT_VERIFY = 16
"""unmunge processes at most at once: more only add forks on a busy host (munged has few threads)."""
MAX_WAITING_VERIFY = 512
"""Requests that may wait for an unmunge slot; beyond, they answer 503 and are retried."""
VERIFY_WAIT_S = 10.0
"""How long a request waits for an unmunge slot before it answers 503 (and is retried)."""
HEARTBEAT_S = 10.0
"""Attach streams carry a heartbeat this often (the waiter's read timeout is 45 s)."""
HEARTBEAT = {"type": "heartbeat"}
FORWARDED_SIGNALS = frozenset(int(s) for s in FORWARDED)
AGENT = f"{wellknown.AGENT_DIR}/{wellknown.AGENT_BINARY}"
EARLY_SIGNALS_PER_TASK = 8
"""Signals kept for one task whose proxy is up but whose run in the pod has not begun."""
MAX_TASKS_WITH_EARLY_SIGNALS = 65536
"""About 200 bytes each: ~13 MB at most."""
EARLY_SIGNAL_TASKS_PER_JOB = 256
EARLY_SIGNAL_TASKS_PER_USER = 2048
EARLY_SIGNAL_TTL_S = 120.0
"""A task that never asks to run (its proxy died) has its kept signals dropped after this."""
TASK_SIGNAL_TRIES, TASK_SIGNAL_RETRY_S = 4, 0.5
"""A task's signal is tried this often, after 0.5, 1 and 2 s, when its exec failed to start."""
MAX_SIGNALS_PER_ATTACH = 64
"""A waiter keeps the signals the daemon has not taken; more than this many is not a waiter's."""

STEP_OUTPUT_FEED_FRAMES = 8
"""Frames (each at most MAX_OUTPUT_FRAME) waiting for the pod, per step: a slow reader there holds
Slurm's srun, not the daemon's memory."""
STREAM_HEADER_TIMEOUT_S = 30.0
FRAME_BODY_TIMEOUT_S = 60.0
AGENT_SRUN_GONE = 3
"""`agent step-output`'s exit when the script's srun closed its end (= agent/steps.go)."""
TASK_START_DEADLINE_S = 60.0
"""How long a task's exec may keep being refused before it opens (its pod's container may still
be starting when Slurm's srun already launched the step)."""
TASK_START_FIRST_RETRY_S = 0.25
TASK_START_MAX_RETRY_S = 4.0

T = TypeVar("T")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
NOT_ACTING = "this bridge replica is not acting (standby or syncing)"
TaskId = tuple[int, str, str]
"""(job id, step key, SLURM_PROCID)."""


async def _until_started(
    attempt: Callable[[], Awaitable[T]], still_wanted: Callable[[], bool], bound: Any,
) -> T:
    """`attempt()`, again after a backoff while it raises ExecNotStarted (its exec ran nothing),
    until TASK_START_DEADLINE_S or until it is no longer wanted (then the last error is raised)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + TASK_START_DEADLINE_S
    delay = TASK_START_FIRST_RETRY_S
    while True:
        try:
            return await attempt()
        except ExecNotStarted as error:
            if loop.time() + delay > deadline or not still_wanted():
                raise
            bound.info("exec.retried", error=str(error))
            # Jittered: the tasks of a burst refused together must not come back together.
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, TASK_START_MAX_RETRY_S)


def task_pidfile(key: str, procid: str) -> str:
    """Where `agent task` keeps a task's pid (key and procid are digits: checked by the callers)."""
    return f"{wellknown.AGENT_DIR}/tasks/{int(key)}-{int(procid)}.pid"
"""What a waiter may ask to pass on to its script: what it forwards itself (TERM and INT cancel)."""


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
        self.unmunge_command = tuple(unmunge_command)
        self._verifying = asyncio.Semaphore(MAX_CONCURRENT_VERIFY)
        self._verify_waiting = 0
        self._background: set[asyncio.Future[object]] = set()
        # Tasks whose run in the pod has begun, and signals that reached a task's proxy before
        # that (slurmctld signals a step as soon as it exists: --signal=SIG@T, scancel -s).
        self._running_tasks: set[TaskId] = set()
        self._early_signals: dict[TaskId, tuple[float, list[int]]] = {}
        self._early_signal_jobs: dict[int, int] = {}
        self._early_signal_users: dict[int, int] = {}
        self._early_signal_owner: dict[TaskId, int] = {}
        self._step_streams: set[tuple[int, int | None, str]] = set()

    @web.middleware
    async def _turn_away_early(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Refuse what _identify would refuse anyway before the handler reads a body of up to
        8 MB: hundreds of requests queued for unmunge must not each hold one."""
        if request.path.startswith("/v1/"):
            if not self.ready():
                raise web.HTTPServiceUnavailable(text=NOT_ACTING)
            if self._verifying.locked() and self._verify_waiting >= MAX_WAITING_VERIFY:
                raise web.HTTPServiceUnavailable(text="busy checking other credentials; retry")
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
            web.post("/v1/jobs/{job_id:\\d+}/task", self.task),
            web.post("/v1/jobs/{job_id:\\d+}/step-done", self.step_done),
            web.post("/v1/jobs/{job_id:\\d+}/step-output", self.step_output),
            web.post("/v1/jobs/{job_id:\\d+}/task-signal", self.task_signal),
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
    async def _identify(self, request: web.Request, job_id: int, body: bytes) -> int:
        uid, _ = await self._authorise(request, job_id, body, keyed=False)
        return uid

    async def _authorise(
        self, request: web.Request, job_id: int, body: bytes, *, keyed: bool
    ) -> tuple[int, bytes]:
        """The job's uid, once the caller proved with munge that it runs as that uid and that the
        credential was made for this very request (method, path, job id and body). A keyed
        credential also carries a key after the digest, for a streamed body whose frames the
        caller signs with it: only munged can read it out of the credential.

        Errors are classified once: what may pass (a standby, munged or Slurm restarting) is 503 and
        the waiter retries; 4xx only for what can never succeed."""
        if not self.ready():
            # A standby (or a replica still syncing) must not act; the waiter retries, and the
            # Service (selecting the leader's pod label, or routing on /readyz) finds the leader.
            raise web.HTTPServiceUnavailable(text=NOT_ACTING)
        credential = request.headers.get("X-Munge-Credential", "")
        if self._verifying.locked() and self._verify_waiting >= MAX_WAITING_VERIFY:
            # Each check runs unmunge: a flood of requests (anyone may send them) must neither
            # fork nor queue without bound. Waiters retry a 503 with backoff.
            raise web.HTTPServiceUnavailable(text="busy checking other credentials; retry")
        self._verify_waiting += 1
        try:
            async with asyncio.timeout(VERIFY_WAIT_S):
                await self._verifying.acquire()
        except TimeoutError:
            raise web.HTTPServiceUnavailable(text="busy checking other credentials; retry") from None
        finally:
            self._verify_waiting -= 1
        if not self.ready():
            # It lost the Lease while this request waited.
            self._verifying.release()
            raise web.HTTPServiceUnavailable(text=NOT_ACTING)
        try:
            who = await munge.verify(credential, self.unmunge_command)
        except munge.MungeUnavailable as error:
            raise web.HTTPServiceUnavailable(text=str(error)) from None
        except munge.MungeError as error:
            raise web.HTTPForbidden(text=str(error)) from None
        finally:
            self._verifying.release()
        hosts = self.reconciler.cfg.waiter.slurmd_hosts
        if hosts and who.encode_host not in hosts:
            raise web.HTTPForbidden(
                text=f"munge credential of uid {who.uid} was made on {who.encode_host or 'an unknown host'}, "
                "not on a host of the bridged slurmds ([waiter] slurmd_hosts)"
            )
        expected = request_digest(request.method, request.path, job_id, body)
        digest, _, stream_key = who.payload.strip().partition(b" ")
        if digest != expected.encode() or keyed != bool(stream_key) or (keyed and len(stream_key) != 64):
            raise web.HTTPForbidden(
                text=f"munge credential of uid {who.uid} was not made for this request ({request.method} "
                f"{request.path}): credentials are bound to one request and cannot be reused"
            )
        try:
            alloc = await self.reconciler.slurm.job(job_id)
        except BridgeError as error:
            # Down, or the daemon's own token refused: either way the operator's to fix, and the
            # job will run once it is (the waiter keeps retrying).
            kind = "unavailable" if isinstance(error, TemporaryError) else "refuses the bridge"
            raise web.HTTPServiceUnavailable(text=f"Slurm {kind}: {error}") from None
        if alloc is None:
            raise web.HTTPNotFound(text=f"Slurm does not know job {job_id}")
        if not self.reconciler.is_bridged(alloc):
            raise web.HTTPBadRequest(text=f"job {job_id} is in partition {alloc.partition}, not bridged")
        if alloc.uid != who.uid:
            raise web.HTTPForbidden(text=f"job {job_id} belongs to uid {alloc.uid}, not to uid {who.uid}")
        self.reconciler.jobs.record(alloc)
        return who.uid, bytes.fromhex(stream_key.decode()) if keyed else b""

    async def attach(self, request: web.Request) -> web.StreamResponse:
        job_id = int(request.match_info["job_id"])
        bound = log.bind(job_id=job_id)
        try:
            raw = await request.read()
            uid = await self._identify(request, job_id, raw)
            body = json.loads(raw)
            payload = payload_from_json(body)
            signals = _attach_signals(body.get("signals"))
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

        session = self.reconciler.attach_session(job_id, payload)
        if session.attached:
            # One waiter per run: a second attach (another host of the same user) must not take
            # over the stream (and the step tokens in it). A waiter whose stream broke retries
            # until this one's next heartbeat write fails and it is detached.
            raise web.HTTPServiceUnavailable(text=f"another waiter of job {job_id} is attached")
        session.payload = payload
        if body.get("cancel"):
            session.cancel_requested = True
        queue = session.attach({str(k): str(v) for k, v in (body.get("last_log") or {}).items()})
        for seq, signum in signals:
            self.reconciler.take_batch_signal(session, signum, seq, offered=True)
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
        await self._identify(request, job_id, raw)
        try:
            body = json.loads(raw)
            signum, seq = _batch_signal(body.get("signal"), body.get("seq"))
        except (ValueError, AttributeError):
            raise web.HTTPBadRequest(text=f"signal must be one of {sorted(FORWARDED_SIGNALS)}, "
                                          "seq a positive integer") from None
        # The current run's session (identify just read the job): after a requeue the old run's
        # may linger while its pods go, and must not take the new run's signals.
        session = self.reconciler.current_session(job_id)
        if session is None:
            # The waiter keeps it and sends it with its attach, which opens the session.
            raise web.HTTPConflict(text=f"job {job_id}'s waiter has not attached yet")
        self.reconciler.take_batch_signal(session, signum, seq)
        log.info("signal.taken", job_id=job_id, signal=signum, seq=seq)
        return web.json_response({"taken": True})

    async def task(self, request: web.Request) -> web.StreamResponse:
        """One task of a step the script's srun asked for: a task proxy, started by Slurm's srun
        as that task on the slurmd host, has the task run in the pod of its node and streams its
        output back; the last line carries the exit code."""
        job_id = int(request.match_info["job_id"])
        raw = await request.read()
        await self._identify(request, job_id, raw)
        try:
            body = json.loads(raw)
            key, node = str(body["key"]), str(body["node"])
            task_env = {str(k): str(v) for k, v in (body.get("env") or {}).items()
                        if str(k).startswith("SLURM")}
        except (ValueError, KeyError, TypeError, AttributeError):
            raise web.HTTPBadRequest(text="task request needs key, node and env") from None
        step = self.reconciler.step_of(job_id, key)
        if step is None:
            raise web.HTTPNotFound(text=f"job {job_id} has no open step {key}")
        pod = self.reconciler.task_pod(job_id, node)
        if pod is None:
            raise web.HTTPServiceUnavailable(text=f"job {job_id} has no pod on node {node} (yet)")
        try:
            _, command = split_srun_args(step["argv"])
        except ValueError as error:
            raise web.HTTPBadRequest(text=str(error)) from None
        env = {**step["env"], **task_env, "SLURM_K8S_BRIDGE_TASK_CWD": step["cwd"]}
        encoded = base64.b64encode(json.dumps(env).encode()).decode()
        procid = task_env.get("SLURM_PROCID", "0")
        if not re.fullmatch(r"[0-9]{1,9}", procid) or not re.fullmatch(r"[0-9]{1,19}", key):
            raise web.HTTPBadRequest(text="task request needs a numeric key and SLURM_PROCID")
        pidfile = task_pidfile(key, procid)
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        code = b"1"
        task_id = (job_id, key, procid)
        self._running_tasks.add(task_id)
        early = self._forget_early_signals(task_id)
        if early:
            # `agent signal ... group` waits for the task's pid file, so these may race its start.
            self._in_background(self._deliver_task_signals(pod, pidfile, early, job_id))
        try:
            code = await self._run_task(
                response, job_id, key, pod, [AGENT, "task", pidfile, encoded, "--", *command])
        except (asyncio.CancelledError, ConnectionResetError):
            # The proxy went away (srun killed the step, --kill-on-bad-exit): closing an exec
            # stream does not stop its process, so the task is killed in the pod.
            self._in_background(self._deliver_task_signals(pod, pidfile, [int(signal.SIGKILL)], job_id))
            raise
        except BridgeError as error:
            message = f"slurm-k8s-bridge: cannot run the task in pod {pod}: {error}\n".encode()
            line = {"fd": 2, "data": base64.b64encode(message).decode()}
            await response.write(json.dumps(line).encode() + b"\n")
        finally:
            self._running_tasks.discard(task_id)
        await response.write(json.dumps({"exit": int(code)}).encode() + b"\n")
        await response.write_eof()
        return response

    async def _run_task(
        self, response: web.StreamResponse, job_id: int, key: str, pod: str, argv: list[str],
    ) -> bytes:
        """Run one task in its pod and stream its output to the proxy; its exit code. An exec the
        kubelet refused before it opened (the pod's container still starting, a busy kubelet: an
        HTTP 500 under load) ran nothing, so it is tried again."""

        async def attempt() -> bytes:
            # Always this pod: the step belongs to its run (a requeue's pods are another run's).
            async for channel, data in self.reconciler.kube.exec_stream(pod, argv):
                if channel == 0:
                    return data
                line = {"fd": channel, "data": base64.b64encode(data).decode()}
                await response.write(json.dumps(line).encode() + b"\n")
            return b"1"

        return await _until_started(
            attempt, lambda: self.reconciler.step_of(job_id, key) is not None,
            log.bind(job_id=job_id, pod=pod, step_key=key, what="task"))

    async def task_signal(self, request: web.Request) -> web.Response:
        """A task proxy got a signal (scancel -s SIG for the steps, --signal=SIG@TIME, a step
        cancel): pass it to its task in the pod."""
        job_id = int(request.match_info["job_id"])
        raw = await request.read()
        uid = await self._identify(request, job_id, raw)
        try:
            body = json.loads(raw)
            key, procid, node = str(int(body["key"])), str(int(body["procid"])), str(body["node"])
            signum = int(body["signal"])
        except (ValueError, KeyError, TypeError, AttributeError):
            raise web.HTTPBadRequest(text="task-signal needs key, procid, node and signal") from None
        if signum not in FORWARDED_SIGNALS | {int(signal.SIGTERM), int(signal.SIGINT)}:
            raise web.HTTPBadRequest(text=f"signal {signum} is not passed on")
        if self.reconciler.step_of(job_id, key) is None:
            raise web.HTTPNotFound(text=f"job {job_id} has no open step {key}")
        task_id = (job_id, key, procid)
        if len(procid) > 9 or len(key) > 19:
            raise web.HTTPBadRequest(text="task-signal needs the step key and SLURM_PROCID of a task")
        if task_id not in self._running_tasks:
            # The proxy is up but has not yet asked to run its task (munge, the pod's exec):
            # natively the task would exist and get the signal, so it is kept for the task's start.
            if not self._keep_early_signal(task_id, signum, uid):
                raise web.HTTPServiceUnavailable(text="too many signals waiting for tasks to start")
            log.info("task.signal_kept", job_id=job_id, step_key=key, procid=procid, signal=signum)
            return web.json_response({"kept": f"{key}.{procid}"}, status=202)
        pod = self.reconciler.task_pod(job_id, node)
        if pod is None:
            raise web.HTTPNotFound(text=f"job {job_id} has no pod on node {node}")
        try:
            await self._signal_task(pod, task_pidfile(key, procid), signum)
        except ExecOutcomeUnknown as error:
            # It may have been sent: the proxy must not ask again (a 503 would make it).
            log.warning("task.signal_unknown", job_id=job_id, pod=pod, signal=signum, error=str(error))
            return web.json_response({"unknown": f"{key}.{procid}"})
        except BridgeError as error:
            raise web.HTTPServiceUnavailable(text=f"cannot signal the task: {error}") from None
        return web.json_response({"signalled": f"{key}.{procid}"})

    async def _signal_task(self, pod: str, pidfile: str, signum: int) -> None:
        """Signal a task's process group in its pod; an exec that failed before it could have run
        (a kubelet's 500 under load) is tried again a few times, one that timed out is not (the
        signal may have been sent)."""
        command = [AGENT, "signal", pidfile, str(signum), "group"]
        for attempt in range(TASK_SIGNAL_TRIES):
            try:
                await self.reconciler.kube.exec_in_pod(pod, command)
                return
            except ExecCommandFailed as error:
                if error.ran:
                    # The agent ran and said why: the task has ended (no such process, as a
                    # native kill of a task that just exited), or never wrote its pid. Again
                    # cannot help.
                    log.info("task.signal_not_delivered", pod=pod, signal=signum,
                             why=error.output.strip()[:200])
                    return
                if attempt == TASK_SIGNAL_TRIES - 1:  # the runtime could not start it: again
                    raise
            except (ExecOutcomeUnknown, PermanentError):
                raise
            except BridgeError:
                if attempt == TASK_SIGNAL_TRIES - 1:
                    raise
            await asyncio.sleep(TASK_SIGNAL_RETRY_S * 2 ** attempt)

    def _keep_early_signal(self, task_id: TaskId, signum: int, uid: int) -> bool:
        now = time.monotonic()
        if task_id not in self._early_signals:
            if len(self._early_signals) >= MAX_TASKS_WITH_EARLY_SIGNALS:
                stale = [t for t, (at, _) in self._early_signals.items() if now - at > EARLY_SIGNAL_TTL_S]
                for old in stale:
                    self._forget_early_signals(old)
            # Quotas per job and per user: one user's flood must not take everybody's place.
            if (len(self._early_signals) >= MAX_TASKS_WITH_EARLY_SIGNALS
                    or self._early_signal_jobs.get(task_id[0], 0) >= EARLY_SIGNAL_TASKS_PER_JOB
                    or self._early_signal_users.get(uid, 0) >= EARLY_SIGNAL_TASKS_PER_USER):
                return False
            self._early_signal_jobs[task_id[0]] = self._early_signal_jobs.get(task_id[0], 0) + 1
            self._early_signal_users[uid] = self._early_signal_users.get(uid, 0) + 1
            self._early_signal_owner[task_id] = uid
        _, kept = self._early_signals.setdefault(task_id, (now, []))
        if len(kept) < EARLY_SIGNALS_PER_TASK:
            kept.append(signum)
        return True

    def _forget_early_signals(self, task_id: TaskId) -> list[int]:
        _, kept = self._early_signals.pop(task_id, (0.0, []))
        if kept:
            _count_down(self._early_signal_jobs, task_id[0])
            _count_down(self._early_signal_users, self._early_signal_owner.pop(task_id, -1))
        return kept

    async def _deliver_task_signals(self, pod: str, pidfile: str, signals: list[int], job_id: int) -> None:
        for signum in signals:
            try:
                await self._signal_task(pod, pidfile, signum)
            except BridgeError as error:
                log.warning("task.signal_failed", job_id=job_id, pod=pod, signal=signum, error=str(error))

    def _in_background(self, work: Awaitable[object]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def finish_background(self, timeout_s: float) -> int:
        """Let the work handed off by requests end (above all the kills of the tasks whose
        proxies went away as the daemon stopped: else they run on in their pods); how many
        were still running after `timeout_s` (then cancelled)."""
        if not self._background:
            return 0
        _, pending = await asyncio.wait(set(self._background), timeout=timeout_s)
        for task in pending:
            task.cancel()
        return len(pending)

    async def step_done(self, request: web.Request) -> web.Response:
        """The waiter's srun for a step ended: the script's srun gets its exit code."""
        job_id = int(request.match_info["job_id"])
        raw = await request.read()
        await self._identify(request, job_id, raw)
        try:
            body = json.loads(raw)
            key, code = str(int(body["key"])), int(body["code"])
        except (ValueError, KeyError, TypeError, AttributeError):
            raise web.HTTPBadRequest(text="step-done needs key and code") from None
        try:
            await self.reconciler.finish_step(job_id, key, code)
        except BridgeError as error:
            raise web.HTTPServiceUnavailable(text=f"cannot tell the pod the step ended: {error}") from None
        return web.json_response({"step": key, "code": code})

    async def step_output(self, request: web.Request) -> web.StreamResponse:
        """Slurm's srun output for a step, streamed by the waiter as it comes (a first line naming
        the step, then signed frames, the last carrying srun's exit code): relayed into the first
        node's pod to the script's srun, which writes it where its own stdout and stderr go."""
        job_id = int(request.match_info["job_id"])
        try:
            header = await asyncio.wait_for(request.content.readline(), timeout=STREAM_HEADER_TIMEOUT_S)
        except (ValueError, TimeoutError):
            raise web.HTTPBadRequest(text="step-output needs a first line naming the step") from None
        _, stream_key = await self._authorise(request, job_id, header, keyed=True)
        try:
            key = str(int(json.loads(header)["key"]))
        except (ValueError, KeyError, TypeError):
            raise web.HTTPBadRequest(text="step-output needs the step's key") from None
        if self.reconciler.current_step(job_id, key) is None:
            raise web.HTTPNotFound(text=f"job {job_id} has no open step {key} in its current run")
        stream_id = (job_id, self.reconciler.current_run(job_id), key)
        if stream_id in self._step_streams:
            # One stream per step: the pod's srun takes one relay, and each holds daemon memory.
            raise web.HTTPConflict(text=f"step {key} of job {job_id} already streams its output")
        pod = self.reconciler.task_pod_of_index(job_id, 0)
        if pod is None:
            raise web.HTTPServiceUnavailable(text=f"job {job_id} has no pod for its script")
        bound = log.bind(job_id=job_id, pod=pod, step_key=key)
        self._step_streams.add(stream_id)
        try:
            response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
            await response.prepare(request)
            await response.write(b'{"accepted": true}\n')
            answer = await self._relay_step_output(request, job_id, key, pod, stream_key)
        finally:
            self._step_streams.discard(stream_id)
        bound.info("step.output_relayed", **{k: str(v) for k, v in answer.items()})
        with contextlib.suppress(ConnectionResetError):
            await response.write(json.dumps(answer).encode() + b"\n")
            await response.write_eof()
        return response

    async def _relay_step_output(
        self, request: web.Request, job_id: int, key: str, pod: str, stream_key: bytes
    ) -> dict[str, object]:
        """{"done": true} once the script's srun took every frame and the end; {"gone": ...} when
        it is gone (the waiter then ends the step); {"failed": ...} when the relay broke (the
        waiter writes the rest to the job's files and reports the end by step-done)."""
        feed: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=STEP_OUTPUT_FEED_FRAMES)
        relay = asyncio.ensure_future(self._feed_step_output(job_id, key, pod, feed))
        try:
            answer = await self._relay_frames(request, stream_key, feed, relay)
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
                answer = _relay_ended(relay)
                if answer.get("done"):
                    self.reconciler.close_step(job_id, key)
            return answer
        except (asyncio.IncompleteReadError, ConnectionResetError, TimeoutError):
            return {"failed": "the waiter went away"}
        finally:
            relay.cancel()

    async def _feed_step_output(
        self, job_id: int, key: str, pod: str, feed: asyncio.Queue[bytes | None]
    ) -> int:
        """`agent step-output KEY` in the batch pod, fed from `feed`; its exit code. An exec
        refused before it opened took nothing from the feed, so it is tried again (as a task's)."""
        return await _until_started(
            lambda: self.reconciler.kube.exec_feeding(pod, [AGENT, "step-output", key], feed),
            lambda: self.reconciler.current_step(job_id, key) is not None,
            log.bind(job_id=job_id, pod=pod, step_key=key, what="step-output"))

    async def _relay_frames(
        self, request: web.Request, stream_key: bytes, feed: asyncio.Queue[bytes | None],
        relay: asyncio.Future[int],
    ) -> dict[str, object]:
        """Check each frame's signature and pass it on, until the end frame; or stop early when
        the relay into the pod ended (the script's srun is gone, the pod unreachable)."""
        seq = 0
        while True:
            # Waiting for srun's next output, the relay may end first: the script's srun is gone
            # (killed, `timeout 5 srun ...`), and the waiter must end the step now.
            next_head = asyncio.ensure_future(request.content.readexactly(5))
            await asyncio.wait({next_head, relay}, return_when=asyncio.FIRST_COMPLETED)
            if not next_head.done():
                next_head.cancel()
                return _relay_ended(relay)
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
            await asyncio.wait({put, relay}, return_when=asyncio.FIRST_COMPLETED)
            if not put.done():
                put.cancel()
            if relay.done():
                return _relay_ended(relay)
            if fd == 0:
                return {"done": True}

    async def cancel(self, request: web.Request) -> web.Response:
        job_id = int(request.match_info["job_id"])
        await self._identify(request, job_id, await request.read())
        session = self.reconciler.cancel_session(job_id) or JobSession(job_id)
        session.cancel_requested = True
        self.enqueue(job_id)
        log.info("cancel.requested", job_id=job_id)
        return web.json_response({"cancelling": job_id})


def _relay_ended(relay: asyncio.Future[int]) -> dict[str, object]:
    """How the agent's relay ended: 0, it passed the end on; 3, the script's srun is gone (its
    connection closed); anything else (the exec broke, the pod went away) is a failed relay,
    which must not end a step that still runs."""
    if not relay.done() or relay.cancelled():
        return {"failed": "the relay into the pod did not end"}
    error = relay.exception()
    if error is not None:
        return {"failed": f"cannot relay into the pod: {error}"}
    code = relay.result()
    if code == 0:
        return {"done": True}
    if code == AGENT_SRUN_GONE:
        return {"gone": "the script's srun is gone"}
    return {"failed": f"the relay into the pod ended with exit code {code}"}


def _count_down(counts: dict[int, int], key: int) -> None:
    left = counts.get(key, 1) - 1
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)



def _batch_signal(signum: object, seq: object) -> tuple[int, int | None]:
    """A signal for the batch script and the waiter's sequence number for it (None from a waiter
    older than sequence numbers); ValueError when either is not one."""
    if not isinstance(signum, int) or isinstance(signum, bool) or signum not in FORWARDED_SIGNALS:
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
