"""The rest and pyslurm backends turn the same Slurm jobs into identical JobAllocation records.

Covers the kinds of records the reconciler meets: running with GPUs on one and on two nodes,
array tasks, pending (held), failed, cancelled. Two reads are never simultaneous, so a record that
differs is read again a few times before the test fails (a job may be moving between states).
"""

from __future__ import annotations

import asyncio

import pytest

from bridge.clients.slurm import SlurmClient
from bridge.core.model import JobAllocation
from tests.contract.jobs import Jobs
from tests.e2e.sandbox import Sandbox, wait_until

pytestmark = pytest.mark.e2e


async def read_both(both: dict[str, SlurmClient], job_id: int) -> dict[str, JobAllocation | None]:
    return {name: await client.job(job_id) for name, client in both.items()}


async def agreed(both: dict[str, SlurmClient], job_id: int, attempts: int = 6) -> JobAllocation:
    views = await read_both(both, job_id)
    for _ in range(attempts - 1):
        if views["rest"] == views["pyslurm"]:
            break
        await asyncio.sleep(0.5)
        views = await read_both(both, job_id)
    assert views["rest"] == views["pyslurm"], f"job {job_id}: backends disagree"
    assert views["rest"] is not None
    return views["rest"]


async def test_backends_agree_on_running_pending_array_and_finished_jobs(
    both: dict[str, SlurmClient], jobs: Jobs, sandbox: Sandbox
) -> None:
    # The native partition has 2 nodes x 4 CPUs: the running jobs below take 7 of them.
    failed = jobs.submit("-p", "native", "--wrap", "exit 3")
    sandbox.wait_job_final(failed)
    gpu_job = jobs.submit(
        "-p", "native", "-w", "native1", "--gres=gpu:2", "-c2", "--mem=700", "-t", "5", "--wrap", "sleep 60"
    )
    two_nodes = jobs.submit("-p", "native", "-N2", "-n3", "--gres=gpu:1", "--mem=300", "--wrap", "sleep 60")
    # bob's array only once alice's jobs run: fair-share would put it first (bob has used less),
    # and its two tasks could take the cores two_nodes needs beside its GPUs.
    jobs.wait_state(gpu_job, two_nodes)
    array = jobs.submit("-p", "native", "-a", "0-1", "-t", "3", "--wrap", "sleep 60", user="bob")
    held = jobs.submit("-p", "native", "-H", "--wrap", "true")
    cancelled = jobs.submit("-p", "native", "-H", "--wrap", "true")
    sandbox.slurm("scancel", str(cancelled))
    wait_until("two array tasks with records of their own", lambda: len(jobs.array_tasks(array)) == 2)
    tasks = jobs.array_tasks(array)
    jobs.wait_state(*tasks)
    jobs.wait_state(cancelled, state="CANCELLED")

    ids = (gpu_job, two_nodes, *tasks, held, failed, cancelled)
    views = {job_id: await agreed(both, job_id) for job_id in ids}

    # The records are not trivially equal: they carry what the jobs really got.
    for job_id in (gpu_job, two_nodes, *tasks):
        truth = jobs.allocation(job_id)
        assert [(n.name, n.cpus, n.memory_mb, n.gpu_indices) for n in views[job_id].nodes] == [
            (name, *truth[name]) for name in sorted(truth)
        ]
    assert sorted(n.cpus for n in views[two_nodes].nodes) == [1, 2]
    assert sorted((views[t].array_job_id, views[t].array_task_id) for t in tasks) == [(array, 0), (array, 1)]
    assert {views[t].user for t in tasks} == {"bob"}
    states = (views[held].state, views[failed].state, views[cancelled].state)
    assert states == ("PENDING", "FAILED", "CANCELLED")
    assert views[held].nodes == views[cancelled].nodes == ()


async def test_full_job_lists_agree_on_the_jobs_of_this_test(
    both: dict[str, SlurmClient], jobs: Jobs
) -> None:
    running = jobs.submit("-p", "native", "--gres=gpu:1", "--wrap", "sleep 60")
    held = jobs.submit("-p", "native", "-H", "--wrap", "true")
    jobs.wait_state(running)

    lists = {name: await client.changed_jobs() for name, client in both.items()}  # fresh: everything

    mine = {
        name: {j.job_id: j for j in (listed.jobs if listed else ()) if j.job_id in (running, held)}
        for name, listed in lists.items()
    }
    assert mine["rest"].keys() == {running, held}
    assert mine["rest"] == mine["pyslurm"]
