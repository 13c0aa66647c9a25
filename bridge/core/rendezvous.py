"""How the pods of a multi-node job find the first node by its Slurm name, as jobs do under Slurm
(`MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)`, torch.distributed's
TCP rendezvous): the first pod is that host (its hostname), and the others get the name as a host
alias of the first pod's address, which exists only once that pod has its network. Pure."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from bridge.core.config import PartitionConfig
from bridge.core.model import JobAllocation

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
"""What Kubernetes takes as a pod's hostname (RFC 1123 label)."""

def first_node_named(alloc: JobAllocation, part: PartitionConfig) -> bool:
    """Every pod of the job can resolve the first Slurm node's name, as `scontrol show hostnames`
    prints it (MASTER_ADDR=$(scontrol show hostnames | head -n1), torch.distributed's rendezvous):
    the first pod is that host (its hostname), the others get it as a host alias of the first
    pod's address (`pods_to_create`). Not with host_network, where the nodes' own names serve,
    nor where the partition turned it off or simulates its nodes (kwok pods run nothing)."""
    return (part.resolve_first_node and not part.host_network and not part.simulated
            and bool(DNS_LABEL.match(alloc.nodes[0].name)))


def pods_to_create(
    manifests: Sequence[dict[str, Any]], alloc: JobAllocation, part: PartitionConfig, first_pod_ip: str,
    first_pod_ended: bool = False,
) -> list[dict[str, Any]]:
    """Which of a run's pod manifests to create now. A pod's host aliases are fixed at creation and
    pod addresses are known only once a pod has its network, so the pods after the first wait for
    the first pod's address (`first_pod_ip`, empty while unknown) and get the first Slurm node's
    name as an alias of it; the first pod goes alone. Single-node jobs, host-network partitions and
    first nodes whose names are not DNS labels start all at once, as before; so do the others when
    the first pod ended without an address to give (there is no one to reach then)."""
    if len(manifests) < 2 or not first_node_named(alloc, part) or (first_pod_ended and not first_pod_ip):
        return list(manifests)
    if not first_pod_ip:
        return [manifests[0]]
    alias = {"ip": first_pod_ip, "hostnames": [alloc.nodes[0].name]}
    later = []
    for manifest in manifests[1:]:
        spec = {**manifest["spec"], "hostAliases": [alias]}
        later.append({**manifest, "spec": spec})
    return [manifests[0], *later]
