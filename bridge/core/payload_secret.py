"""The payload Secret: the job's script and the environment its pods share, in one immutable Secret
named by its content and its user. Pure.

The job's variables (tokens, often) then live in a Secret, readable only by who may read Secrets,
not in the pods (which stay small in etcd and in every watch event); an array's tasks share one.
What differs per job or node stays in each pod's own env (PER_JOB_ENV). Called by translate.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Mapping
from typing import Any

from bridge.core import wellknown
from bridge.core.config import BridgeConfig
from bridge.core.model import JobAllocation
from bridge.core.pod_identity import payload_secret_name

SECRET_DATA_BYTES = 1024 * 1024 - 4096
"""What the values of one Secret may weigh (Kubernetes: 1 MiB), less a margin."""

# What Slurm or the bridge sets for each job (or node): in each pod's own env, so that the Secret
# holds what is the same for every task of an array. Any other variable, SLURM_* ones the user
# exported (SLURM_JWT, say) included, goes into the Secret: the pod shows only these.
PER_JOB_ENV = frozenset({
    "SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NAME", "SLURM_JOB_PARTITION", "SLURM_JOB_USER",
    "SLURM_JOB_UID", "SLURM_JOB_GID", "SLURM_NNODES", "SLURM_JOB_NUM_NODES", "SLURM_JOB_NODELIST",
    "SLURM_NODELIST", "SLURMD_NODENAME", "SLURM_NODEID", "SLURM_PROCID", "SLURM_LOCALID",
    "SLURM_CPUS_ON_NODE", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_GPUS",
    "SLURM_GPUS_ON_NODE", "SLURM_SUBMIT_DIR", "SLURM_RESTART_COUNT", "SLURM_JOB_START_TIME",
    "SLURM_JOB_END_TIME", "SLURM_TASKS_PER_NODE", "SLURM_JOB_CPUS_PER_NODE", "SLURM_NTASKS",
    "SLURM_NPROCS", "SLURM_MEM_PER_NODE", "SLURM_MEM_PER_CPU", "SLURM_JOB_RESERVATION",
    "SLURM_STEP_ID", "SLURM_STEPID", "CUDA_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL", "NVIDIA_VISIBLE_DEVICES", "SLURM_GTIDS", "SLURM_TOPOLOGY_ADDR",
    "SLURM_TOPOLOGY_ADDR_PATTERN", "TMPDIR", wellknown.ENV_SCRIPT_STDIN, wellknown.SECRET_SCRIPT_KEY,
    wellknown.SECRET_PASSWD_KEY, wellknown.SECRET_GROUP_KEY,
})
MAX_POD_ENV_BYTES = 128 * 1024
"""What one pod's own env may weigh (the per-job values and names a Secret cannot hold)."""


def shared_environment(envs: list[dict[str, str]]) -> dict[str, str]:
    """The variables for the Secret: all but Slurm's and the bridge's per-job ones, alike on every
    node, and named as a Secret key may be."""
    return {name: value for name, value in envs[0].items()
            if name not in PER_JOB_ENV and _is_secret_key(name)
            and all(env.get(name) == value for env in envs[1:])}


_SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")


def _is_secret_key(name: str) -> bool:
    """What Kubernetes accepts as a key of a Secret's data."""
    return (len(name) <= 253 and bool(_SECRET_KEY.match(name)) and name not in (".", "..")
            and not name.startswith(".."))


def _utf8(value: str) -> bytes:
    """The value as UTF-8, each byte that was not (the waiter reads the environment with
    surrogateescape) as U+FFFD, which is what the API server made of it when it was in the pod:
    the kubelet refuses invalid UTF-8 in a container's environment."""
    if any("\ud800" <= char <= "\udfff" for char in value):
        value = "".join("\ufffd" if "\ud800" <= char <= "\udfff" else char for char in value)
    return value.encode("utf-8")


def payload_secret(alloc: JobAllocation, cfg: BridgeConfig, shared_env: Mapping[str, str],
                   script: str, files: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The Secret with `script`, `shared_env` and `files` (more keys: the user's /etc/passwd and
    /etc/group), named by its content and its user."""
    data = {name: _utf8(value) for name, value in shared_env.items()}
    data[wellknown.SECRET_SCRIPT_KEY] = _utf8(script)
    data.update((name, _utf8(text)) for name, text in (files or {}).items())
    content = hashlib.sha256(f"{cfg.cluster}\0{alloc.uid}\0{alloc.gid}\0".encode())
    for name in sorted(data):
        content.update(name.encode() + b"\0" + len(data[name]).to_bytes(8, "big") + data[name])
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        # Never changes once made: kubelets then need no watch of it (one per pod at 10,000 jobs).
        "immutable": True,
        "metadata": {
            "name": payload_secret_name(content.hexdigest()[:32]),
            "namespace": cfg.namespace,
            # No job id: the Secret may serve many jobs (the sweep tells when none needs it).
            "labels": {wellknown.LABEL_MANAGED_BY: wellknown.MANAGER, wellknown.LABEL_CLUSTER: cfg.cluster},
        },
        "data": {name: base64.b64encode(value).decode("ascii") for name, value in sorted(data.items())},
    }
