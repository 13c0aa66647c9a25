"""Allocation -> desired pods: one plain-dict Pod manifest per allocated node. Pure.

The manifests are deterministic (same input, same dicts: no timestamps, sorted environment), so a
planner can compare them with what exists and a restarted daemon rebuilds the same state.

Decisions worth knowing (each explained where it is made):
- the script and the environment the user exported live in one immutable Secret named by its
  content (payload_secret; an array's tasks share it), not in the pods: pods stay small in etcd,
  in every watch event and relist, and the job's variables (tokens, often) are readable only by
  who may read Secrets. The script reaches the container through a secret volume, and runs with
  the interpreter of its shebang;
- the job's environment is passed on minus what describes the slurmd host, then per-node Slurm
  variables are set in each pod's own env, where every `$` is escaped because the kubelet expands
  `$(VAR)` there (values from envFrom are never expanded);
- GPUs are pinned by NVIDIA_VISIBLE_DEVICES (physical indices Slurm chose); CUDA_VISIBLE_DEVICES
  counts from 0 because the container only sees its own GPUs;
- the pause container is PID 1 (shareProcessNamespace) so that the script gets SIGTERM on delete.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from bridge.core import wellknown
from bridge.core.config import BridgeConfig, PartitionConfig
from bridge.core.directives import Directives, interpreter_of
from bridge.core.errors import PermanentError
from bridge.core.model import JobAllocation, JobPayload
from bridge.core.pod_identity import payload_secret_name, pod_name

MAX_SCRIPT_BYTES = 240 * 1024
"""Largest script kept in the payload Secret; larger ones are copied into the pod by the agent."""
SECRET_DATA_BYTES = 1024 * 1024 - 4096
"""What the values of one Secret may weigh (Kubernetes: 1 MiB), less a margin."""
MAX_DELIVERED_SCRIPT_BYTES = 4 * 1024 * 1024
"""Largest script accepted: Slurm's own default max_script_size. Scripts over MAX_SCRIPT_BYTES are
copied into the pod by the agent."""

MASTER_PORT_BASE = 20000
"""MASTER_PORT = base + job id % 10000: fixed per job, and jobs sharing a host network rarely clash."""

DEFAULT_PULL_POLICY = "IfNotPresent"

# Variables that describe the slurmd host, the waiter process or the login session, not the job.
# PATH is one of them: the image's PATH (conda, /usr/local/cuda/bin, ...) must win over the host's.
# LD_* point at host libraries and would break (or hijack) binaries in the image.
HOST_ONLY_ENV = frozenset(
    {
        "PATH",
        "HOSTNAME",
        "HOST",
        "PWD",
        "OLDPWD",
        "SHLVL",
        "_",
        "TMPDIR",
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "LD_AUDIT",
        "XDG_RUNTIME_DIR",
        "DBUS_SESSION_BUS_ADDRESS",
        "DISPLAY",
        "XAUTHORITY",
        "KRB5CCNAME",
        "MAIL",
    }
)
HOST_ONLY_PREFIXES = (
    "SLURM_K8S_",  # the waiter's own settings
    "KUBERNETES_",  # the kubelet sets the pod's own API endpoint
    "BASH_FUNC_",  # exported shell functions: invalid env names for Kubernetes anyway
    "SSH_",
    "XDG_SESSION_",
    "SLURM_STEP_",  # the batch step on the slurmd; pods are not that step
)

# Slurm's values for the batch host that the bridge replaces with per-node values (or drops).
PER_NODE_ENV = frozenset(
    {
        "SLURMD_NODENAME",
        "SLURM_NODEID",
        "SLURM_PROCID",
        "SLURM_LOCALID",
        "SLURM_GTIDS",
        "SLURM_TASK_PID",
        "SLURM_STEPID",
        "SLURM_CPUS_ON_NODE",
        "SLURM_TOPOLOGY_ADDR",
        "SLURM_TOPOLOGY_ADDR_PATTERN",
        "SLURM_CONF",
        "SLURM_SCRIPT_CONTEXT",
        "SLURM_LAUNCH_NODE_IPADDR",
        "SLURM_SRUN_COMM_HOST",
        "SLURM_SRUN_COMM_PORT",
        "SLURM_NODE_ALIASES",
        "SLURM_JOB_GPUS",
        "SLURM_GPUS_ON_NODE",
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "GPU_DEVICE_ORDINAL",
        "ROCR_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "ZE_AFFINITY_MASK",
    }
)

# What Kubernetes accepts as an env var name without the RelaxedEnvironmentVariableValidation gate.
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class TranslateError(PermanentError, ValueError):
    """The job cannot be expressed as pods (no image, root job, unknown node, ...)."""


def resolve_image(directives: Directives, part: PartitionConfig) -> str:
    """The job's image: its `#K8S image=` directive, else the partition's default."""
    image = directives.image or part.default_image
    if not image:
        raise TranslateError(
            "no container image: add a line '#K8S image=IMAGE' to the job script's leading comments"
        )
    return image


def job_environment(environment: Mapping[str, str]) -> dict[str, str]:
    """The payload's environment minus host-only, per-node and invalidly named variables."""
    return {
        name: value
        for name, value in environment.items()
        if name not in HOST_ONLY_ENV
        and name not in PER_NODE_ENV
        and not name.startswith(HOST_ONLY_PREFIXES)
        and _ENV_NAME.match(name)
    }


