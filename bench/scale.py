"""Throughput of the bridge with many short jobs at once, beside native Slurm: prints, asserts
nothing; the last line is one JSON object.

Runs, one after the other on the running sandbox (`make sandbox-up bridge-up`):
  1. bridged: a `--array=0-(N-1)` of short jobs in `sim` (pods complete through kwok after
     SIM_RUN_TIME), every task's exit code checked;
  2. native: the same array in `native`.
Measured from the daemon's own log and /proc: attach → pod created, pod end seen → Slurm shows
the job over, the daemon's CPU and peak RSS, and the PSS of the waiters and slurmds while the
bridged array runs.

Not measured yet (issue 11), reported as null with a reason: the kubectl-per-job wrapper, the
API server's request rate, and native Slurm on the very same nodes (the native partition has
its own two nodes: `native_nodes` says how many).

On this one 2-core VM the slurmd "hosts" share the CPU with the control plane (etcd, the API
server, slurmctld, the bridge), which in production run on hosts of their own. Hundreds of
waiters and slurmstepds starting at once starved the API server until Lease renewals took over
5 s and the bridge lost its Lease. So while it runs, the benchmark puts every slurmd (native and
bridged alike, so both runs pay the same) in one CPU cgroup (`--job-hosts-weight`, default 100:
all of them together weigh as one process; 0 leaves them be), and moves them back after. At
weight 25 slurmstepds took so long to start that Slurm requeued tasks ("Prolog error"). 300
tasks is what fits (the default): at 1,000, slurmstepds took 7-16 s to start and Slurm drained
nodes.

Usage: .venv/bin/python bench/scale.py [--tasks 300] [--run-time 1s] [--job-hosts-weight 100]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from tests.e2e.sandbox import Sandbox, sandbox_env, write_script

STATE = Path("/var/lib/slurm-k8s-sandbox")
LOG = STATE / "log" / "bridge.log"


def final_rows(sandbox: Sandbox, array_id: int) -> dict[int, tuple[str, str]]:
    out = sandbox.slurm("sacct", "-X", "-n", "-P", "-j", str(array_id), "-o", "JobID,State,ExitCode",
                        check=False).stdout
    rows = {}
    for line in out.splitlines():
        job, state, code = line.split("|")
        task = job.partition("_")[2]
        if task.isdigit() and state not in ("PENDING", "RUNNING", "REQUEUED"):
            rows[int(task)] = (state.split()[0], code)
    return rows


def run_array(sandbox: Sandbox, partition: str, tasks: int, script: Path, env: str) -> tuple[float, int, int]:
    """(seconds, array job id, tasks not COMPLETED 0:0)."""
    started = time.monotonic()
    array_id = sandbox.sbatch("-p", partition, f"--array=0-{tasks - 1}", "-o", "/dev/null",
                              f"--export=ALL,{env}", str(script))
    while True:
        rows = final_rows(sandbox, array_id)
        if len(rows) >= tasks:
            break
        time.sleep(1)
    wall = time.monotonic() - started
    wrong = sum(1 for row in rows.values() if row != ("COMPLETED", "0:0"))
    return wall, array_id, wrong


def pss_kb(pattern: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if not re.search(pattern, cmdline):
                continue
            for line in (proc / "smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    found.append(int(line.split()[1]))
        except OSError:
            continue
    return found


@contextlib.contextmanager
def slurmds_in_cpu_group(weight: int) -> Iterator[str | None]:
    """Every slurmd of the sandbox (their future slurmstepds and jobs follow) in a CPU cgroup of
    relative `weight` (100 = a process's), for the duration; the cgroup's path, or None."""
    pids = [int(path.read_text()) for path in (STATE / "run").glob("slurmd-*.pid")]
    v1 = Path("/sys/fs/cgroup/cpu")
    if weight <= 0 or not pids:
        yield None
        return
    if (v1 / "cpu.shares").exists():
        group, root = v1 / "sbx-job-hosts", v1
        group.mkdir(exist_ok=True)
        (group / "cpu.shares").write_text(str(max(2, weight * 1024 // 100)))
    elif (Path("/sys/fs/cgroup") / "cgroup.controllers").exists():
        root = Path("/sys/fs/cgroup")
        group = root / "sbx-job-hosts"
        group.mkdir(exist_ok=True)
        (group / "cpu.weight").write_text(str(max(1, weight)))
    else:
        yield None
        return
    for pid in pids:
        with contextlib.suppress(OSError):
            (group / "cgroup.procs").write_text(str(pid))
    try:
        yield str(group)
    finally:
        for pid in pids:
            with contextlib.suppress(OSError):
                (root / "cgroup.procs").write_text(str(pid))


def daemon_pid() -> int:
    return int((STATE / "run" / "bridge.pid").read_text())


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def latencies(since: float) -> tuple[list[float], list[float]]:
    """(attach → pod created, container end seen → session ended), ms, for jobs after `since`."""
    attach: dict[int, float] = {}
    created: dict[int, float] = {}
    finished: dict[int, float] = {}
    ended: dict[int, float] = {}
    for line in LOG.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        stamp = datetime.fromisoformat(record.get("timestamp", "").replace("Z", "+00:00")).timestamp()
        if stamp < since or "job_id" not in record:
            continue
        job, event = record["job_id"], record.get("event")
        table = {"attach.accepted": attach, "pod.created": created, "job.finished": finished,
                 "session.ended": ended}.get(event)
        if table is not None:
            table.setdefault(job, stamp)
    to_pod = [(created[j] - attach[j]) * 1000 for j in created if j in attach]
    to_end = [(ended[j] - finished[j]) * 1000 for j in ended if j in finished]
    return to_pod, to_end


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=int(os.environ.get("BENCH_TASKS", "300")))
    parser.add_argument("--run-time", default=os.environ.get("BENCH_RUN_TIME", "1s"))
    parser.add_argument("--job-hosts-weight", type=int,
                        default=int(os.environ.get("BENCH_JOB_HOSTS_WEIGHT", "100")))
    args = parser.parse_args()
    with slurmds_in_cpu_group(args.job_hosts_weight) as group:
        run(args, group)


def run(args: argparse.Namespace, cpu_group: str | None) -> None:
    sandbox = Sandbox(env=sandbox_env())
    script = write_script(sandbox, "alice", "bench-scale.sh", "#!/bin/sh\nexit 0\n")
    sim_nodes = len(sandbox.slurm("sinfo", "-h", "-N", "-p", "sim", "-o", "%N").stdout.split())
    native_nodes = len(sandbox.slurm("sinfo", "-h", "-N", "-p", "native", "-o", "%N").stdout.split())
    pid = daemon_pid()

    samples: dict[str, list[int]] = {"waiter": [], "slurmd": []}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(2.0):
            samples["waiter"] += pss_kb(r"slurm-k8s-bridge-waiter\.py")
            samples["slurmd"] += pss_kb(r"(^|/)slurmd ")

    sampler = threading.Thread(target=sample, daemon=True)
    since, cpu_before = time.time(), cpu_seconds(pid)
    sampler.start()
    bridged_s, _, wrong = run_array(sandbox, "sim", args.tasks, script,
                                    f"SIM_RUN_TIME={args.run_time},SIM_EXIT_CODE=0")
    stop.set()
    cpu = (cpu_seconds(pid) - cpu_before) / bridged_s
    to_pod, to_end = latencies(since)
    print(f"bridged: {args.tasks} tasks on {sim_nodes} sim nodes in {bridged_s:.1f}s "
          f"({args.tasks / bridged_s:.2f} jobs/s), {wrong} wrong exit codes")

    native_s, _, native_wrong = run_array(sandbox, "native", args.tasks, script, "BENCH=1")
    print(f"native: {args.tasks} tasks on {native_nodes} native nodes in {native_s:.1f}s "
          f"({args.tasks / native_s:.2f} jobs/s), {native_wrong} wrong exit codes")

    result = {
        "nodes": sim_nodes,
        "native_nodes": native_nodes,
        "tasks": args.tasks,
        "jobs_per_s": round(args.tasks / bridged_s, 2),
        "native_jobs_per_s": round(args.tasks / native_s, 2),
        "kubectl_wrapper_jobs_per_s": None,
        "ratio_vs_native": round(native_s / bridged_s, 3),
        "ratio_vs_kubectl_wrapper": None,
        "attach_to_pod_ms_p50": percentile(to_pod, 0.5),
        "attach_to_pod_ms_p99": percentile(to_pod, 0.99),
        "pod_end_to_job_end_ms_p50": percentile(to_end, 0.5),
        "pod_end_to_job_end_ms_p99": percentile(to_end, 0.99),
        "bridge_cpu_cores": round(cpu, 3),
        "bridge_peak_rss_mb": round(peak_rss_mb(pid), 1),
        "apiserver_requests_per_s": None,
        "wrong_exit_codes": wrong,
        "lost_lines": None,
        "waiter_pss_kb": round(statistics.median(samples["waiter"])) if samples["waiter"] else None,
        "slurmd_pss_kb": round(statistics.median(samples["slurmd"])) if samples["slurmd"] else None,
        "job_hosts_cpu_group": cpu_group,
        "job_hosts_weight": args.job_hosts_weight if cpu_group else None,
        "not_measured": "kubectl wrapper, API server request rate, native on the same nodes, lost lines "
                        "(sim pods print nothing): issue 11",
    }
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
