"""[workloads]: Kubernetes workloads scheduled by Slurm. Pure.

A namespace listed under [workloads.namespaces] (and labelled `slurm-k8s-bridge/managed=true`, which
makes the API server's admission policies hand its pods to the bridge) has its pods' gangs submitted
as Slurm jobs: as the namespace's user, under its account, in its partition. A pod may ask for
another account or partition only from the lists given here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from pydantic import Field, StrictFloat, StrictInt, field_validator
from pydantic.dataclasses import dataclass

from bridge.core.config_types import MODEL_CONFIG, NonEmpty

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True, config=MODEL_CONFIG)
class ManagedNamespace:
    """[workloads.namespaces.NAME]: whose jobs a managed namespace's pods become."""

    user: NonEmpty = Field(description=(
        "Slurm user the namespace's jobs run as (submitted through slurmrestd in this user's name: "
        "fair-share, limits and sacct see them as this user's)."))
    account: NonEmpty = Field(description=(
        "Slurm account of the namespace's jobs, unless a pod picks an allowed one."))
    partition: NonEmpty = Field(description=(
        "Bridged partition of the namespace's jobs, unless a pod picks an allowed one "
        "(annotation `slurm-k8s-bridge/partition`)."))
    accounts: tuple[NonEmpty, ...] = Field(default=(), description=(
        "Other accounts a pod of this namespace may pick (annotation `slurm-k8s-bridge/account`); any other "
        "is refused with an event on the pod."))
    partitions: tuple[NonEmpty, ...] = Field(default=(), description=(
        "Other bridged partitions a pod of this namespace may pick."))
    qos: NonEmpty | None = Field(default=None, description=(
        "Slurm QOS of the namespace's jobs, unless a pod picks an allowed one (annotation "
        "`slurm-k8s-bridge/qos`); unset: the user's default QOS."))
    qoses: tuple[NonEmpty, ...] = Field(default=(), description=(
        "Other QOSes a pod of this namespace may pick (its limits, e.g. GPUs per user, apply as to "
        "sbatch --qos)."))
    time_limit_min: StrictInt | None = Field(default=None, gt=0, description=(
        "Time limit of a job whose pods set neither activeDeadlineSeconds nor the annotation "
        "`slurm-k8s-bridge/time-limit` (minutes); unset: the partition's default."))


@dataclass(frozen=True, config=MODEL_CONFIG)
class WorkloadsConfig:
    """[workloads]: pods of managed namespaces wait in Slurm's queue and run where Slurm places them."""

    namespaces: Mapping[str, ManagedNamespace] = Field(default_factory=dict, description=(
        "Managed namespaces by name, one [workloads.namespaces.NAME] table each. None: the bridge watches "
        "no workload pods."))
    gang_wait_s: StrictFloat = Field(default=300.0, gt=0.0, description=(
        "How long the first pods of a gang wait for the rest (a Job's parallelism, or "
        "`slurm-k8s-bridge/gang-size`) before they get a warning event; they keep waiting."))

    @field_validator("namespaces")
    @classmethod
    def _names_are_namespaces(
        cls, namespaces: Mapping[str, ManagedNamespace]
    ) -> Mapping[str, ManagedNamespace]:
        for name in namespaces:
            if not _DNS_LABEL.match(name):
                raise ValueError(f"{name!r} is not a valid namespace name (DNS label)")
        return namespaces

    def allowed_accounts(self, namespace: str) -> tuple[str, ...]:
        managed = self.namespaces.get(namespace)
        return () if managed is None else (managed.account, *managed.accounts)

    def allowed_qoses(self, namespace: str) -> tuple[str, ...]:
        managed = self.namespaces.get(namespace)
        return () if managed is None else (*((managed.qos,) if managed.qos else ()), *managed.qoses)

    def allowed_partitions(self, namespace: str) -> tuple[str, ...]:
        managed = self.namespaces.get(namespace)
        return () if managed is None else (managed.partition, *managed.partitions)
