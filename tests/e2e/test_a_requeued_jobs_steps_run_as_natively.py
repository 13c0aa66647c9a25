"""A requeued job's script runs its srun steps in its second run as in its first, as natively: an
array's tasks requeue themselves from inside the job (`scontrol requeue`, as submitit's checkpointing
does), and their second run's srun prints SLURM_RESTART_COUNT from its task. Before the fix, each
such srun in `k8s` was refused by the SPANK guard as a user's hand-made step (its token was checked
against Slurm's step restart count, always 0 there) and ended 2 with an execve error."""

from __future__ import annotations

import functools
import os
import pwd
import re

from tests.e2e.sandbox import Sandbox, at_once, wait_until, write_script

# Alone: compared with native Slurm's own signal races, which other tests' load makes vary
# (in a CI run beside others, native's runs of the same job disagreed).

TASKS = 3
# slurmstepd's own line in the job's file as the requeue ends its first run: the job, node and time
# differ between the two partitions, the line must be there in both.
REQUEUE_LINE = re.compile(
    r"^\[[\d\-T:.]+\] error: \*\*\* JOB \d+ ON \S+ CANCELLED AT \S+ DUE TO JOB REQUEUE \*\*\*$", re.MULTILINE)
SCRIPT = """#!/bin/bash
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --time=5
echo "run ${SLURM_RESTART_COUNT:-0}"
if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then
  scontrol requeue "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"
  # exec: natively the shell waiting on a child sometimes outlived the requeue's TERM (bash said
  # "Terminated", went on, and its srun found the job pending): the shell is not what is compared.
  exec sleep 120
fi
srun -n1 bash -c 'echo "step of run $SLURM_RESTART_COUNT"'
echo "srun said $?"
"""


def _submit(bridge: Sandbox, partition: str, directory: str, script: str) -> int:
    return bridge.sbatch("-p", partition, f"--array=0-{TASKS - 1}", "-o", f"{directory}/{partition}-%a.out",
                         "-D", directory, script)


def _rows(bridge: Sandbox, job_id: int) -> list[str] | None:
    """Each task's State|ExitCode once every task is final (sacct's last record of each)."""
    out = bridge.slurm("sacct", "-X", "-n", "-P", "-j", str(job_id), "-o", "JobID,State,ExitCode",
                       check=False).stdout
    rows = sorted(line for line in out.splitlines() if "_" in line.split("|")[0])
    unfinished = ("RUNNING", "PENDING", "REQUEUED")
    if len(rows) != TASKS or any(state in row for row in rows for state in unfinished):
        return None
    return [row.partition("|")[2] for row in rows]


def test_a_requeued_jobs_srun_runs_in_its_second_run_as_natively(bridge: Sandbox) -> None:
    alice = pwd.getpwnam("alice")
    directory = bridge.home("alice") / "requeued-steps"
    directory.mkdir(exist_ok=True)
    os.chown(directory, alice.pw_uid, alice.pw_gid)
    for old in directory.glob("*.out"):
        old.unlink()
    script = str(write_script(bridge, "alice", "requeue-self.sh", SCRIPT))

    submit = functools.partial(_submit, bridge, directory=str(directory), script=script)
    jobs = at_once({p: functools.partial(submit, partition=p) for p in ("native", "k8s")})
    for partition, job_id in jobs.items():
        rows = wait_until(f"{partition} array run twice", functools.partial(_rows, bridge, job_id),
                          timeout=300)
        said = (directory / f"{partition}-0.out").read_text()
        assert rows == ["COMPLETED|0:0"] * TASKS, (partition, rows, said)
    for task in range(TASKS):
        native = REQUEUE_LINE.sub("<requeued>", (directory / f"native-{task}.out").read_text())
        bridged = REQUEUE_LINE.sub("<requeued>", (directory / f"k8s-{task}.out").read_text())
        assert native == "run 0\n<requeued>\nrun 1\nstep of run 1\nsrun said 0\n", native
        assert bridged == native, (task, bridged)
