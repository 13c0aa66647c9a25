"""The controller asks its questions of a pod (does it run the agent, carry the job's output, has
its script started, ended, every container stopped, since when) of the typed view in
core/pod_view.py, never of the raw pod dict."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from bridge.core import wellknown
from bridge.core.pod_view import pod_view

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


def _stamp(seconds_ago: float) -> str:
    return (NOW - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _pod(index: int = 0, output: str | None = wellknown.OUTPUT_FRAMED, phase: str = "Running",
         states: list[dict[str, Any]] | None = None, **annotations: str) -> dict[str, Any]:
    notes = {wellknown.ANNOTATION_NODE_INDEX: str(index), **annotations}
    if output is not None:
        notes[wellknown.ANNOTATION_OUTPUT] = output
    statuses = [{"name": wellknown.CONTAINER_NAME if i == 0 else f"side{i}", "state": state}
                for i, state in enumerate(states or [])]
    return {
        "metadata": {"name": f"slurm-42-r3-{index}", "uid": "u-1", "annotations": notes,
                     "labels": {wellknown.LABEL_RUN: "3"}},
        "spec": {"nodeName": "kube7"},
        "status": {"phase": phase, "containerStatuses": statuses},
    }


def test_identity_and_placement_come_from_the_pod() -> None:
    view = pod_view(_pod(2, **{wellknown.ANNOTATION_SLURM_NODE: "node7"}))

    assert (view.name, view.index, view.run, view.uid) == ("slurm-42-r3-2", 2, 3, "u-1")
    assert (view.node_name, view.slurm_node) == ("kube7", "node7")


@pytest.mark.parametrize(("index", "output", "agent", "carries"), [
    (0, wellknown.OUTPUT_FRAMED, True, True),
    (1, wellknown.OUTPUT_FRAMED, True, False),  # the agent's other nodes hold their node, silent
    (1, None, False, True),  # without the agent every pod prints
    (0, wellknown.OUTPUT_NONE, False, False),  # a simulated partition
])
def test_who_runs_the_agent_and_who_carries_output(index: int, output: str | None, agent: bool,
                                                   carries: bool) -> None:
    view = pod_view(_pod(index, output))

    assert view.runs_agent is agent
    assert view.carries_output is carries


def test_a_running_script_has_started_and_counts_its_time() -> None:
    view = pod_view(_pod(states=[{"running": {"startedAt": _stamp(30)}}]))

    assert view.started and not view.container_ended and not view.stopped
    assert view.running_for_s(NOW) == pytest.approx(30.0)


def test_a_waiting_container_has_not_started() -> None:
    view = pod_view(_pod(phase="Pending", states=[{"waiting": {"reason": "ContainerCreating"}}]))

    assert not view.started and not view.container_ended
    assert view.running_for_s(NOW) == 0.0


def test_the_job_container_ended_while_a_sidecar_runs_is_ended_but_not_stopped() -> None:
    ended = {"terminated": {"exitCode": 0, "finishedAt": _stamp(5)}}
    view = pod_view(_pod(states=[ended, {"running": {}}]))

    assert view.started and view.container_ended
    assert not view.stopped, "a sidecar still uses the pod's resources"
    assert view.terminated is not None and view.terminated.finished_at == NOW - timedelta(seconds=5)

    every = pod_view(_pod(states=[ended, {"terminated": {"exitCode": 0}}]))
    assert every.stopped


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_an_ended_pod_is_ended_and_stopped_whatever_its_statuses(phase: str) -> None:
    view = pod_view(_pod(phase=phase))

    assert view.container_ended and view.stopped and not view.started


def test_a_pod_without_statuses_is_not_stopped() -> None:
    assert not pod_view(_pod(phase="Pending")).stopped
