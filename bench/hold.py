"""The bridge's footprint with thousands of jobs queued and up to 1,000 running: prints, asserts
nothing; the last line is one JSON object.

Submits `--arrays` arrays of `--tasks-per-array` long sim jobs (kwok ends their pods after
`--run-time`; Slurm's MaxArraySize keeps one array at 1,001 tasks), then samples, every 10 s
until `--running` pods run or `--minutes` pass: how many tasks are pending and running in Slurm,
how many of their pods run, the daemon's RSS and CPU (the mean over each window). Once `--running`
pods run, it sums the PSS of every slurmstepd and waiter: the job host's memory for that many
running jobs. Everything it submitted is cancelled at the end. The slurmds sit in one CPU cgroup
while it runs, as in bench/scale.py.

The start is ramped: each array's ArrayTaskThrottle lets `--ramp` more tasks start once the
tasks let start so far have their pods (or after 60 s). Started all at once, 1,024 slurmstepds
and waiters on the 2-core VM drove its load average to 2,049 and starved the daemon's lease
renewal (2026-12-06); `--ramp 0` still does that.

Usage: .venv/bin/python bench/hold.py [--arrays 10] [--tasks-per-array 1000] [--running 500]
           [--minutes 12] [--run-time 1800s] [--ramp 100]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

from bench.scale import cpu_seconds, daemon_pid, pss_kb, slurmds_in_cpu_group, status_mb
from tests.e2e.sandbox import JOB_NAMESPACE, Sandbox, sandbox_env, write_script

WAITER = r"/slurm-k8s-bridge-waiter( |$)"  # the compiled one, as the sandbox installs it
SLURMSTEPD = r"^slurmstepd: \["
STEP_PATIENCE_S = 60.0


def states(sandbox: Sandbox, array_ids: list[int]) -> tuple[int, int]:
    """(pending, running) tasks of the arrays, as squeue lists them one per line."""
    listed = sandbox.slurm("squeue", "-h", "-r", "-j", ",".join(map(str, array_ids)), "-o", "%T",
                           check=False).stdout.split()
    return listed.count("PENDING"), listed.count("RUNNING")


def pods_running(sandbox: Sandbox) -> int:
    listed = sandbox.kubectl("get", "pods", "-n", JOB_NAMESPACE, "--no-headers",
                             "--field-selector=status.phase=Running", check=False).stdout
    return len(listed.splitlines())


def let_start(sandbox: Sandbox, array_ids: list[int], tasks: int) -> None:
    """Let at most `tasks` tasks of the arrays run at once, shared evenly among them."""
    each = max(1, math.ceil(tasks / len(array_ids)))
    for array_id in array_ids:
        sandbox.slurm("scontrol", "update", f"JobId={array_id}", f"ArrayTaskThrottle={each}", check=False)


def load_average() -> float:
    return os.getloadavg()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arrays", type=int, default=10)
    parser.add_argument("--tasks-per-array", type=int, default=1000)
    parser.add_argument("--running", type=int, default=500)
    parser.add_argument("--minutes", type=float, default=12.0)
    parser.add_argument("--run-time", default="1800s")
    parser.add_argument("--ramp", type=int, default=100,
                        help="tasks let start per step (0: every task at once)")
    parser.add_argument("--job-hosts-weight", type=int, default=100)
    args = parser.parse_args()
    sandbox = Sandbox(env=sandbox_env())
    script = write_script(sandbox, "alice", "bench-hold.sh", "#!/bin/sh\nexit 0\n")
    pid = daemon_pid()
    array_ids: list[int] = []
    peak = {"pending": 0, "running": 0, "pods": 0, "rss_mb": 0.0, "cpu_cores": 0.0, "load": 0.0}
    windows: list[float] = []
    footprint: dict[str, object] = {}
    daemon_stopped_at: float | None = None
    with slurmds_in_cpu_group(args.job_hosts_weight):
        try:
            throttle = f"%{max(1, math.ceil(args.ramp / args.arrays))}" if args.ramp else ""
            for _ in range(args.arrays):
                array_ids.append(sandbox.sbatch(
                    "-p", "sim", f"--array=0-{args.tasks_per_array - 1}{throttle}", "-o", "/dev/null",
                    f"--export=ALL,SIM_RUN_TIME={args.run_time},SIM_EXIT_CODE=0", str(script)))
            let_through = args.ramp or args.running
            step_started = started = time.monotonic()
            cpu_before, at = cpu_seconds(pid), time.monotonic()
            while time.monotonic() - started < args.minutes * 60:
                time.sleep(10)
                try:
                    cpu_now, now = cpu_seconds(pid), time.monotonic()
                    rss = status_mb(pid, "VmRSS")
                except OSError:  # the daemon stopped (a lost lease ends it): say when, and stop
                    daemon_stopped_at = time.monotonic() - started
                    print(f"{daemon_stopped_at:6.0f}s the bridge daemon stopped", flush=True)
                    break
                cores = (cpu_now - cpu_before) / (now - at)
                cpu_before, at = cpu_now, now
                pending, running = states(sandbox, array_ids)
                pods = pods_running(sandbox)
                load = load_average()
                windows.append(cores)
                peak = {"pending": max(peak["pending"], pending), "running": max(peak["running"], running),
                        "pods": max(peak["pods"], pods), "rss_mb": max(peak["rss_mb"], rss),
                        "cpu_cores": max(peak["cpu_cores"], cores), "load": max(peak["load"], load)}
                print(f"{now - started:6.0f}s pending {pending:5d} running {running:5d} pods {pods:5d} "
                      f"bridge {rss:6.1f} MB {cores:5.2f} cores load {load:7.1f}", flush=True)
                if pods >= args.running:
                    footprint = job_host_footprint(running)
                    break
                if args.ramp and let_through < args.running and (
                        pods >= 0.9 * let_through or now - step_started > STEP_PATIENCE_S):
                    let_through = min(args.running, let_through + args.ramp)
                    let_start(sandbox, array_ids, let_through)
                    step_started = now
        finally:
            if array_ids:
                sandbox.slurm("scancel", *map(str, array_ids), check=False)
    result = {
        "submitted": args.arrays * args.tasks_per_array,
        "ramp": args.ramp,
        "peak_pending": peak["pending"],
        "peak_running": peak["running"],
        "peak_pods_running": peak["pods"],
        "peak_load_average": round(peak["load"], 1),
        "bridge_rss_mb_peak": round(peak["rss_mb"], 1),
        "bridge_cpu_cores_mean": round(sum(windows) / len(windows), 3) if windows else None,
        "bridge_cpu_cores_peak_10s": round(peak["cpu_cores"], 3),
        "daemon_stopped_at_s": round(daemon_stopped_at) if daemon_stopped_at is not None else None,
        **footprint,
        "cpus": os.cpu_count(),
    }
    print(json.dumps(result, sort_keys=True))


def job_host_footprint(running: int) -> dict[str, object]:
    """The PSS of every slurmstepd and waiter now, summed: what `running` jobs cost the job host."""
    waiters, stepds = pss_kb(WAITER), pss_kb(SLURMSTEPD)
    total_mb = (sum(waiters) + sum(stepds)) / 1024
    return {
        "running_when_measured": running,
        "waiters_sampled": len(waiters),
        "waiter_pss_kb_median": sorted(waiters)[len(waiters) // 2] if waiters else None,
        "slurmstepds_sampled": len(stepds),
        "slurmstepd_pss_kb_median": sorted(stepds)[len(stepds) // 2] if stepds else None,
        "job_host_pss_mb": round(total_mb),
        "job_host_pss_mb_per_1000_jobs": round(total_mb * 1000 / max(1, len(stepds))),
    }


if __name__ == "__main__":
    main()
