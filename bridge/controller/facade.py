"""The controller's narrow door for the API: the few questions and requests a waiter's call needs,
answered by the subsystems that own the state (sessions, steps, batch signals, the job store).
Besides these methods the API uses only the two subsystems that serve its calls alone
(controller.tasks, controller.step_streams); it never reaches the clients or the stores. The
daemon's sweep loop comes in here too.

A mixin of the Reconciler, which wires the subsystems it names here.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import structlog

from bridge.core.model import JobAllocation, JobPayload

if TYPE_CHECKING:
    from bridge.clients.slurm import SlurmClient
    from bridge.controller.batch_signals import BatchSignals
    from bridge.controller.jobstore import JobStore
    from bridge.controller.kube_workloads import KubeWorkloads
    from bridge.controller.payload_secrets import PayloadSecrets
    from bridge.controller.run_pods import RunPods
    from bridge.controller.sessions import EventQueue, JobSession, SessionRegistry
    from bridge.controller.steps import Step, Steps
    from bridge.core.config import BridgeConfig

log = structlog.get_logger(__name__)

# Slurm states in which the job's pods may exist; any other state means the job is over.
LIVE_STATES = frozenset({"PENDING", "RUNNING", "SUSPENDED"})
COMMAND_ANSWER_WAIT_S = 1.0
"""How long a TERM for the run's script or an srun task waits for the answers to the run's Slurm
commands (ApiFacade._stop_script_once_answered, commands_answered); then it goes all the same."""
COMMAND_ANSWER_POLL_S = 0.02


class ApiFacade:
    cfg: BridgeConfig
    slurm: SlurmClient
    jobs: JobStore
    sessions: SessionRegistry
    pods: RunPods
    steps: Steps
    batch_signals: BatchSignals
    payload_secrets: PayloadSecrets
    node_is_dead: Callable[[str], bool]
    workloads: KubeWorkloads | None

    def _spawn(self, work: Awaitable[None]) -> None:
        """Work nobody awaits (the Reconciler's)."""
        raise NotImplementedError

    # -- jobs ------------------------------------------------------------------------------------
    def is_bridged(self, alloc: JobAllocation) -> bool:
        return self.cfg.partition(alloc.partition) is not None

    async def read_job(self, job_id: int) -> JobAllocation | None:
        """Slurm's record of the job, read now (a caller's proof of ownership is checked on it)."""
        return await self.slurm.job(job_id)

    def record_job(self, alloc: JobAllocation) -> None:
        """A fresh Slurm view of the job, for the reconciler."""
        self.jobs.record(alloc)

    # -- sessions ----------------------------------------------------------------------------------
    def attach_session(self, job_id: int, payload: JobPayload) -> JobSession:
        """The session of the run whose waiter attaches (made if new).

        The attach has just recorded a fresh view, so the store knows the current run. A waiter of
        an earlier run (the job was requeued meanwhile) gives its own in SLURM_RESTART_COUNT, which
        Slurm sets for every run but the first; the smaller of the two is right in both cases (an
        inherited, stale value can only be too big, and only for run 0).
        """
        current = self.pods.current_run(job_id) or 0
        return self.sessions.open(job_id, min(current, _restart_count(payload)))

    def attach_waiter(
        self, job_id: int, payload: JobPayload, *, last_log: dict[str, str], cancel: bool,
        signals: list[tuple[int, int]],
    ) -> tuple[JobSession, EventQueue] | None:
        """The waiter's stream of events for its run, with the signals it still keeps taken (as
        (seq, signal), oldest first); None while another waiter of the run is attached."""
        session = self.attach_session(job_id, payload)
        if session.attached:
            return None
        queue = session.attach(last_log, payload)
        for seq, signum in signals:
            self.batch_signals.take(session, signum, seq, offered=True)
        if cancel:  # its TERM, which no daemon answered
            self._decide_term(session)
        return session, queue

    def cancel_session(self, job_id: int) -> JobSession | None:
        """The session a waiter's cancel applies to: its job's newest one. Without one (the daemon
        restarted), one is made for the current run only while Slurm shows that run running: a
        late cancel from the waiter of a requeued run must not cancel the next run in advance
        (its pods are stopped anyway, that run being over). None when there is nothing to cancel."""
        existing = self.sessions.of_job(job_id)
        if existing:
            return existing[-1]
        view = self.jobs.get(job_id)
        alloc = view.alloc if view is not None else None
        if alloc is not None and alloc.state == "RUNNING" and not over(alloc):
            return self.sessions.open(job_id, alloc.run)
        return None

    def term_from_slurm(self, job_id: int, run: int | None = None, take_signal: bool = True) -> str | None:
        """slurmstepd sent the batch step of run `run` (None: the job's newest session's) SIGTERM.
        It does so when the run ends (scancel, the time limit, a requeue, a preemption), and
        then Slurm shows the run over before it signals anything; and for a mere signal
        (`scancel -s TERM -b`, `--signal=B:TERM@T`), when the job goes on and a script that traps
        TERM keeps running. The store's view is fresh: the request's identify has just read the
        job. "stop": the run's pods are stopped; "signal": the TERM is the script's, delivered as
        any other (kept here when `take_signal`; else the waiter sends it, numbered, as it does
        every other); None: no run of the job to act on."""
        session = self._term_session(job_id, run)
        return None if session is None else self._decide_term(session, take_signal)

    def _term_session(self, job_id: int, run: int | None) -> JobSession | None:
        if run is None:
            return self.cancel_session(job_id)
        view = self.jobs.get(job_id)
        alloc = view.alloc if view is not None else None
        run = _waiters_run(alloc, run) if alloc is not None else run
        session = self.sessions.get(job_id, run)
        if session is None and alloc is not None and alloc.run == run and alloc.state == "RUNNING" \
                and not over(alloc):
            session = self.sessions.open(job_id, run)
        return session

    def _decide_term(self, session: JobSession, take_signal: bool = True) -> str:
        workloads = self.workloads
        view = self.jobs.get(session.job_id)
        alloc = view.alloc if view is not None else None
        if (workloads is not None and workloads.owns(session.job_id, alloc)) or self._run_over(session):
            session.tell_stopping()
            if not session.cancel_requested:  # the first word of the stop
                session.request_cancel()
                self._spawn(self._stop_script_once_answered(session))
            return "stop"
        log.info("term.is_a_signal", job_id=session.job_id, run=session.run)
        if take_signal:
            self.batch_signals.take(session, int(signal.SIGTERM))
        return "signal"

    def _run_over(self, session: JobSession) -> bool:
        """The store's view shows the session's run over: gone, ended, or requeued."""
        view = self.jobs.get(session.job_id)
        alloc = view.alloc if view is not None else None
        return alloc is None or over(alloc) or alloc.run != session.run

    async def _stop_script_once_answered(self, session: JobSession) -> None:
        """The script's TERM, once the answers on their way to its Slurm commands are in (at most
        COMMAND_ANSWER_WAIT_S): natively `scontrol requeue` or `scancel` of the job itself has its
        answer before slurmd signals the job, so the command exits 0; the answer's way through
        the pod is longer than the signal's, and the TERM killed the command first."""
        await _until_commands_answered(session)
        await self.batch_signals.stop_script(session.job_id, session.run, self.node_is_dead)

    async def commands_answered(self, job_id: int, key: str) -> None:
        """The same for a TERM to a task of step `key` (its proxy's): a command such a task
        started (submitit's python runs as an srun task, and requeues its job) gets its answer
        first, as natively."""
        run = self.steps.open_run(job_id, key)
        session = None if run is None else self.sessions.get(job_id, run)
        if session is not None:
            await _until_commands_answered(session)

    def current_session(self, job_id: int) -> JobSession | None:
        """The session of the job's current run (as the store last read it), if its waiter
        attached: a signal for the batch script is for that run, not a requeued one's."""
        run = self.pods.current_run(job_id)
        return None if run is None else self.sessions.get(job_id, run)

    # -- batch signals -------------------------------------------------------------------------------
    def take_batch_signal(
        self, session: JobSession, signum: int, seq: int | None = None, offered: bool = False
    ) -> bool:
        """Keep `signum` for the run's batch script (controller.batch_signals); True when the job
        should be reconciled to deliver it."""
        return self.batch_signals.take(session, signum, seq, offered)

    def signal_batch_script(self, job_id: int, signum: int, seq: int | None) -> bool | None:
        """Keep `signum` for the current run's batch script: whether the job should be reconciled
        to deliver it; None when that run's waiter has not attached (it keeps the signal and
        sends it with its attach). After a requeue the old run's session may linger while its
        pods go, and must not take the new run's signals."""
        session = self.current_session(job_id)
        return None if session is None else self.batch_signals.take(session, signum, seq)

    # -- steps ---------------------------------------------------------------------------------------
    def current_run(self, job_id: int) -> int | None:
        return self.pods.current_run(job_id)

    def step_run(self, job_id: int, key: str) -> int | None:
        """The run whose step `key` is open (controller.steps)."""
        return self.steps.open_run(job_id, key)

    def step_of(self, job_id: int, key: str) -> Step | None:
        return self.steps.of_any_run(job_id, key)

    def close_step(self, job_id: int, key: str) -> None:
        self.steps.close(job_id, key)

    async def finish_step(self, job_id: int, key: str, code: int, run: int | None = None) -> None:
        """Tell the script's srun how the step ended (Slurm's srun exit code); `run`: the waiter's
        SLURM_RESTART_COUNT, which one beyond the job's run was inherited by a first run (as in
        _term_session)."""
        view = self.jobs.get(job_id)
        alloc = view.alloc if view is not None else None
        if run is not None:
            run = None if run < 0 or alloc is None else _waiters_run(alloc, run)
        await self.steps.finish(job_id, key, code, run)

    def volumes_of(self, job_id: int) -> list[tuple[str, str]]:
        """(mount_path, host_path) of the job's partition's volumes: where its per-step files land."""
        view = self.jobs.get(job_id)
        alloc = view.alloc if view is not None else None
        part = self.cfg.partition(alloc.partition) if alloc is not None else None
        return [(v.mount_path, v.host_path) for v in part.volumes] if part is not None else []

    def task_pod(self, job_id: int, slurm_node: str) -> str | None:
        """The pod of the job's current run on Slurm node `slurm_node`."""
        pod = self.pods.on_slurm_node(job_id, slurm_node)
        return None if pod is None else pod.name

    def spools_tasks(self, job_id: int, pod_name: str) -> bool:
        """Its agent spools step tasks' output (a task there outlives a daemon's restart)."""
        return self.pods.spools_tasks(job_id, pod_name)

    def node_gpus(self, job_id: int, slurm_node: str) -> tuple[int, ...] | None:
        """The physical indices of the GPUs the job holds on `slurm_node`, in the order its pod there
        numbers them; None while the store has no record of the job."""
        view = self.jobs.get(job_id)
        if view is None or view.alloc is None:
            return None
        for node in view.alloc.nodes:
            if node.name == slurm_node:
                return node.gpu_indices
        return None

    def task_pod_of_index(self, job_id: int, index: int, run: int | None = None) -> str | None:
        pod = self.pods.of_index(job_id, index, run)
        return None if pod is None else pod.name

    # -- payload Secrets ---------------------------------------------------------------------------
    async def sweep_payload_secrets(self, selector: str) -> int:
        """controller.payload_secrets' sweep, for the daemon's sweep loop."""
        return await self.payload_secrets.sweep(selector)


def over(alloc: JobAllocation) -> bool:
    """Slurm shows the job's current run over (or ending: COMPLETING)."""
    return alloc.state not in LIVE_STATES or "COMPLETING" in alloc.state_flags


def _restart_count(payload: JobPayload) -> int:
    value = payload.environment.get("SLURM_RESTART_COUNT", "0")
    with contextlib.suppress(ValueError):
        return max(0, int(value))
    return 0


async def _until_commands_answered(session: JobSession) -> None:
    """Return once none of the run's Slurm commands awaits its answer, or after COMMAND_ANSWER_WAIT_S."""
    waited_until = time.monotonic() + COMMAND_ANSWER_WAIT_S
    while session.steps.commands_open() and time.monotonic() < waited_until:
        await asyncio.sleep(COMMAND_ANSWER_POLL_S)


def _waiters_run(alloc: JobAllocation, run: int) -> int:
    """The run a waiter's SLURM_RESTART_COUNT names: Slurm sets it for every run but the first, so
    one beyond the job's run was inherited (from the environment sbatch ran in) by the first."""
    return 0 if run > alloc.run else run
