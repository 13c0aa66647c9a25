"""The bridge's footprint with thousands of jobs queued and hundreds running: prints, asserts
nothing; the last line is one JSON object.

Submits `--arrays` arrays of `--tasks-per-array` long sim jobs (kwok ends their pods after
`--run-time`; Slurm's MaxArraySize keeps one array at 1,001 tasks), then samples, every 10 s
until `--running` pods run or `--minutes` pass: how many tasks are pending and running in Slurm,
how many of their pods run, the daemon's RSS and CPU (the mean over each window), and the
waiters' PSS. Everything it submitted is cancelled at the end. The slurmds sit in one CPU cgroup
while it runs, as in bench/scale.py.

On the 2-core, 24 GB VM, 1,060 tasks RUNNING in Slurm (580 pods) put the slurmd side at about
10 GB (a waiter and a slurmstepd each) and the load average past 2,000 while they were
cancelled: hence the default of 500.

Usage: .venv/bin/python bench/hold.py [--arrays 10] [--tasks-per-array 1000] [--running 500]
           [--minutes 12] [--run-time 1800s]
"""

from __future__ import annotations

import argparse
import json
import os
import time

from bench.scale import cpu_seconds, daemon_pid, pss_kb, slurmds_in_cpu_group, status_mb
from tests.e2e.sandbox import JOB_NAMESPACE, Sandbox, sandbox_env, write_script


def states(sandbox: Sandbox, array_ids: list[int]) -> tuple[int, int]:
    """(pending, running) tasks of the arrays, as squeue lists them one per line."""
    listed = sandbox.slurm("squeue", "-h", "-r", "-j", ",".join(map(str, array_ids)), "-o", "%T",
                           check=False).stdout.split()
    return listed.count("PENDING"), listed.count("RUNNING")


def pods_running(sandbox: Sandbox) -> int:
    listed = sandbox.kubectl("get", "pods", "-n", JOB_NAMESPACE, "--no-headers",
                             "--field-selector=status.phase=Running", check=False).stdout
    return len(listed.splitlines())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arrays", type=int, default=10)
    parser.add_argument("--tasks-per-array", type=int, default=1000)
    parser.add_argument("--running", type=int, default=500)
    parser.add_argument("--minutes", type=float, default=12.0)
    parser.add_argument("--run-time", default="1800s")
    parser.add_argument("--job-hosts-weight", type=int, default=100)
    args = parser.parse_args()
    sandbox = Sandbox(env=sandbox_env())
    script = write_script(sandbox, "alice", "bench-hold.sh", "#!/bin/sh\nexit 0\n")
    pid = daemon_pid()
    array_ids: list[int] = []
    peak = {"pending": 0, "running": 0, "pods": 0, "rss_mb": 0.0, "cpu_cores": 0.0}
    windows: list[float] = []
    waiter_pss: list[int] = []
    with slurmds_in_cpu_group(args.job_hosts_weight):
        try:
            for _ in range(args.arrays):
                array_ids.append(sandbox.sbatch(
                    "-p", "sim", f"--array=0-{args.tasks_per_array - 1}", "-o", "/dev/null",
                    f"--export=ALL,SIM_RUN_TIME={args.run_time},SIM_EXIT_CODE=0", str(script)))
            started = time.monotonic()
            cpu_before, at = cpu_seconds(pid), time.monotonic()
            while time.monotonic() - started < args.minutes * 60:
                time.sleep(10)
                cpu_now, now = cpu_seconds(pid), time.monotonic()
                cores = (cpu_now - cpu_before) / (now - at)
                cpu_before, at = cpu_now, now
                pending, running = states(sandbox, array_ids)
                pods = pods_running(sandbox)
                rss = status_mb(pid, "VmRSS")
                windows.append(cores)
                peak = {"pending": max(peak["pending"], pending), "running": max(peak["running"], running),
                        "pods": max(peak["pods"], pods), "rss_mb": max(peak["rss_mb"], rss),
                        "cpu_cores": max(peak["cpu_cores"], cores)}
                print(f"{now - started:6.0f}s pending {pending:5d} running {running:5d} pods {pods:5d} "
                      f"bridge {rss:6.1f} MB {cores:5.2f} cores", flush=True)
                if pods >= args.running:
                    waiter_pss = pss_kb(r"/slurm-k8s-bridge-waiter( |$)")  # the compiled one
                    break
        finally:
            if array_ids:
                sandbox.slurm("scancel", *map(str, array_ids), check=False)
    result = {
        "submitted": args.arrays * args.tasks_per_array,
        "peak_pending": peak["pending"],
        "peak_running": peak["running"],
        "peak_pods_running": peak["pods"],
        "bridge_rss_mb_peak": round(peak["rss_mb"], 1),
        "bridge_cpu_cores_mean": round(sum(windows) / len(windows), 3) if windows else None,
        "bridge_cpu_cores_peak_10s": round(peak["cpu_cores"], 3),
        "waiter_pss_kb_median": sorted(waiter_pss)[len(waiter_pss) // 2] if waiter_pss else None,
        "waiters_sampled": len(waiter_pss),
        "cpus": os.cpu_count(),
    }
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
