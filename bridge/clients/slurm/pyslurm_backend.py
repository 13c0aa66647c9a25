"""pyslurm backend: libslurm in-process, polling with `update_time`, no slurmrestd.

Runs only where pyslurm is built against the running Slurm: PyPI has none for 26.05, so
containers/pyslurm/build.sh builds pyslurm 25.11 (patched) plus `bridge_pyslurm_ext`, a small
Cython module for what pyslurm's Python API lacks: slurm_load_jobs with `update_time`, the raw job
state (base state and flags), per-node CPU/memory/GRES strings, array task 0 (see its docstring).
Both are imported when the client is created, so this module imports anywhere.

libslurm calls block, so they run on one worker thread (which also keeps libslurm's thread-local
errno with the call that set it). The loads release the GIL; pyslurm's own signal and update calls
(used here for signal_job and set_comment) hold it for their short RPC.

Records come out exactly as `allocation_from_rest` builds them from slurmrestd; the contract
tests (tests/contract) compare both backends on the same jobs.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import time
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import structlog

from bridge.clients.slurm import (
    ESLURM_TRANSITION_STATE_NO_UPDATE,
    SIGNAL_RETRY_DELAYS_S,
    JobListing,
    parse_listing,
    slurm_node,
)
from bridge.core import gres, hostlist
from bridge.core.errors import PermanentError, SlurmRefused, SlurmUnavailable
from bridge.core.model import JobAllocation, ModelError, NodeAllocation
from bridge.core.nodehealth import SlurmNode

log = structlog.get_logger(__name__)

T = TypeVar("T")

EXTENSION = "bridge_pyslurm_ext"

# Slurm errno values (slurm/slurm_errno.h); the enum blocks there start at explicit numbers.
_PROTOCOL_ERRORS = range(1000, 1900)  # SLURM_COMMUNICATIONS_*, SLURMCTLD_COMMUNICATIONS_*
_NOT_TRANSIENT = frozenset({1005, 1006, 1007})  # protocol/IO version mismatch, authentication
_STANDBY = frozenset({2027, 2131})  # ESLURM_IN_STANDBY_MODE, ESLURM_IN_STANDBY_USE_BACKUP
_SOCKET_ERRORS = range(5003, 5006)  # incomplete packet, socket timeout, zero bytes sent
ESLURM_INVALID_JOB_ID = 2017
ESLURM_ALREADY_DONE = 2021


class PyslurmUnavailable(PermanentError):
    """pyslurm (or the bridge's extension to it) is not installed for this Python."""


class SlurmRejected(PermanentError):
    """slurmctld answered with an error that retrying cannot fix (permission, bad request...)."""

    def __init__(self, message: str, errno: int) -> None:
        super().__init__(message)
        self.errno = errno


class PyslurmSlurmClient:
    """Reads and updates Slurm through libslurm, as the user the daemon runs as (root or SlurmUser)."""

    def __init__(self, slurm_conf: Path | None = None) -> None:
        """`slurm_conf`: the cluster's slurm.conf, if not $SLURM_CONF or Slurm's built-in path.

        libslurm reads it once, when pyslurm is first imported in the process.
        """
        if slurm_conf is not None:
            os.environ["SLURM_CONF"] = str(slurm_conf)
        self._pyslurm, self._ext = _import_modules()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pyslurm")
        self._last_update = 0
        self._reported: set[int] = set()
        self._last_nodes: list[SlurmNode] | None = None

    # -- plumbing ---------------------------------------------------------
    async def _call(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, fn, *args)
        except self._pyslurm.RPCError as error:
            raise _classify(what, error) from error

    # -- the SlurmClient verbs --------------------------------------------
    async def changed_jobs(self, partitions: Collection[str] | None = None) -> JobListing | None:
        read_at = time.monotonic()
        answer = await self._call("load jobs", self._load_changed, self._last_update, partitions, read_at)
        if answer is None:
            return None
        # slurmctld's own clock (time of its answer), as the REST backend uses.
        self._last_update, listing = answer
        return listing

    async def job(self, job_id: int) -> JobAllocation | None:
        return await self._call(f"load job {job_id}", self._load_one, job_id, time.monotonic())

    async def signal_job(self, job_id: int, signal: str) -> None:
        for delay in (*SIGNAL_RETRY_DELAYS_S, None):
            try:
                await self._call(f"signal job {job_id}", self._signal, job_id, _signal_name(signal))
                return
            except SlurmRejected as error:
                if error.errno in (ESLURM_INVALID_JOB_ID, ESLURM_ALREADY_DONE):
                    return  # nothing left to signal, as with slurmrestd
                if error.errno != ESLURM_TRANSITION_STATE_NO_UPDATE or delay is None:
                    log.warning("slurm.signal_failed", job_id=job_id, signal=signal, error=str(error))
                    return
            await asyncio.sleep(delay)

    async def submit_job(self, user: str, job: Mapping[str, Any]) -> int:
        # libslurm submits as this process's uid: only slurmrestd may act as the namespace's user.
        raise SlurmRefused("Kubernetes workloads are submitted through slurmrestd: "
                           "set [slurm] backend = \"rest\"")

    async def cancel_job(self, job_id: int) -> None:
        try:
            await self._call(f"cancel job {job_id}", self._cancel, job_id)
        except SlurmRejected as error:
            if error.errno not in (ESLURM_INVALID_JOB_ID, ESLURM_ALREADY_DONE):
                log.warning("slurm.cancel_failed", job_id=job_id, error=str(error))

    async def set_comment(self, job_id: int, comment: str) -> None:
        try:
            await self._call(f"comment job {job_id}", self._comment, job_id, comment)
        except SlurmRejected as error:
            log.warning("slurm.comment_failed", job_id=job_id, error=str(error))

    async def changed_nodes(self, partitions: Collection[str]) -> list[SlurmNode] | None:
        # libslurm's node load has no cheap "unchanged" answer through pyslurm: load, compare.
        nodes = await self._call("load nodes", self._load_nodes, frozenset(partitions))
        if nodes == self._last_nodes:
            return None
        self._last_nodes = nodes
        return nodes

    async def node(self, name: str) -> SlurmNode | None:
        return await self._call(f"load node {name}", self._load_node, name)

    async def update_node(self, name: str, state: str, reason: str = "") -> None:
        await self._call(f"update node {name}", self._update_node, name, state, reason)

    async def close(self) -> None:
        # A call in flight finishes on its own (bounded by Slurm's MessageTimeout); nothing waits for it.
        self._executor.shutdown(wait=False, cancel_futures=True)

    # -- on the worker thread ---------------------------------------------
    def _load_changed(
        self, since: int, partitions: Collection[str] | None, read_at: float
    ) -> tuple[int, JobListing] | None:
        answer = self._ext.load_jobs(since)
        if answer is None:
            return None
        last_update, jobs = answer
        names: dict[int, str] = {}
        listing = parse_listing(
            jobs, read_at=read_at, partitions=partitions,
            partition_of=lambda job: job.partition or "", job_id_of=lambda job: int(job.id),
            parse=lambda job: self._allocation(job, names, read_at), reported=self._reported,
        )
        return int(last_update), listing

    def _load_one(self, job_id: int, read_at: float) -> JobAllocation | None:
        job = self._ext.load_job(job_id)
        return None if job is None else self._allocation(job, {}, read_at)

    def _signal(self, job_id: int, signal: str) -> None:
        # pyslurm reads errno even after a successful RPC: start from a clean one.
        self._ext.clear_errno()
        self._pyslurm.Job(job_id).send_signal(signal, steps="batch")

    def _load_nodes(self, partitions: frozenset[str]) -> list[SlurmNode]:
        nodes = []
        for node in self._pyslurm.Nodes.load().values():
            parts = list(node.partitions or [])
            if not partitions.isdisjoint(parts):
                nodes.append(slurm_node(node.name, [node.state or ""], node.reason, parts))
        return sorted(nodes, key=lambda n: n.name)

    def _load_node(self, name: str) -> SlurmNode | None:
        try:
            node = self._pyslurm.Node.load(name)
        except self._pyslurm.RPCError:
            return None
        return slurm_node(node.name, [node.state or ""], node.reason, list(node.partitions or []))

    def _update_node(self, name: str, state: str, reason: str) -> None:
        self._ext.clear_errno()
        fields = {"state": state, **({"reason": reason} if reason else {})}
        changes = self._pyslurm.Node(**fields)
        self._pyslurm.Node(name).modify(changes)

    def _cancel(self, job_id: int) -> None:
        self._pyslurm.Job(job_id).cancel()

    def _comment(self, job_id: int, comment: str) -> None:
        self._pyslurm.Job(job_id).modify(self._pyslurm.JobSubmitDescription(comment=comment))

    def _allocation(self, job: Any, user_names: dict[int, str], read_at: float) -> JobAllocation:
        """A JobAllocation from a pyslurm.Job, field for field as allocation_from_rest reads slurmrestd."""
        ext = self._ext
        job_id = int(job.id)
        state, flags = ext.job_state(job)
        array_job_id = job.array_id or None  # 0 means "not an array job"
        time_limit_min = job.time_limit  # None when unlimited or unset
        uid = job.user_id
        return JobAllocation(
            job_id=job_id,
            name=job.name or "",
            user=_user_name(uid, user_names),
            uid=uid,
            gid=job.group_id,
            partition=job.partition or "",
            state=state,
            state_flags=frozenset(flags),
            nodes=_nodes(job_id, job.allocated_nodes or "", ext.node_resources(job), ext.gres_detail(job)),
            time_limit_s=time_limit_min * 60 if time_limit_min is not None else None,
            array_job_id=array_job_id,
            array_task_id=ext.array_task_id(job) if array_job_id is not None else None,
            work_dir=job.working_directory or "",
            start_time=job.start_time or None,  # 0 means "not started"
            batch_host=job.batch_host or "",
            batch=bool(job.is_batch_job),
            cluster=job.cluster or "",
            tasks=int(getattr(job, "ntasks", None) or 1),
            comment=getattr(job, "comment", None) or "",  # absent from older pyslurm records
            state_reason=str(getattr(job, "state_reason", None) or "").replace("None", ""),
            run=job.requeue_count or 0,  # pyslurm's name for restart_cnt
            read_at=read_at,
        )


def _nodes(
    job_id: int, expr: str, resources: list[tuple[int, int]], gres_detail: list[str]
) -> tuple[NodeAllocation, ...]:
    """Nodes in Slurm's node order with their CPUs, memory and GPU indices.

    slurmctld's per-node arrays (job_resources, gres_detail) follow the job's node order.
    """
    try:
        names = hostlist.expand(expr) if expr else []
        gpus = gres.gpu_indices_per_node(gres_detail, len(names))
    except (hostlist.HostlistError, gres.GresError) as exc:
        raise ModelError(f"job {job_id}: {exc}") from exc
    if resources and len(resources) != len(names):
        # Also what a job_resources layout that does not match this Slurm would look like.
        raise ModelError(f"job {job_id}: {len(resources)} allocated node record(s) for nodes {expr!r}")
    resources = resources or [(0, 0)] * len(names)
    return tuple(
        NodeAllocation(name=name, cpus=cpus, memory_mb=memory, gpu_indices=indices)
        for name, (cpus, memory), indices in zip(names, resources, gpus, strict=True)
    )


def _user_name(uid: int | None, cache: dict[int, str]) -> str:
    """The user's name as slurmctld's host would resolve it ("" if unknown); one lookup per uid."""
    if uid is None:
        return ""
    if uid not in cache:
        try:
            cache[uid] = pwd.getpwuid(uid).pw_name
        except KeyError:
            cache[uid] = ""
    return cache[uid]


def _signal_name(signal: str) -> str:
    """`USR1`, `SIGUSR1` or `10` → what pyslurm accepts (`SIGUSR1` or `10`)."""
    signal = signal.strip().upper()
    if signal.isdigit() or signal.startswith("SIG"):
        return signal
    return f"SIG{signal}"


def _classify(what: str, error: Any) -> Exception:
    errno = int(getattr(error, "errno", -1) or -1)
    message = f"slurm {what}: {error} (errno {errno})"
    temporary = (
        0 < errno < 1000  # an OS error such as ECONNREFUSED
        or (errno in _PROTOCOL_ERRORS and errno not in _NOT_TRANSIENT)
        or errno in _STANDBY
        or errno in _SOCKET_ERRORS
    )
    return SlurmUnavailable(message) if temporary else SlurmRejected(message, errno)


def _import_modules() -> tuple[ModuleType, ModuleType]:
    try:
        import pyslurm  # optional: built per Slurm version
    except ImportError as error:
        raise PyslurmUnavailable(
            f"the pyslurm backend needs pyslurm built for this Slurm ({error}); "
            "see containers/pyslurm/README.md, or use backend = \"rest\""
        ) from error
    try:
        import bridge_pyslurm_ext
    except ImportError as error:
        raise PyslurmUnavailable(
            f"pyslurm is installed but {EXTENSION} is not ({error}); build it with "
            "containers/pyslurm/build.sh or see containers/pyslurm/README.md"
        ) from error
    return pyslurm, bridge_pyslurm_ext
