"""Small factories for the records most tests need, with overridable defaults."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from bridge.core.config import BridgeConfig, PartitionConfig
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
    return replace(BridgeConfig(cluster="sandbox", partitions={"k8s": PartitionConfig()}), **changes)
