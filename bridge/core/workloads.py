"""Kubernetes workloads scheduled by Slurm, the pure part: which pods form a gang, the one Slurm job a
gang becomes, where its pods go once Slurm allocates, and how it ended. Pure.

A gang is the set of pods that must start together:
- pods labelled `slurm-k8s-bridge/gang=G` (size: `slurm-k8s-bridge/gang-size`): one gang per G;
- the pods of a batch/v1 Job (size: what the Job runs at once, read from the Job);
- any other pod alone.
Each pod is one Slurm task: `--ntasks` = the gang's size, `--cpus-per-task` and `--mem-per-cpu` from
the largest pod's requests, so Slurm may put several pods on a node and share nodes with sbatch jobs
at core and memory granularity (docs/architecture.md § Kubernetes workloads).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bridge.core import wellknown
from bridge.core.config_workloads import ManagedNamespace, WorkloadsConfig
from bridge.core.errors import WorkloadError
from bridge.core.pod_view import parse_time
from bridge.core.workload_placement import task_shape
from bridge.core.workload_security import run_as, unsafe

MARKER = "slurm-k8s-bridge workload"
"""Starts the comment of every job the bridge submits for a gang, and a line of its script."""

SCHEDULER_NAME = "slurm-k8s-bridge"
"""The schedulerName the admission policy gives the pods of managed namespaces."""
LABEL_GANG = wellknown.PREFIX + "gang"
ANNOTATION_GANG_SIZE = wellknown.PREFIX + "gang-size"
ANNOTATION_ACCOUNT = wellknown.PREFIX + "account"
ANNOTATION_PARTITION = wellknown.PREFIX + "partition"
ANNOTATION_QOS = wellknown.PREFIX + "qos"
ANNOTATION_TIME_LIMIT = wellknown.PREFIX + "time-limit"
ANNOTATION_SLURM_JOB = wellknown.PREFIX + "slurm-job-id"
"""Written by the bridge only (the admission policy refuses it from anyone else): the job of a pod."""
ANNOTATION_SLURM_GPUS = wellknown.PREFIX + "slurm-gpus"
"""Written by the bridge only, before it binds the pod: Slurm's GPU indices on its node that the pod's
claims get. The bridge's own record of who uses a GPU, whatever a user does to their claims."""

