"""Preemption (issue 21): the sandbox's PreemptType=preempt/qos lets a `high` job take a running job's
GPUs. A `normal` job is requeued: its pods get their grace and go, the preemptor runs on its GPUs,
and the preempted job runs again in fresh pods and ends as its second run says. A `suspendable`
job is suspended until the preemptor ends, then goes on. Each side by side in `native` and `k8s`,
and two jobs preempted by one two-node job at once."""

from __future__ import annotations

import itertools
import re
import time
from pathlib import Path

import pytest

from tests.e2e.sandbox import Sandbox, job_pods, job_trail, wait_until, write_script

pytestmark = pytest.mark.e2e

NODES = {"native": ("native1", "native2"), "k8s": ("kreal1", "kreal2")}
BUSYBOX = "#!/bin/sh\n#K8S image=sandbox.local/busybox:1\n"
LOW = BUSYBOX + (
    'echo "run ${SLURM_RESTART_COUNT:-0} on $SLURMD_NODENAME"\n'
    '[ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] || sleep 300\n'
    "exit 7\n"
)
"""Its first run waits to be preempted; the run after the requeue ends with 7."""
HIGH = BUSYBOX + 'echo "high on $SLURMD_NODENAME with $SLURM_JOB_GPUS"\nsleep 4\n'
TICKER = BUSYBOX + "for i in $(seq 1 30); do date +%s; sleep 1; done\n"
HIGH_FOR = 10
"""Seconds the preemptor of a suspendable job runs (its pause in the ticker)."""


Runs = list[tuple[str, str]]
"""(State, ExitCode) of each run of a job, as sacct -D lists them."""


def _state(sandbox: Sandbox, job_id: int) -> str:
    return sandbox.slurm("squeue", "-h", "-j", str(job_id), "-o", "%T", check=False).stdout.strip()


def _runs(sandbox: Sandbox, job_id: int) -> Runs | None:
    """(State, ExitCode) of each run of the job (sacct -D), once the last one is final."""
    out = sandbox.slurm("sacct", "-D", "-X", "-n", "-P", "-j", str(job_id), "-o", "State,ExitCode",
                        check=False).stdout
    rows = [tuple(line.split("|")) for line in out.splitlines() if line]
    if not rows or rows[-1][0] in ("PENDING", "RUNNING", "REQUEUED", "SUSPENDED", "PREEMPTED"):
        return None
    return [(state.split()[0], code) for state, code in rows]


def _normalise(text: str) -> str:
    return re.sub(r"\b(native|kreal)([0-9])\b", r"NODE\2", text)


def _first_run_pods(sandbox: Sandbox, job_id: int) -> list[str]:
    names = [pod["metadata"]["name"] for pod in job_pods(sandbox, job_id)]
    return [name for name in names if name.startswith(f"slurm-{job_id}-") and "-r" not in name]


def _preempt_requeued(sandbox: Sandbox, partition: str, nodes: int) -> tuple[list[Runs], str]:
    """`nodes` normal jobs, one per node holding all its GPUs, preempted by one high job on those
    nodes; each preempted job's runs and the outputs (normalised)."""
    low = write_script(sandbox, "alice", f"preempt-low-{partition}.sh", LOW)
    high = write_script(sandbox, "alice", f"preempt-high-{partition}.sh", HIGH)
    targets = NODES[partition][:nodes]
    lows = []
    for node in targets:
        out = sandbox.home("alice") / f"preempt-low-{partition}-{node}.out"
        out.unlink(missing_ok=True)
        job_id = sandbox.sbatch("-p", partition, "--requeue", "--open-mode=append", "-w", node,
                                "--gres=gpu:4", "-o", str(out), str(low))
        lows.append((job_id, out))
    for job_id, out in lows:
        wait_until(f"{partition} job {job_id} running its first run",
                   lambda job_id=job_id, out=out: _state(sandbox, job_id) == "RUNNING" and "run 0" in (
                       out.read_text() if out.exists() else ""), timeout=120)
    high_out = sandbox.home("alice") / f"preempt-high-{partition}.out"
    high_out.unlink(missing_ok=True)
    high_id = sandbox.sbatch("-p", partition, "--qos=high", "-N", str(nodes), "-w", ",".join(targets),
                             "--gres=gpu:4", "-o", str(high_out), str(high))
    if partition != "native":
        # The preemptor runs on the GPUs the preempted pods held: none of them is left by then.
        wait_until(f"high job {high_id} running", lambda: "high on" in (
            high_out.read_text() if high_out.exists() else ""), timeout=120)
        for job_id, _ in lows:
            assert _first_run_pods(sandbox, job_id) == [], f"first-run pods of {job_id} beside the preemptor"
    high_runs = wait_until(f"{partition} high job {high_id}", lambda: _runs(sandbox, high_id), timeout=180)
    assert high_runs == [("COMPLETED", "0:0")], f"{high_runs}\n{job_trail(high_id)}"
    runs = []
    for job_id, _ in lows:
        got = wait_until(f"{partition} preempted job {job_id} to end its second run",
                         lambda job_id=job_id: _runs(sandbox, job_id), timeout=240)
        runs.append(got)
        if partition != "native":
            wait_until(f"job {job_id}'s pods gone", lambda job_id=job_id: not job_pods(sandbox, job_id),
                       timeout=60)
    outputs = "".join(_normalise(out.read_text()) for _, out in lows)
    return runs, outputs + _normalise(high_out.read_text())


