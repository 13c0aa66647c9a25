"""The Kubernetes-submitted path: pods of managed namespaces wait in Slurm's queue as one job per gang,
start where Slurm placed them, and end in sacct with their real outcome.

Two halves, one owner of their state (which gangs this daemon submitted, which refusals and waits it
told the pods about):
- `reconcile_gang(key)` (its own work queue, keyed by gang): once all of a gang's pods exist, submit
  one Slurm job for them through slurmrestd as the namespace's user (core.workloads.job_request), and
  record the job on each pod. A job submitted before a restart is found again by its comment.
- `reconcile_job(...)` (called by the reconciler for a job that is a gang's): while it pends, the pods
  say why (a PodScheduled condition and an event with Slurm's reason); once it runs and its waiter
  (the job's batch script, as for sbatch jobs) has attached, bind the pods to the nodes Slurm gave,
  and when every pod has ended, hand the waiter the highest exit code. Slurm ending the job (scancel,
  time limit, preemption) deletes the pods with their grace; their owner deleting them cancels it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import structlog

from bridge.clients.kube.workload_pods import WorkloadPodCache, WorkloadVerbs
from bridge.clients.slurm import SlurmClient
from bridge.controller.device_claims import DeviceClaims
from bridge.controller.facade import over
from bridge.controller.jobstore import JobStore
from bridge.controller.metrics import Metrics
from bridge.controller.sessions import JobSession, SessionRegistry
from bridge.controller.steps import read_step_key
from bridge.controller.workload_devices import DevicesRefused, DevicesWait, WorkloadDevices, waited_s
from bridge.controller.workqueue import DONE, Result
from bridge.core import workloads as wl
from bridge.core.config import BridgeConfig, ConfigError
from bridge.core.errors import SlurmAuthError, SlurmRefused, SlurmUnavailable
from bridge.core.model import JobAllocation
from bridge.core.translate import TranslateError, kubernetes_node_names
from bridge.core.workload_placement import ClaimsNotReady, claim_gpus, place, task_shape

log = structlog.get_logger(__name__)

MARK_GRACE_S = 60.0
"""How long a job just submitted may show no pod of its own (the marks are not in the cache yet)."""
EXIT_NOT_STARTED = 1
REFUSAL_RETRY_S = 300.0
GANG_INDEX_S = 1.0
CLAIMS_RETRY_S = 1.0
"""While a gang's claims are being made (Kubernetes' claim controller): when to look again."""
DEVICES_RETRY_S = 0.5
REASON_FIRST_READ_S = 1.0
REASON_READS = 5
"""A pending job's own reads for Slurm's reason (1, 2, 4, 8, 16 s apart): bounded, never a poll."""
SUBMIT_SETTLE_S = 5.0
"""After a submission that got no answer: long enough for the poller to show a job it made."""


class KubeWorkloads:
    def __init__(
        self, cfg: BridgeConfig, slurm: SlurmClient, jobs: JobStore, sessions: SessionRegistry,
        cache: WorkloadPodCache, verbs: WorkloadVerbs, metrics: Metrics,
        kubernetes_nodes: Callable[[str], Any], devices: DeviceClaims,
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
        """The cluster's ResourceSlices and ResourceClaims (the `dra` mode's caches)."""
        self.gpus = WorkloadDevices(devices, verbs, metrics)
        key = read_step_key(cfg.waiter.step_key_file)
        if key is None:
            raise ConfigError("[workloads.namespaces] needs waiter.step_key_file (it signs gangs' comments)")
        self._key = key
        """`await kubernetes_nodes(partition)`: the Slurm → Kubernetes node map (None: same names)."""
        self._submitted: dict[str, tuple[int, frozenset[str], float]] = {}
        """Gang key → (job id, pod uids, when): a gang this daemon submitted, until its marks are seen."""
        self._refused: dict[str, tuple[frozenset[str], str, float]] = {}
        """Gang key → (pod uids, why, when): told once; tried again when the gang's pods change, or
        REFUSAL_RETRY_S later."""
        self._told: dict[str, str] = {}
        """Pod uid → the last pending reason its condition and event carry."""
        self._unsure: dict[str, float] = {}
        """Gang key → when its submission failed without an answer (the job may exist)."""
        self._gang_index: dict[str, set[int]] = {}
        self._gang_index_at = float("-inf")
        self._reason_reads: dict[int, tuple[int, float]] = {}
        """Pending job → (its record's reads for a reason, when the next is due)."""
        self._stopping: set[int] = set()
        """Jobs whose pods this daemon deletes (their deletion is no owner's cancel)."""

    # -- gangs into jobs ----------------------------------------------------------------------
    async def reconcile_gang(self, key: str) -> Result:
        waiting = sorted((p for p in self.cache.gang(key)
                          if p.job_id is None and not p.deleting and not p.node_name and not p.ended),
                         key=lambda p: p.name)
        if not waiting:
            self._unsure.pop(key, None)
            refused = self._refused.pop(key, None)
            for uid in refused[0] if refused is not None and not self.cache.gang(key) else ():
                self._told.pop(uid, None)
            return DONE
        bound = log.bind(gang=key)
        incomplete = self._incomplete_job(key, waiting)
        if incomplete is not None:
            # A job of this gang lacks marks (a restart between them, or the cache has not seen them
            # yet): its missing pods are these, never a new job's.
            job_id, pods = incomplete
            await self._mark(job_id, pods, bound)
            return DONE
        size = await self._size(waiting[0])
        if size is None:
            why = (f"label {wl.LABEL_GANG} needs annotation {wl.ANNOTATION_GANG_SIZE}: the gang's size "
                   "(a positive integer)")
            return await self._refuse(key, waiting, why, bound)
        if size <= 0:
            return DONE  # a Job that needs no more pods (the controller is about to delete these)
        if len(waiting) < size:
            return await self._wait_for_the_rest(key, waiting, size)
        gang = waiting[:size]
        uids = frozenset(p.uid for p in gang)
        refused = self._refused.get(key)
        if refused is not None and refused[0] == uids:
            # Told already; an administrator's fix (an account, a limit) is tried a while later.
            left = REFUSAL_RETRY_S - (time.monotonic() - refused[2])
            if left > 0:
                return DONE.sooner(left)
        known = self._submitted.get(key)
        if known is not None and uids <= known[1]:
            await self._mark(known[0], gang, bound)  # its marks are not in the cache yet: again, idempotent
            return DONE
        try:
            gpus = self._gpus_per_task(gang)
            request = wl.job_request(gang, self.cfg.workloads, self._key, gpus)
        except wl.WorkloadError as error:
            return await self._refuse(key, gang, str(error), bound)
        except ClaimsNotReady as wait:
            return await self._wait_for_claims(gang, str(wait))
        user = self.cfg.workloads.namespaces[gang[0].namespace].user
        unsure = self._unsure.get(key)
        if unsure is not None and time.monotonic() - unsure < SUBMIT_SETTLE_S:
            return DONE.sooner(SUBMIT_SETTLE_S - (time.monotonic() - unsure) + 0.1)
        try:
            job_id = await self.slurm.submit_job(user, request)
        except (SlurmRefused, SlurmAuthError) as error:
            return await self._refuse(key, gang, f"Slurm refused the job: {error}", bound)
        except SlurmUnavailable as error:
            # It may have been made all the same: look for it (the gang's jobs) before submitting again.
            self._unsure[key] = time.monotonic()
            bound.warning("gang.submit_unsure", error=repr(error))
            for pod in gang:
                await self._tell(pod, "Warning", "SlurmUnavailable",
                                 f"cannot reach Slurm: {error}; trying again")
            return DONE.sooner(SUBMIT_SETTLE_S + 0.1)
        self._unsure.pop(key, None)
        self._submitted[key] = (job_id, uids, time.monotonic())
        self.metrics.inc("workload_jobs_submitted_total")
        bound.info("gang.submitted", job_id=job_id, pods=[p.name for p in gang], user=user,
                   account=request["account"], partition=request["partition"], tasks=request["tasks"],
                   cpus_per_task=request["cpus_per_task"])
        await self._mark(job_id, gang, bound)
        return DONE

    def _gpus_per_task(self, gang: list[wl.WorkloadPod]) -> int:
        """The GPUs of each task: the most any pod's claims ask for (0 without claims)."""
        if not any(p.claims for p in gang):
            return 0
        partition = wl.gang_partition(gang[0], self.cfg.workloads)
        part = self.cfg.partition(partition)
        device_class = (part.dra_device_class or part.dra_driver) if part is not None else None
        if device_class is not None and not self.devices.claims.synced.is_set():
            raise ClaimsNotReady("the cluster's ResourceClaims are not listed yet")
        return max(claim_gpus(p, self.devices.claims.get, device_class, partition) for p in gang)

    async def _wait_for_claims(self, gang: list[wl.WorkloadPod], why: str) -> Result:
        """Kubernetes makes each pod's claims from their templates in a moment; past the gang's wait, the
        pods say what is missing (a template that does not exist, say)."""
        oldest = min((p.created for p in gang if p.created is not None), default=None)
        waited = (datetime.now(UTC) - oldest).total_seconds() if oldest else 0.0
        if waited >= self.cfg.workloads.gang_wait_s:
            for pod in gang:
                await self._tell(pod, "Warning", "ClaimsNotReady", f"{why} after {int(waited)}s; the job is "
                                 "submitted to Slurm once every claim exists", condition="ClaimsNotReady")
            return DONE.sooner(CLAIMS_RETRY_S * 5)
        return DONE.sooner(CLAIMS_RETRY_S)

    async def _mark(self, job_id: int, pods: list[wl.WorkloadPod], bound: Any) -> None:
        for pod in pods:
            if await self.verbs.mark_job(pod, job_id):
                await self._tell(pod, "Normal", "SubmittedToSlurm",
                                 f"Slurm job {job_id} (its gang's pods as one job) waits in Slurm's queue")
            else:
                bound.info("gang.mark_failed", job_id=job_id, pod=pod.name)

    async def _size(self, pod: wl.WorkloadPod) -> int | None:
        if pod.kind != "Job":
            return pod.gang_size
        job = await self.verbs.get_job(pod.namespace, pod.owner)
        if job is None or ((job.get("metadata") or {}).get("uid") not in (None, pod.owner_uid)):
            return 0
        running = sum(1 for p in self.cache.gang(pod.gang) if p.job_id is not None and not p.ended)
        return wl.job_size(job) - running

    async def _wait_for_the_rest(self, key: str, waiting: list[wl.WorkloadPod], size: int) -> Result:
        oldest = min((p.created for p in waiting if p.created is not None), default=None)
        waited = (datetime.now(UTC) - oldest).total_seconds() if oldest else 0.0
        limit = self.cfg.workloads.gang_wait_s
        if waited < limit:
            return DONE.sooner(limit - waited + 0.1)
        for pod in waiting:
            await self._tell(pod, "Warning", "GangIncomplete",
                             f"{len(waiting)} of the gang's {size} pods exist after {int(waited)}s; "
                             "the job is submitted to Slurm once all do", condition="GangIncomplete")
        return DONE

    def _incomplete_job(
        self, key: str, waiting: list[wl.WorkloadPod]
    ) -> tuple[int, list[wl.WorkloadPod]] | None:
        """A live job of the gang (its comment names it) with fewer marked pods than tasks and none
        bound yet, and the waiting pods that complete it: the ones this daemon submitted it for, or,
        after a restart between the submission and the marks, any of the gang's."""
        known = self._submitted.get(key)
        for job_id in self._gang_jobs(key) | ({known[0]} if known else set()):
            view = self.jobs.get(job_id)
            alloc = view.alloc if view is not None else None
            if alloc is None or over(alloc) or self.gang_of(alloc) != key or alloc.tasks <= 0:
                continue
            if self._user_of(key.partition("/")[0]) != alloc.user:
                continue  # never another user's job, whatever its comment says
            marked = self.members(job_id, alloc)
            missing = alloc.tasks - len(marked)
            if missing <= 0 or any(p.node_name for p in marked):
                continue
            candidates = [p for p in waiting if known is None or known[0] != job_id or p.uid in known[1]]
            if candidates:
                return job_id, candidates[:missing]
        return None

    def _gang_jobs(self, key: str) -> set[int]:
        """The live jobs whose comment names gang `key`, from an index of the job store rebuilt at most
        once a second (one pass over the store, not one per question)."""
        now = time.monotonic()
        if now - self._gang_index_at > GANG_INDEX_S:
            index: dict[str, set[int]] = {}
            for job_id in self.jobs.job_ids():
                view = self.jobs.get(job_id)
                gang = self.gang_of(view.alloc) if view is not None and view.alloc else None
                if gang is not None:
                    index.setdefault(gang, set()).add(job_id)
            self._gang_index, self._gang_index_at = index, now
        return self._gang_index.get(key, set())

    async def _refuse(self, key: str, pods: list[wl.WorkloadPod], why: str, bound: Any) -> Result:
        self._refused[key] = (frozenset(p.uid for p in pods), why, time.monotonic())
        self.metrics.inc("workload_gangs_refused_total")
        bound.warning("gang.refused", reason=why, pods=[p.name for p in pods])
        for pod in pods:
            await self._tell(pod, "Warning", "SlurmRefused", why, condition="SlurmRefused")
        return DONE.sooner(REFUSAL_RETRY_S)

    async def _tell(self, pod: wl.WorkloadPod, kind: str, reason: str, message: str,
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
        return wl.verified_gang(alloc.comment, alloc.user, self._key)

    def members(self, job_id: int, alloc: JobAllocation | None) -> list[wl.WorkloadPod]:
        """The pods of the job: marked with it, of its gang, in a namespace of its user. A mark alone
        proves nothing where admission did not guard it (a namespace labelled late, say)."""
        pods = self.cache.of_job(job_id)
        if alloc is None:
            return pods
        gang = self.gang_of(alloc)
        return [p for p in pods if p.gang == gang and self._user_of(p.namespace) == alloc.user]

    def _user_of(self, namespace: str) -> str | None:
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
        if any(p.deleting for p in pods if not p.ended) and job_id not in self._stopping and not failed:
            # Not after a pod failed: its Job controller deletes the others then, and the failed
            # pod's exit code is the job's.
            return await self._cancel(job_id, "a pod of the job was deleted", bound)
        if not pods and not self._just_submitted(job_id) and not self._gang_alive(alloc):
            return await self._cancel(job_id, "the job's pods are gone", bound)
        if alloc.state == "PENDING":
            reason, again = await self._pending_reason(job_id, alloc)
            for pod in pods:
                await self._tell(pod, "Normal", "SlurmPending", f"Slurm job {job_id} pending: {reason}",
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
        shape = task_shape(pods) if pods else None
        gpus = {p.name: self.gpus.count(p) for p in pods if p.claims}
        placed = place(pods, alloc, shape, gpus) if shape is not None else "the job has no pods"
        if isinstance(placed, str):
            return await self._fail(session, pods, placed, bound)
        # Slurm's record says whose job it is: each pod runs as that user, or not at all.
        foreign = "; ".join(filter(None, (wl.foreign_ids(pod, alloc.uid, alloc.gid) for pod in pods)))
        if foreign:
            return await self._fail(session, pods, foreign, bound)
        part = self.cfg.partition(alloc.partition)
        try:
            k8s_nodes = await self._kubernetes_nodes(alloc.partition) if part is not None else None
            names = dict(zip(alloc.node_names, kubernetes_node_names(alloc, part, k8s_nodes), strict=True)) \
                if part is not None else {}
        except TranslateError as error:
            return await self._fail(session, pods, str(error), bound)
        again: float | None = None
        for pod in pods:
            if pod.node_name or pod.ended:
                continue
            where = placed[pod.name]
            node = names.get(where.node, where.node)
            if pod.claims:
                try:
                    await self.gpus.give(pod, node, where.gpus, part, bound)
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
            await self._tell(pod, "Warning", "SlurmJobFailed", f"Slurm job {session.job_id} failed: {reason}")
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
            self._forget(pods)
        return DONE

    async def _cancel(self, job_id: int, why: str, bound: Any) -> Result:
        bound.info("job.cancelled_by_its_pods", reason=why)
        self.metrics.inc("workload_jobs_cancelled_total")
        await self.slurm.cancel_job(job_id)
        return DONE

    def _just_submitted(self, job_id: int) -> bool:
        now = time.monotonic()
        return any(job == job_id and now - at < MARK_GRACE_S for job, _, at in self._submitted.values())

    def _gang_alive(self, alloc: JobAllocation) -> bool:
        """Pods of the job's gang still wait unmarked (a restart between submission and the marks)."""
        key = self.gang_of(alloc)
        return key is not None and any(p.job_id is None and not p.deleting and not p.ended
                                       for p in self.cache.gang(key))

    def _forget(self, pods: list[wl.WorkloadPod]) -> None:
        for pod in pods:
            self._told.pop(pod.uid, None)
        gone = {key for key, (job, _, _) in self._submitted.items() if not self.cache.gang(key)}
        for key in gone:
            self._submitted.pop(key, None)
