"""Device claims, the `dra` GPU mode: the one owner of the bridge's GPU ResourceClaims.

A pod with GPUs in a `dra` partition is created unbound (core.device_claims.claim_pod). Each pass
over its run, `prepare` takes every such pod not bound yet and
  1. maps Slurm's GRES indices on its node to the devices the node's ResourceSlices publish;
  2. checks that no other claim holds one of them: Kubernetes may have given it to another
     workload (the job fails, with the claim's name), or an ended run's claim is not gone yet
     (the pass waits, HOLDER_WAIT_S at most);
  3. creates the pod's claim, owned by the pod, and writes its allocation and reservation;
  4. binds the pod to its node: only now does the kubelet see it, with its devices ready to prepare.
Every step is idempotent, so a pass after a restart goes on where the last one stopped. The garbage
collector deletes a claim with its pod, also while no daemon runs; the leader's `sweep` deletes the
bridge's claims whose pod is gone all the same (one created just after its pod was deleted).
"""

from __future__ import annotations

import time
from typing import Any

from bridge.clients.kube.actions import KubeActions
from bridge.clients.kube.cache import PodCache
from bridge.clients.kube.dra import ClaimCache, SliceCache
from bridge.clients.kube.errors import KubeRejected
from bridge.controller.metrics import Metrics
from bridge.controller.refusals import judge_refusal
from bridge.controller.sessions import JobSession
from bridge.core import wellknown
from bridge.core.config import BridgeConfig, PartitionConfig
from bridge.core.device_claims import (
    ClaimView,
    DeviceMappingError,
    PublishedDevice,
    claim_manifest,
    claim_name,
    claim_status,
    devices_for,
    holders,
)
from bridge.core.model import JobAllocation
from bridge.core.pod_view import PodView

HOLDER_WAIT_S = 30.0
"""How long a GPU Slurm gave a run may stay held by another of the bridge's claims (an ended run's
pod still stopping) before the run fails: Slurm freed it, so the claim is on its way out."""
RETRY_S = 0.5
"""When to look again while a device is held or a stale claim is being deleted."""


