"""Device claims, the `dra` GPU mode: the one owner of the bridge's GPU ResourceClaims.

A pod with GPUs in a `dra` partition is created unbound (core.device_claims.claim_pod). Each pass
over its run, `prepare` takes every such pod not bound yet and
  1. maps Slurm's GRES indices on its node to the devices the node's ResourceSlices publish;
  2. checks that no other claim holds one of them;
  3. creates the pod's claim, owned by the pod, and writes its allocation and reservation (only
     that incarnation of the claim: uid precondition);
  4. binds the pod (only that incarnation) to its node: only now does the kubelet see it, with its
     devices ready to prepare.
Every step is idempotent, so a pass after a restart goes on where the last one stopped. What can
pass waits, CLAIM_WAIT_S at most from the pod's creation, then fails the job with the reason: the
caches not listed yet, a node's devices not (all) published (a driver restarting), a claim of
an ended run of ours still holding a device. What cannot pass fails the job at once: a device
another workload's claim holds, a claim Kubernetes refuses (controller.refusals).

The garbage collector deletes a claim with its pod, also while no daemon runs; the leader's
`sweep` deletes our claims whose pod is gone all the same (one created just after its pod's
deletion). "Ours" is a claim labelled by this bridge, of this cluster, in the job namespace: a
label alone proves nothing (anyone may write it on a claim of theirs).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
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
from bridge.core.outcome import not_started_for_s
from bridge.core.pod_view import PodView

CLAIM_WAIT_S = 30.0
"""The least a pod waits for its devices before its job fails (start_failure_grace_s if longer):
an ended run's pod stopping (Slurm has freed its GPUs already), a driver republishing its slices."""
RETRY_S = 0.5
"""When to look again while something that can pass is waited for."""


class _Wait(Exception):
    """A pod cannot be given its devices yet; the text says why (the job's reason if it lasts)."""


