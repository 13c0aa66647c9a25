"""The tasks of srun steps: each task of a step runs in the pod of its node, and its signals go there.

The path: Slurm's srun starts a task proxy (the waiter, as that task) on the slurmd host; the proxy
asks the API to run its task, and the API hands it here: `run` execs `agent task` in the pod and
streams its output back. A signal the proxy gets (scancel -s, --signal=SIG@TIME, a step cancel)
comes the same way to `signal`; one that comes before its task runs is kept for its start (natively
the task would exist and get it).

Owns the tasks running now, the signals kept for tasks not started yet (with quotas per job and
per user), and the work handed to the background (kills of tasks whose proxy went away), which the
daemon lets finish before it closes its clients. Called by the API.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import structlog
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
)

from bridge.clients.kube.actions import KubeActions
from bridge.controller.steps import Step
from bridge.core import agent_protocol
from bridge.core.errors import (
    BridgeError,
    ExecCommandFailed,
    ExecNotStarted,
    ExecOutcomeUnknown,
    PermanentError,
)
from bridge.core.waiter_protocol import USAGE_FD

log = structlog.get_logger(__name__)

T = TypeVar("T")
TaskId = tuple[int, str, str]
"""(job id, step key, SLURM_PROCID)."""

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
TASK_START_DEADLINE_S = 60.0
"""How long a task's exec may keep being refused before it opens (its pod's container may still
be starting when Slurm's srun already launched the step)."""
TASK_START_FIRST_RETRY_S = 0.25
TASK_START_MAX_RETRY_S = 4.0


