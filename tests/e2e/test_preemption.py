"""Preemption (issue 21): the sandbox's PreemptType=preempt/qos lets a `high` job take a running job's
GPUs. The `normal` job is requeued: its pods get their grace and go, the preemptor runs on its GPUs,
and the preempted job runs again in fresh pods and ends as its second run says. Side by side in
`native` and `k8s` (the output and every run's sacct row), and two jobs preempted by one two-node
job at once.

Suspend mode: a `suspendable` job is suspended by a `high` job that runs on its node from a
partition of a higher PriorityTier (`urgent` over the native nodes, `dra` over the real kubelets':
Slurm's gang scheduler suspends only under a higher tier), and resumed once the preemptor ends. Its
processes stop in its pods for as long as the preemptor runs, as natively, and the job ends as its
script says."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from tests.e2e.sandbox import Sandbox, at_once, job_pods, job_trail, wait_until, write_script
from tests.e2e.test_parity_output_and_signals import _normalised

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


T = TypeVar("T")
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
    """slurmstepd's `*** JOB N ON node CANCELLED AT t DUE TO PREEMPTION ***` without id, node, time;
    and without the shell's `Terminated` line: whether sh reports its `sleep` killed by the
    SIGTERM that kills sh too is a race of the two processes, natively as much as in a pod (CI saw
    it in native's output once, and not in k8s's)."""
    kept = [line for line in text.splitlines(keepends=True) if line.strip() != "Terminated"]
    return _normalised("".join(kept).encode()).decode()


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


def _both_partitions(run: Callable[..., T]) -> dict[str, T]:
    """`run` in `native` and in `k8s` at once: their nodes, jobs and files are apart, and each side
    mostly waits on Slurm (the preemptor's run, requeue_delay): half the wall time."""
    return at_once({partition: functools.partial(run, partition=partition) for partition in NODES})


def test_a_preempted_job_gives_its_gpus_back_requeues_and_reruns_as_natively(bridge: Sandbox) -> None:
    results = _both_partitions(functools.partial(_preempt_requeued, bridge, nodes=1))
    (native_runs, native_out), (k8s_runs, k8s_out) = results["native"], results["k8s"]
    # What the comparison rests on: the first run preempted, the second ending with its own code.
    assert len(native_runs[0]) == 2 and native_runs[0][-1] == ("FAILED", "7:0"), native_runs
    assert k8s_runs == native_runs
    assert k8s_out == native_out
    preempted = "run 0 on NODE\nerror: *** JOB CANCELLED DUE TO PREEMPTION ***\nrun 1 on NODE"
    assert preempted in native_out, native_out


def test_one_job_preempts_two_bridged_jobs_at_once(bridge: Sandbox) -> None:
    results = _both_partitions(functools.partial(_preempt_requeued, bridge, nodes=2))
    (native_runs, native_out), (k8s_runs, k8s_out) = results["native"], results["k8s"]
    assert k8s_runs == native_runs and len(k8s_runs) == 2
    assert k8s_out == native_out


PREEMPTOR_PARTITION = {"native": "urgent", "k8s": "dra"}
CPUS = {"native": 4, "k8s": 8}
"""Every CPU of a node as Slurm counts it: the preemptor needs the suspended job's."""
TICKER = BUSYBOX + "for i in $(seq 1 20); do date +%s; sleep 1; done\nexit 5\n"
PREEMPTOR_S = 10
SUSPENDER = BUSYBOX + f'echo "high on $SLURMD_NODENAME"\nsleep {PREEMPTOR_S}\n'


def _ticks(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split() if line.isdigit()] if path.exists() else []


def _preempt_suspended(sandbox: Sandbox, partition: str, nodes: int) -> list[tuple[list[int], Runs]]:
    """`nodes` suspendable jobs, one per node holding all its CPUs, suspended by one high job on
    those nodes from the other partition; each one's ticks and runs."""
    ticker = write_script(sandbox, "alice", f"suspend-low-{partition}.sh", TICKER)
    high = write_script(sandbox, "alice", f"suspend-high-{partition}.sh", SUSPENDER)
    targets = NODES[partition][:nodes]
    lows = []
    for node in targets:
        out = sandbox.home("alice") / f"suspend-low-{partition}-{node}.out"
        out.unlink(missing_ok=True)
        job_id = sandbox.sbatch("-p", partition, "--qos=suspendable", "-w", node, "-c", str(CPUS[partition]),
                                "-o", str(out), str(ticker))
        lows.append((job_id, out))
    for job_id, out in lows:
        wait_until(f"{partition} job {job_id} ticking", lambda out=out: len(_ticks(out)) >= 3, timeout=120)
    high_id = sandbox.sbatch("-p", PREEMPTOR_PARTITION[partition], "--qos=high", "-N", str(nodes),
                             "-w", ",".join(targets), "-c", str(CPUS[partition]), "-o", "/dev/null",
                             str(high))
    for job_id, _ in lows:
        wait_until(f"{partition} job {job_id} suspended by {high_id}",
                   lambda job_id=job_id: _state(sandbox, job_id) == "SUSPENDED", timeout=60)
    high_runs = wait_until(f"{partition} high job {high_id}", lambda: _runs(sandbox, high_id), timeout=180)
    assert high_runs == [("COMPLETED", "0:0")], f"{high_runs}\n{job_trail(high_id)}"
    results = []
    for job_id, out in lows:
        runs = wait_until(f"{partition} suspended job {job_id} to end",
                          lambda job_id=job_id: _runs(sandbox, job_id), timeout=240)
        results.append((_ticks(out), runs))
        if partition != "native":
            wait_until(f"job {job_id}'s pods gone", lambda job_id=job_id: not job_pods(sandbox, job_id),
                       timeout=60)
    return results


def _largest_gap(ticks: list[int]) -> int:
    return max((b - a for a, b in itertools.pairwise(ticks)), default=0)


SLURM_CONF = Path("/var/lib/slurm-k8s-sandbox/slurm/etc/slurm.conf")
"""What slurmctld and the slurmds read (in the Slurm rootfs); containers/slurm/up.sh writes it."""


def _preempt_mode(bridge: Sandbox) -> str:
    config = bridge.slurm("scontrol", "show", "config").stdout
    return next(line.split("=", 1)[1].strip() for line in config.splitlines()
                if line.startswith("PreemptMode "))


@pytest.fixture(scope="module")
def gang(bridge: Sandbox) -> Iterator[Sandbox]:
    """PreemptMode=REQUEUE,GANG for this module's suspend tests (suspend preemption needs the gang
    scheduler, which stays off for the rest of the suite: see slurm.conf.in), then REQUEUE again."""
    original = SLURM_CONF.read_text()
    assert "\nPreemptMode=REQUEUE\n" in original, "slurm.conf's PreemptMode is not the sandbox's"
    SLURM_CONF.write_text(original.replace("\nPreemptMode=REQUEUE\n", "\nPreemptMode=REQUEUE,GANG\n"))
    try:
        bridge.slurm("scontrol", "reconfigure")
        wait_until("the gang scheduler on", lambda: "GANG" in _preempt_mode(bridge), timeout=60)
        yield bridge
    finally:
        SLURM_CONF.write_text(original)
        bridge.slurm("scontrol", "reconfigure")
        wait_until("the gang scheduler off", lambda: "GANG" not in _preempt_mode(bridge), timeout=60)


@pytest.mark.parametrize("nodes", [1, 2], ids=["one job", "two jobs at once"])
def test_a_suspend_preempted_job_pauses_while_the_preemptor_runs_and_resumes_as_natively(
    gang: Sandbox, nodes: int
) -> None:
    bridge = gang
    # Apart: `urgent` suspends on the native nodes only, `dra` on the real kubelets' only.
    both = _both_partitions(functools.partial(_preempt_suspended, bridge, nodes=nodes))
    native, k8s = both["native"], both["k8s"]
    for partition, results in (("native", native), ("k8s", k8s)):
        for ticks, runs in results:
            # Every tick printed, one run ending with the script's own code, and a pause about as
            # long as the preemptor ran (its pod's start included on the bridged side).
            assert len(ticks) == 20, (partition, ticks)
            assert runs == [("FAILED", "5:0")], (partition, runs)
            assert _largest_gap(ticks) >= PREEMPTOR_S - 2, (partition, ticks)
    print(f"\nlargest gaps while preempted ({PREEMPTOR_S} s preemptor): "
          f"native {[_largest_gap(t) for t, _ in native]}, k8s {[_largest_gap(t) for t, _ in k8s]}")
