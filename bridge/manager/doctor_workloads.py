"""doctor's check of managed namespaces, pure: can a node hold what Slurm gives a Kubernetes pod there?

A kubelet admits a pod against its own allocatable CPUs and memory, whatever Slurm allocated. For
the bridge's own pods that does not matter (they request nothing); for a managed namespace's pods,
which carry their requests, Slurm's node must offer no more than its kubelet admits (less the pods
Slurm does not place, DaemonSets), or a pod Slurm placed there is refused (OutOfcpu, OutOfmemory) and
its job fails with that reason.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from bridge.core.workloads import WorkloadError, quantity


def capacity_notes(
    partitions: Collection[str], slurm_nodes: Collection[Mapping[str, Any]],
    kube_nodes: Mapping[str, Mapping[str, Any]],
) -> list[str]:
    """A warning per node of `partitions` (the managed namespaces' partitions) whose Slurm CPUs or
    memory (slurmrestd's node records) exceed its Kubernetes node's allocatable (of the same name)."""
    notes = []
    for raw in sorted(slurm_nodes, key=lambda n: str(n.get("name"))):
        name = str(raw.get("name"))
        if not set(raw.get("partitions") or []) & set(partitions):
            continue
        node = kube_nodes.get(name)
        allocatable = ((node or {}).get("status") or {}).get("allocatable") or {}
        try:
            cpus = quantity(allocatable.get("cpu", 0))
            memory_mb = quantity(allocatable.get("memory", 0)) / 2**20
        except WorkloadError:
            continue
        offered_cpus, offered_mb = int(raw.get("cpus") or 0), int(raw.get("real_memory") or 0)
        if node is None:
            continue  # the node mapping check says so
        if offered_cpus > cpus or offered_mb > memory_mb:
            notes.append(
                f"warning: node {name}: Slurm offers {offered_cpus} CPUs and {offered_mb} MiB, its kubelet "
                f"admits pods up to {cpus:g} CPUs and {int(memory_mb)} MiB: a managed namespace's pod Slurm "
                "places there may be refused (OutOfcpu/OutOfmemory); set CPUs=/RealMemory= in slurm.conf "
                "to the kubelet's allocatable less its DaemonSets' requests")
    return notes
