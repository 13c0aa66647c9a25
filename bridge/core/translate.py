"""Allocation -> desired pods: one plain-dict Pod manifest per allocated node. Pure.

The manifests are deterministic (same input, same dicts: no timestamps, sorted environment), so a
planner can compare them with what exists and a restarted daemon rebuilds the same state.

Decisions worth knowing (each explained where it is made):
- the script and the environment the user exported live in one immutable Secret named by its
  content (bridge.core.payload_secret; an array's tasks share it), not in the pods: pods stay
  small in etcd, in every watch event and relist, and the job's variables (tokens, often) are
  readable only by who may read Secrets. The script reaches the container through a secret
  volume, and runs with the interpreter of its shebang;
- the job's environment is passed on minus what describes the slurmd host, then per-node Slurm
  variables are set in each pod's own env (bridge.core.job_environment), where every `$` is
  escaped because the kubelet expands `$(VAR)` there (values from envFrom are never expanded);
- GPUs are pinned by NVIDIA_VISIBLE_DEVICES (physical indices Slurm chose); CUDA_VISIBLE_DEVICES
  counts from 0 because the container only sees its own GPUs;
- the pause container is PID 1 (shareProcessNamespace) so that the script gets SIGTERM on delete.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from bridge.core import wellknown
from bridge.core.annotation_templates import expand_annotations
from bridge.core.config import BridgeConfig, PartitionConfig
from bridge.core.device_claims import claim_pod
from bridge.core.directives import Directives, interpreter_of
from bridge.core.errors import PermanentError
from bridge.core.job_environment import container_environment, script_path, script_stdin
from bridge.core.model import JobAllocation, JobPayload
from bridge.core.payload_secret import (
    MAX_POD_ENV_BYTES,
    SECRET_DATA_BYTES,
    payload_secret,
    shared_environment,
)
from bridge.core.pod_identity import pod_name
from bridge.core.pod_user import (
    FILES,
    UserAccount,
    files_bytes,
    groups_policy,
    mount_user_files,
    pod_security,
    user_files,
)
from bridge.core.rendezvous import DNS_LABEL

MAX_SCRIPT_BYTES = 240 * 1024
"""Largest script kept in the payload Secret; larger ones are copied into the pod by the agent."""
MAX_DELIVERED_SCRIPT_BYTES = 4 * 1024 * 1024
"""Largest script accepted: Slurm's own default max_script_size. Scripts over MAX_SCRIPT_BYTES are
copied into the pod by the agent."""

DEFAULT_PULL_POLICY = "IfNotPresent"

MAX_ARGUMENT_BYTES = 128 * 1024
"""The script's arguments travel in the pod's command (the pod object is at most ~1.5 MB)."""


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
    account: UserAccount | None = None,
) -> list[dict[str, Any]]:
    """The pods of desired_objects."""
    return desired_objects(alloc, payload, directives, part, cfg, k8s_nodes,
                           supplemental_groups=supplemental_groups,
                           strict_groups_nodes=strict_groups_nodes, home=home, account=account)[1]


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
    account: UserAccount | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The job's payload Secret (create it first: the pods mount it), and one Pod manifest per
    allocated node, in node order.

    `k8s_nodes` maps Slurm node names to Kubernetes node names; it is required when the partition
    has a `node_label` (the caller looks the labels up), and ignored otherwise (same names).
    `supplemental_groups`: the job user's other groups, as the caller resolved them from Slurm's
    user name (bridge.clients.identity), never from the payload. `strict_groups_nodes`: the
    Kubernetes nodes that enforce supplementalGroupsPolicy Strict (for the `auto` policy).
    `home`: the user's home from NSS, for a job exported without HOME; `account`: the user's NSS
    entry, for the pods' /etc/passwd and /etc/group (bridge.core.pod_user).
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
    if sum(len(a.encode("utf-8", "surrogateescape")) + 1 for a in payload.arguments) > MAX_ARGUMENT_BYTES:
        raise TranslateError(f"the script's arguments exceed {MAX_ARGUMENT_BYTES} bytes")
    image = resolve_image(directives, part)
    k8s_names = kubernetes_node_names(alloc, part, k8s_nodes)
    groups = sorted({g for g in supplemental_groups if g > 0 and g != alloc.gid})
    delivered = script_bytes > MAX_SCRIPT_BYTES
    try:
        stdin = script_stdin(payload, part, cfg)
    except ValueError as error:
        raise TranslateError(str(error)) from None
    envs = [container_environment(alloc, payload, part, cfg, index, home, delivered, stdin)
            for index in range(len(alloc.nodes))]
    shared = shared_environment(envs)
    env_bytes = sum(len(value.encode("utf-8", "surrogateescape")) for value in shared.values())
    files = user_files(account, alloc, groups) if cfg.pods.user_files == "job_user" else {}
    if env_bytes + files_bytes(files) > SECRET_DATA_BYTES:
        files = {}  # no room for the user's files beside the environment: the image's stay (the job runs)
    env_bytes += files_bytes(files)  # from here on the Secret's data but the script
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
        envs = [container_environment(alloc, payload, part, cfg, index, home, delivered, stdin)
                for index in range(len(alloc.nodes))]
        shared = shared_environment(envs)
    secret = payload_secret(alloc, cfg, shared, "" if delivered else payload.script, files)
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
             groups_policy(cfg.pods.supplemental_groups_policy, k8s_names[index], strict_groups_nodes),
             # The files' keys: their paths, never the job's variables (the Secret's envFrom).
             {name: value for name, value in envs[index].items() if name not in shared}
             | {key: FILES[key] for key in files},
             delivered, secret_name, files)
        for index in range(len(alloc.nodes))
    ]
    return secret, pods


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
    policy: str,
    env: dict[str, str],
    delivered: bool,
    secret_name: str,
    files: Mapping[str, str],
) -> dict[str, Any]:
    """Node `index`'s pod; `env` is what its container gets beyond the Secret's shared variables."""
    node = alloc.nodes[index]
    script_file = script_path(index, delivered)
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
    mount_user_files(files, volumes[0], mounts)
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
    if delivered and index == 0 and not part.simulated and not payload.allocation:
        annotations[wellknown.ANNOTATION_SCRIPT_DELIVERY] = "exec"  # a simulated pod has no exec
    command = [*interpreter_of(payload.script), script_file, *payload.arguments]
    if agent:
        annotations[wellknown.ANNOTATION_OUTPUT] = wellknown.OUTPUT_FRAMED
        annotations[wellknown.ANNOTATION_TASK_SPOOL] = "1"
        agent_volume = {"sizeLimit": wellknown.AGENT_VOLUME_SIZE}
        volumes.append({"name": wellknown.AGENT_VOLUME, "emptyDir": agent_volume})
        mounts.append({"name": wellknown.AGENT_VOLUME, "mountPath": wellknown.AGENT_DIR})
        mode = "merged" if payload.output_merged else "split"
        agent_path = f"{wellknown.AGENT_DIR}/{wellknown.AGENT_BINARY}"
        # The batch script runs once, on the first node, as on Slurm's batch host; the other
        # nodes' pods hold their share of the allocation (all of them, for salloc's or srun's).
        command = ([agent_path, "run", wellknown.AGENT_PIDFILE, mode, "--", *command]
                   if index == 0 and not payload.allocation else [agent_path, "wait"])
        if cfg.pods.agent_host_dir:
            # The node's agent copies itself into the pod's volume and goes on from there: no init
            # container to start first.
            volumes.append({"name": wellknown.AGENT_NODE_VOLUME,
                            "hostPath": {"path": cfg.pods.agent_host_dir, "type": "Directory"}})
            mounts.append({"name": wellknown.AGENT_NODE_VOLUME, "mountPath": wellknown.AGENT_NODE_DIR,
                           "readOnly": True})
            command = [f"{wellknown.AGENT_NODE_DIR}/{wellknown.AGENT_BINARY}", "install", agent_path, "--",
                       *command[1:]]
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
    if agent and not cfg.pods.agent_host_dir:
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
        "securityContext": pod_security(alloc, groups, policy),
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
    elif DNS_LABEL.match(node.name):
        # `hostname` in the job prints the Slurm node name, as it would under Slurm.
        spec["hostname"] = node.name
    if part.runtime_class:
        spec["runtimeClassName"] = part.runtime_class
    name = pod_name(alloc.job_id, index, alloc.run)
    if part.gpu_mode == "dra" and node.gpu_indices:
        claim_pod(spec, container, annotations, name)  # bound by the bridge once its claim is allocated

    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": cfg.namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": spec,
    }


def escape_for_kubelet(value: str) -> str:
    """Protect a value from the kubelet's `$(VAR)` expansion in command and env.

    The kubelet turns `$$` into `$` and `$(NAME)` into NAME's value; doubling every `$` makes it
    give back exactly the original string.
    """
    return value.replace("$", "$$")

