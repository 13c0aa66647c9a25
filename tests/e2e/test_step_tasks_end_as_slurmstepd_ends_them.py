"""A step's tasks end as their slurmstepd ends them, not with the batch script: on scancel a task
gets SIGTERM and KillWait to finish (its TERM trap runs and it ends with the code it chose), as
natively: the same lines (srun's and
slurmstepd's too: the script's srun got one TERM, not a second one back from the pod) and the
same sacct rows. Before the fix the pod's agent exited with the script and the kernel killed every
task at once (no trap, sacct's step CANCELLED 0:9). Jobs in both partitions at once, several of
each."""

from __future__ import annotations

import functools
import os
import pwd
import time
from collections.abc import Callable
from pathlib import Path

from tests.e2e.sandbox import (
    Sandbox,
    at_once,
    cancelled_lines_alike,
    wait_until,
    within_natives_span,
    write_script,
)

# Alone: compared with native Slurm's own signal races, which other tests' load makes vary
# (in a CI run beside others, native's runs of the same job disagreed).

JOBS = 3
# The task traps TERM, says so, and ends 3 two seconds later (KillWait is 10 s on the sandbox).
TASK = ("python3 -c 'import signal, sys, time\n"
        "def term(*_):\n    print(\"task got TERM\", flush=True); time.sleep(2)\n"
        "    print(\"task ends\", flush=True); sys.exit(3)\n"
        "signal.signal(signal.SIGTERM, term)\nprint(\"task runs\", flush=True)\ntime.sleep(300)'")
CANCELLED = f"#!/bin/bash\n#SBATCH --time=5\nsrun -n1 {TASK}\necho 'srun said' $?\n"


def _steps(bridge: Sandbox, job_id: int) -> list[str] | None:
    """The job's and its steps' State|ExitCode once each has ended (a step of a cancelled job shows
    CANCELLED 0:0 until its slurmstepd reports how it ended)."""
    out = bridge.slurm("sacct", "-n", "-P", "-j", str(job_id), "-o", "JobID,State,ExitCode,End",
                       check=False).stdout
    rows = [line.replace(str(job_id), "J", 1).rpartition("|") for line in out.splitlines()]
    if len(rows) < 3 or any(end in ("", "Unknown") for _, _, end in rows):
        return None
    return sorted(row for row, _, _ in rows)


_last_seen: dict[int, list[str]] = {}


def _settled(bridge: Sandbox, job_id: int, output: Callable[[], str]) -> list[str] | None:
    """_steps once srun wrote its last line (how the task ended) and two looks 1.5 s apart agree:
    slurmctld records a cancelled step's end before its slurmstepd reports how it ended."""
    if "srun: error:" not in output():
        return None
    rows = _steps(bridge, job_id)
    before, _last_seen[job_id] = _last_seen.get(job_id), rows or []
    return rows if rows and rows == before else None


def _run(bridge: Sandbox, directory: str, script: str, partition: str) -> list[int]:
    jobs = [bridge.sbatch("-p", partition, "-o", f"{directory}/{partition}-%j.out", "-D", directory, script)
            for _ in range(JOBS)]
    for job_id in jobs:
        wait_until(f"job {job_id}'s task to run",
                   lambda j=job_id: "task runs" in _output(directory, partition, j), timeout=120)
    for job_id in jobs:
        bridge.slurm("scancel", str(job_id), user="alice")
    return jobs


def _output(directory: str, partition: str, job_id: int) -> str:
    path = Path(directory) / f"{partition}-{job_id}.out"
    return path.read_text() if path.exists() else ""


def test_scancel_gives_a_steps_task_its_term_and_kill_wait_as_natively(bridge: Sandbox) -> None:
    name, body = "cancelled-step", CANCELLED
    alice = pwd.getpwnam("alice")
    directory = bridge.home("alice") / f"{name}-{int(time.time())}"
    directory.mkdir()
    os.chown(directory, alice.pw_uid, alice.pw_gid)
    script = str(write_script(bridge, "alice", f"{name}.sh", body))
    run = functools.partial(_run, bridge, str(directory), script)
    jobs = at_once({p: functools.partial(run, partition=p) for p in ("native", "k8s")})
    seen = {}
    for partition, ids in jobs.items():
        for job_id in ids:
            output = functools.partial(_output, str(directory), partition, job_id)
            settled = functools.partial(_settled, bridge, job_id, output)
            rows = wait_until(f"{partition} job {job_id} over", settled, timeout=120, interval=1.5)
            seen[partition, job_id] = (rows, cancelled_lines_alike(output()))
    native = [seen["native", job_id] for job_id in jobs["native"]]
    assert all("task got TERM" in case[1] for case in native), native
    for job_id in jobs["k8s"]:
        assert within_natives_span(seen["k8s", job_id], native), (job_id, seen["k8s", job_id], native)
