"""The configuration's sections: [slurm], [kubernetes], [api], [pods], [leader_election], [nodes] and
[partitions.NAME] with its volumes and tolerations. Pure; bridge.core.config assembles them.

Each field's default and description are written once, here; docs/configuration.md is generated
from them. The checks that need the files themselves (the TLS key's mode) are the manager's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Literal, NotRequired, Self

from pydantic import (
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.dataclasses import dataclass
from typing_extensions import TypedDict

from bridge.core import wellknown
from bridge.core.config_errors import KeyProblem
from bridge.core.config_types import MODEL_CONFIG, FilePath, NonEmpty

PullPolicy = Literal["Always", "IfNotPresent", "Never"]
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_URL = re.compile(r"^https?://[^/\s]+")


def is_label_key(key: str) -> bool:
    """A Kubernetes label or annotation key: an optional DNS subdomain and `/`, and a name."""
    prefix, sep, name = key.rpartition("/")
    if sep and not _DNS_SUBDOMAIN.match(prefix):
        return False
    return bool(_LABEL_NAME.match(name))


def listen_address(listen: str) -> tuple[str, int] | None:
    """(host, port) of a HOST:PORT ([::1]:6830 for IPv6), None if it is not one."""
    host, sep, port = listen.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host, int(port)


@dataclass(frozen=True, config=MODEL_CONFIG)
class SlurmConfig:
    """[slurm]: how the bridge reads Slurm."""

    backend: Literal["rest", "pyslurm"] = Field(
        default="rest",
        description="`rest` (slurmrestd) or `pyslurm` (needs pyslurm built against this Slurm).")
    rest_url: NonEmpty | None = Field(default=None, alias="url", description=(
        "slurmrestd base URL such as http://127.0.0.1:6820; required for the rest backend."))
    token_file: FilePath | None = Field(default=None, description=(
        "File holding the JWT for slurmrestd (`scontrol token` output, with or without SLURM_JWT=); read "
        "when connecting, so a rotated token needs no restart. The token itself never enters the config."))
    rest_user: NonEmpty | None = Field(default=None, alias="user", description=(
        "Sent as X-SLURM-USER-NAME with the token, if the token is not a user's own (an operator: "
        "SlurmUser or root)."))
    poll_interval_s: StrictFloat = Field(default=0.2, gt=0.0, description=(
        "Pause between polls of the jobs' update time (Slurm has no watch; cheap when nothing changed)."))
    slurm_conf: FilePath | None = Field(default=None, description=(
        "The cluster's slurm.conf for the pyslurm backend, if not $SLURM_CONF or Slurm's default."))

    @field_validator("rest_url")
    @classmethod
    def _url_is_http(cls, url: str | None) -> str | None:
        if url is not None and not _URL.match(url):
            raise ValueError(f"{url!r} is not an http:// or https:// URL")
        return url.rstrip("/") if url else url

    @model_validator(mode="after")
    def _rest_needs_a_url(self, info: ValidationInfo) -> Self:
        # Only the file must say it: code may build a SlurmConfig for a backend it never starts.
        if (info.context or {}).get("from_file") and self.backend == "rest" and self.rest_url is None:
            raise KeyProblem("url", "required when backend is 'rest'")
        return self


@dataclass(frozen=True, config=MODEL_CONFIG)
class KubeConfig:
    """[kubernetes]: how the bridge reaches Kubernetes."""

    kubeconfig: FilePath | None = Field(
        default=None, description="kubeconfig file; unset: the in-cluster service account's credentials.")
    context: NonEmpty | None = Field(
        default=None, description="kubeconfig context; unset: the file's current one.")


@dataclass(frozen=True, config=MODEL_CONFIG)
class ApiConfig:
    """[api]: the bridge's own HTTP API (health, metrics, the waiters' attach calls)."""

    listen: StrictStr = Field(default="127.0.0.1:8470", description=(
        "HOST:PORT to listen on ([::1]:8470 for IPv6); the default only serves slurmds on the same host."))
    tls_cert_file: FilePath | None = Field(default=None, description=(
        "PEM certificate (chain) to serve the API over TLS with; it must name the host of waiter.api_url "
        "(DNS or IP SAN). Read at start: a renewed one needs a restart. With TLS, /healthz, /readyz and "
        "/metrics are https too. Unset: plain HTTP."))
    tls_key_file: FilePath | None = Field(default=None, description=(
        "The certificate's private key (set both or neither); not readable by group or others (mode 600, "
        "or 0440 with the daemon's own group, as a Kubernetes Secret with fsGroup)."))

    @property
    def host(self) -> str:
        """The listen address's host (without an IPv6 address's brackets)."""
        return self._address[0]

    @property
    def port(self) -> int:
        return self._address[1]

    @property
    def tls(self) -> bool:
        return self.tls_cert_file is not None

    @property
    def _address(self) -> tuple[str, int]:
        address = listen_address(self.listen)
        assert address is not None, "validated"
        return address

    @field_validator("listen")
    @classmethod
    def _listen_is_host_port(cls, listen: str) -> str:
        if listen_address(listen) is None:
            raise ValueError(f"{listen!r} is not HOST:PORT")
        return listen

    @model_validator(mode="after")
    def _tls_needs_both_files(self) -> Self:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise KeyProblem("tls_cert_file" if self.tls_cert_file is None else "tls_key_file",
                             "set both tls_cert_file and tls_key_file, or neither")
        return self


@dataclass(frozen=True, config=MODEL_CONFIG)
class PodsConfig:
    """[pods]: what every job pod gets, whatever its partition."""

    supplemental_groups: Literal["nss", "none"] = Field(default="nss", description=(
        "`nss`: the job user's groups as this daemon's host resolves them (getgrouplist of the user name "
        "Slurm reports; the waiter's payload has no say), without the primary gid and never 0, become the "
        "pod's supplementalGroups; `none`: no supplementary groups."))
    supplemental_groups_policy: Literal["auto", "Strict", "Merge", ""] = Field(default="auto", description=(
        "supplementalGroupsPolicy of the pods: `Strict` (only the groups above: the image's /etc/group adds "
        "none; needs containerd >= 2.0 or CRI-O >= 1.31, else the kubelet refuses the pod), `auto` (Strict "
        "on every node that reports it enforces it, node.status.features, and unset elsewhere), `Merge` "
        "(Kubernetes' default), or \"\" to leave the field unset."))
    user_files: Literal["job_user", "image"] = Field(default="job_user", description=(
        "`job_user`: each job container's /etc/passwd and /etc/group are the job user's NSS entry and "
        "groups (with root and nobody), mounted read-only over the image's, so that `whoami`, `id`, "
        "`ls -l` and getpwuid name the user as on a native host; a user NSS does not know here keeps "
        "the image's files. `image`: the image's own files (a site whose images need their accounts)."))
    agent_image: NonEmpty | None = Field(default=None, description=(
        "Image holding the in-pod agent (/slurm-k8s-bridge-agent, built from agent/). An init container "
        "copies it into each job pod (or the nodes hold it: agent_host_dir), where it runs the script: "
        "stdout and stderr then reach the job's -o and -e files apart and byte for byte, and signals from "
        "`scancel -s` and `--signal` reach the script (needs RBAC create on pods/exec). Unset: the script "
        "runs directly and its two streams arrive merged, line by line."))
    agent_pull_policy: PullPolicy = Field(
        default="IfNotPresent", description="imagePullPolicy of the agent's image.")
    agent_host_dir: NonEmpty | None = Field(default=None, description=(
        "Directory on every Kubernetes node that holds the agent_image's agent (slurm-k8s-bridge-agent), "
        "installed there by the Helm chart's agent DaemonSet (agent.onNodes) or by the site. Set: a job pod "
        "has no init container; it mounts this directory read-only (hostPath type Directory: a node without "
        "it fails the pod with the kubelet's reason) and its command copies the agent into the pod's own "
        "volume and runs it from there, which saves the init container's start (~0.9 s a pod on the "
        "sandbox's kubelets). A symlink (such as the chart's `current`) is resolved when the pod starts: "
        "a pod keeps the version it started with, so a version still in use must not be deleted. Needs "
        "agent_image (the version the daemon expects, and what the chart installs)."))
    usage_interval_s: StrictInt = Field(default=wellknown.DEFAULT_USAGE_INTERVAL_S, ge=1, description=(
        "Seconds between the samples of a batch script's usage (CPU, memory, I/O of its processes) that "
        "the agent sends for `sstat` while the job runs; a resident set that grew by a tenth is sent at "
        "once, and the last sample at its end. Match slurm.conf's JobAcctGatherFrequency (task=, 30 by "
        "default). Each sample is a log line the daemon relays: 10,000 running jobs at 30 s are ~330 a "
        "second."))

    @model_validator(mode="after")
    def _agent_from_the_node_is_the_images(self) -> Self:
        if self.agent_host_dir is not None:
            if not self.agent_host_dir.startswith("/"):
                raise KeyProblem("agent_host_dir", f"{self.agent_host_dir!r} is not an absolute path")
            if self.agent_image is None:
                raise KeyProblem("agent_host_dir", "needs agent_image (the nodes hold that image's agent)")
        return self


@dataclass(frozen=True, config=MODEL_CONFIG)
class LeaderConfig:
    """[leader_election]: several replicas may run; only the holder of a coordination.k8s.io Lease acts
    (the others keep warm caches and answer /readyz with 503)."""

    enabled: StrictBool = Field(
        default=True, description="Take part in the election; false: act at once, alone.")
    lease_name: NonEmpty | None = Field(
        default=None, description="Lease name; unset: `slurm-k8s-bridge-<cluster>`.")
    namespace: NonEmpty | None = Field(
        default=None, description="Namespace of the Lease; unset: the job namespace.")
    identity: NonEmpty | None = Field(default=None, description=(
        "This replica's name on the Lease; unset: `<hostname>:<api port>` (a pod's hostname is its name, "
        "so replicas differ; a restarted replica takes its own Lease back at once)."))
    lease_duration_s: StrictFloat = Field(default=15.0, gt=0.0, description=(
        "A standby takes over when the Lease has not been renewed for this long."))
    renew_deadline_s: StrictFloat = Field(default=10.0, gt=0.0, description=(
        "A leader that could not renew for this long stops acting first (less than lease_duration_s)."))
    retry_period_s: StrictFloat = Field(default=2.0, gt=0.0, description=(
        "Seconds between attempts to take or renew the Lease (less than renew_deadline_s)."))

    @model_validator(mode="after")
    def _deadlines_are_ordered(self) -> Self:
        if not self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise KeyProblem("renew_deadline_s", "needs retry_period_s < renew_deadline_s < lease_duration_s")
        return self


@dataclass(frozen=True, config=MODEL_CONFIG)
class NodesConfig:
    """[nodes]: Kubernetes node health carried over to Slurm (bridge.core.nodehealth; the leader acts)."""

    enabled: StrictBool = Field(default=True, description=(
        "Drain bridged Slurm nodes whose Kubernetes twin is cordoned or tainted against the partition, "
        "set DOWN those NotReady too long, and resume them once healthy (only nodes the bridge itself "
        "drained: the reason starts with `slurm-k8s-bridge:`). Needs RBAC list/watch on nodes and patch "
        "on nodes/status."))
    not_ready_grace_s: StrictFloat = Field(default=60.0, gt=0.0, description=(
        "How long a Kubernetes node may be NotReady, Unknown or gone before its Slurm node goes DOWN (and "
        "the jobs running there end as on any failed node: requeued, or NODE_FAIL)."))
    poll_interval_s: StrictFloat = Field(default=1.0, gt=0.0, description=(
        "Seconds between polls of slurmctld's node states (cheap when nothing changed)."))


@dataclass(frozen=True, config=MODEL_CONFIG)
class VolumeConfig:
    """[[partitions.NAME.volumes]]: a host directory mounted into every pod of the partition."""

    name: NonEmpty = Field(description="Volume name in the pod (a DNS label).")
    host_path: NonEmpty = Field(description=(
        "Directory on the Kubernetes node; it must exist (hostPath type Directory: a missing one fails the "
        "pod instead of being created as root)."))
    mount_path: NonEmpty = Field(json_schema_extra={"toml_default": "the host_path"}, description=(
        "Path in the container; by default host_path, so that job paths mean the same inside."))
    read_only: StrictBool = Field(default=False, description="Mount it read-only.")

    @model_validator(mode="before")
    @classmethod
    def _mounted_where_it_is(cls, data: object) -> object:
        if isinstance(data, dict) and "mount_path" not in data and isinstance(data.get("host_path"), str):
            return {**data, "mount_path": data["host_path"]}
        return data

    @field_validator("name")
    @classmethod
    def _name_is_free(cls, name: str) -> str:
        if not _DNS_LABEL.match(name):
            raise ValueError(f"{name!r} is not a valid volume name (DNS label)")
        if name in wellknown.RESERVED_VOLUMES:
            raise ValueError(f"{name!r} is reserved for the bridge's own volumes")
        return name

    @field_validator("host_path", "mount_path")
    @classmethod
    def _path_is_absolute(cls, path: str) -> str:
        if not path.startswith("/"):
            raise ValueError(f"{path!r} is not an absolute path")
        return path

    @field_validator("mount_path")
    @classmethod
    def _mount_is_not_the_bridges(cls, path: str) -> str:
        bridges = (wellknown.SCRIPT_DIR, "/dev/shm", wellknown.AGENT_DIR, wellknown.AGENT_NODE_DIR)
        files = ("/etc/passwd", "/etc/group")  # the job user's (bridge.core.pod_user)
        below = tuple(f"{mount}/" for mount in bridges)
        if path.rstrip("/") in (*bridges, *files, "") or path.startswith(below):
            raise ValueError(f"{path!r} is used by the bridge itself (or is /)")
        return path


class Toleration(TypedDict):
    """[[partitions.NAME.tolerations]]: a pod toleration in Kubernetes' own shape."""

    __pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[misc]

    key: NotRequired[Annotated[NonEmpty, Field(description="Taint key; unset with Exists: every taint.")]]
    operator: NotRequired[Annotated[Literal["Equal", "Exists"], Field(description="Default Equal.")]]
    value: NotRequired[Annotated[NonEmpty, Field(description="Taint value, for Equal.")]]
    effect: NotRequired[Annotated[Literal["NoSchedule", "PreferNoSchedule", "NoExecute"], Field(
        description="Taint effect; unset: every effect.")]]
    tolerationSeconds: NotRequired[Annotated[StrictInt, Field(
        description="How long a NoExecute taint is tolerated before the pod is evicted.")]]


