"""The bridge's configuration, read from one TOML file (docs/bridge.example.toml shows every key).

Unknown keys are errors, not warnings: a misspelt `gpu_mode` that silently falls back to the
default would hand a job GPUs it was not given. The JWT is never read here, only its file's path,
so that no configuration object can leak the token through a repr or a log line.
"""

from __future__ import annotations

import os
import re
import shlex
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from bridge.core import wellknown
from bridge.core.directives import PULL_POLICIES
from bridge.core.errors import PermanentError

BACKENDS = ("rest", "pyslurm")
GPU_MODES = ("env", "device-plugin")
LOG_LEVELS = ("debug", "info", "warning", "error")
SUPPLEMENTAL_GROUPS = ("nss", "none")
SUPPLEMENTAL_GROUPS_POLICIES = ("auto", "Strict", "Merge", "")

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_TOLERATION_KEYS = frozenset({"key", "operator", "value", "effect", "tolerationSeconds"})

DEFAULT_ATTACH_COMMAND = "/usr/bin/python3 -I -S /usr/libexec/slurm-k8s-bridge/waiter.py"
"""The waiter as the slurmds start it: one root-owned copy of bridge/waiter/attach.py, by absolute path, in
isolated mode (-I: no PYTHON* variables, no user site, no script or cwd directory on sys.path)."""
_SHELL_SPECIAL = frozenset("$`;|&<>(){}*?[]~#!\\\n")
_PYTHON = re.compile(r"^(python|pypy)[0-9.]*$")
# Programs whose business is to start another program, found on the PATH (the job's, i.e. the
# user's) unless named by absolute path: the waiter must not be started through them.
_PROGRAM_RUNNERS = frozenset({
    "env", "sh", "bash", "dash", "zsh", "ksh", "csh", "tcsh", "fish", "busybox", "nice", "nohup",
    "setsid", "stdbuf", "timeout", "ionice", "chrt", "taskset", "numactl", "xargs", "sudo", "su",
    "runuser", "doas", "exec", "command", "time", "flock", "unshare", "nsenter", "chroot", "strace",
})

T = TypeVar("T")


class ConfigError(PermanentError, ValueError):
    """The configuration is invalid; the message names the file and the key."""


@dataclass(frozen=True)
class VolumeConfig:
    """A host directory mounted into every pod of a partition at the same path."""

    name: str
    """Volume name in the pod (a DNS label)."""
    host_path: str
    """Directory on the Kubernetes node; it must exist (hostPath type Directory)."""
    mount_path: str
    """Path in the container; defaults to host_path so that job paths mean the same inside."""
    read_only: bool = False


@dataclass(frozen=True)
class PartitionConfig:
    """How the jobs of one bridged Slurm partition run on Kubernetes."""

    default_image: str | None = None
    """Image for jobs without `#K8S image=`; None makes the directive mandatory."""
    image_pull_policy: str = "IfNotPresent"
    """imagePullPolicy when the job does not choose one."""
    node_label: str | None = None
    """If set, the Kubernetes node for Slurm node X is the node labelled `<node_label>=X`;
    otherwise the Kubernetes node has the Slurm node's name."""
    gpu_mode: str = "env"
    """`env`: pin GPUs by NVIDIA_VISIBLE_DEVICES only (no nvidia.com/gpu request, Slurm owns the
    GPUs); `device-plugin`: request nvidia.com/gpu (the plugin picks devices, only counts match)."""
    host_network: bool = False
    """Run pods in the node's network namespace, like native Slurm jobs (multi-node jobs need it
    to reach MASTER_ADDR, see translate)."""
    runtime_class: str | None = None
    """runtimeClassName of the pods, e.g. `nvidia` where the NVIDIA runtime is not the default
    (the `env` GPU mode needs a runtime that reads NVIDIA_VISIBLE_DEVICES)."""
    cpu_request_fraction: float = 1.0
    """CPU request as a fraction of the CPUs Slurm allocated (the limit is always the full
    allocation). 1 means requests = limits; less lets a node that Slurm is told has more CPUs
    than the kubelet reports (oversubscription, a small test VM) still admit the pods."""
    volumes: tuple[VolumeConfig, ...] = ()
    tolerations: tuple[Mapping[str, Any], ...] = ()
    """Extra pod tolerations, in Kubernetes' own shape; the bridged taint is always tolerated."""
    pod_annotations: Mapping[str, str] = field(default_factory=dict)
    """Extra annotations on every pod of the partition (cost centres, a policy engine's hints, a
    simulator's stage). `${NAME}` in a value is replaced by the job's environment variable NAME
    (empty when unset), e.g. `"example.com/account" = "${SLURM_JOB_ACCOUNT}"`."""
    simulated: bool = False
    """The nodes are simulated (kwok): pods run no containers, so the daemon reads no output
    from them (kwok serves no logs: every read would fail and be retried until the job's end
    waited it out); the -o/-e files get only what the waiter itself writes. Pods end as the
    simulator's stages say (see pod_annotations)."""


