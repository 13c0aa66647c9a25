"""Issue 10: an MPI program across the two real nodes. Open MPI's mpirun (Debian's, in the
sandbox's debian-mpi image) starts one daemon per node with srun, the bridge's step launcher in
the pod, so the daemons are a real Slurm step; they start the ranks in their pods, and the ranks
talk over TCP, pod to pod. Two such jobs run at once (each has its own step and relays)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.e2e.sandbox import Sandbox, wait_until, write_script

# Not beside other tests: on the loaded two-core VM, Open MPI 4.1's TCP connect between the ranks
# once failed (its "Operation now in progress (115)", a misreported timeout) and the job hung
# with both real nodes (CI, beside two other workers' tests); the job it ran with passed.
pytestmark = [pytest.mark.e2e]

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "mpi_hello.sh"


def test_mpi_hello_world_runs_a_rank_on_each_node_and_they_talk(bridge: Sandbox) -> None:
    script = write_script(bridge, "alice", "mpi_hello.sh", EXAMPLE.read_text())
    # A time limit: a hung MPI job must not hold the real nodes for the tests after this one.
    jobs = [bridge.sbatch("-p", "k8s", "--time=4", "-o", "mpi-%j.out", str(script)) for _ in range(2)]

    for job in jobs:
        row = bridge.wait_job_final(job, timeout=300)
        out = (bridge.home("alice") / f"mpi-{job}.out").read_text()
        assert row["State"] == "COMPLETED", out
        ranks = sorted(re.findall(r"^rank (\d) of 2: sum of ranks 1, 2 hosts$", out, flags=re.M))
        assert ranks == ["0", "1"], out
        assert out.rstrip().endswith("mpirun said 0"), out
        steps = wait_until(f"job {job}'s steps in sacct", lambda j=job: _steps(bridge, j), timeout=60)
        # mpirun's daemon for the other node (mpirun serves its own): one real step, ended well.
        assert steps == [(f"{job}.0", "COMPLETED", "0:0", "1")], steps


def _steps(bridge: Sandbox, job: int) -> list[tuple[str, ...]] | None:
    out = bridge.slurm("sacct", "-n", "-P", "-j", str(job), "-o", "JobID,State,ExitCode,NTasks").stdout
    rows = [tuple(line.split("|")) for line in out.splitlines()]
    steps = [row for row in rows if re.fullmatch(rf"{job}\.\d+", row[0])]
    return steps if steps and all(row[1] not in ("RUNNING", "PENDING") for row in steps) else None
