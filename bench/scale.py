"""Throughput of the bridge with many short jobs at once, beside native Slurm on the same nodes and
a kubectl-per-job wrapper: prints, asserts nothing; the last line is one JSON object.

Runs, one after the other on the running sandbox (`make sandbox-up bridge-up`):
  1. bridged: a `--array=0-(N-1)` of short jobs in `sim` (pods complete through kwok after
     SIM_RUN_TIME), every task's exit code checked;
  2. native: the same array, each task sleeping SIM_RUN_TIME, on the very same slurmds: in a
     partition over the sim nodes that the benchmark creates for its own duration
     (`scontrol create`, RootOnly and Hidden: no user can submit to it, so no user code ever runs
     on those slurmds; it is gone at the end, and at any slurmctld restart);
  3. the kubectl wrapper (the peer baseline, on a slice of the tasks): in the same partition, a
     batch script that creates a pod with kubectl on its node, waits for it to succeed, fetches
     its logs and deletes it;
  4. lost lines: a small array in `k8s` (real kubelets), each task printing numbered lines into
     its own -o file, every line checked.
Measured from the daemon's own log, /metrics and /proc: attach (the batch step's start on its
slurmd) → pod created, pod end seen → Slurm shows the job over, the requests the daemon sent to
the API server, the daemon's CPU and peak RSS, and the PSS of the waiters and slurmds while the
bridged array runs.

On this one 2-core VM the slurmd "hosts" share the CPU with the control plane (etcd, the API
server, slurmctld, the bridge), which in production run on hosts of their own. Hundreds of
waiters and slurmstepds starting at once starved the API server until Lease renewals took over
5 s and the bridge lost its Lease. So while it runs, the benchmark puts every slurmd (native and
bridged alike, so every run pays the same) in one CPU cgroup (`--job-hosts-weight`, default 100:
all of them together weigh as one process; 0 leaves them be), and moves them back after. At
weight 25 slurmstepds took so long to start that Slurm requeued tasks ("Prolog error"). 300
tasks is what fits (the default): at 1,000, slurmstepds took 7-16 s to start and Slurm drained
nodes.

Usage: .venv/bin/python bench/scale.py [--tasks 300] [--run-time 1s] [--wrapper-tasks 60]
           [--lines-tasks 16] [--lines-per-task 2000] [--job-hosts-weight 100]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
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


def run_array(sandbox: Sandbox, partition: str, tasks: int, script: Path, env: str, *,
              user: str = "alice", output: str = "/dev/null") -> tuple[float, int, int]:
    """(seconds, array job id, tasks not COMPLETED 0:0)."""
    started = time.monotonic()
    array_id = sandbox.sbatch("-p", partition, f"--array=0-{tasks - 1}", "-o", output,
                              f"--export=ALL,{env}", str(script), user=user, cwd=str(script.parent))
    while True:
        rows = final_rows(sandbox, array_id)
        if len(rows) >= tasks:
            break
        time.sleep(1)
    wall = time.monotonic() - started
    wrong = sum(1 for row in rows.values() if row != ("COMPLETED", "0:0"))
    return wall, array_id, wrong


NATIVE_PARTITION = "bench-native"


@contextlib.contextmanager
def native_partition_over(sandbox: Sandbox, nodes: str) -> Iterator[str]:
    """A plain (not bridged) partition over the bridged `nodes` while the benchmark runs, so that
    native Slurm runs on exactly the same slurmds. RootOnly: sbatch refuses everyone else (and
    `scontrol update` cannot move a job into it), so only the benchmark's own jobs run natively
    there. Made with `scontrol create`: never in slurm.conf, gone at a slurmctld restart."""
    spec = [f"PartitionName={NATIVE_PARTITION}", f"Nodes={nodes}", "RootOnly=YES", "AllowGroups=root",
            "Hidden=YES", "MaxTime=INFINITE", "State=UP"]
    made = sandbox.slurm("scontrol", "create", *spec, check=False)
    if made.returncode != 0:  # left by an interrupted run: make it what it must be
        sandbox.slurm("scontrol", "update", *spec)
    try:
        yield NATIVE_PARTITION
    finally:
        sandbox.slurm("scancel", "-p", NATIVE_PARTITION, check=False)
        for _ in range(30):
            if sandbox.slurm("scontrol", "delete", f"PartitionName={NATIVE_PARTITION}",
                             check=False).returncode == 0:
                break
            time.sleep(1)  # jobs still completing in it


WRAPPER_NAMESPACE = "bench-kubectl-wrapper"
# What a kube-slurm-style wrapper does per job: create the pod on the job's node, wait for it,
# fetch its logs (kwok serves none: the request is still made, and its error printed), delete it.
WRAPPER_SCRIPT = """#!/bin/sh
set -eu
k() { "$BENCH_KUBECTL" --kubeconfig "$BENCH_KUBECONFIG" --cache-dir /tmp/bench-kubectl-cache \\
      -n "$BENCH_NAMESPACE" "$@"; }