@dataclass(frozen=True)
class SlurmConfig:
    """How the bridge reads Slurm."""

    backend: str = "rest"
    """`rest` (slurmrestd) or `pyslurm`."""
    rest_url: str | None = None
    """slurmrestd base URL such as http://127.0.0.1:6820 (required for `rest`)."""
    token_file: Path | None = None
    """File holding the JWT for slurmrestd; read when connecting, so rotation needs no restart."""
    rest_user: str | None = None
    """X-SLURM-USER-NAME sent with the token, if the token is not a user's own."""
    poll_interval_s: float = 0.2
    """Pause between polls of the jobs' update time (Slurm has no watch)."""
    slurm_conf: Path | None = None
    """The cluster's slurm.conf for the pyslurm backend, if not $SLURM_CONF or Slurm's default."""


@dataclass(frozen=True)
class KubeConfig:
    """How the bridge reaches Kubernetes."""

    kubeconfig: Path | None = None
    """kubeconfig file; None means in-cluster service account credentials."""
    context: str | None = None
    """kubeconfig context; None means the file's current context."""


@dataclass(frozen=True)
class ApiConfig:
    """The bridge's own HTTP API (health, metrics, waiters attaching)."""

    host: str = "127.0.0.1"
    """Listen address; the default only serves slurmds on the same host."""
    port: int = 8470
    tls_cert_file: Path | None = None
    """PEM certificate (chain) to serve the API over TLS with; None serves plain HTTP."""
    tls_key_file: Path | None = None
    """Its private key (set with tls_cert_file); readable by the daemon only."""

    @property
    def tls(self) -> bool:
        return self.tls_cert_file is not None


@dataclass(frozen=True)
class WaiterConfig:
    """How job-side waiters reach the daemon and prove who they are."""

    unmunge_command: tuple[str, ...] = ("unmunge",)
    """Command that decodes a waiter's munge credential (it talks to this host's munged)."""
    attach_command: str = DEFAULT_ATTACH_COMMAND
    """Command line, as run on the slurmds (as the job's user), that starts a waiter;
    job_submit.lua puts it into every rewritten batch script, followed by `--api <api_url>` and
    the script's path. Validated: nothing in it may be looked up on the user's PATH or cwd."""
    api_url: str = "http://127.0.0.1:8470"
    """URL of this daemon's API as the slurmds reach it (https:// when the API serves TLS)."""
    ca_file: Path | None = None
    """CA bundle, on the slurmd hosts, that the waiters verify the API's certificate with
    (`--ca`); None: the system's CAs."""
    slurmd_hosts: frozenset[str] = frozenset()
    """Addresses (as munged reports them: unmunge's ENCODE_HOST) of the hosts where bridged
    slurmds run. If set, waiter and task-proxy requests are only taken from there: a user's
    credential made on a login node cannot attach to their job (and so never sees its step
    tokens). Empty: any host of the munge realm."""
    step_key_file: Path | None = None
    """Secret key (root only, mode 600) shared by this daemon and the SPANK step guard on the
    bridged slurmds' hosts: it signs each `srun` step of a bridged job, so that only steps the
    bridge launched pass the guard. None: srun is not available in bridged jobs."""


