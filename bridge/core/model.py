"""Typed records of the bridge: a running job's allocation and the payload its waiter sends.

`allocation_from_rest` reads a job as slurmrestd v0.0.45 reports it (`GET /slurm/v0.0.45/jobs`).
Fields that are missing or null get neutral defaults, because slurmrestd omits fields depending on
the job's state and the plugin configuration; only a job id is indispensable.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bridge.core import gres, hostlist
from bridge.core.errors import PermanentError

# Base job states; every other element of v0.0.45's `job_state` list is a flag (COMPLETING, ...).
BASE_STATES = frozenset(
    {
        "PENDING",
        "RUNNING",
        "SUSPENDED",
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
    }
)


class ModelError(PermanentError, ValueError):
    """Input cannot be turned into a model record."""


@dataclass(frozen=True)
class NodeAllocation:
    """What Slurm gave the job on one node."""

    name: str
    """Slurm node name."""
    cpus: int
    """Allocated CPUs (0 if slurmrestd did not say)."""
    memory_mb: int
    """Allocated memory in MiB (0 if Slurm does not track memory)."""
    gpu_indices: tuple[int, ...] = ()
    """Indices of the node's GPUs that Slurm allocated to the job."""


@dataclass(frozen=True)
class JobAllocation:
    """A Slurm job and where it runs."""

    job_id: int
    name: str = ""
    user: str = ""
    uid: int | None = None
    gid: int | None = None
    partition: str = ""
    state: str = ""
    """Base state such as RUNNING; empty if slurmrestd sent none."""
    state_flags: frozenset[str] = frozenset()
    """The other elements of `job_state` (COMPLETING, CONFIGURING, ...)."""
    nodes: tuple[NodeAllocation, ...] = ()
    """Allocated nodes in Slurm's node order (index = SLURM_NODEID)."""
    time_limit_s: int | None = None
    """Time limit in seconds; None for unlimited or unknown."""
    array_job_id: int | None = None
    array_task_id: int | None = None
    work_dir: str = ""
    start_time: int | None = None
    """Start time (Unix seconds) once the job started."""
    batch_host: str = ""
    """Node that runs the batch script, i.e. the waiter."""
    batch: bool = True
    """The job has a batch script (sbatch); False for an allocation made by salloc or srun, whose
    pods the daemon starts for the first step the user runs in it."""
    cluster: str = ""
    tasks: int = 1
    """Its number of tasks (`--ntasks`; 1 if Slurm did not say, as libslurm reads it)."""
    comment: str = ""
    """The job's comment (the bridge's gangs of Kubernetes pods carry core.workloads.MARKER there)."""
    state_reason: str = ""
    """Why a pending job waits (Priority, Resources, QOSMaxGRESPerUser, ...); empty or `None` otherwise."""
    run: int = 0
    """Slurm's restart count (`restart_cnt`): 0 for the first run, one more at each requeue. The job
    id alone does not name a run: a requeued job keeps its id and must start from a clean slate."""
    read_at: float = field(default=0.0, compare=False, repr=False)
    """`time.monotonic()` (of the reading process) when the request that produced this record was
    sent: its version. An answer can reflect Slurm at any moment after that, never before, so the
    send time is a safe lower bound. Not compared: two reads of the same record are equal."""

    @property
    def node_names(self) -> tuple[str, ...]:
        return tuple(n.name for n in self.nodes)

    @property
    def nodelist(self) -> str:
        """Compressed hostlist of the nodes, as in SLURM_JOB_NODELIST."""
        return hostlist.compress(self.node_names)

    @property
    def is_array_task(self) -> bool:
        return self.array_job_id is not None and self.array_task_id is not None


@dataclass(frozen=True)
class JobPayload:
    """What the waiter sends for its job: the original script and the environment it runs with."""

    script: str
    """The batch script as the user submitted it (slurmd's copy, which the step guard gives the waiter)."""
    environment: Mapping[str, str]
    """The batch script's environment on the slurmd, as the waiter saw it."""
    work_dir: str
    """The job's working directory."""
    uid: int
    gid: int
    output_merged: bool = True
    """The job's stdout and stderr go to one file (no -e elsewhere than -o), as the waiter saw its
    own fds 1 and 2: the in-pod agent then gives the script one pipe for both, so their order is
    the order of the writes."""
    arguments: tuple[str, ...] = ()
    """What sbatch passed the script after its name (`sbatch job.sh a b`), as natively."""
    allocation: bool = False
    """An allocation without a batch script (salloc, srun): its pods only hold the nodes for the
    user's steps, and `script` carries nothing but the #K8S directives the first step asked for."""


