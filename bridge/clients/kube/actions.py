"""KubeActions: the verbs reconcile, nodesync, the API and the daemon use on Kubernetes, one namespace.

The verbs live in one module per kind of work and are mixed in here, so that callers keep one object:

    objects     create/get/delete pods and Secrets, node conditions, the namespace (idempotent)
    pod_exec    exec in a pod's container, and how an exec ended (not started, unknown, failed)
    pod_logs    follow a container's log, resumable after the last line seen
    pod_events  explain a pod from its latest (Warning) event
    dra         a pod's GPU ResourceClaim (create, allocate, delete) and the pod's binding
"""

from __future__ import annotations

import asyncio

import aiohttp
from kubernetes_asyncio.client import ApiClient

from bridge.clients.kube.dra import ClaimVerbs
from bridge.clients.kube.objects import ObjectVerbs
from bridge.clients.kube.pod_events import EventVerbs
from bridge.clients.kube.pod_exec import ExecVerbs
from bridge.clients.kube.pod_logs import LOG_READ_TIMEOUT_S, STREAM_OPENS_AT_ONCE, LogVerbs


class KubeActions(ObjectVerbs, ExecVerbs, LogVerbs, EventVerbs, ClaimVerbs):
    """Pod verbs in one namespace."""

    def __init__(
        self, api_client: ApiClient, namespace: str, *, log_read_timeout_s: float = LOG_READ_TIMEOUT_S,
        streams: ApiClient | None = None,
    ) -> None:
        self._api = api_client
        self._streams = streams or api_client
        self._opening_streams = asyncio.Semaphore(STREAM_OPENS_AT_ONCE)
        self.namespace = namespace
        self._pods = f"/api/v1/namespaces/{namespace}/pods"
        self._secrets = f"/api/v1/namespaces/{namespace}/secrets"
        self._log_timeout = aiohttp.ClientTimeout(connect=10, sock_read=log_read_timeout_s)
