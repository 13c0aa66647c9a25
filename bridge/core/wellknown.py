"""Every name the bridge shares with Kubernetes, Slurm or the job, in one place.

Labels are for selecting (values must be valid label values); annotations carry the rest. All keys
use the `slurm-k8s-bridge/` prefix because the sandbox (and any real site following its setup)
already labels and taints bridged nodes with `slurm-k8s-bridge/bridged`; one prefix for all keys
keeps `kubectl get pods -l ...` guessable.
"""

from __future__ import annotations

from typing import Final

PREFIX: Final = "slurm-k8s-bridge/"
"""Prefix of every label, annotation and taint key the bridge owns."""

MANAGER: Final = "slurm-k8s-bridge"
"""Value of LABEL_MANAGED_BY on every object the bridge creates."""

# --- pod labels (selectable) -------------------------------------------------------------------

LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
"""The Kubernetes-recommended ownership label; the bridge lists its pods with `=MANAGER`."""

LABEL_CLUSTER: Final = PREFIX + "cluster"
"""Slurm cluster name: separates bridges of different clusters that share a namespace."""

LABEL_JOB_ID: Final = PREFIX + "job-id"
"""Slurm job id (array tasks have their own job id, so this is always the unit of work)."""

LABEL_ARRAY_JOB_ID: Final = PREFIX + "array-job-id"
"""Slurm array job id, only on pods of array tasks: select a whole array at once."""

LABEL_RUN: Final = PREFIX + "run"
"""Run of the job the pod belongs to: Slurm's restart count (0, then +1 at each requeue). A
requeued job keeps its id; its new run gets new pods and never adopts the old run's. Pod names
carry it too: `slurm-<jobid>-<node index>` for run 0, `slurm-<jobid>-r<run>-<node index>` after
(see pod_identity.pod_name). A pod without the label is from run 0."""

# --- pod annotations (state needed to rebuild after a restart, and context for humans) ---------

ANNOTATION_NODE_INDEX: Final = PREFIX + "node-index"
"""Index of this pod's node in the job's node list (0 = batch host, like SLURM_NODEID)."""

ANNOTATION_NODE_COUNT: Final = PREFIX + "node-count"
"""Number of nodes (= pods) of the job: a pod alone tells how many siblings to expect."""

ANNOTATION_SLURM_NODE: Final = PREFIX + "slurm-node"
"""Slurm node name this pod stands for (may differ from the Kubernetes node name)."""

ANNOTATION_USER: Final = PREFIX + "user"
"""Slurm user name of the job; user names are not always valid label values."""

ANNOTATION_SCRIPT: Final = PREFIX + "script"
"""The job's original batch script, delivered to the container by a downward API volume."""

# --- nodes -----------------------------------------------------------------------------------

NODE_LABEL_BRIDGED: Final = PREFIX + "bridged"
"""Label on Kubernetes nodes that the bridge may run jobs on (value NODE_LABEL_BRIDGED_VALUE)."""

NODE_LABEL_BRIDGED_VALUE: Final = "true"

TAINT_BRIDGED: Final = PREFIX + "bridged"
"""NoSchedule taint on bridged nodes so that only bridge pods (which tolerate it) land there."""

TAINT_BRIDGED_EFFECT: Final = "NoSchedule"

# --- inside the pod ----------------------------------------------------------------------------

CONTAINER_NAME: Final = "job"
"""Name of the single container that runs the batch script."""

SCRIPT_VOLUME: Final = "slurm-k8s-bridge-script"
"""Name of the downward API volume holding the script; partition volumes may not reuse it."""

SCRIPT_DIR: Final = "/slurm-k8s-bridge"
"""Mount point of SCRIPT_VOLUME inside the container."""

SCRIPT_FILE: Final = "slurm_script"
"""File name of the script in SCRIPT_DIR (Slurm names its copy the same)."""