class DeviceClaims:
    def __init__(
        self, cfg: BridgeConfig, kube: KubeActions, pods: PodCache, metrics: Metrics,
        slices: SliceCache | None = None, claims: ClaimCache | None = None,
    ) -> None:
        self.cfg = cfg
        self._kube = kube
        self._pods = pods
        self._metrics = metrics
        self.slices = slices or SliceCache()
        """The cluster's ResourceSlices (their watch runs only where a partition is in `dra` mode)."""
        self.claims = claims or ClaimCache()
        """The cluster's ResourceClaims."""

    async def prepare(
        self, session: JobSession, alloc: JobAllocation, part: PartitionConfig, views: list[PodView],
        bound: Any,
    ) -> str | float | None:
        """Claim the devices of the run's pods that wait for them, and bind those pods. Returns
        why the job fails (str), when to look again (seconds), or None when none waits."""
        waiting = [v for v in views if v.binds_to and not v.node_name and not v.deleting]
        if not waiting:
            return None
        if not (self.slices.synced.is_set() and self.claims.synced.is_set()):
            return RETRY_S  # "no device" or "nobody holds it" would be a guess before the first list
        assert part.dra_driver is not None
        again: float | None = None
        for view in waiting:
            assert view.binds_to is not None
            node = alloc.nodes[view.index]
            try:
                devices = devices_for(
                    node.gpu_indices, self.slices.devices(part.dra_driver, view.binds_to),
                    part.dra_device_identity, driver=part.dra_driver, node=view.binds_to)
            except DeviceMappingError as error:
                return f"cannot give the pod on {node.name} its GPUs by DRA: {error}"
            verdict = await self._held_elsewhere(session, view, node.gpu_indices, devices, bound)
            if verdict is not None:
                if isinstance(verdict, str):
                    return verdict
                again = verdict if again is None else min(again, verdict)
                continue
            try:
                await self._claim_and_bind(alloc, part, view, devices, bound)
            except KubeRejected as error:
                # A quota on claims, an admission policy, a device class the cluster lacks.
                judge_refusal(session, error, bound)
                return f"Kubernetes refused the GPU claim of the pod on {node.name}: {error}"
        return again

    async def _claim_and_bind(
        self, alloc: JobAllocation, part: PartitionConfig, view: PodView, devices: list[PublishedDevice],
        bound: Any,
    ) -> None:
        assert view.binds_to is not None and part.dra_driver is not None
        name = claim_name(view.name)
        existing = self.claims.get(self.cfg.namespace, name)
        if existing is None:
            labels = {
                wellknown.LABEL_MANAGED_BY: wellknown.MANAGER, wellknown.LABEL_CLUSTER: self.cfg.cluster,
                wellknown.LABEL_JOB_ID: str(alloc.job_id), wellknown.LABEL_RUN: str(alloc.run),
            }
            device_class = part.dra_device_class or part.dra_driver
            manifest = claim_manifest(view.name, view.uid, self.cfg.namespace, labels, device_class, devices,
                                      part.dra_device_identity)
            if await self._kube.create_claim(manifest):
                self._metrics.inc("claims_created_total")
        wanted = {d.key for d in devices}
        if existing is None or existing.devices != wanted or view.uid not in existing.reserved_for:
            await self._kube.allocate_claim(name, claim_status(view.name, view.uid, view.binds_to, devices))
            self._metrics.inc("claims_allocated_total")
        if await self._kube.bind_pod(view.name, view.binds_to):
            self._metrics.inc("pods_bound_total")
            bound.info("pod.bound", pod=view.name, node=view.binds_to, claim=name,
                       devices=[d.name for d in devices])

    async def _held_elsewhere(
        self, session: JobSession, view: PodView, indices: tuple[int, ...], devices: list[PublishedDevice],
        bound: Any,
    ) -> str | float | None:
        """None when no other claim holds the devices; else when to look again (an old claim of
        ours on its way out, or one of a previous incarnation of this very pod), or why the job fails."""
        mine = f"{self.cfg.namespace}/{claim_name(view.name)}"
        own = self.claims.get(self.cfg.namespace, claim_name(view.name))
        if own is not None and own.owner_pod_uid != view.uid:
            # A claim of an earlier pod of the same name (a restart between two attempts).
            await self._delete_stale(own, bound)
            return RETRY_S
        held = holders(devices, self.claims.holding(devices), mine)
        if not held:
            session.devices_held_since = None
            return None
        device, holder = held[0]
        index = indices[devices.index(device)]
        if not holder.ours:
            return (f"GPU index {index} on {view.binds_to} ({device.name} of {device.driver}) is held by "
                    f"ResourceClaim {holder.key}, which Kubernetes gave to another workload: it is not free "
                    f"for this job although Slurm allocated it")
        if not self._owner_alive(holder):
            await self._delete_stale(holder, bound)
            return RETRY_S
        now = time.monotonic()
        session.devices_held_since = session.devices_held_since or now
        if now - session.devices_held_since >= HOLDER_WAIT_S:
            return (f"GPU index {index} on {view.binds_to} ({device.name}) is still held by ResourceClaim "
                    f"{holder.key} of an ended job after {HOLDER_WAIT_S:.0f} s")
        bound.info("claim.device_held", pod=view.name, device=device.name, holder=holder.key)
        return RETRY_S

    def _owner_alive(self, claim: ClaimView) -> bool:
        pod = self._pods.get(claim.name.removesuffix(wellknown.CLAIM_NAME_SUFFIX))
        return pod is not None and (pod.get("metadata") or {}).get("uid") == claim.owner_pod_uid

    async def _delete_stale(self, claim: ClaimView, bound: Any) -> None:
        if claim.deleting:
            return
        if await self._kube.delete_claim(claim.name, uid=claim.uid):
            self._metrics.inc("claims_swept_total")
            bound.info("claim.stale_deleted", claim=claim.key)

    async def sweep(self) -> int:
        """Delete the bridge's claims (of this cluster's namespace) whose pod is gone."""
        removed = 0
        for claim in self.claims.ours():
            if (claim.namespace != self.cfg.namespace or claim.cluster != self.cfg.cluster or claim.deleting
                    or self._owner_alive(claim)):
                continue
            if await self._kube.delete_claim(claim.name, uid=claim.uid):
                self._metrics.inc("claims_swept_total")
                removed += 1
        return removed
