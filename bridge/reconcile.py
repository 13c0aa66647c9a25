"""reconcile(job_id): make Kubernetes match what Slurm says about one job.

Level-triggered: whatever woke us up, re-read the Slurm view, the cached pods
and the waiter's session, then act. Every action is idempotent, so running it
twice, or after a restart, is harmless (pod names are deterministic, a create
that finds the pod already there is success, a delete of a missing pod too).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import structlog

from bridge import outcome as outcomes
from bridge import wellknown
from bridge.config import BridgeConfig
from bridge.directives import DirectiveError, parse_directives
from bridge.kube.actions import KubeActions
from bridge.kube.cache import PodCache
from bridge.metrics import Metrics
from bridge.model import JobAllocation
from bridge.sessions import JobSession
from bridge.slurm import SlurmClient
from bridge.translate import TranslateError, desired_pods, node_index_of

log = structlog.get_logger(__name__)

EXIT_CODE_NOT_STARTED = 1
# Slurm states in which the job's pods may exist; any other state means the job is over.
LIVE_STATES = frozenset({"PENDING", "RUNNING", "SUSPENDED"})
CANCEL_GRACE_S = 1


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
    ) -> None:
        self.cfg = cfg
        self.slurm = slurm
        self.kube = kube
        self.cache = cache
        self.metrics = metrics
        self.requeue = requeue
        self.requeue_after = requeue_after or (lambda key, _delay: requeue(key))
        self.slurm_jobs: dict[int, JobAllocation] = {}
        """Latest view of every job in a bridged partition (from the poller or an attach)."""
        self.sessions: dict[int, JobSession] = {}

    def is_bridged(self, alloc: JobAllocation) -> bool:
        return self.cfg.partition(alloc.partition) is not None

    # -- the loop body ---------------------------------------------------------
    async def reconcile(self, job_id: int) -> None:
        self.metrics.inc("reconciles_total")
        alloc = self.slurm_jobs.get(job_id)
        session = self.sessions.get(job_id)
        pods = self.cache.pods_of(job_id)
        bound = log.bind(job_id=job_id)

        over = alloc is None or alloc.state not in LIVE_STATES or "COMPLETING" in alloc.state_flags
        if over or (session is not None and session.cancel_requested):
            await self._stop(job_id, pods, session, alloc, bound)
            return
        assert alloc is not None
        if alloc.state != "RUNNING":
            return  # a stale view (the waiter runs, so Slurm started the job): wait for the next one
        if session is None or session.payload is None:
            return  # pods, if any, keep running; the waiter will attach and tell us what to do
        if session.final is not None:
            return

        if not pods:
            if session.created:
                await self._fail(session, alloc, "the job's pods were deleted outside Slurm", bound)
                return
            await self._create(session, alloc, bound)
            return
        session.created = True
        if len(pods) < len(alloc.nodes):
            # Creation was interrupted (restart mid-way): create the rest, idempotently.
            await self._create(session, alloc, bound)

        grace = self.cfg.start_failure_grace_s
        # Like srun: wait for every rank, then the highest non-zero exit code wins (deciding at the
        # first failure would make the code depend on which rank happened to end first).
        decision = outcomes.job_outcome(
            pods, len(alloc.nodes), now=datetime.now(UTC), grace_s=grace, wait_for_all=True
        )
        self._ensure_log_relays(session, pods)
        if isinstance(decision, outcomes.FailedBeforeStart):
            await self._fail(session, alloc, decision.reason, bound)
        elif isinstance(decision, outcomes.Finished):
            if self._logs_drained(session, pods):
                bound.info("job.finished", exit_code=decision.exit_code, signal=decision.signal)
                # A plain exit code speaks for itself (native Slurm prints nothing either);
                # signals, OOM kills and timeouts get an explanation in slurm-<id>.out.
                explain = decision.signal is not None or decision.oom_killed or decision.timed_out
                session.finish({
                    "type": "exit", "code": decision.exit_code, "signal": decision.signal,
                    "reason": decision.reason if explain else "",
                })
        elif _retrying_start_error(pods):
            # It fails the job once it outlasts the grace period; no pod event may wake us
            # up then, so look again.
            self.requeue_after(job_id, min(grace, 5.0))

    # -- actions -------------------------------------------------------------------
    async def _create(self, session: JobSession, alloc: JobAllocation, bound: Any) -> None:
        assert session.payload is not None
        part = self.cfg.partition(alloc.partition)
        if part is None:
            await self._fail(session, alloc, f"partition {alloc.partition} is not bridged", bound)
            return
        # Partitions that map nodes by label look the labels up at each start: rare next to
        # pod events, and a relabelled node is seen at once.
        k8s_nodes = await self.kube.nodes_by_label(part.node_label) if part.node_label else None
        try:
            directives = parse_directives(session.payload.script)
            manifests = desired_pods(alloc, session.payload, directives, part, self.cfg, k8s_nodes)
        except (DirectiveError, TranslateError) as error:
            await self._fail(session, alloc, str(error), bound)
            return
        for manifest in manifests:
            if await self.kube.create_pod(manifest):
                self.metrics.inc("pods_created_total")
                bound.info("pod.created", pod=manifest["metadata"]["name"], node=manifest["spec"]["nodeName"])
        session.created = True

    async def _stop(
        self, job_id: int, pods: list[dict[str, Any]], session: JobSession | None,
        alloc: JobAllocation | None, bound: Any,
    ) -> None:
        """The job is over in Slurm, or its waiter asked to stop: remove the pods."""
        grace = CANCEL_GRACE_S if session is not None and session.cancel_requested else None
        for pod in pods:
            name = pod["metadata"]["name"]
            stopped = _containers_stopped(pod)
            if pod["metadata"].get("deletionTimestamp") and not stopped:
                continue  # the kubelet is stopping it
            # Once its containers have stopped, removing the object at once is safe: nothing
            # runs any more, and it saves the kubelet's volume clean-up from the waiter's wait.
            if await self.kube.delete_pod(name, 0 if stopped else grace):
                self.metrics.inc("pods_deleted_total")
                bound.info("pod.deleted", pod=name, slurm_state=alloc.state if alloc else "gone")
        if session is None:
            return
        if not pods:
            if session.cancel_requested:
                session.finish({"type": "exit", "code": 0, "signal": 15,
                                "reason": "cancelled: the job's pods are gone"})
            else:
                self.sessions.pop(job_id, None)
                session.detach()

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
            await self.kube.delete_pod(pod["metadata"]["name"], 0)

    # -- logs ------------------------------------------------------------------------
    def _ensure_log_relays(self, session: JobSession, pods: list[dict[str, Any]]) -> None:
        if not session.attached:
            return
        for pod in pods:
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
        return all(pod["metadata"]["name"] in session.logs_done for pod in pods if _container_started(pod))

    async def _relay_logs(self, session: JobSession, pod_name: str, index: int) -> None:
        since = session.last_log.get(str(index))
        bound = log.bind(job_id=session.job_id, pod=pod_name)
        try:
            # stream_logs yields only lines after `since`: nothing is printed twice on a reconnect.
            async for stamp, line in self.kube.stream_logs(pod_name, since_time=since):
                session.last_log[str(index)] = stamp
                session.publish({"type": "log", "pod": index, "ts": stamp, "line": line})
                self.metrics.inc("log_lines_total")
        except asyncio.CancelledError:
            raise
        except Exception as error:
            bound.warning("logs.unavailable", error=repr(error))
        session.log_tasks.pop(pod_name, None)
        session.logs_done.add(pod_name)
        self.requeue(session.job_id)


def _container_started(pod: dict[str, Any]) -> bool:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == wellknown.CONTAINER_NAME:
            state = status.get("state") or {}
            return "running" in state or "terminated" in state
    return False


_RETRIED_START_ERRORS = outcomes.IMAGE_ERRORS_RETRIED | outcomes.CREATE_ERRORS_RETRIED


def _retrying_start_error(pods: list[dict[str, Any]]) -> bool:
    for pod in pods:
        view = outcomes.pod_view(pod)
        if view.waiting_reason in _RETRIED_START_ERRORS or view.unschedulable:
            return True
    return False


def _containers_stopped(pod: dict[str, Any]) -> bool:
    """The pod ran and every container of it has terminated (nothing uses its resources)."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return True
    statuses = status.get("containerStatuses") or []
    return bool(statuses) and all("terminated" in (c.get("state") or {}) for c in statuses)