pod="kw-$SLURM_ARRAY_JOB_ID-$SLURM_ARRAY_TASK_ID"
k create -f - >/dev/null <<JSON
{"apiVersion": "v1", "kind": "Pod",
 "metadata": {"name": "$pod", "annotations": {
   "pod-complete.stage.kwok.x-k8s.io/delay": "$SIM_RUN_TIME",
   "pod-complete.stage.kwok.x-k8s.io/exit-code": "0"}},
 "spec": {"nodeName": "$SLURMD_NODENAME", "restartPolicy": "Never",
          "tolerations": [{"operator": "Exists"}],
          "containers": [{"name": "job", "image": "sandbox.local/busybox:1"}]}}
JSON
k wait --for=jsonpath='{.status.phase}'=Succeeded --timeout=600s "pod/$pod" >/dev/null
k logs "$pod" || true
k delete pod "$pod" --wait=false >/dev/null
"""


def kubectl_wrapper_run(sandbox: Sandbox, partition: str, tasks: int, run_time: str) -> tuple[float, int]:
    """(seconds, tasks not COMPLETED 0:0) of `tasks` jobs through the kubectl wrapper."""
    work = STATE / "bench"
    work.mkdir(exist_ok=True)
    # The slurmds run in the Slurm rootfs, where the state directory is mounted at the same path
    # but the host's kubectl (a link into root's cache) is not.
    kubectl = work / "kubectl"
    shutil.copy2(shutil.which("kubectl", path=sandbox.environ()["PATH"]) or "kubectl", kubectl)
    script = work / "kubectl-wrapper.sh"
    script.write_text(WRAPPER_SCRIPT)
    sandbox.kubectl("create", "namespace", WRAPPER_NAMESPACE, check=False)
    env = (f"BENCH_KUBECTL={kubectl},BENCH_KUBECONFIG={sandbox.kubeconfig},"
           f"BENCH_NAMESPACE={WRAPPER_NAMESPACE},SIM_RUN_TIME={run_time}")
    try:
        wall, _, wrong = run_array(sandbox, partition, tasks, script, env, user="root")
    finally:
        sandbox.kubectl("delete", "namespace", WRAPPER_NAMESPACE, "--wait=false", check=False)
    return wall, wrong


def lost_lines_run(sandbox: Sandbox, tasks: int, lines: int) -> tuple[float, int, int]:
    """(seconds, lines missing or wrong over all -o files, tasks not COMPLETED 0:0) of an array
    in `k8s` (real kubelets: kwok pods print nothing) whose tasks print `lines` numbered lines."""
    out_dir = sandbox.home("alice") / "bench-lines"
    out_dir.mkdir(exist_ok=True)
    for old in out_dir.glob("*.out"):
        old.unlink()
    alice = int(subprocess.run(["id", "-u", "alice"], check=True, capture_output=True, text=True).stdout)
    os.chown(out_dir, alice, alice)
    script = write_script(sandbox, "alice", "bench-lines.sh",
                          "#!/bin/sh\n#K8S image=sandbox.local/busybox:1\n"
                          f"seq 1 {lines} | sed 's/^/line /'\n")
    wall, array_id, wrong = run_array(sandbox, "k8s", tasks, script, "BENCH=1",
                                      output=f"{out_dir}/%A_%a.out")
    expected = [f"line {i}" for i in range(1, lines + 1)]
    lost = 0
    for task in range(tasks):
        path = out_dir / f"{array_id}_{task}.out"
        got = path.read_text().splitlines() if path.exists() else []
        # A line counts once, in its place: missing, garbled or reordered lines are all lost.
        lost += sum(1 for i, line in enumerate(expected) if i >= len(got) or got[i] != line)
    return wall, lost, wrong


def seconds_of(duration: str) -> float:
    """A Go duration as the sim partition's annotations take it ("1s", "500ms")."""
    if duration.endswith("ms"):
        return float(duration[:-2]) / 1000
    return float(duration.removesuffix("s"))


