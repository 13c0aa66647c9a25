"""The bridge's configuration: BridgeConfig (the top level), [waiter], and parse_config. Pure.

One model per TOML table (the other tables: bridge.core.config_sections), each key's type,
default and meaning written once. The models are frozen pydantic dataclasses with strict values
and unknown keys forbidden (bridge.core.config_types): a misspelt `gpu_mode` that silently fell
back to the default would hand a job GPUs it was not given. docs/configuration.md is generated
from them (python -m bridge.manager.config_reference). parse_config validates TOML text; reading
the file, and the checks that look at the files it names, are the manager's
(bridge.manager.config_file). The JWT is never read here, only its file's path, so that no
configuration object can leak the token through a repr or a log line.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import (
    BeforeValidator,
    Field,
    StrictFloat,
    StrictInt,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.dataclasses import dataclass

from bridge.core import wellknown
from bridge.core.attach_command import DEFAULT_ATTACH_COMMAND, SHELL_SPECIAL, attach_command_problem
from bridge.core.config_errors import ConfigError, KeyProblem, config_error
from bridge.core.config_sections import (
    ApiConfig,
    KubeConfig,
    LeaderConfig,
    NodesConfig,
    PartitionConfig,
    PodsConfig,
    SlurmConfig,
    VolumeConfig,
    listen_address,
)
from bridge.core.config_types import MODEL_CONFIG, FilePath, NonEmpty
from bridge.core.config_workloads import ManagedNamespace, WorkloadsConfig

# Callers import every model from here, wherever it is defined.
__all__ = [
    "DEFAULT_ATTACH_COMMAND", "ApiConfig", "BridgeConfig", "ConfigError", "KubeConfig", "LeaderConfig",
    "ManagedNamespace", "NodesConfig", "PartitionConfig", "PodsConfig", "SlurmConfig", "VolumeConfig",
    "WaiterConfig", "WorkloadsConfig", "config_from_dict", "parse_config",
]

LogLevel = Literal["debug", "info", "warning", "error"]
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_URL = re.compile(r"^https?://[^/\s]+")


def _command_words(value: object) -> object:
    """unmunge_command is written as one command line; the daemon runs its words."""
    if isinstance(value, str):
        if not value.strip():
            raise ValueError("must not be empty")
        return tuple(shlex.split(value))
    return value


def _plain_absolute(path: Path | None, forbidden: frozenset[str] | set[str]) -> Path | None:
    if path is not None and (not str(path).startswith("/") or set(str(path)) & forbidden):
        raise ValueError(f"{str(path)!r} is not an absolute path without spaces or shell characters")
    return path


@dataclass(frozen=True, config=MODEL_CONFIG)
class WaiterConfig:
    """[waiter]: how job-side waiters reach the daemon and prove who they are."""

    unmunge_command: Annotated[tuple[str, ...], BeforeValidator(_command_words)] = Field(
        default=("unmunge",),
        json_schema_extra={"toml_type": "string (a command line)", "toml_default": '`"unmunge"`'},
        description="Command that decodes a waiter's munge credential (it talks to this host's munged).")
    attach_command: NonEmpty = Field(default=DEFAULT_ATTACH_COMMAND, description=(
        "Command line, as run on the slurmds (as the job's user, in the user's environment and submit "
        "directory), that starts a waiter; the step guard writes it into slurmd's copy of every bridged "
        "batch script, followed by `--api <api_url>`, the path of slurmd's copy of the user's script and "
        "its arguments. It must name everything by absolute path: "
        "start with one, not go through env, a shell or another program that finds its argument on the "
        "PATH, and hold no shell characters. The waiter is the compiled, static program of agent/cmd/waiter: "
        "install it on every bridged slurmd host, as root, from the bridge's source: "
        "`deploy/slurm/install-waiter.sh PATH` (root-owned, mode 755)."))
    api_url: NonEmpty = Field(default="http://127.0.0.1:8470", json_schema_extra={
        "toml_default": "http:// (https:// with TLS) + [api] listen"}, description=(
        "URL of this daemon's API as the slurmds reach it; https:// when the API serves TLS."))
    ca_file: FilePath | None = Field(default=None, description=(
        "CA bundle, on the slurmd hosts, that the waiters verify the API's certificate with (job-submit-conf "
        "passes it as --ca); https only. An absolute path without spaces or shell characters. Unset: the "
        "system's CAs. `doctor` refuses one that anyone but root may write, or that sits below a directory "
        "anyone else may write (they could have every waiter trust a daemon of theirs)."))
    slurmd_hosts: frozenset[NonEmpty] = Field(default=frozenset(), description=(
        "Addresses of the hosts where bridged slurmds run, as munged reports them (unmunge's ENCODE_HOST). "
        "If set, waiter and task-proxy requests are only taken from there: a user's credential made on a "
        "login node cannot attach to their job (and so never sees its step tokens). Empty: any host of "
        "the munge realm."))
    step_key_file: FilePath | None = Field(default=None, description=(
        "Secret key (root only, mode 600, 16 to 256 bytes) shared by this daemon and the SPANK step guard "
        "on the bridged slurmds' hosts, at the same path on both: it signs each `srun` step of a bridged "
        "job, so that only steps the bridge launched pass the guard. Unset: srun is not available in "
        "bridged jobs."))

    @field_validator("attach_command")
    @classmethod
    def _attach_command_is_safe(cls, command: str) -> str:
        problem = attach_command_problem(command)
        if problem:
            raise ValueError(problem)
        return command

    @field_validator("api_url")
    @classmethod
    def _api_url_is_http(cls, url: str) -> str:
        if not _URL.match(url):
            raise ValueError(f"{url!r} is not an http:// or https:// URL")
        # Written into the command line that the slurmds' /bin/sh runs for every bridged batch step
        # (an IPv6 literal's brackets stay: a pattern that matches no file is left as it is).
        special = sorted(set(url) & ((SHELL_SPECIAL - set("[]")) | set(" \t'\"")))
        if special:
            raise ValueError(f"{url!r} holds characters a shell would act on: {''.join(special)}")
        return url

    @field_validator("step_key_file")
    @classmethod
    def _step_key_path_is_plain(cls, path: Path | None) -> Path | None:
        # Written into job_submit_bridge.conf for the step guard on the slurmd hosts.
        return _plain_absolute(path, SHELL_SPECIAL | {" "})

    @field_validator("ca_file")
    @classmethod
    def _ca_path_is_plain(cls, path: Path | None) -> Path | None:
        # A path on the slurmd hosts (not necessarily this one), written into the waiter's command
        # line: absolute, and nothing the batch script's shell would split or expand.
        return _plain_absolute(path, SHELL_SPECIAL | set(" \t'\""))

    @model_validator(mode="after")
    def _ca_file_needs_https(self) -> Self:
        if self.ca_file is not None and not self.api_url.lower().startswith("https://"):
            raise KeyProblem("ca_file", f"only used with an https:// api_url, not {self.api_url!r}")
        return self


@dataclass(frozen=True, config=MODEL_CONFIG)
class BridgeConfig:
    """The top level: everything the daemon needs to know, validated."""

    cluster: NonEmpty = Field(description=(
        "Slurm cluster name (ClusterName in slurm.conf); also a label value on every pod, so letters, "
        "digits, '-', '_', '.', at most 63 characters."))
    partitions: Mapping[str, PartitionConfig] = Field(description=(
        "Bridged partitions by Slurm partition name, one [partitions.NAME] table each; jobs of other "
        "partitions are left alone."))
    namespace: NonEmpty = Field(default="slurm-jobs", description=(
        "Namespace of the job pods. Pod names do not carry the cluster: give each cluster its own."))
    slurm: SlurmConfig = Field(default_factory=SlurmConfig, description="How the bridge reads Slurm.")
    kube: KubeConfig = Field(default_factory=KubeConfig, alias="kubernetes",
                             description="How the bridge reaches Kubernetes.")
    api: ApiConfig = Field(default_factory=ApiConfig, description="The bridge's own HTTP API.")
    waiter: WaiterConfig = Field(default_factory=WaiterConfig,
                                 description="How job-side waiters reach the daemon.")
    pods: PodsConfig = Field(default_factory=PodsConfig,
                             description="What every job pod gets, whatever its partition.")
    leader: LeaderConfig = Field(default_factory=LeaderConfig, alias="leader_election",
                                 description="Leader election among replicas.")
    nodes: NodesConfig = Field(default_factory=NodesConfig,
                               description="Kubernetes node health carried over to Slurm.")
    workloads: WorkloadsConfig = Field(default_factory=WorkloadsConfig, description=(
        "Kubernetes workloads scheduled by Slurm: the managed namespaces."))
    termination_grace_s: StrictInt = Field(
        default=wellknown.DEFAULT_TERMINATION_GRACE_S, ge=0, description=(
        "Seconds between SIGTERM and SIGKILL when a job's pods are deleted (scancel, time limit), as "
        "KillWait is for a native step: a script's TERM trap gets this long. Keep it below slurm.conf's "
        "KillWait (Slurm kills the waiter after KillWait)."))
    start_failure_grace_s: StrictFloat = Field(default=60.0, gt=0.0, description=(
        "How long a pod may stay unstarted (an error the kubelet keeps retrying: image pull, volume mount, "
        "unschedulable, container config; or no kubelet at all) before the job fails with the pod's "
        "latest Warning event as the reason. An image still being pulled is waited for."))
    log_level: LogLevel = Field(default="info", description="Level of the daemon's log.")

    def partition(self, name: str) -> PartitionConfig | None:
        """The configuration of a bridged partition, None if `name` is not bridged."""
        return self.partitions.get(name)

    @model_validator(mode="before")
    @classmethod
    def _waiter_url_follows_the_api(cls, data: Any) -> Any:
        """Without waiter.api_url, waiters reach the API where it listens (https with TLS)."""
        if not isinstance(data, dict) or not isinstance(data.get("api", {}), dict):
            return data
        waiter = data.get("waiter", {})
        if not isinstance(waiter, dict) or "api_url" in waiter:
            return data
        api = data.get("api", {})
        listen = api.get("listen", ApiConfig().listen)
        address = listen_address(listen) if isinstance(listen, str) else None
        if address is None:
            return data  # the listen address's own error says why
        host, port = address
        scheme = "https" if api.get("tls_cert_file") is not None else "http"
        host = f"[{host}]" if ":" in host else host
        return {**data, "waiter": {**waiter, "api_url": f"{scheme}://{host}:{port}"}}

    @field_validator("cluster")
    @classmethod
    def _cluster_is_a_label_value(cls, cluster: str) -> str:
        if not _LABEL_VALUE.match(cluster):
            raise ValueError(f"{cluster!r} is not a valid Kubernetes label value (letters, digits, -_.)")
        return cluster

    @field_validator("namespace")
    @classmethod
    def _namespace_is_a_dns_label(cls, namespace: str) -> str:
        if not _DNS_LABEL.match(namespace):
            raise ValueError(f"{namespace!r} is not a valid namespace name (DNS label)")
        return namespace

    @field_validator("partitions")
    @classmethod
    def _some_partition_is_bridged(
        cls, partitions: Mapping[str, PartitionConfig]
    ) -> Mapping[str, PartitionConfig]:
        if not partitions:
            raise ValueError("no partition is bridged; add a [partitions.NAME] table")
        return partitions

    @model_validator(mode="after")
    def _managed_namespaces_use_bridged_partitions(self) -> Self:
        for name, managed in self.workloads.namespaces.items():
            where = f"workloads.namespaces.{name}"
            if self.slurm.backend != "rest":
                # Only slurmrestd submits in another user's name (an operator's token may).
                raise KeyProblem(where, "managed namespaces need [slurm] backend = \"rest\"")
            if self.waiter.step_key_file is None:
                raise KeyProblem(where, "managed namespaces need waiter.step_key_file (it signs their jobs' "
                                        "comments)")
            if managed.user in ("root", self.slurm.rest_user or "root"):
                raise KeyProblem(where, f"user {managed.user!r} may act for every user: map the namespace to "
                                        "an ordinary Slurm user")
            if name == self.namespace:
                raise KeyProblem(where, "the job namespace holds the bridge's own pods; it cannot be managed")
            for partition in (managed.partition, *managed.partitions):
                if partition not in self.partitions:
                    raise KeyProblem(where, f"partition {partition!r} is not bridged "
                                            f"(no [partitions.{partition}])")
        return self

    @model_validator(mode="after")
    def _waiters_use_tls_when_the_api_does(self) -> Self:
        url = self.waiter.api_url
        if self.api.tls and not url.lower().startswith("https://"):
            raise KeyProblem("waiter.api_url",
                             f"{url!r} must be https://: the API is served over TLS (api.tls_cert_file)")
        return self


_TABLES = ("slurm", "kubernetes", "api", "waiter", "pods", "leader_election", "nodes", "partitions",
           "workloads")
"""The tables validated even when the file leaves them out: their checks are about what the file must
say (slurm.url for the rest backend; at least one partition)."""
_VALIDATOR: TypeAdapter[BridgeConfig] = TypeAdapter(BridgeConfig)


def parse_config(text: str, source: str = "<config>") -> BridgeConfig:
    """Validate TOML `text`; `source` names it in error messages."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from exc
    return config_from_dict(data, source)


def config_from_dict(data: Mapping[str, Any], source: str = "<config>") -> BridgeConfig:
    """Validate an already decoded configuration."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: top level: expected a table")
    try:
        # Keys by their TOML names only (`url`, not the attribute's `rest_url`).
        return _VALIDATOR.validate_python({**{name: {} for name in _TABLES}, **data}, by_alias=True,
                                          by_name=False, context={"from_file": True})
    except ValidationError as error:
        raise config_error(error, BridgeConfig, source) from None
