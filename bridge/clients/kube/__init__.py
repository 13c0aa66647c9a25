"""The bridge's only door to Kubernetes: one pod watch feeding a cache, and a few idempotent verbs.

    client   make_api_client, raw requests through kubernetes_asyncio's ApiClient, error mapping
    cache    PodCache: trimmed pods by name and by Slurm job id (pure)
    watch    PodWatcher: list + watch (+ relist on 410) into the cache, job ids out
    actions  KubeActions: the verbs below, on one object for the callers
      objects     create/get/delete pods and Secrets, node conditions, the namespace
      pod_exec    exec in a pod's container, classified (not started, outcome unknown, failed)
      pod_logs    follow a container's log, resumable
      pod_events  explain a pod's failure from its events
    errors   the classified errors (temporary vs permanent) callers catch
"""

from __future__ import annotations

from bridge.clients.kube.actions import KubeActions
from bridge.clients.kube.cache import PodCache, trim_pod
from bridge.clients.kube.client import make_api_client, server_version
from bridge.clients.kube.errors import (
    KubeConfigError,
    KubeConflict,
    KubeForbidden,
    KubeInvalid,
    KubeNotFound,
    KubeRejected,
    LogsNotReady,
    ResourceVersionExpired,
)
from bridge.clients.kube.watch import PodWatcher

__all__ = [
    "KubeActions",
    "KubeConfigError",
    "KubeConflict",
    "KubeForbidden",
    "KubeInvalid",
    "KubeNotFound",
    "KubeRejected",
    "LogsNotReady",
    "PodCache",
    "PodWatcher",
    "ResourceVersionExpired",
    "make_api_client",
    "server_version",
    "trim_pod",
]
