"""Creating, reading and deleting objects: pods, payload Secrets, node conditions, the namespace.

Every verb is idempotent in the way reconcile needs: creating a pod that exists and deleting one
that is gone both succeed (they return False to say "nothing to do"), so a restarted daemon that
re-plans from scratch never makes duplicates and never fails on a half-done previous attempt.
Retrying temporary errors is the caller's job (the work queue requeues with backoff). Mixed into
KubeActions (bridge.clients.kube.actions), which reconcile, nodesync and the daemon use.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import structlog
from kubernetes_asyncio.client import ApiClient

from bridge.clients.kube.client import request, request_json
from bridge.clients.kube.errors import KubeConflict, KubeForbidden, KubeNotFound
from bridge.core import wellknown

log = structlog.get_logger(__name__)

METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
"""Accept header for a list of objects' metadata only."""
LIST_PAGE = 500


class ObjectVerbs:
    """Create, get and delete the namespace's pods and Secrets, and patch nodes' conditions."""

    _api: ApiClient
    namespace: str
    _pods: str
    """The pods' collection path in the namespace."""
    _secrets: str
    """The Secrets' collection path in the namespace."""

    async def create_pod(self, manifest: dict[str, Any]) -> bool:
        """Create the pod; True if created, False if a pod of that name already exists (not an error)."""
        meta = manifest.get("metadata") or {}
        name = meta.get("name")
        bound = log.bind(pod=name, job_id=(meta.get("labels") or {}).get(wellknown.LABEL_JOB_ID))
        what = f"create pods in namespace {self.namespace}"
        try:
            response = await request(self._api, "POST", self._pods, what, body=manifest)
        except KubeConflict:
            bound.debug("kube.pod_exists")
            return False
        response.release()
        bound.info("kube.pod_created", node=(manifest.get("spec") or {}).get("nodeName"))
        return True

    async def delete_pod(
        self, name: str, grace_seconds: int | None = None, *, uid: str | None = None
    ) -> bool:
        """Delete the pod (in the background); True if a deletion was requested, False if already gone.

        With `uid`, only that incarnation is deleted: a newer pod with the same name is left alone
        (and False is returned). Careful with `grace_seconds=0`: the API server then forgets the pod
        at once (a force delete) although its container may still run on the node for a while;
        the pod's own terminationGracePeriodSeconds (None here) or >= 1 waits for the kubelet.
        """
        options: dict[str, Any] = {
            "apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background",
        }
        if grace_seconds is not None:
            options["gracePeriodSeconds"] = grace_seconds
        if uid is not None:
            options["preconditions"] = {"uid": uid}
        what = f"delete pods in namespace {self.namespace}"
        try:
            response = await request(self._api, "DELETE", f"{self._pods}/{name}", what, body=options)
        except (KubeNotFound, KubeConflict):
            log.debug("kube.pod_already_gone", pod=name, uid=uid)
            return False
        response.release()
        log.info("kube.pod_deleted", pod=name, grace_s=grace_seconds)
        return True

    async def create_secret(self, manifest: dict[str, Any]) -> bool:
        """Create the Secret; True if created, False if one of that name exists (not an error).
        Only its name is ever logged: it holds a job's script and environment."""
        name = (manifest.get("metadata") or {}).get("name")
        what = f"create secrets in namespace {self.namespace}"
        try:
            response = await request(self._api, "POST", self._secrets, what, body=manifest)
        except KubeConflict:
            log.debug("kube.secret_exists", secret=name)
            return False
        response.release()
        return True

    async def delete_secret(self, name: str, *, uid: str | None = None) -> bool:
        """Delete the Secret (with `uid`: only that incarnation); True if deleted, False if gone
        (or, with `uid`, replaced)."""
        what = f"delete secrets in namespace {self.namespace}"
        options: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if uid is not None:
            options["preconditions"] = {"uid": uid}
        try:
            response = await request(self._api, "DELETE", f"{self._secrets}/{name}", what, body=options)
        except (KubeNotFound, KubeConflict):
            return False
        response.release()
        return True

    async def secrets_metadata(self, selector: str) -> list[dict[str, Any]]:
        """The metadata of every Secret matching the label `selector`: names, labels and creation
        times only (a metadata-only list: their data never crosses the wire)."""
        items: list[dict[str, Any]] = []
        query: dict[str, str | int] = {"labelSelector": selector, "limit": LIST_PAGE}
        while True:
            page = await request_json(
                self._api, "GET", self._secrets, f"list secrets in namespace {self.namespace}",
                query=query, accept=METADATA_LIST,
            )
            items.extend(item.get("metadata") or {} for item in page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items
            query = {**query, "continue": token}

    async def get_pod(self, name: str) -> dict[str, Any] | None:
        """The pod as the API server has it now (raw dict), or None. Reconcile reads the cache instead."""
        try:
            return await request_json(
                self._api, "GET", f"{self._pods}/{name}", f"get pods in namespace {self.namespace}"
            )
        except KubeNotFound:
            return None

    async def annotate_pod(self, name: str, key: str, value: str | None) -> bool:
        """Set (or with None remove) one annotation of the pod; False when the pod is gone."""
        try:
            await request_json(self._api, "PATCH", f"{self._pods}/{name}", f"annotate pod {name}",
                               body={"metadata": {"annotations": {key: value}}},
                               content_type="application/merge-patch+json")
        except KubeNotFound:
            return False
        return True

    async def get_node(self, name: str) -> dict[str, Any]:
        return await request_json(self._api, "GET", f"/api/v1/nodes/{name}", f"get node {name}")

    async def set_node_condition(
        self, name: str, condition_type: str, status: str, reason: str, message: str
    ) -> None:
        """Set one condition on a node's status (a strategic merge keyed by type, so the kubelet's
        own conditions are left alone)."""
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        condition = {
            "type": condition_type, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": now, "lastHeartbeatTime": now,
        }
        await request_json(
            self._api, "PATCH", f"/api/v1/nodes/{name}/status", f"patch the status of node {name}",
            body={"status": {"conditions": [condition]}},
            content_type="application/strategic-merge-patch+json",
        )

    async def nodes_by_label(self, label: str) -> dict[str, str]:
        """Map each value of node label `label` to the name of the node carrying it."""
        body = await request_json(
            self._api, "GET", "/api/v1/nodes", "list nodes", query={"labelSelector": label}
        )
        return {
            node["metadata"]["labels"][label]: node["metadata"]["name"]
            for node in body.get("items") or []
            if label in (node["metadata"].get("labels") or {})
        }

    async def ensure_namespace(self) -> bool:
        """Create the namespace if it does not exist; True if it was created.

        If the bridge may not read namespaces (a namespaced Role only), assume it exists: creating
        a pod in a missing one then fails with a clear NotFound.
        """
        path = f"/api/v1/namespaces/{self.namespace}"
        try:
            await request_json(self._api, "GET", path, f"get namespace {self.namespace}")
            return False
        except KubeNotFound:
            pass
        except KubeForbidden as error:
            log.warning("kube.namespace_unchecked", namespace=self.namespace, error=str(error))
            return False
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}}
        try:
            await request_json(self._api, "POST", "/api/v1/namespaces", "create namespaces", body=body)
        except KubeConflict:
            return False
        log.info("kube.namespace_created", namespace=self.namespace)
        return True
