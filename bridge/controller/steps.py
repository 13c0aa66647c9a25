"""srun steps: the script's `srun` calls in the pod, from request to end.

The path: the agent in the first pod frames a step request ("s <base64>") into its log; the log
relay hands it here (`register`), which signs it (the SPANK guard on the slurmd host lets only
signed steps through) and passes the key and srun options on to the waiter. The waiter runs Slurm's
srun, whose task proxies ask the API to run each task in its pod (controller.tasks); srun's output
comes back through controller.step_streams, and its end through `finish`, which tells the script's
srun in the pod (`agent step-done`).

Owns the open step requests and the keys already signed, per run (StepBook, held by the run's
JobSession and written only here). Read by the API through the reconciler and by tasks/streams.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    retry_if_not_exception_type,
    stop_after_attempt,
    wait_exponential,
)

from bridge.clients.kube.actions import KubeActions
from bridge.controller.run_pods import RunPods
from bridge.core import agent_protocol
from bridge.core.config import ConfigError
from bridge.core.errors import BridgeError, PermanentError
from bridge.core.srun_options import parse_srun_args, refused_exit_code
from bridge.core.step_request import Volumes, host_io_options

if TYPE_CHECKING:
    from bridge.controller.sessions import JobSession, SessionRegistry

STEP_DONE_TRIES = 4
"""Tries to tell the script's srun that a step the daemon refused has ended (after 1, 2, 4 s)."""
MAX_OPEN_STEPS = 64
"""Step requests a run may have open at once (each srun in the script is one until it ends)."""
MAX_STEP_REQUEST_BYTES = 96 * 1024
"""A step's environment goes into one exec argument in the pod; Linux allows 128 KiB per argument."""
MAX_STEP_STDIN_BYTES = 512 * 1024
"""What the script's srun read of its stdin for Slurm's srun of its step (agent/steps.go
maxSrunStdin); it goes to the waiter, not into the pod's exec, and is not counted above."""
SIGNALS_FOR_SRUN = frozenset(int(s) for s in (
    signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
    signal.SIGALRM, signal.SIGCONT))
"""What the script's srun passes on to Slurm's srun of its step (native srun acts on these)."""

Step = dict[str, Any]
"""A step request: argv (srun's options and command), cwd, env."""


class StepBook:
    """One run's step requests, by key, until each ends; and every key ever signed in the run (a
    replayed request is never signed twice). Written only by Steps."""

    def __init__(self) -> None:
        self._open: dict[str, Step] = {}
        self._answered: set[str] = set()

    def get(self, key: str) -> Step | None:
        return self._open.get(key)

    def open_requests(self) -> dict[str, Step]:
        """A copy of the open requests, by key."""
        return dict(self._open)

    def answered(self) -> set[str]:
        """The keys answered once (signed or refused), a copy."""
        return set(self._answered)

    def __contains__(self, key: object) -> bool:
        return key in self._open

    def was_answered(self, key: str) -> bool:
        return key in self._answered

    def answer(self, key: str, step: Step | None) -> None:
        """Mark `key` answered; `step`: it was signed and is open until it ends."""
        self._answered.add(key)
        if step is not None:
            self._open[key] = step

    def end(self, key: str) -> None:
        self._open.pop(key, None)

    def commands_open(self) -> bool:
        """One of Slurm's commands in the script awaits its answer (booked by open_command)."""
        return any("command" in step for step in self._open.values())

    def __len__(self) -> int:
        return len(self._open)


