"""A job's outcome from the observed state of its pods. Pure.

Pods come as Kubernetes API dicts, read through the typed view of core.pod_view. The answer is one of:
`Running` (wait), `Finished` (tell the waiter the exit code / signal), `FailedBeforeStart` (the
script never ran; tell the user why).

Rules, and why:
- Multi-node jobs report the highest exit code of their pods, as srun does for its tasks.
- The first pod that fails decides at once (like KillOnBadExit=1): the other ranks of a
  distributed job usually hang without it, holding GPUs until the time limit. Pass
  `wait_for_all=True` to wait for every pod instead.
- Container runtimes report a process killed by signal N as exit code 128+N (137 for SIGKILL) and
  rarely fill the `signal` field. With reason Error or OOMKilled such a code is read as signal N.
  A script that itself ends with `exit 137` looks the same; that case is rare and is reported as a
  signal too.
- Image and container-creation errors that the kubelet retries (ErrImagePull, ImagePullBackOff,
  CreateContainerConfigError, ...) fail the job only once they have lasted `grace_s` since the pod
  started, so that a registry hiccup does not kill a job; InvalidImageName and ErrImageNeverPull
  never heal and fail at once.
- Start deadline: a pod still not running `grace_s` after it started (or, without a start time,
  after it was created) fails the job whatever the cause (a volume that cannot be mounted, a node
  whose kubelet is gone). Such an answer is marked `overdue`: the caller explains it from the
  pod's events, and keeps waiting while the image is still being pulled.
"""

from __future__ import annotations

import signal as signals
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bridge.core.agent_protocol import ScriptEnding
from bridge.core.fields import because
from bridge.core.pod_view import PodView, Terminated, aware, parse_time, pod_view

IMAGE_ERRORS_PERMANENT = frozenset({"InvalidImageName", "ErrImageNeverPull"})
IMAGE_ERRORS_RETRIED = frozenset({"ErrImagePull", "ImagePullBackOff", "RegistryUnavailable"})
CREATE_ERRORS_RETRIED = frozenset({"CreateContainerConfigError", "CreateContainerError", "RunContainerError"})
# Terminated reasons meaning the process never started (exec of the interpreter failed, ...).
START_FAILURES = frozenset({"StartError", "ContainerCannotRun"})
# Terminated reasons under which an exit code 128+N means "killed by signal N".
SIGNAL_REASONS = frozenset({"Error", "OOMKilled"})
MAX_SIGNAL = 64
DEFAULT_GRACE_S = 60.0


@dataclass(frozen=True)
class Running:
    """The job still runs (or its pods still start)."""

    detail: str = ""
    """What is being waited for, for status output (e.g. "slurm-7-0: ContainerCreating")."""


@dataclass(frozen=True)
class Finished:
    """The script ran and ended; the waiter exits with `exit_code`, or dies by `signal`."""

    exit_code: int
    signal: int | None = None
    reason: str = ""
    """Explanation for the job's stderr; empty for a clean exit 0."""
    timed_out: bool = False
    oom_killed: bool = False
    by_kubernetes: bool = False
    """Kubernetes itself ended it (status.reason set: Evicted, Preempting, ...), which native Slurm
    has no word for: worth a line in the job's output, where a plain kill by signal is not."""


@dataclass(frozen=True)
class FailedBeforeStart:
    """The script never ran: image missing, kubelet refused the pod, interpreter not found, ..."""

    reason: str
    overdue: str = ""
    """Set (to the pod's name) when the only known fault is that the pod has not started within
    the grace period: the caller looks at the pod's events for the cause (a volume that cannot be
    mounted, a node without a kubelet) and keeps waiting while an image is still being pulled."""


Outcome = Running | Finished | FailedBeforeStart


