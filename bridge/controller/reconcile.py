"""reconcile(job_id): make Kubernetes match what Slurm says about one job.

Level-triggered: whatever woke us up, re-read the Slurm view, the cached pods and the waiters'
sessions, then act. Every action is idempotent, so running it twice, or after a restart, is
harmless (pod names are deterministic, a create that finds the pod already there is success, a
delete of a missing pod too).

The reconciler owns no state of its own; it reads three owners:
- the job store (bridge.controller.jobstore): the newest Slurm view per job, versioned. An absence there is
  only a hint: before anything is stopped for it, the store asks Slurm about that one job;
- the session registry (bridge.controller.sessions): one session per run (job id + restart count). The runs
  that Slurm shows over are ended here and dropped;
- the pod cache, plus create expectations (bridge.controller.expectations): a pod created but not yet seen
  by the cache is neither missing nor created twice.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import signal
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import structlog

from bridge.clients.identity import SupplementalGroups
from bridge.clients.kube.actions import KubeActions
from bridge.clients.kube.cache import PodCache
from bridge.clients.kube.errors import KubeConflict, KubeNotFound, KubeRejected
from bridge.clients.kube.node_features import StrictGroupsNodes
from bridge.clients.kube.nodes import NodeCache
from bridge.clients.slurm import SlurmClient
from bridge.controller.expectations import CreateExpectations
from bridge.controller.jobstore import JobStore
from bridge.controller.metrics import Metrics
from bridge.controller.sessions import JobSession, SessionRegistry
from bridge.core import outcome as outcomes
from bridge.core import wellknown
from bridge.core.config import BridgeConfig, ConfigError
from bridge.core.directives import DirectiveError, parse_directives
from bridge.core.errors import (
    BridgeError,
    ExecCommandFailed,
    ExecOutcomeUnknown,
    PermanentError,
    TemporaryError,
)
from bridge.core.model import JobAllocation, JobPayload
from bridge.core.pod_identity import node_index_of, payload_secret_of, pod_name, run_of
from bridge.core.translate import TranslateError, desired_objects, kubernetes_node_names

log = structlog.get_logger(__name__)

EXIT_CODE_NOT_STARTED = 1
# Slurm states in which the job's pods may exist; any other state means the job is over.
LIVE_STATES = frozenset({"PENDING", "RUNNING", "SUSPENDED"})
STEP_DONE_TRIES = 4
"""Tries to tell the script's srun that a step the daemon refused has ended."""
SIGNAL_AFTER_START_S = 1.0
"""A signal for a script that is not running yet is delivered this long after it started (time
for its first lines, its traps, to run: natively the script has run since the job started)."""
SIGNAL_RETRY_MAX_S = 10.0
"""The longest wait between two tries of a signal whose exec failed."""
BLOCKING_EVENTS = frozenset({
    "FailedMount", "FailedAttachVolume", "FailedMapVolume", "FailedCreatePodSandBox",
    "FailedCreatePodContainer", "FailedScheduling", "Failed", "BackOff", "InspectFailed",
    "ErrImageNeverPull", "NetworkNotReady", "FailedPodSandBoxStatus", "UnexpectedAdmissionError",
})
"""Warning events that keep a pod from starting (others, e.g. MissingClusterDNS, do not)."""
MAX_OPEN_STEPS = 64
MAX_STEP_REQUEST_BYTES = 96 * 1024
"""A step's environment goes into one exec argument in the pod; Linux allows 128 KiB per argument."""
"""Step requests a run may have open at once (each srun in the script is one until it ends)."""
# A log relay whose stream ended while its container still runs resumes after these pauses.
LOG_RESUME_DELAYS_S = (0.0, 0.1, 0.2, 0.5, 1.0, 2.0)
# Failed reads tolerated once the container has ended, before its remaining lines are given up.
LOG_ATTEMPTS_AFTER_END = 3
LOG_NOT_FOUND_ATTEMPTS = 10
"""404s for the log of a pod the watch has, asked again before the relay gives up on it."""
SECRET_KNOWN_S = 30.0
"""How long a payload Secret this daemon made or found is taken to exist without asking again."""
SECRET_SWEEP_MIN_AGE_S = 300.0
"""A payload Secret that no pod or session names is deleted by the sweep only once this old."""


