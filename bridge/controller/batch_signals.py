"""Batch signals: signals for a run's batch script (`scancel -s SIG --batch`, `--signal=B:SIG@TIME`).

The path: slurmstepd signals the waiter on the slurmd host, which forwards the signal to the API
(and keeps it, with a sequence number, until told it was delivered); the API hands it here
(`take`), and the job's next reconcile delivers it (`deliver`), in order, once the script runs:
`agent signal` in the first node's pod. Then the waiter hears "signal-done" and forgets it.

Owns the kept signals of each run (SignalBook, held by the run's JobSession and written only here).
Called by the reconciler, which asks the work queue for the retry `deliver` wants.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import structlog

from bridge.clients.kube.actions import KubeActions
from bridge.controller.run_pods import RunPods
from bridge.core import agent_protocol, wellknown
from bridge.core.errors import BridgeError, ExecCommandFailed, ExecOutcomeUnknown, PermanentError

if TYPE_CHECKING:
    from bridge.controller.sessions import JobSession

log = structlog.get_logger(__name__)

SIGNAL_AFTER_START_S = 1.0
"""A signal for a script that is not running yet is delivered this long after it started (time
for its first lines, its traps, to run: natively the script has run since the job started). The
container's start time has whole seconds only, and the agent starts the script a while after: the
agent's `signal` counts the second again from the script's own start (agent/main.go)."""
SIGNAL_RETRY_MAX_S = 10.0
"""The longest wait between two tries of a signal whose exec failed."""
NOT_STARTING = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CrashLoopBackOff",
                          "CreateContainerConfigError", "CreateContainerError", "RunContainerError"})
"""A job container waiting for one of these runs no script: stop_script leaves it alone."""
MAX_STOPS_AT_ONCE = 32
"""stop_script's execs under way at once; beyond, a run is left to its pods' deletion alone."""


class SignalBook:
    """One run's signals for its batch script. Written only by BatchSignals."""

    def __init__(self) -> None:
        self.pending: list[int] = []
        """Signals not delivered yet, oldest first (kept until they are)."""
        self.seqs: dict[int, int] = {}
        """By kept signal, the newest sequence number it stands for: the waiter keeps that signal
        (for a daemon that restarts before delivering it) until told it was delivered."""
        self.taken = 0
        """The waiter's sequence number of the last signal taken: a resent one is not taken twice."""
        self.failures = 0
        """Failed deliveries of the oldest kept signal in a row (the retry backs off)."""

    def __bool__(self) -> bool:
        return bool(self.pending)


