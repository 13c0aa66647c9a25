"""The soft resource limits and the umask of the submitting shell reach a bridged job's script and
its srun tasks as slurmstepd gives them to a native job (PropagateResourceLimits, SLURM_UMASK):
`ulimit -a`, `umask` and the mode of a file the job makes are the same in `native` and `k8s`, for
an array's tasks at once; and the SLURM_RLIMIT_* variables are gone from the job's environment.
What the script itself sets before an srun reaches that step's tasks, as srun propagates its own
(and only what its --propagate names)."""

from __future__ import annotations

import functools
import os
import pwd
import shlex
import subprocess

import pytest

from tests.e2e.sandbox import Sandbox, at_once, wait_until, write_script

pytestmark = pytest.mark.shares_the_cluster

SCRIPT = """#!/bin/bash
#SBATCH --time=5
ulimit -a
umask
env | grep -c '^SLURM_RLIMIT_'
made="made-$SLURM_ARRAY_TASK_ID-$SLURM_JOB_PARTITION"; : > "$made"; stat -c %a "$made"
srun -n1 bash -c 'echo "step: $(ulimit -S -n) $(ulimit -S -s) $(ulimit -S -c) $(umask)"'
# What the script sets before its srun reaches the step's tasks, as srun propagates its own.
ulimit -S -n 256 && ulimit -S -s 2048 && ulimit -S -c 1000 && umask 077
srun -n1 bash -c 'echo "changed: $(ulimit -S -n) $(ulimit -S -s) $(ulimit -S -c) $(umask)"'
(ulimit -S -n 300; srun --propagate=NOFILE -n1 bash -c 'echo "propagate=NOFILE: $(ulimit -S -n) $(umask)"')
"""
TASKS = 3
# What the submitting shell sets: each differs from the sandbox's defaults.
SHELL_SETTINGS = "ulimit -S -n 512 && ulimit -S -s 4096 && ulimit -S -c 0 && ulimit -S -u 2000 && umask 027"


def _submit(bridge: Sandbox, partition: str, directory: str, script: str) -> int:
    sbatch = shlex.join(["sbatch", "--parsable", "-p", partition, f"--array=0-{TASKS - 1}",
                         "-o", f"{directory}/{partition}-%a.out", "-D", directory, script])
    out = subprocess.run(["runuser", "-u", "alice", "--", "bash", "-c", f"{SHELL_SETTINGS} && {sbatch}"],
                         env=bridge.environ(), cwd=directory, capture_output=True, text=True, check=True,
                         timeout=60).stdout
    return int(out.strip().split(";")[0])


def test_ulimit_umask_and_a_made_files_mode_are_the_submitting_shells_as_natively(bridge: Sandbox) -> None:
    alice = pwd.getpwnam("alice")
    directory = bridge.home("alice") / "limits"
    directory.mkdir(exist_ok=True)
    os.chown(directory, alice.pw_uid, alice.pw_gid)
    script = str(write_script(bridge, "alice", "limits.sh", SCRIPT))

    submit = functools.partial(_submit, bridge, directory=str(directory), script=script)
    jobs = at_once({p: functools.partial(submit, partition=p) for p in ("native", "k8s")})
    for partition, job_id in jobs.items():
        done = functools.partial(bridge.array_rows, job_id, TASKS)
        rows = wait_until(f"{partition} array", done, timeout=240)
        said = (directory / f"{partition}-0.out").read_text()
        assert rows == ["COMPLETED|0:0"] * TASKS, (partition, rows, said)

    native = (directory / "native-0.out").read_text()
    lines = native.splitlines()
    assert "open files                          (-n) 512" in lines and "0027" in lines, native
    assert lines[-5:] == ["0", "640", "step: 512 4096 0 0027", "changed: 256 2048 1000 0077",
                          "propagate=NOFILE: 300 0077"], native
    for task in range(TASKS):
        bridged = (directory / f"k8s-{task}.out").read_text()
        assert bridged == (directory / f"native-{task}.out").read_text(), (task, bridged)