@dataclass(frozen=True)
class PodsConfig:
    """What every job pod gets, whatever its partition."""

    supplemental_groups: str = "nss"
    """`nss`: the job user's groups as the daemon's host resolves them (getgrouplist of the user
    name Slurm reports) become the pod's supplementalGroups; `none`: no supplementary groups."""
    supplemental_groups_policy: str = "auto"
    """supplementalGroupsPolicy of the pods: `Strict` (only the groups above: the image's
    /etc/group adds none; needs containerd >= 2.0 or CRI-O >= 1.31, else the kubelet refuses the
    pod), `auto` (Strict on every node that reports it supports it, node.status.features, and
    unset elsewhere), `Merge` (Kubernetes' default), or "" to leave the field unset."""
    agent_image: str | None = None
    """Image holding the in-pod agent (/slurm-k8s-bridge-agent, built from agent/). An init
    container copies it into each job pod, where it runs the script: stdout and stderr then reach
    the job's -o and -e files apart and byte for byte, and signals from `scancel -s` and
    `--signal` reach the script. Without it the script runs directly and its two streams arrive
    merged, line by line."""
    agent_pull_policy: str = "IfNotPresent"


@dataclass(frozen=True)
class LeaderConfig:
    """Leader election among replicas (a coordination.k8s.io Lease): only the leader acts."""

    enabled: bool = True
    lease_name: str | None = None
    """Lease name; default `slurm-k8s-bridge-<cluster>`."""
    namespace: str | None = None
    """Namespace of the Lease; default the job namespace."""
    identity: str | None = None
    """This replica's name on the Lease; default `<hostname>:<api port>` (a pod's hostname is
    its name, so replicas differ; a restarted replica takes its own Lease back at once)."""
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0


@dataclass(frozen=True)
class NodesConfig:
    """Kubernetes node health carried over to Slurm (bridge.core.nodehealth)."""

    enabled: bool = True
    """Down or drain bridged Slurm nodes whose Kubernetes twin is unhealthy (and resume them)."""
    not_ready_grace_s: float = 60.0
    """How long a Kubernetes node may be NotReady or Unknown before its Slurm node goes DOWN (and
    the jobs running there end as on any failed node: requeued, or NODE_FAIL)."""
    poll_interval_s: float = 1.0
    """Seconds between polls of slurmctld's node states (cheap when nothing changed)."""


@dataclass(frozen=True)
class BridgeConfig:
    """Everything the daemon needs to know, validated."""

    cluster: str
    """Slurm cluster name; also a label value on every pod."""
    partitions: Mapping[str, PartitionConfig]
    """Bridged partitions by Slurm partition name; jobs elsewhere are left alone."""
    namespace: str = "slurm-jobs"
    """Namespace of the job pods (one namespace per cluster: pod names do not carry the cluster)."""
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    kube: KubeConfig = field(default_factory=KubeConfig)
    api: ApiConfig = field(default_factory=ApiConfig)
    waiter: WaiterConfig = field(default_factory=WaiterConfig)
    pods: PodsConfig = field(default_factory=PodsConfig)
    leader: LeaderConfig = field(default_factory=LeaderConfig)
    nodes: NodesConfig = field(default_factory=NodesConfig)
    termination_grace_s: int = 10
    """Seconds between SIGTERM and SIGKILL when a job's pods are deleted."""
    start_failure_grace_s: float = 60.0
    """How long a pod may stay unstarted (an error the kubelet keeps retrying: image pull,
    volume mount, unschedulable, container config; or no kubelet at all) before the job is failed
    with the reason. An image still being pulled is waited for."""
    log_level: str = "info"

    def partition(self, name: str) -> PartitionConfig | None:
        """The configuration of a bridged partition, None if `name` is not bridged."""
        return self.partitions.get(name)


