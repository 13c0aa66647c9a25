"""A typed view of one bridge pod: the fields the outcome and the controller decide on. Pure.

Pods come as Kubernetes API dicts (camelCase, as kubernetes_asyncio's
`ApiClient.sanitize_for_serialization` or a raw watch event gives them); `pod_view` reads them once,
defensively (a missing or mistyped field reads as empty), so that no caller walks a raw pod dict.
Who a pod is (its run, its node index) comes from pod_identity. Read by core.outcome and by the
controller's reconciler, batch signals and log relay.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from bridge.core import wellknown
from bridge.core.fields import as_int, as_list, as_map, as_str, because
from bridge.core.pod_identity import node_index_of, run_of

_UNSCHEDULABLE = ("PodScheduled", "False", "Unschedulable")
_ENDED_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Terminated:
    """A container's terminated state."""

    exit_code: int
    signal: int | None
    reason: str
    message: str
    finished_at: datetime | None = None


@dataclass(frozen=True)
class PodView:
    """The parts of a pod that decide the outcome, and what the controller asks of a pod."""

    name: str
    index: int
    phase: str
    reason: str
    """status.reason: Evicted, DeadlineExceeded, NodeLost, OutOfcpu, ..."""
    message: str
    deleting: bool
    image: str
    waiting_reason: str
    waiting_message: str
    running: bool
    terminated: Terminated | None
    unschedulable: str | None
    """Message of a PodScheduled=False/Unschedulable condition, if any."""
    since: datetime | None
    """When the pod started (status.startTime), else when it was created."""
    init_failure: str = ""
    """Why an init container (the bridge's agent install) failed or cannot start, if it did."""
    run: int = 0
    """The job run the pod belongs to (pod_identity.run_of)."""
    uid: str = ""
    node_name: str = ""
    """spec.nodeName: the Kubernetes node the pod is pinned to."""
    slurm_node: str | None = None
    """The Slurm node the pod stands for (ANNOTATION_SLURM_NODE)."""
    output: str | None = None
    """How the pod's log carries the job's output (ANNOTATION_OUTPUT): framed by the agent, plain, none."""
    script_delivery: str | None = None
    """ANNOTATION_SCRIPT_DELIVERY: "exec" when the script is too big for the payload Secret."""
    running_since: datetime | None = None
    """When the job container started running, while it runs."""
    all_containers_terminated: bool = False
    """Every container of the pod reports a terminated state (and there is at least one)."""
    suspend_mark: str | None = None
    """ANNOTATION_SUSPENDED: `stopping` while the daemon stops the job's processes in it (Slurm
    suspended the job), `true` once they are stopped; None when they run."""
    pod_ip: str = ""
    """status.podIP, once the runtime has given the pod its network."""
    binds_to: str | None = None
    """The Kubernetes node a pod the bridge binds itself (`dra` GPU mode) goes to; None otherwise."""
    spools_tasks: bool = False
    """ANNOTATION_TASK_SPOOL: its agent spools step tasks' output and takes acknowledgements."""

    @property
    def runs_agent(self) -> bool:
        """The job container runs the bridge's agent, whose log lines are frames."""
        return self.output == wellknown.OUTPUT_FRAMED

    @property
    def carries_output(self) -> bool:
        """Its log carries the job's output: with the agent only the first node's (the others
        hold their node and print nothing), else every pod's; none of a simulated partition."""
        return self.output != wellknown.OUTPUT_NONE and (not self.runs_agent or self.index == 0)

    @property
    def started(self) -> bool:
        """The job container has run (it runs, or it ended)."""
        return self.running or self.terminated is not None

    @property
    def container_ended(self) -> bool:
        """The job container has ended, or the pod as a whole has."""
        return self.phase in _ENDED_PHASES or self.terminated is not None

    @property
    def stopped(self) -> bool:
        """The pod ran and every container of it has terminated (nothing uses its resources)."""
        return self.phase in _ENDED_PHASES or self.all_containers_terminated

    def running_for_s(self, now: datetime) -> float:
        """How long the job container has run (0 when it does not run)."""
        if not self.running or self.running_since is None:
            return 0.0
        return (aware(now) - self.running_since).total_seconds()