def node_environment(
    alloc: JobAllocation, payload: JobPayload, part: PartitionConfig, index: int, master_addr: str,
    home: str | None = None,
) -> dict[str, str]:
    """The full environment of node `index`'s container (before `$` escaping)."""
    node = alloc.nodes[index]
    count = len(alloc.nodes)
    env = job_environment(payload.environment)
    # A job exported without them (--export=NONE) would get them from its login environment
    # natively; that is never built for a bridged job (it runs the user's login scripts on the
    # slurmd host), so the basics come from Slurm and NSS.
    if alloc.user:
        env.setdefault("USER", alloc.user)
        env.setdefault("LOGNAME", alloc.user)
    if home:
        env.setdefault("HOME", home)
    env.setdefault("SLURM_SUBMIT_DIR", payload.work_dir)
    env.update(
        {
            "SLURM_JOB_ID": str(alloc.job_id),
            "SLURM_JOBID": str(alloc.job_id),
            "SLURM_JOB_NAME": alloc.name,
            "SLURM_JOB_PARTITION": alloc.partition,
            "SLURM_JOB_USER": alloc.user,
            "SLURM_JOB_UID": str(alloc.uid),
            "SLURM_JOB_GID": str(alloc.gid),
            "SLURM_NNODES": str(count),
            "SLURM_JOB_NUM_NODES": str(count),
            "SLURM_JOB_NODELIST": alloc.nodelist,
            "SLURM_NODELIST": alloc.nodelist,
            "SLURMD_NODENAME": node.name,
            "SLURM_NODEID": str(index),
            # One script instance per node, so node index = task rank, local rank 0.
            "SLURM_PROCID": str(index),
            "SLURM_LOCALID": "0",
            # torch.distributed & co.: one process per node; torchrun overrides RANK/WORLD_SIZE for
            # its workers and reads NODE_RANK. MASTER_ADDR is the first Kubernetes node: reachable
            # only with the partition's host_network (pod IPs are not known in advance and the
            # bridge creates no Service).
            "RANK": str(index),
            "NODE_RANK": str(index),
            "WORLD_SIZE": str(count),
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(MASTER_PORT_BASE + alloc.job_id % 10000),
        }
    )
    if node.cpus > 0:
        env["SLURM_CPUS_ON_NODE"] = str(node.cpus)
    if alloc.is_array_task:
        env["SLURM_ARRAY_JOB_ID"] = str(alloc.array_job_id)
        env["SLURM_ARRAY_TASK_ID"] = str(alloc.array_task_id)
    env.update(gpu_environment(node.gpu_indices, part.gpu_mode))
    return env