def load_config(path: str | Path) -> BridgeConfig:
    """Read and validate the TOML file at `path`."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    return parse_config(text, source=str(path))


def parse_config(text: str, source: str = "<config>") -> BridgeConfig:
    """Validate TOML `text`; `source` names it in error messages."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from exc
    return config_from_dict(data, source)


def config_from_dict(data: Mapping[str, Any], source: str = "<config>") -> BridgeConfig:
    """Validate an already decoded configuration."""
    top = _Table(data, "", source)
    cluster = top.get_str("cluster", required=True)
    assert cluster is not None
    if not _LABEL_NAME.match(cluster):
        top.fail("cluster", f"{cluster!r} is not a valid Kubernetes label value (letters, digits, -_.)")
    namespace = top.get_str("namespace", "slurm-jobs")
    assert namespace is not None
    if not _DNS_LABEL.match(namespace):
        top.fail("namespace", f"{namespace!r} is not a valid namespace name (DNS label)")
    log_level = top.choice("log_level", LOG_LEVELS, "info")
    grace = top.get_int("termination_grace_s", 10, minimum=0)
    start_grace = top.get_float("start_failure_grace_s", 60.0, minimum_exclusive=0.0)

    slurm = _slurm(top.table("slurm"))
    kube = _kube(top.table("kubernetes"))
    api = _api(top.table("api"))
    waiter = _waiter(top.table("waiter"), api)
    leader = _leader(top.table("leader_election"))
    pods = _pods(top.table("pods"))
    nodes = _nodes(top.table("nodes"))

    parts_table = top.table("partitions")
    partitions = {name: _partition(parts_table.table(name)) for name in parts_table.names()}
    if not partitions:
        top.fail("partitions", "no partition is bridged; add a [partitions.NAME] table")
    top.done()
    parts_table.done()
    return BridgeConfig(
        cluster=cluster,
        namespace=namespace,
        log_level=log_level,
        termination_grace_s=grace,
        start_failure_grace_s=start_grace,
        slurm=slurm,
        kube=kube,
        api=api,
        waiter=waiter,
        pods=pods,
        leader=leader,
        nodes=nodes,
        partitions=partitions,
    )


def _slurm(t: _Table) -> SlurmConfig:
    backend = t.choice("backend", BACKENDS, "rest")
    url = t.get_str("url")
    if url is not None and not re.match(r"^https?://[^/\s]+", url):
        t.fail("url", f"{url!r} is not an http:// or https:// URL")
    if backend == "rest" and url is None:
        t.fail("url", "required when backend is 'rest'")
    token_file = t.get_str("token_file")
    cfg = SlurmConfig(
        backend=backend,
        rest_url=url.rstrip("/") if url else None,
        token_file=Path(token_file) if token_file else None,
        rest_user=t.get_str("user"),
        poll_interval_s=t.get_float("poll_interval_s", 0.2, minimum_exclusive=0.0),
        slurm_conf=Path(conf) if (conf := t.get_str("slurm_conf")) else None,
    )
    t.done()
    return cfg


def _kube(t: _Table) -> KubeConfig:
    kubeconfig = t.get_str("kubeconfig")
    cfg = KubeConfig(kubeconfig=Path(kubeconfig) if kubeconfig else None, context=t.get_str("context"))
    t.done()
    return cfg


