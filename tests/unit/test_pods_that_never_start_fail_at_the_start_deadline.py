"""Start deadline: a pod whose container has neither run nor ended `grace_s` after the pod started
(status.startTime, else metadata.creationTimestamp) fails its job as FailedBeforeStart, marked
`overdue` with the pod's name; before that it is still Running, and a pod without any timestamp
is never overdue."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from bridge.core.outcome import (
    FailedBeforeStart,
    Finished,
    Outcome,
    Running,
    job_outcome,
    not_started_for_s,
    pod_outcome,
    pod_view,
)

NOW = datetime(2025, 12, 1, 12, 0, 0, tzinfo=UTC)
GRACE = 60.0


def ago(seconds: float) -> str:
    return (NOW - timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def pending_pod(
    index: int = 0,
    *,
    started: str | None = None,
    created: str | None = None,
    phase: str = "Pending",
    state: dict[str, Any] | None = None,
    deleting: bool = False,
    conditions: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A job pod; by default Pending, with no container status at all (nothing pulled yet)."""
    meta: dict[str, Any] = {
        "name": f"slurm-9-{index}",
        "annotations": {"slurm-k8s-bridge/node-index": str(index)},
    }
    if created is not None:
        meta["creationTimestamp"] = created
    if deleting:
        meta["deletionTimestamp"] = ago(1)
    status: dict[str, Any] = {"phase": phase}
    if started is not None:
        status["startTime"] = started
    if state is not None:
        status["containerStatuses"] = [{"name": "job", "image": "reg.io/app:1", "state": state}]
    if conditions is not None:
        status["conditions"] = conditions
    return {
        "metadata": meta,
        "spec": {"containers": [{"name": "job", "image": "reg.io/app:1"}]},
        "status": status,
    }


def outcome_of(pod: dict[str, Any], grace_s: float = GRACE) -> Outcome:
    return pod_outcome(pod_view(pod), NOW, grace_s)


# -- the deadline -----------------------------------------------------------------------------


def test_a_pod_pending_past_the_grace_since_it_started_is_overdue() -> None:
    assert outcome_of(pending_pod(started=ago(61), created=ago(61))) == FailedBeforeStart(
        "slurm-9-0: did not start within 60s (Pending)", overdue="slurm-9-0"
    )


def test_a_pod_pending_inside_the_grace_is_still_running() -> None:
    assert outcome_of(pending_pod(started=ago(59), created=ago(59))) == Running("slurm-9-0: Pending")


def test_the_deadline_is_reached_at_exactly_the_grace() -> None:
    outcome = outcome_of(pending_pod(started=ago(GRACE)))
    assert isinstance(outcome, FailedBeforeStart)
    assert outcome.overdue == "slurm-9-0"


def test_the_waiting_reason_is_named_in_the_overdue_answer() -> None:
    pod = pending_pod(started=ago(120), state={"waiting": {"reason": "ContainerCreating"}})
    assert outcome_of(pod) == FailedBeforeStart(
        "slurm-9-0: did not start within 60s (ContainerCreating)", overdue="slurm-9-0"
    )


def test_the_grace_is_the_callers_and_printed_as_given() -> None:
    pod = pending_pod(started=ago(2))
    assert outcome_of(pod, grace_s=1.5) == FailedBeforeStart(
        "slurm-9-0: did not start within 1.5s (Pending)", overdue="slurm-9-0"
    )
    assert outcome_of(pod, grace_s=3600) == Running("slurm-9-0: Pending")


def test_the_start_time_counts_rather_than_the_creation_time() -> None:
    # Created long ago but only just accepted by its kubelet: not overdue yet.
    assert outcome_of(pending_pod(started=ago(5), created=ago(600))) == Running("slurm-9-0: Pending")


def test_without_a_start_time_the_creation_time_counts() -> None:
    assert outcome_of(pending_pod(created=ago(5))) == Running("slurm-9-0: Pending")
    assert outcome_of(pending_pod(created=ago(61))) == FailedBeforeStart(
        "slurm-9-0: did not start within 60s (Pending)", overdue="slurm-9-0"
    )


def test_an_unreadable_start_time_falls_back_to_the_creation_time() -> None:
    outcome = outcome_of(pending_pod(started="yesterday", created=ago(61)))
    assert isinstance(outcome, FailedBeforeStart)
    assert outcome.overdue == "slurm-9-0"


