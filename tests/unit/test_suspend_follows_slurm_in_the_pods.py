"""Suspend and resume in the pods (issue 21): each pod is stopped once Slurm shows the job
SUSPENDED and continued once it shows it running, recorded on the pod itself (an annotation), so a
restarted daemon still continues a pod stopped before; a pod that cannot be reached is retried."""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from bridge.controller.metrics import Metrics
from bridge.controller.suspension import RETRY_S, Suspension
from bridge.core import agent_protocol, wellknown
from bridge.core.errors import KubeUnavailable
from bridge.core.pod_view import pod_view


def _pod(name: str, suspended: bool = False, running: bool = True, mark: str = "true") -> dict[str, Any]:
    annotations = {wellknown.ANNOTATION_NODE_INDEX: "0"}
    if suspended:
        annotations[wellknown.ANNOTATION_SUSPENDED] = mark
    state = {"running": {"startedAt": "2026-12-04T10:00:00Z"}} if running else {"waiting": {"reason": "x"}}
    return {"metadata": {"name": name, "annotations": annotations, "labels": {}},
            "spec": {"containers": [{"name": wellknown.CONTAINER_NAME, "image": "i"}]},
            "status": {"phase": "Running" if running else "Pending",
                       "containerStatuses": [{"name": wellknown.CONTAINER_NAME, "state": state}]}}


class Kube:
    def __init__(self, unreachable: frozenset[str] = frozenset()) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.unreachable = unreachable

    async def exec_in_pod(self, pod: str, command: list[str]) -> str:
        if pod in self.unreachable:
            raise KubeUnavailable(f"cannot exec in pod {pod}")
        self.calls.append((pod, command))
        return ""

    async def annotate_pod(self, pod: str, key: str, value: str | None) -> bool:
        self.calls.append((pod, (key, value)))
        return True


def _follow(kube: Kube, suspended: bool, pods: list[dict[str, Any]]) -> float | None:
    suspension = Suspension(kube, Metrics())  # type: ignore[arg-type]
    return asyncio.run(suspension.follow(suspended, [pod_view(p) for p in pods], structlog.get_logger()))


def test_slurm_suspends_every_running_pod_is_marked_stopped_then_marked_done() -> None:
    """Marked first: a stop whose mark failed would never be continued."""
    kube = Kube()
    pods = [_pod("a"), _pod("b", suspended=True, mark="stopping"), _pod("c", suspended=True)]
    assert _follow(kube, True, pods) is None
    stop = agent_protocol.signal_all_command(19)
    assert kube.calls == [("a", (wellknown.ANNOTATION_SUSPENDED, "stopping")), ("a", stop),
                          ("a", (wellknown.ANNOTATION_SUSPENDED, "true")),
                          # b's stop may not have happened: stopped again
                          ("b", stop), ("b", (wellknown.ANNOTATION_SUSPENDED, "true"))]


def test_slurm_resumes_only_marked_pods_are_continued_then_unmarked() -> None:
    kube = Kube()
    assert _follow(kube, False, [_pod("a", suspended=True), _pod("b"),
                                 _pod("c", suspended=True, mark="stopping")]) is None
    cont = agent_protocol.signal_all_command(18)
    assert kube.calls == [("a", cont), ("a", (wellknown.ANNOTATION_SUSPENDED, None)),
                          ("c", cont), ("c", (wellknown.ANNOTATION_SUSPENDED, None))]


def test_a_pod_not_started_yet_waits_and_an_unreachable_one_is_retried() -> None:
    kube = Kube(unreachable=frozenset({"b"}))
    assert _follow(kube, True, [_pod("a", running=False), _pod("b")]) == RETRY_S
    # b is marked `stopping`, its stop failed: the next pass stops it again; were Slurm to
    # resume meanwhile, the mark makes sure it is continued.
    assert kube.calls == [("b", (wellknown.ANNOTATION_SUSPENDED, "stopping"))]


def test_the_agent_verb_only_takes_stop_and_cont() -> None:
    assert agent_protocol.signal_all_command(19)[1:] == ["signal-all", "19"]
