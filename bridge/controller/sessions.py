"""Per-run runtime state of attached waiters, and the registry that owns it.

A session belongs to one run of a job: (job id, run), the run being Slurm's restart count. It is
made when that run's waiter attaches and ended (its waiter told, its log relays stopped) and dropped
once Slurm shows that run over: finished, cancelled, timed out, gone, or requeued (a requeued job
keeps its id but gets a new run, hence a new, clean session that never replays the old exit).

Lost on restart by design: the waiter re-attaches and re-sends everything here (payload, log
positions).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from bridge.clients.identity import Resolution
from bridge.controller.batch_signals import SignalBook
from bridge.controller.log_relay import LogBook
from bridge.controller.steps import StepBook
from bridge.core.model import JobPayload

Event = dict[str, Any]
STOPPING: Event = {"type": "stopping"}
"""The run stops because Slurm ends it (JobSession.tell_stopping)."""
MAX_QUEUED_OUTPUT = 256
"""Output events (each at most one 16 KB frame) a waiter may have unread before the log relays
wait for it: a waiter that writes slowly (a busy filesystem) holds its relays, whose lines wait
in the node's container log, instead of the daemon's memory growing."""


class EventQueue(asyncio.Queue[Event]):
    """A waiter's events. Output waits for room (`put_output`); the few control events (exit,
    messages) always go in."""

    def __init__(self, output_limit: int = MAX_QUEUED_OUTPUT) -> None:
        super().__init__()
        self._output_limit = output_limit
        self._room = asyncio.Event()
        self._room.set()

    def get_nowait(self) -> Event:
        event = super().get_nowait()  # Queue.get() ends here too
        if self.qsize() < self._output_limit:
            self._room.set()
        return event

    async def put_output(self, event: Event) -> None:
        while self.qsize() >= self._output_limit:
            self._room.clear()
            await self._room.wait()
        self.put_nowait(event)


@dataclass
class JobSession:
    """One run's session. Each part of it is written by one owner:
    - the waiter's connection and the run's end (payload, cancel_requested, listener, attached_at,
      final): this module, through attach/detach/request_cancel/finish;
    - `steps`: controller.steps; `signals`: controller.batch_signals; `logs`: controller.log_relay;
    - the run's pods (created, script_delivered, payload_secret, stopped_with): the reconciler and
      its controller.pod_creation.
    """

    job_id: int
    run: int = 0
    """Slurm's restart count of the run this session serves (JobAllocation.run)."""
    payload: JobPayload | None = None
    cancel_requested: bool = False
    stopping: bool = False
    """The waiter was told the run stops (tell_stopping)."""
    listener: EventQueue | None = None
    attached_at: float = 0.0
    """When the waiter last attached (monotonic): the attach → pod latency starts there."""
    final: Event | None = None
    """The exit event, once decided; re-sent to a waiter that re-attaches."""
    steps: StepBook = field(default_factory=StepBook)
    """Step requests of the script's `srun` calls (controller.steps)."""
    signals: SignalBook = field(default_factory=SignalBook)
    """Signals for the batch script not delivered yet (controller.batch_signals)."""
    logs: LogBook = field(default_factory=LogBook)
    """The pods' log relays and their positions (controller.log_relay)."""
    created: bool = False
    """This daemon created (or found) the pods; a missing pod afterwards is a failure."""
    script_delivered: bool = False
    """A script too big for the payload Secret has been copied into the first pod."""
    payload_secret: str | None = None
    """The name of the run's payload Secret, once this daemon made (or found) it."""
    user: Resolution | None = None
    """The NSS answer (groups, home, passwd entry) the run's first pods were made with: its later
    pods (a multi-node job's, made once the first has its address) get the same, whatever NSS
    says by then."""
    stopped_with: tuple[int, int | None] | None = None
    """(exit code, signal) of the run's script when its pods were stopped (cancel, time limit)."""
    forbidden_since: float | None = None
    """When Kubernetes first answered 403 to this run's Secret or pods (monotonic; pod creation)."""

    def attach(self, last_log: dict[str, str], payload: JobPayload | None = None) -> EventQueue:
        """A new waiter connection replaces any older one (and its log relays). The waiter tells
        its payload and the last log line it printed of each pod."""
        self.detach()
        if payload is not None:
            self.payload = payload
        self.attached_at = time.monotonic()
        self.logs.restart(last_log)
        self.listener = EventQueue()
        if self.stopping:
            self.listener.put_nowait(STOPPING)
        if self.final is not None:
            self.listener.put_nowait(self.final)
        return self.listener

    def request_cancel(self) -> None:
        """The run is to stop (its waiter's TERM, and Slurm shows it over): the reconciler stops
        its pods."""
        self.cancel_requested = True

    def tell_stopping(self) -> None:
        """Tell the waiter, once, that the run stops because Slurm ends it: slurmstepd sends every
        process of the batch step its TERM, the sruns the waiter runs for the script's steps too,
        and the stop's TERM to the script's process group in the pod reaches the pod's srun of each
        step, which passes it back. The waiter takes that one for the stop's, whenever it comes:
        before slurmstepd's own (the daemon saw the run over first) or seconds after it (a slow
        stop under load). Passed on, it was a second TERM for Slurm's srun (CI: "srun: forcing job
        termination" twice after a requeue, once natively). Sent on the stream that carries the
        pod's srun signals, before the stop acts: the waiter reads it first."""
        if not self.stopping:
            self.stopping = True
            self.publish(STOPPING)

    def detach(self, queue: asyncio.Queue[Event] | None = None) -> None:
        if queue is not None and queue is not self.listener:
            return
        self.listener = None
        self.logs.forget()

    @property
    def attached(self) -> bool:
        return self.listener is not None

    def publish(self, event: Event) -> None:
        if self.listener is not None:
            self.listener.put_nowait(event)

    async def publish_output(self, event: Event) -> None:
        """Output for the waiter, once it has room for more (its relay waits meanwhile)."""
        if self.listener is not None:
            await self.listener.put_output(event)

    def finish(self, event: Event) -> None:
        """Decide the run's end once; the waiter exits when it reads it."""
        if self.final is None:
            self.final = event
            self.publish(event)