def kube_requests_sent() -> float | None:
    """The daemon's own count of requests it sent to the API server (all verbs), or None."""
    url = f"http://127.0.0.1:{os.environ.get('SBX_BRIDGE_PORT', '8470')}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            text = answer.read().decode()
    except OSError:
        return None
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("slurm_k8s_bridge_kube_requests_total{"))


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


@dataclass
class JobHosts:
    """Where the slurmds (and so their slurmstepds, waiters and native jobs) are while the
    benchmark runs: `group` weighs them as one process (None: left alone), `accounted` counts
    their CPU time (cgroup v1 cpuacct; None if that hierarchy is missing)."""

    group: str | None
    accounted: Path | None

    def cpu_seconds(self) -> float | None:
        """CPU time used by every slurmd and all it started, since the benchmark moved them."""
        if self.accounted is None:
            return None
        return int((self.accounted / "cpuacct.usage").read_text()) / 1e9


@contextlib.contextmanager
def slurmds_in_cpu_group(weight: int) -> Iterator[JobHosts]:
    """Every slurmd of the sandbox (their future slurmstepds and jobs follow) in a CPU cgroup of
    relative `weight` (100 = a process's), and in a CPU accounting cgroup, for the duration."""
    pids = [int(path.read_text()) for path in (STATE / "run").glob("slurmd-*.pid")]
    moved: list[tuple[Path, Path]] = []  # (group, its parent) the slurmds were put in
    group: Path | None = None
    v1 = Path("/sys/fs/cgroup/cpu")
    if weight > 0 and pids and (v1 / "cpu.shares").exists():
        group = v1 / "sbx-job-hosts"
        group.mkdir(exist_ok=True)
        (group / "cpu.shares").write_text(str(max(2, weight * 1024 // 100)))
        moved.append((group, v1))
    elif weight > 0 and pids and (Path("/sys/fs/cgroup") / "cgroup.controllers").exists():
        group = Path("/sys/fs/cgroup") / "sbx-job-hosts"
        group.mkdir(exist_ok=True)
        (group / "cpu.weight").write_text(str(max(1, weight)))
        moved.append((group, group.parent))
    accounted: Path | None = None
    cpuacct = Path("/sys/fs/cgroup/cpuacct")
    if pids and (cpuacct / "cpuacct.usage").exists() and cpuacct.resolve() != v1.resolve():
        accounted = cpuacct / "sbx-job-hosts"
        accounted.mkdir(exist_ok=True)
        moved.append((accounted, cpuacct))
    elif group is not None and (group / "cpuacct.usage").exists():
        accounted = group  # cpu and cpuacct mounted together
    for where, _ in moved:
        for pid in pids:
            with contextlib.suppress(OSError):
                (where / "cgroup.procs").write_text(str(pid))
    try:
        yield JobHosts(str(group) if group else None, accounted)
    finally:
        for _, parent in moved:
            for pid in pids:
                with contextlib.suppress(OSError):
                    (parent / "cgroup.procs").write_text(str(pid))


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
    parser.add_argument("--wrapper-tasks", type=int, default=int(os.environ.get("BENCH_WRAPPER_TASKS", "60")),
                        help="the slice of tasks run through the kubectl wrapper (0: skip it)")
    parser.add_argument("--lines-tasks", type=int, default=int(os.environ.get("BENCH_LINES_TASKS", "16")),
                        help="tasks of the lost-lines array on the real kubelets (0: skip it)")
    parser.add_argument("--lines-per-task", type=int,
                        default=int(os.environ.get("BENCH_LINES_PER_TASK", "2000")))
    parser.add_argument("--job-hosts-weight", type=int,
                        default=int(os.environ.get("BENCH_JOB_HOSTS_WEIGHT", "100")))
    args = parser.parse_args()
    with slurmds_in_cpu_group(args.job_hosts_weight) as hosts:
        run(args, hosts)


def per_job(hosts: JobHosts, before: float | None, jobs: int) -> float | None:
    """CPU milliseconds per job that the slurmds and all they started used since `before`."""
    after = hosts.cpu_seconds()
    return round((after - before) * 1000 / jobs, 1) if after is not None and before is not None else None


def run(args: argparse.Namespace, hosts: JobHosts) -> None:
    sandbox = Sandbox(env=sandbox_env())
    script = write_script(sandbox, "alice", "bench-scale.sh", "#!/bin/sh\nexit 0\n")
    sim_hostlist = sandbox.slurm("sinfo", "-h", "-p", "sim", "-o", "%N").stdout.strip()
    sim_nodes = len(sandbox.slurm("sinfo", "-h", "-N", "-p", "sim", "-o", "%N").stdout.split())
    pid = daemon_pid()

    samples: dict[str, list[int]] = {"waiter": [], "slurmd": []}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(2.0):
            samples["waiter"] += pss_kb(r"slurm-k8s-bridge-waiter\.py")
            samples["slurmd"] += pss_kb(r"(^|/)slurmd ")

    sampler = threading.Thread(target=sample, daemon=True)
    since, cpu_before, requests_before = time.time(), cpu_seconds(pid), kube_requests_sent()
    sampler.start()
    hosts_before = hosts.cpu_seconds()
    bridged_s, _, wrong = run_array(sandbox, "sim", args.tasks, script,
                                    f"SIM_RUN_TIME={args.run_time},SIM_EXIT_CODE=0")
    stop.set()
    bridged_hosts_ms = per_job(hosts, hosts_before, args.tasks)
    cpu = (cpu_seconds(pid) - cpu_before) / bridged_s
    requests_after = kube_requests_sent()
    requests_per_s = (round((requests_after - requests_before) / bridged_s, 1)
                      if requests_before is not None and requests_after is not None else None)
    to_pod, to_end = latencies(since)
    print(f"bridged: {args.tasks} tasks on {sim_nodes} sim nodes in {bridged_s:.1f}s "
          f"({args.tasks / bridged_s:.2f} jobs/s), {wrong} wrong exit codes, "
          f"{requests_per_s} API requests/s")

    with native_partition_over(sandbox, sim_hostlist) as native_partition:
        work = STATE / "bench"
        work.mkdir(exist_ok=True)
        native_script = work / "native.sh"
        native_script.write_text(f"#!/bin/sh\nsleep {seconds_of(args.run_time)}\nexit 0\n")
        hosts_before = hosts.cpu_seconds()
        native_s, _, native_wrong = run_array(sandbox, native_partition, args.tasks, native_script,
                                              "BENCH=1", user="root")
        native_hosts_ms = per_job(hosts, hosts_before, args.tasks)
        print(f"native: {args.tasks} tasks on the same {sim_nodes} nodes in {native_s:.1f}s "
              f"({args.tasks / native_s:.2f} jobs/s), {native_wrong} wrong exit codes")
        wrapper_s = wrapper_wrong = wrapper_hosts_ms = None
        if args.wrapper_tasks > 0:
            hosts_before = hosts.cpu_seconds()
            wrapper_s, wrapper_wrong = kubectl_wrapper_run(sandbox, native_partition, args.wrapper_tasks,
                                                           args.run_time)
            wrapper_hosts_ms = per_job(hosts, hosts_before, args.wrapper_tasks)
            print(f"kubectl wrapper: {args.wrapper_tasks} tasks on the same nodes in {wrapper_s:.1f}s "
                  f"({args.wrapper_tasks / wrapper_s:.2f} jobs/s), {wrapper_wrong} wrong exit codes")

    lines_s = lost = lines_wrong = None
    if args.lines_tasks > 0:
        lines_s, lost, lines_wrong = lost_lines_run(sandbox, args.lines_tasks, args.lines_per_task)
        print(f"lines: {args.lines_tasks} tasks x {args.lines_per_task} lines on the real kubelets in "
              f"{lines_s:.1f}s, {lost} lost lines, {lines_wrong} wrong exit codes")

    jobs_per_s = args.tasks / bridged_s
    wrapper_rate = args.wrapper_tasks / wrapper_s if wrapper_s else None
    result = {
        "nodes": sim_nodes,
        "tasks": args.tasks,
        "jobs_per_s": round(jobs_per_s, 2),
        "native_jobs_per_s": round(args.tasks / native_s, 2),
        "native_wrong_exit_codes": native_wrong,
        "kubectl_wrapper_tasks": args.wrapper_tasks or None,
        "kubectl_wrapper_jobs_per_s": round(wrapper_rate, 2) if wrapper_rate else None,
        "kubectl_wrapper_wrong_exit_codes": wrapper_wrong,
        "ratio_vs_native": round(native_s / bridged_s, 3),
        "ratio_vs_kubectl_wrapper": round(jobs_per_s / wrapper_rate, 2) if wrapper_rate else None,
        # From the waiter's attach (its batch step started on the slurmd: the job is RUNNING).
        "running_to_pod_ms_p50": percentile(to_pod, 0.5),
        "running_to_pod_ms_p99": percentile(to_pod, 0.99),
        "pod_end_to_job_end_ms_p50": percentile(to_end, 0.5),
        "pod_end_to_job_end_ms_p99": percentile(to_end, 0.99),
        "bridge_cpu_cores": round(cpu, 3),
        "bridge_peak_rss_mb": round(peak_rss_mb(pid), 1),
        "apiserver_requests_per_s": requests_per_s,
        "wrong_exit_codes": wrong,
        "lost_lines": lost,
        "lines_tasks": args.lines_tasks or None,
        "lines_per_task": args.lines_per_task if args.lines_tasks else None,
        "lines_wrong_exit_codes": lines_wrong,
        "waiter_pss_kb": round(statistics.median(samples["waiter"])) if samples["waiter"] else None,
        "slurmd_pss_kb": round(statistics.median(samples["slurmd"])) if samples["slurmd"] else None,
        # CPU the slurmd side used per job (slurmstepd, and the waiter or the job or kubectl).
        "job_hosts_cpu_ms_per_job": bridged_hosts_ms,
        "native_job_hosts_cpu_ms_per_job": native_hosts_ms,
        "kubectl_wrapper_job_hosts_cpu_ms_per_job": wrapper_hosts_ms,
        "job_hosts_cpu_group": hosts.group,
        "job_hosts_weight": args.job_hosts_weight if hosts.group else None,
    }
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