def test_a_pod_without_any_timestamp_is_never_overdue() -> None:
    assert outcome_of(pending_pod()) == Running("slurm-9-0: Pending")
    assert outcome_of(pending_pod(), grace_s=0.001) == Running("slurm-9-0: Pending")
    assert outcome_of(pending_pod(state={"waiting": {"reason": "ContainerCreating"}})) == Running(
        "slurm-9-0: ContainerCreating"
    )


def test_a_pod_on_a_lost_node_is_overdue_too() -> None:
    pod = pending_pod(started=ago(300), phase="Unknown")
    assert outcome_of(pod) == FailedBeforeStart(
        "slurm-9-0: did not start within 60s (Unknown)", overdue="slurm-9-0"
    )


# -- what is not overdue ----------------------------------------------------------------------


def test_a_running_container_is_never_overdue() -> None:
    pod = pending_pod(started=ago(3600), phase="Running", state={"running": {"startedAt": ago(3500)}})
    assert outcome_of(pod) == Running("slurm-9-0: Running")


def test_an_ended_container_is_finished_not_overdue() -> None:
    pod = pending_pod(started=ago(3600), phase="Succeeded", state={"terminated": {"exitCode": 0}})
    assert outcome_of(pod) == Finished(0)


def test_a_deleted_pod_is_finished_not_overdue() -> None:
    outcome = outcome_of(pending_pod(started=ago(3600), deleting=True))
    assert isinstance(outcome, Finished)
    assert outcome.signal == 15


def test_known_causes_are_named_rather_than_marked_overdue() -> None:
    unschedulable = pending_pod(
        started=ago(120),
        conditions=[
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "no fit"}
        ],
    )
    assert outcome_of(unschedulable) == FailedBeforeStart("slurm-9-0: cannot be placed on its node: no fit")
    pull = pending_pod(started=ago(120), state={"waiting": {"reason": "ImagePullBackOff", "message": "404"}})
    outcome = outcome_of(pull)
    assert isinstance(outcome, FailedBeforeStart)
    assert (outcome.overdue, outcome.reason) == (
        "", "slurm-9-0: cannot pull image 'reg.io/app:1': ImagePullBackOff: 404"
    )


# -- in a job ---------------------------------------------------------------------------------


def test_one_overdue_pod_fails_the_whole_job_and_is_named() -> None:
    pods = [
        pending_pod(0, started=ago(120), phase="Running", state={"running": {}}),
        pending_pod(1, started=ago(120), state={"waiting": {"reason": "ContainerCreating"}}),
    ]
    assert job_outcome(pods, 2, now=NOW, grace_s=GRACE) == FailedBeforeStart(
        "slurm-9-1: did not start within 60s (ContainerCreating)", overdue="slurm-9-1"
    )
    assert job_outcome(pods, 2, now=NOW, grace_s=600) == Running("slurm-9-0: Running")


# -- not_started_for_s ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        (pending_pod(started=ago(42), created=ago(50)), 42.0),
        (pending_pod(created=ago(50)), 50.0),
        (pending_pod(state={"waiting": {"reason": "ContainerCreating"}}, started=ago(7)), 7.0),
        (pending_pod(), 0.0),
        (pending_pod(started=(NOW + timedelta(seconds=30)).strftime("%Y-%m-%dT%H:%M:%SZ")), 0.0),
    ],
    ids=["since start", "since creation", "waiting", "no timestamp", "clock skew"],
)
def test_a_pod_not_started_yet_says_for_how_long(pod: dict[str, Any], expected: float) -> None:
    assert not_started_for_s(pod_view(pod), NOW) == expected


@pytest.mark.parametrize(
    "pod",
    [
        pending_pod(started=ago(9), phase="Running", state={"running": {}}),
        pending_pod(started=ago(9), phase="Failed", state={"terminated": {"exitCode": 1}}),
        pending_pod(started=ago(9), phase="Running", state={"terminated": {"exitCode": 0}}),
        pending_pod(started=ago(9), phase="Succeeded"),
        pending_pod(started=ago(9), phase="Failed"),
        pending_pod(started=ago(9), deleting=True),
    ],
    ids=["running", "failed with exit", "terminated", "succeeded", "failed", "deleting"],
)
def test_a_pod_that_ran_or_ended_is_not_waiting_to_start(pod: dict[str, Any]) -> None:
    assert not_started_for_s(pod_view(pod), NOW) is None


def test_a_naive_now_is_read_as_utc() -> None:
    view = pod_view(pending_pod(started=ago(30)))
    assert not_started_for_s(view, NOW.replace(tzinfo=None)) == 30.0
