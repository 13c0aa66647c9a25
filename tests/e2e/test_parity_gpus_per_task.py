"""GPUs per task and per step (issue 21), side by side in `native` and `k8s`: `--gpus-per-task=1`
with -n 2 and -n 4 on a 4-GPU node, `--gres=gpu:1` for one step of a 2-GPU job and `--gres=none`
for another; several jobs at once, so GPUs other than 0..n-1 get used too.

Natively (no ConstrainDevices in the sandbox) a task's CUDA_VISIBLE_DEVICES names physical GPUs; in
a pod only the job's GPUs exist, numbered from 0 in the order of SLURM_JOB_GPUS. Both are compared
as places in the job's SLURM_JOB_GPUS, which is what a program's device ordinal means in each."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.e2e.sandbox import Sandbox, job_trail, wait_until, write_script
from tests.e2e.test_parity_output_and_signals import _sacct

pytestmark = pytest.mark.e2e

PER_TASK = r"""#!/bin/sh
#K8S image=sandbox.local/busybox:1
echo "job $SLURM_JOB_GPUS"
srun -l sh -c 'echo "task $SLURM_PROCID cuda=$CUDA_VISIBLE_DEVICES" \
  "ordinal=$GPU_DEVICE_ORDINAL step=$SLURM_STEP_GPUS"' | sort
"""

PER_STEP = r"""#!/bin/sh
#K8S image=sandbox.local/busybox:1
echo "job $SLURM_JOB_GPUS"
echo "batch cuda=$CUDA_VISIBLE_DEVICES"
srun -n1 --gres=gpu:1 sh -c 'echo "one cuda=$CUDA_VISIBLE_DEVICES step=$SLURM_STEP_GPUS"'
srun -n1 sh -c 'echo "all cuda=$CUDA_VISIBLE_DEVICES step=$SLURM_STEP_GPUS"'
srun -n1 --gres=none sh -c 'echo "none cuda=${CUDA_VISIBLE_DEVICES-unset} step=${SLURM_STEP_GPUS-unset}"'
"""

CASES = [
    ("per-task-2", PER_TASK, ("-N1", "-n2", "--gpus-per-task=1")),
    ("per-task-4", PER_TASK, ("-N1", "-n4", "--gpus-per-task=1")),
    ("per-step", PER_STEP, ("-N1", "-n1", "--gres=gpu:2")),
]


def _normalise(text: str, partition: str) -> str:
    """Lists to places; in `k8s` cuda=/ordinal= are already places, natively physical."""
    job = re.search(r"^job (\S*)$", text, re.M)
    assert job, f"no job line in {text!r}"
    physical = job.group(1).split(",")

    def place(match: re.Match[str]) -> str:
        name, value = match.group(1), match.group(2)
        if value in ("", "unset"):
            return match.group(0)
        already = partition != "native" and name in ("cuda", "ordinal")
        places = value.split(",") if already else [
            str(physical.index(v)) if v in physical else f"?{v}" for v in value.split(",")]
        return f"{name}=" + ",".join(places)

    text = re.sub(r"\b(cuda|ordinal|step)=(\S*)", place, text)
    return text.replace(f"job {job.group(1)}", f"job x{len(physical)}")


def _submit(sandbox: Sandbox, partition: str, copies: int) -> list[tuple[str, int, Path]]:
    jobs = []
    for name, body, options in CASES:
        script = write_script(sandbox, "alice", f"gpus-{name}-{partition}.sh", body)
        for copy in range(copies):
            out = sandbox.home("alice") / f"gpus-{name}-{partition}-{copy}.out"
            job_id = sandbox.sbatch("-p", partition, *options, "-o", str(out), str(script))
            jobs.append((name, job_id, out))
    return jobs


def _results(sandbox: Sandbox, partition: str, jobs: list[tuple[str, int, Path]]) -> dict[str, set[str]]:
    """Each case's normalised outputs (a set: copies of a case print the same) and sacct rows."""
    results: dict[str, set[str]] = {}
    for name, job_id, out in jobs:
        rows = wait_until(f"{partition} job {job_id} ({name}) and its steps in sacct",
                          lambda job_id=job_id: _sacct(sandbox, job_id), timeout=240)
        text = out.read_text(errors="replace")
        assert "error" not in text, f"{partition} {name}: {text}\n{job_trail(job_id)}"
        results.setdefault(name, set()).add(_normalise(text, partition) + "\n" + repr(rows))
    return results


def _side_by_side(bridge: Sandbox, copies: int, partition: str = "k8s") -> dict[str, set[str]]:
    """Each case, `copies` times in each partition at once: native's results, once `partition`'s match."""
    native = _submit(bridge, "native", copies)
    bridged = _submit(bridge, partition, copies)
    expected = _results(bridge, "native", native)
    got = _results(bridge, partition, bridged)
    for name in expected:
        assert len(expected[name]) == 1, f"native {name} differs between copies: {expected[name]}"
        assert got[name] == expected[name], f"{name}: {partition} {got[name]} != native {expected[name]}"
    return expected


def test_each_task_sees_the_gpus_slurm_gave_it_as_natively(bridge: Sandbox) -> None:
    expected = _side_by_side(bridge, 1)
    # What the comparison rests on: each rank its own GPU, and none for --gres=none.
    per_task = next(iter(expected["per-task-4"]))
    assert "3: task 3 cuda=3 ordinal=3 step=3" in per_task, per_task
    assert "none cuda=unset step=unset" in next(iter(expected["per-step"]))


def test_several_gpu_jobs_at_once_each_task_its_own(bridge: Sandbox) -> None:
    # Three copies of each case in each partition: 8 GPUs per partition, so jobs wait for GPUs and
    # get physical GPUs other than 0..n-1; places in the job's list still match.
    _side_by_side(bridge, 3)