def pod_outcome(
    pod: PodView, now: datetime, grace_s: float = DEFAULT_GRACE_S, calm_since: datetime | None = None,
) -> Outcome:
    """The outcome of one pod on its own. `calm_since`: when the API server last failed the
    bridge's watch; an error the kubelet keeps retrying is final only once it has persisted for
    `grace_s` since then too (a kubelet that could not read the pod's Secret while the API server
    was away says CreateContainerConfigError until it can, however old the pod is)."""
    persisted = pod.since is None or (aware(now) - pod.since).total_seconds() >= grace_s
    if calm_since is not None and (aware(now) - aware(calm_since)).total_seconds() < grace_s:
        persisted = False

    if pod.terminated is not None:
        return _from_terminated(pod, pod.terminated)
    if pod.phase == "Succeeded":
        return Finished(0)
    if pod.phase == "Failed":
        if pod.reason == "DeadlineExceeded":
            return _timeout(pod, 128 + signals.SIGTERM, int(signals.SIGTERM))
        if pod.running:
            # It ran, but the kubelet lost or killed it without a recorded exit status.
            return Finished(1, None, f"{pod.name}: {because(pod.reason, pod.message) or 'failed'}")
        if pod.init_failure:
            why = pod.init_failure
            return FailedBeforeStart(f"{pod.name}: the bridge's agent could not be set up: {why}")
        # Failed before the container ever ran: the kubelet refused it (OutOfcpu, NodeAffinity, ...).
        why = because(pod.reason, pod.message) or "phase Failed"
        return FailedBeforeStart(f"{pod.name}: Kubernetes refused the pod: {why}")
    if pod.deleting:
        return Finished(
            128 + signals.SIGTERM,
            int(signals.SIGTERM),
            f"{pod.name}: the pod was deleted in Kubernetes before the job ended",
        )

    if pod.init_failure and not pod.running and (persisted or any(
            reason in pod.init_failure for reason in IMAGE_ERRORS_PERMANENT)):
        return FailedBeforeStart(f"{pod.name}: the bridge's agent could not be set up: {pod.init_failure}")
    waiting = pod.waiting_reason
    if waiting in IMAGE_ERRORS_PERMANENT or (waiting in IMAGE_ERRORS_RETRIED and persisted):
        return FailedBeforeStart(
            f"{pod.name}: cannot pull image {pod.image!r}: {because(waiting, pod.waiting_message)}"
        )
    if waiting in CREATE_ERRORS_RETRIED and persisted:
        return FailedBeforeStart(
            f"{pod.name}: cannot create the container: {because(waiting, pod.waiting_message)}"
        )
    if pod.unschedulable is not None and persisted:
        return FailedBeforeStart(f"{pod.name}: cannot be placed on its node: {pod.unschedulable}")
    detail = waiting or pod.reason or pod.phase or "Pending"
    if pod.since is not None and persisted and not pod.running:
        return FailedBeforeStart(
            f"{pod.name}: did not start within {grace_s:g}s ({detail})", overdue=pod.name
        )
    return Running(f"{pod.name}: {detail}")


def told_outcome(pod: PodView, ending: ScriptEnding) -> Finished | None:
    """The batch pod's outcome as its agent told it on the log ("x" frame), before the kubelet
    notices the container's end (up to a second later). Only a plain exit, of a pod that nothing is
    deleting or evicting, and for a non-zero code only without an OOM kill and without a stop the
    agent was told (an eviction's SIGTERM may come before its reason reaches the pod's status):
    every other end waits for the runtime's word, which is what explains it to the user (a
    signal, OOMKilled, Evicted). Exit 0 is success on either word."""
    if pod.deleting or pod.reason or ending.exit_code is None or ending.exit_code >= 128:
        return None
    if ending.exit_code == 0:
        return Finished(0)
    if ending.oom_kills != 0 or ending.stopped:
        return None
    return Finished(ending.exit_code, None, f"{pod.name}: exited with code {ending.exit_code}")