def _api(t: _Table) -> ApiConfig:
    listen = t.get_str("listen", "127.0.0.1:8470")
    assert listen is not None
    host, sep, port_s = listen.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")  # [::1]:6830
    if not sep or not host or not port_s.isdigit() or not 0 < int(port_s) < 65536:
        t.fail("listen", f"{listen!r} is not HOST:PORT")
    cert, key = t.get_str("tls_cert_file"), t.get_str("tls_key_file")
    if (cert is None) != (key is None):
        t.fail("tls_cert_file" if cert is None else "tls_key_file",
               "set both tls_cert_file and tls_key_file, or neither")
    if cert is not None and key is not None:
        for name, path in (("tls_cert_file", cert), ("tls_key_file", key)):
            if not Path(path).is_file():
                t.fail(name, f"{path} does not exist (or is not a file)")
        # Checked like the JWT file (doctor): whoever reads the key can impersonate the daemon to
        # the waiters, which hand it their jobs' scripts and environments.
        info = Path(key).stat()
        exposed_to = secret_file_exposure(info.st_mode & 0o777, info.st_gid, {os.getegid(), *os.getgroups()})
        if exposed_to:
            t.fail("tls_key_file", f"{key} is readable by {exposed_to} (mode {info.st_mode & 0o777:o}); "
                                   f"chmod 600 {key}")
    t.done()
    return ApiConfig(host=host, port=int(port_s), tls_cert_file=Path(cert) if cert else None,
                     tls_key_file=Path(key) if key else None)


def secret_file_exposure(mode: int, gid: int, own_gids: set[int]) -> str | None:
    """Who besides the daemon may read a secret file, or None when nobody may. A group bit is
    fine when the group is one of the daemon's own (a Kubernetes Secret volume with fsGroup is
    mode 0440, group = the pod's own group)."""
    if mode & 0o007:
        return "every user"
    if mode & 0o070 and gid not in own_gids:
        return f"group {gid}"
    return None


def _pods(t: _Table) -> PodsConfig:
    cfg = PodsConfig(
        supplemental_groups=t.choice("supplemental_groups", SUPPLEMENTAL_GROUPS, "nss"),
        # "" is a value here: leave the field to the API server's default.
        supplemental_groups_policy=t.choice(
            "supplemental_groups_policy", SUPPLEMENTAL_GROUPS_POLICIES, "auto", allow_empty=True
        ),
        agent_image=t.get_str("agent_image"),
        agent_pull_policy=t.choice("agent_pull_policy", PULL_POLICIES, "IfNotPresent"),
    )
    t.done()
    return cfg


def _nodes(t: _Table) -> NodesConfig:
    cfg = NodesConfig(
        enabled=t.get_bool("enabled", True),
        not_ready_grace_s=t.get_float("not_ready_grace_s", 60.0, minimum_exclusive=0.0),
        poll_interval_s=t.get_float("poll_interval_s", 1.0, minimum_exclusive=0.0),
    )
    t.done()
    return cfg


def _leader(t: _Table) -> LeaderConfig:
    cfg = LeaderConfig(
        enabled=t.get_bool("enabled", True),
        lease_name=t.get_str("lease_name"),
        namespace=t.get_str("namespace"),
        identity=t.get_str("identity"),
        lease_duration_s=t.get_float("lease_duration_s", 15.0, minimum_exclusive=0.0),
        renew_deadline_s=t.get_float("renew_deadline_s", 10.0, minimum_exclusive=0.0),
        retry_period_s=t.get_float("retry_period_s", 2.0, minimum_exclusive=0.0),
    )
    if not cfg.retry_period_s < cfg.renew_deadline_s < cfg.lease_duration_s:
        t.fail("renew_deadline_s", "needs retry_period_s < renew_deadline_s < lease_duration_s")
    t.done()
    return cfg


