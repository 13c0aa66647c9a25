"""The environment of a job's containers: the job's own variables minus what describes the slurmd host,
and the per-node Slurm and GPU variables each node's container gets. Pure.

The job's environment is passed on minus host-only variables (PATH, LD_*, the login session's),
minus Slurm's values for the batch host (each pod gets its own node's) and minus names Kubernetes
would refuse. Called by translate (the pods) and, for the host-only list, nowhere else: the waiter
sends the whole environment and the daemon decides here.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping

from bridge.core import wellknown
from bridge.core.config import BridgeConfig, PartitionConfig
from bridge.core.model import JobAllocation, JobPayload
from bridge.core.volume_paths import through_volumes

# Variables that describe the slurmd host, the waiter process or the login session, not the job.
# PATH is one of them: the image's PATH (conda, /usr/local/cuda/bin, ...) must win over the host's
# system directories, so the pod's spec sets none; the agent puts its own bin directory first, then
# the submitted PATH's entries on shared volumes (shared_path_entries), then the image's.
# LD_* point at host libraries and would break (or hijack) binaries in the image; LD_LIBRARY_PATH's
# entries on shared volumes (a module tree the pods mount, ~/lib) are passed as PATH's are.
HOST_ONLY_ENV = frozenset(
    {
        "PATH",
        "HOSTNAME",
        "HOST",
        "PWD",
        "OLDPWD",
        "SHLVL",
        "_",
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

BATCH_HOST_ENV = ("SLURM_GTIDS", "SLURM_TOPOLOGY_ADDR", "SLURM_TOPOLOGY_ADDR_PATTERN", "SLURM_STEP_ID",
                  "SLURM_STEPID")
"""Per-node values the batch script gets natively that describe node 0, the batch host, and its
step (the batch step, -5): the first node's pod, which runs the script, takes them as slurmstepd
gave them to the waiter."""

# What Kubernetes accepts as an env var name without the RelaxedEnvironmentVariableValidation gate.
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")


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
    alloc: JobAllocation, payload: JobPayload, part: PartitionConfig, index: int, home: str | None = None,
) -> dict[str, str]:
    """The full environment of node `index`'s container (before `$` escaping)."""
    node = alloc.nodes[index]
    count = len(alloc.nodes)
    env = job_environment(payload.environment)
    if index == 0:
        host = payload.environment
        env.update((name, host[name]) for name in BATCH_HOST_ENV if name in host)
    # TMPDIR (the user's, or the /tmp slurmstepd set) is checked again in the pod by the agent,
    # as slurmstepd does on its host: made when missing, /tmp when not a directory it can use.
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
            # No RANK, WORLD_SIZE or MASTER_ADDR: Slurm sets none, and a step's tasks would all
            # inherit their pod's (code that prefers RANK to SLURM_PROCID, as torchrun-aware
            # training scripts do, would make every task rank 0 of a world of one).
        }
    )
    if node.cpus > 0:
        env["SLURM_CPUS_ON_NODE"] = str(node.cpus)
    if alloc.is_array_task:
        env["SLURM_ARRAY_JOB_ID"] = str(alloc.array_job_id)
        env["SLURM_ARRAY_TASK_ID"] = str(alloc.array_task_id)
    env.update(gpu_environment(node.gpu_indices, part.gpu_mode))
    return env


GPU_ORDINAL_VARIABLES = (
    "CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES", "ZE_AFFINITY_MASK")
"""What Slurm's gres/gpu plugin sets to the devices' ordinals (gres.conf's default Flags: all four)."""


def gpu_environment(indices: tuple[int, ...], gpu_mode: str) -> dict[str, str]:
    """GPU variables for a container given the node's GPU indices Slurm allocated.

    - SLURM_JOB_GPUS: the physical indices, as Slurm sets it.
    - NVIDIA_VISIBLE_DEVICES: the physical indices (env mode), read by the NVIDIA runtime to expose
      exactly these devices; `void` when the node has none, because CUDA base images set `all`
      in their ENV and would otherwise get every GPU of the node; `void` in dra mode too (the
      claim's devices come through CDI). In device-plugin mode the plugin sets it for the devices
      it picked.
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
        **dict.fromkeys(GPU_ORDINAL_VARIABLES, local),
    }
    if gpu_mode == "env":
        env["NVIDIA_VISIBLE_DEVICES"] = env["SLURM_JOB_GPUS"]
    elif gpu_mode == "dra":
        # The claim's devices come through CDI; an image's own `all` must not add the rest of the
        # node's GPUs where the NVIDIA runtime still reads the variable.
        env["NVIDIA_VISIBLE_DEVICES"] = "void"
    return env


def task_gpu_environment(
    step_gpus: str | None, pod_gpus: tuple[int, ...]
) -> tuple[dict[str, str], list[str]]:
    """A step task's GPU variables in a pod holding the node's `pod_gpus` (physical indices, in the
    order the pod numbers them from 0): what to set, and what to unset, over the pod's own.

    `step_gpus` is the SLURM_STEP_GPUS slurmstepd set for this very task: the physical indices of
    the GPUs the task may use (`--gpus-per-task`, `--gres` of the step, `--gpu-bind`), or None when
    the step holds none (`--gres=none`), where Slurm unsets the ordinal variables. The ordinals are
    those indices' places among the pod's, as the pod's own variables number them, so a task never
    names a GPU its step does not hold. A pod without GPUs is left as it is."""
    if not pod_gpus:
        return {}, []
    ordinals = []
    for word in (step_gpus or "").split(","):
        if word.strip().isdigit() and int(word) in pod_gpus:
            ordinals.append(str(pod_gpus.index(int(word))))
    if not ordinals:
        return {}, list(GPU_ORDINAL_VARIABLES)
    return dict.fromkeys(GPU_ORDINAL_VARIABLES, ",".join(ordinals)), []


def container_environment(
    alloc: JobAllocation, payload: JobPayload, part: PartitionConfig, cfg: BridgeConfig, index: int,
    home: str | None, delivered: bool, stdin: str | None = None,
) -> dict[str, str]:
    """Everything node `index`'s container gets in its environment (before `$` escaping) but the
    paths of the user's files (bridge.core.pod_user): the job's, node `index`'s Slurm variables,
    and what the bridge's agent reads. `delivered`: the script is copied into the first pod;
    `stdin`: the script's stdin in the first pod (script_stdin)."""
    env = node_environment(alloc, payload, part, index, home=home)
    if stdin and index == 0:
        env[wellknown.ENV_SCRIPT_STDIN] = stdin
    if delivered and index == 0:
        env[wellknown.ENV_SCRIPT_PENDING] = wellknown.AGENT_SCRIPT
    if not cfg.pods.agent_image:
        env = without_limits(env)
        # No agent to check the job's TMPDIR in the pod (a host path may not exist there): the
        # one slurmstepd falls back to, which every image has.
        env["TMPDIR"] = "/tmp"
    else:
        for variable, for_the_agent in (("PATH", wellknown.ENV_JOB_PATH),
                                        ("LD_LIBRARY_PATH", wellknown.ENV_JOB_LIBRARY_PATH)):
            shared = shared_path_entries(payload.environment.get(variable, ""), part)
            if shared:
                env[for_the_agent] = shared
        if index == 0 and cfg.pods.usage_interval_s != wellknown.DEFAULT_USAGE_INTERVAL_S:
            env[wellknown.ENV_USAGE_INTERVAL] = str(cfg.pods.usage_interval_s)
        if index == 0 and cfg.termination_grace_s != wellknown.DEFAULT_TERMINATION_GRACE_S:
            env[wellknown.ENV_STOP_GRACE] = str(cfg.termination_grace_s)
    env[wellknown.SECRET_SCRIPT_KEY] = script_path(index, delivered)
    return env


