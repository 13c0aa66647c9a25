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
     its own -o file, every line checked;
  5. the DRA claims' cost: 1-GPU arrays in `sim` (env mode) and `simdra` (GPUs by DRA claims on
     the kwok nodes' published mock GPUs), the daemon's API writes per pod in each.
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
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from tests.e2e.sandbox import JOB_NAMESPACE, Sandbox, sandbox_env, write_script

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
              user: str = "alice", output: str = "/dev/null",
              options: tuple[str, ...] = ()) -> tuple[float, int, int]:
    """(seconds, array job id, tasks not COMPLETED 0:0)."""
    started = time.monotonic()
    array_id = sandbox.sbatch("-p", partition, f"--array=0-{tasks - 1}", "-o", output, *options,
                              f"--export=ALL,{env}", str(script), user=user, cwd=str(script.parent))
    deadline = started + max(600.0, 3.0 * tasks)
    while True:
        rows = final_rows(sandbox, array_id)
        if len(rows) >= tasks:
            break
        if time.monotonic() > deadline:
            sandbox.slurm("scancel", str(array_id), check=False)
            raise TimeoutError(f"array {array_id} in {partition}: {len(rows)} of {tasks} tasks ended "
                               f"in {deadline - started:.0f}s (cancelled)")
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
    if sandbox.slurm("scontrol", "show", "partition", NATIVE_PARTITION, check=False).returncode == 0:
        # Left by an interrupted run: none of its jobs may run now.
        print(f"{NATIVE_PARTITION} left by an earlier run: its jobs are cancelled and it is made again")
        drop_partition(sandbox)
    sandbox.slurm("scontrol", "create", *spec)
    try:
        yield NATIVE_PARTITION
    finally:
        drop_partition(sandbox)


def drop_partition(sandbox: Sandbox) -> None:
    sandbox.slurm("scancel", "-p", NATIVE_PARTITION, check=False)
    for _ in range(60):
        if sandbox.slurm("scontrol", "delete", f"PartitionName={NATIVE_PARTITION}",
                         check=False).returncode == 0:
            return
        time.sleep(1)  # jobs still completing in it
    raise RuntimeError(f"partition {NATIVE_PARTITION} could not be deleted: scontrol delete "
                       f"PartitionName={NATIVE_PARTITION} once its jobs are gone")


# What a kube-slurm-style wrapper does per job: create the pod on the job's node, wait for it,
# fetch its logs (kwok serves none: the request is still made, and its error printed), delete it.
WRAPPER_SCRIPT = """#!/bin/sh
set -eu
k() { "$BENCH_KUBECTL" --kubeconfig "$BENCH_KUBECONFIG" -n "$BENCH_NAMESPACE" \\
      --cache-dir "$BENCH_WORK/kubectl-cache-$SLURM_JOB_ID" "$@"; }
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
rm -rf "$BENCH_WORK/kubectl-cache-$SLURM_JOB_ID"
"""


def bench_work_dir() -> Path:
    """Root's own directory for the benchmark's root jobs (in the state directory, which the
    slurmds' rootfs mounts at the same path); nobody else may enter it."""
    work = STATE / "bench"
    work.mkdir(mode=0o700, exist_ok=True)
    os.chmod(work, 0o700)
    return work


def kubectl_wrapper_run(sandbox: Sandbox, partition: str, tasks: int, run_time: str) -> tuple[float, int]:
    """(seconds, tasks not COMPLETED 0:0) of `tasks` jobs through the kubectl wrapper."""
    work = bench_work_dir()
    namespace = f"bench-kubectl-wrapper-{os.getpid()}"
    # The slurmds run in the Slurm rootfs, where the state directory is mounted at the same path
    # but the host's kubectl (a link into root's cache) is not.
    kubectl = work / "kubectl"
    shutil.copy2(shutil.which("kubectl", path=sandbox.environ()["PATH"]) or "kubectl", kubectl)
    script = work / "kubectl-wrapper.sh"
    script.write_text(WRAPPER_SCRIPT)
    sandbox.kubectl("create", "namespace", namespace)
    env = (f"BENCH_KUBECTL={kubectl},BENCH_KUBECONFIG={sandbox.kubeconfig},BENCH_WORK={work},"
           f"BENCH_NAMESPACE={namespace},SIM_RUN_TIME={run_time}")
    try:
        wall, _, wrong = run_array(sandbox, partition, tasks, script, env, user="root")
    finally:
        sandbox.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    return wall, wrong