def _waiter(t: _Table, api: ApiConfig) -> WaiterConfig:
    unmunge = t.get_str("unmunge_command", "unmunge")
    attach = t.get_str("attach_command", DEFAULT_ATTACH_COMMAND)
    host = f"[{api.host}]" if ":" in api.host else api.host
    url = t.get_str("api_url", f"{'https' if api.tls else 'http'}://{host}:{api.port}")
    assert unmunge is not None and attach is not None and url is not None
    if not re.match(r"^https?://[^/\s]+", url):
        t.fail("api_url", f"{url!r} is not an http:// or https:// URL")
    https = url.lower().startswith("https://")
    if api.tls and not https:
        t.fail("api_url", f"{url!r} must be https://: the API is served over TLS (api.tls_cert_file)")
    problem = attach_command_problem(attach)
    if problem:
        t.fail("attach_command", problem)
    hosts_raw = t._get("slurmd_hosts", list, "a list of addresses") or []
    if not all(isinstance(h, str) and h for h in hosts_raw):
        t.fail("slurmd_hosts", "must be a list of non-empty strings (addresses as unmunge reports them)")
    step_key = t.get_str("step_key_file")
    if step_key is not None and (not step_key.startswith("/") or set(step_key) & (_SHELL_SPECIAL | {" "})):
        t.fail("step_key_file", f"{step_key!r} is not an absolute path without spaces or shell characters")
    ca_file = t.get_str("ca_file")
    if ca_file is not None:
        if not https:
            t.fail("ca_file", f"only used with an https:// api_url, not {url!r}")
        # A path on the slurmd hosts (not necessarily this one), written into the waiter's command
        # line: absolute, and nothing the batch script's shell would split or expand.
        if not ca_file.startswith("/") or set(ca_file) & (_SHELL_SPECIAL | set(" \t'\"")):
            t.fail("ca_file", f"{ca_file!r} is not an absolute path without spaces or shell characters")
    t.done()
    return WaiterConfig(unmunge_command=tuple(shlex.split(unmunge)), attach_command=attach, api_url=url,
                        ca_file=Path(ca_file) if ca_file else None,
                        step_key_file=Path(step_key) if step_key else None,
                        slurmd_hosts=frozenset(hosts_raw))


def attach_command_problem(command: str) -> str | None:
    """Why `command` may not start the waiter, or None. It runs as the job's user, in the user's
    environment and submit directory: whatever it names relatively (a program on the PATH, a
    script beside the cwd) the user can plant, and Python without -I reads PYTHONPATH & co."""
    special = sorted(set(command) & _SHELL_SPECIAL)
    if special:
        # job_submit.lua writes it into a /bin/sh script: `$HOME`, a glob or a `;` would be expanded
        # in the user's environment and directory.
        return f"{command!r} holds {''.join(special)!r}, which the batch script's shell would interpret"
    try:
        words = shlex.split(command)
    except ValueError as error:
        return f"{command!r} is not a valid command line ({error})"
    if not words or not words[0].startswith("/"):
        return (f"{command!r} does not start with an absolute path: the job's PATH is the user's to "
                f"shape. Use e.g. {DEFAULT_ATTACH_COMMAND!r}")
    program = words[0].rsplit("/", 1)[1]
    if program in _PROGRAM_RUNNERS:
        return (f"{command!r} starts {program}, which runs another program looked up on the user's "
                "PATH; name the interpreter itself by absolute path")
    if _PYTHON.match(program):
        isolated, target = _python_options(words[1:])
        if not isolated:
            return (f"{command!r} runs Python without -I: PYTHONPATH, the user site and the cwd would "
                    "decide what it imports. Add -I -S before the waiter's path")
        if target is not None and not target.startswith("/"):
            return f"{command!r}: the script {target!r} is not an absolute path (it would be the cwd's)"
    return None


def attach_command_files(command: str) -> list[str]:
    """The files a valid attach command runs: its program and, for Python, the script."""
    words = shlex.split(command)
    files = words[:1]
    if _PYTHON.match(words[0].rsplit("/", 1)[-1]):
        script = _python_options(words[1:])[1]
        files += [script] if script else []
    return files


def _python_options(args: list[str]) -> tuple[bool, str | None]:
    """(is -I among the interpreter's options, the script path if one follows them)."""
    isolated, rest = False, iter(args)
    for arg in rest:
        if arg in ("--", "-") or not arg.startswith("-"):
            return isolated, (None if arg in ("--", "-") else arg)
        if arg.startswith("--"):
            continue  # --version & co.: no short options inside
        for at, letter in enumerate(arg[1:], start=1):
            isolated = isolated or letter == "I"
            if letter in "cm":  # a program text or a module follows, not a script path
                return isolated, None
            if letter in "WX":  # the option's argument: the rest of this word, or the next one
                if at == len(arg) - 1:
                    next(rest, None)
                break
    return isolated, None