class Steps:
    def __init__(
        self, kube: KubeActions, pods: RunPods, sessions: SessionRegistry, step_key: bytes | None,
        spawn: Callable[[Awaitable[None]], None], volumes_of: Callable[[int], Volumes] = lambda _job: (),
    ) -> None:
        self._kube = kube
        self._volumes_of = volumes_of
        """The job's partition's volumes (mount_path, host_path): where per-step files land."""
        self._pods = pods
        self._sessions = sessions
        self._step_key = step_key
        """Signs the steps of the scripts' srun (None: srun unavailable). Never logged."""
        self._spawn = spawn

    def register(self, session: JobSession, event: dict[str, Any], bound: Any) -> None:
        """Keep a step request of the script's srun for the task proxies; the waiter gets only its
        key and srun options (the event still carries the whole request, encoded)."""
        book = session.steps
        try:
            request = json.loads(base64.b64decode(event["data"]))
            key = str(int(request["key"]))
            argv = [str(a) for a in request["argv"]]
            env = {str(k): str(v) for k, v in (request.get("env") or {}).items()}
            stdin = request.get("stdin") or ""  # base64, as Go encodes []byte
            if not isinstance(stdin, str):
                raise TypeError("stdin is not base64 text")
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            bound.warning("step.bad_request", error=repr(error))
            event.clear()
            event.update(type="heartbeat")  # nothing the waiter should act on
            return
        if book.was_answered(key):
            # Seen before (a relay replaying after a re-attach): never signed twice.
            event.update(type="heartbeat")
            return
        refusal = None
        if self._step_key is None:
            refusal = ("job steps are not enabled for jobs that run in Kubernetes on this cluster (the "
                       "bridge has no [waiter] step_key_file)")
        elif len(book) >= MAX_OPEN_STEPS:
            refusal = f"more than {MAX_OPEN_STEPS} job steps at once"
        elif len(stdin) // 4 * 3 - stdin[-2:].count("=") > MAX_STEP_STDIN_BYTES:
            refusal = f"the step's stdin exceeds {MAX_STEP_STDIN_BYTES // 1024} KiB"
        elif len(event["data"]) - base64_size(len(stdin)) > MAX_STEP_REQUEST_BYTES:
            refusal = f"the step's environment and arguments exceed {MAX_STEP_REQUEST_BYTES // 1024} KiB"
        if refusal is not None:
            book.answer(key, None)  # answered once: a replay is not answered again
            bound.warning("step.refused", key=key, reason=refusal)
            event.clear()
            event.update(type="message", text=f"srun: error: {refusal}")
            self._spawn(self._finish_refused(session.job_id, session.run, key, bound))
            return
        try:
            args = parse_srun_args(argv)
            io = host_io_options(args, str(request.get("cwd") or "/"), self._volumes_of(session.job_id),
                                 env.get("SLURM_JOB_NAME"))
        except ValueError as error:
            # An option the bridge cannot honour: the script's srun says why on its own stderr
            # and ends with 255, as srun does natively with an option it cannot take.
            book.answer(key, None)
            bound.warning("step.refused", key=key, reason=str(error))
            event.clear()
            event.update(type="heartbeat")
            self._spawn(self._finish_refused(session.job_id, session.run, key, bound, str(error),
                                             refused_exit_code(error)))
            return
        book.answer(key, {"argv": argv, "cwd": str(request.get("cwd") or ""), "env": env})
        # The waiter passes it to its srun; the SPANK guard lets only steps with it through.
        assert self._step_key is not None
        event["token"] = step_token(self._step_key, session.job_id, session.run, key)
        event["io"] = io
        bound.info("step.requested", key=key, io=io)

    def answered(self, session: JobSession, key: str) -> bool:
        """Key `key` of the run was answered once already (a step, or a Slurm command)."""
        return session.steps.was_answered(key)

    def open_count(self, session: JobSession) -> int:
        return len(session.steps)

    def open_command(self, session: JobSession, key: str, command: str, cwd: str) -> None:
        """Book one of Slurm's commands (controller.commands) under its key: its output and end
        come back as a step's do. It carries no argv, so no task can ever run under its key."""
        session.steps.answer(key, {"argv": [], "cwd": cwd, "env": {}, "command": command})

    async def _finish_refused(
        self, job_id: int, run: int, key: str, bound: Any, reason: str = "", code: int = 1,
    ) -> None:
        """Tell the script's srun that its refused step ended (`code`), with `reason` on its stderr,
        trying a few times: else it waits for ever. Nobody awaits this, so its failure is logged here."""
        pod = self._pods.of_index(job_id, 0, run) if reason else None
        if pod is not None:
            frames = _output_frame(2, f"{reason}\n".encode()) + _output_frame(0, str(code).encode())
            try:
                command = agent_protocol.step_output_command(key)
                if await self._kube.exec_with_input(pod.name, command, frames) == 0:
                    self.close(job_id, key)
                    return
            except BridgeError as error:
                bound.info("step.refusal_not_relayed", key=key, error=str(error))
        try:
            # The agent's step-done is idempotent: again is safe.
            async for attempt in AsyncRetrying(
                stop=stop_after_attempt(STEP_DONE_TRIES), wait=wait_exponential(multiplier=1, min=1),
                retry=retry_if_exception_type(BridgeError) & retry_if_not_exception_type(PermanentError),
                sleep=_sleep, reraise=True,
            ):
                with attempt:
                    await self.finish(job_id, key, code)
        except BridgeError as error:
            bound.warning("step.done_not_told", key=key, error=str(error))

    def open_run(self, job_id: int, key: str) -> int | None:
        """The run whose step `key` is open (the newest: keys start again at 1 in each run). A
        step's output and end go to its own run's pod, also once a requeue made the next run the
        current one: an in-pod `scontrol requeue` is answered while its run stops, as natively."""
        session = self._newest_open(job_id, key)
        return None if session is None else session.run

    def answered_run(self, job_id: int, key: str) -> int | None:
        """The newest run that answered key `key`, whether its step is open or has ended."""
        for session in reversed(self._sessions.of_job(job_id)):
            if session.steps.was_answered(key):
                return session.run
        return None

    def of_any_run(self, job_id: int, key: str) -> Step | None:
        """Step `key` of the newest run that has it open."""
        session = self._newest_open(job_id, key)
        return None if session is None else session.steps.get(key)

    def _newest_open(self, job_id: int, key: str) -> JobSession | None:
        for session in reversed(self._sessions.of_job(job_id)):
            if key in session.steps:
                return session
        return None

    def close(self, job_id: int, key: str) -> None:
        """The step has ended: its key no longer runs tasks, nor takes output."""
        for session in reversed(self._sessions.of_job(job_id)):
            session.steps.end(key)

    async def finish(self, job_id: int, key: str, code: int, waiter_run: int | None = None) -> None:
        """Tell the script's srun how the step ended (Slurm's srun exit code), in the pod of the
        run that answered the key: also when told again (the last try failed), the step closed.
        A key no run here answered was answered before this daemon started (a restart while the
        step ran): the waiter's own run (`waiter_run`) names the pod, whose srun waits for it."""
        run = self.answered_run(job_id, key)
        if run is None:
            run = waiter_run
        self.close(job_id, key)
        pod = None if run is None else self._pods.of_index(job_id, 0, run)
        if pod is None:
            return
        await self._kube.exec_in_pod(pod.name, agent_protocol.step_done_command(key, code))