SHM_VOLUME: Final = "slurm-k8s-bridge-shm"
"""Name of the memory-backed emptyDir mounted at /dev/shm when the job asks for shm_size."""

AGENT_VOLUME: Final = "slurm-k8s-bridge-agent"
"""Name of the emptyDir the in-pod agent is copied into (by the init container, or from the node)."""

AGENT_VOLUME_SIZE: Final = "256Mi"
"""The agent's emptyDir: its copy (~10 MB), pid files, step sockets and the spools of step tasks'
output (agent/task_spool.go: at most 2.5 MiB a task, while no daemon passes it on)."""
AGENT_DIR: Final = "/slurm-k8s-bridge-bin"
"""Mount point of AGENT_VOLUME in the job container (the agent, and the script's pid file)."""

AGENT_NODE_VOLUME: Final = "slurm-k8s-bridge-agent-node"
"""Name of the hostPath volume of [pods] agent_host_dir: the node's copy of the agent."""

AGENT_NODE_DIR: Final = "/slurm-k8s-bridge-node"
"""Mount point of AGENT_NODE_VOLUME (read-only): the container's command copies the agent from there
into AGENT_DIR and runs it from the copy."""

AGENT_BINARY: Final = "slurm-k8s-bridge-agent"
"""File name of the agent, at the root of its image and in AGENT_DIR."""

AGENT_PIDFILE: Final = AGENT_DIR + "/script.pid"
"""Where the agent writes the script's pid, for `agent signal`."""

AGENT_RUN_PIDFILE: Final = AGENT_DIR + "/agent.pid"
"""Where the agent running the script writes its own pid: the daemon's SIGTERM for it stops the run
as the kubelet's does (agent/stop.go)."""

INIT_CONTAINER_NAME: Final = "slurm-k8s-bridge-agent"

AGENT_SCRIPT: Final = AGENT_DIR + "/slurm_script"
"""Where a script too big for an annotation is copied (`agent receive-script`)."""

SECRET_SCRIPT_KEY: Final = "SLURM_K8S_BRIDGE_SCRIPT"
"""Key of the script in a job's payload Secret. The Secret is the pods' envFrom too, so the same name
is set in every container's own env (which wins over envFrom) to the script's path: the script
never becomes an environment variable (one is capped at 128 KiB, and every child would inherit it)."""

SECRET_PASSWD_KEY: Final = "SLURM_K8S_BRIDGE_PASSWD"
SECRET_GROUP_KEY: Final = "SLURM_K8S_BRIDGE_GROUP"
"""Keys of the job user's /etc/passwd and /etc/group in the payload Secret (bridge.core.pod_user);
set in each container's own env to the file's path, as the script's key is, and unset by the agent
before the script runs."""

ENV_SCRIPT_PENDING: Final = "SLURM_K8S_BRIDGE_SCRIPT_PENDING"
"""Set in the first pod when its script is copied in: the agent waits for that file."""

ENV_BATCH_STDIN: Final = "SLURM_K8S_BRIDGE_BATCH_STDIN"
"""In the environment the waiter sends: the slurmd host's path of the file slurmstepd opened as the
batch script's stdin (sbatch --input); absent for /dev/null (agent/internal/waiter/batch_stdin.go)."""

ENV_SCRIPT_STDIN: Final = "SLURM_K8S_BRIDGE_SCRIPT_STDIN"
"""In the first pod's env: that file's path in the pod, which the agent opens as the script's stdin."""

ENV_JOB_PATH: Final = "SLURM_K8S_BRIDGE_JOB_PATH"
"""In each pod's env: the entries of the PATH the job was submitted with that lie on a volume the pods
share with the slurmd host (a conda env's or ~/bin), as the pods see them, in the user's order, an
empty entry marking the image's PATH's place (job_environment.shared_path_entries). The agent puts
them after its own bin directory, around the image's PATH, and unsets it."""