def _partition(t: _Table) -> PartitionConfig:
    node_label = t.get_str("node_label")
    if node_label is not None and not _is_label_key(node_label):
        t.fail("node_label", f"{node_label!r} is not a valid Kubernetes label key")
    runtime_class = t.get_str("runtime_class")
    if runtime_class is not None and not _DNS_SUBDOMAIN.match(runtime_class):
        t.fail("runtime_class", f"{runtime_class!r} is not a valid RuntimeClass name")
    volumes = tuple(_volume(v) for v in t.tables("volumes"))
    names = [v.name for v in volumes]
    for name in names:
        if names.count(name) > 1:
            t.fail("volumes", f"volume name {name!r} is used twice")
    mounts = [v.mount_path for v in volumes]
    for mount in mounts:
        if mounts.count(mount) > 1:
            t.fail("volumes", f"mount_path {mount!r} is used twice")
    cfg = PartitionConfig(
        default_image=t.get_str("default_image"),
        image_pull_policy=t.choice("image_pull_policy", PULL_POLICIES, "IfNotPresent"),
        node_label=node_label,
        gpu_mode=t.choice("gpu_mode", GPU_MODES, "env"),
        host_network=t.get_bool("host_network", False),
        runtime_class=runtime_class,
        cpu_request_fraction=_fraction(t, "cpu_request_fraction"),
        volumes=volumes,
        tolerations=tuple(_toleration(x) for x in t.tables("tolerations")),
        pod_annotations=_pod_annotations(t.table("pod_annotations")),
        simulated=t.get_bool("simulated", False),
    )
    t.done()
    return cfg


def _pod_annotations(t: _Table) -> dict[str, str]:
    annotations: dict[str, str] = {}
    for key in t.names():
        if not _is_label_key(key):
            t.fail(key, "is not a valid annotation key (an optional DNS prefix/ and a name)")
        if key.startswith(wellknown.PREFIX):
            t.fail(key, f"keys under {wellknown.PREFIX} are the bridge's own")
        value = t._get(key, str, "a string")
        annotations[key] = value or ""
    t.done()
    return annotations


def _fraction(t: _Table, key: str) -> float:
    value = t.get_float(key, 1.0, minimum_exclusive=0.0)
    if value > 1.0:
        t.fail(key, f"{value} is more than 1 (requests never exceed the allocation)")
    return value


def _volume(t: _Table) -> VolumeConfig:
    name = t.get_str("name", required=True)
    assert name is not None
    if not _DNS_LABEL.match(name):
        t.fail("name", f"{name!r} is not a valid volume name (DNS label)")
    if name in wellknown.RESERVED_VOLUMES:
        t.fail("name", f"{name!r} is reserved for the bridge's own volumes")
    host_path = t.get_str("host_path", required=True)
    assert host_path is not None
    mount_path = t.get_str("mount_path", host_path)
    assert mount_path is not None
    for key, path in (("host_path", host_path), ("mount_path", mount_path)):
        if not path.startswith("/"):
            t.fail(key, f"{path!r} is not an absolute path")
    if mount_path.rstrip("/") in (wellknown.SCRIPT_DIR, "/dev/shm", ""):
        t.fail("mount_path", f"{mount_path!r} is used by the bridge itself (or is /)")
    read_only = t.get_bool("read_only", False)
    cfg = VolumeConfig(name=name, host_path=host_path, mount_path=mount_path, read_only=read_only)
    t.done()
    return cfg