def as_alice(*argv: str) -> None:
    """Files in alice's home are alice's business: root acting there would follow her links."""
    subprocess.run(["runuser", "-u", "alice", "--", *argv], check=True, capture_output=True, timeout=60)


def lost_lines_run(sandbox: Sandbox, tasks: int, lines: int) -> tuple[float, int, int, int]:
    """(seconds, lines missing, lines extra, tasks not COMPLETED 0:0) over the -o files of an
    array in `k8s` (real kubelets: kwok pods print nothing) whose tasks print `lines` numbered
    lines each."""
    out_dir = sandbox.home("alice") / "bench-lines"
    as_alice("mkdir", "-p", str(out_dir))
    as_alice("find", str(out_dir), "-maxdepth", "1", "-name", "*.out", "-delete")
    script = write_script(sandbox, "alice", "bench-lines.sh",
                          "#!/bin/sh\n#K8S image=sandbox.local/busybox:1\n"
                          f"seq 1 {lines} | sed 's/^/line /'\n")
    wall, array_id, wrong = run_array(sandbox, "k8s", tasks, script, "BENCH=1",
                                      output=f"{out_dir}/%A_%a.out")
    expected = Counter(f"line {i}" for i in range(1, lines + 1))
    lost = extra = 0
    for task in range(tasks):
        got = Counter(read_own_file(out_dir / f"{array_id}_{task}.out").splitlines())
        lost += sum((expected - got).values())
        extra += sum((got - expected).values())  # doubled lines, or words of the bridge's own
    return wall, lost, extra, wrong


def read_own_file(path: Path) -> str:
    """The file's text, never through a link (empty if it is missing)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return ""
    with os.fdopen(fd, encoding="utf-8", errors="replace") as file:
        return file.read()


def seconds_of(duration: str) -> float:
    """A Go duration as the sim partition's annotations take it ("1s", "500ms")."""
    if duration.endswith("ms"):
        return float(duration[:-2]) / 1000
    return float(duration.removesuffix("s"))


WRITE_VERBS = ("POST", "PUT", "PATCH", "DELETE")


def kube_requests_sent(sandbox: Sandbox, verbs: tuple[str, ...] | None = None) -> float | None:
    """The daemon's own count of requests it sent to the API server (of `verbs`; all by default),
    or None."""
    url = f"http://127.0.0.1:{sandbox.environ().get('SBX_BRIDGE_PORT', '8470')}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            text = answer.read().decode()
    except OSError:
        return None
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("slurm_k8s_bridge_kube_requests_total{")
               and (verbs is None or any(f'verb="{verb}"' in line for verb in verbs)))


def writes_per_task(sandbox: Sandbox, partition: str, tasks: int, script: Path, env: str,
                    *options: str) -> tuple[float | None, int, float]:
    """(API writes the daemon sent per task, wrong exit codes, seconds) of an array in `partition`."""
    before = kube_requests_sent(sandbox, WRITE_VERBS)
    wall, _, wrong = run_array(sandbox, partition, tasks, script, env, options=options)
    wait_for_no_pods(sandbox)  # the deletes of the pods (and Secrets) count too
    time.sleep(2)
    after = kube_requests_sent(sandbox, WRITE_VERBS)
    if before is None or after is None or after < before:
        return None, wrong, wall
    return round((after - before) / tasks, 2), wrong, wall


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


