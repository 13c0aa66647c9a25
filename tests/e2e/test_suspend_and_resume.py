"""scontrol suspend / resume (issue 21): natively slurmstepd stops every process of the job and
continues it; a bridged job's processes are in its pods, and stop and continue there too. A job
that prints the time every second shows the suspension as a gap in both partitions; several
bridged jobs suspended at once all stop; a resume after a daemon restart (or kill -9) still continues
them; a job suspended while its pod is still starting stops once it has started, and stays stopped
until it is resumed."""

from __future__ import annotations

import functools
import itertools
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.sandbox import BRIDGE_UP, Sandbox, at_once, job_pods, job_trail, wait_until, write_script

TICKS = 15
"""Seconds a ticker ticks: suspended after its third, it still has a dozen to go."""
TICKER = (f"#!/bin/sh\n#K8S image=sandbox.local/busybox:1\n"
          f"for i in $(seq 1 {TICKS}); do date +%s; sleep 1; done\n")
SUSPENDED_S = 12
SANDBOX_STATE = Path("/var/lib/slurm-k8s-sandbox")


def _ticks(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split() if line.isdigit()] if path.exists() else []


def _largest_gap(ticks: list[int]) -> int:
    return max((b - a for a, b in itertools.pairwise(ticks)), default=0)


def _submit(bridge: Sandbox, partition: str, name: str) -> tuple[int, Path]:
    script = write_script(bridge, "alice", f"{name}.sh", TICKER)
    out = bridge.home("alice") / f"{name}.out"
    out.unlink(missing_ok=True)
    return bridge.sbatch("-p", partition, "-o", str(out), str(script)), out


def _ticking(out: Path) -> bool:
    return len(_ticks(out)) >= 3


def _ended(bridge: Sandbox, job_id: int) -> bool:
    return bridge.slurm("squeue", "-h", "-j", str(job_id), check=False).stdout.strip() == ""


def _suspend_round(
    bridge: Sandbox, jobs: list[tuple[int, Path]], between: Callable[[], None] | None = None
) -> None:
    for job_id, out in jobs:
        wait_until(f"job {job_id} ticking", functools.partial(_ticking, out), timeout=120)
    ids = ",".join(str(job_id) for job_id, _ in jobs)
    bridge.slurm("scontrol", "suspend", ids)
    time.sleep(SUSPENDED_S / 2)
    if between is not None:
        between()
    time.sleep(SUSPENDED_S / 2)
    bridge.slurm("scontrol", "resume", ids)
    for job_id, _ in jobs:
        wait_until(f"job {job_id} ended", functools.partial(_ended, bridge, job_id), timeout=120)


def _suspended_once(bridge: Sandbox, partition: str) -> int:
    """One ticker suspended and resumed in `partition`; the largest gap between its ticks."""
    job = _submit(bridge, partition, f"ticker-{partition}")
    _suspend_round(bridge, [job])
    ticks = _ticks(job[1])
    assert len(ticks) == TICKS, (partition, ticks)
    state = bridge.slurm("sacct", "-X", "-n", "-P", "-j", str(job[0]), "-o", "State,ExitCode").stdout
    assert state.strip() == "COMPLETED|0:0", (partition, state)
    return _largest_gap(ticks)


def test_a_suspended_job_stops_in_its_pod_as_natively(bridge: Sandbox) -> None:
    # Both partitions at once, each suspending only its own job: their nodes are apart.
    gaps = at_once({partition: functools.partial(_suspended_once, bridge, partition)
                    for partition in ("native", "k8s")})
    assert gaps["native"] >= SUSPENDED_S - 2, gaps
    assert gaps["k8s"] >= SUSPENDED_S - 2, gaps
    print(f"\nlargest gap while suspended {SUSPENDED_S}s: {gaps}")