def _toleration(t: _Table) -> Mapping[str, Any]:
    unknown = set(t.names()) - _TOLERATION_KEYS
    if unknown:
        t.fail(sorted(unknown)[0], f"not a toleration field; allowed: {', '.join(sorted(_TOLERATION_KEYS))}")
    result: dict[str, Any] = {}
    for key in ("key", "operator", "value", "effect"):
        value = t.get_str(key)
        if value is not None:
            result[key] = value
    if "tolerationSeconds" in t.names():
        result["tolerationSeconds"] = t.get_int("tolerationSeconds", 0)
    if result.get("operator", "Equal") not in ("Equal", "Exists"):
        t.fail("operator", "must be Equal or Exists")
    if result.get("effect", "NoSchedule") not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
        t.fail("effect", "must be NoSchedule, PreferNoSchedule or NoExecute")
    return result


def _is_label_key(key: str) -> bool:
    prefix, sep, name = key.rpartition("/")
    if sep and not _DNS_SUBDOMAIN.match(prefix):
        return False
    return bool(_LABEL_NAME.match(name))


class _Table:
    """Typed, path-aware access to one TOML table that remembers which keys were read."""

    def __init__(self, data: object, path: str, source: str) -> None:
        self.path = path
        self.source = source
        if not isinstance(data, Mapping):
            raise ConfigError(f"{source}: {path or 'top level'}: expected a table")
        self.data: Mapping[str, Any] = data
        self.used: set[str] = set()

    def names(self) -> list[str]:
        return list(self.data)

    def where(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: str, message: str) -> None:
        raise ConfigError(f"{self.source}: {self.where(key)}: {message}")

    def _get(self, key: str, kind: type[T] | tuple[type, ...], what: str) -> T | None:
        self.used.add(key)
        value = self.data.get(key)
        if value is None:
            return None
        # bool is an int subclass in Python; TOML true is never a meant number.
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            self.fail(key, f"expected {what}, got {type(value).__name__} {value!r}")
        result: T = value
        return result

    def get_str(
        self, key: str, default: str | None = None, *, required: bool = False, allow_empty: bool = False
    ) -> str | None:
        value = self._get(key, str, "a string")
        if value is None and required:
            self.fail(key, "required")
        if value == "" and not allow_empty:
            self.fail(key, "must not be empty")
        return default if value is None else value

    def get_bool(self, key: str, default: bool) -> bool:
        value = self._get(key, bool, "true or false")
        return default if value is None else value

    def get_int(self, key: str, default: int, *, minimum: int | None = None) -> int:
        value = self._get(key, int, "an integer")
        value = default if value is None else value
        if minimum is not None and value < minimum:
            self.fail(key, f"must be at least {minimum}")
        return value

    def get_float(self, key: str, default: float, *, minimum_exclusive: float | None = None) -> float:
        value = self._get(key, (int, float), "a number")
        result = default if value is None else float(value)
        if minimum_exclusive is not None and result <= minimum_exclusive:
            self.fail(key, f"must be greater than {minimum_exclusive}")
        return result

    def choice(self, key: str, choices: tuple[str, ...], default: str, *, allow_empty: bool = False) -> str:
        value = self.get_str(key, default, allow_empty=allow_empty)
        assert value is not None
        if value not in choices:
            self.fail(key, f"must be one of {', '.join(map(repr, choices))}, got {value!r}")
        return value

    def table(self, key: str) -> _Table:
        self.used.add(key)
        return _Table(self.data.get(key, {}), self.where(key), self.source)

    def tables(self, key: str) -> list[_Table]:
        """An array of tables (`[[x]]` or `x = [{...}]`); missing means empty."""
        self.used.add(key)
        value = self.data.get(key, [])
        if not isinstance(value, list):
            self.fail(key, "expected an array of tables")
        return [_Table(v, f"{self.where(key)}[{i}]", self.source) for i, v in enumerate(value)]

    def done(self) -> None:
        """Reject keys nobody read: they are typos or options that do not exist."""
        unknown = [k for k in self.data if k not in self.used]
        if unknown:
            known = ", ".join(sorted(self.used)) or "none"
            self.fail(unknown[0], f"unknown key (known here: {known})")
