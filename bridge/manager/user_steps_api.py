"""The API of steps a user starts in a bridged job (srun --jobid N --overlap, the srun of an salloc or
of a bare srun's allocation): authenticate the user-step proxy, parse, delegate.

Each task of such a step is the waiter's user-step proxy on the slurmd host
(agent/internal/waiter/user_step.go), as the job's user: munge proves it (manager.auth: the
credential's uid must be the job's, made on a bridged slurmd's host, for this very request). It can
only ever run what that user could run in their own job's pods anyway. controller.user_steps finds
(or, for an allocation, asks for) the pod; controller.tasks runs the task there and passes on its
signals.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import signal
from typing import TYPE_CHECKING, Any

import structlog
from aiohttp import web

from bridge.controller.user_steps import PROCID, UserStepRefused, UserSteps, task_key
from bridge.core import agent_protocol, step_request
from bridge.core.errors import BridgeError
from bridge.core.job_environment import job_environment
from bridge.core.waiter_protocol import FORWARDED, MAX_OUTPUT_FRAME, sign_output_frame
from bridge.manager.bodies import UserTaskBody, UserTaskSignalBody, parse
from bridge.manager.task_answers import TaskStream, pass_signal

if TYPE_CHECKING:
    from bridge.manager.api import Api

log = structlog.get_logger(__name__)

PASSED_ON = frozenset(int(s) for s in (*FORWARDED, signal.SIGTERM, signal.SIGINT))
"""The signals a task proxy passes on (those slurmstepd sends a step's tasks)."""
MAX_TASK_REQUEST_BYTES = 256 * 1024
"""argv and environment of one task: they travel in the exec's command line."""
HEADER_TIMEOUT_S = 30.0
TERMINAL_QUEUE = 64
"""Frames typed ahead of a slow pod: the proxy's writes wait beyond it (TCP), not our memory."""
INPUT_KIND, RESIZE_KIND = 0, 3
"""The proxy's frame kinds (agent/internal/waiter/terminal.go)."""
INPUT_CHANNEL, RESIZE_CHANNEL = 0, 4
"""The exec protocol's stdin and resize channels."""
MAX_WINDOW = 0xFFFF
"""A terminal's rows and columns are 16-bit (struct winsize)."""


class UserStepsApi:
    def __init__(self, api: Api) -> None:
        self._api = api
        self._auth = api.auth
        self._tasks = api.tasks

    @property
    def _steps(self) -> UserSteps:
        return self._api.reconciler.user_steps

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/jobs/{job_id:\\d+}/user-task", self.user_task),
            web.post("/v1/jobs/{job_id:\\d+}/user-task-tty", self.user_task_tty),
            web.post("/v1/jobs/{job_id:\\d+}/user-task-signal", self.user_task_signal),
        ]

    async def user_task(self, request: web.Request) -> web.StreamResponse:
        """Run one task of a user's step in the job's pod on its node; stream its output, then
        its exit code (the last line)."""
        job_id = int(request.match_info["job_id"])
        raw = await request.read()
        await self._auth.identify(request, job_id, raw)
        return await self._run(request, job_id, _task_body(raw), None, None)

    async def user_task_tty(self, request: web.Request) -> web.StreamResponse:
        """The same for a task with a terminal (srun --pty): the first line of the body is the
        task, then come signed frames of what is typed and of window sizes (agent/internal/
        waiter/terminal.go), under the key the munge credential of the request carries."""
        job_id = int(request.match_info["job_id"])
        try:
            header = await asyncio.wait_for(request.content.readline(), timeout=HEADER_TIMEOUT_S)
        except (ValueError, TimeoutError):
            raise web.HTTPBadRequest(text="user-task-tty needs a first line naming the task") from None
        _, stream_key = await self._auth.authorise(request, job_id, header, keyed=True)
        body = _task_body(header)
        terminal: asyncio.Queue[tuple[int, bytes]] = asyncio.Queue(maxsize=TERMINAL_QUEUE)
        if body.rows > 0 and body.cols > 0:
            terminal.put_nowait((RESIZE_CHANNEL, _resize(body.rows, body.cols)))
        return await self._run(request, job_id, body, terminal, stream_key)

    async def _run(
        self, request: web.Request, job_id: int, body: UserTaskBody,
        terminal: asyncio.Queue[tuple[int, bytes]] | None, stream_key: bytes | None,
    ) -> web.StreamResponse:
        procid = body.env.get("SLURM_PROCID", "0")
        if not body.argv or not PROCID.fullmatch(procid) or not body.cwd.startswith("/"):
            raise web.HTTPBadRequest(text="user-task needs a command, SLURM_PROCID and an absolute cwd")
        bound = log.bind(job_id=job_id, step=body.step, procid=procid)
        try:
            key = task_key(body.step)
            pod, run = await self._steps.pod_for(job_id, body.node, body.env, body.cwd)
        except UserStepRefused as error:
            bound.info("user_task.refused", reason=str(error))
            raise web.HTTPConflict(text=f"slurm-k8s-bridge: {error}") from None
        pidfile = agent_protocol.task_pidfile(key, procid)
        spooled = self._api.reconciler.spools_tasks(job_id, pod)
        if body.resume is not None and not (spooled and terminal is None):
            raise web.HTTPConflict(text=f"slurm-k8s-bridge: the agent of pod {pod} cannot go on with it")
        if body.resume is not None:
            # A daemon before this one ran it: the rest of its output, spooled in the pod.
            argv = agent_protocol.task_follow_command(pidfile, (body.resume[0], body.resume[1]))
        else:
            environment = self._task_environment(job_id, body, terminal)
            argv = agent_protocol.task_command(pidfile, environment, body.argv)
        stream = await TaskStream.open(request)
        bound.info("user_task.started", pod=pod, tty=terminal is not None, resume=body.resume)
        typing = None
        if terminal is not None and stream_key is not None:
            await stream.response.write(b'{"accepted": true}\n')  # the proxy's terminal goes raw then
            typing = asyncio.ensure_future(_read_terminal(request, stream_key, terminal, bound))
        code = b"1"
        try:
            code = await self._tasks.run(
                (job_id, key, procid), pod, argv,
                stream.write, still_wanted=lambda: self._steps.live(job_id, run), terminal=terminal,
                spooled=spooled)
        except BridgeError as error:
            # A pod that failed to start is removed: its reason is what the user needs.
            why = self._steps.why_not(job_id, run)
            text = (f"job {job_id} cannot run steps: {why}" if why
                    else f"cannot run the task in pod {pod}: {error}")
            await stream.write(2, f"slurm-k8s-bridge: {text}\n".encode())
        finally:
            if typing is not None:
                typing.cancel()
        bound.info("user_task.ended", pod=pod, exit_code=int(code))
        return await stream.finish(int(code))

    def _task_environment(
        self, job_id: int, body: UserTaskBody, terminal: asyncio.Queue[tuple[int, bytes]] | None,
    ) -> str:
        """The task's environment for `agent task`, encoded: the user's variables as a batch job's
        pods get them (no host PATH, LD_*, ...), then the SLURM_* slurmstepd set for this task."""
        env = {**job_environment(body.env), **{k: v for k, v in body.env.items() if k.startswith("SLURM")},
               step_request.TASK_CWD: body.cwd}
        step_request.set_task_gpus(
            env, body.env.get("SLURM_STEP_GPUS"), self._api.reconciler.node_gpus(job_id, body.node))
        env.pop(step_request.TASK_TTY_SIZE, None)
        if terminal is not None and 0 < body.rows <= MAX_WINDOW and 0 < body.cols <= MAX_WINDOW:
            env[step_request.TASK_TTY_SIZE] = f"{body.rows} {body.cols}"
        return base64.b64encode(json.dumps(env).encode()).decode()

    async def user_task_signal(self, request: web.Request) -> web.Response:
        """A user step's task proxy got a signal (Ctrl-C at srun, scancel -s, a step cancel): pass
        it to its task in the pod, or keep it for the task's start."""
        job_id = int(request.match_info["job_id"])
        raw = await request.read()
        uid = await self._auth.identify(request, job_id, raw)
        try:
            body = parse(UserTaskSignalBody, raw)
            key = task_key(body.step)
        except (ValueError, UserStepRefused):
            raise web.HTTPBadRequest(text="user-task-signal needs step, procid, node and signal") from None
        signum = body.signal
        if signum not in PASSED_ON:
            raise web.HTTPBadRequest(text=f"signal {signum} is not passed on")
        if not PROCID.fullmatch(body.procid):
            raise web.HTTPBadRequest(text="user-task-signal needs the SLURM_PROCID of a task")
        return await pass_signal(self._tasks, (job_id, key, body.procid), signum, uid)


