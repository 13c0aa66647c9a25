"""When slurmstepd stops a run (scancel, a requeue, the time limit), it signals the batch script
and the steps' tasks at once. The bridge's tasks get theirs through their proxies; the script got
its TERM only from the kubelet, once it acted on the pod's deletion, which a kubelet still starting
the pod put off: the script went on past its srun (a line more in the output, the batch step
COMPLETED where native shows CANCELLED 0:15). The waiter's cancel now also has the daemon send the
agent that runs the script its SIGTERM at once (agent/stop.go), in that run's pod only."""

from __future__ import annotations

import asyncio
from typing import Any
from unittest import mock

from bridge.clients.kube.cache import PodCache
from bridge.controller import facade
from bridge.controller.metrics import Metrics
from bridge.controller.reconcile import Reconciler
from bridge.core import agent_protocol, wellknown
from bridge.core.pod_identity import pod_name

from .builders import NoSlurmJobs, RecordedExecs, allocation, config


def _pod(
    run: int, index: int, *, ended: bool = False, waiting: str = "", node: str = "kube1",
) -> dict[str, Any]:
    state: dict[str, Any] = {"running": {"startedAt": "2026-12-06T10:00:00Z"}}
    if ended:
        state = {"terminated": {"exitCode": 0}}
    elif waiting:
        state = {"waiting": {"reason": waiting}}
    return {
        "metadata": {
            "name": pod_name(42, index, run), "namespace": "slurm-jobs", "uid": f"u{run}{index}",
            "labels": {wellknown.LABEL_JOB_ID: "42", wellknown.LABEL_RUN: str(run)},
            "annotations": {wellknown.ANNOTATION_NODE_INDEX: str(index),
                            wellknown.ANNOTATION_OUTPUT: wellknown.OUTPUT_FRAMED},
        },
        "spec": {"nodeName": node},
        "status": {"phase": "Running", "containerStatuses": [{"name": "job", "state": state}]},
    }


async def _cancel(pods: list[dict[str, Any]], run: int = 0, times: int = 1) -> list[tuple[str, list[str]]]:
    kube, cache = RecordedExecs(), PodCache()
    for pod in pods:
        cache.apply("ADDED", pod)
    reconciler = Reconciler(config(), NoSlurmJobs(), kube, cache, Metrics(), lambda _: None)  # type: ignore[arg-type]
    # Slurm shows the run cancelled before slurmstepd signals the waiter.
    reconciler.jobs.record(allocation(run=run, state="CANCELLED"))
    reconciler.sessions.open(42, run)
    for _ in range(times):
        reconciler.term_from_slurm(42)
    await asyncio.sleep(0.05)
    return kube.execs


STOP = agent_protocol.signal_command(wellknown.AGENT_RUN_PIDFILE, 15)


def test_the_waiters_cancel_sends_the_scripts_agent_its_term_at_once() -> None:
    execs = asyncio.run(_cancel([_pod(0, 0), _pod(0, 1)]))
    assert execs == [("slurm-42-0", STOP)]


def test_only_the_cancelled_runs_script_is_stopped() -> None:
    # Run 1's waiter cancels: run 0's pod (still going) is not that run's.
    execs = asyncio.run(_cancel([_pod(0, 0), _pod(1, 0)], run=1))
    assert execs == [("slurm-42-r1-0", STOP)]


def test_a_script_that_has_ended_is_not_signalled() -> None:
    assert asyncio.run(_cancel([_pod(0, 0, ended=True)])) == []


def test_a_pod_still_being_started_is_asked_too() -> None:
    # The kubelet may not have reported the container running yet: that pod is the slow one.
    execs = asyncio.run(_cancel([_pod(0, 0, waiting="ContainerCreating")]))
    assert execs == [("slurm-42-0", STOP)]


def test_the_waiters_cancel_told_again_stops_once() -> None:
    assert len(asyncio.run(_cancel([_pod(0, 0)], times=3))) == 1


def test_a_pod_that_runs_no_script_or_has_no_node_is_not_asked() -> None:
    assert asyncio.run(_cancel([_pod(0, 0, waiting="ImagePullBackOff")])) == []
    assert asyncio.run(_cancel([_pod(0, 0, node="")])) == []


