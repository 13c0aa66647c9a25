"""Where a gang's pods go once Slurm allocates, pure: the shape of each task (CPUs, memory), the
node and GPU indices of each pod within the allocation, and the GPUs each pod asks for through its
DRA claims, which the bridge pins to the devices behind Slurm's indices (docs/architecture.md §
The Kubernetes-submitted path, GPUs).

A pod's GPUs are its claims' (spec.resourceClaims), each made for it alone from a
ResourceClaimTemplate; Kubernetes' own allocator never sees them (the pod's scheduler is the bridge),
so the bridge writes their allocation as kube-scheduler would, from Slurm's choice. What a claim asks
that Slurm's choice cannot honour (alternatives, admin access, constraints, driver config, a device
class the partition does not give) is refused before the job is submitted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bridge.core.device_claims import ClaimView, PublishedDevice
from bridge.core.errors import WorkloadError
from bridge.core.model import JobAllocation

if TYPE_CHECKING:
    from bridge.core.workloads import WorkloadPod


class ClaimsNotReady(Exception):
    """A pod's claims are not all made (or not seen) yet; the text says which."""


@dataclass(frozen=True)
class TaskShape:
    """What each task (pod) of a gang's job gets."""

    cpus: int
    memory_mb_per_cpu: int
    """0: the pods request no memory (Slurm's default per CPU applies)."""


def task_shape(pods: Sequence[WorkloadPod]) -> TaskShape:
    """One shape for every task: the largest pod's CPUs (at least one) and memory."""
    cpus = max(1, math.ceil(max(p.cpu_millis for p in pods) / 1000))
    memory_mb = math.ceil(max(p.memory_bytes for p in pods) / 2**20)
    return TaskShape(cpus, math.ceil(memory_mb / cpus) if memory_mb else 0)


@dataclass(frozen=True)
class Placement:
    node: str
    """The Slurm node."""
    gpus: tuple[int, ...]
    """Slurm's GPU indices on it that the pod's claims get."""


def place(
    pods: Sequence[WorkloadPod], alloc: JobAllocation, shape: TaskShape,
    gpus: Mapping[str, int] | None = None, bound_to: Mapping[str, str] | None = None,
) -> dict[str, Placement] | str:
    """Where each pod (by name) goes: as many pods on each allocated node as its CPUs (and memory, when
    Slurm tracks it) and GPUs hold, in Slurm's node order; each pod gets `gpus[name]` of the node's GPU
    indices, none twice. A pod bound already (`bound_to`: its Slurm node) stays there with the indices
    it was given (its record), whatever its claims say now. A text says why they do not fit: the
    allocation is not what the gang needs, and no pod may run beyond what Slurm gave."""
    wanted = gpus or {}
    fixed = bound_to or {}
    free = {n.name: [n.cpus, n.memory_mb] for n in alloc.nodes}
    free_gpus = {n.name: list(n.gpu_indices) for n in alloc.nodes}
    tracked = {n.name: n.memory_mb > 0 for n in alloc.nodes}  # 0: Slurm does not track memory there
    need_mb = shape.memory_mb_per_cpu * shape.cpus
    placed: dict[str, Placement] = {}
    ordered = sorted(pods, key=lambda p: (p.name not in fixed, p.name))
    for pod in ordered:
        need_gpus = wanted.get(pod.name, 0)
        if pod.name in fixed and fixed[pod.name] in free:
            node: str | None = fixed[pod.name]
            given = tuple(i for i in pod.slurm_gpus or () if i in free_gpus[fixed[pod.name]])
        else:
            node = next((name for name, (cpus, memory) in free.items()
                         if cpus >= shape.cpus and (not tracked[name] or memory >= need_mb)
                         and len(free_gpus[name]) >= need_gpus), None)
            given = tuple(free_gpus[node][:need_gpus]) if node is not None else ()
        if node is None:
            gpu_words = f" and {max(wanted.values())} GPUs" if any(wanted.values()) else ""
            return (f"job {alloc.job_id}'s allocation ({alloc.nodelist}) does not hold {len(pods)} tasks of "
                    f"{shape.cpus} CPUs and {need_mb} MiB{gpu_words}")
        free[node][0] -= shape.cpus
        free[node][1] -= need_mb
        free_gpus[node] = [i for i in free_gpus[node] if i not in given]
        placed[pod.name] = Placement(node, given)
    return placed