async def until_started(
    attempt: Callable[[], Awaitable[T]], still_wanted: Callable[[], bool], bound: Any,
) -> T:
    """`attempt()`, again after a backoff while it raises ExecNotStarted (its exec ran nothing),
    until TASK_START_DEADLINE_S or until it is no longer wanted (then the last error is raised)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + TASK_START_DEADLINE_S

    def wait(state: RetryCallState) -> float:
        # Jittered: the tasks of a burst refused together must not come back together.
        return _start_delay(state.attempt_number) * random.uniform(0.5, 1.0)

    def stop(state: RetryCallState) -> bool:
        return loop.time() + _start_delay(state.attempt_number) > deadline or not still_wanted()

    def before_sleep(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        bound.info("exec.retried", error=str(error))

    async for trying in AsyncRetrying(retry=retry_if_exception_type(ExecNotStarted), wait=wait, stop=stop,
                                      before_sleep=before_sleep, sleep=_sleep, reraise=True):
        with trying:
            return await attempt()
    raise AssertionError("unreachable: the last attempt returns or raises")  # pragma: no cover


def _start_delay(attempt_number: int) -> float:
    """The wait after the n-th refused attempt, before jitter: 0.25 s, doubling, at most 4 s."""
    return min(TASK_START_FIRST_RETRY_S * 2 ** (attempt_number - 1), TASK_START_MAX_RETRY_S)


async def _sleep(seconds: float) -> None:
    # Looked up at call time: tests replace asyncio.sleep to go faster.
    await asyncio.sleep(seconds)


def _may_not_have_run(error: BaseException) -> bool:
    """A task signal's exec that is worth trying again: the runtime could not start it (an exec
    whose agent ran and said why, one that timed out, a permanent refusal are not)."""
    if isinstance(error, ExecCommandFailed):
        return not error.ran
    return isinstance(error, BridgeError) and not isinstance(error, ExecOutcomeUnknown | PermanentError)


class PassedOn:
    """What of a task's stdout and stderr the daemon passed on to its proxy, told to the task's
    agent on the exec's stdin ("a STDOUT STDERR\n", agent/task_spool.go): what it may drop from
    the task's spool. Only the latest count waits to be sent; the first ("a 0 0") says that this
    daemon acknowledges."""

    def __init__(self) -> None:
        self._counts = [0, 0]
        self.queue: asyncio.Queue[tuple[int, bytes]] = asyncio.Queue(maxsize=1)
        self.queue.put_nowait((0, b"a 0 0\n"))

    def passed(self, channel: int, size: int) -> None:
        if channel not in (1, 2):
            return
        self._counts[channel - 1] += size
        with contextlib.suppress(asyncio.QueueEmpty):
            self.queue.get_nowait()  # superseded
        self.queue.put_nowait((0, f"a {self._counts[0]} {self._counts[1]}\n".encode()))


class OpenSteps(Protocol):
    def step_of(self, job_id: int, key: str) -> Step | None: ...


class Tasks:
    def __init__(self, kube: KubeActions, steps: OpenSteps) -> None:
        self._kube = kube
        self._steps = steps
        # Tasks whose run in the pod has begun, with that pod, and signals that reached a task's
        # proxy before that (slurmctld signals a step as soon as it exists: --signal=SIG@T,
        # scancel -s).
        self._running: dict[TaskId, str] = {}
        self._early: dict[TaskId, tuple[float, list[int]]] = {}
        self._early_jobs: dict[int, int] = {}
        self._early_users: dict[int, int] = {}
        self._early_owner: dict[TaskId, int] = {}
        self._background: set[asyncio.Future[object]] = set()
        self._handing_over = False

    async def run(
        self, task_id: TaskId, pod: str, argv: list[str], write: Callable[[int, bytes], Awaitable[None]],
        still_wanted: Callable[[], bool] | None = None,
        terminal: asyncio.Queue[tuple[int, bytes]] | None = None,
        stdin: bytes | None = None, spooled: bool = False,
    ) -> bytes:
        """Run one task in its pod (`agent task`), passing its output to `write(fd, data)`; its
        exit code. An exec the kubelet refused before it opened (the pod's container still
        starting, a busy kubelet: an HTTP 500 under load) ran nothing, so it is tried again while
        `still_wanted()` (by default: while its script step is open). With `terminal`, the task
        gets a terminal fed from that queue (KubeActions.exec_stream). `stdin`: the task's stdin
        (srun --input=FILE), fed to the agent, which reads that much. `spooled`: the pod's agent
        spools the task's output (ANNOTATION_TASK_SPOOL): the exec's stdin then carries what this
        daemon passed on, and the task outlives a restart of it."""
        job_id, key, procid = task_id
        pidfile = agent_protocol.task_pidfile(key, procid)
        self._running[task_id] = pod
        early = self._forget_early_signals(task_id)
        if early:
            # `agent signal ... group` waits for the task's pid file, so these may race its start.
            self._in_background(self._deliver(pod, pidfile, early, job_id))

        async def attempt() -> bytes:
            # Always this pod: the step belongs to its run (a requeue's pods are another run's).
            acks = PassedOn() if spooled and terminal is None else None
            if terminal is not None:
                stream = self._kube.exec_stream(pod, argv, terminal=terminal)
            elif acks is not None:
                stream = self._kube.exec_stream(pod, argv, stdin=stdin, feed=acks.queue)
            else:  # an older agent gives the exec's stdin to the task itself
                stream = self._kube.exec_stream(pod, argv, stdin=stdin)
            # The agent ends the task's stderr with what the task used: the proxy's, not output.
            trailer = agent_protocol.UsageTrailer()
            code = b"1"  # the stream ended without the exec's status
            async for channel, data in stream:
                if channel == 0:
                    code = data
                    break
                if channel == 2 and terminal is None:
                    data, usage = trailer.feed(data)
                    for figures in usage:
                        await write(USAGE_FD, figures.encode())
                    if not data:
                        continue
                await write(channel, data)
                if acks is not None:
                    acks.passed(channel, len(data))
            if held := trailer.flush():
                await write(2, held)
            return code

        try:
            return await until_started(
                attempt, still_wanted or (lambda: self._steps.step_of(job_id, key) is not None),
                log.bind(job_id=job_id, pod=pod, step_key=key, what="task"))
        except (asyncio.CancelledError, ConnectionResetError):
            # The proxy went away (srun killed the step, --kill-on-bad-exit): closing an exec
            # stream does not stop its process, so the task is killed in the pod. Not when this
            # daemon stops: the task runs on, and its proxy asks the next daemon for the rest.
            if not (self._handing_over and spooled and terminal is None):  # else it runs on, spooled
                self._in_background(self._deliver(pod, pidfile, [int(signal.SIGKILL)], job_id))
            raise
        finally:
            if self._running.get(task_id) == pod:
                del self._running[task_id]

    def hand_over(self) -> None:
        """This daemon stops: the streams it ends leave their tasks running in their pods (each
        spools its output there), for their proxies to follow with the next daemon."""
        self._handing_over = True

    def running_in(self, task_id: TaskId) -> str | None:
        """The pod the task runs in, once its run there has begun: its signals go there, also
        when its run is no longer the job's current one (a requeue stops it, and slurmstepd's
        TERM for it comes after Slurm's record moved on to the next run)."""
        return self._running.get(task_id)

    async def signal(self, pod: str, pidfile: str, signum: int) -> None:
        """Signal a task's process group in its pod; an exec that failed before it could have run
        (a kubelet's 500 under load) is tried again a few times, one that timed out is not (the
        signal may have been sent)."""
        command = agent_protocol.signal_command(pidfile, signum, group=True)
        try:
            async for attempt in AsyncRetrying(
                stop=stop_after_attempt(TASK_SIGNAL_TRIES),
                wait=wait_exponential(multiplier=TASK_SIGNAL_RETRY_S, min=TASK_SIGNAL_RETRY_S),
                retry=retry_if_exception(_may_not_have_run), sleep=_sleep, reraise=True,
            ):
                with attempt:
                    await self._kube.exec_in_pod(pod, command)
        except ExecCommandFailed as error:
            if not error.ran:
                raise
            # The agent ran and said why: the task has ended (no such process, as a native kill
            # of a task that just exited), or never wrote its pid. Again cannot help.
            log.info("task.signal_not_delivered", pod=pod, signal=signum, agent_exit=error.code,
                     why=error.output.strip()[:200])

    def keep_early_signal(self, task_id: TaskId, signum: int, uid: int) -> bool:
        """Keep `signum` for a task whose proxy is up but which does not run yet; False when the
        quotas are spent (one user's flood must not take everybody's place)."""
        now = time.monotonic()
        if task_id not in self._early:
            if len(self._early) >= MAX_TASKS_WITH_EARLY_SIGNALS:
                stale = [t for t, (at, _) in self._early.items() if now - at > EARLY_SIGNAL_TTL_S]
                for old in stale:
                    self._forget_early_signals(old)
            if (len(self._early) >= MAX_TASKS_WITH_EARLY_SIGNALS
                    or self._early_jobs.get(task_id[0], 0) >= EARLY_SIGNAL_TASKS_PER_JOB
                    or self._early_users.get(uid, 0) >= EARLY_SIGNAL_TASKS_PER_USER):
                return False
            self._early_jobs[task_id[0]] = self._early_jobs.get(task_id[0], 0) + 1
            self._early_users[uid] = self._early_users.get(uid, 0) + 1
            self._early_owner[task_id] = uid
        _, kept = self._early.setdefault(task_id, (now, []))
        if len(kept) < EARLY_SIGNALS_PER_TASK:
            kept.append(signum)
        return True

    def forget_job(self, job_id: int) -> None:
        """A run of the job is over: what was kept for its tasks that never ran goes (step keys
        start again at 1 in the next run, whose tasks must not get them)."""
        if not self._early_jobs.get(job_id):
            return
        for task_id in [task_id for task_id in self._early if task_id[0] == job_id]:
            self._forget_early_signals(task_id)

    def _forget_early_signals(self, task_id: TaskId) -> list[int]:
        _, kept = self._early.pop(task_id, (0.0, []))
        if kept:
            _count_down(self._early_jobs, task_id[0])
            _count_down(self._early_users, self._early_owner.pop(task_id, -1))
        return kept

    async def _deliver(self, pod: str, pidfile: str, signals: list[int], job_id: int) -> None:
        for signum in signals:
            try:
                await self.signal(pod, pidfile, signum)
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


def _count_down(counts: dict[int, int], key: int) -> None:
    left = counts.get(key, 1) - 1
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)