# -- an in-pod Slurm command's answer comes first ---------------------------------------------------
# Natively `scontrol requeue` (or `scancel` of the job itself) has its answer before slurmd signals
# the job, and exits 0; submitit's checkpoint requeues so. Through the pod the answer's way is
# longer than the TERM's, which killed the command first ("died with SIGTERM", the job failed).


async def _cancel_with(open_step: dict[str, Any], answer_after: float | None, wait_s: float = 1.0,
                       ) -> tuple[list[tuple[str, list[str]]], float | None]:
    """The waiter cancels while step "3" is open; it ends after `answer_after` s (None: never).
    The stop's execs, and how long after the cancel the stop went out."""
    kube, cache = RecordedExecs(), PodCache()
    cache.apply("ADDED", _pod(0, 0))
    reconciler = Reconciler(config(), NoSlurmJobs(), kube, cache, Metrics(), lambda _: None)  # type: ignore[arg-type]
    reconciler.jobs.record(allocation(run=0, state="CANCELLED"))
    session = reconciler.sessions.open(42, 0)
    session.steps.answer("3", open_step)
    sent_after: float | None = None
    started = asyncio.get_running_loop().time()
    with mock.patch.object(facade, "COMMAND_ANSWER_WAIT_S", wait_s):
        reconciler.term_from_slurm(42)
        if answer_after is not None:
            await asyncio.sleep(answer_after)
            assert kube.execs == [], "the stop went before the command's answer"
            reconciler.steps.close(42, "3")
        for _ in range(100):
            await asyncio.sleep(0.02)
            if kube.execs and sent_after is None:
                sent_after = asyncio.get_running_loop().time() - started
    return kube.execs, sent_after


COMMAND = {"argv": [], "cwd": "/", "env": {}, "command": "scontrol"}


def test_the_stop_waits_for_the_answer_to_a_command_in_flight() -> None:
    execs, sent_after = asyncio.run(_cancel_with(COMMAND, answer_after=0.3))
    assert execs == [("slurm-42-0", STOP)]
    assert sent_after is not None and sent_after >= 0.3


def test_a_command_never_answered_holds_the_stop_only_so_long() -> None:
    execs, sent_after = asyncio.run(_cancel_with(COMMAND, answer_after=None, wait_s=0.2))
    assert execs == [("slurm-42-0", STOP)]
    assert sent_after is not None and 0.2 <= sent_after < 1.5


def test_an_srun_step_does_not_hold_the_stop() -> None:
    # Natively the steps' tasks get their TERM with the script: no answer to wait for.
    step = {"argv": ["hostname"], "cwd": "/", "env": {}}
    execs, sent_after = asyncio.run(_cancel_with(step, answer_after=None))
    assert execs == [("slurm-42-0", STOP)]
    assert sent_after is not None and sent_after < 0.9


async def _task_term_waits(answer_after: float | None) -> float:
    """A task of step "2" gets its TERM while the run's command "3" awaits its answer (ended
    after `answer_after` s; None: never): how long the TERM was held."""
    kube, cache = RecordedExecs(), PodCache()
    cache.apply("ADDED", _pod(0, 0))
    reconciler = Reconciler(config(), NoSlurmJobs(), kube, cache, Metrics(), lambda _: None)  # type: ignore[arg-type]
    reconciler.jobs.record(allocation(run=0))
    session = reconciler.sessions.open(42, 0)
    session.steps.answer("2", {"argv": ["python3"], "cwd": "/", "env": {}})
    session.steps.answer("3", COMMAND)
    loop = asyncio.get_running_loop()
    if answer_after is not None:
        loop.call_later(answer_after, reconciler.steps.close, 42, "3")
    started = loop.time()
    with mock.patch.object(facade, "COMMAND_ANSWER_WAIT_S", 0.6):
        await reconciler.commands_answered(42, "2")
    return loop.time() - started


def test_a_tasks_term_waits_for_the_answer_to_a_command_in_flight() -> None:
    # submitit's python runs as an srun task, and its `scontrol requeue` is answered first.
    assert 0.2 <= asyncio.run(_task_term_waits(0.2)) < 0.55


def test_a_tasks_term_waits_only_so_long_for_an_answer() -> None:
    assert 0.6 <= asyncio.run(_task_term_waits(None)) < 1.5
