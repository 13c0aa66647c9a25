"""The leader's own pod carries `slurm-k8s-bridge/role=leader`, which the Service selects: waiters
reach the acting replica, while every replica may be Ready (so Deployment rollouts proceed).

Only when the daemon runs in a pod (POD_NAME and POD_NAMESPACE from the downward API).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import structlog
from kubernetes_asyncio.client import ApiClient

from bridge.clients.kube.client import request_json
from bridge.clients.kube.errors import KubeNotFound
from bridge.core import wellknown

log = structlog.get_logger(__name__)
MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True)
class OwnPod:
    namespace: str
    name: str

    @classmethod
    def from_environment(cls, environ: dict[str, str] | None = None) -> OwnPod | None:
        env = os.environ if environ is None else environ
        name, namespace = env.get("POD_NAME"), env.get("POD_NAMESPACE")
        return cls(namespace, name) if name and namespace else None


def role_patch(leading: bool) -> dict[str, object]:
    """Merge patch that sets (or, with None, removes) the role label."""
    return {"metadata": {"labels": {wellknown.LABEL_ROLE: wellknown.ROLE_LEADER if leading else None}}}


class LeaderPodLabel:
    def __init__(self, api: ApiClient, own: OwnPod) -> None:
        self._api = api
        self.own = own
        self._pods = f"/api/v1/namespaces/{own.namespace}/pods"

    async def _set(self, name: str, leading: bool) -> None:
        with contextlib.suppress(KubeNotFound):  # gone already: nothing routes to it
            await request_json(self._api, "PATCH", f"{self._pods}/{name}", f"label pod {name}",
                               body=role_patch(leading), content_type=MERGE_PATCH)

    async def mark(self) -> None:
        """We act: take the label from any other pod (a former leader that could not clean up:
        killed, or hung past its lease), then put it on ours, so two pods never carry it."""
        selector = f"{wellknown.LABEL_ROLE}={wellknown.ROLE_LEADER}"
        listed = await request_json(self._api, "GET", self._pods, "list leader pods",
                                    query={"labelSelector": selector})
        for pod in listed.get("items") or []:
            name = (pod.get("metadata") or {}).get("name")
            if name and name != self.own.name:
                log.warning("leader_pod.stale_label_removed", pod=name)
                await self._set(name, False)
        await self._set(self.own.name, True)
        log.info("leader_pod.marked", pod=self.own.name)

    async def unmark(self) -> None:
        """We do not act (at start, after a restart in the same pod; or stopping)."""
        await self._set(self.own.name, False)
