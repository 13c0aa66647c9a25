"""scontrol suspend / resume (issue 21): natively slurmstepd stops every process of the job and
continues it; a bridged job's processes are in its pods, and stop and continue there too. A job
that prints the time every second shows the suspension as a gap in both partitions; several
bridged jobs suspended at once all stop; a resume after a daemon restart still continues them."""

from __future__ import annotations

import functools
import itertools
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from tests.e2e.sandbox import BRIDGE_UP, Sandbox, wait_until, write_script

TICKER = "#!/bin/sh\n#K8S image=sandbox.local/busybox:1\nfor i in $(seq 1 25); do date +%s; sleep 1; done\n"
SUSPENDED_S = 12


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


def test_a_suspended_job_stops_in_its_pod_as_natively(bridge: Sandbox) -> None:
    gaps = {}
    for partition in ("native", "k8s"):
        job = _submit(bridge, partition, f"ticker-{partition}")
        _suspend_round(bridge, [job])
        ticks = _ticks(job[1])
        assert len(ticks) == 25, (partition, ticks)
        gaps[partition] = _largest_gap(ticks)
        state = bridge.slurm("sacct", "-X", "-n", "-P", "-j", str(job[0]), "-o", "State,ExitCode").stdout
        assert state.strip() == "COMPLETED|0:0", (partition, state)
    assert gaps["native"] >= SUSPENDED_S - 2, gaps
    assert gaps["k8s"] >= SUSPENDED_S - 2, gaps
    print(f"\nlargest gap while suspended {SUSPENDED_S}s: {gaps}")


def test_several_bridged_jobs_suspended_at_once_and_resumed_across_a_daemon_restart(bridge: Sandbox) -> None:
    jobs = [_submit(bridge, "k8s", f"ticker-many-{n}") for n in range(3)]

    def restart_the_daemon() -> None:
        subprocess.run([str(BRIDGE_UP.with_name("down.sh"))], check=True, capture_output=True)
        subprocess.run([str(BRIDGE_UP)], check=True, capture_output=True)

    _suspend_round(bridge, jobs, between=restart_the_daemon)
    for job_id, out in jobs:
        ticks = _ticks(out)
        assert len(ticks) == 25 and _largest_gap(ticks) >= SUSPENDED_S - 2, (job_id, ticks)