_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?(?:[eE][0-9]+)?)(m|Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$")
_FACTORS = {None: 1, "m": 0.001, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
            "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}
GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")
ALLOWED_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage"})
"""What a pod may ask for besides GPUs (which are refused for now): any other extended resource (a
device plugin's) would reach devices Slurm never allocated."""
_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@-]*$")
START_ERRORS = frozenset({
    "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError",
    "CreateContainerError", "RunContainerError",
})
"""Waiting reasons of a bound pod's container that the kubelet retries, but that rarely heal."""


@dataclass(frozen=True)
class PodClaim:
    """One entry of a pod's spec.resourceClaims, and the claim it names."""

    name: str
    template: str
    """resourceClaimTemplateName: Kubernetes makes the pod a claim of its own from it."""
    claim: str
    """The claim's name: resourceClaimName, or the one made from the template (status.resourceClaimStatuses;
    "" until it is made)."""


@dataclass(frozen=True)
class WorkloadPod:
    """What the bridge needs of one pod of a managed namespace."""

    namespace: str
    name: str
    uid: str
    gang: str
    """The gang's key: `<namespace>/<kind>/<id>`."""
    kind: str
    """`Job`, `Group` (the gang label) or `Pod`."""
    owner: str
    """The Job's or group's name, or the pod's own."""
    owner_uid: str
    gang_size: int | None
    """From the gang label's annotation, 1 for a pod alone; None: the Job's to read."""
    cpu_millis: int
    memory_bytes: int
    gpus: int
    node_name: str
    phase: str
    deleting: bool
    job_id: int | None
    """The Slurm job the bridge submitted this pod in."""
    created: datetime | None
    annotations: Mapping[str, str]
    active_deadline_s: int | None
    exit_code: int | None
    """The highest exit code of its containers once the pod has ended (Succeeded: 0)."""
    end_reason: str
    """Why an ended pod ended, if not by its containers' exit (eviction, deadline)."""
    waiting_reason: str
    """A container's waiting reason with its message (ErrImagePull: ...), if any."""
    started: bool
    image: str = ""
    """The first container's image (named in the job's script: job_submit.lua wants one)."""
    unsafe: str = ""
    """Why the pod may not run as a Slurm job's tasks (privileged, the host's namespaces or files,
    root), if it may not."""
    run_as: tuple[tuple[int | None, int | None], ...] = ()
    """(uid, gid) each container runs as: its own securityContext, else the pod's."""
    groups: tuple[int, ...] = ()
    """The pod's fsGroup and supplementalGroups: only the job's own group is allowed."""
    claims: tuple[PodClaim, ...] = ()
    """Its DRA claims (spec.resourceClaims): its GPUs, pinned by the bridge to Slurm's."""
    slurm_gpus: tuple[int, ...] | None = None
    """Slurm's GPU indices on its node the bridge gave it (ANNOTATION_SLURM_GPUS); None: none given."""

    @property
    def ended(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


def quantity(text: object) -> float:
    """A Kubernetes quantity (`500m`, `2`, `1.5Gi`, `1e9`) as a number; WorkloadError if it is not one."""
    match = _QUANTITY.match(str(text).strip())
    if match is None:
        raise WorkloadError(f"{text!r} is not a Kubernetes quantity")
    return float(match.group(1)) * _FACTORS[match.group(2)]


def _limits(containers: object) -> list[tuple[float, float, int]]:
    """(cpus, memory bytes, GPUs) of each container, from its limits: what Slurm allocates is what the
    pod may use, so a container without CPU and memory limits could use a whole node beyond its job."""
    found = []
    for container in containers if isinstance(containers, list) else []:
        resources = container.get("resources") or {}
        limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
        if "cpu" not in limits or "memory" not in limits:
            raise WorkloadError(f"container {container.get('name', '?')} must set resources.limits for cpu "
                                "and memory: Slurm allocates that much to it, and it may use no more")
        for name in {*limits, *requests} - ALLOWED_RESOURCES:
            if name not in GPU_RESOURCES:
                raise WorkloadError(f"container {container.get('name', '?')} asks for {name}, which Slurm "
                                    "does not allocate")
        gpus = sum(int(quantity(limits.get(name, requests.get(name, 0)))) for name in GPU_RESOURCES)
        found.append((quantity(limits["cpu"]), quantity(limits["memory"]), gpus))
    return found


def pod_requests(spec: Mapping[str, Any]) -> tuple[int, int, int]:
    """The pod's (millicpus, memory bytes, GPUs) by its limits, counted as the scheduler counts requests:
    its containers and sidecars (init containers that keep running) together, or its largest other
    init container if larger, plus the pod's overhead."""
    init = spec.get("initContainers") or []
    sidecars = [c for c in init if isinstance(c, Mapping) and c.get("restartPolicy") == "Always"]
    main = _limits([*(spec.get("containers") or []), *sidecars])
    others = _limits([c for c in init if c not in sidecars])
    totals = [sum(c[i] for c in main) for i in range(3)]
    peaks = [max((c[i] for c in others), default=0) for i in range(3)]
    overhead = spec.get("overhead") or {}
    cpu, memory, gpus = (max(total, peak) for total, peak in zip(totals, peaks, strict=True))
    cpu += quantity(overhead.get("cpu", 0))
    memory += quantity(overhead.get("memory", 0))
    return math.ceil(cpu * 1000), math.ceil(memory), int(gpus)


def trim_pod(pod: Mapping[str, Any]) -> WorkloadPod:
    """The WorkloadPod of a pod object (WorkloadError if its requests cannot be read)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    namespace, name, uid = meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", "")
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    kind, owner, owner_uid = "Pod", name, uid
    size: int | None = 1
    job_owner = next((ref for ref in meta.get("ownerReferences") or []
                      if ref.get("kind") == "Job" and ref.get("controller")), None)
    if labels.get(LABEL_GANG):
        kind, owner, owner_uid = "Group", labels[LABEL_GANG], labels[LABEL_GANG]
        size = _positive_int(annotations.get(ANNOTATION_GANG_SIZE, labels.get(ANNOTATION_GANG_SIZE)))
    elif job_owner is not None:
        kind, owner, owner_uid, size = "Job", job_owner.get("name", ""), job_owner.get("uid", ""), None
    try:
        cpu, memory, gpus = pod_requests(spec)
        resource_problem = ""
    except WorkloadError as error:
        cpu, memory, gpus = -1, -1, 0
        resource_problem = str(error)  # judged when the gang is submitted, with an event
    job = annotations.get(ANNOTATION_SLURM_JOB, "")
    statuses = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
    codes = [s["state"]["terminated"].get("exitCode", 0) for s in statuses
             if (s.get("state") or {}).get("terminated")]
    phase = status.get("phase", "")
    waiting = next(((s["state"]["waiting"].get("reason", ""), s["state"]["waiting"].get("message", ""))
                    for s in statuses if (s.get("state") or {}).get("waiting")), ("", ""))
    return WorkloadPod(
        namespace=namespace, name=name, uid=uid, gang=f"{namespace}/{kind.lower()}/{owner_uid}", kind=kind,
        owner=owner, owner_uid=owner_uid, gang_size=size, cpu_millis=cpu, memory_bytes=memory, gpus=gpus,
        node_name=spec.get("nodeName") or "", phase=phase, deleting=bool(meta.get("deletionTimestamp")),
        job_id=int(job) if job.isdigit() else None, created=parse_time(meta.get("creationTimestamp")),
        annotations={k: v for k, v in annotations.items() if k.startswith(wellknown.PREFIX)},
        active_deadline_s=spec.get("activeDeadlineSeconds"),
        exit_code=0 if phase == "Succeeded" else (max(codes) if codes and phase == "Failed" else None),
        end_reason=f"{status.get('reason', '')}: {status.get('message', '')}".strip(": ")
        if phase == "Failed" else "",
        waiting_reason=": ".join(part for part in waiting if part),
        started=any((s.get("state") or {}).get("running") or (s.get("state") or {}).get("terminated")
                    for s in status.get("containerStatuses") or []),
        image=str(((spec.get("containers") or [{}])[0] or {}).get("image") or ""),
        unsafe="; ".join(filter(None, (resource_problem, unsafe(spec)))),
        run_as=run_as(spec),
        claims=_pod_claims(spec, status),
        slurm_gpus=_indices(annotations.get(ANNOTATION_SLURM_GPUS)),
        groups=tuple(int(g) for g in [*((spec.get("securityContext") or {}).get("supplementalGroups") or []),
                                       (spec.get("securityContext") or {}).get("fsGroup")] if g is not None),
    )


def _indices(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    return tuple(int(i) for i in text.split(",") if i.strip().isdigit())


def _pod_claims(spec: Mapping[str, Any], status: Mapping[str, Any]) -> tuple[PodClaim, ...]:
    made = {str(s.get("name")): str(s.get("resourceClaimName") or "")
            for s in status.get("resourceClaimStatuses") or () if isinstance(s, Mapping)}
    claims = []
    for entry in spec.get("resourceClaims") or ():
        name = str(entry.get("name") or "")
        template = str(entry.get("resourceClaimTemplateName") or "")
        claims.append(PodClaim(name, template, made.get(name, "") if template else
                               str(entry.get("resourceClaimName") or "")))
    return tuple(claims)


def foreign_ids(pod: WorkloadPod, uid: int | None, gid: int | None) -> str:
    """The containers of `pod` that would run as another user or group than the Slurm job's."""
    wrong = [f"{u}:{g}" for u, g in pod.run_as if (u, g) != (uid, gid)]
    wrong += [f"group {group}" for group in pod.groups if group != gid]
    return (f"{pod.namespace}/{pod.name} runs as {', '.join(sorted(set(wrong)))}, not as the Slurm job's "
            f"user {uid}:{gid}") if wrong else ""


def _positive_int(value: object) -> int | None:
    text = str(value or "")
    return int(text) if text.isdigit() and int(text) > 0 else None


def job_size(job: Mapping[str, Any]) -> int:
    """How many pods a batch/v1 Job runs at once now: its parallelism, capped by the completions it
    still needs (none left: 0)."""
    spec, status = job.get("spec") or {}, job.get("status") or {}
    parallelism = spec.get("parallelism", 1)
    completions = spec.get("completions")
    if completions is None:
        return int(parallelism)
    return max(0, min(int(parallelism), int(completions) - int(status.get("succeeded", 0))))


def time_limit_minutes(text: str) -> int:
    """Slurm's --time forms (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S) in whole minutes, rounded up."""
    days, dash, clock = text.strip().rpartition("-")
    if dash and not days:
        raise WorkloadError(f"time limit {text!r} must be positive")
    try:
        parts = [int(p) for p in clock.split(":")]
        day_count = int(days) if days else 0
    except ValueError:
        raise WorkloadError(f"time limit {text!r} is not in Slurm's --time form (90, 1:30:00, 2-00)") \
            from None
    if days:
        hours, minutes, seconds = [*parts, 0, 0][:3]
    elif len(parts) == 3:
        hours, minutes, seconds = parts
    elif len(parts) in (1, 2):
        hours, minutes, seconds = 0, parts[0], parts[1] if len(parts) == 2 else 0
    else:
        raise WorkloadError(f"time limit {text!r} is not in Slurm's --time form (e.g. 90, 1:30:00, 2-00)")
    total = ((day_count * 24 + hours) * 60 + minutes) * 60 + seconds
    if total <= 0 or min(parts) < 0:
        raise WorkloadError(f"time limit {text!r} must be positive")
    return math.ceil(total / 60)


def gang_partition(pod: WorkloadPod, workloads: WorkloadsConfig) -> str:
    """The partition the gang of `pod` asks for (its annotation, else its namespace's); WorkloadError
    if the namespace may not use it."""
    managed = _managed(pod, workloads)
    partition = pod.annotations.get(ANNOTATION_PARTITION, managed.partition)
    if partition not in workloads.allowed_partitions(pod.namespace):
        raise WorkloadError(f"partition {partition!r} is not allowed in namespace {pod.namespace} "
                            f"(allowed: {', '.join(workloads.allowed_partitions(pod.namespace))})")
    return partition


def _managed(pod: WorkloadPod, workloads: WorkloadsConfig) -> ManagedNamespace:
    managed = workloads.namespaces.get(pod.namespace)
    if managed is None:
        raise WorkloadError(f"namespace {pod.namespace} is labelled managed but the bridge's config "
                            "maps it to no Slurm user and account ([workloads.namespaces]); ask your "
                            "administrator")
    return managed


def job_request(
    pods: Sequence[WorkloadPod], workloads: WorkloadsConfig, key: bytes, gpus_per_task: int = 0
) -> dict[str, Any]:
    """slurmrestd v0.0.45's `job` of the one Slurm job the gang `pods` becomes (its comment signed with
    `key`; each task with `gpus_per_task` GPUs, from the pods' claims). WorkloadError says why it
    cannot be one (the pods' event)."""
    first = pods[0]
    managed = _managed(first, workloads)
    for pod in pods:
        if pod.unsafe:
            raise WorkloadError(f"pod {pod.name} cannot run as a Slurm job's task: {pod.unsafe}")
    if any(p.gpus for p in pods):
        raise WorkloadError("GPUs come through a DRA claim of the pod's own (spec.resourceClaims with a "
                            "resourceClaimTemplateName), which the bridge pins to the GPUs Slurm gives; a "
                            "limit of nvidia.com/gpu would be another allocator's")
    account = first.annotations.get(ANNOTATION_ACCOUNT, managed.account)
    if account not in workloads.allowed_accounts(first.namespace):
        raise WorkloadError(f"account {account!r} is not allowed in namespace {first.namespace} "
                            f"(allowed: {', '.join(workloads.allowed_accounts(first.namespace))})")
    partition = gang_partition(first, workloads)
    qos = first.annotations.get(ANNOTATION_QOS, managed.qos)
    if qos is not None and qos not in workloads.allowed_qoses(first.namespace):
        raise WorkloadError(f"QOS {qos!r} is not allowed in namespace {first.namespace} "
                            f"(allowed: {', '.join(workloads.allowed_qoses(first.namespace)) or 'none'})")
    shape = task_shape(pods)
    job: dict[str, Any] = {
        "name": f"{first.namespace}/{first.owner}"[:200],
        "comment": gang_comment(first, managed.user, key),
        "account": account,
        "partition": partition,
        "tasks": len(pods),
        "cpus_per_task": shape.cpus,
        "script": gang_script(first),
        # The waiter's working directory and output: the pods' output is in their logs.
        "current_working_directory": "/tmp",
        "standard_output": "/dev/null",
        "standard_error": "/dev/null",
        "environment": ["PATH=/usr/bin:/bin"],
        # Not requeued: preempted, its pods go and the job ends PREEMPTED (as a non-requeueable sbatch
        # job does); their Job controller's new pods are a new job. A requeued gang job would wait
        # with no pods through the controller's back-off (10 s and more).
        "requeue": False,
    }
    if shape.memory_mb_per_cpu:
        job["memory_per_cpu"] = {"set": True, "infinite": False, "number": shape.memory_mb_per_cpu}
    limit = _time_limit(first, managed)
    if limit is not None:
        job["time_limit"] = {"set": True, "infinite": False, "number": limit}
    if qos is not None:
        job["qos"] = qos
    if gpus_per_task:
        job["tres_per_task"] = f"gres/gpu:{gpus_per_task}"
    return job


def _time_limit(pod: WorkloadPod, managed: ManagedNamespace) -> int | None:
    text = pod.annotations.get(ANNOTATION_TIME_LIMIT)
    if text:
        return time_limit_minutes(text)
    if isinstance(pod.active_deadline_s, int) and pod.active_deadline_s > 0:
        return math.ceil(pod.active_deadline_s / 60)
    return managed.time_limit_min


def _comment_mac(key: bytes, gang: str, user: str) -> str:
    # A key of its own, derived: a comment's MAC is never a step token, nor the reverse.
    derived = hmac.new(key, b"slurm-k8s-bridge workload comment", hashlib.sha256).digest()
    return hmac.new(derived, f"{gang}\0{user}".encode(), hashlib.sha256).hexdigest()[:32]


def gang_comment(pod: WorkloadPod, user: str, key: bytes) -> str:
    """The job's comment: names the gang for the daemon (a restart finds the job again by it) and for
    sacct's readers, with a MAC over the gang and the job's user, so that a comment a user writes
    (sbatch --comment, scontrol update) never makes a job a gang's."""
    return f"{MARKER} {pod.gang} {_comment_mac(key, pod.gang, user)} {pod.kind} {pod.namespace}/{pod.owner}"


def verified_gang(comment: str, user: str, key: bytes) -> str | None:
    """The gang a job's comment names, if the bridge wrote it for this user's job."""
    words = comment.split()
    marker = MARKER.split()
    if words[: len(marker)] != marker or len(words) < len(marker) + 2:
        return None
    gang, mac = words[len(marker)], words[len(marker) + 1]
    return gang if hmac.compare_digest(mac, _comment_mac(key, gang, user)) else None


def gang_script(pod: WorkloadPod) -> str:
    """The job's script: it never runs (the waiter binds the pods instead); the image line is what
    job_submit.lua asks of a script in a partition without a default image."""
    image = f"#K8S image={pod.image}\n" if _IMAGE.match(pod.image) else ""
    return (f"#!/bin/sh\n# {MARKER}: the pods of {pod.kind} {pod.namespace}/{pod.owner} run in Kubernetes; "
            f"this script never runs\n{image}")


def is_gang_script(script: str) -> bool:
    return script.startswith(f"#!/bin/sh\n# {MARKER}: ")


@dataclass(frozen=True)
class GangEnd:
    exit_code: int
    reason: str
    """Set when a pod ended otherwise than by its containers (eviction, deadline)."""


def gang_outcome(pods: Iterable[WorkloadPod]) -> GangEnd | None:
    """How a started gang ended, once every pod has: the highest exit code, as srun reports a step's."""
    pods = list(pods)
    if not pods or not all(p.ended for p in pods):
        return None
    code = max((p.exit_code if p.exit_code is not None else 1) for p in pods)
    reasons = [f"{p.name}: {p.end_reason}" for p in pods if p.exit_code is None and p.end_reason]
    return GangEnd(code, "; ".join(reasons))


def start_failure(pods: Iterable[WorkloadPod]) -> str | None:
    """A bound pod whose container the kubelet cannot start (image, config): the reason."""
    for pod in pods:
        reason = pod.waiting_reason.partition(":")[0]
        if pod.node_name and not pod.started and reason in START_ERRORS:
            return f"{pod.namespace}/{pod.name}: {pod.waiting_reason}"
    return None