def not_started_for_s(pod: PodView, now: datetime) -> float | None:
    """How long a pod has existed without its container running or ending (None once it has)."""
    if pod.running or pod.terminated is not None or pod.phase in ("Succeeded", "Failed") or pod.deleting:
        return None
    return 0.0 if pod.since is None else max(0.0, (aware(now) - pod.since).total_seconds())


def job_outcome(
    pods: Iterable[Mapping[str, Any] | PodView],
    node_count: int,
    *,
    now: datetime,
    grace_s: float = DEFAULT_GRACE_S,
    wait_for_all: bool = False,
    batch_only: bool = False,
    calm_since: datetime | None = None,
) -> Outcome:
    """The outcome of a job with `node_count` nodes from the pods observed for it (pod dicts, or
    their views).

    Pods not observed yet count as still starting; the caller knows whether it created them.
    `batch_only`: the script runs in the first node's pod only (the in-pod agent holds the other
    nodes); the job ends as that pod ends, while any pod that cannot start still fails it.
    `calm_since`: see pod_outcome.
    """
    views = sorted((p if isinstance(p, PodView) else pod_view(p) for p in pods),
                   key=lambda v: (v.index, v.name))
    outcomes = [(view, pod_outcome(view, now, grace_s, calm_since)) for view in views]

    for _, outcome in outcomes:
        if isinstance(outcome, FailedBeforeStart):
            return outcome
    if batch_only:
        outcomes = [(view, outcome) for view, outcome in outcomes if view.index == 0]
        node_count = 1
    finished = [o for _, o in outcomes if isinstance(o, Finished)]
    failed = [o for o in finished if o.exit_code != 0 or o.signal is not None or o.timed_out]
    everyone_done = len(finished) >= node_count and len(finished) == len(outcomes)
    if failed and (everyone_done or not wait_for_all):
        return _worst(failed)
    if everyone_done and node_count > 0:
        return Finished(0)

    for _, outcome in outcomes:
        if isinstance(outcome, Running):
            return outcome
    return Running(f"{len(outcomes)} of {node_count} pods exist")


def _worst(failed: list[Finished]) -> Finished:
    """A timeout first (it explains the others' kills), else the highest exit code."""
    timeouts = [f for f in failed if f.timed_out]
    if timeouts:
        return timeouts[0]
    return max(failed, key=lambda f: f.exit_code)  # max keeps the first (lowest index) of equals


def _from_terminated(pod: PodView, term: Terminated) -> Outcome:
    if term.reason in START_FAILURES:
        return FailedBeforeStart(
            f"{pod.name}: the container could not start: {because(term.reason, term.message)}"
        )
    sig = term.signal
    if sig is None and term.reason in SIGNAL_REASONS and 128 < term.exit_code <= 128 + MAX_SIGNAL:
        sig = term.exit_code - 128
    if pod.reason == "DeadlineExceeded":
        return _timeout(pod, term.exit_code, sig)
    oom = term.reason == "OOMKilled"
    if term.exit_code == 0 and sig is None:
        return Finished(0)
    if oom:
        text = f"{pod.name}: out of memory: killed by the kernel on reaching the job's memory limit"
    elif sig is not None:
        text = f"{pod.name}: killed by signal {sig} ({_signal_name(sig)})"
    else:
        text = f"{pod.name}: exited with code {term.exit_code}"
    if pod.reason:
        text += f" ({because(pod.reason, pod.message)})"
    return Finished(term.exit_code, sig, text, oom_killed=oom, by_kubernetes=bool(pod.reason))


def _timeout(pod: PodView, exit_code: int, sig: int | None) -> Finished:
    return Finished(exit_code, sig, f"{pod.name}: time limit reached", timed_out=True)


def _signal_name(sig: int) -> str:
    try:
        return signals.Signals(sig).name
    except ValueError:
        return "unknown signal"


__all__ = [
    "FailedBeforeStart", "Finished", "Outcome", "PodView", "Running", "Terminated", "job_outcome",
    "not_started_for_s", "parse_time", "pod_outcome", "pod_view", "told_outcome",
]
