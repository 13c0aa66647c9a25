"""The GPUs of Kubernetes-submitted pods: each pod's own DRA claims get the devices behind the GPU
indices Slurm gave its task, before the pod is bound (the kubelet then has the driver prepare exactly
those, and the runtime inject them by CDI).

The same steps as kube-scheduler's, with Slurm's choice instead of its own: the devices must be
published and free (no other claim holds one: an ended job's claim is waited for, not long), the
allocation and the reservation are written into that incarnation of each claim, then the pod is
bound. Each step is idempotent, so a pass after a restart goes on where the last one stopped.
"""

from __future__ import annotations

import time
from typing import Any

from bridge.clients.kube.errors import KubeRejected
from bridge.clients.kube.workload_pods import WorkloadVerbs
from bridge.controller.device_claims import CLAIM_WAIT_S, DeviceClaims
from bridge.controller.metrics import Metrics
from bridge.core.config import PartitionConfig
from bridge.core.device_claims import ClaimView, DeviceMappingError, claim_status, devices_for, holders
from bridge.core.model import JobAllocation
from bridge.core.workload_placement import claim_results
from bridge.core.workloads import WorkloadPod


class DevicesWait(Exception):
    """The pod's devices cannot be given yet; the text says why (the job's reason if it lasts)."""


class DevicesRefused(Exception):
    """The pod's devices can never be given; the text is the job's reason."""


class WorkloadDevices:
    def __init__(self, devices: DeviceClaims, verbs: WorkloadVerbs, metrics: Metrics) -> None:
        self._devices = devices
        self._verbs = verbs
        self._metrics = metrics

    def claims_of(self, pod: WorkloadPod) -> list[ClaimView | None]:
        return [self._devices.claims.get(pod.namespace, entry.claim) if entry.claim else None
                for entry in pod.claims]

    def count(self, pod: WorkloadPod) -> int:
        """How many GPUs the pod's claims ask for (what its place in the allocation must hold)."""
        return sum(r.count for view in self.claims_of(pod) if view is not None for r in view.requests)

    def wait_limit(self, grace_s: float) -> float:
        return max(CLAIM_WAIT_S, grace_s)

    async def give(
        self, pod: WorkloadPod, node: str, indices: tuple[int, ...], part: PartitionConfig | None, bound: Any,
    ) -> None:
        """Allocate Slurm's GPUs `indices` on Kubernetes node `node` to the pod's claims. Raises
        DevicesWait or DevicesRefused."""
        if part is None or part.dra_driver is None:
            raise DevicesRefused(f"pod {pod.name} has DRA claims, but its partition gives no GPUs by DRA "
                                 "claims (gpu_mode changed while the job waited?)")
        devices, claims = self._devices.slices, self._devices.claims
        if not (devices.synced.is_set() and claims.synced.is_set()) or self._devices.claim_watch_failing():
            raise DevicesWait("the cluster's ResourceSlices and ResourceClaims are not listed (or their "
                              "watch is failing): who holds a device is not known")
        views = self.claims_of(pod)
        mine = [v for v in views if v is not None and v.owner_pod_uid == pod.uid and not v.deleting]
        if len(mine) != len(views):
            raise DevicesRefused(f"the claims of pod {pod.name} are gone, or not its own")
        try:
            published = devices_for(indices, devices.devices(part.dra_driver, node), part.dra_device_identity,
                                     driver=part.dra_driver, node=node)
            shares = claim_results(mine, published)
        except DeviceMappingError as error:
            raise DevicesWait(str(error)) from error
        except ValueError as error:
            raise DevicesRefused(f"pod {pod.name}'s claims and its task's GPUs differ: {error}") from error
        for view, given, requests in shares:
            held = holders(given, claims.holding(given), view.key)
            if held:
                device, holder = held[0]
                raise DevicesWait(f"GPU {device.name} on {node} is still held by ResourceClaim {holder.key}")
            wanted = {d.key for d in given}
            if view.devices and view.devices != wanted:
                raise DevicesRefused(f"ResourceClaim {view.key} holds other devices than Slurm gave")
            if view.devices == wanted and pod.uid in view.reserved_for:
                continue
            try:
                written = await self._verbs.allocate_claim(
                    view, claim_status(pod.name, pod.uid, node, given, requests))
            except KubeRejected as error:
                raise DevicesRefused(f"Kubernetes refused the allocation of ResourceClaim {view.key}: "
                                     f"{error}") from error
            if not written:
                raise DevicesRefused(f"ResourceClaim {view.key} went away before its devices were written")
            self._metrics.inc("claims_allocated_total")
            bound.info("claim.allocated", pod=f"{pod.namespace}/{pod.name}", claim=view.key,
                       devices=[d.name for d in given], slurm_gpus=list(indices))


def waited_s(alloc: JobAllocation) -> float:
    return time.time() - alloc.start_time if alloc.start_time else 0.0