class Reconciler:
    def __init__(
        self,
        cfg: BridgeConfig,
        slurm: SlurmClient,
        kube: KubeActions,
        cache: PodCache,
        metrics: Metrics,
        requeue: Callable[[int], None],
        requeue_after: Callable[[int, float], None] | None = None,
        *,
        jobs: JobStore | None = None,
        expectations: CreateExpectations | None = None,
        nodes: NodeCache | None = None,
        node_is_dead: Callable[[str], bool] | None = None,
    ) -> None:
        self.cfg = cfg
        self.slurm = slurm
        self.kube = kube
        self.cache = cache
        # The API's clock has one-second resolution: a second of slack.
        self.started_at = datetime.now(UTC) - timedelta(seconds=1)
        self.metrics = metrics
        self.requeue = requeue
        self.requeue_after = requeue_after or (lambda key, _delay: requeue(key))
        self.jobs = jobs if jobs is not None else JobStore(slurm)
        """The versioned Slurm view (the poller and attaches write it; reconcile only reads)."""
        self.sessions = SessionRegistry()
        self.expectations = expectations if expectations is not None else CreateExpectations()
        cache.on_seen(self.expectations.observed)
        self.payload_secrets: dict[str, float] = {}
        """Payload Secrets this daemon made or found, and when (monotonic)."""
        self._secret_locks: dict[str, tuple[asyncio.Lock, int]] = {}
        self.groups = SupplementalGroups(cfg.pods.supplemental_groups)
        """The job user's supplementary groups, from Slurm's user name via NSS (cached)."""
        self.strict_groups = StrictGroupsNodes(lambda name: self.kube.get_node(name))
        """Nodes that enforce supplementalGroupsPolicy Strict (the `auto` policy asks)."""
        self.nodes = nodes
        """The node watch's cache (maps Slurm nodes by label without listing the cluster)."""
        self.step_key = read_step_key(cfg.waiter.step_key_file)
        """Signs the steps of the scripts' srun (None: srun unavailable). Never logged."""
        self._background: set[asyncio.Future[Any]] = set()
        self.node_is_dead = node_is_dead or (lambda _name: False)
        """True for a Kubernetes node that is gone or not Ready past the grace: no kubelet there
        will confirm a pod's end, so its pods are removed without waiting (node health sync)."""

    def is_bridged(self, alloc: JobAllocation) -> bool:
        return self.cfg.partition(alloc.partition) is not None

    # -- sessions, for the API -------------------------------------------------------------------
    def attach_session(self, job_id: int, payload: JobPayload) -> JobSession:
        """The session of the run whose waiter attaches (made if new).

        The attach has just recorded a fresh view, so the store knows the current run. A waiter of
        an earlier run (the job was requeued meanwhile) gives its own in SLURM_RESTART_COUNT, which
        Slurm sets for every run but the first; the smaller of the two is right in both cases (an
        inherited, stale value can only be too big, and only for run 0).
        """
        view = self.jobs.get(job_id)
        current = view.alloc.run if view is not None and view.alloc is not None else 0
        return self.sessions.open(job_id, min(current, _restart_count(payload)))

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
        if alloc is not None and alloc.state == "RUNNING" and not _over(alloc):
            return self.sessions.open(job_id, alloc.run)
        return None

    async def _deliver_script(self, session: JobSession, pods: list[dict[str, Any]], bound: Any) -> None:
        """Copy a script too big for an annotation into the first pod, once it runs (the agent
        waits for it there)."""
        for pod in pods:
            copied_in = _annotation(pod, wellknown.ANNOTATION_SCRIPT_DELIVERY) == "exec"
            if not copied_in or not _container_running(pod) or session.payload is None:
                continue
            data = session.payload.script.encode("utf-8", "surrogateescape")
            agent = f"{wellknown.AGENT_DIR}/{wellknown.AGENT_BINARY}"
            command = [agent, "receive-script", wellknown.AGENT_SCRIPT, str(len(data))]
            code = await self.kube.exec_with_input(pod["metadata"]["name"], command, data)
            if code != 0:
                raise TemporaryError(f"copying the script into pod {pod['metadata']['name']} exited {code}")
            session.script_delivered = True
            bound.info("script.delivered", pod=pod["metadata"]["name"], bytes=len(data))

    # -- steps (srun in the pods) ------------------------------------------------------------
    def _register_step(self, session: JobSession, event: dict[str, Any], bound: Any) -> None:
        """Keep a step request of the script's srun for the task proxies; the waiter gets only its
        key and srun options (the event still carries the whole request, encoded)."""
        try:
            request = json.loads(base64.b64decode(event["data"]))
            key = str(int(request["key"]))
            argv = [str(a) for a in request["argv"]]
            env = {str(k): str(v) for k, v in (request.get("env") or {}).items()}
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            bound.warning("step.bad_request", error=repr(error))
            event.clear()
            event.update(type="heartbeat")  # nothing the waiter should act on
            return
        refusal = None
        if key in session.tokens_issued:
            # Seen before (a relay replaying after a re-attach): never signed twice.
            event.update(type="heartbeat")
            return
        if self.step_key is None:
            refusal = ("job steps are not enabled for jobs that run in Kubernetes on this cluster (the "
                       "bridge has no [waiter] step_key_file)")
        elif len(session.steps) >= MAX_OPEN_STEPS:
            refusal = f"more than {MAX_OPEN_STEPS} job steps at once"
        elif len(event["data"]) > MAX_STEP_REQUEST_BYTES:
            refusal = f"the step's environment and arguments exceed {MAX_STEP_REQUEST_BYTES // 1024} KiB"
        if refusal is not None:
            session.tokens_issued.add(key)  # answered once: a replay is not answered again
            bound.warning("step.refused", key=key, reason=refusal)
            event.clear()
            event.update(type="message", text=f"srun: error: {refusal}")
            self._spawn(self._finish_refused_step(session.job_id, key, bound))
            return
        session.steps[key] = {"argv": argv, "cwd": str(request.get("cwd") or ""), "env": env}
        session.tokens_issued.add(key)
        # The waiter passes it to its srun; the SPANK guard lets only steps with it through.
        assert self.step_key is not None
        event["token"] = step_token(self.step_key, session.job_id, session.run, key)
        bound.info("step.requested", key=key)

    async def _finish_refused_step(self, job_id: int, key: str, bound: Any) -> None:
        """Tell the script's srun its refused step ended (1), trying a few times: else it waits
        for ever. Nobody awaits this, so its failure is logged here."""
        for attempt in range(STEP_DONE_TRIES):
            try:
                await self.finish_step(job_id, key, 1)
                return
            except PermanentError as error:
                bound.warning("step.done_not_told", key=key, error=str(error))
                return
            except BridgeError as error:  # the agent's step-done is idempotent: again is safe
                if attempt == STEP_DONE_TRIES - 1:
                    bound.warning("step.done_not_told", key=key, error=str(error))
                    return
            await asyncio.sleep(2 ** attempt)

    def _spawn(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def task_pod(self, job_id: int, slurm_node: str) -> str | None:
        """The pod of the job's current run on Slurm node `slurm_node`."""
        view = self.jobs.get(job_id)
        run = view.alloc.run if view is not None and view.alloc is not None else None
        for pod in self.cache.pods_of(job_id):
            if run_of(pod) == run and _annotation(pod, wellknown.ANNOTATION_SLURM_NODE) == slurm_node:
                return str(pod["metadata"]["name"])
        return None

    def current_run(self, job_id: int) -> int | None:
        view = self.jobs.get(job_id)
        return view.alloc.run if view is not None and view.alloc is not None else None

    def current_step(self, job_id: int, key: str) -> dict[str, Any] | None:
        """Step `key` of the job's current run (keys start again at 1 in each run)."""
        view = self.jobs.get(job_id)
        run = view.alloc.run if view is not None and view.alloc is not None else None
        for session in self.sessions.of_job(job_id):
            if session.run == run and key in session.steps:
                return session.steps[key]
        return None

    def step_of(self, job_id: int, key: str) -> dict[str, Any] | None:
        for session in reversed(self.sessions.of_job(job_id)):
            if key in session.steps:
                return session.steps[key]
        return None

    def close_step(self, job_id: int, key: str) -> None:
        """The step has ended: its key no longer runs tasks, nor takes output."""
        for session in reversed(self.sessions.of_job(job_id)):
            session.steps.pop(key, None)

    async def finish_step(self, job_id: int, key: str, code: int) -> None:
        """Tell the script's srun how the step ended (Slurm's srun exit code)."""
        self.close_step(job_id, key)
        pod = self.task_pod_of_index(job_id, 0)
        if pod is None:
            return
        agent = f"{wellknown.AGENT_DIR}/{wellknown.AGENT_BINARY}"
        await self.kube.exec_in_pod(pod, [agent, "step-done", key, str(code)])

    def task_pod_of_index(self, job_id: int, index: int) -> str | None:
        view = self.jobs.get(job_id)
        run = view.alloc.run if view is not None and view.alloc is not None else None
        for pod in self.cache.pods_of(job_id):
            if run_of(pod) == run and (node_index_of(pod) or 0) == index:
                return str(pod["metadata"]["name"])
        return None

    def current_session(self, job_id: int) -> JobSession | None:
        """The session of the job's current run (as the store last read it), if its waiter
        attached: a signal for the batch script is for that run, not a requeued one's."""
        view = self.jobs.get(job_id)
        if view is None or view.alloc is None:
            return None
        return self.sessions.get(job_id, view.alloc.run)

    def take_batch_signal(
        self, session: JobSession, signum: int, seq: int | None = None, offered: bool = False
    ) -> None:
        """Keep `signum` for the run's batch script (`scancel -s SIG --batch`,
        `--signal=B:SIG@TIME`); the job's next reconcile delivers it, in order, once the script
        runs. A `seq` the session took already (the waiter sent it again, not knowing it was
        taken) is dropped. Taken, a signal is never lost to a pod still starting or an exec that
        failed: delivery is tried again until the run ends. `offered`: it came with an attach,
        from a waiter that still keeps it."""
        if seq is not None:
            if seq <= session.signals_taken:
                if offered and session.pending_signal_seqs.get(signum, 0) < seq:
                    # Delivered already, and the waiter missed the word (its stream broke):
                    # tell it again, or it would keep the signal for ever. Only to an attach,
                    # whose new stream takes at most one per kind.
                    _signal_done(session, signum, seq)
                return
            session.signals_taken = seq
            session.pending_signal_seqs[signum] = seq
        if signum not in session.pending_signals:
            # As the kernel keeps a signal pending once, however often it comes while blocked:
            # the kept list stays bounded by the forwarded signals, whatever a user sends.
            session.pending_signals.append(signum)
        self.requeue(session.job_id)

    async def _signal_batch_script(self, job_id: int, signum: int) -> str:
        """One delivery of `signum` to the script in the first node's pod of the job's current
        run: "sent", "later" (the script does not run yet) or "dropped" (no agent there to
        signal it). Raises BridgeError when the exec fails."""
        pod = self._batch_pod(job_id)
        if pod is not None and not _runs_agent(pod):
            log.warning("signal.no_agent", job_id=job_id, pod=pod["metadata"]["name"], signal=signum)
            return "dropped"
        if pod is None or _script_running_for_s(pod) < SIGNAL_AFTER_START_S:
            return "later"
        name = pod["metadata"]["name"]
        agent = f"{wellknown.AGENT_DIR}/{wellknown.AGENT_BINARY}"
        try:
            await self.kube.exec_in_pod(name, [agent, "signal", wellknown.AGENT_PIDFILE, str(signum)])
        except ExecCommandFailed as error:
            if "has not started" in error.output:
                return "later"
            if "no such process" in error.output:
                # The script has ended: as a signal to a batch step whose shell just exited.
                log.info("signal.script_gone", job_id=job_id, pod=name, signal=signum)
                return "dropped"
            raise  # not sent (the runtime failed the exec, a torn pid file): tried again
        log.info("signal.sent", job_id=job_id, pod=name, signal=signum)
        return "sent"

    def _batch_pod(self, job_id: int) -> dict[str, Any] | None:
        view = self.jobs.get(job_id)
        run = view.alloc.run if view is not None and view.alloc is not None else None
        for pod in self.cache.pods_of(job_id):
            if run_of(pod) == run and (node_index_of(pod) or 0) == 0:
                return pod
        return None

    async def _deliver_pending_signals(self, session: JobSession, bound: Any) -> None:
        """Deliver the kept signals oldest first; each stays kept until it was sent (a failed
        exec under load, the kubelet's 500 on a container that just started, is tried again)."""
        while session.pending_signals:
            signum = session.pending_signals[0]
            sending = session.pending_signal_seqs.get(signum)
            try:
                delivery = await self._signal_batch_script(session.job_id, signum)
            except (ExecOutcomeUnknown, PermanentError) as error:
                # Perhaps sent already (a second USR1 may meet a script whose trap is gone), or
                # never deliverable (the pod is gone, RBAC): not tried again.
                bound.warning("signal.given_up", signal=signum, error=str(error))
                delivery = "dropped"
            except BridgeError as error:
                session.signal_failures += 1
                delay = min(SIGNAL_AFTER_START_S * 2 ** session.signal_failures, SIGNAL_RETRY_MAX_S)
                bound.warning("signal.retry", signal=signum, error=str(error), retry_in_s=delay)
                self.requeue_after(session.job_id, delay)
                return
            if delivery == "later":
                self.requeue_after(session.job_id, SIGNAL_AFTER_START_S)
                return
            session.signal_failures = 0
            session.pending_signals.pop(0)
            newest = session.pending_signal_seqs.pop(signum, None)
            if newest is not None and sending is not None and newest > sending:
                # Another came while this one was being sent: it may have missed the delivery,
                # so it is sent again, after the others kept meanwhile.
                session.pending_signals.append(signum)
                session.pending_signal_seqs[signum] = newest
            if sending is not None:
                _signal_done(session, signum, sending)

    # -- the loop body ---------------------------------------------------------
    async def reconcile(self, job_id: int) -> None:
        self.metrics.inc("reconciles_total")
        bound = log.bind(job_id=job_id)
        view = self.jobs.get(job_id)
        pods = self.cache.pods_of(job_id)
        sessions = self.sessions.of_job(job_id)
        if view is None or not view.listed:
            if not pods and not sessions:
                return  # nothing of ours: an absence needs no confirmation
            # Absence alone never stops anything: ask Slurm about this one job first.
            self.metrics.inc("slurm_confirm_reads_total")
            view = await self.jobs.refresh(job_id)
            bound.info("slurm.absence_checked", gone=view.alloc is None,
                       state=view.alloc.state if view.alloc else None)
        alloc = view.alloc
        current = None if alloc is None or _over(alloc) else alloc.run

        # Every run but a live current one is over: its pods go, then its session ends.
        by_run: dict[int, list[dict[str, Any]]] = {}
        for pod in pods:
            by_run.setdefault(run_of(pod), []).append(pod)
        runs = set(by_run) | {s.run for s in sessions}
        for run in sorted(runs - {current} if current is not None else runs):
            session = self.sessions.get(job_id, run)
            await self._stop(by_run.get(run, []), session, alloc, bound.bind(run=run))
        if current is None:
            return
        assert alloc is not None
        run_pods = by_run.get(current, [])
        session = self.sessions.get(job_id, current)
        if session is not None and session.cancel_requested:
            await self._stop(run_pods, session, alloc, bound.bind(run=current))
            return
        if alloc.state != "RUNNING":
            return  # pending or suspended: the waiter attaches once Slurm starts the job
        if session is None or session.payload is None:
            return  # pods, if any, keep running; the waiter will attach and tell us what to do
        if session.final is not None:
            return
        await self._run(session, alloc, run_pods, bound.bind(run=current))

    async def _run(
        self, session: JobSession, alloc: JobAllocation, pods: list[dict[str, Any]], bound: Any
    ) -> None:
        """The current run is live and its waiter attached: create, watch, decide its outcome."""
        names = [pod_name(alloc.job_id, i, alloc.run) for i in range(len(alloc.nodes))]
        present = {pod["metadata"]["name"] for pod in pods}
        expected = self.expectations.pending(n for n in names if n not in present)
        if expected:
            # Created, not in the cache yet: neither gone nor to be created again. Look again
            # when the expectation expires, in case no event ever comes.
            self.requeue_after(alloc.job_id, max(expected.values()) + 0.1)
        if not pods:
            if expected:
                return
            if session.created:
                await self._fail(session, alloc, "the job's pods were deleted outside Slurm", bound)
                return
            await self._create(session, alloc, set(), bound)
            return
        session.created = True
        if len(present) + len(expected) < len(names):
            # Creation was interrupted (restart mid-way): create the rest, idempotently.
            await self._create(session, alloc, present | set(expected), bound)

        grace = self.cfg.start_failure_grace_s
        # Like srun: wait for every rank, then the highest non-zero exit code wins (deciding at the
        # first failure would make the code depend on which rank happened to end first).
        decision = outcomes.job_outcome(
            pods, len(alloc.nodes), now=datetime.now(UTC), grace_s=grace, wait_for_all=True,
            batch_only=any(_runs_agent(p) for p in pods),
        )
        self._ensure_log_relays(session, pods)
        if not session.script_delivered:
            await self._deliver_script(session, pods, bound)
        if session.pending_signals:
            await self._deliver_pending_signals(session, bound)
        if isinstance(decision, outcomes.FailedBeforeStart) and decision.overdue:
            reason = await self._overdue_reason(decision, pods)
            if reason is None:
                # Progress, or nothing known: look again a grace period later (not every few
                # seconds: each look lists the pod's events).
                self.requeue_after(alloc.job_id, grace)
                return
            await self._fail(session, alloc, reason, bound)
        elif isinstance(decision, outcomes.FailedBeforeStart):
            await self._fail(session, alloc, decision.reason, bound)
        elif isinstance(decision, outcomes.Finished):
            if self._logs_drained(session, pods):
                ended = _container_finished_at(pods)
                took = None
                # Only ends this process lived through: after a restart, old ends would count.
                if ended is not None and session.final is None and ended >= self.started_at:
                    took = (datetime.now(UTC) - ended).total_seconds()
                    self.metrics.observe("pod_end_to_job_end_seconds", took)
                bound.info("job.finished", exit_code=decision.exit_code, signal=decision.signal,
                           pod_end_to_job_end_s=None if took is None else round(took, 3))
                # An exit code or a kill by signal speaks for itself (native Slurm prints nothing
                # either: sacct shows it); what native Slurm would not do (OOM kills, time limits,
                # Kubernetes evicting a pod) gets a line in the job's stderr.
                explain = decision.oom_killed or decision.timed_out or decision.by_kubernetes
                session.finish({
                    "type": "exit", "code": decision.exit_code, "signal": decision.signal,
                    "reason": decision.reason if explain else "",
                })
        elif (waited := _longest_unstarted_s(pods)) is not None:
            # The start deadline (or a retried start error's grace) runs out without any pod
            # event to wake us up then: look again when it does.
            self.requeue_after(alloc.job_id, max(0.1, grace - waited + 0.1))

    async def _overdue_reason(
        self, decision: outcomes.FailedBeforeStart, pods: list[dict[str, Any]]
    ) -> str | None:
        """Why a pod has not started: its latest event if that is a Warning (FailedMount,
        FailedCreatePodSandBox, ...). None means wait on: the latest event is Normal (an image
        being pulled, or just pulled), there is none (a kubelet drops events under load; a node
        without a kubelet is node health's business), the pod has started meanwhile (the watch
        lags), or Kubernetes cannot be asked."""
        pod = next((p for p in pods if p["metadata"]["name"] == decision.overdue), None)
        uid = pod["metadata"].get("uid") if pod is not None else None
        try:
            event = await self.kube.latest_pod_event(decision.overdue, uid, reasons=BLOCKING_EVENTS)
            if event is None or event[0] != "Warning":
                return None
            live = await self.kube.get_pod(decision.overdue)
        except BridgeError as error:
            # The API server is not answering: the cached pod may be stale too (the kubelet
            # cannot report either). Judge it once Kubernetes answers again.
            log.warning("pod.events_unreadable", pod=decision.overdue, error=repr(error))
            return None
        if live is None or outcomes.not_started_for_s(outcomes.pod_view(live), datetime.now(UTC)) is None:
            return None
        _, reason, message = event
        return f"{decision.reason}: {reason}: {message}" if message else f"{decision.reason}: {reason}"

    # -- actions -------------------------------------------------------------------
    async def _create(self, session: JobSession, alloc: JobAllocation, skip: set[str], bound: Any) -> None:
        assert session.payload is not None
        part = self.cfg.partition(alloc.partition)
        if part is None:
            await self._fail(session, alloc, f"partition {alloc.partition} is not bridged", bound)
            return
        k8s_nodes = None
        if part.node_label and self.nodes is not None and self.nodes.synced.is_set():
            k8s_nodes = self.nodes.by_label(part.node_label)  # the node watch's index: no list
        elif part.node_label:
            k8s_nodes = await self.kube.nodes_by_label(part.node_label)
        groups = await self.groups.of(alloc)
        home = (await self.groups.resolve(alloc)).home  # the same NSS answer, cached
        try:
            strict: set[str] = set()
            if self.cfg.pods.supplemental_groups_policy == "auto":
                strict = await self.strict_groups.among(kubernetes_node_names(alloc, part, k8s_nodes))
            directives = parse_directives(session.payload.script)
            secret, manifests = desired_objects(
                alloc, session.payload, directives, part, self.cfg, k8s_nodes,
                supplemental_groups=groups, strict_groups_nodes=strict, home=home)
        except (DirectiveError, TranslateError) as error:
            await self._fail(session, alloc, str(error), bound)
            return
        # First: the pods mount it and import its variables (the same every time: a restart that
        # creates the rest of the pods finds it there).
        secret_name = secret["metadata"]["name"]
        session.payload_secret = secret_name
        try:
            await self._ensure_payload_secret(secret, bound)
        except KubeRejected as error:
            if not _refuses_the_job(error):
                raise
            await self._fail(session, alloc, f"Kubernetes refused the job's script and environment "
                             f"(Secret {secret_name}): {error}", bound)
            return
        manifests = [m for m in manifests if m["metadata"]["name"] not in skip]
        names = [m["metadata"]["name"] for m in manifests]
        # Expected before the first request: its ADDED event may be applied before it returns.
        self.expectations.expect(names)
        for done, manifest in enumerate(manifests):
            try:
                created = await self.kube.create_pod(manifest)
            except KubeRejected as error:
                self.expectations.forget(names[done:])
                if not _refuses_the_job(error):
                    raise
                await self._fail(session, alloc, f"Kubernetes refused the job's pod: {error}", bound)
                return
            except BaseException:
                self.expectations.forget(names[done:])
                raise
            if created:
                self.metrics.inc("pods_created_total")
                bound.info("pod.created", pod=manifest["metadata"]["name"], node=manifest["spec"]["nodeName"])
        if not session.created and session.attached_at:
            self.metrics.observe("attach_to_pod_seconds", time.monotonic() - session.attached_at)
        session.created = True

    async def _stop(
        self, pods: list[dict[str, Any]], session: JobSession | None, alloc: JobAllocation | None, bound: Any
    ) -> None:
        """A run is over in Slurm, or its waiter asked to stop: remove its pods; once they are gone,
        tell the waiter, and end the session if Slurm shows the run over."""
        cancelled = session is not None and session.cancel_requested
        # The pods' own grace (termination_grace_s), as slurmstepd gives a step KillWait between
        # SIGTERM and SIGKILL: a script's TERM trap gets to clean up.
        grace = None
        state = _describe(alloc, run_of(pods[0]) if pods else session.run if session else None)
        for pod in pods:
            name = pod["metadata"]["name"]
            # No kubelet will ever confirm the end of a pod on a dead node: remove it at once.
            node = (pod.get("spec") or {}).get("nodeName") or ""
            stopped = _containers_stopped(pod) or self.node_is_dead(node)
            if pod["metadata"].get("deletionTimestamp") and not stopped:
                continue  # the kubelet is stopping it
            # Once its containers have stopped, removing the object at once is safe: nothing
            # runs any more, and it saves the kubelet's volume clean-up from the waiter's wait.
            if await self.kube.delete_pod(name, 0 if stopped else grace):
                self.metrics.inc("pods_deleted_total")
                bound.info("pod.deleted", pod=name, slurm_state=state)
        if session is not None and pods and all(_containers_stopped(p) for p in pods):
            # How the script ended (a TERM trap may exit 0): the batch step reports that, as
            # natively, once the pods are gone.
            ended = outcomes.job_outcome(pods, len(pods), now=datetime.now(UTC), wait_for_all=True)
            if isinstance(ended, outcomes.Finished):
                session.stopped_with = (ended.exit_code, ended.signal)
        if session is None or pods:
            return  # the waiter leaves only once the pods are gone: Slurm frees what they used
        # A cancel needs no word: slurmstepd writes its own "*** JOB ... CANCELLED ***" line, as
        # for a native job, and anything more would differ from native output.
        reason = "" if cancelled else f"this run of the job is over ({state})"
        code, signum = session.stopped_with or (0, 15)
        event = {"type": "exit", "code": code, "signal": signum, "reason": reason}
        run_over = alloc is None or _over(alloc) or alloc.run != session.run
        if run_over:
            bound.info("session.ended", slurm_state=state)
            self.metrics.inc("sessions_ended_total")
            self.sessions.end(session, event)
        else:
            session.finish(event)  # kept (and re-sent on re-attach) until Slurm shows the run over

    async def _ensure_payload_secret(self, secret: dict[str, Any], bound: Any) -> None:
        """The Secret exists once this returns: made now, or already there (the same content, by
        its name). Once per Secret and daemon: an array's tasks share one."""
        name = secret["metadata"]["name"]
        if self._known_secret(name):
            return
        async with self._secret_lock(name):  # never while the sweep decides about it
            if self._known_secret(name):  # made by the job that held the lock before us
                return
            if await self.kube.create_secret(secret):
                bound.info("secret.created", secret=name)
            self.payload_secrets[name] = time.monotonic()

    def _known_secret(self, name: str) -> bool:
        """Made or found a moment ago: an array's burst of tasks sends one request. Trusted only
        for SECRET_KNOWN_S, so one deleted behind the daemon's back is made again soon."""
        seen = self.payload_secrets.get(name)
        return seen is not None and time.monotonic() - seen < SECRET_KNOWN_S

    @contextlib.asynccontextmanager
    async def _secret_lock(self, name: str) -> AsyncIterator[None]:
        """One Secret's lock, kept while anyone holds or waits for it."""
        lock, users = self._secret_locks.get(name, (asyncio.Lock(), 0))
        self._secret_locks[name] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._secret_locks[name]
            if users == 1:
                del self._secret_locks[name]
            else:
                self._secret_locks[name] = (lock, users - 1)

    def _secrets_in_use(self) -> set[str]:
        """Payload Secrets that a cached pod or a live session names."""
        used = {s.payload_secret for s in self.sessions if s.payload_secret}
        for job_id in self.cache.job_ids():
            used.update(filter(None, map(payload_secret_of, self.cache.pods_of(job_id))))
        return used

    async def sweep_payload_secrets(self, selector: str) -> int:
        """Delete the payload Secrets that no cached pod and no session names, made over
        SECRET_SWEEP_MIN_AGE_S ago. A job that starts later with the same script and environment
        (an array's next task) makes its Secret again. Returns how many went."""
        now = datetime.now(UTC)
        removed = 0
        listed = await self.kube.secrets_metadata(selector)
        existing = {meta.get("name") for meta in listed}
        self.payload_secrets = {name: seen for name, seen in self.payload_secrets.items()
                                if name in existing and time.monotonic() - seen < SECRET_KNOWN_S}
        used = self._secrets_in_use()
        for meta in listed:
            name, created = meta.get("name"), outcomes.parse_time(meta.get("creationTimestamp"))
            if not isinstance(name, str) or created is None or name in used:
                continue
            if (now - created).total_seconds() < SECRET_SWEEP_MIN_AGE_S:
                continue
            async with self._secret_lock(name):
                # Asked again under the lock: a job may have come for it since the list.
                if any(s.payload_secret == name for s in self.sessions):
                    continue
                self.payload_secrets.pop(name, None)
                # Only the listed incarnation: one made again meanwhile stays.
                try:
                    deleted = await self.kube.delete_secret(name, uid=meta.get("uid"))
                except BridgeError as error:  # this one next time; the others now
                    log.warning("secret.sweep_failed", secret=name, error=repr(error))
                    continue
                if deleted:
                    removed += 1
                    log.info("secret.swept", secret=name)
        return removed

    async def _fail(self, session: JobSession, alloc: JobAllocation, reason: str, bound: Any) -> None:
        """The script could not run: tell the user where they look, end the job non-zero."""
        bound.warning("job.failed_before_start", reason=reason)
        self.metrics.inc("jobs_failed_before_start_total")
        session.finish({"type": "exit", "code": EXIT_CODE_NOT_STARTED, "signal": None, "reason": reason})
        try:
            await self.slurm.set_comment(alloc.job_id, f"slurm-k8s-bridge: {reason}"[:1000])
        except Exception as error:  # the comment is a courtesy; the exit code carries the failure
            bound.warning("slurm.comment_failed", error=repr(error))
        for pod in self.cache.pods_of(alloc.job_id):
            if run_of(pod) == session.run:
                await self.kube.delete_pod(pod["metadata"]["name"], 0)

    # -- logs ------------------------------------------------------------------------
    def _ensure_log_relays(self, session: JobSession, pods: list[dict[str, Any]]) -> None:
        if not session.attached:
            return
        for pod in _with_output(pods):
            name = pod["metadata"]["name"]
            if name in session.log_tasks or name in session.logs_done or not _container_started(pod):
                continue
            index = node_index_of(pod) or 0
            session.log_tasks[name] = asyncio.create_task(
                self._relay_logs(session, name, index), name=f"logs:{name}"
            )

    def _logs_drained(self, session: JobSession, pods: list[dict[str, Any]]) -> bool:
        if not session.attached:
            return False
        return all(pod["metadata"]["name"] in session.logs_done
                   for pod in _with_output(pods) if _container_started(pod))

    async def _relay_logs(self, session: JobSession, pod_name: str, index: int) -> None:
        """Relay one pod's log to the waiter until its container has terminated and every line is out.

        A stream can end, or stall (stream_logs has a read deadline), while the container still runs:
        the kubelet or API server restarted, a half-open connection. Then the relay resumes after the
        last line it relayed (stream_logs yields only lines after `since`, so nothing is printed
        twice). It is done after a read that began once the container had terminated and ran to
        its end: only such a read is sure to have every line.
        """
        bound = log.bind(job_id=session.job_id, pod=pod_name)
        pauses = failures_after_end = not_found = 0
        while True:
            pod = self.cache.get(pod_name)
            if pod is None:
                break  # deleted: nothing left to read
            ended = _container_terminated(pod)
            framed = _annotation(pod, wellknown.ANNOTATION_OUTPUT) == wellknown.OUTPUT_FRAMED
            since = session.last_log.get(str(index))
            try:
                async for stamp, line in self.kube.stream_logs(pod_name, since_time=since):
                    session.last_log[str(index)] = stamp
                    event = (_output_event(index, stamp, line) if framed else
                             {"type": "log", "pod": index, "ts": stamp, "line": line})
                    if event["type"] == "step":
                        self._register_step(session, event, bound)
                    elif event["type"] == "step-signal":
                        _check_step_signal(session, event, bound)
                    await session.publish_output(event)
                    self.metrics.inc("log_lines_total")
                    pauses = 0
            except asyncio.CancelledError:
                raise
            except PermanentError as error:  # the pod is gone, or its log can never be read
                # ... unless it is a 404 for a pod the watch still has: a fresh pod the API
                # server's cache does not show yet. Asked again, a few times.
                if not (isinstance(error, KubeNotFound) and self.cache.get(pod_name) is not None
                        and not_found < LOG_NOT_FOUND_ATTEMPTS):
                    bound.warning("logs.unavailable", error=repr(error))
                    break
                not_found += 1
                bound.info("logs.not_found_yet", error=repr(error), attempt=not_found)
            except Exception as error:
                if ended:
                    failures_after_end += 1
                    if failures_after_end >= LOG_ATTEMPTS_AFTER_END:
                        bound.warning("logs.unavailable", error=repr(error), attempts=failures_after_end)
                        break
                bound.info("logs.resuming", error=repr(error), container_ended=ended)
            else:
                if ended:
                    break
            self.metrics.inc("log_relay_resumes_total")
            await asyncio.sleep(LOG_RESUME_DELAYS_S[min(pauses, len(LOG_RESUME_DELAYS_S) - 1)])
            pauses += 1
        session.log_tasks.pop(pod_name, None)
        session.logs_done.add(pod_name)
        self.requeue(session.job_id)


SIGNALS_FOR_SRUN = frozenset(int(s) for s in (
    signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
    signal.SIGALRM, signal.SIGCONT))
"""What the script's srun passes on to Slurm's srun of its step (native srun acts on these)."""


def _check_step_signal(session: JobSession, event: dict[str, Any], bound: Any) -> None:
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


def _output_event(index: int, stamp: str, line: str) -> dict[str, Any]:
    """One log line of the in-pod agent as the waiter's event: "o <base64>" is the script's stdout,
    "e <base64>" its stderr (passed on still encoded: the waiter writes the bytes). Anything else
    is the agent's own complaint (it could not start the script), a line of stderr."""
    tag, sep, data = line.partition(" ")
    if sep and tag in ("o", "e"):
        return {"type": "out", "pod": index, "ts": stamp, "fd": 1 if tag == "o" else 2, "data": data}
    if sep and tag == "s" and index == 0:
        return {"type": "step", "pod": index, "ts": stamp, "data": data}
    if sep and tag == "k" and index == 0:
        return {"type": "step-signal", "pod": index, "ts": stamp, "data": data}
    text = base64.b64encode((line + "\n").encode("utf-8", "surrogateescape")).decode()
    return {"type": "out", "pod": index, "ts": stamp, "fd": 2, "data": text}


def _runs_agent(pod: dict[str, Any]) -> bool:
    return _annotation(pod, wellknown.ANNOTATION_OUTPUT) == wellknown.OUTPUT_FRAMED


def _with_output(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pods whose logs carry the job's output: with the agent only the first node's (the
    others hold their node and print nothing), else every pod's; none of a simulated partition."""
    return [p for p in pods if _annotation(p, wellknown.ANNOTATION_OUTPUT) != wellknown.OUTPUT_NONE
            and (not _runs_agent(p) or (node_index_of(p) or 0) == 0)]


def _refuses_the_job(error: KubeRejected) -> bool:
    """A refusal of this job's object (invalid, too big, an admission policy or quota, 403): asking
    again would not help, so the job ends with the reason. Not the bridge's credentials (401):
    every job would fail while a token is renewed; those keep waiting, and the log says why."""
    return error.status != 401 and not isinstance(error, KubeConflict)


def _annotation(pod: dict[str, Any], key: str) -> str | None:
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(key)
    return value if isinstance(value, str) else None


def _over(alloc: JobAllocation) -> bool:
    """Slurm shows the job's current run over (or ending: COMPLETING)."""
    return alloc.state not in LIVE_STATES or "COMPLETING" in alloc.state_flags


def _describe(alloc: JobAllocation | None, run: int | None) -> str:
    """The Slurm state that ends a run, for logs and the waiter."""
    if alloc is None:
        return "gone"
    if run is not None and run != alloc.run:
        return f"requeued (now run {alloc.run})"
    return alloc.state


def _restart_count(payload: JobPayload) -> int:
    value = payload.environment.get("SLURM_RESTART_COUNT", "0")
    with contextlib.suppress(ValueError):
        return max(0, int(value))
    return 0


def _job_container(pod: dict[str, Any]) -> dict[str, Any]:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == wellknown.CONTAINER_NAME:
            return status.get("state") or {}
    return {}


def _container_finished_at(pods: list[dict[str, Any]]) -> datetime | None:
    """When the first node's job container ended (the API's one-second resolution)."""
    for pod in pods:
        if (node_index_of(pod) or 0) == 0:
            terminated = _job_container(pod).get("terminated")
            if isinstance(terminated, dict):
                return outcomes.parse_time(terminated.get("finishedAt"))
    return None


def _signal_done(session: JobSession, signum: int, seq: int) -> None:
    """Tell the waiter the batch script's `signum` (taken as `seq`, and the older ones of its
    kind) needs keeping no longer: delivered, or never deliverable."""
    session.publish({"type": "signal-done", "signal": signum, "seq": seq})


def _script_running_for_s(pod: dict[str, Any]) -> float:
    """How long the job container has run (0 when it does not run)."""
    running = _job_container(pod).get("running")
    if not isinstance(running, dict):
        return 0.0
    started = outcomes.parse_time(running.get("startedAt"))
    return 0.0 if started is None else (datetime.now(UTC) - started).total_seconds()


def _container_running(pod: dict[str, Any]) -> bool:
    return "running" in _job_container(pod)


def _container_started(pod: dict[str, Any]) -> bool:
    state = _job_container(pod)
    return "running" in state or "terminated" in state


def _container_terminated(pod: dict[str, Any]) -> bool:
    phase = (pod.get("status") or {}).get("phase")
    return phase in ("Succeeded", "Failed") or "terminated" in _job_container(pod)


def _longest_unstarted_s(pods: list[dict[str, Any]]) -> float | None:
    """How long the longest-waiting pod that has not started yet has waited (None: all started)."""
    now = datetime.now(UTC)
    waits = [w for pod in pods if (w := outcomes.not_started_for_s(outcomes.pod_view(pod), now)) is not None]
    return max(waits) if waits else None


def _containers_stopped(pod: dict[str, Any]) -> bool:
    """The pod ran and every container of it has terminated (nothing uses its resources)."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return True
    statuses = status.get("containerStatuses") or []
    return bool(statuses) and all("terminated" in (c.get("state") or {}) for c in statuses)
