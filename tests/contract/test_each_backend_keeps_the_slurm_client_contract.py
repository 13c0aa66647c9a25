"""Every SlurmClient verb, run against the live slurmctld once per backend (rest, pyslurm).

The expected values come from Slurm's own CLI (scontrol, squeue, sacct), never from a backend.
Jobs run in the `native` partition, which job_submit.lua leaves alone.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest

from bridge.clients.slurm import SlurmClient
from bridge.clients.slurm.rest import RestSlurmClient
from bridge.core.errors import SlurmAuthError
from bridge.core.model import JobAllocation, NodeAllocation
from tests.contract.jobs import Jobs
from tests.e2e.sandbox import Sandbox, wait_until

pytestmark = pytest.mark.e2e

UNKNOWN_JOB_ID = 66_000_000  # below MaxJobId, far above any id the sandbox hands out
REST_URL = "http://127.0.0.1:6820"


async def wait_idle(backend: SlurmClient, timeout: float = 30.0) -> None:
    """Poll until changed_jobs says "nothing changed" (after a change it lists jobs for ~1-2 s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await backend.changed_jobs() is None:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"changed_jobs never returned None within {timeout:.0f}s")


async def wait_job(
    backend: SlurmClient, job_id: int, what: str, ok: object, timeout: float = 30.0
) -> JobAllocation:
    """Poll backend.job until `ok(alloc)` holds."""
    deadline = time.monotonic() + timeout
    alloc = None
    while time.monotonic() < deadline:
        alloc = await backend.job(job_id)
        if alloc is not None and ok(alloc):  # type: ignore[operator]
            return alloc
        await asyncio.sleep(0.3)
    raise AssertionError(f"job {job_id} never {what} within {timeout:.0f}s (last: {alloc!r})")


def uid_gid(sandbox: Sandbox, user: str) -> tuple[int, int]:
    ids = sandbox.slurm("id", "-u", user).stdout, sandbox.slurm("id", "-g", user).stdout
    return int(ids[0]), int(ids[1])


async def test_running_job_carries_the_nodes_cpus_memory_and_gpus_slurm_allocated(
    backend: SlurmClient, jobs: Jobs, sandbox: Sandbox
) -> None:
    # A holder takes a GPU of native1 first, so the target's indices cannot be the default 0,1.
    holder = jobs.submit("-p", "native", "-w", "native1", "--gres=gpu:1", "--wrap", "sleep 60")
    jobs.wait_state(holder)
    target = jobs.submit(
        "-p", "native", "-w", "native1", "-N1", "--gres=gpu:2", "-c2", "--mem=700", "-t", "5",
        "--wrap", "sleep 30",
    )
    jobs.wait_state(target)
    truth = jobs.allocation(target)
    uid, gid = uid_gid(sandbox, "alice")

    alloc = await backend.job(target)
    held = await backend.job(holder)

    assert alloc is not None and held is not None
    assert truth.keys() == {"native1"} and truth["native1"][:2] == (2, 700) and len(truth["native1"][2]) == 2
    assert alloc.nodes == (NodeAllocation("native1", cpus=2, memory_mb=700, gpu_indices=truth["native1"][2]),)
    assert set(alloc.nodes[0].gpu_indices).isdisjoint(held.nodes[0].gpu_indices)
    assert (alloc.job_id, alloc.state, alloc.state_flags) == (target, "RUNNING", frozenset())
    assert (alloc.user, alloc.uid, alloc.gid, alloc.partition) == ("alice", uid, gid, "native")
    assert alloc.time_limit_s == 5 * 60
    assert (alloc.batch_host, alloc.work_dir, alloc.name) == ("native1", "/home/alice", "wrap")
    assert alloc.cluster == jobs.cluster_name()
    assert alloc.start_time is not None and abs(alloc.start_time - time.time()) < 120
    assert (alloc.array_job_id, alloc.array_task_id) == (None, None)