def claim_gpus(
    pod: WorkloadPod, claims: Callable[[str, str], ClaimView | None], device_class: str | None,
    partition: str, *, allocated_by_bridge: bool = False,
) -> int:
    """How many GPUs `pod`'s claims ask for (0 without claims). WorkloadError when the claims cannot be
    honoured; ClaimsNotReady while one is not made yet. `allocated_by_bridge`: checked again at bind
    time, when the bridge may have written their allocation already."""
    if not pod.claims:
        return 0
    if device_class is None:
        raise WorkloadError(f"pod {pod.name} asks for devices through DRA claims, but partition {partition} "
                            "does not give GPUs by DRA claims (its gpu_mode is not \"dra\")")
    total = 0
    for entry in pod.claims:
        if not entry.template:
            raise WorkloadError(
                f"pod {pod.name}'s claim {entry.name} names the shared ResourceClaim {entry.claim}: the GPUs "
                "Slurm gives one task go to a claim of that pod's own; use resourceClaimTemplateName")
        if not entry.claim:
            raise ClaimsNotReady(f"Kubernetes has not made pod {pod.name}'s claim {entry.name} from "
                                 f"ResourceClaimTemplate {entry.template} yet")
        view = claims(pod.namespace, entry.claim)
        if view is None:
            raise ClaimsNotReady(f"ResourceClaim {pod.namespace}/{entry.claim} is not seen yet")
        if view.owner_pod_uid != pod.uid:
            raise WorkloadError(f"ResourceClaim {view.key} is not pod {pod.name}'s own")
        if view.devices and not allocated_by_bridge:
            raise WorkloadError(f"ResourceClaim {view.key} was allocated before Slurm chose its GPUs")
        if view.extras:
            raise WorkloadError(f"ResourceClaim {view.key} sets {' and '.join(view.extras)}: Slurm chooses "
                                "the GPUs, and only their count is honoured")
        for request in view.requests:
            if not request.device_class:
                raise WorkloadError(f"request {request.name} of ResourceClaim {view.key} gives alternatives "
                                    "(firstAvailable); Slurm allocates one kind, ask for it with exactly")
            if request.device_class != device_class:
                raise WorkloadError(f"request {request.name} of ResourceClaim {view.key} asks for class "
                                    f"{request.device_class}; partition {partition} gives {device_class}")
            if request.admin_access:
                raise WorkloadError(f"request {request.name} of ResourceClaim {view.key} asks for admin "
                                    "access: a device Slurm gave another job is never shared")
            if request.unhonoured:
                raise WorkloadError(f"request {request.name} of ResourceClaim {view.key} sets "
                                    f"{' and '.join(request.unhonoured)}: Slurm chooses the GPUs, and only "
                                    "their count is honoured")
            if request.count <= 0:
                raise WorkloadError(f"request {request.name} of ResourceClaim {view.key} asks for all "
                                    "devices; ask for a count (allocationMode ExactCount)")
            total += request.count
    return total


def claim_results(
    views: Sequence[ClaimView], devices: Sequence[PublishedDevice]
) -> list[tuple[ClaimView, list[PublishedDevice], list[str]]]:
    """`devices` (Slurm's, in its index order) shared out among the pod's claims, request by request:
    each claim with its devices and the request each answers. ValueError if the counts differ."""
    left = list(devices)
    shares = []
    for view in views:
        mine: list[PublishedDevice] = []
        names: list[str] = []
        for request in view.requests:
            if len(left) < request.count:
                raise ValueError(f"{len(devices)} devices for claims that ask for more")
            mine += left[: request.count]
            names += [request.name] * request.count
            left = left[request.count:]
        shares.append((view, mine, names))
    if left:
        raise ValueError(f"{len(devices)} devices for claims that ask for {len(devices) - len(left)}")
    return shares
