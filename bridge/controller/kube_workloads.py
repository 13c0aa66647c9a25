"""The Kubernetes-submitted path: pods of managed namespaces wait in Slurm's queue as one job per gang,
start where Slurm placed them, and end in sacct with their real outcome.

Two halves:
- `reconcile_gang(key)` (its own work queue, keyed by gang): gangs into jobs, in
  controller.workload_gangs (the owner of which gangs this daemon submitted or was refused).
- `reconcile_job(...)` (called by the reconciler for a job that is a gang's): while it pends, the pods
  say why (a PodScheduled condition and an event with Slurm's reason); once it runs and its waiter
  (the job's batch script, as for sbatch jobs) has attached, bind the pods to the nodes Slurm gave,
  and when every pod has ended, hand the waiter the highest exit code. Slurm ending the job (scancel,
  time limit, preemption) deletes the pods with their grace; their owner deleting them cancels it.
  Pods with GPU claims get Slurm's GPUs in their claims first (controller.workload_devices).
This module owns what the pods were told (each event and condition once per change), the pending
jobs' reads of their reason, and which jobs' pods this daemon is deleting.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import structlog

from bridge.clients.kube.workload_pods import WorkloadPodCache, WorkloadVerbs
from bridge.clients.slurm import SlurmClient
from bridge.controller.device_claims import DeviceClaims
from bridge.controller.early_endings import HELD_NODE_RETRY_S, EarlyEndings
from bridge.controller.facade import over
from bridge.controller.jobstore import JobStore
from bridge.controller.metrics import Metrics
from bridge.controller.sessions import JobSession, SessionRegistry
from bridge.controller.steps import read_step_key
from bridge.controller.workload_devices import DevicesRefused, DevicesWait, WorkloadDevices, waited_s
from bridge.controller.workload_gangs import MARK_GRACE_S, GangSubmission
from bridge.controller.workqueue import DONE, Result
from bridge.core import workloads as wl
from bridge.core.config import BridgeConfig, ConfigError
from bridge.core.model import JobAllocation
from bridge.core.translate import TranslateError, kubernetes_node_names
from bridge.core.workload_placement import place, task_shape

log = structlog.get_logger(__name__)

EXIT_NOT_STARTED = 1
DEVICES_RETRY_S = 0.5
REASON_FIRST_READ_S = 1.0
REASON_READS = 5
"""A pending job's own reads for Slurm's reason (1, 2, 4, 8, 16 s apart): bounded, never a poll."""


class KubeWorkloads:
    def __init__(
        self, cfg: BridgeConfig, slurm: SlurmClient, jobs: JobStore, sessions: SessionRegistry,
        cache: WorkloadPodCache, verbs: WorkloadVerbs, metrics: Metrics,
        kubernetes_nodes: Callable[[str], Any], devices: DeviceClaims, ended_runs: EarlyEndings | None = None,
    ) -> None:
        self.cfg = cfg
        self.slurm = slurm
        self.jobs = jobs
        self.sessions = sessions
        self.cache = cache
        self.verbs = verbs
        self.metrics = metrics
        self._kubernetes_nodes = kubernetes_nodes
        self.devices = devices
        self.ended_runs = ended_runs
        """The nodes batch runs that ended still hold in their kubelets (the reconciler's)."""
        """The cluster's ResourceSlices and ResourceClaims (the `dra` mode's caches)."""
        self.gpus = WorkloadDevices(devices, verbs, metrics, cache, cfg.workloads.namespaces)
        key = read_step_key(cfg.waiter.step_key_file)
        if key is None:
            raise ConfigError("[workloads.namespaces] needs waiter.step_key_file (it signs gangs' comments)")
        self.key = key
        """Signs the comments of gangs' jobs."""
        self.gangs = GangSubmission(self)
        self._told: dict[str, str] = {}
        """Pod uid → the last pending reason its condition and event carry."""
        self._reason_reads: dict[int, tuple[int, float]] = {}
        """Pending job → (its record's reads for a reason, when the next is due)."""
        self._owner_deleted: set[int] = set()
        """Jobs a pod of which its owner deleted: cancelled once no such pod runs."""
        self._stopping: set[int] = set()
        """Jobs whose pods this daemon deletes (their deletion is no owner's cancel)."""

    async def reconcile_gang(self, key: str) -> Result:
        return await self.gangs.reconcile_gang(key)

    def untell(self, uids: frozenset[str]) -> None:
        for uid in uids:
            self._told.pop(uid, None)

    async def tell(self, pod: wl.WorkloadPod, kind: str, reason: str, message: str,
                    condition: str | None = None) -> None:
        """An event (and, with `condition`, the PodScheduled condition) on the pod, once per change."""
        said = f"{reason}: {message}"
        if self._told.get(pod.uid) == said:
            return
        self._told[pod.uid] = said
        await self.verbs.event(pod, kind, reason, message)
        if condition is not None:
            await self.verbs.condition(pod, condition, message)

    # -- jobs of gangs ------------------------------------------------------------------------
    def owns(self, job_id: int, alloc: JobAllocation | None) -> bool:
        """The job is a gang's: the bridge submitted it (its comment), or pods are marked with it."""
        if alloc is not None:
            return self.gang_of(alloc) is not None
        # Gone from Slurm: pods marked with it are stopped here (only the bridge marks pods, and
        # stopping a forged mark's pod hurts only its author).
        return bool(self.cache.of_job(job_id))

    def gang_of(self, alloc: JobAllocation) -> str | None:
        """The gang whose job `alloc` is: its comment, signed by this bridge for this job's user."""
        return wl.verified_gang(alloc.comment, alloc.user, self.key)

    def members(self, job_id: int, alloc: JobAllocation | None) -> list[wl.WorkloadPod]:
        """The pods of the job: marked with it, of its gang, in a namespace of its user. A mark alone
        proves nothing where admission did not guard it (a namespace labelled late, say)."""
        pods = self.cache.of_job(job_id)
        if alloc is None:
            return pods
        gang = self.gang_of(alloc)
        return [p for p in pods if p.gang == gang and self.user_of(p.namespace) == alloc.user]

    def user_of(self, namespace: str) -> str | None:
        managed = self.cfg.workloads.namespaces.get(namespace)
        return managed.user if managed is not None else None

    async def reconcile_job(self, job_id: int, alloc: JobAllocation | None) -> Result:
        pods = self.members(job_id, alloc)
        bound = log.bind(job_id=job_id)
        sessions = self.sessions.of_job(job_id)
        current = None if alloc is None or over(alloc) else alloc.run
        cancelled = any(s.cancel_requested for s in sessions)
        if current is None or cancelled:
            return await self._stop(job_id, alloc, pods, sessions, bound)
        assert alloc is not None
        earlier = [s for s in sessions if s.run != alloc.run]
        if alloc.state == "PENDING" and (earlier or any(p.node_name and not p.ended for p in pods)):
            # Requeued all the same (gang jobs are submitted not requeueable; an admin may insist):
            # the run that placed these pods is over. They go with their grace, and the job, left
            # without pods, is then cancelled; their Job's new pods are a new job.
            return await self._stop(job_id, alloc, [p for p in pods if p.node_name], earlier, bound)
        failed = any(p.phase == "Failed" and not p.deleting for p in pods)
        deleted = any(p.deleting for p in pods if not p.ended) or job_id in self._owner_deleted
        if deleted and job_id not in self._stopping and not failed:
            # Not after a pod failed: its Job controller deletes the others then, and the failed
            # pod's exit code is the job's. The job keeps its allocation while a deleted pod still
            # runs: the kubelet stops it within the grace its deletion asked, which nothing shortens
            # once it has begun, and what it holds must not be given to the next job meanwhile.
            self._owner_deleted.add(job_id)
            if any(p.deleting and p.node_name and not p.ended for p in pods):
                return DONE
            return await self._cancel(job_id, "a pod of the job was deleted", bound)
        if not pods and not self.gangs.just_submitted(job_id) and not self._gang_alive(alloc):
            return await self._cancel(job_id, "the job's pods are gone", bound)
        if alloc.state == "PENDING":
            reason, again = await self._pending_reason(job_id, alloc)
            for pod in pods:
                await self.tell(pod, "Normal", "SlurmPending", f"Slurm job {job_id} pending: {reason}",
                                 condition="SlurmPending")
            return DONE if again is None else DONE.sooner(again)
        self._reason_reads.pop(job_id, None)
        session = self.sessions.get(job_id, alloc.run)
        if alloc.state != "RUNNING" or session is None or session.payload is None:
            return DONE
        if session.final is not None:
            return DONE
        return await self._run(session, alloc, pods, bound)

    async def _pending_reason(self, job_id: int, alloc: JobAllocation) -> tuple[str, float | None]:
        """Slurm's reason the job pends, and when to look again. The poll reads a job's record when its
        state changes, so a reason Slurm sets at its next scheduling pass (the state still PENDING) is
        read here: a few times, further apart each time, while there is none yet (REASON_READS reads a
        job at most; a later change of reason comes with the poll's full listing)."""
        if alloc.state_reason not in ("", "None"):
            self._reason_reads.pop(job_id, None)
            return alloc.state_reason, None
        now = time.monotonic()
        count, due = self._reason_reads.setdefault(job_id, (0, now + REASON_FIRST_READ_S))
        if count >= REASON_READS:
            return "waiting to start", None
        if now < due:
            return "waiting to start", due - now
        self._reason_reads[job_id] = (count + 1, now + REASON_FIRST_READ_S * 2 ** (count + 1))
        fresh = (await self.jobs.refresh(job_id)).alloc
        if fresh is not None and fresh.state_reason not in ("", "None"):
            return fresh.state_reason, None
        return "waiting to start", REASON_FIRST_READ_S * 2 ** (count + 1)

    async def _run(
        self, session: JobSession, alloc: JobAllocation, every_pod: list[wl.WorkloadPod], bound: Any
    ) -> Result:
        # Pods being deleted are never placed, nor counted in the outcome; the job ends only once
        # they have stopped (their Job controller deletes the rest after a failure).
        pods = [p for p in every_pod if not p.deleting]
        if not any(p.node_name for p in pods) and len(pods) < alloc.tasks:
            # The waiter came before the cache saw every mark: wait for them, not long.
            waited = time.time() - (alloc.start_time or time.time())
            if waited < MARK_GRACE_S:
                return DONE.sooner(2.0)
            missing = f"the job has {len(pods)} of its {alloc.tasks} pods"
            return await self._fail(session, pods, missing, bound)
        # Slurm's record says whose job it is: each pod runs as that user, or not at all. And whatever
        # way a pod joined the job, nothing it may not do runs.
        foreign = "; ".join(filter(None, (wl.foreign_ids(pod, alloc.uid, alloc.gid) for pod in pods)))
        unsafe = "; ".join(f"pod {p.name}: {p.unsafe}" for p in pods if p.unsafe and not p.node_name)
        if foreign or unsafe:
            return await self._fail(session, pods, "; ".join(filter(None, (foreign, unsafe))), bound)
        part = self.cfg.partition(alloc.partition)
        try:
            k8s_nodes = await self._kubernetes_nodes(alloc.partition) if part is not None else None
            names = dict(zip(alloc.node_names, kubernetes_node_names(alloc, part, k8s_nodes), strict=True)) \
                if part is not None else {}
        except TranslateError as error:
            return await self._fail(session, pods, str(error), bound)
        # Pods bound already keep their node and GPUs, also while they are being deleted (they still
        # run: what they hold is no one else's).
        holding = [p for p in every_pod if p.node_name and not p.ended]
        slurm_name = {k8s: slurm for slurm, k8s in names.items()}
        bound_to = {p.name: slurm_name.get(p.node_name, p.node_name) for p in holding}
        placing = [*pods, *(p for p in holding if p.deleting)]
        shape = task_shape(pods) if pods else None
        gpus = {p.name: self.gpus.count(p) for p in pods if p.claims}
        placed = place(placing, alloc, shape, gpus, bound_to) if shape is not None else "the job has no pods"
        if isinstance(placed, str):
            return await self._fail(session, pods, placed, bound)
        again: float | None = None
        targets = [names.get(placed[p.name].node, placed[p.name].node) for p in pods
                   if not p.node_name and not p.ended]
        if targets and self.ended_runs is not None:
            # An ended run's pods still count on these nodes in their kubelets (early_endings.py).
            held, first = self.ended_runs.hold(alloc.job_id, targets)
            if held:
                if first:
                    bound.info("pods.wait_for_ended_pods", held=held)
                    self.metrics.inc("pod_creations_held_total")
                return DONE.sooner(HELD_NODE_RETRY_S)
        for pod in pods:
            if pod.node_name or pod.ended:
                continue
            where = placed[pod.name]
            node = names.get(where.node, where.node)
            if pod.claims:
                try:
                    await self.gpus.give(pod, node, where.gpus, part, alloc.partition, bound)
                except DevicesRefused as refused:
                    return await self._fail(session, pods, str(refused), bound)
                except DevicesWait as wait:
                    limit = self.gpus.wait_limit(self.cfg.start_failure_grace_s)
                    if waited_s(alloc) >= limit:
                        return await self._fail(session, pods, f"pod {pod.name} got no GPUs in {limit:.0f}s: "
                                                f"{wait}", bound)
                    bound.info("claim.waiting", pod=f"{pod.namespace}/{pod.name}", reason=str(wait))
                    again = DEVICES_RETRY_S
                    continue
            if await self.verbs.bind(pod, node):
                self.metrics.inc("workload_pods_bound_total")
                bound.info("pod.bound", pod=f"{pod.namespace}/{pod.name}", node=node,
                           slurm_node=where.node, slurm_gpus=list(where.gpus) or None)
        if again is not None:
            return DONE.sooner(again)
        end = None if any(p.deleting and not p.ended for p in every_pod) else wl.gang_outcome(pods)
        if end is not None:
            bound.info("job.finished", exit_code=end.exit_code, reason=end.reason or None)
            session.finish({"type": "exit", "code": end.exit_code, "signal": None, "reason": end.reason})
            return DONE
        failure = wl.start_failure(pods)
        if failure is not None:
            started = alloc.start_time or 0
            waited = time.time() - started if started else 0.0
            grace = self.cfg.start_failure_grace_s
            if waited < grace:
                return DONE.sooner(grace - waited + 0.1)
            return await self._fail(session, pods, f"{failure} (not started within {int(grace)}s)", bound)
        return DONE

    async def _fail(self, session: JobSession, pods: list[wl.WorkloadPod], reason: str, bound: Any) -> Result:
        """The pods cannot run: the job ends non-zero, and each pod's event says why (a Kubernetes user
        reads no -o file)."""
        bound.warning("job.failed_before_start", reason=reason)
        self.metrics.inc("jobs_failed_before_start_total")
        session.finish({"type": "exit", "code": EXIT_NOT_STARTED, "signal": None, "reason": reason})
        for pod in pods:
            await self.tell(pod, "Warning", "SlurmJobFailed", f"Slurm job {session.job_id} failed: {reason}")
        return DONE

    async def _stop(self, job_id: int, alloc: JobAllocation | None, pods: list[wl.WorkloadPod],
                    sessions: list[JobSession], bound: Any) -> Result:
        """Slurm ended the job (or its waiter asks to stop): the pods still running go with their grace;
        once none runs, the waiter hears how they ended and the session ends with the run."""
        self._stopping.add(job_id)
        live = [p for p in pods if not p.ended]
        for pod in live:
            if not pod.deleting and await self.verbs.delete(pod, self.cfg.termination_grace_s):
                bound.info("pod.deleted", pod=f"{pod.namespace}/{pod.name}")
        if live:
            return DONE
        end = wl.gang_outcome(pods)
        event = {"type": "exit", "code": end.exit_code if end else 0, "signal": None if end else 15,
                 "reason": ""}
        for session in sessions:
            if alloc is None or over(alloc) or alloc.run != session.run:
                self.sessions.end(session, event)
            else:
                session.finish(event)
        self._stopping.discard(job_id)
        if alloc is None or over(alloc):
            self._reason_reads.pop(job_id, None)
            self._owner_deleted.discard(job_id)
            self._forget(pods)
        return DONE

    async def _cancel(self, job_id: int, why: str, bound: Any) -> Result:
        bound.info("job.cancelled_by_its_pods", reason=why)
        self.metrics.inc("workload_jobs_cancelled_total")
        await self.slurm.cancel_job(job_id)
        return DONE

    def _gang_alive(self, alloc: JobAllocation) -> bool:
        """Pods of the job's gang still wait unmarked (a restart between submission and the marks)."""
        key = self.gang_of(alloc)
        return key is not None and any(p.job_id is None and not p.deleting and not p.ended
                                       for p in self.cache.gang(key))

    def _forget(self, pods: list[wl.WorkloadPod]) -> None:
        for pod in pods:
            self._told.pop(pod.uid, None)
        self.gangs.forget_gone()
