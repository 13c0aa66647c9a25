"""Jobs for the contract tests, and what Slurm's own CLI says about them (the ground truth)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from bridge.core import gres, hostlist
from tests.e2e.sandbox import Sandbox, wait_until

# `scontrol -d show job` prints one line per allocated node:
#      Nodes=native1 CPU_IDs=1-2 Mem=700 GRES=gpu:2(IDX:1-2)
_DETAIL = re.compile(
    r"^\s*Nodes=(?P<nodes>\S+) CPU_IDs=(?P<cpus>\S+) Mem=(?P<mem>\d+) GRES=(?P<gres>\S*)", re.M
)


@dataclass
class Jobs:
    """Submits jobs as the test users and cancels whatever is left at the end of the test."""

    sandbox: Sandbox
    submitted: list[int] = field(default_factory=list)

    def submit(self, *args: str, user: str = "alice") -> int:
        job_id = self.sandbox.sbatch(*args, user=user)
        self.submitted.append(job_id)
        return job_id

    def cancel_all(self) -> None:
        if self.submitted:
            self.sandbox.slurm("scancel", *map(str, self.submitted), check=False)

    # -- ground truth from the CLI --------------------------------------
    def state(self, job_id: int) -> str:
        return self.field(job_id, "JobState")

    def field(self, job_id: int, name: str) -> str:
        """One `Key=value` of `scontrol show job` (values without spaces)."""
        out = self.sandbox.slurm("scontrol", "-o", "show", "job", str(job_id)).stdout
        m = re.search(rf"(?:^| ){re.escape(name)}=(\S*)", out)
        assert m, f"no {name}= in scontrol's view of job {job_id}: {out!r}"
        return m.group(1)

    def comment(self, job_id: int) -> str:
        out = self.sandbox.slurm("scontrol", "show", "job", str(job_id)).stdout
        m = re.search(r"^\s*Comment=(.*)$", out, re.M)
        return m.group(1) if m else ""

    def allocation(self, job_id: int) -> dict[str, tuple[int, int, tuple[int, ...]]]:
        """{node: (CPUs, memory MiB, GPU indices)} as `scontrol -d show job` reports them.

        CPUs are counted from CPU_IDs: the sandbox's nodes have one thread per core.
        """
        out = self.sandbox.slurm("scontrol", "-d", "show", "job", str(job_id)).stdout
        found = {}
        for m in _DETAIL.finditer(out):
            for node in hostlist.expand(m["nodes"]):
                found[node] = (_count_ids(m["cpus"]), int(m["mem"]), gres.gpu_indices(m["gres"]))
        return found

    def wait_state(self, *job_ids: int, state: str = "RUNNING", timeout: float = 60.0) -> None:
        for job_id in job_ids:
            wait_until(f"job {job_id} {state}", lambda j=job_id: self.state(j) == state, timeout)

    def array_tasks(self, array_id: int) -> dict[int, int]:
        """{job id: task id} of an array's tasks that have a job record of their own."""
        out = self.sandbox.slurm("squeue", "-h", "-r", "-j", str(array_id), "-o", "%A %K").stdout
        return {int(a): int(k) for a, k in (line.split() for line in out.splitlines())}

    def cluster_name(self) -> str:
        out = self.sandbox.slurm("scontrol", "show", "config").stdout
        m = re.search(r"^ClusterName\s*=\s*(\S+)", out, re.M)
        assert m, "no ClusterName in scontrol show config"
        return m.group(1)


def _count_ids(ids: str) -> int:
    """How many ids a Slurm id list such as `0-2,5` names."""
    count = 0
    for part in ids.split(","):
        first, _, last = part.partition("-")
        count += int(last or first) - int(first) + 1
    return count