class BatchSignals:
    def __init__(self, kube: KubeActions, pods: RunPods) -> None:
        self._kube = kube
        self._pods = pods
        self._stopping = 0
        """stop_script's execs under way."""

    def take(self, session: JobSession, signum: int, seq: int | None = None, offered: bool = False) -> bool:
        """Keep `signum` for the run's batch script; True when the job should be reconciled to
        deliver it. A `seq` the session took already (the waiter sent it again, not knowing it was
        taken) is dropped. Taken, a signal is never lost to a pod still starting or an exec that
        failed: delivery is tried again until the run ends. `offered`: it came with an attach,
        from a waiter that still keeps it."""
        book = session.signals
        if seq is not None:
            if seq <= book.taken:
                if offered and book.seqs.get(signum, 0) < seq:
                    # Delivered already, and the waiter missed the word (its stream broke):
                    # tell it again, or it would keep the signal for ever. Only to an attach,
                    # whose new stream takes at most one per kind.
                    _signal_done(session, signum, seq)
                return False
            book.taken = seq
            book.seqs[signum] = seq
        if signum not in book.pending:
            # As the kernel keeps a signal pending once, however often it comes while blocked:
            # the kept list stays bounded by the forwarded signals, whatever a user sends.
            book.pending.append(signum)
        return True

    async def deliver(self, session: JobSession, bound: Any) -> float | None:
        """Deliver the kept signals oldest first; each stays kept until it was sent (a failed
        exec under load, the kubelet's 500 on a container that just started, is tried again).
        Returns when to try again (seconds), None when nothing is left to try."""
        book = session.signals
        while book.pending:
            signum = book.pending[0]
            sending = book.seqs.get(signum)
            try:
                delivery = await self._signal_once(session.job_id, signum)
            except (ExecOutcomeUnknown, PermanentError) as error:
                # Perhaps sent already (a second USR1 may meet a script whose trap is gone), or
                # never deliverable (the pod is gone, RBAC): not tried again.
                bound.warning("signal.given_up", signal=signum, error=str(error))
                delivery = "dropped"
            except BridgeError as error:
                book.failures += 1
                delay = min(SIGNAL_AFTER_START_S * 2 ** book.failures, SIGNAL_RETRY_MAX_S)
                bound.warning("signal.retry", signal=signum, error=str(error), retry_in_s=delay)
                return delay
            if delivery == "later":
                return SIGNAL_AFTER_START_S
            book.failures = 0
            book.pending.pop(0)
            newest = book.seqs.pop(signum, None)
            # Sending one without a number (an older waiter's TERM, a cancel an attach carried),
            # a numbered one that came meanwhile is another.
            if newest is not None and (sending is None or newest > sending):
                # Another came while this one was being sent: it may have missed the delivery,
                # so it is sent again, after the others kept meanwhile.
                book.pending.append(signum)
                book.seqs[signum] = newest
            if sending is not None:
                _signal_done(session, signum, sending)
        return None

    async def stop_script(self, job_id: int, run: int, node_is_dead: Callable[[str], bool]) -> None:
        """SIGTERM to the agent that runs run `run`'s script, which passes it on to the script's
        process group as it does the kubelet's (agent/stop.go). The waiter asks as slurmstepd
        signals it, when slurmstepd signals the steps' tasks too: natively the script and the
        tasks get their TERM at once. The pods' deletion, which follows, stays the stop that
        counts, but a kubelet still starting the pod takes its time to act on it, and meanwhile
        the script would go on past a step that ended. Only logged when it fails."""
        pod = self._pods.of_index(job_id, 0, run)
        if (pod is None or not pod.runs_agent or not pod.node_name or pod.container_ended
                or pod.waiting_reason in NOT_STARTING or node_is_dead(pod.node_name)):
            # Nothing runs a script there, or will soon. One still being started is asked: its
            # kubelet may not have reported it running yet, and it is the one slow to stop.
            return
        bound = log.bind(job_id=job_id, pod=pod.name, run=run)
        if self._stopping >= MAX_STOPS_AT_ONCE:
            # A wave of cancels (scancel -u, a time limit for thousands): the deletions stop them.
            bound.info("stop.left_to_the_kubelet")
            return
        self._stopping += 1
        try:
            await self._kube.exec_in_pod(
                pod.name, agent_protocol.signal_command(wellknown.AGENT_RUN_PIDFILE, int(signal.SIGTERM)))
        except BridgeError as error:
            bound.info("stop.not_sent", error=str(error)[:200])
            return
        finally:
            self._stopping -= 1
        bound.info("stop.sent")

    async def _signal_once(self, job_id: int, signum: int) -> str:
        """One delivery of `signum` to the script in the first node's pod of the job's current
        run: "sent", "later" (the script does not run yet) or "dropped" (no agent there to
        signal it). Raises BridgeError when the exec fails."""
        pod = self._pods.of_index(job_id, 0)
        if pod is not None and not pod.runs_agent:
            log.warning("signal.no_agent", job_id=job_id, pod=pod.name, signal=signum)
            return "dropped"
        if pod is None or pod.running_for_s(datetime.now(UTC)) < SIGNAL_AFTER_START_S:
            return "later"
        try:
            await self._kube.exec_in_pod(
                pod.name, agent_protocol.signal_command(wellknown.AGENT_PIDFILE, signum))
        except ExecCommandFailed as error:
            if error.ran and error.code == agent_protocol.EXIT_NOT_STARTED:
                return "later"
            if error.ran and error.code == agent_protocol.EXIT_NO_SUCH_PROCESS:
                # The script has ended: as a signal to a batch step whose shell just exited.
                log.info("signal.script_gone", job_id=job_id, pod=pod.name, signal=signum)
                return "dropped"
            raise  # not sent (the runtime failed the exec, a torn pid file): tried again
        log.info("signal.sent", job_id=job_id, pod=pod.name, signal=signum)
        return "sent"


def _signal_done(session: JobSession, signum: int, seq: int) -> None:
    """Tell the waiter the batch script's `signum` (taken as `seq`, and the older ones of its
    kind) needs keeping no longer: delivered, or never deliverable."""
    session.publish({"type": "signal-done", "signal": signum, "seq": seq})
