"""The pods of managed namespaces (Kubernetes workloads scheduled by Slurm): one cluster-wide watch of
the pods whose schedulerName is the bridge's, a cache of them by gang and by Slurm job, and the verbs
on them that the job namespace's KubeActions do not have (events, conditions, their Jobs).
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterable
from datetime import UTC, datetime
from typing import Any, Final

import structlog
from kubernetes_asyncio.client import ApiClient

from bridge.clients.kube.client import request, request_json
from bridge.clients.kube.errors import KubeConflict, KubeNotFound
from bridge.core.device_claims import ClaimView
from bridge.core.workloads import (
    ANNOTATION_SLURM_GPUS,
    ANNOTATION_SLURM_JOB,
    SCHEDULER_NAME,
    WorkloadError,
    WorkloadPod,
    trim_pod,
)

log = structlog.get_logger(__name__)

PODS_PATH: Final = "/api/v1/pods"
FIELD_SELECTOR: Final = f"spec.schedulerName={SCHEDULER_NAME}"
"""Only the pods handed to the bridge: the watch never sees the rest of the cluster's pods."""
SOURCE: Final = {"component": "slurm-k8s-bridge"}

Key = str | int
"""What a change names: a gang's key (str), or the Slurm job (int) of a submitted pod."""


class WorkloadPodCache:
    """The pods of the managed namespaces, trimmed, indexed by gang and by Slurm job (no scan of all
    pods per question: 10,000 pods stay cheap). Fed by a ListWatcher."""

    def __init__(self, namespaces: Collection[str], job_namespace: str) -> None:
        self._namespaces = frozenset(namespaces)
        self._job_namespace = job_namespace
        self._pods: dict[str, WorkloadPod] = {}
        """By `namespace/name`."""
        self._by_gang: dict[str, dict[str, WorkloadPod]] = {}
        self._by_job: dict[int, dict[str, WorkloadPod]] = {}
        self._by_node: dict[str, dict[str, WorkloadPod]] = {}
        self.unreadable = 0

    def __len__(self) -> int:
        return len(self._pods)

    def gang(self, key: str) -> list[WorkloadPod]:
        return list(self._by_gang.get(key, {}).values())

    def of_job(self, job_id: int) -> list[WorkloadPod]:
        return list(self._by_job.get(job_id, {}).values())

    def on_node(self, node: str) -> list[WorkloadPod]:
        """The pods bound to Kubernetes node `node`."""
        return list(self._by_node.get(node, {}).values())

    def job_ids(self) -> set[int]:
        return set(self._by_job)

    def gangs(self) -> set[str]:
        return set(self._by_gang)

    def trim(self, obj: dict[str, Any]) -> WorkloadPod | None:
        meta = obj.get("metadata") or {}
        # The bridge's own pods (dra mode) carry its schedulerName too; other namespaces are not ours.
        if meta.get("namespace") == self._job_namespace or meta.get("namespace") not in self._namespaces:
            return None
        try:
            return trim_pod(obj)
        except (WorkloadError, TypeError, ValueError, KeyError) as error:
            self.unreadable += 1
            log.warning("workload.pod_unreadable", pod=f"{meta.get('namespace')}/{meta.get('name')}",
                        error=repr(error))
            return None

    def replace_all(self, objs: Iterable[WorkloadPod | None]) -> set[Key]:
        before = list(self._pods.values())
        self._pods, self._by_gang, self._by_job, self._by_node = {}, {}, {}, {}
        for pod in objs:
            if pod is not None:
                self._put(pod)
        return _keys([*before, *self._pods.values()])

    def apply(self, event_type: str, obj: dict[str, Any]) -> set[Key]:
        meta = obj.get("metadata") or {}
        old = self._remove(f"{meta.get('namespace')}/{meta.get('name')}")
        new = None if event_type == "DELETED" else self.trim(obj)
        if new is not None:
            self._put(new)
        return _keys(p for p in (old, new) if p is not None)

    def _put(self, pod: WorkloadPod) -> None:
        name = f"{pod.namespace}/{pod.name}"
        self._pods[name] = pod
        self._by_gang.setdefault(pod.gang, {})[name] = pod
        if pod.job_id is not None:
            self._by_job.setdefault(pod.job_id, {})[name] = pod
        if pod.node_name:
            self._by_node.setdefault(pod.node_name, {})[name] = pod

    def _remove(self, name: str) -> WorkloadPod | None:
        pod = self._pods.pop(name, None)
        if pod is None:
            return None
        _drop(self._by_gang, pod.gang, name)
        if pod.job_id is not None:
            _drop(self._by_job, pod.job_id, name)
        if pod.node_name:
            _drop(self._by_node, pod.node_name, name)
        return pod