def _label_key(what: str, key: str | None) -> str | None:
    if key is not None and not is_label_key(key):
        raise ValueError(f"{key!r} is not a valid Kubernetes {what}")
    return key


@dataclass(frozen=True, config=MODEL_CONFIG)
class PartitionConfig:
    """[partitions.NAME]: how the jobs of one bridged Slurm partition run on Kubernetes."""

    default_image: NonEmpty | None = Field(default=None, description=(
        "Image for jobs without a `#K8S image=` line; unset makes that line mandatory."))
    image_pull_policy: PullPolicy = Field(default="IfNotPresent", description=(
        "imagePullPolicy when the job does not choose one (`#K8S pull_policy=`)."))
    node_label: NonEmpty | None = Field(default=None, description=(
        "If set, the Kubernetes node for Slurm node X is the node labelled `<node_label>=X`; unset: the "
        "Kubernetes node of the Slurm node's name."))
    gpu_mode: Literal["env", "device-plugin", "dra"] = Field(default="env", description=(
        "`dra`: each pod with GPUs gets a ResourceClaim allocated to exactly the devices behind the GRES "
        "indices Slurm chose (read from the node's ResourceSlices; see dra_driver, dra_device_identity); "
        "the runtime injects them through CDI. `env`: pin GPUs by NVIDIA_VISIBLE_DEVICES to those indices, "
        "no nvidia.com/gpu request (needs the NVIDIA toolkit's insecure default that honours that variable "
        "from unprivileged pods); `device-plugin`: request nvidia.com/gpu (the plugin picks devices, only "
        "the count follows Slurm)."))
    dra_driver: NonEmpty | None = Field(default=None, description=(
        "`dra` mode: the DRA driver publishing the GPUs (e.g. `gpu.nvidia.com`, `gpu.example.com`)."))
    dra_device_class: NonEmpty | None = Field(default=None, description=(
        "`dra` mode: the DeviceClass the claims name; unset: the driver's name."))
    dra_device_identity: Literal["index", "minor", "pciBusID"] = Field(default="index", description=(
        "`dra` mode: how Slurm's GRES index N names a published device. `index`: the device whose `index` "
        "attribute is N (dra-example-driver); `minor`: whose `minor` attribute is N (gres.conf "
        "File=/dev/nvidia[0-N], minor = index; NVIDIA's driver); `pciBusID`: the N-th device by ascending "
        "`pciBusID` (Slurm's AutoDetect=nvml order)."))
    host_network: StrictBool = Field(default=False, description=(
        "Run pods in the node's network namespace, like native Slurm jobs (the nodes' own names resolve "
        "as on the hosts)."))
    resolve_first_node: StrictBool = Field(default=True, description=(
        "Every pod of a multi-node job resolves the first Slurm node's name to the first pod "
        "(`MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1)`, torch.distributed's "
        "TCP rendezvous): the first pod is created first, and the others "
        "once it has an address, with the name as a host alias of it. Off: all pods at once (they start "
        "one pod network setup sooner), and rank 0 is reachable only by pod address. Ignored with "
        "host_network."))
    runtime_class: NonEmpty | None = Field(default=None, description=(
        "runtimeClassName of the pods, e.g. `nvidia` where the NVIDIA runtime is not the default."))
    cpu_request_fraction: StrictFloat = Field(default=1.0, gt=0.0, le=1.0, description=(
        "CPU request as a fraction of the CPUs Slurm allocated (the limit is always the full allocation; "
        "requests never exceed it). Below 1 only when Slurm is told a node has more CPUs than the kubelet "
        "reports (oversubscription, a small test VM): otherwise the kubelet refuses pods Slurm placed."))
    volumes: tuple[VolumeConfig, ...] = Field(
        default=(), description="Host directories mounted into every pod.")
    tolerations: tuple[Toleration, ...] = Field(default=(), description=(
        "Extra pod tolerations; the bridged-node taint is always tolerated."))
    pod_annotations: Mapping[str, StrictStr] = Field(default_factory=dict, description=(
        "Extra annotations on every pod of the partition (cost centres, a policy engine's hints, a "
        "simulator's stage). `${NAME}` in a value is the job's environment variable NAME (empty when "
        "unset), `${NAME:-default}` falls back to the default. Keys under slurm-k8s-bridge/ are the "
        "bridge's own."))
    simulated: StrictBool = Field(default=False, description=(
        "The nodes are simulated (kwok): pods run no containers, so the daemon reads no output from them "
        "(the -o/-e files get only what the waiter itself writes); pods end as the simulator's stages say "
        "(see pod_annotations)."))

    @model_validator(mode="after")
    def _dra_names_a_driver(self) -> Self:
        if self.gpu_mode == "dra" and self.dra_driver is None:
            raise KeyProblem("dra_driver", "required when gpu_mode is 'dra' (the driver publishing the GPUs)")
        return self

    @field_validator("node_label")
    @classmethod
    def _node_label_is_a_label_key(cls, key: str | None) -> str | None:
        return _label_key("label key", key)

    @field_validator("runtime_class")
    @classmethod
    def _runtime_class_is_a_name(cls, name: str | None) -> str | None:
        if name is not None and not _DNS_SUBDOMAIN.match(name):
            raise ValueError(f"{name!r} is not a valid RuntimeClass name")
        return name

    @field_validator("volumes")
    @classmethod
    def _volumes_are_distinct(cls, volumes: tuple[VolumeConfig, ...]) -> tuple[VolumeConfig, ...]:
        for what, values in (("volume name", [v.name for v in volumes]),
                             ("mount_path", [v.mount_path for v in volumes])):
            for value in values:
                if values.count(value) > 1:
                    raise ValueError(f"{what} {value!r} is used twice")
        return volumes

    @field_validator("pod_annotations")
    @classmethod
    def _annotation_keys_are_ours_to_use(cls, annotations: Mapping[str, str]) -> Mapping[str, str]:
        for key in annotations:
            if not is_label_key(key):
                raise KeyProblem(key, "is not a valid annotation key (an optional DNS prefix/ and a name)")
            if key.startswith(wellknown.PREFIX):
                raise KeyProblem(key, f"keys under {wellknown.PREFIX} are the bridge's own")
        return annotations
