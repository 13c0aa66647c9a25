"""Gangs into jobs, the first half of the Kubernetes-submitted path (controller.kube_workloads has the
second): once all of a gang's pods exist (and their GPU claims), submit ONE Slurm job for them through
slurmrestd as the namespace's user (core.workloads.job_request), and record the job on each pod. A
job submitted before a restart is found again by its signed comment, and completed with the gang's
waiting pods instead of a second job. The one owner of which gangs this daemon submitted, which were
refused (told once, tried again later), and which submissions got no answer.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import structlog

from bridge.controller.facade import over
from bridge.controller.workqueue import DONE, Result
from bridge.core import workloads as wl
from bridge.core.errors import SlurmAuthError, SlurmRefused, SlurmUnavailable
from bridge.core.workload_placement import ClaimsNotReady, claim_gpus

if TYPE_CHECKING:
    from bridge.controller.kube_workloads import KubeWorkloads

log = structlog.get_logger(__name__)

MARK_GRACE_S = 60.0
"""How long a job just submitted may show no pod of its own (the marks are not in the cache yet)."""
REFUSAL_RETRY_S = 300.0
GANG_INDEX_S = 1.0
CLAIMS_RETRY_S = 1.0
"""While a gang's claims are being made (Kubernetes' claim controller): when to look again."""
SUBMIT_SETTLE_S = 5.0
"""After a submission that got no answer: long enough for the poller to show a job it made."""


class GangSubmission:
    def __init__(self, owner: KubeWorkloads) -> None:
        self._owner = owner
        self._submitted: dict[str, tuple[int, frozenset[str], float]] = {}
        """Gang key → (job id, pod uids, when): a gang this daemon submitted, until its marks are seen."""
        self._refused: dict[str, tuple[frozenset[str], str, float]] = {}
        """Gang key → (pod uids, why, when): told once; tried again when the gang's pods change, or
        REFUSAL_RETRY_S later."""
        self._unsure: dict[str, float] = {}
        """Gang key → when its submission failed without an answer (the job may exist)."""
        self._gang_index: dict[str, set[int]] = {}
        self._gang_index_at = float("-inf")

    def just_submitted(self, job_id: int) -> bool:
        now = time.monotonic()
        return any(job == job_id and now - at < MARK_GRACE_S for job, _, at in self._submitted.values())

    def forget_gone(self) -> None:
        gone = {key for key in self._submitted if not self._owner.cache.gang(key)}
        for key in gone:
            self._submitted.pop(key, None)

    async def reconcile_gang(self, key: str) -> Result:
        waiting = sorted((p for p in self._owner.cache.gang(key)
                          if p.job_id is None and not p.deleting and not p.node_name and not p.ended),
                         key=lambda p: p.name)
        if not waiting:
            self._unsure.pop(key, None)
            refused = self._refused.pop(key, None)
            if refused is not None and not self._owner.cache.gang(key):
                self._owner.untell(refused[0])
            return DONE
        bound = log.bind(gang=key)
        incomplete = self._incomplete_job(key, waiting)
        if incomplete is not None:
            # A job of this gang lacks marks (a restart between them, or the cache has not seen them
            # yet): its missing pods are these, never a new job's.
            job_id, pods = incomplete
            try:
                # The checks of a submission: a pod that joins a job is judged like one that starts it.
                wl.job_request(pods, self._owner.cfg.workloads, self._owner.key, self._gpus_per_task(pods))
            except wl.WorkloadError as error:
                return await self._refuse(key, pods, str(error), bound)
            except ClaimsNotReady as wait:
                return await self._wait_for_claims(pods, str(wait))
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
            request = wl.job_request(gang, self._owner.cfg.workloads, self._owner.key, gpus)
        except wl.WorkloadError as error:
            return await self._refuse(key, gang, str(error), bound)
        except ClaimsNotReady as wait:
            return await self._wait_for_claims(gang, str(wait))
        user = self._owner.cfg.workloads.namespaces[gang[0].namespace].user
        unsure = self._unsure.get(key)
        if unsure is not None and time.monotonic() - unsure < SUBMIT_SETTLE_S:
            return DONE.sooner(SUBMIT_SETTLE_S - (time.monotonic() - unsure) + 0.1)
        try:
            job_id = await self._owner.slurm.submit_job(user, request)
        except (SlurmRefused, SlurmAuthError) as error:
            return await self._refuse(key, gang, f"Slurm refused the job: {error}", bound)
        except SlurmUnavailable as error:
            # It may have been made all the same: look for it (the gang's jobs) before submitting again.
            self._unsure[key] = time.monotonic()
            bound.warning("gang.submit_unsure", error=repr(error))
            for pod in gang:
                await self._owner.tell(pod, "Warning", "SlurmUnavailable",
                                 f"cannot reach Slurm: {error}; trying again")
            return DONE.sooner(SUBMIT_SETTLE_S + 0.1)
        self._unsure.pop(key, None)
        self._submitted[key] = (job_id, uids, time.monotonic())
        self._owner.metrics.inc("workload_jobs_submitted_total")
        bound.info("gang.submitted", job_id=job_id, pods=[p.name for p in gang], user=user,
                   account=request["account"], partition=request["partition"], tasks=request["tasks"],
                   cpus_per_task=request["cpus_per_task"])
        await self._mark(job_id, gang, bound)
        return DONE

    def _gpus_per_task(self, gang: list[wl.WorkloadPod]) -> int:
        """The GPUs of each task: the most any pod's claims ask for (0 without claims)."""
        if not any(p.claims for p in gang):
            return 0
        partition = wl.gang_partition(gang[0], self._owner.cfg.workloads)
        part = self._owner.cfg.partition(partition)
        device_class = (part.dra_device_class or part.dra_driver) if part is not None else None
        if device_class is not None and not self._owner.devices.claims.synced.is_set():
            raise ClaimsNotReady("the cluster's ResourceClaims are not listed yet")
        return max(claim_gpus(p, self._owner.devices.claims.get, device_class, partition) for p in gang)

    async def _wait_for_claims(self, gang: list[wl.WorkloadPod], why: str) -> Result:
        """Kubernetes makes each pod's claims from their templates in a moment; past the gang's wait, the
        pods say what is missing (a template that does not exist, say)."""
        oldest = min((p.created for p in gang if p.created is not None), default=None)
        waited = (datetime.now(UTC) - oldest).total_seconds() if oldest else 0.0
        if waited >= self._owner.cfg.workloads.gang_wait_s:
            for pod in gang:
                await self._owner.tell(pod, "Warning", "ClaimsNotReady",
                                       f"{why} after {int(waited)}s; the job is submitted to Slurm once "
                                       "every claim exists", condition="ClaimsNotReady")
            return DONE.sooner(CLAIMS_RETRY_S * 5)
        return DONE.sooner(CLAIMS_RETRY_S)

    async def _mark(self, job_id: int, pods: list[wl.WorkloadPod], bound: Any) -> None:
        for pod in pods:
            if await self._owner.verbs.mark_job(pod, job_id):
                await self._owner.tell(pod, "Normal", "SubmittedToSlurm",
                                 f"Slurm job {job_id} (its gang's pods as one job) waits in Slurm's queue")
            else:
                bound.info("gang.mark_failed", job_id=job_id, pod=pod.name)

    async def _size(self, pod: wl.WorkloadPod) -> int | None:
        if pod.kind != "Job":
            return pod.gang_size
        job = await self._owner.verbs.get_job(pod.namespace, pod.owner)
        if job is None or ((job.get("metadata") or {}).get("uid") not in (None, pod.owner_uid)):
            return 0
        running = sum(1 for p in self._owner.cache.gang(pod.gang) if p.job_id is not None and not p.ended)
        return wl.job_size(job) - running

    async def _wait_for_the_rest(self, key: str, waiting: list[wl.WorkloadPod], size: int) -> Result:
        oldest = min((p.created for p in waiting if p.created is not None), default=None)
        waited = (datetime.now(UTC) - oldest).total_seconds() if oldest else 0.0
        limit = self._owner.cfg.workloads.gang_wait_s
        if waited < limit:
            return DONE.sooner(limit - waited + 0.1)
        for pod in waiting:
            await self._owner.tell(pod, "Warning", "GangIncomplete",
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
            view = self._owner.jobs.get(job_id)
            alloc = view.alloc if view is not None else None
            if alloc is None or over(alloc) or self._owner.gang_of(alloc) != key or alloc.tasks <= 0:
                continue
            if self._owner.user_of(key.partition("/")[0]) != alloc.user:
                continue  # never another user's job, whatever its comment says
            marked = self._owner.members(job_id, alloc)
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
            for job_id in self._owner.jobs.job_ids():
                view = self._owner.jobs.get(job_id)
                gang = self._owner.gang_of(view.alloc) if view is not None and view.alloc else None
                if gang is not None:
                    index.setdefault(gang, set()).add(job_id)
            self._gang_index, self._gang_index_at = index, now
        return self._gang_index.get(key, set())

    async def _refuse(self, key: str, pods: list[wl.WorkloadPod], why: str, bound: Any) -> Result:
        self._refused[key] = (frozenset(p.uid for p in pods), why, time.monotonic())
        self._owner.metrics.inc("workload_gangs_refused_total")
        bound.warning("gang.refused", reason=why, pods=[p.name for p in pods])
        for pod in pods:
            await self._owner.tell(pod, "Warning", "SlurmRefused", why, condition="SlurmRefused")
        return DONE.sooner(REFUSAL_RETRY_S)
