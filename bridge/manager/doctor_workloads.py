"""doctor's check of managed namespaces, pure: can a node hold what Slurm gives a Kubernetes pod there?

A kubelet admits a pod against its own allocatable CPUs and memory, whatever Slurm allocated. For
the bridge's own pods that does not matter (they request nothing); for a managed namespace's pods,
which carry their requests, Slurm's node must offer no more than its kubelet admits (less the pods
Slurm does not place, DaemonSets), or a pod Slurm placed there is refused (OutOfcpu, OutOfmemory) and
its job fails with that reason.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from bridge.core.workloads import WorkloadError, quantity


def not_slurms(pods: Iterable[Mapping[str, Any]]) -> dict[str, tuple[float, float]]:
    """Node name -> (CPUs, memory bytes) that pods Slurm does not place request there: the DaemonSets'
    pods (a node's agents: CNI, DRA drivers, monitoring) that have not ended."""
    held: dict[str, tuple[float, float]] = {}
    for pod in pods:
        owners = (pod.get("metadata") or {}).get("ownerReferences") or []
        node = (pod.get("spec") or {}).get("nodeName")
        phase = (pod.get("status") or {}).get("phase")
        if not node or phase in ("Succeeded", "Failed"):
            continue
        if not any(o.get("kind") == "DaemonSet" for o in owners):
            continue
        cpu = memory = 0.0
        for container in (pod.get("spec") or {}).get("containers") or []:
            requests = (container.get("resources") or {}).get("requests") or {}
            try:
                cpu += quantity(requests.get("cpu", 0))
                memory += quantity(requests.get("memory", 0))
            except WorkloadError:
                continue
        before = held.get(node, (0.0, 0.0))
        held[node] = (before[0] + cpu, before[1] + memory)
    return held


def capacity_notes(
    partitions: Collection[str], slurm_nodes: Collection[Mapping[str, Any]],
    kube_nodes: Mapping[str, Mapping[str, Any]], not_placed: Mapping[str, tuple[float, float]] | None = None,
) -> list[str]:
    """A warning per node of `partitions` (the managed namespaces' partitions) whose Slurm CPUs or
    memory (slurmrestd's node records) exceed what its Kubernetes node (of the same name) admits: its
    allocatable less what the pods Slurm does not place there request (`not_placed`, by not_slurms)."""
    notes = []
    for raw in sorted(slurm_nodes, key=lambda n: str(n.get("name"))):
        name = str(raw.get("name"))
        if not set(raw.get("partitions") or []) & set(partitions):
            continue
        node = kube_nodes.get(name)
        allocatable = ((node or {}).get("status") or {}).get("allocatable") or {}
        others_cpu, others_memory = (not_placed or {}).get(name, (0.0, 0.0))
        try:
            cpus = quantity(allocatable.get("cpu", 0)) - others_cpu
            memory_mb = (quantity(allocatable.get("memory", 0)) - others_memory) / 2**20
        except WorkloadError:
            continue
        offered_cpus, offered_mb = int(raw.get("cpus") or 0), int(raw.get("real_memory") or 0)
        if node is None:
            continue  # the node mapping check says so
        if offered_cpus > cpus or offered_mb > memory_mb:
            daemons = (f" (its allocatable less {others_cpu:g} CPUs and {int(others_memory / 2**20)} MiB its "
                       "DaemonSets' pods request)") if others_cpu or others_memory else ""
            notes.append(
                f"warning: node {name}: Slurm offers {offered_cpus} CPUs and {offered_mb} MiB, its kubelet "
                f"admits pods up to {cpus:g} CPUs and {int(memory_mb)} MiB{daemons}: a managed namespace's "
                "pod Slurm places there may be refused (OutOfcpu/OutOfmemory); set slurm.conf's "
                f"CPUs={max(0, math.floor(cpus))} RealMemory={max(0, int(memory_mb))} for it (or hold the "
                "difference back with CoreSpecCount/MemSpecLimit)")
    return notes