@pytest.mark.parametrize("stop", ["restart", "kill -9"])
def test_several_bridged_jobs_suspended_at_once_and_resumed_across_a_daemon_restart(
    bridge: Sandbox, stop: str
) -> None:
    jobs = [_submit(bridge, "k8s", f"ticker-many-{n}") for n in range(3)]

    def restart_the_daemon() -> None:
        if stop == "kill -9":
            os.kill(int((SANDBOX_STATE / "run" / "bridge.pid").read_text()), signal.SIGKILL)
        else:
            subprocess.run([str(BRIDGE_UP.with_name("down.sh"))], check=True, capture_output=True)
        subprocess.run([str(BRIDGE_UP)], check=True, capture_output=True)

    _suspend_round(bridge, jobs, between=restart_the_daemon)
    for job_id, out in jobs:
        ticks = _ticks(out)
        assert len(ticks) == TICKS and _largest_gap(ticks) >= SUSPENDED_S - 2, (job_id, ticks)


def _running(bridge: Sandbox, job_id: int) -> bool:
    state = bridge.slurm("squeue", "-h", "-j", str(job_id), "-o", "%T", check=False).stdout.strip()
    return state == "RUNNING"


def _started(bridge: Sandbox, job_id: int) -> bool:
    pods = job_pods(bridge, job_id)
    return bool(pods) and all(
        "running" in (status.get("state") or {})
        for pod in pods for status in pod.get("status", {}).get("containerStatuses") or [{}]
    )


def _has_pods(bridge: Sandbox, job_id: int) -> bool:
    return bool(job_pods(bridge, job_id))


@pytest.mark.parametrize(("partitions", "when"),
                         [(("native", "k8s"), "running"), (("k8s",), "pods made")],
                         ids=["native+k8s-running", "k8s-pods made"])
def test_jobs_suspended_before_their_pods_start_stop_once_they_have(
    bridge: Sandbox, partitions: tuple[str, ...], when: str
) -> None:
    """Suspended as soon as Slurm says RUNNING (the waiter may not have attached: no pod is made
    until the resume), or once the pods exist and have not started yet (the stop reaches each one
    once its container runs, the reconciler's next pass). The native and the bridged case run at
    once, each suspending its own jobs on its own nodes."""
    at_once({partition: functools.partial(_suspend_early, bridge, partition, when)
             for partition in partitions})


def _suspend_early(bridge: Sandbox, partition: str, when: str) -> None:
    jobs = [_submit(bridge, partition, f"ticker-early-{partition}-{when[0]}{n}") for n in range(3)]
    ids = ",".join(str(job_id) for job_id, _ in jobs)
    ready = _running if when == "running" else _has_pods
    for job_id, _ in jobs:
        wait_until(f"job {job_id} {when}", functools.partial(ready, bridge, job_id), timeout=120,
                   interval=0.05)
    bridge.slurm("scontrol", "suspend", ids)
    suspended = started = time.time()
    # The latest time a pod's container was first seen running while the job was suspended.
    deadline = suspended + SUSPENDED_S
    seen: set[int] = set()
    while time.time() < deadline:
        for job_id, _ in jobs:
            if partition == "k8s" and job_id not in seen and _started(bridge, job_id):
                seen.add(job_id)
                started = time.time()
        time.sleep(0.2)
    resumed = time.time()
    bridge.slurm("scontrol", "resume", ids)
    for job_id, out in jobs:
        wait_until(f"job {job_id} ended", functools.partial(_ended, bridge, job_id), timeout=120)
        state = bridge.slurm("sacct", "-X", "-n", "-P", "-j", str(job_id), "-o", "State,ExitCode").stdout
        assert state.strip() == "COMPLETED|0:0", (partition, job_id, state)
        ticks = _ticks(out)
        assert len(ticks) == TICKS, (partition, job_id, ticks)
        # From a few seconds after the last pod started (or the suspend) until the resume, nothing
        # ran. The output's own clock says so (the waiter, suspended on the slurmd host, writes the
        # lines only after the resume).
        while_suspended = [tick for tick in ticks if max(started, suspended) + 3 <= tick < resumed - 1]
        assert while_suspended == [], (partition, job_id, started, resumed, ticks, job_trail(job_id))
    print(f"\n{partition}, suspended when {when}: pods started while suspended: {len(seen)} of {len(jobs)}")