def _task_body(raw: bytes) -> UserTaskBody:
    if len(raw) > MAX_TASK_REQUEST_BYTES:
        raise web.HTTPRequestEntityTooLarge(
            max_size=MAX_TASK_REQUEST_BYTES, actual_size=len(raw),
            text=f"the task's command line and environment exceed {MAX_TASK_REQUEST_BYTES} bytes")
    try:
        return parse(UserTaskBody, raw)
    except ValueError:
        raise web.HTTPBadRequest(text="user-task needs step, node, argv, cwd and env") from None


def _resize(rows: int, cols: int) -> bytes:
    """The exec protocol's resize message (channel 4)."""
    return json.dumps({"Width": max(1, min(cols, 65535)), "Height": max(1, min(rows, 65535))}).encode()


async def _read_terminal(
    request: web.Request, stream_key: bytes, terminal: asyncio.Queue[tuple[int, bytes]], bound: Any,
) -> None:
    """Check each frame the proxy sends and queue it for the task's terminal: what is typed
    (channel 0) and window sizes (channel 4). A frame that is not the proxy's ends the input."""
    seq = 0
    try:
        while True:
            head = await request.content.readexactly(5)
            kind, size = head[0], int.from_bytes(head[1:], "big")
            if kind not in (INPUT_KIND, RESIZE_KIND) or size > MAX_OUTPUT_FRAME:
                bound.warning("user_task.bad_terminal_frame", kind=kind, size=size)
                return
            body = await request.content.readexactly(size + 32)
            data, mac = body[:size], body[size:]
            if not hmac.compare_digest(sign_output_frame(stream_key, seq, kind, data)[-32:], mac):
                bound.warning("user_task.terminal_frame_not_signed", seq=seq)
                return
            seq += 1
            if kind == RESIZE_KIND:
                try:
                    size_of = json.loads(data)
                    await terminal.put((RESIZE_CHANNEL, _resize(int(size_of["rows"]), int(size_of["cols"]))))
                except (ValueError, KeyError, TypeError):
                    return
            elif data:
                await terminal.put((INPUT_CHANNEL, data))
            else:
                return  # the user's terminal went away: its end of input (a hang-up follows)
    except (asyncio.IncompleteReadError, ConnectionResetError):
        return