def pod_view(pod: Mapping[str, Any]) -> PodView:
    """Read a pod dict; missing fields read as empty."""
    meta = as_map(pod.get("metadata"))
    spec = as_map(pod.get("spec"))
    status = as_map(pod.get("status"))
    annotations = as_map(meta.get("annotations"))

    containers = [as_map(c) for c in as_list(spec.get("containers"))]
    spec_job = next((c for c in containers if c.get("name") == wellknown.CONTAINER_NAME), {})
    statuses = [as_map(c) for c in as_list(status.get("containerStatuses"))]
    job = next((c for c in statuses if c.get("name") == wellknown.CONTAINER_NAME), {})
    state = as_map(job.get("state"))
    waiting = as_map(state.get("waiting"))
    running = state.get("running")
    term = state.get("terminated")
    terminated = None
    if isinstance(term, Mapping):
        raw_signal = term.get("signal")
        terminated = Terminated(
            exit_code=as_int(term.get("exitCode")),
            signal=raw_signal if isinstance(raw_signal, int) and raw_signal > 0 else None,
            reason=as_str(term.get("reason")),
            message=as_str(term.get("message")).strip(),
            finished_at=parse_time(term.get("finishedAt")),
        )

    return PodView(
        name=as_str(meta.get("name")),
        index=node_index_of(pod) or 0,
        phase=as_str(status.get("phase")),
        reason=as_str(status.get("reason")),
        message=as_str(status.get("message")),
        deleting=meta.get("deletionTimestamp") is not None,
        image=as_str(job.get("image")) or as_str(spec_job.get("image")),
        waiting_reason=as_str(waiting.get("reason")),
        waiting_message=as_str(waiting.get("message")),
        running=isinstance(running, Mapping),
        terminated=terminated,
        unschedulable=_unschedulable(status),
        since=parse_time(status.get("startTime")) or parse_time(meta.get("creationTimestamp")),
        init_failure=_init_failure(status),
        run=run_of(pod),
        uid=as_str(meta.get("uid")),
        node_name=as_str(spec.get("nodeName")),
        slurm_node=_str_or_none(annotations.get(wellknown.ANNOTATION_SLURM_NODE)),
        output=_str_or_none(annotations.get(wellknown.ANNOTATION_OUTPUT)),
        script_delivery=_str_or_none(annotations.get(wellknown.ANNOTATION_SCRIPT_DELIVERY)),
        running_since=parse_time(running.get("startedAt")) if isinstance(running, Mapping) else None,
        all_containers_terminated=bool(statuses) and all(
            "terminated" in as_map(c.get("state")) for c in statuses),
        suspend_mark=_str_or_none(annotations.get(wellknown.ANNOTATION_SUSPENDED)),
        binds_to=_str_or_none(annotations.get(wellknown.ANNOTATION_KUBE_NODE)),
        pod_ip=as_str(status.get("podIP")),
        spools_tasks=annotations.get(wellknown.ANNOTATION_TASK_SPOOL) == "1",
    )


def _init_failure(status: Mapping[str, Any]) -> str:
    failure = ""
    for init in map(as_map, as_list(status.get("initContainerStatuses"))):
        init_state = as_map(init.get("state"))
        init_term, init_wait = as_map(init_state.get("terminated")), as_map(init_state.get("waiting"))
        if init_term and as_int(init_term.get("exitCode")) != 0:
            code = as_int(init_term.get("exitCode"))
            failure = because(as_str(init_term.get("reason")) or f"exit code {code}",
                              as_str(init_term.get("message")).strip())
        elif init_wait.get("reason") not in (None, "", "PodInitializing"):
            failure = because(as_str(init_wait.get("reason")), as_str(init_wait.get("message")).strip())
    return failure


def _unschedulable(status: Mapping[str, Any]) -> str | None:
    found = None
    for cond in map(as_map, as_list(status.get("conditions"))):
        if (cond.get("type"), cond.get("status"), cond.get("reason")) == _UNSCHEDULABLE:
            found = as_str(cond.get("message")) or "Unschedulable"
    return found


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


def parse_time(value: object) -> datetime | None:
    """A timestamp from an RFC 3339 string (raw API dict) or a datetime (client objects)."""
    if isinstance(value, str) and value:
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return None
    return aware(value) if isinstance(value, datetime) else None


def aware(value: datetime) -> datetime:
    """Naive times are UTC (the API's zone), so that naive and aware times can be compared."""
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