def gpu_environment(indices: tuple[int, ...], gpu_mode: str) -> dict[str, str]:
    """GPU variables for a container given the node's GPU indices Slurm allocated.

    - SLURM_JOB_GPUS: the physical indices, as Slurm sets it.
    - NVIDIA_VISIBLE_DEVICES: the physical indices (env mode), read by the NVIDIA runtime to expose
      exactly these devices; `void` when the node has none, because CUDA base images set `all`
      in their ENV and would otherwise get every GPU of the node. In device-plugin mode the
      plugin sets it for the devices it picked.
    - CUDA_VISIBLE_DEVICES / GPU_DEVICE_ORDINAL: 0..n-1, because inside the container only the
      exposed GPUs exist, numbered from 0 (Slurm does the same with ConstrainDevices=yes). Left
      unset without GPUs, as Slurm does.
    """
    if not indices:
        return {"NVIDIA_VISIBLE_DEVICES": "void"}
    local = ",".join(str(i) for i in range(len(indices)))
    env = {
        "SLURM_JOB_GPUS": ",".join(map(str, indices)),
        "SLURM_GPUS_ON_NODE": str(len(indices)),
        "CUDA_VISIBLE_DEVICES": local,
        "GPU_DEVICE_ORDINAL": local,
    }
    if gpu_mode == "env":
        env["NVIDIA_VISIBLE_DEVICES"] = env["SLURM_JOB_GPUS"]
    return env


def desired_pods(
    alloc: JobAllocation,
    payload: JobPayload,
    directives: Directives,
    part: PartitionConfig,
    cfg: BridgeConfig,
    k8s_nodes: Mapping[str, str] | None = None,
    *,
    supplemental_groups: Sequence[int] = (),
    strict_groups_nodes: Collection[str] = (),
    home: str | None = None,
) -> list[dict[str, Any]]:
    """The pods of desired_objects."""
    return desired_objects(alloc, payload, directives, part, cfg, k8s_nodes,
                           supplemental_groups=supplemental_groups,
                           strict_groups_nodes=strict_groups_nodes, home=home)[1]


