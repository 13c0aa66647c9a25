"""The bridge's only door to Kubernetes: one pod watch feeding a cache, and a few idempotent verbs.

    client   make_api_client, raw requests through kubernetes_asyncio's ApiClient, error mapping
    cache    PodCache: trimmed pods by name and by Slurm job id (pure)
    watch    PodWatcher: list + watch (+ relist on 410) into the cache, job ids out
    actions  KubeActions: create/delete pods, follow logs, explain failures from events
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