def cgroup_of(pid: int, controller: str) -> str | None:
    """The pid's cgroup path in the v1 hierarchy of `controller` ("" for v2), or None."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path
    return None


@contextlib.contextmanager
def slurmds_in_cpu_group(weight: int) -> Iterator[JobHosts]:
    """Every slurmd of the sandbox (their future slurmstepds and jobs follow) in a CPU cgroup of
    relative `weight` (100 = a process's; 0 leaves their weight be), and in a CPU accounting
    cgroup, for the duration; each goes back to the cgroups it came from."""
    pids = [int(path.read_text()) for path in (STATE / "run").glob("slurmd-*.pid")]
    moves: list[tuple[Path, Path, str]] = []  # (hierarchy, the benchmark's group, controller)
    group: Path | None = None
    v1 = Path("/sys/fs/cgroup/cpu")
    if weight > 0 and pids and (v1 / "cpu.shares").exists():
        group = v1 / "sbx-job-hosts"
        group.mkdir(exist_ok=True)
        (group / "cpu.shares").write_text(str(max(2, weight * 1024 // 100)))
        moves.append((v1, group, "cpu"))
    elif weight > 0 and pids and (Path("/sys/fs/cgroup") / "cgroup.controllers").exists():
        group = Path("/sys/fs/cgroup") / "sbx-job-hosts"
        group.mkdir(exist_ok=True)
        (group / "cpu.weight").write_text(str(max(1, weight)))
        moves.append((group.parent, group, ""))
    accounted: Path | None = None
    cpuacct = Path("/sys/fs/cgroup/cpuacct")
    if pids and (cpuacct / "cpuacct.usage").exists() and cpuacct.resolve() != v1.resolve():
        accounted = cpuacct / "sbx-job-hosts"
        accounted.mkdir(exist_ok=True)
        moves.append((cpuacct, accounted, "cpuacct"))
    elif group is not None and (group / "cpuacct.usage").exists():
        accounted = group  # cpu and cpuacct mounted together
    came_from = {(pid, controller): cgroup_of(pid, controller) for pid in pids for _, _, controller in moves}
    for _, where, _ in moves:
        for pid in pids:
            with contextlib.suppress(OSError):
                (where / "cgroup.procs").write_text(str(pid))
    try:
        yield JobHosts(str(group) if group else None, accounted)
    finally:
        for hierarchy, _, controller in moves:
            for pid in pids:
                back = hierarchy / (came_from.get((pid, controller)) or "/").lstrip("/")
                with contextlib.suppress(OSError):
                    (back / "cgroup.procs").write_text(str(pid))


def daemon_pid() -> int:
    return int((STATE / "run" / "bridge.pid").read_text())


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def status_mb(pid: int, field: str) -> float:
    """A memory line of /proc/PID/status (VmRSS, VmHWM...) in MB; 0 when it is absent."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return 0.0


def peak_rss_mb(pid: int) -> float:
    return status_mb(pid, "VmHWM")


def slurmd_launches(since: float) -> dict[int, float]:
    """When each slurmd got a batch job to start (its log's millisecond stamps: the job is RUNNING
    in slurmctld by then), by job id, for launches after `since`."""
    launched: dict[int, float] = {}
    pattern = re.compile(r"^\[([0-9T:.-]+)\] Launching batch JobId=(\d+) ")
    for path in (STATE / "log").glob("slurmd-*.log"):
        with path.open(errors="replace") as log:
            for line in log:
                found = pattern.match(line)
                if found:
                    stamp = datetime.fromisoformat(found.group(1)).timestamp()
                    if stamp >= since:
                        launched[int(found.group(2))] = stamp
    return launched


def latencies(since: float) -> tuple[list[float], list[float], list[float]]:
    """In ms, for jobs after `since`: (slurmd's launch → pod created, waiter's attach → pod created,
    first container end → the waiter told the outcome, as the daemon measured it)."""
    attach: dict[int, float] = {}
    created: dict[int, float] = {}
    to_end: list[float] = []
    for line in LOG.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        stamp = datetime.fromisoformat(record.get("timestamp", "").replace("Z", "+00:00")).timestamp()
        if stamp < since or "job_id" not in record:
            continue
        job, event = record["job_id"], record.get("event")
        if event == "attach.accepted":
            attach.setdefault(job, stamp)
        elif event == "pod.created":
            created.setdefault(job, stamp)
        elif event == "job.finished" and record.get("pod_end_to_job_end_s") is not None:
            to_end.append(record["pod_end_to_job_end_s"] * 1000)
    launched = slurmd_launches(since)
    running_to_pod = [(created[j] - launched[j]) * 1000 for j in created if j in launched]
    attach_to_pod = [(created[j] - attach[j]) * 1000 for j in created if j in attach]
    return running_to_pod, attach_to_pod, to_end


def wait_for_no_pods(sandbox: Sandbox, timeout: float = 180.0) -> None:
    """Until the bridge's pods of the last run are gone, so the next run does not pay for them."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listed = sandbox.kubectl("get", "pods", "-n", JOB_NAMESPACE, "--no-headers", check=False).stdout
        if not listed.strip():
            return
        time.sleep(2)


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
    parser.add_argument("--dra-tasks", type=int, default=int(os.environ.get("BENCH_DRA_TASKS", "100")),
                        help="tasks of 1 GPU each in simdra (GPUs by DRA claims) and as many without GPUs in "
                        "sim, to count the claims' API writes per pod (0: skip it)")
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

    samples: dict[str, list[int]] = {"waiter": [], "slurmd": [], "slurmstepd": []}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(2.0):
            samples["waiter"] += pss_kb(r"slurm-k8s-bridge-waiter\.pyz?( |$)")
            samples["slurmd"] += pss_kb(r"(^|/)slurmd ")
            samples["slurmstepd"] += pss_kb(r"^slurmstepd")

    sampler = threading.Thread(target=sample, daemon=True)
    since, cpu_before, requests_before = time.time(), cpu_seconds(pid), kube_requests_sent(sandbox)
    sampler.start()
    hosts_before = hosts.cpu_seconds()
    bridged_s, _, wrong = run_array(sandbox, "sim", args.tasks, script,
                                    f"SIM_RUN_TIME={args.run_time},SIM_EXIT_CODE=0")
    stop.set()
    bridged_hosts_ms = per_job(hosts, hosts_before, args.tasks)
    cpu = (cpu_seconds(pid) - cpu_before) / bridged_s
    requests_after = kube_requests_sent(sandbox)
    requests_per_s = None  # unknown, or the daemon restarted meanwhile (its count began again)
    if requests_before is not None and requests_after is not None and requests_after >= requests_before:
        requests_per_s = round((requests_after - requests_before) / bridged_s, 1)
    running_to_pod, attach_to_pod, to_end = latencies(since)
    print(f"bridged: {args.tasks} tasks on {sim_nodes} sim nodes in {bridged_s:.1f}s "
          f"({args.tasks / bridged_s:.2f} jobs/s), {wrong} wrong exit codes, "
          f"{requests_per_s} API requests/s from the bridge")
    wait_for_no_pods(sandbox)

    with native_partition_over(sandbox, sim_hostlist) as native_partition:
        native_script = bench_work_dir() / "native.sh"
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

    lines_s = lost = extra = lines_wrong = None
    if args.lines_tasks > 0:
        lines_s, lost, extra, lines_wrong = lost_lines_run(sandbox, args.lines_tasks, args.lines_per_task)
        print(f"lines: {args.lines_tasks} tasks x {args.lines_per_task} lines on the real kubelets in "
              f"{lines_s:.1f}s, {lost} lost and {extra} extra lines, {lines_wrong} wrong exit codes")

    plain_writes = dra_writes = dra_wrong = dra_s = None
    if args.dra_tasks > 0:
        env = f"SIM_RUN_TIME={args.run_time},SIM_EXIT_CODE=0"
        plain_writes, plain_wrong, _ = writes_per_task(sandbox, "sim", args.dra_tasks, script, env,
                                                       "--gres=gpu:1")
        dra_writes, dra_wrong, dra_s = writes_per_task(sandbox, "simdra", args.dra_tasks, script, env,
                                                       "--gres=gpu:1")
        dra_wrong += plain_wrong
        print(f"dra: {args.dra_tasks} 1-GPU tasks in simdra in {dra_s:.1f}s, {dra_writes} API writes per pod "
              f"against {plain_writes} in sim (env mode), {dra_wrong} wrong exit codes")

    jobs_per_s = args.tasks / bridged_s
    wrapper_rate = args.wrapper_tasks / wrapper_s if wrapper_s else None
    # A rate that came with wrong exit codes compares nothing: no ratio then.
    ratio_native = round(native_s / bridged_s, 3) if not (wrong or native_wrong) else None
    ratio_wrapper = (round(jobs_per_s / wrapper_rate, 2) if wrapper_rate and not (wrong or wrapper_wrong)
                     else None)
    result = {
        "nodes": sim_nodes,
        "tasks": args.tasks,
        "jobs_per_s": round(jobs_per_s, 2),
        "native_jobs_per_s": round(args.tasks / native_s, 2),
        "native_wrong_exit_codes": native_wrong,
        # A slice: each of its jobs costs as much as a bridged one at any count (4 kubectl runs).
        "kubectl_wrapper_tasks": args.wrapper_tasks or None,
        "kubectl_wrapper_jobs_per_s": round(wrapper_rate, 2) if wrapper_rate else None,
        "kubectl_wrapper_wrong_exit_codes": wrapper_wrong,
        "ratio_vs_native": ratio_native,
        "ratio_vs_kubectl_wrapper": ratio_wrapper,
        # From the slurmd's batch launch (the job RUNNING) to the first pod created.
        "running_to_pod_ms_p50": percentile(running_to_pod, 0.5),
        "running_to_pod_ms_p99": percentile(running_to_pod, 0.99),
        # The daemon's own part of it: from the waiter's attach.
        "attach_to_pod_ms_p50": percentile(attach_to_pod, 0.5),
        "attach_to_pod_ms_p99": percentile(attach_to_pod, 0.99),
        "pod_end_to_job_end_ms_p50": percentile(to_end, 0.5),
        "pod_end_to_job_end_ms_p99": percentile(to_end, 0.99),
        "bridge_cpu_cores": round(cpu, 3),
        "bridge_peak_rss_mb": round(peak_rss_mb(pid), 1),
        # The bridge's own requests (kube_requests_total), watches, log streams and execs included.
        "apiserver_requests_per_s": requests_per_s,
        "wrong_exit_codes": wrong,
        # The DRA claims' cost (one pod per task): writes per pod in simdra minus in sim.
        "dra_tasks": args.dra_tasks or None,
        "dra_writes_per_pod": dra_writes,
        "env_mode_writes_per_pod": plain_writes,
        "dra_claim_writes_per_pod": (round(dra_writes - plain_writes, 2)
                                     if dra_writes is not None and plain_writes is not None else None),
        "dra_wrong_exit_codes": dra_wrong,
        "lost_lines": lost,
        "extra_lines": extra,
        "lines_tasks": args.lines_tasks or None,
        "lines_per_task": args.lines_per_task if args.lines_tasks else None,
        "lines_wrong_exit_codes": lines_wrong,
        "waiter_pss_kb": round(statistics.median(samples["waiter"])) if samples["waiter"] else None,
        "slurmd_pss_kb": round(statistics.median(samples["slurmd"])) if samples["slurmd"] else None,
        "slurmstepd_pss_kb": (round(statistics.median(samples["slurmstepd"]))
                              if samples["slurmstepd"] else None),
        # CPU of every slurmd and all it started (slurmstepds; then the waiters, the native jobs or
        # kubectl), per job of the run. The daemon and the API server are not in it.
        "job_hosts_cpu_ms_per_job": bridged_hosts_ms,
        "native_job_hosts_cpu_ms_per_job": native_hosts_ms,
        "kubectl_wrapper_job_hosts_cpu_ms_per_job": wrapper_hosts_ms,
        "job_hosts_cpu_group": hosts.group,
        "job_hosts_weight": args.job_hosts_weight if hosts.group else None,
    }
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
