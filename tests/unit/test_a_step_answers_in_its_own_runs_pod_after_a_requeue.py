"""A step's output and end go to the pod of the run that opened it, also once a requeue made the
next run the current one. `scontrol requeue` from inside a task is answered by the waiter after
Slurm's record has already moved to run 1: natively the command returns at once and the task goes
on until slurmstepd's TERM. The bridge looked the step up in the current run, so the answer was
dropped (404 "no open step") and the in-pod command waited until its pod was killed."""

from __future__ import annotations

import asyncio
from typing import Any

from bridge.clients.kube.cache import PodCache
from bridge.controller.jobstore import JobStore
from bridge.controller.run_pods import RunPods
from bridge.controller.sessions import SessionRegistry
from bridge.controller.steps import Steps
from bridge.core import agent_protocol, wellknown
from bridge.core.pod_identity import pod_name
from tests.unit.builders import NoSlurmJobs, RecordedExecs, allocation


def _pod(job_id: int, run: int, index: int) -> dict[str, Any]:
    return {"metadata": {
        "name": pod_name(job_id, index, run), "namespace": "slurm-jobs", "uid": f"uid-{run}-{index}",
        "labels": {wellknown.LABEL_JOB_ID: str(job_id), wellknown.LABEL_RUN: str(run)},
        "annotations": {wellknown.ANNOTATION_NODE_INDEX: str(index)},
    }}


def _requeued_job() -> tuple[Steps, RecordedExecs, SessionRegistry]:
    """Job 42: run 0 has step 2 (an in-pod scontrol) open and its pod still there; Slurm's record
    already says run 1, whose pod exists too (as after a fast restart)."""
    jobs = JobStore(NoSlurmJobs())  # type: ignore[arg-type]
    jobs.record(allocation(run=0))
    cache = PodCache()
    cache.apply("ADDED", _pod(42, 0, 0))
    sessions = SessionRegistry()
    kube = RecordedExecs()
    steps = Steps(kube, RunPods(jobs, cache), sessions, b"k" * 32, lambda work: None)  # type: ignore[arg-type]
    steps.open_command(sessions.open(42, 0), "2", "scontrol", "/home/alice")
    jobs.record(allocation(run=1))
    cache.apply("ADDED", _pod(42, 1, 0))
    sessions.open(42, 1)
    return steps, kube, sessions


def test_an_old_runs_open_step_is_found_in_that_run() -> None:
    steps, _, _ = _requeued_job()
    assert steps.open_run(42, "2") == 0
    assert steps.open_run(42, "3") is None


def test_an_old_runs_step_end_goes_to_that_runs_pod_not_the_next_runs() -> None:
    steps, kube, _ = _requeued_job()
    asyncio.run(steps.finish(42, "2", 0))
    assert [pod for pod, _ in kube.execs] == ["slurm-42-0"]
    assert steps.open_run(42, "2") is None


def test_the_newest_run_with_the_key_open_wins() -> None:
    steps, kube, sessions = _requeued_job()
    run1 = sessions.get(42, 1)
    assert run1 is not None
    steps.open_command(run1, "2", "squeue", "/home/alice")
    assert steps.open_run(42, "2") == 1
    asyncio.run(steps.finish(42, "2", 0))
    assert [pod for pod, _ in kube.execs] == ["slurm-42-r1-0"]


def test_a_step_end_told_again_goes_to_the_same_runs_pod() -> None:
    # The waiter tells a step's end again when the last try failed (a kubelet's 500): the step is
    # closed by then, and the retry must not go to the current run's pod, nor nowhere.
    steps, kube, _ = _requeued_job()
    asyncio.run(steps.finish(42, "2", 0))
    asyncio.run(steps.finish(42, "2", 0))
    assert [pod for pod, _ in kube.execs] == ["slurm-42-0", "slurm-42-0"]


def test_a_step_begun_before_the_daemon_started_ends_in_the_waiters_runs_pod() -> None:
    """Killed with -9 while a step ran, the daemon came back knowing no step of the run: the end the
    waiter told went nowhere, and the script's srun in the pod waited until the time limit."""
    steps, kube, _ = _requeued_job()
    asyncio.run(steps.finish(42, "5", 1, 1))  # key 5 was never answered by this daemon
    asyncio.run(steps.finish(42, "6", 1, 0))
    asyncio.run(steps.finish(42, "7", 1))  # an older waiter names no run: nothing to tell
    assert kube.execs[0] == ("slurm-42-r1-0", agent_protocol.step_done_command("5", 1))
    assert [pod for pod, _ in kube.execs] == ["slurm-42-r1-0", "slurm-42-0"]


def test_the_run_that_answered_the_key_wins_over_the_one_the_waiter_names() -> None:
    steps, kube, _ = _requeued_job()
    asyncio.run(steps.finish(42, "2", 0, 1))
    assert [pod for pod, _ in kube.execs] == ["slurm-42-0"]
