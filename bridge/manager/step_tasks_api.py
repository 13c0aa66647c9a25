"""The tasks of the script's srun steps, as the API serves them: a task proxy (the waiter as
`task KEY`, started by Slurm's srun on the slurmd host) has its task run in the pod of its node
(POST /v1/jobs/N/task), or the rest of one a daemon before this one ran (`resume`: the pod's agent
spooled its output), and passes its signals on (POST /v1/jobs/N/task-signal). The state is
controller.tasks'; this module reads requests and answers them."""

from __future__ import annotations

import base64
import json
import re
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog
from aiohttp import web

from bridge.controller.tasks import TaskId
from bridge.core import agent_protocol, step_request
from bridge.core.errors import BridgeError
from bridge.core.srun_options import parse_srun_args
from bridge.core.waiter_protocol import FORWARDED
from bridge.manager.bodies import TaskBody, TaskSignalBody, parse
from bridge.manager.task_answers import TaskStream, pass_signal

if TYPE_CHECKING:
    from bridge.manager.api import Api

log = structlog.get_logger(__name__)

FORWARDED_SIGNALS = frozenset(int(s) for s in FORWARDED)


class ScriptStepTasksApi:
    def __init__(self, api: Api) -> None:
        self._auth = api.auth
        self._reconciler = api.reconciler
        self._tasks = api.tasks

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/jobs/{job_id:\\d+}/task", self.task),
            web.post("/v1/jobs/{job_id:\\d+}/task-signal", self.task_signal),
        ]

    async def task(self, request: web.Request) -> web.StreamResponse:
        """One task of a step the script's srun asked for: a task proxy, started by Slurm's srun
        as that task on the slurmd host, has the task run in the pod of its node and streams its
        output back; the last line carries the exit code."""
        job_id = int(request.match_info["job_id"])
        raw = await request.read()
        await self._auth.identify(request, job_id, raw)
        try:
            body = parse(TaskBody, raw)
        except ValueError:
            raise web.HTTPBadRequest(text="task request needs key, node and env") from None
        key = body.key
        task_env = {k: v for k, v in (body.env or {}).items() if k.startswith("SLURM") or k == "SRUN_DEBUG"}
        if body.resume is not None:
            return await self._follow_task(request, job_id, body.node, key, task_env, body.resume)
        step = self._reconciler.step_of(job_id, key)
        if step is None or step.get("command"):  # a Slurm command's key runs no task
            raise web.HTTPNotFound(text=f"job {job_id} has no open step {key}")
        pod = self._reconciler.task_pod(job_id, body.node)
        if pod is None:
            raise web.HTTPServiceUnavailable(text=f"job {job_id} has no pod on node {body.node} (yet)")
        try:
            args = parse_srun_args(step["argv"])
            stdin = base64.b64decode(body.stdin, validate=True) if body.stdin is not None else None
        except ValueError as error:
            raise web.HTTPBadRequest(text=str(error)) from None
        env = step_request.task_environment(args, step["env"], task_env)
        step_request.set_task_gpus(env, task_env.get("SLURM_STEP_GPUS"),
                                   self._reconciler.node_gpus(job_id, body.node))
        env[step_request.TASK_CWD] = step_request.task_cwd(args, step["cwd"])
        if args.multi_prog:
            env[step_request.TASK_MULTI_PROG] = "1"
        if step_request.stderr_to_stdout(args):
            env[step_request.TASK_STDERR_TO_STDOUT] = "1"
        if stdin is not None:
            env[step_request.TASK_STDIN_SIZE] = str(len(stdin))
        encoded = base64.b64encode(json.dumps(env).encode()).decode()
        procid = task_env.get("SLURM_PROCID", "0")
        if not re.fullmatch(r"[0-9]{1,9}", procid) or not re.fullmatch(r"[0-9]{1,19}", key):
            raise web.HTTPBadRequest(text="task request needs a numeric key and SLURM_PROCID")
        pidfile = agent_protocol.task_pidfile(key, procid)
        command = agent_protocol.task_command(pidfile, encoded, args.command)
        return await self._stream_task(request, (job_id, key, procid), pod, command, stdin)

    async def _follow_task(
        self, request: web.Request, job_id: int, node: str, key: str, task_env: dict[str, str],
        resume: list[int],
    ) -> web.StreamResponse:
        """The rest of a task a daemon before this one started: it runs on in its pod, its output
        spooled there, and its proxy has `resume` bytes of its stdout and stderr. Its step need
        not be known yet (the waiter tells this daemon of it again), only the task's pod."""
        procid = task_env.get("SLURM_PROCID", "0")
        if not re.fullmatch(r"[0-9]{1,9}", procid) or not re.fullmatch(r"[0-9]{1,19}", key):
            raise web.HTTPBadRequest(text="task request needs a numeric key and SLURM_PROCID")
        pod = self._reconciler.task_pod(job_id, node)
        if pod is None:
            raise web.HTTPServiceUnavailable(text=f"job {job_id} has no pod on node {node} (yet)")
        if not self._reconciler.spools_tasks(job_id, pod):
            raise web.HTTPConflict(text=f"the agent of pod {pod} cannot go on with an earlier daemon's task")
        follow = agent_protocol.task_follow_command(
            agent_protocol.task_pidfile(key, procid), (resume[0], resume[1]))
        log.info("task.followed", job_id=job_id, pod=pod, step_key=key, procid=procid, resume=resume)
        return await self._stream_task(request, (job_id, key, procid), pod, follow, None, lambda: True)

    async def _stream_task(
        self, request: web.Request, task_id: TaskId, pod: str, argv: list[str], stdin: bytes | None,
        still_wanted: Callable[[], bool] | None = None,
    ) -> web.StreamResponse:
        stream = await TaskStream.open(request)
        code = b"1"
        try:
            code = await self._tasks.run(task_id, pod, argv, stream.write, still_wanted, stdin=stdin,
                                        spooled=self._reconciler.spools_tasks(task_id[0], pod))
        except BridgeError as error:
            await stream.write(2, f"slurm-k8s-bridge: cannot run the task in pod {pod}: {error}\n".encode())
        return await stream.finish(int(code))

    async def task_signal(self, request: web.Request) -> web.Response:
        """A task proxy got a signal (scancel -s SIG for the steps, --signal=SIG@TIME, a step
        cancel): pass it to its task in the pod."""
        job_id = int(request.match_info["job_id"])
        raw = await request.read()
        uid = await self._auth.identify(request, job_id, raw)
        try:
            body = parse(TaskSignalBody, raw)
        except ValueError:
            raise web.HTTPBadRequest(text="task-signal needs key, procid, node and signal") from None
        key, procid, signum = body.key, body.procid, body.signal
        if signum not in FORWARDED_SIGNALS | {int(signal.SIGTERM), int(signal.SIGINT)}:
            raise web.HTTPBadRequest(text=f"signal {signum} is not passed on")
        if self._reconciler.step_of(job_id, key) is None:
            raise web.HTTPNotFound(text=f"job {job_id} has no open step {key}")
        if len(procid) > 9 or len(key) > 19:
            raise web.HTTPBadRequest(text="task-signal needs the step key and SLURM_PROCID of a task")
        if signum == signal.SIGTERM:
            await self._reconciler.commands_answered(job_id, key)
        return await pass_signal(self._tasks, (job_id, key, procid), signum, uid)

