"""What doctor checks the daemon may do in Kubernetes: the RBAC it needs, by mode."""

from __future__ import annotations

# What the daemon does in Kubernetes (the RBAC it needs), as (verb, group, resource, namespaced).
NEEDED_ACCESS = (
    ("create", "", "pods", True),
    ("delete", "", "pods", True),
    ("list", "", "pods", True),
    ("watch", "", "pods", True),
    ("patch", "", "pods", True),
    ("get", "", "pods/log", True),
    ("create", "", "pods/exec", True),
    ("list", "", "events", True),
    ("create", "", "secrets", True),
    ("delete", "", "secrets", True),
    ("list", "", "secrets", True),
    ("get", "", "namespaces", True),
    ("get", "coordination.k8s.io", "leases", True),
    ("create", "coordination.k8s.io", "leases", True),
    ("update", "coordination.k8s.io", "leases", True),
    ("list", "", "nodes", False),
    ("watch", "", "nodes", False),
    ("patch", "", "nodes/status", False),
)
# gpu_mode = "dra" (bridge/controller/device_claims.py): the GPU pods' claims and bindings, and one
# watch each of the cluster's ResourceSlices and ResourceClaims.
NEEDED_FOR_DRA = (
    ("create", "resource.k8s.io", "resourceclaims", True),
    ("delete", "resource.k8s.io", "resourceclaims", True),
    ("patch", "resource.k8s.io", "resourceclaims/status", True),
    ("create", "", "pods/binding", True),
    ("list", "resource.k8s.io", "resourceclaims", False),
    ("watch", "resource.k8s.io", "resourceclaims", False),
    ("list", "resource.k8s.io", "resourceslices", False),
    ("watch", "resource.k8s.io", "resourceslices", False),
)
# [workloads.namespaces] (bridge/controller/kube_workloads.py): one cluster-wide watch of the pods
# handed to the bridge, their marks, bindings, conditions, events and deletion; their Jobs' size.
NEEDED_FOR_WORKLOADS = (
    ("list", "", "pods", False),
    ("watch", "", "pods", False),
    ("patch", "", "pods", False),
    ("delete", "", "pods", False),
    ("create", "", "pods/binding", False),
    ("patch", "", "pods/status", False),
    ("create", "", "events", False),
    ("get", "batch", "jobs", False),
)
# Both: the GPUs of those pods, written into their own claims in any managed namespace.
NEEDED_FOR_WORKLOAD_GPUS = (("patch", "resource.k8s.io", "resourceclaims/status", False),)
# In a pod, on its own namespace: the leader labels its own pod (bridge/clients/kube/leader_pod.py).
NEEDED_IN_OWN_NAMESPACE = (("get", "", "pods"), ("list", "", "pods"), ("patch", "", "pods"))


def needed_access(
    job_namespace: str, own_namespace: str | None, dra: bool = False, workloads: bool = False
) -> list[tuple[str, str, str, str | None]]:
    """(verb, group, resource, namespace or None for cluster-wide) the daemon needs."""
    wanted = NEEDED_ACCESS + (NEEDED_FOR_DRA if dra else ()) + (NEEDED_FOR_WORKLOADS if workloads else ()) \
        + (NEEDED_FOR_WORKLOAD_GPUS if dra and workloads else ())
    needed = [(verb, group, resource, job_namespace if namespaced else None)
              for verb, group, resource, namespaced in wanted]
    if own_namespace:
        needed += [(verb, group, resource, own_namespace)
                   for verb, group, resource in NEEDED_IN_OWN_NAMESPACE]
    return needed