ENV_JOB_LIBRARY_PATH: Final = "SLURM_K8S_BRIDGE_JOB_LIBRARY_PATH"
"""The same for LD_LIBRARY_PATH: the agent puts them around the image's own LD_LIBRARY_PATH."""

ENV_USAGE_INTERVAL: Final = "SLURM_K8S_BRIDGE_USAGE_INTERVAL"
"""Seconds between the usage samples the first pod's agent sends ([pods] usage_interval_s), when
not its default of 30 (agent/usage.go). The agent unsets it before the script runs."""
DEFAULT_USAGE_INTERVAL_S: Final = 30

ENV_STOP_GRACE: Final = "SLURM_K8S_BRIDGE_STOP_GRACE"
"""The pods' grace period (termination_grace_s), when not its default, for the first pod's agent: a
stopped script's process group may outlive it only until shortly before the kubelet's SIGKILL
(agent/main.go). The agent unsets it before the script runs."""
DEFAULT_TERMINATION_GRACE_S: Final = 10

ANNOTATION_SCRIPT_DELIVERY: Final = PREFIX + "script-delivery"
"""`exec` on a pod whose script the daemon copies in once it runs (too big for an annotation)."""

ANNOTATION_PAYLOAD_SECRET: Final = PREFIX + "payload-secret"
"""On every pod: the name of its payload Secret (script and exported environment)."""

ANNOTATION_TASK_SPOOL: Final = PREFIX + "task-spool"
"""On a pod whose agent spools its step tasks' output (agent/task_spool.go): "1". Only then does the
daemon acknowledge on a task exec's stdin and follow a task after a restart; a pod made before
(its agent older) gets neither, as before."""
ANNOTATION_OUTPUT: Final = PREFIX + "output"
"""`framed` on pods whose log lines are the agent's frames ("o <base64>", "e <base64>")."""

ANNOTATION_SUSPENDED: Final = PREFIX + "suspended"
"""On a pod whose job processes the daemon stops because Slurm suspended the job: `stopping` before
the stop, `true` once it is done; removed once they are continued (controller.suspension)."""

OUTPUT_FRAMED: Final = "framed"
OUTPUT_NONE: Final = "none"
"""On pods of a simulated partition: there is no output to read."""

RESERVED_VOLUMES: Final = frozenset({SCRIPT_VOLUME, SHM_VOLUME, AGENT_VOLUME, AGENT_NODE_VOLUME})
"""Volume names the bridge adds itself."""

GPU_RESOURCE: Final = "nvidia.com/gpu"
"""Extended resource requested in the `device-plugin` GPU mode."""

SCHEDULER_NAME: Final = "slurm-k8s-bridge"
"""schedulerName of pods the bridge binds itself after it has prepared them (`dra` GPU mode: the
claim is allocated first); kube-scheduler leaves such pods alone."""

ANNOTATION_KUBE_NODE: Final = PREFIX + "kubernetes-node"
"""On a pod the bridge binds itself: the Kubernetes node Slurm's node maps to."""

CLAIM_NAME_SUFFIX: Final = "-gpus"
"""A pod's GPU ResourceClaim is named after it: `<pod name>-gpus` (`dra` GPU mode)."""

POD_CLAIM_NAME: Final = "gpus"
"""The pod's own name for its GPU claim (spec.resourceClaims[].name, resources.claims[].name) and the
claim's one request."""

# --- Slurm side ------------------------------------------------------------------------------

JOB_SUBMIT_LUA_SIGNATURE: Final = "slurm-k8s-bridge job_submit.lua"
"""A line the bridge's job_submit.lua holds (doctor recognises it by it)."""

# --- the daemon's own pods (deployed in Kubernetes) --------------------------------------------

LABEL_ROLE: Final = PREFIX + "role"
"""Label on the acting replica's own pod (value ROLE_LEADER); the Service selects it, so waiters
always reach the leader while every replica stays Ready (Deployment rollouts need that)."""

ROLE_LEADER: Final = "leader"