class SessionRegistry:
    """The sessions by (job id, run). Attaches open them (through the reconciler); the reconciler
    ends them."""

    def __init__(self) -> None:
        # By job, then run: every reconcile asks for one job's sessions, which must not cost a
        # walk over the whole cluster's (10,000 live jobs).
        self._by_job: dict[int, dict[int, JobSession]] = {}

    def get(self, job_id: int, run: int) -> JobSession | None:
        runs = self._by_job.get(job_id)
        return None if runs is None else runs.get(run)

    def open(self, job_id: int, run: int) -> JobSession:
        """The session of this run, made if it is new."""
        runs = self._by_job.setdefault(job_id, {})
        session = runs.get(run)
        if session is None:
            session = runs[run] = JobSession(job_id, run)
        return session

    def of_job(self, job_id: int) -> list[JobSession]:
        """Every session of the job, oldest run first."""
        runs = self._by_job.get(job_id)
        return [] if not runs else [runs[run] for run in sorted(runs)]

    def end(self, session: JobSession, event: Event) -> None:
        """The run is over: tell its waiter `event` (unless its end was decided before), stop its
        log relays and forget it. A waiter still connected reads the event and leaves."""
        session.finish(event)
        runs = self._by_job.get(session.job_id)
        if runs is not None and runs.get(session.run) is session:
            del runs[session.run]
            if not runs:
                del self._by_job[session.job_id]
        session.logs.stop()

    def __iter__(self) -> Iterator[JobSession]:
        return iter([session for runs in self._by_job.values() for session in runs.values()])

    def __len__(self) -> int:
        return sum(len(runs) for runs in self._by_job.values())
