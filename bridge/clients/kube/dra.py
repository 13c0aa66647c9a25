"""Dynamic Resource Allocation objects, for the `dra` GPU mode: the cluster's ResourceSlices and
ResourceClaims, each kept by one list+watch (bridge.clients.kube.watch.ListWatcher) in a cache
trimmed to what the bridge reads (bridge.core.device_claims), and the verbs on a pod's claim
(create, allocate, delete) and on the pod (bind), mixed into KubeActions.

The claims are watched cluster-wide: a device that Kubernetes gave to a workload in any namespace
is held, and the bridge must see that before it writes an allocation of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import structlog
from kubernetes_asyncio.client import ApiClient

from bridge.clients.kube.client import request, request_json
from bridge.clients.kube.errors import KubeConflict, KubeNotFound
from bridge.core import wellknown
from bridge.core.device_claims import (
    ClaimView,
    PublishedDevice,
    SliceView,
    current_devices,
    trim_claim,
    trim_slice,
)

log = structlog.get_logger(__name__)

SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"
CLAIMS_PATH = "/apis/resource.k8s.io/v1/resourceclaims"


class SliceCache:
    """ResourceSlices by name, indexed by (driver, node). Keys handed to the watcher: node names."""

    def __init__(self) -> None:
        self._slices: dict[str, SliceView] = {}
        self._by_node: dict[tuple[str, str], set[str]] = {}
        self.synced = asyncio.Event()

    def __len__(self) -> int:
        return len(self._slices)

    def devices(self, driver: str, node: str) -> list[PublishedDevice]:
        """The devices `driver` publishes on `node` now (newest pool generation)."""
        return current_devices(self._slices[name] for name in sorted(self._by_node.get((driver, node), ())))

    def trim(self, obj: dict[str, Any]) -> SliceView:
        return trim_slice(obj)

    def apply(self, event_type: str, obj: dict[str, Any]) -> set[str]:
        piece = self.trim(obj)
        if not piece.name:
            return set()
        changed = self._remove(piece.name)
        if event_type in ("ADDED", "MODIFIED"):
            changed |= self._put(piece)
        return changed

    def replace_all(self, objs: Iterable[SliceView]) -> set[str]:
        changed = {s.node for s in self._slices.values()}
        self._slices.clear()
        self._by_node.clear()
        for piece in objs:
            changed |= self._put(piece)
        self.synced.set()
        return changed

    def _put(self, piece: SliceView) -> set[str]:
        self._slices[piece.name] = piece
        self._by_node.setdefault((piece.driver, piece.node), set()).add(piece.name)
        return {piece.node}

    def _remove(self, name: str) -> set[str]:
        old = self._slices.pop(name, None)
        if old is None:
            return set()
        names = self._by_node.get((old.driver, old.node), set())
        names.discard(name)
        if not names:
            self._by_node.pop((old.driver, old.node), None)
        return {old.node}


class ClaimCache:
    """ResourceClaims of every namespace by namespace/name, indexed by the devices they hold. Keys
    handed to the watcher: the Slurm job ids of the bridge's own claims (labelled so, of its
    cluster, in its namespace: another's label must not queue this bridge's jobs)."""

    def __init__(self, namespace: str = "", cluster: str = "") -> None:
        self.namespace = namespace
        self.cluster = cluster
        self._claims: dict[str, ClaimView] = {}
        self._job_of: dict[str, int] = {}
        self._by_device: dict[tuple[str, str, str], set[str]] = {}
        self.synced = asyncio.Event()

    def __len__(self) -> int:
        return len(self._claims)

    def get(self, namespace: str, name: str) -> ClaimView | None:
        return self._claims.get(f"{namespace}/{name}")

    def holding(self, devices: Iterable[PublishedDevice]) -> list[ClaimView]:
        """The claims whose allocation holds any of `devices`."""
        keys = set().union(*(self._by_device.get(d.key, set()) for d in devices))
        return [self._claims[key] for key in sorted(keys)]

    def ours(self) -> list[ClaimView]:
        return [claim for claim in self._claims.values() if claim.ours]

    def trim(self, obj: dict[str, Any]) -> tuple[ClaimView, int | None]:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        job = labels.get(wellknown.LABEL_JOB_ID)
        return trim_claim(obj), int(job) if isinstance(job, str) and job.isdigit() else None

    def apply(self, event_type: str, obj: dict[str, Any]) -> set[int]:
        claim, job = self.trim(obj)
        changed = self._remove(claim.key)
        if event_type in ("ADDED", "MODIFIED"):
            changed |= self._put(claim, job)
        return changed

    def replace_all(self, objs: Iterable[tuple[ClaimView, int | None]]) -> set[int]:
        changed = set(self._job_of.values())
        self._claims.clear()
        self._job_of.clear()
        self._by_device.clear()
        for claim, job in objs:
            changed |= self._put(claim, job)
        self.synced.set()
        return changed

    def _put(self, claim: ClaimView, job: int | None) -> set[int]:
        self._claims[claim.key] = claim
        for device in claim.devices:
            self._by_device.setdefault(device, set()).add(claim.key)
        mine = (claim.namespace, claim.cluster) == (self.namespace, self.cluster)
        if claim.ours and mine and job is not None:
            self._job_of[claim.key] = job
            return {job}
        return set()

    def _remove(self, key: str) -> set[int]:
        old = self._claims.pop(key, None)
        if old is None:
            return set()
        for device in old.devices:
            holders = self._by_device.get(device, set())
            holders.discard(key)
            if not holders:
                self._by_device.pop(device, None)
        job = self._job_of.pop(key, None)
        return {job} if job is not None else set()


class ClaimVerbs:
    """A pod's claim and its binding, in the namespace (idempotent like the other verbs)."""

    _api: ApiClient
    namespace: str
    _pods: str

    @property
    def _claims(self) -> str:
        return f"/apis/resource.k8s.io/v1/namespaces/{self.namespace}/resourceclaims"

    async def create_claim(self, manifest: dict[str, Any]) -> str | None:
        """The new claim's uid; None if a claim of that name exists already."""
        what = f"create resourceclaims in namespace {self.namespace}"
        try:
            created = await request_json(self._api, "POST", self._claims, what, body=manifest)
        except KubeConflict:
            return None
        return str((created.get("metadata") or {}).get("uid") or "")

    async def allocate_claim(self, name: str, uid: str, status: dict[str, Any]) -> None:
        """Write the claim's allocation and reservation (its status), as the scheduler would; only
        into the incarnation `uid` (a claim of that name made since is another's)."""
        what = f"update resourceclaims/status in namespace {self.namespace}"
        response = await request(
            self._api, "PATCH", f"{self._claims}/{name}/status", what,
            body={"metadata": {"uid": uid}, "status": status}, content_type="application/merge-patch+json")
        response.release()

    async def delete_claim(self, name: str, *, uid: str | None = None) -> bool:
        """Delete the claim (only that incarnation, with `uid`); False if it is gone already."""
        options: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if uid is not None:
            options["preconditions"] = {"uid": uid}
        what = f"delete resourceclaims in namespace {self.namespace}"
        try:
            response = await request(self._api, "DELETE", f"{self._claims}/{name}", what, body=options)
        except (KubeNotFound, KubeConflict):
            return False
        response.release()
        log.info("kube.claim_deleted", claim=name)
        return True

    async def bind_pod(self, name: str, uid: str, node: str) -> bool:
        """Bind the pod (only the incarnation `uid`) to `node`: its kubelet then starts it. False if
        it is bound already."""
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, "uid": uid},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        what = f"create pods/binding in namespace {self.namespace}"
        try:
            response = await request(self._api, "POST", f"{self._pods}/{name}/binding", what, body=body)
        except KubeConflict:
            return False
        response.release()
        return True