def test_a_preempted_job_gives_its_gpus_back_requeues_and_reruns_as_natively(bridge: Sandbox) -> None:
    native_runs, native_out = _preempt_requeued(bridge, "native", 1)
    k8s_runs, k8s_out = _preempt_requeued(bridge, "k8s", 1)
    # What the comparison rests on: the first run preempted, the second ending with its own code.
    assert len(native_runs[0]) == 2 and native_runs[0][-1] == ("FAILED", "7:0"), native_runs
    assert k8s_runs == native_runs
    assert k8s_out == native_out
    assert "run 0 on NODE1\nhigh on NODE1" in native_out or "run 0 on NODE1\nrun 1" in native_out, native_out


def test_one_job_preempts_two_bridged_jobs_at_once(bridge: Sandbox) -> None:
    native_runs, native_out = _preempt_requeued(bridge, "native", 2)
    k8s_runs, k8s_out = _preempt_requeued(bridge, "k8s", 2)
    assert k8s_runs == native_runs and len(k8s_runs) == 2
    assert k8s_out == native_out


def _ticks(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split() if line.isdigit()] if path.exists() else []


def _preempt_suspended(sandbox: Sandbox, partition: str) -> tuple[int, Runs]:
    """A suspendable ticker holding a node's GPUs, preempted by a high job for HIGH_FOR seconds:
    the ticker's largest gap, and its runs."""
    node = NODES[partition][0]
    ticker = write_script(sandbox, "alice", f"preempt-ticker-{partition}.sh", TICKER)
    high = write_script(sandbox, "alice", f"preempt-high-s-{partition}.sh", BUSYBOX + f"sleep {HIGH_FOR}\n")
    out = sandbox.home("alice") / f"preempt-ticker-{partition}.out"
    out.unlink(missing_ok=True)
    job_id = sandbox.sbatch("-p", partition, "--qos=suspendable", "-w", node, "--gres=gpu:4", "-o", str(out),
                            str(ticker))
    wait_until(f"{partition} ticker {job_id} ticking", lambda: len(_ticks(out)) >= 3, timeout=120)
    high_id = sandbox.sbatch("-p", partition, "--qos=high", "-w", node, "--gres=gpu:4", "-o", "/dev/null",
                             str(high))
    wait_until(f"{partition} ticker {job_id} suspended", lambda: _state(sandbox, job_id) == "SUSPENDED",
               timeout=60)
    time.sleep(2)
    during = len(_ticks(out))
    time.sleep(3)
    assert len(_ticks(out)) == during, f"{partition} ticker {job_id} went on ticking while suspended"
    assert wait_until(f"{partition} high job {high_id}", lambda: _runs(sandbox, high_id), timeout=120) == [
        ("COMPLETED", "0:0")]
    runs = wait_until(f"{partition} ticker {job_id} ended", lambda: _runs(sandbox, job_id), timeout=180)
    ticks = _ticks(out)
    assert len(ticks) == 30, (partition, ticks, job_trail(job_id))
    return max(b - a for a, b in itertools.pairwise(ticks)), runs


def test_a_suspendable_job_pauses_for_its_preemptor_and_goes_on_as_natively(bridge: Sandbox) -> None:
    native_gap, native_runs = _preempt_suspended(bridge, "native")
    k8s_gap, k8s_runs = _preempt_suspended(bridge, "k8s")
    assert native_runs == k8s_runs == [("COMPLETED", "0:0")]
    assert native_gap >= HIGH_FOR - 2 and k8s_gap >= HIGH_FOR - 2, (native_gap, k8s_gap)
    print(f"\nsuspend-preempted for a {HIGH_FOR}s job: largest gap native {native_gap}s, k8s {k8s_gap}s")
