"""The GPUs of Kubernetes-submitted pods: each pod's own DRA claims get the devices behind the GPU
indices Slurm gave its task, before the pod is bound (the kubelet then has the driver prepare exactly
those, and the runtime inject them by CDI).

The same steps as kube-scheduler's, with Slurm's choice instead of its own: the devices must be
published and free (no other claim holds one, no live pod was given one: an ended job's is waited
for, not long), Slurm's indices are recorded on the pod (an annotation only the bridge may write: the
bridge's own record of who uses a GPU, whatever a user does to their claims), the allocation and the
reservation are written into that incarnation of each claim, then the pod is bound. Each step is
idempotent, so a pass after a restart goes on where the last one stopped.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from typing import Any

from bridge.clients.kube.errors import KubeRejected
from bridge.clients.kube.workload_pods import WorkloadPodCache, WorkloadVerbs
from bridge.controller.device_claims import CLAIM_WAIT_S, DeviceClaims
from bridge.controller.metrics import Metrics
from bridge.core.config import PartitionConfig
from bridge.core.device_claims import ClaimView, DeviceMappingError, claim_status, devices_for, holders
from bridge.core.errors import WorkloadError
from bridge.core.model import JobAllocation
from bridge.core.workload_placement import ClaimsNotReady, claim_gpus, claim_results
from bridge.core.workloads import WorkloadPod


class DevicesWait(Exception):
    """The pod's devices cannot be given yet; the text says why (the job's reason if it lasts)."""


class DevicesRefused(Exception):
    """The pod's devices can never be given; the text is the job's reason."""


class WorkloadDevices:
    def __init__(
        self, devices: DeviceClaims, verbs: WorkloadVerbs, metrics: Metrics, pods: WorkloadPodCache,
        managed: Collection[str],
    ) -> None:
        self._devices = devices
        self._verbs = verbs
        self._metrics = metrics
        self._pods = pods
        self._managed = frozenset(managed)
        # The sbatch path asks too: a managed namespace's claim holds a device only while the pod the
        # bridge gave it to runs (a user may edit or delete their claims; the record on the pod is ours).
        devices.workload_user_of = self.user_of

    def user_of(self, node: str, index: int, except_job: int | None = None) -> str | None:
        """The live pod of a managed namespace that was given Slurm GPU index `index` on Kubernetes node
        `node` (its record), other than `except_job`'s, as words; None if none."""
        for pod in self._pods.on_node(node):
            if not pod.ended and pod.slurm_gpus and index in pod.slurm_gpus and pod.job_id != except_job:
                return f"pod {pod.namespace}/{pod.name} of Slurm job {pod.job_id}"
        return None

    def claims_of(self, pod: WorkloadPod) -> list[ClaimView | None]:
        return [self._devices.claims.get(pod.namespace, entry.claim) if entry.claim else None
                for entry in pod.claims]

    def count(self, pod: WorkloadPod) -> int:
        """How many GPUs the pod's claims ask for (what its place in the allocation must hold)."""
        return sum(r.count for view in self.claims_of(pod) if view is not None for r in view.requests)

    def wait_limit(self, grace_s: float) -> float:
        return max(CLAIM_WAIT_S, grace_s)

    async def give(
        self, pod: WorkloadPod, node: str, indices: tuple[int, ...], part: PartitionConfig | None,
        partition: str, bound: Any,
    ) -> None:
        """Record Slurm's GPUs `indices` on Kubernetes node `node` on the pod and allocate them to its
        claims. Raises DevicesWait or DevicesRefused."""
        if part is None or part.dra_driver is None:
            raise DevicesRefused(f"pod {pod.name} has DRA claims, but its partition gives no GPUs by DRA "
                                 "claims (gpu_mode changed while the job waited?)")
        try:
            # Checked again: a claim deleted and made anew since the submission was never judged.
            claim_gpus(pod, self._devices.claims.get, part.dra_device_class or part.dra_driver, partition,
                       allocated_by_bridge=True)
        except WorkloadError as error:
            raise DevicesRefused(str(error)) from error
        except ClaimsNotReady as wait:
            raise DevicesWait(str(wait)) from wait
        for index in indices:
            user = self.user_of(node, index, except_job=pod.job_id)
            if user is not None:
                raise DevicesWait(f"GPU index {index} on {node} is still used by {user}")
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
        if pod.slurm_gpus != indices and not await self._verbs.record_gpus(pod, indices):
            raise DevicesRefused(f"pod {pod.name} went away before its GPUs were recorded")
        for view, given, requests in shares:
            # A managed namespace's claim holds nothing by itself: the record on its pod (above) decides.
            held = [(d, h) for d, h in holders(given, claims.holding(given), view.key)
                    if h.namespace not in self._managed]
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