def _drop(index: dict[Any, dict[str, WorkloadPod]], key: object, name: str) -> None:
    members = index.get(key)
    if members is not None:
        members.pop(name, None)
        if not members:
            del index[key]


def _keys(pods: Iterable[WorkloadPod]) -> set[Key]:
    keys: set[Key] = set()
    for pod in pods:
        keys.add(pod.gang)
        if pod.job_id is not None:
            keys.add(pod.job_id)
    return keys


class WorkloadVerbs:
    """Verbs on the pods (and Jobs) of any managed namespace."""

    def __init__(self, api_client: ApiClient) -> None:
        self._api = api_client

    async def mark_job(self, pod: WorkloadPod, job_id: int) -> bool:
        """Record the pod's Slurm job on it (only on the incarnation seen); False if it is gone."""
        return await self._annotate(pod, {ANNOTATION_SLURM_JOB: str(job_id)})

    async def record_gpus(self, pod: WorkloadPod, indices: tuple[int, ...]) -> bool:
        """Record on the pod (only the incarnation seen) Slurm's GPU indices its claims get; False if
        it is gone."""
        return await self._annotate(pod, {ANNOTATION_SLURM_GPUS: ",".join(str(i) for i in indices)})

    async def _annotate(self, pod: WorkloadPod, annotations: dict[str, str]) -> bool:
        body = {"metadata": {"uid": pod.uid, "annotations": annotations}}
        try:
            await request_json(self._api, "PATCH", _pod_path(pod), f"annotate pods in {pod.namespace}",
                               body=body, content_type="application/merge-patch+json")
        except (KubeNotFound, KubeConflict):
            return False
        return True

    async def bind(self, pod: WorkloadPod, node: str) -> bool:
        """Bind the pod (only the incarnation seen) to `node`; False if it is bound already or gone."""
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod.name, "uid": pod.uid},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        try:
            response = await request(self._api, "POST", f"{_pod_path(pod)}/binding",
                                     f"create pods/binding in namespace {pod.namespace}", body=body)
        except (KubeConflict, KubeNotFound):
            return False
        response.release()
        return True

    async def delete(self, pod: WorkloadPod, grace_seconds: int | None = None) -> bool:
        options: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions",
                                   "preconditions": {"uid": pod.uid}}
        if grace_seconds is not None:
            options["gracePeriodSeconds"] = grace_seconds
        try:
            response = await request(self._api, "DELETE", _pod_path(pod),
                                     f"delete pods in namespace {pod.namespace}", body=options)
        except (KubeNotFound, KubeConflict):
            return False
        response.release()
        return True

    async def event(self, pod: WorkloadPod, kind: str, reason: str, message: str) -> None:
        """An event on the pod (`kubectl describe pod` shows it)."""
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{pod.name}.", "namespace": pod.namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": pod.namespace,
                               "name": pod.name, "uid": pod.uid},
            "type": kind, "reason": reason, "message": message[:1024], "source": SOURCE,
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
            "reportingComponent": SOURCE["component"], "reportingInstance": SOURCE["component"],
        }
        response = await request(self._api, "POST", f"/api/v1/namespaces/{pod.namespace}/events",
                                 f"create events in namespace {pod.namespace}", body=body)
        response.release()

    async def condition(self, pod: WorkloadPod, reason: str, message: str) -> None:
        """The pod's PodScheduled condition, as kube-scheduler sets it for a pod it cannot place yet."""
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {"status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": reason,
                                           "message": message[:1024], "lastTransitionTime": now}]}}
        with contextlib.suppress(KubeNotFound):
            await request_json(self._api, "PATCH", f"{_pod_path(pod)}/status",
                               f"patch pods/status in namespace {pod.namespace}", body=body,
                               content_type="application/strategic-merge-patch+json")

    async def allocate_claim(self, claim: ClaimView, status: dict[str, Any]) -> bool:
        """Write a pod's claim's allocation and reservation (its status), as kube-scheduler would; only
        into the incarnation seen. False if that claim is gone."""
        path = f"/apis/resource.k8s.io/v1/namespaces/{claim.namespace}/resourceclaims/{claim.name}/status"
        try:
            response = await request(
                self._api, "PATCH", path, f"update resourceclaims/status in namespace {claim.namespace}",
                body={"metadata": {"uid": claim.uid}, "status": status},
                content_type="application/merge-patch+json")
        except (KubeNotFound, KubeConflict):
            return False
        response.release()
        return True

    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await request_json(self._api, "GET", f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}",
                                      f"get jobs.batch in namespace {namespace}")
        except KubeNotFound:
            return None


def _pod_path(pod: WorkloadPod) -> str:
    return f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}"
