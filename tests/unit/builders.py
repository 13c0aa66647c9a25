"""Small factories for the records most tests need, with overridable defaults."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from bridge.clients.kube.cache import PodCache
from bridge.core.config import BridgeConfig, PartitionConfig, PodsConfig, parse_config
from bridge.core.model import JobAllocation, JobPayload, NodeAllocation

SCRIPT = "#!/bin/bash\n#K8S image=debian:12\necho hello\n"


def allocation(**changes: Any) -> JobAllocation:
    base = JobAllocation(
        job_id=42,
        name="train",
        user="alice",
        uid=1000,
        gid=100,
        partition="k8s",
        state="RUNNING",
        nodes=(
            NodeAllocation("kube1", cpus=2, memory_mb=1024, gpu_indices=(1, 3)),
            NodeAllocation("kube2", cpus=1, memory_mb=512, gpu_indices=()),
        ),
        time_limit_s=600,
        work_dir="/home/alice/run",
        start_time=1764513601,
        batch_host="kube1",
        cluster="sandbox",
    )
    return replace(base, **changes)


def payload(**changes: Any) -> JobPayload:
    base = JobPayload(
        script=SCRIPT,
        environment={"HOME": "/home/alice", "SLURM_JOB_ID": "42"},
        work_dir="/home/alice/run",
        uid=1000,
        gid=100,
    )
    return replace(base, **changes)


def config(**changes: Any) -> BridgeConfig:
    """A config; its pods get no supplementalGroupsPolicy unless a test asks (`auto`, the default,
    asks Kubernetes about nodes, which the in-memory fakes answer only where a test needs it), and
    all of a run's pods are made in one pass (the in-memory pods never get an address, which the
    default resolve_first_node waits for; tests of it turn it on)."""
    base = BridgeConfig(cluster="sandbox", partitions={"k8s": PartitionConfig(resolve_first_node=False)},
                        pods=PodsConfig(supplemental_groups_policy=""))
    return replace(base, **changes)


class SecretStore:
    """The payload Secrets of an in-memory Kubernetes: kept by name, creation times settable."""

    secrets: dict[str, dict[str, Any]]
    secrets_deleted: list[str]

    async def create_secret(self, manifest: dict[str, Any]) -> bool:
        store = self.__dict__.setdefault("secrets", {})
        name = manifest["metadata"]["name"]
        if name in store:
            return False
        meta = {"creationTimestamp": "2026-12-01T10:00:00Z", **manifest["metadata"]}
        store[name] = {**manifest, "metadata": meta}
        return True

    async def delete_secret(self, name: str, *, uid: str | None = None) -> bool:
        self.__dict__.setdefault("secrets_deleted", []).append(name)
        return self.__dict__.setdefault("secrets", {}).pop(name, None) is not None

    async def secrets_metadata(self, selector: str) -> list[dict[str, Any]]:
        return [dict(s["metadata"]) for s in self.__dict__.setdefault("secrets", {}).values()]


class RecordingKube(SecretStore):
    """In-memory Kubernetes for reconcile tests: a created pod reaches the cache at once, in
    phase Running (with its container running when `container_running`); deletes are recorded."""

    def __init__(self, cache: PodCache, *, container_running: bool = False) -> None:
        self.cache = cache
        self.container_running = container_running
        self.created: list[str] = []
        self.deleted: list[str] = []

    async def create_pod(self, manifest: dict[str, Any]) -> bool:
        self.created.append(manifest["metadata"]["name"])
        status: dict[str, Any] = {"phase": "Running"}
        if self.container_running:
            status["containerStatuses"] = [{"name": "job", "state": {"running": {}}}]
        self.cache.apply("ADDED", {**manifest, "status": status})
        return True

    async def delete_pod(self, name: str, grace_seconds: int | None = None) -> bool:
        self.deleted.append(name)
        return True


def workloads_config(tmp_path: Path, key: bytes, tables: str) -> BridgeConfig:
    """A config for the Kubernetes-submitted path (slurmrestd, a step key of `key`), with `tables`
    (its partitions and managed namespaces) after the common part."""
    key_file = tmp_path / "step.key"
    key_file.write_bytes(key)
    key_file.chmod(0o600)
    token = tmp_path / "jwt"
    token.write_text("t")
    return parse_config(f"""cluster = "c"
[slurm]
url = "http://127.0.0.1:1"
token_file = "{token}"
[waiter]
step_key_file = "{key_file}"
""" + tables)


class NoSlurmJobs:
    """A Slurm client that knows no job: the job store's own reads find nothing."""

    async def read_job(self, job_id: int) -> None:
        return None


class RecordedExecs:
    """Kubernetes as the daemon's one-shot execs see it: each (pod, command) recorded, none fails."""

    def __init__(self) -> None:
        self.execs: list[tuple[str, list[str]]] = []

    async def exec_in_pod(self, pod: str, command: list[str]) -> str:
        self.execs.append((pod, command))
        return ""