def desired_objects(
    alloc: JobAllocation,
    payload: JobPayload,
    directives: Directives,
    part: PartitionConfig,
    cfg: BridgeConfig,
    k8s_nodes: Mapping[str, str] | None = None,
    *,
    supplemental_groups: Sequence[int] = (),
    strict_groups_nodes: Collection[str] = (),
    home: str | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The job's payload Secret (create it first: the pods mount it), and one Pod manifest per
    allocated node, in node order.

    `k8s_nodes` maps Slurm node names to Kubernetes node names; it is required when the partition
    has a `node_label` (the caller looks the labels up), and ignored otherwise (same names).
    `supplemental_groups`: the job user's other groups, as the caller resolved them from Slurm's
    user name (bridge.clients.identity), never from the payload. `strict_groups_nodes`: the
    Kubernetes nodes that enforce supplementalGroupsPolicy Strict (for the `auto` policy).
    `home`: the user's home from NSS, for a job exported without HOME.
    """
    _check_identity(alloc, payload)
    if not alloc.nodes:
        raise TranslateError(f"job {alloc.job_id} has no allocated nodes (state {alloc.state or '?'})")
    try:
        script_bytes = len(payload.script.encode("utf-8"))
    except UnicodeEncodeError:
        raise TranslateError("the job script is not valid UTF-8") from None
    if script_bytes > MAX_SCRIPT_BYTES and not cfg.pods.agent_image:
        raise TranslateError(
            f"the job script has {script_bytes} bytes; at most {MAX_SCRIPT_BYTES} fit into a pod "
            "without the bridge's in-pod agent ([pods] agent_image)"
        )
    if script_bytes > MAX_DELIVERED_SCRIPT_BYTES:
        raise TranslateError(
            f"the job script has {script_bytes} bytes; at most {MAX_DELIVERED_SCRIPT_BYTES} are accepted"
        )
    image = resolve_image(directives, part)
    k8s_names = kubernetes_node_names(alloc, part, k8s_nodes)
    groups = sorted({g for g in supplemental_groups if g > 0 and g != alloc.gid})
    delivered = script_bytes > MAX_SCRIPT_BYTES
    envs = [_container_env(alloc, payload, part, cfg, index, k8s_names, home, delivered)
            for index in range(len(alloc.nodes))]
    shared = _shared(envs)
    env_bytes = sum(len(value.encode("utf-8", "surrogateescape")) for value in shared.values())
    if env_bytes > SECRET_DATA_BYTES:
        largest = sorted(shared, key=lambda name: len(shared[name]), reverse=True)[:3]
        raise TranslateError(
            f"the job's environment has {env_bytes} bytes; at most {SECRET_DATA_BYTES} fit into "
            f"Kubernetes (a Secret); the largest variables: {', '.join(largest)}")
    if not delivered and script_bytes + env_bytes > SECRET_DATA_BYTES:
        if not cfg.pods.agent_image:
            raise TranslateError(
                f"the job script ({script_bytes} bytes) and its environment ({env_bytes} bytes) "
                f"together exceed the {SECRET_DATA_BYTES} bytes that fit into Kubernetes (a Secret) "
                "without the bridge's in-pod agent ([pods] agent_image)")
        delivered = True  # the agent copies the script in once the first pod runs
        envs = [_container_env(alloc, payload, part, cfg, index, k8s_names, home, delivered)
                for index in range(len(alloc.nodes))]
        shared = _shared(envs)
    secret = payload_secret(alloc, cfg, shared, "" if delivered else payload.script)
    secret_name = secret["metadata"]["name"]
    for env in envs:
        own = {name: value for name, value in env.items() if name not in shared}
        own_bytes = sum(len(name) + len(value.encode("utf-8", "surrogateescape"))
                        for name, value in own.items())
        if own_bytes > MAX_POD_ENV_BYTES:
            largest = sorted(own, key=lambda name: len(own[name]), reverse=True)[:3]
            raise TranslateError(
                f"the job's per-job variables have {own_bytes} bytes; at most {MAX_POD_ENV_BYTES} fit "
                f"into a pod; the largest: {', '.join(largest)}")
    pods = [
        _pod(alloc, payload, directives, part, cfg, image, index, k8s_names, groups,
             _groups_policy(cfg.pods.supplemental_groups_policy, k8s_names[index], strict_groups_nodes),
             {name: value for name, value in envs[index].items() if name not in shared},
             delivered, secret_name)
        for index in range(len(alloc.nodes))
    ]
    return secret, pods


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
    "RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL", "NVIDIA_VISIBLE_DEVICES", wellknown.SECRET_SCRIPT_KEY,
})
MAX_POD_ENV_BYTES = 128 * 1024
"""What one pod's own env may weigh (the per-job values and names a Secret cannot hold)."""


def _shared(envs: list[dict[str, str]]) -> dict[str, str]:
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


def _labels(alloc: JobAllocation, cfg: BridgeConfig) -> dict[str, str]:
    labels = {
        wellknown.LABEL_MANAGED_BY: wellknown.MANAGER,
        wellknown.LABEL_CLUSTER: cfg.cluster,
        wellknown.LABEL_JOB_ID: str(alloc.job_id),
        wellknown.LABEL_RUN: str(alloc.run),
    }
    if alloc.is_array_task:
        labels[wellknown.LABEL_ARRAY_JOB_ID] = str(alloc.array_job_id)
    return labels


def _container_env(
    alloc: JobAllocation, payload: JobPayload, part: PartitionConfig, cfg: BridgeConfig, index: int,
    k8s_names: list[str], home: str | None, delivered: bool,
) -> dict[str, str]:
    """Everything node `index`'s container gets in its environment (before `$` escaping)."""
    env = node_environment(alloc, payload, part, index, master_addr=k8s_names[0], home=home)
    if delivered and index == 0:
        env[wellknown.ENV_SCRIPT_PENDING] = wellknown.AGENT_SCRIPT
    if cfg.pods.agent_image:
        # `srun` in the job is the agent's step launcher (a symlink in its bin directory).
        env["PATH"] = f"{wellknown.AGENT_DIR}/bin:" + (env.get("PATH") or DEFAULT_PATH)
    env[wellknown.SECRET_SCRIPT_KEY] = _script_path(index, delivered)
    return env


def _script_path(index: int, delivered: bool) -> str:
    if delivered and index == 0:
        return wellknown.AGENT_SCRIPT  # copied in once the pod runs (agent receive-script)
    return f"{wellknown.SCRIPT_DIR}/{wellknown.SCRIPT_FILE}"


def payload_secret(alloc: JobAllocation, cfg: BridgeConfig, shared_env: Mapping[str, str],
                   script: str) -> dict[str, Any]:
    """The Secret with `script` and `shared_env`, named by its content and its user."""
    data = {name: _utf8(value) for name, value in shared_env.items()}
    data[wellknown.SECRET_SCRIPT_KEY] = _utf8(script)
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


def _check_identity(alloc: JobAllocation, payload: JobPayload) -> None:
    if alloc.uid is None or alloc.gid is None:
        raise TranslateError(f"Slurm did not report the uid/gid of job {alloc.job_id}")
    if alloc.uid == 0:
        # A root job would run as root on a Kubernetes node; job_submit.lua rejects it too.
        raise TranslateError("jobs of root (uid 0) are not run on Kubernetes")
    if (payload.uid, payload.gid) != (alloc.uid, alloc.gid):
        raise TranslateError(
            f"payload identity {payload.uid}:{payload.gid} differs from job {alloc.job_id}'s "
            f"{alloc.uid}:{alloc.gid}"
        )


def kubernetes_node_names(
    alloc: JobAllocation, part: PartitionConfig, k8s_nodes: Mapping[str, str] | None
) -> list[str]:
    """The Kubernetes node of each allocated Slurm node, in node order (see desired_pods)."""
    return [_k8s_node(name, part, k8s_nodes) for name in alloc.node_names]


def _k8s_node(slurm_name: str, part: PartitionConfig, k8s_nodes: Mapping[str, str] | None) -> str:
    if part.node_label is None:
        return slurm_name
    found = (k8s_nodes or {}).get(slurm_name)
    if not found:
        raise TranslateError(f"no Kubernetes node has label {part.node_label}={slurm_name}")
    return found


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def expand_annotations(templates: Mapping[str, str], environment: Mapping[str, str]) -> dict[str, str]:
    """The partition's pod annotations with `${NAME}` replaced by the job's variable NAME, and
    `${NAME:-default}` by the default (which may hold `${...}` itself) when NAME is unset or
    empty, as in sh. Values from the job are inserted as they are, never expanded again."""
    return {key: _expand(value, environment) for key, value in templates.items()}


def _expand(text: str, environment: Mapping[str, str]) -> str:
    out, _ = _expand_until(text, 0, environment, closing=False)
    return out


def _expand_until(text: str, pos: int, env: Mapping[str, str], *, closing: bool) -> tuple[str, int]:
    """Expand from `pos` to the end, or (closing) to the `}` that ends a default; return the text
    and the position after it."""
    out: list[str] = []
    while pos < len(text):
        if closing and text[pos] == "}":
            return "".join(out), pos + 1
        name = _NAME.match(text, pos + 2) if text.startswith("${", pos) else None
        if name is None:
            out.append(text[pos])
            pos += 1
            continue
        pos = name.end()
        default = ""
        if text.startswith(":-", pos):
            default, pos = _expand_until(text, pos + 2, env, closing=True)
        elif text.startswith("}", pos):
            pos += 1
        else:  # not a reference after all: keep it literally
            out.append(text[name.start() - 2:pos])
            continue
        out.append(env.get(name.group()) or default)
    return "".join(out), pos


def _pod(
    alloc: JobAllocation,
    payload: JobPayload,
    directives: Directives,
    part: PartitionConfig,
    cfg: BridgeConfig,
    image: str,
    index: int,
    k8s_names: list[str],
    groups: list[int],
    groups_policy: str,
    env: dict[str, str],
    delivered: bool,
    secret_name: str,
) -> dict[str, Any]:
    """Node `index`'s pod; `env` is what its container gets beyond the Secret's shared variables."""
    node = alloc.nodes[index]
    script_path = _script_path(index, delivered)
    labels = _labels(alloc, cfg)
    annotations = {
        **expand_annotations(part.pod_annotations, payload.environment),
        wellknown.ANNOTATION_NODE_INDEX: str(index),
        wellknown.ANNOTATION_NODE_COUNT: str(len(alloc.nodes)),
        wellknown.ANNOTATION_SLURM_NODE: node.name,
        wellknown.ANNOTATION_USER: alloc.user,
        wellknown.ANNOTATION_PAYLOAD_SECRET: secret_name,
    }

    quantities: dict[str, str] = {}
    if node.cpus > 0:
        quantities["cpu"] = str(node.cpus)
    if node.memory_mb > 0:
        quantities["memory"] = f"{node.memory_mb}Mi"
    if part.gpu_mode == "device-plugin" and node.gpu_indices:
        quantities[wellknown.GPU_RESOURCE] = str(len(node.gpu_indices))
    requests = dict(quantities)
    if node.cpus > 0 and part.cpu_request_fraction < 1.0:
        # Slurm already decided the job fits; a site that tells Slurm more CPUs than the
        # kubelet reports (oversubscription) must keep the kubelet from refusing the pod.
        requests["cpu"] = f"{max(1, round(node.cpus * 1000 * part.cpu_request_fraction))}m"

    # The script arrives as a file: one key of the job's Secret, as a secret volume. Unlike an env
    # var it does not leak into every child process's environment or hit the 128 KiB limit of one
    # env string; unlike writing it out from a shell wrapper it needs no shell and no writable
    # directory in the image. The file is read by the shebang's interpreter, so it needs no
    # exec permission (volume mounts may be noexec).
    volumes: list[dict[str, Any]] = [
        {
            "name": wellknown.SCRIPT_VOLUME,
            "secret": {
                "secretName": secret_name,
                "defaultMode": 0o444,
                "items": [{"key": wellknown.SECRET_SCRIPT_KEY, "path": wellknown.SCRIPT_FILE}],
            },
        }
    ]
    mounts: list[dict[str, Any]] = [
        {"name": wellknown.SCRIPT_VOLUME, "mountPath": wellknown.SCRIPT_DIR, "readOnly": True}
    ]
    for vol in part.volumes:
        # type Directory: a missing host directory fails the pod instead of being created as root.
        volumes.append({"name": vol.name, "hostPath": {"path": vol.host_path, "type": "Directory"}})
        mounts.append({"name": vol.name, "mountPath": vol.mount_path, "readOnly": vol.read_only})
    if directives.shm_size:
        volumes.append(
            {"name": wellknown.SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": directives.shm_size}}
        )
        mounts.append({"name": wellknown.SHM_VOLUME, "mountPath": "/dev/shm"})

    agent = cfg.pods.agent_image
    if delivered and index == 0 and not part.simulated:  # a simulated pod has nothing to exec in
        annotations[wellknown.ANNOTATION_SCRIPT_DELIVERY] = "exec"
    command = [*interpreter_of(payload.script), script_path]
    if agent:
        annotations[wellknown.ANNOTATION_OUTPUT] = wellknown.OUTPUT_FRAMED
        volumes.append({"name": wellknown.AGENT_VOLUME, "emptyDir": {"sizeLimit": "64Mi"}})
        mounts.append({"name": wellknown.AGENT_VOLUME, "mountPath": wellknown.AGENT_DIR})
        mode = "merged" if payload.output_merged else "split"
        agent_path = f"{wellknown.AGENT_DIR}/{wellknown.AGENT_BINARY}"
        # The batch script runs once, on the first node, as on Slurm's batch host; the other
        # nodes' pods hold their share of the allocation.
        command = ([agent_path, "run", wellknown.AGENT_PIDFILE, mode, "--", *command] if index == 0
                   else [agent_path, "wait"])
    if part.simulated:
        annotations[wellknown.ANNOTATION_OUTPUT] = wellknown.OUTPUT_NONE
    container: dict[str, Any] = {
        "name": wellknown.CONTAINER_NAME,
        "image": image,
        "imagePullPolicy": directives.pull_policy or part.image_pull_policy or DEFAULT_PULL_POLICY,
        "command": [escape_for_kubelet(arg) for arg in command],
        "workingDir": directives.workdir or payload.work_dir,
        # The Secret's variables first; the pod's own (per-node) ones win over them.
        "envFrom": [{"secretRef": {"name": secret_name}}],
        "env": [{"name": name, "value": escape_for_kubelet(env[name])} for name in sorted(env)],
        "resources": {"requests": requests, "limits": dict(quantities)},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": mounts,
        # A failed script's last log lines become the termination message the outcome reports
        # (the agent's lines are frames, not text).
        "terminationMessagePolicy": "File" if agent else "FallbackToLogsOnError",
    }
    init_containers = []
    if agent:
        # Copies the static agent into the pod: the job's image needs nothing of the bridge. Same
        # user, same resources as the job (the pod's QoS class stays what the job's gives).
        init_containers.append({
            "name": wellknown.INIT_CONTAINER_NAME,
            "image": agent,
            "imagePullPolicy": cfg.pods.agent_pull_policy,
            "command": [f"/{wellknown.AGENT_BINARY}", "install",
                        f"{wellknown.AGENT_DIR}/{wellknown.AGENT_BINARY}"],
            "resources": {"requests": dict(requests), "limits": dict(quantities)},
            "securityContext": dict(container["securityContext"]),
            "volumeMounts": [{"name": wellknown.AGENT_VOLUME, "mountPath": wellknown.AGENT_DIR}],
        })

    spec: dict[str, Any] = {
        "nodeName": k8s_names[index],
        "restartPolicy": "Never",
        # The pause container becomes PID 1, so the interpreter is an ordinary process: as PID 1
        # it would ignore SIGTERM (no default action for PID 1) and every delete would wait the full
        # grace period and end in SIGKILL. Pause also reaps the script's orphaned children.
        "shareProcessNamespace": True,
        # Service links would add MYSVC_SERVICE_HOST & co. for every Service in the namespace to the
        # job's environment; jobs get the environment they were submitted with, nothing more.
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": cfg.termination_grace_s,
        "securityContext": _pod_security(alloc, groups, groups_policy),
        "tolerations": [
            {
                "key": wellknown.TAINT_BRIDGED,
                "operator": "Exists",
                "effect": wellknown.TAINT_BRIDGED_EFFECT,
            },
            *(dict(t) for t in part.tolerations),
        ],
        "volumes": volumes,
        "containers": [container],
    }
    if init_containers:
        spec["initContainers"] = init_containers
    # No activeDeadlineSeconds: Slurm enforces the time limit (it signals the waiter, which has the
    # pods deleted), and an admin may raise a running job's limit (scontrol update TimeLimit=),
    # while Kubernetes only ever lets a pod's deadline shrink: any deadline set here could kill a
    # job that Slurm has been told to keep.
    if part.host_network:
        spec["hostNetwork"] = True
        spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    elif _DNS_LABEL.match(node.name):
        # `hostname` in the job prints the Slurm node name, as it would under Slurm.
        spec["hostname"] = node.name
    if part.runtime_class:
        spec["runtimeClassName"] = part.runtime_class

    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(alloc.job_id, index, alloc.run),
            "namespace": cfg.namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": spec,
    }


def _groups_policy(configured: str, node: str, strict_nodes: Collection[str]) -> str:
    """The supplementalGroupsPolicy of a pod on `node` ("" = unset)."""
    if configured == "auto":
        return "Strict" if node in strict_nodes else ""
    return configured


def _pod_security(alloc: JobAllocation, groups: list[int], groups_policy: str) -> dict[str, Any]:
    security: dict[str, Any] = {
        "runAsUser": alloc.uid,
        "runAsGroup": alloc.gid,
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if groups:
        security["supplementalGroups"] = groups
    if groups_policy:
        # Strict: the image's /etc/group adds no groups to the job's uid (Merge, the default, would).
        security["supplementalGroupsPolicy"] = groups_policy
    return security


def escape_for_kubelet(value: str) -> str:
    """Protect a value from the kubelet's `$(VAR)` expansion in command and env.

    The kubelet turns `$$` into `$` and `$(NAME)` into NAME's value; doubling every `$` makes it
    give back exactly the original string.
    """
    return value.replace("$", "$$")
