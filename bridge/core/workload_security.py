"""What a managed namespace's pod may not do, pure: act beyond the Slurm job's user on its node.

A job's tasks run as its user, unprivileged, natively too: a pod must say so (runAsUser, runAsGroup,
no privilege escalation) and reach nothing of the node's (its namespaces, hostPath and other
node-reaching volumes, host ports, an unconfined seccomp, GPUs by variable), or it is not run.
core.workloads refuses such a pod before any job, and checks the ids against Slurm's at bind time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SAFE_VOLUMES = frozenset({"configMap", "secret", "emptyDir", "projected", "downwardAPI",
                          "persistentVolumeClaim", "ephemeral", "image"})
"""Volume kinds a pod of a managed namespace may use; the others reach the node or a storage system
directly (hostPath, nfs, iscsi, csi inline, ...), past what the namespace's claims allow."""

def _containers(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [c for key in ("initContainers", "containers", "ephemeralContainers")
            for c in spec.get(key) or [] if isinstance(c, Mapping)]


def run_as(spec: Mapping[str, Any]) -> tuple[tuple[int | None, int | None], ...]:
    pod_context = spec.get("securityContext") or {}
    found = []
    for container in _containers(spec):
        context = container.get("securityContext") or {}
        found.append((context.get("runAsUser", pod_context.get("runAsUser")),
                      context.get("runAsGroup", pod_context.get("runAsGroup"))))
    return tuple(found)


def unsafe(spec: Mapping[str, Any]) -> str:
    """What would let the pod act beyond the Slurm job's user on its node (empty: nothing). A job's
    tasks run as its user, unprivileged, natively too: a pod must say so, or it is not run."""
    pod_context = spec.get("securityContext") or {}
    problems = [f"spec.{key}" for key in ("hostNetwork", "hostPID", "hostIPC") if spec.get(key)]
    problems += [f"{kind} volume {v.get('name')}" for v in spec.get("volumes") or []
                 for kind in set(v) - {"name"} if kind not in SAFE_VOLUMES]
    if (pod_context.get("seccompProfile") or {}).get("type") == "Unconfined":
        problems.append("the pod runs without seccomp")
    if 0 in (pod_context.get("supplementalGroups") or []) or pod_context.get("fsGroup") == 0:
        problems.append("group 0 in the pod's securityContext")
    for container in _containers(spec):
        context = container.get("securityContext") or {}
        name = container.get("name", "?")
        if context.get("privileged"):
            problems.append(f"container {name} is privileged")
        if (context.get("capabilities") or {}).get("add"):
            problems.append(f"container {name} adds capabilities")
        if context.get("allowPrivilegeEscalation") is not False:
            # Unset is true: a setuid binary of the image would make it root again.
            problems.append(f"container {name} must set allowPrivilegeEscalation: false")
        if (context.get("seccompProfile") or {}).get("type") == "Unconfined":
            problems.append(f"container {name} runs without seccomp")
        if any(port.get("hostPort") for port in container.get("ports") or []):
            problems.append(f"container {name} takes a port of the node (hostPort)")
        for variable in container.get("env") or []:
            if variable.get("name") == "NVIDIA_VISIBLE_DEVICES" and variable.get("value") != "void":
                problems.append(f"container {name} sets NVIDIA_VISIBLE_DEVICES (GPUs come from Slurm only)")
    for (uid, gid), container in zip(run_as(spec), _containers(spec), strict=True):
        if not uid or not gid:
            problems.append(f"container {container.get('name', '?')} must set runAsUser and runAsGroup to "
                            "the Slurm job's user (not root, not the image's choice)")
    return "; ".join(problems)
