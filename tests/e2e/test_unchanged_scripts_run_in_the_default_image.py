"""A researcher's script as it is, with no `#K8S` line, in a bridged partition that has a default
image (the sandbox's k8s: sandbox.local/debian-python:12): a bash script, an array of it, `sbatch
--wrap` and a bare `srun` without SLURM_K8S_IMAGE run as they do in `native`, side by side and at
the same time, and give the same bytes and sacct rows."""

from __future__ import annotations

import functools
import os
import pwd
import re
import subprocess

import pytest

from tests.e2e.sandbox import Sandbox, at_once, wait_until, write_script

pytestmark = pytest.mark.shares_the_cluster

# No #K8S line: only what a native script has. bash's own features, coreutils, the array's
# variables and an exit code; the host name is left out (native1 against kreal1).
SCRIPT = """#!/bin/bash
#SBATCH --time=5
declare -A seen=([task]="$SLURM_ARRAY_TASK_ID" [count]="$SLURM_ARRAY_TASK_COUNT")
printf '%s=%s\\n' task "${seen[task]}" count "${seen[count]}"
echo "bash ${BASH_VERSINFO[0]}, $(( $(seq 3 | paste -sd+) ))"
echo "to stderr" >&2
exit $(( SLURM_ARRAY_TASK_ID + 3 ))
"""
TASKS = 4


def _run(bridge: Sandbox, partition: str, directory: str, script: str) -> tuple[int, int]:
    files = f"{directory}/%x-{partition}-%a"
    array = bridge.sbatch("-p", partition, f"--array=0-{TASKS - 1}", "-J", "plain",
                          "-o", f"{files}.out", "-e", f"{files}.err", script)
    wrapped = bridge.sbatch("-p", partition, "-o", f"{directory}/wrap-{partition}.out",
                            "--wrap", "echo wrapped $SLURM_JOB_NAME; ls /proc/self >/dev/null && exit 5")
    return array, wrapped


def _final_rows(bridge: Sandbox, job_id: int, count: int) -> list[tuple[str, str]] | None:
    out = bridge.slurm("sacct", "-X", "-n", "-P", "-j", str(job_id), "-o", "JobID,State,ExitCode").stdout
    rows = [line.split("|") for line in out.splitlines() if line]
    if len(rows) != count or any(state in ("PENDING", "RUNNING", "REQUEUED") for _, state, _ in rows):
        return None
    return sorted((re.sub(r"^\d+", "N", job), f"{state.split()[0]} {code}") for job, state, code in rows)


def test_a_plain_bash_script_its_array_and_wrap_run_as_natively(bridge: Sandbox) -> None:
    directory = bridge.home("alice") / "plain-scripts"
    directory.mkdir(exist_ok=True)
    owner = pwd.getpwnam("alice")
    os.chown(directory, owner.pw_uid, owner.pw_gid)
    script = str(write_script(bridge, "alice", "plain.sh", SCRIPT))

    jobs = at_once({p: functools.partial(_run, bridge, p, str(directory), script) for p in ("native", "k8s")})
    rows = {}
    for partition, (array, wrapped) in jobs.items():
        rows[partition] = tuple(
            wait_until(f"{partition} job {job}", functools.partial(_final_rows, bridge, job, n), timeout=240)
            for job, n in ((array, TASKS), (wrapped, 1)))

    assert rows["native"][0] == [(f"N_{t}", f"FAILED {t + 3}:0") for t in range(TASKS)], rows["native"]
    assert rows["native"][1] == [("N", "FAILED 5:0")], rows["native"]
    assert rows["k8s"] == rows["native"]
    for task in range(TASKS):
        for stream in ("out", "err"):
            native = (directory / f"plain-native-{task}.{stream}").read_bytes()
            bridged = (directory / f"plain-k8s-{task}.{stream}").read_bytes()
            assert bridged == native, (task, stream, bridged, native)
    assert (directory / "plain-native-2.out").read_text().startswith("task=2\ncount=4\nbash 5, ")
    assert (directory / "plain-native-2.out").read_text().endswith(", 6\n")
    wrapped = {p: (directory / f"wrap-{p}.out").read_bytes() for p in ("native", "k8s")}
    assert wrapped["k8s"] == wrapped["native"] == b"wrapped wrap\n"


def test_a_bare_srun_without_an_image_runs_in_the_default_one_as_natively(bridge: Sandbox) -> None:
    """What a researcher types, with nothing exported: the allocation takes the partition's image."""
    env = {key: value for key, value in bridge.environ().items() if key != "SLURM_K8S_IMAGE"}

    def srun(partition: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["runuser", "-u", "alice", "--", "srun", "-p", partition, "-N2", "-l", "bash", "-c",
             'echo "rank $SLURM_PROCID of $SLURM_NTASKS, bash ${BASH_VERSINFO[0]}"; exit $SLURM_PROCID'],
            env=env, cwd=str(bridge.home("alice")), capture_output=True, text=True, timeout=180)

    done = at_once({p: functools.partial(srun, p) for p in ("native", "k8s")})

    expected = {"0: rank 0 of 2, bash 5", "1: rank 1 of 2, bash 5"}
    for partition, result in done.items():
        assert set(result.stdout.splitlines()) == expected, (partition, result.stdout, result.stderr)
    assert done["k8s"].returncode == done["native"].returncode == 1

