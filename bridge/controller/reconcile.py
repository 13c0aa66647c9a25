"""reconcile(job_id): make Kubernetes match what Slurm says about one job.

Level-triggered: whatever woke us up, re-read the Slurm view, the cached pods and the waiters'
sessions, then act. Every action is idempotent, so running it twice, or after a restart, is
harmless (pod names are deterministic, a create that finds the pod already there is success, a
delete of a missing pod too). A pass returns the Result it wants (a look later, for a deadline no
event will announce); the worker schedules it.

The reconciler owns no state of its own; it orchestrates the subsystems that do:
- the job store (controller.jobstore): the newest Slurm view per job, versioned. An absence there is
  only a hint: before anything is stopped for it, the store asks Slurm about that one job;
- the session registry (controller.sessions): one session per run (job id + restart count). The runs
  that Slurm shows over are ended here and dropped;
- the pod cache, plus create expectations (controller.expectations): a pod created but not yet seen
  by the cache is neither missing nor created twice;
- pod creation (controller.pod_creation) and payload Secrets (controller.payload_secrets);
- the GPU claims of pods in `dra` partitions, and their binding (controller.device_claims);
- the log relay (controller.log_relay), srun steps (controller.steps), batch signals
  (controller.batch_signals) and the tasks of steps (controller.tasks, controller.step_streams);
- the steps users start themselves, and the allocations without a script they open
  (controller.user_steps); suspend and resume in the pods (controller.suspension);
- the jobs of gangs of Kubernetes pods from managed namespaces (controller.kube_workloads), which
  bind those pods instead of creating any.
The API reaches them through the narrow methods of controller.facade.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog

from bridge.clients.kube.actions import KubeActions
from bridge.clients.kube.cache import PodCache
from bridge.clients.kube.nodes import NodeCache
from bridge.clients.slurm import SlurmClient
from bridge.controller.batch_signals import BatchSignals
from bridge.controller.device_claims import DeviceClaims
from bridge.controller.early_endings import HELD_NODE_RETRY_S, EarlyEndings
from bridge.controller.expectations import CreateExpectations
from bridge.controller.facade import ApiFacade, over
from bridge.controller.jobstore import JobStore
from bridge.controller.kube_workloads import KubeWorkloads
from bridge.controller.log_relay import LogRelay
from bridge.controller.metrics import Metrics
from bridge.controller.payload_secrets import PayloadSecrets
from bridge.controller.pod_creation import PodCreation
from bridge.controller.run_pods import RunPods
from bridge.controller.sessions import JobSession, SessionRegistry
from bridge.controller.step_streams import StepStreams
from bridge.controller.steps import Steps, read_step_key
from bridge.controller.suspension import Suspension
from bridge.controller.tasks import Tasks
from bridge.controller.user_steps import UserSteps
from bridge.controller.workqueue import DONE, Result
from bridge.core import outcome as outcomes
from bridge.core.agent_protocol import ScriptEnding
from bridge.core.config import BridgeConfig
from bridge.core.errors import BridgeError
from bridge.core.model import JobAllocation
from bridge.core.pod_identity import pod_name, run_of
from bridge.core.pod_view import PodView, parse_time, pod_view

log = structlog.get_logger(__name__)

EXIT_CODE_NOT_STARTED = 1
"""The exit code of a run whose script never ran (the reason goes to its stderr and comment)."""
COMMENT_TIMEOUT_S = 5.0
"""How long a failed run's end waits for the reason to be set as its job's comment."""
BLOCKING_EVENTS = frozenset({
    "FailedMount", "FailedAttachVolume", "FailedMapVolume", "FailedCreatePodSandBox",
    "FailedCreatePodContainer", "FailedScheduling", "Failed", "BackOff", "InspectFailed",
    "ErrImageNeverPull", "NetworkNotReady", "FailedPodSandBoxStatus", "UnexpectedAdmissionError",
    "FailedPrepareDynamicResources",
})
"""Warning events that keep a pod from starting (others, e.g. MissingClusterDNS, do not)."""


class Reconciler(ApiFacade):
    """Wires the state owners and subsystems of one daemon, and reconciles one job at a time
    (the work queue's workers call `reconcile`; the API calls the ApiFacade's methods)."""

    def __init__(
        self,
        cfg: BridgeConfig,
        slurm: SlurmClient,
        kube: KubeActions,
        cache: PodCache,
        metrics: Metrics,
        wake: Callable[[int], None],
        *,
        jobs: JobStore | None = None,
        expectations: CreateExpectations | None = None,
        nodes: NodeCache | None = None,
        node_is_dead: Callable[[str], bool] | None = None,
    ) -> None:
        """`wake(job_id)` queues the job: a log relay that ended calls it (an event, as a pod's)."""
        self.cfg = cfg
        self.slurm = slurm
        self.kube = kube
        self.cache = cache
        self.metrics = metrics
        # The API's clock has one-second resolution: a second of slack.
        self.started_at = datetime.now(UTC) - timedelta(seconds=1)
        self.jobs = jobs if jobs is not None else JobStore(slurm)
        """The versioned Slurm view (the poller and attaches write it; reconcile only reads)."""
        self.sessions = SessionRegistry()
        self.expectations = expectations if expectations is not None else CreateExpectations()
        cache.on_seen(self.expectations.observed)
        self.pods = RunPods(self.jobs, cache)
        self.payload_secrets = PayloadSecrets(kube, cache, self.sessions)
        self.creation = PodCreation(cfg, kube, metrics, self.expectations, self.payload_secrets, nodes)
        self.early_endings = EarlyEndings(cache)
        self.device_claims = DeviceClaims(cfg, kube, cache, metrics)
        self.steps = Steps(kube, self.pods, self.sessions, read_step_key(cfg.waiter.step_key_file),
                           self._spawn, self.volumes_of)
        self.batch_signals = BatchSignals(kube, self.pods)
        self.log_relay = LogRelay(kube, cache, metrics, self.steps, wake)
        self.tasks = Tasks(kube, self)
        self.user_steps = UserSteps(cfg, self.jobs, self.pods, self.sessions, wake)
        self.suspension = Suspension(kube, metrics)
        self.step_streams = StepStreams(kube, self)
        self._background: set[asyncio.Future[None]] = set()
        self.workloads: KubeWorkloads | None = None
        """The Kubernetes-submitted path, when managed namespaces are configured (the daemon sets it)."""
        self.node_is_dead = node_is_dead or (lambda _name: False)
        """True for a Kubernetes node that is gone or not Ready past the grace: no kubelet there
        will confirm a pod's end, so its pods are removed without waiting (node health sync)."""

    def _spawn(self, work: Awaitable[None]) -> None:
        """Work nobody awaits (it logs its own failure), kept referenced until it ends."""
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- the loop body ---------------------------------------------------------
    async def reconcile(self, job_id: int) -> Result:
        self.metrics.inc("reconciles_total")
        bound = log.bind(job_id=job_id)
        view = self.jobs.get(job_id)
        pods = self.cache.pods_of(job_id)
        sessions = self.sessions.of_job(job_id)
        workloads = self.workloads
        if view is None or not view.listed:
            theirs = workloads is not None and workloads.cache.of_job(job_id)
            if not pods and not sessions and not theirs:
                return DONE  # nothing of ours: an absence needs no confirmation
            # Absence alone never stops anything: ask Slurm about this one job first.
            self.metrics.inc("slurm_confirm_reads_total")
            view = await self.jobs.refresh(job_id)
            bound.info("slurm.absence_checked", gone=view.alloc is None,
                       state=view.alloc.state if view.alloc else None)
        alloc = view.alloc
        if workloads is not None and workloads.owns(job_id, alloc):
            return await workloads.reconcile_job(job_id, alloc)  # a gang of Kubernetes pods
        current = None if alloc is None or over(alloc) else alloc.run

        # Every run but a live current one is over: its pods go, then its session ends.
        by_run: dict[int, list[dict[str, Any]]] = {}
        for pod in pods:
            by_run.setdefault(run_of(pod), []).append(pod)
        runs = set(by_run) | {s.run for s in sessions}
        for run in sorted(runs - {current} if current is not None else runs):
            session = self.sessions.get(job_id, run)
            await self._stop(by_run.get(run, []), session, alloc, bound.bind(run=run))
        if current is None:
            return DONE
        assert alloc is not None
        run_pods = by_run.get(current, [])
        session = self.sessions.get(job_id, current)
        if session is not None and session.cancel_requested:
            await self._stop(run_pods, session, alloc, bound.bind(run=current))
            return DONE
        views = [pod_view(pod) for pod in run_pods]
        suspended = alloc.state == "SUSPENDED"
        if suspended or any(view.suspend_mark for view in views):
            # Slurm stopped (or continued) the job: its processes are in the pods.
            retry = await self.suspension.follow(suspended, views, bound.bind(run=current))
            if suspended:
                return DONE.sooner(retry)
        if alloc.state != "RUNNING":
            return DONE  # pending: the waiter attaches once Slurm starts the job
        if session is None or session.payload is None:
            return DONE  # pods, if any, keep running; the waiter will attach and tell us what to do
        if session.final is not None:
            return DONE
        return await self._run(session, alloc, run_pods, bound.bind(run=current))

    async def _run(
        self, session: JobSession, alloc: JobAllocation, pods: list[dict[str, Any]], bound: Any
    ) -> Result:
        """The current run is live and its waiter attached: create, watch, decide its outcome."""
        names = [pod_name(alloc.job_id, i, alloc.run) for i in range(len(alloc.nodes))]
        views = [pod_view(pod) for pod in pods]
        present = {view.name for view in views}
        expected = self.expectations.pending(n for n in names if n not in present)
        result = DONE
        if expected:
            # Created, not in the cache yet: neither gone nor to be created again. Look again
            # when the expectation expires, in case no event ever comes.
            result = result.sooner(max(expected.values()) + 0.1)
        if not views:
            if expected:
                return result
            if session.created:
                await self._fail(session, alloc, "the job's pods were deleted outside Slurm", bound)
                return result
            return result.sooner(await self._create(session, alloc, set(), bound))
        session.created = True
        if len(present) + len(expected) < len(names):
            # The first pod went alone (the others wait for its address) or creation was
            # interrupted (restart mid-way): create the rest, idempotently.
            first = next((view for view in views if view.name == names[0]), None)
            result = result.sooner(await self._create(
                session, alloc, present | set(expected), bound, first.pod_ip if first else "",
                first is not None and first.stopped))

        part = self.cfg.partition(alloc.partition)
        if part is not None and (part.gpu_mode == "dra" or any(view.binds_to for view in views)):
            # Pods with GPUs wait unbound until their claims hold exactly Slurm's devices.
            prepared = await self.device_claims.prepare(session, alloc, part, views, bound)
            if isinstance(prepared, str):
                await self._fail(session, alloc, prepared, bound)
                return result
            if prepared is not None:
                result = result.sooner(prepared)

        grace = self.cfg.start_failure_grace_s
        # Like srun: wait for every rank, then the highest non-zero exit code wins (deciding at the
        # first failure would make the code depend on which rank happened to end first).
        batch_only = any(view.runs_agent for view in views)
        decision = outcomes.job_outcome(
            views, len(alloc.nodes), now=datetime.now(UTC), grace_s=grace, wait_for_all=True,
            batch_only=batch_only, calm_since=self.cache.trouble_at,
        )
        told = session.logs.ending
        if isinstance(decision, outcomes.Running) and batch_only and told is not None:
            # The agent's "x" frame, before the kubelet's status (early_endings.py).
            batch_pod = next((view for view in views if view.name == told[0] and view.index == 0), None)
            if batch_pod is not None and (early := outcomes.told_outcome(batch_pod, told[2])) is not None:
                decision = early
                if session.final is None and self.log_relay.drained(session, views):
                    self.metrics.inc("batch_ends_told_by_agent_total")
        self.log_relay.ensure(session, views)
        if not session.script_delivered:
            await self.creation.deliver_script(session, views, bound)
        if session.signals:
            result = result.sooner(await self.batch_signals.deliver(session, bound))
        if isinstance(decision, outcomes.FailedBeforeStart) and decision.overdue:
            reason = await self._overdue_reason(decision, views)
            if reason is None:
                # Progress, or nothing known: look again a grace period later (not every few
                # seconds: each look lists the pod's events).
                return result.sooner(grace)
            await self._fail(session, alloc, reason, bound)
        elif isinstance(decision, outcomes.FailedBeforeStart):
            await self._fail(session, alloc, decision.reason, bound)
        elif isinstance(decision, outcomes.Finished):
            if self.log_relay.drained(session, views):
                self._finish(session, decision, views, bound)
        elif (waited := _longest_unstarted_s(views, self.cache.trouble_at)) is not None:
            # The start deadline (or a retried start error's grace) runs out without any pod
            # event to wake us up then: look again when it does.
            result = result.sooner(max(0.1, grace - waited + 0.1))
        return result

    def _finish(
        self, session: JobSession, decision: outcomes.Finished, views: list[PodView], bound: Any
    ) -> None:
        """The script ended and every line of its output is out: tell the waiter how."""
        ended = _batch_finished_at(views, session.logs.ending)
        took = None
        # Only ends this process lived through: after a restart, old ends would count.
        if ended is not None and session.final is None and ended >= self.started_at:
            took = (datetime.now(UTC) - ended).total_seconds()
            self.metrics.observe("pod_end_to_job_end_seconds", took)
        bound.info("job.finished", exit_code=decision.exit_code, signal=decision.signal,
                   pod_end_to_job_end_s=None if took is None else round(took, 3))
        # Its pods still run in their kubelets' eyes (the ending came first, other nodes' pods
        # are deleted only now): their nodes take no other pod until they stop.
        self.early_endings.record(views)
        # An exit code or a kill by signal speaks for itself (native Slurm prints nothing
        # either: sacct shows it); what native Slurm would not do (OOM kills, time limits,
        # Kubernetes evicting a pod) gets a line in the job's stderr.
        explain = decision.oom_killed or decision.timed_out or decision.by_kubernetes
        session.finish({
            "type": "exit", "code": decision.exit_code, "signal": decision.signal,
            "reason": decision.reason if explain else "",
        })

    async def _overdue_reason(self, decision: outcomes.FailedBeforeStart, views: list[PodView]) -> str | None:
        """Why a pod has not started: its latest event if that is a Warning (FailedMount,
        FailedCreatePodSandBox, ...). None means wait on: the latest event is Normal (an image
        being pulled, or just pulled), there is none (a kubelet drops events under load; a node
        without a kubelet is node health's business), the pod has started meanwhile (the watch
        lags), or Kubernetes cannot be asked."""
        pod = next((view for view in views if view.name == decision.overdue), None)
        uid = (pod.uid or None) if pod is not None else None
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
        if live is None or outcomes.not_started_for_s(pod_view(live), datetime.now(UTC)) is None:
            return None
        _, reason, message = event
        return f"{decision.reason}: {reason}: {message}" if message else f"{decision.reason}: {reason}"

    # -- actions -------------------------------------------------------------------
    async def _create(
        self, session: JobSession, alloc: JobAllocation, skip: set[str], bound: Any, first_pod_ip: str = "",
        first_pod_ended: bool = False,
    ) -> float | None:
        """Create the run's pods (pod_creation), once no early-ended pod holds their nodes in its
        kubelet's eyes; else the delay after which to look again."""
        if len(self.early_endings):
            nodes = await self.creation.kubernetes_node_names_of(alloc)
            held, first = self.early_endings.hold(alloc.job_id, nodes)
            if held:
                if first:
                    bound.info("pods.wait_for_ended_pods", held=held)
                    self.metrics.inc("pod_creations_held_total")
                return HELD_NODE_RETRY_S
        failure = await self.creation.create(session, alloc, skip, bound, first_pod_ip, first_pod_ended)
        if failure is not None:
            await self._fail(session, alloc, failure, bound)
        return None

    async def _stop(
        self, pods: list[dict[str, Any]], session: JobSession | None, alloc: JobAllocation | None, bound: Any
    ) -> None:
        """A run is over in Slurm, or its waiter asked to stop: remove its pods; once they are gone,
        tell the waiter, and end the session if Slurm shows the run over."""
        cancelled = session is not None and session.cancel_requested
        if session is not None and pods:
            session.tell_stopping()  # before the pods get their TERM
        # The pods' own grace (termination_grace_s), as slurmstepd gives a step KillWait between
        # SIGTERM and SIGKILL: a script's TERM trap gets to clean up.
        grace = None
        views = [pod_view(pod) for pod in pods]
        state = describe(alloc, views[0].run if views else session.run if session else None)
        if any(view.suspend_mark for view in views):
            # As slurmd continues a suspended job before it signals it: the TERM trap runs.
            await self.suspension.follow(False, [view for view in views if view.suspend_mark], bound)
        for pod in views:
            # No kubelet will ever confirm the end of a pod on a dead node: remove it at once.
            stopped = pod.stopped or self.node_is_dead(pod.node_name)
            if pod.deleting and not stopped:
                continue  # the kubelet is stopping it
            # Once its containers have stopped, removing the object at once is safe: nothing
            # runs any more, and it saves the kubelet's volume clean-up from the waiter's wait.
            if await self.kube.delete_pod(pod.name, 0 if stopped else grace):
                self.metrics.inc("pods_deleted_total")
                bound.info("pod.deleted", pod=pod.name, slurm_state=state)
        if session is not None and views and all(view.stopped for view in views):
            # How the script ended (a TERM trap may exit 0): the batch step reports that, as
            # natively, once the pods are gone.
            ended = outcomes.job_outcome(views, len(views), now=datetime.now(UTC), wait_for_all=True)
            if isinstance(ended, outcomes.Finished):
                session.stopped_with = (ended.exit_code, ended.signal)
        if session is None or pods:
            return  # the waiter leaves only once the pods are gone: Slurm frees what they used
        # A cancel needs no word: slurmstepd writes its own "*** JOB ... CANCELLED ***" line, as
        # for a native job, and anything more would differ from native output. Slurm's watch may
        # show such an end before the waiter's cancel request arrives.
        told_by_slurmstepd = (alloc is not None and alloc.run == session.run
                              and alloc.state in SLURMSTEPD_TELLS)
        reason = "" if cancelled or told_by_slurmstepd else f"this run of the job is over ({state})"
        code, signum = session.stopped_with or (0, 15)
        event = {"type": "exit", "code": code, "signal": signum, "reason": reason}
        run_over = alloc is None or over(alloc) or alloc.run != session.run
        if run_over:
            bound.info("session.ended", slurm_state=state)
            self.metrics.inc("sessions_ended_total")
            self.sessions.end(session, event)
            self.tasks.forget_job(session.job_id)
        else:
            session.finish(event)  # kept (and re-sent on re-attach) until Slurm shows the run over

    async def _fail(self, session: JobSession, alloc: JobAllocation, reason: str, bound: Any) -> None:
        """The script could not run: tell the user where they look, end the job non-zero."""
        bound.warning("job.failed_before_start", reason=reason)
        self.metrics.inc("jobs_failed_before_start_total")
        # The comment first: once the waiter is told, the job ends, and whoever looks at its
        # record then must find the reason there (a CI run read it before a later comment landed).
        try:
            async with asyncio.timeout(COMMENT_TIMEOUT_S):
                await self.slurm.set_comment(alloc.job_id, f"slurm-k8s-bridge: {reason}"[:1000])
        except Exception as error:  # the comment is a courtesy; the exit code carries the failure
            bound.warning("slurm.comment_failed", error=repr(error))
        session.finish({"type": "exit", "code": EXIT_CODE_NOT_STARTED, "signal": None, "reason": reason})
        for pod in self.cache.pods_of(alloc.job_id):
            if run_of(pod) == session.run:
                await self.kube.delete_pod(pod["metadata"]["name"], 0)


SLURMSTEPD_TELLS = frozenset({"CANCELLED", "TIMEOUT", "PREEMPTED", "DEADLINE"})
"""Ends of a run whose "*** JOB ... CANCELLED ... ***" line slurmstepd writes into the job's output
itself, as for a native job."""


def describe(alloc: JobAllocation | None, run: int | None) -> str:
    """The Slurm state that ends a run, for logs and the waiter."""
    if alloc is None:
        return "gone"
    if run is not None and run != alloc.run:
        return f"requeued (now run {alloc.run})"
    return alloc.state


def _batch_finished_at(views: list[PodView], told: tuple[str, str, ScriptEnding] | None) -> datetime | None:
    """When the first node's script ended: its agent's last log line (nanoseconds), else its job
    container's end (the API's one-second resolution)."""
    if told is not None:
        return parse_time(told[1])
    for view in views:
        if view.index == 0 and view.terminated is not None:
            return view.terminated.finished_at
    return None


def _longest_unstarted_s(views: list[PodView], calm_since: datetime | None) -> float | None:
    """How long the longest-waiting pod that has not started yet has waited (None: all started),
    counted from the API server's last trouble if that was later (job_outcome's calm_since)."""
    now = datetime.now(UTC)
    waits = [w for view in views if (w := outcomes.not_started_for_s(view, now)) is not None]
    if not waits:
        return None
    calm = (now - calm_since).total_seconds() if calm_since is not None else max(waits)
    return min(max(waits), calm)