class DeviceClaims:
    def __init__(
        self, cfg: BridgeConfig, kube: KubeActions, pods: PodCache, metrics: Metrics,
        slices: SliceCache | None = None, claims: ClaimCache | None = None,
    ) -> None:
        self.cfg = cfg
        self._kube = kube
        self._pods = pods
        self._metrics = metrics
        self.slices = slices if slices is not None else SliceCache()
        """The cluster's ResourceSlices (their watch runs only where a partition is in `dra` mode)."""
        self.claims = claims if claims is not None else ClaimCache(cfg.namespace, cfg.cluster)
        """The cluster's ResourceClaims."""
        self.workload_user_of: Callable[[str, int], str | None] = lambda _node, _index: None
        """The live pod of a managed namespace given Slurm GPU index (on a Kubernetes node), as words
        (controller.workload_devices sets it where namespaces are managed)."""
        self.claim_watch_failing: Callable[[], bool] = lambda: False
        """True while the claims' watch waits to try again (the daemon sets it): who holds a device
        is then not known, and no allocation is written."""

    def ours(self, claim: ClaimView) -> bool:
        return claim.ours and claim.namespace == self.cfg.namespace and claim.cluster == self.cfg.cluster

    async def prepare(
        self, session: JobSession, alloc: JobAllocation, part: PartitionConfig, views: list[PodView],
        bound: Any,
    ) -> str | float | None:
        """Claim the devices of the run's pods that wait for them, and bind those pods. Returns
        why the job fails (str), when to look again (seconds), or None when none waits."""
        waiting = [v for v in views if v.binds_to and not v.node_name and not v.deleting]
        if not waiting:
            return None
        if part.dra_driver is None:
            return (f"the pods of partition {alloc.partition} wait for GPU claims, but its gpu_mode is no "
                    f"longer \"dra\" (changed while the job ran)")
        limit = max(CLAIM_WAIT_S, self.cfg.start_failure_grace_s)
        again: float | None = None
        for view in waiting:
            node = alloc.nodes[view.index]
            try:
                await self._give_devices(session, alloc, part, view, bound)
            except _Wait as wait:
                waited = not_started_for_s(view, datetime.now(UTC)) or 0.0
                if waited >= limit:
                    return f"the pod on {node.name} got no GPUs in {limit:.0f} s: {wait}"
                bound.info("claim.waiting", pod=view.name, reason=str(wait), waited_s=round(waited, 1))
                again = RETRY_S if again is None else min(again, RETRY_S)
            except _Refused as refused:
                return str(refused)
            except KubeRejected as error:
                # A quota on claims, an admission policy, a device class the cluster lacks.
                judge_refusal(session, error, bound)
                return f"Kubernetes refused the GPU claim of the pod on {node.name}: {error}"
        return again

    async def _give_devices(
        self, session: JobSession, alloc: JobAllocation, part: PartitionConfig, view: PodView, bound: Any
    ) -> None:
        assert view.binds_to is not None and part.dra_driver is not None
        if not (self.slices.synced.is_set() and self.claims.synced.is_set()):
            raise _Wait("the cluster's ResourceSlices and ResourceClaims are not listed yet")
        if self.claim_watch_failing():
            raise _Wait("the watch of the cluster's ResourceClaims is failing: who holds a device is unknown")
        node = alloc.nodes[view.index]
        try:
            devices = devices_for(node.gpu_indices, self.slices.devices(part.dra_driver, view.binds_to),
                                  part.dra_device_identity, driver=part.dra_driver, node=view.binds_to)
        except DeviceMappingError as error:
            raise _Wait(str(error)) from error
        name = claim_name(view.name)
        own = self.claims.get(self.cfg.namespace, name)
        if own is not None and own.owner_pod_uid != view.uid:
            await self._delete_stale(own, bound)  # an earlier pod of the same name's
            raise _Wait(f"ResourceClaim {own.key} of an earlier pod of the same name is being deleted")
        await self._check_holders(node.gpu_indices, devices, view, f"{self.cfg.namespace}/{name}", bound)
        uid = own.uid if own is not None else await self._create(alloc, part, view, devices)
        wanted = {d.key for d in devices}
        if own is None or own.devices != wanted or view.uid not in own.reserved_for:
            status = claim_status(view.name, view.uid, view.binds_to, devices)
            await self._kube.allocate_claim(name, uid, status)
            self._metrics.inc("claims_allocated_total")
        if await self._kube.bind_pod(view.name, view.uid, view.binds_to):
            self._metrics.inc("pods_bound_total")
            bound.info("pod.bound", pod=view.name, node=view.binds_to, claim=name,
                       devices=[d.name for d in devices])
        session.forbidden_since = None

    async def _create(
        self, alloc: JobAllocation, part: PartitionConfig, view: PodView, devices: list[PublishedDevice]
    ) -> str:
        """Create the pod's claim; its uid. One that exists already but is not in the cache yet
        is waited for: whose it is must be known before anything is written into it."""
        assert part.dra_driver is not None
        labels = {
            wellknown.LABEL_MANAGED_BY: wellknown.MANAGER, wellknown.LABEL_CLUSTER: self.cfg.cluster,
            wellknown.LABEL_JOB_ID: str(alloc.job_id), wellknown.LABEL_RUN: str(alloc.run),
        }
        manifest = claim_manifest(view.name, view.uid, self.cfg.namespace, labels,
                                  part.dra_device_class or part.dra_driver, devices, part.dra_device_identity)
        uid = await self._kube.create_claim(manifest)
        if uid is None:
            raise _Wait(f"ResourceClaim {claim_name(view.name)} exists but is not in the claim watch yet")
        self._metrics.inc("claims_created_total")
        return uid

    async def _check_holders(
        self, indices: tuple[int, ...], devices: list[PublishedDevice], view: PodView, mine: str, bound: Any
    ) -> None:
        """Raise _Refused when another workload's claim holds one of `devices`, _Wait while one of
        ours of an ended run does (deleted here once its pod is gone), or a managed namespace's pod
        given one still runs (Slurm ended its job: the pod goes within its grace)."""
        for index in indices:
            # A managed namespace's pod uses what the bridge gave it (its record) until it ends, whatever
            # its user did to its claims; their claims themselves decide nothing.
            user = self.workload_user_of(view.binds_to or "", index)
            if user is not None:
                raise _Wait(f"GPU index {index} on {view.binds_to} is still used by {user}")
        for device, holder in holders(devices, self.claims.holding(devices), mine):
            index = indices[devices.index(device)]
            if holder.namespace in self.cfg.workloads.namespaces:
                continue
            if not self.ours(holder):
                raise _Refused(
                    f"GPU index {index} on {view.binds_to} ({device.name} of {device.driver}) is held by "
                    f"ResourceClaim {holder.key}, which Kubernetes gave to another workload: it is not free "
                    f"for this job although Slurm allocated it")
            if self.ours(holder) and not self._owner_alive(holder):
                await self._delete_stale(holder, bound)
            raise _Wait(f"GPU index {index} ({device.name}) is still held by ResourceClaim {holder.key} "
                        f"of an ended job")

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
        """Delete our claims whose pod is gone."""
        removed = 0
        for claim in self.claims.ours():
            if not self.ours(claim) or claim.deleting or self._owner_alive(claim):
                continue
            if await self._kube.delete_claim(claim.name, uid=claim.uid):
                self._metrics.inc("claims_swept_total")
                removed += 1
        return removed


class _Refused(Exception):
    """A pod can never be given its devices; the text is the job's reason."""
