"""Who a pod is: the names and labels that tie a pod manifest to its Slurm job, run and node.
Pure; the one place that reads or writes a pod's identity.

The labels and annotations themselves are named in wellknown.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bridge.core import wellknown


def pod_name(job_id: int, index: int, run: int = 0) -> str:
    """Name of the pod for node `index` of run `run` of job `job_id` (array tasks have their own
    job id): `slurm-<jobid>-<index>` for the first run (the name users and scripts know), and
    `slurm-<jobid>-r<run>-<index>` once Slurm requeued the job, so no name is shared between runs."""
    return f"slurm-{job_id}-{index}" if run == 0 else f"slurm-{job_id}-r{run}-{index}"


def payload_secret_name(digest: str) -> str:
    """Name of the Secret with a script and the environment its user exported: the digest of its
    content (and of the uid and gid it is for). The tasks of an array, and the runs of a requeued
    job, have the same script and exported environment: one Secret serves them all (one write, not
    one per task). No job ever gets another's: a different content is a different name."""
    return f"slurm-payload-{digest}"


def payload_secret_of(pod: Mapping[str, Any]) -> str | None:
    """The name of the payload Secret a pod manifest uses (annotation ANNOTATION_PAYLOAD_SECRET)."""
    name = _metadata(pod, "annotations").get(wellknown.ANNOTATION_PAYLOAD_SECRET)
    return name if isinstance(name, str) and name else None


def run_of(pod: Mapping[str, Any]) -> int:
    """The job run a pod manifest belongs to (label LABEL_RUN); 0 when unlabelled."""
    return _int_or_none(_metadata(pod, "labels").get(wellknown.LABEL_RUN)) or 0


def job_id_of(pod: Mapping[str, Any]) -> int | None:
    """The Slurm job id a pod manifest belongs to, None if it is not a bridge pod."""
    return _int_or_none(_metadata(pod, "labels").get(wellknown.LABEL_JOB_ID))


def node_index_of(pod: Mapping[str, Any]) -> int | None:
    """The node index a pod manifest stands for, None if unknown."""
    return _int_or_none(_metadata(pod, "annotations").get(wellknown.ANNOTATION_NODE_INDEX))


def _metadata(pod: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    meta = pod.get("metadata")
    value = meta.get(key) if isinstance(meta, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def _int_or_none(value: object) -> int | None:
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    return None