MAX_JOB_PATH_BYTES = 64 * 1024
"""What the submitted PATH's shared entries may weigh in the pods (Linux allows 128 KiB for one
variable, and the image's PATH joins them); entries beyond are left out."""


def shared_path_entries(path: str, part: PartitionConfig) -> str:
    """The entries of a submitted PATH (or LD_LIBRARY_PATH) that lie on the partition's volumes,
    as the pods see them, once each: `conda activate env; sbatch job.sh` (or ~/bin first) finds
    the env's python in the pod as natively. Entries of the slurmd host's own directories
    (/usr/bin, a module tree the pods lack) are not the pod's and stay out; the image's list takes
    the place of the first of them, so a shared entry the user put after the system's still comes
    after the image's (an empty entry marks that place: `before::after`). Relative and empty
    entries stay out."""
    roots = [(volume.host_path, volume.mount_path) for volume in part.volumes]
    before: list[str] = []
    after: list[str] = []
    seen: set[str] = set()
    size = 0
    past_the_hosts = False
    for entry in path.split(":"):
        if not entry.startswith("/"):
            continue
        # "//x" is "/x" to the kernel; normpath keeps two leading slashes (POSIX leaves them open).
        in_pod = through_volumes(posixpath.normpath("/" + entry.lstrip("/")), roots)
        if in_pod is None:
            past_the_hosts = True  # the image's PATH goes here
            continue
        if in_pod in seen or size + len(in_pod) + 1 > MAX_JOB_PATH_BYTES:
            continue
        seen.add(in_pod)
        size += len(in_pod) + 1
        (after if past_the_hosts else before).append(in_pod)
    return ":".join(before + (["", *after] if after else []))


def script_path(index: int, delivered: bool) -> str:
    """Where node `index`'s container finds the script."""
    if delivered and index == 0:
        return wellknown.AGENT_SCRIPT  # copied in once the pod runs (agent receive-script)
    return f"{wellknown.SCRIPT_DIR}/{wellknown.SCRIPT_FILE}"


def script_stdin(payload: JobPayload, part: PartitionConfig, cfg: BridgeConfig) -> str | None:
    """The pod's path of the file `sbatch --input` gave the batch script as its stdin (slurmstepd
    opened it on the slurmd host, as the user), through the partition volume whose host path
    holds it most closely; None for the default /dev/null. ValueError, in the user's words, for a
    file no pod can open there."""
    named = payload.environment.get(wellknown.ENV_BATCH_STDIN)
    if not named:
        return None
    # The kernel's name for the waiter's fd 0 is absolute and has no `..`; one sent otherwise
    # must not climb out of the volume it is matched to.
    host_path = posixpath.normpath(posixpath.join("/", named))
    in_pod = through_volumes(host_path, ((v.host_path, v.mount_path) for v in part.volumes))
    if in_pod is None:
        shared = ", ".join(sorted(volume.host_path for volume in part.volumes)) or "none"
        raise ValueError(
            f"sbatch --input={host_path}: the file is not on a volume the pods share with the slurmd host "
            f"(shared: {shared}); name a file under one of them")
    if not cfg.pods.agent_image:
        raise ValueError(f"sbatch --input={host_path}: a pod reads a file as its script's stdin only "
                         "with the bridge's in-pod agent ([pods] agent_image)")
    return in_pod


def without_limits(env: dict[str, str]) -> dict[str, str]:
    """`env` without the waiter's limits and umask (SLURM_RLIMIT_*, SLURM_UMASK), which only the
    pods' agent sets: without it nothing would, and a native script never sees these variables
    (slurmstepd takes them out)."""
    return {name: value for name, value in env.items()
            if not name.startswith("SLURM_RLIMIT_") and name != "SLURM_UMASK"}