async def test_changed_jobs_is_none_when_idle_and_lists_jobs_right_after_any_change(
    backend: SlurmClient, jobs: Jobs, sandbox: Sandbox
) -> None:
    job_id = jobs.submit("-p", "native", "-t", "5", "--wrap", "sleep 60")
    jobs.wait_state(job_id)
    first = await backend.changed_jobs()
    assert first is not None and job_id in {j.job_id for j in first.jobs}  # a fresh client lists everything

    # What the bridge acts on is a job's state (its nodes come with RUNNING): a change of state is
    # seen at the next poll. (The REST backend reads other fields, e.g. a new time limit, which
    # Slurm itself enforces, at its periodic full listing.)
    await wait_idle(backend)
    sandbox.slurm("scontrol", "suspend", str(job_id))
    after_update = await backend.changed_jobs()
    sandbox.slurm("scontrol", "resume", str(job_id))

    assert after_update is not None, "the state change right after an idle poll was missed"
    assert {j.job_id: j for j in after_update.jobs}[job_id].state == "SUSPENDED"

    await wait_idle(backend)
    new_id = jobs.submit("-p", "native", "-H", "--wrap", "true")  # held: stays PENDING
    after_submit = await backend.changed_jobs()

    assert after_submit is not None, "the new submission right after an idle poll was missed"
    assert {j.job_id: j.state for j in after_submit.jobs}.get(new_id) == "PENDING"


async def test_job_of_an_unknown_id_is_none(backend: SlurmClient) -> None:
    # slurmrestd 26.05.5 answers GET /job/{unknown id} with two HTTP responses on one connection
    # (a JSON 404, then a text/plain one); the REST backend must still say None, not fail.
    assert await backend.job(UNKNOWN_JOB_ID) is None


async def test_a_refused_token_is_still_an_auth_error(tmp_path: Path) -> None:
    token = tmp_path / "jwt"
    token.write_text("eyJhbGciOiJIUzI1NiJ9.e30.forged\n")
    client = RestSlurmClient(REST_URL, "slurm", token)
    try:
        with pytest.raises(SlurmAuthError, match="token"):
            await client.job(UNKNOWN_JOB_ID)
    finally:
        await client.close()


async def test_set_comment_shows_in_scontrol(backend: SlurmClient, jobs: Jobs) -> None:
    job_id = jobs.submit("-p", "native", "--wrap", "sleep 60")
    comment = f"slurm-k8s-bridge: contract {uuid.uuid4().hex[:8]}"

    await backend.set_comment(job_id, comment)

    assert jobs.comment(job_id) == comment


async def test_signal_job_reaches_the_batch_script(
    backend: SlurmClient, jobs: Jobs, sandbox: Sandbox
) -> None:
    script = 'trap "echo got-USR1; exit 0" USR1; echo ready; sleep 60 & wait'
    job_id = jobs.submit("-p", "native", "--wrap", script)
    out = sandbox.home("alice") / f"slurm-{job_id}.out"
    wait_until("the batch script's trap", lambda: out.exists() and "ready" in out.read_text(), 60)

    await backend.signal_job(job_id, "USR1")

    row = sandbox.wait_job_final(job_id, timeout=30)
    assert out.read_text() == "ready\ngot-USR1\n"
    assert (row["State"], row["ExitCode"]) == ("COMPLETED", "0:0")


async def test_signal_to_an_unknown_job_is_not_an_error(backend: SlurmClient) -> None:
    await backend.signal_job(UNKNOWN_JOB_ID, "USR1")


async def test_array_tasks_carry_their_array_job_and_task_ids(backend: SlurmClient, jobs: Jobs) -> None:
    array_id = jobs.submit("-p", "native", "-a", "0-2", "--wrap", "sleep 30")
    wait_until("three array tasks with records of their own", lambda: len(jobs.array_tasks(array_id)) == 3)
    tasks = jobs.array_tasks(array_id)
    assert sorted(tasks.values()) == [0, 1, 2]  # task 0 included: easy to lose as "unset"

    seen = {}
    for job_id in tasks:
        alloc = await backend.job(job_id)
        assert alloc is not None
        seen[job_id] = (alloc.array_job_id, alloc.array_task_id, alloc.is_array_task)

    assert seen == {job_id: (array_id, task, True) for job_id, task in tasks.items()}


@pytest.mark.parametrize(
    ("wrap", "cancel", "state"),
    [("exit 3", False, "FAILED"), ("true", False, "COMPLETED"), ("sleep 60", True, "CANCELLED")],
)
async def test_finished_job_keeps_its_final_state(
    backend: SlurmClient, jobs: Jobs, sandbox: Sandbox, wrap: str, cancel: bool, state: str
) -> None:
    job_id = jobs.submit("-p", "native", "--wrap", wrap)
    if cancel:
        jobs.wait_state(job_id)
        sandbox.slurm("scancel", str(job_id))
    assert sandbox.wait_job_final(job_id)["State"].split()[0] == state

    alloc = await wait_job(backend, job_id, "done completing", lambda a: "COMPLETING" not in a.state_flags)

    assert alloc.state == state
    assert jobs.state(job_id) == state