def check_step_signal(session: JobSession, event: dict[str, Any], bound: Any) -> None:
    """The script's srun got a signal: the waiter passes it to Slurm's srun of that step, if the
    step is open and the signal one srun acts on; anything else is dropped."""
    try:
        request = json.loads(base64.b64decode(event.pop("data")))
        key, signum = str(int(request["key"])), int(request["signal"])
    except (ValueError, KeyError, TypeError, AttributeError):
        key, signum = "", 0
    if key not in session.steps or signum not in SIGNALS_FOR_SRUN:
        bound.warning("step.bad_signal", key=key, signal=signum)
        event["type"] = "heartbeat"
        return
    event.update(key=key, signal=signum)
    bound.info("step.signal", key=key, signal=signum)


def _output_frame(fd: int, data: bytes) -> bytes:
    """One frame of `agent step-output`'s input: fd (0: the end, data = srun's exit code), length, data."""
    return bytes([fd]) + len(data).to_bytes(4, "big") + data


async def _sleep(seconds: float) -> None:
    # Looked up at call time: tests replace asyncio.sleep to go faster.
    await asyncio.sleep(seconds)


def step_token(key: bytes, job_id: int, run: int, step_key: str) -> str:
    """HMAC-SHA256 of "<job id>:<run>:<step key>" (the SPANK guard computes the same, with
    Slurm's restart count as the run): good for that one step of that one run."""
    return hmac.new(key, f"{job_id}:{run}:{step_key}".encode(), hashlib.sha256).hexdigest()


def read_step_key(path: Path | None) -> bytes | None:
    """The step key's bytes (trailing newline dropped), refusing a file others may read."""
    if path is None:
        return None
    try:
        info = path.stat()
        raw = path.read_bytes().rstrip(b"\r\n")
    except OSError as error:
        raise ConfigError(f"waiter.step_key_file: cannot read {path}: {error.strerror}") from None
    if info.st_mode & 0o077:
        raise ConfigError(f"waiter.step_key_file: {path} is readable by others (mode "
                          f"{info.st_mode & 0o777:o}); chmod 600 {path}")
    if not 16 <= len(raw) <= 256:
        # The SPANK guard reads at most 256 bytes of it.
        raise ConfigError(f"waiter.step_key_file: {path} must hold 16 to 256 bytes, not {len(raw)}")
    return raw


def base64_size(size: int) -> int:
    """The length of `size` bytes in base64."""
    return (size + 2) // 3 * 4