def allocation_from_rest(job: Mapping[str, Any], read_at: float = 0.0) -> JobAllocation:
    """A JobAllocation from one element of slurmrestd v0.0.45's `jobs` list.

    `read_at`: when the request that returned it was sent (see JobAllocation.read_at).
    """
    job_id = _number(job.get("job_id"))
    if job_id is None or job_id <= 0:
        raise ModelError(f"job without a valid job_id: {job.get('job_id')!r}")

    states = _str_list(job.get("job_state"))
    state = next((s for s in states if s in BASE_STATES), "")
    flags = frozenset(s for s in states if s != state)

    nodes = _nodes(job, job_id)

    time_limit_min = _number(job.get("time_limit"))
    array_job_id = _number(job.get("array_job_id")) or None  # 0 means "not an array job"
    start_time = _number(job.get("start_time")) or None  # 0 means "not started"

    return JobAllocation(
        job_id=job_id,
        name=_str(job.get("name")),
        user=_str(job.get("user_name")),
        uid=_number(job.get("user_id")),
        gid=_number(job.get("group_id")),
        partition=_str(job.get("partition")),
        state=state,
        state_flags=flags,
        nodes=nodes,
        time_limit_s=time_limit_min * 60 if time_limit_min is not None else None,
        array_job_id=array_job_id,
        array_task_id=_number(job.get("array_task_id")) if array_job_id is not None else None,
        work_dir=_str(job.get("current_working_directory")),
        start_time=start_time,
        batch_host=_str(job.get("batch_host")),
        # Absent from records that predate it: a batch job, as every bridged job was.
        batch=job.get("batch_flag") is not False,
        cluster=_str(job.get("cluster")),
        tasks=_number(job.get("tasks")) or 1,  # unset means one, as libslurm says (pyslurm's ntasks)
        comment=_str(job.get("comment")),
        # Its description where Slurm gives one (what libslurm's readers show, pyslurm's too).
        state_reason=_reason(job.get("state_description") or job.get("state_reason")),
        run=_number(job.get("restart_cnt")) or 0,
        read_at=read_at,
    )


def _reason(value: object) -> str:
    """Slurm's pending reason; it says `None` when there is none."""
    text = _str(value)
    return "" if text == "None" else text


def payload_from_json(data: object) -> JobPayload:
    """A JobPayload from the waiter's decoded JSON body; raises ModelError naming the bad field."""
    if not isinstance(data, Mapping):
        raise ModelError("payload must be a JSON object")
    script = data.get("script")
    if not isinstance(script, str) or not script:
        raise ModelError("payload.script must be a non-empty string")
    env = data.get("environment", {})
    if not isinstance(env, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise ModelError("payload.environment must be an object of strings")
    work_dir = data.get("work_dir")
    if not isinstance(work_dir, str) or not work_dir.startswith("/"):
        raise ModelError("payload.work_dir must be an absolute path")
    ids: dict[str, int] = {}
    for key in ("uid", "gid"):
        value = data.get(key)
        # bool is an int subclass; true/false is never a meant id.
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ModelError(f"payload.{key} must be a non-negative integer")
        ids[key] = value
    merged = data.get("output_merged", True)
    if not isinstance(merged, bool):
        raise ModelError("payload.output_merged must be true or false")
    arguments = data.get("arguments", [])
    if not isinstance(arguments, list) or not all(isinstance(a, str) for a in arguments):
        raise ModelError("payload.arguments must be a list of strings")
    return JobPayload(script=script, environment=dict(env), work_dir=work_dir, output_merged=merged,
                      uid=ids["uid"], gid=ids["gid"], arguments=tuple(arguments))


def payload_to_json(payload: JobPayload) -> dict[str, Any]:
    """The JSON object payload_from_json reads back."""
    return {
        "script": payload.script,
        "environment": dict(payload.environment),
        "work_dir": payload.work_dir,
        "uid": payload.uid,
        "gid": payload.gid,
        "output_merged": payload.output_merged,
    }


def _nodes(job: Mapping[str, Any], job_id: int) -> tuple[NodeAllocation, ...]:
    resources = _mapping(job.get("job_resources"))
    entries = _list(_mapping(resources.get("nodes")).get("allocation"))
    allocation = [a for a in entries if isinstance(a, Mapping)]
    by_name = {_str(a.get("name")): a for a in allocation}

    # `nodes` is authoritative for the order (gres_detail follows it); the allocation list is the
    # fallback when slurmrestd leaves `nodes` out.
    expr = _str(job.get("nodes"))
    try:
        names = hostlist.expand(expr) if expr else [n for n in by_name if n]
    except hostlist.HostlistError as exc:
        raise ModelError(f"job {job_id}: {exc}") from exc
    try:
        gpus = gres.gpu_indices_per_node(_str_list(job.get("gres_detail")), len(names))
    except gres.GresError as exc:
        raise ModelError(f"job {job_id}: {exc}") from exc

    nodes = []
    for name, gpu_indices in zip(names, gpus, strict=True):
        entry = by_name.get(name, {})
        nodes.append(
            NodeAllocation(
                name=name,
                cpus=_number(_mapping(entry.get("cpus")).get("count")) or 0,
                memory_mb=_number(_mapping(entry.get("memory")).get("allocated")) or 0,
                gpu_indices=gpu_indices,
            )
        )
    return tuple(nodes)


def _number(value: object) -> int | None:
    """An int from a plain number or a v0.0.4x `{set, infinite, number}` object.

    Unset or infinite → None (a missing limit is no limit).
    """
    if isinstance(value, Mapping):
        if not value.get("set", True) or value.get("infinite", False):
            return None
        value = value.get("number")
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _str_list(value: object) -> list[str]:
    if isinstance(value, str):
        return [value] if value else []  # older slurmrestd sent job_state as a plain string
    return [v for v in _list(value) if isinstance(v, str)]
