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
     the kwok nodes' published mock GPUs), the daemon's API writes per pod in each;
  6. Kubernetes-submitted (run right after 1, beside it): as many pods as 1 has tasks, as batch/v1
     Jobs of 4 pods in alice's managed namespace team-alice, annotated into `sim`; each Job is one
     Slurm job of alice's. Pods per second (first create → last pod Succeeded), Slurm jobs per
     second, pending → bound and bound → Succeeded p50/p99, the daemon's API and slurmrestd
     requests per pod (the sbatch run's beside them), and its correctness: one Slurm job per Job
     in sacct, every one COMPLETED 0:0, every Job Complete, no pod bound twice.
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
           [--lines-tasks 16] [--lines-per-task 2000] [--dra-tasks 100] [--k8s-tasks 300]
           [--k8s-pods-per-job 4] [--job-hosts-weight 100]
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
from typing import Any

from bench import parties
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
              options: tuple[str, ...] = (), at_once: int | None = None) -> tuple[float, int, int]:
    """(seconds, array job id, tasks not COMPLETED 0:0); `at_once` tasks at most run at once."""
    started = time.monotonic()
    limit = f"%{at_once}" if at_once else ""
    array_id = sandbox.sbatch("-p", partition, f"--array=0-{tasks - 1}{limit}", "-o", output, *options,
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


def kube_requests_by_verb(sandbox: Sandbox) -> dict[str, float] | None:
    """The daemon's own count of requests it sent to the API server, by verb (its /metrics'
    kube_requests_total), or None."""
    url = f"http://127.0.0.1:{sandbox.environ().get('SBX_BRIDGE_PORT', '8470')}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            text = answer.read().decode()
    except OSError:
        return None
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("slurm_k8s_bridge_kube_requests_total{"):
            found = re.search(r'verb="([^"]*)"', line)
            verb = found.group(1) if found else "?"
            counts[verb] = counts.get(verb, 0.0) + float(line.rsplit(" ", 1)[1])
    return counts


def kube_requests_sent(sandbox: Sandbox, verbs: tuple[str, ...] | None = None) -> float | None:
    """The daemon's own count of requests it sent to the API server (of `verbs`; all by default),
    or None."""
    counts = kube_requests_by_verb(sandbox)
    if counts is None:
        return None
    return sum(total for verb, total in counts.items() if verbs is None or verb in verbs)


def requests_per_pod(before: dict[str, float] | None, after: dict[str, float] | None, pods: int,
                     log_offset: int) -> dict[str, float] | None:
    """The daemon's API requests between two readings, per pod, by verb (with "all"); None when a
    reading is missing or the daemon restarted between them (its counts began again).

    Payload Secrets (one per sbatch task: each task's environment differs) are deleted by the
    daemon's sweep at least 5 minutes after their job, so a window holds the deletes of earlier
    runs' Secrets and none of its own: those counted in the window (the daemon logs each from
    `log_offset` of its log on) are taken out, and each Secret it made is counted as its delete."""
    if before is None or after is None or pods <= 0 or any(after.get(v, 0.0) < n for v, n in before.items()):
        return None
    delta = {verb: after[verb] - before.get(verb, 0.0) for verb in after}
    secrets = bridge_events(log_offset, "secret.swept", "secret.created")
    delta["DELETE"] = max(0.0, delta.get("DELETE", 0.0) - secrets["secret.swept"] + secrets["secret.created"])
    per_pod = {verb: round(n / pods, 2) for verb, n in sorted(delta.items()) if n > 0}
    per_pod["all"] = round(sum(delta.values()) / pods, 2)
    return per_pod


def bridge_events(offset: int, *events: str) -> Counter[str]:
    """How many lines of each of `events` the daemon logged from `offset` of its log on."""
    with LOG.open("rb") as log:
        log.seek(offset)
        text = log.read().decode(errors="replace")
    found: Counter[str] = Counter()
    for event in events:
        found[event] = text.count(f'"event": "{event}"')
    return found


SLURMRESTD_LOG = STATE / "log" / "slurmrestd.log"


def log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def slurmrestd_requests(since_offset: int) -> dict[str, int]:
    """The requests slurmrestd logged (one `operations_router` line each) from `since_offset` of its
    log on, by method and endpoint ("GET jobs/state", "POST job/submit", "GET job/{id}"); only the
    daemon talks to slurmrestd while the benchmark holds the sandbox. The daemon has no counter of
    its own for them."""
    counts: Counter[str] = Counter()
    pattern = re.compile(r"operations_router: \[[^\]]*\] ([A-Z]+) /slurm(?:db)?/v[0-9.]+/(\S*)")
    try:
        with SLURMRESTD_LOG.open("rb") as log:
            log.seek(since_offset)
            text = log.read().decode(errors="replace")
    except OSError:
        return {}
    for found in pattern.finditer(text):
        counts[f"{found.group(1)} {re.sub(r'[0-9]+', '{id}', found.group(2).strip('/'))}"] += 1
    return dict(sorted(counts.items()))


def rest_per_pod(counts: dict[str, int], pods: int) -> dict[str, float] | None:
    if not counts or pods <= 0:
        return None
    per_pod = {method: round(n / pods, 2) for method, n in counts.items()}
    per_pod["all"] = round(sum(counts.values()) / pods, 2)
    return per_pod


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


def pod_creations(since: float) -> dict[int, float]:
    """When the daemon created each job's first pod (its log's `pod.created`), by job id, for jobs
    after `since`: with `since` the array's submission, the sbatch path's pending → pod (its pods are
    created already bound to the node Slurm chose)."""
    created: dict[int, float] = {}
    for line in LOG.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") != "pod.created" or "job_id" not in record:
            continue
        stamp = datetime.fromisoformat(record.get("timestamp", "").replace("Z", "+00:00")).timestamp()
        if stamp >= since:
            created.setdefault(record["job_id"], stamp)
    return created


# -- 6. Kubernetes-submitted: pods of batch/v1 Jobs in a managed namespace --------------------------

K8S_NAMESPACE = "team-alice"
"""alice's managed namespace (containers/bridge/common.sh): its pods become Slurm jobs of alice's in
lab_alice, as the sbatch run's tasks are alice's."""
K8S_AS = ("--as=alice", "--as-group=system:authenticated")
"""alice's own rights (edit in team-alice, nothing more), as a Kubernetes user of a site has them."""
K8S_UID_GID = 2001
"""alice's uid and gid: the bridge refuses a pod that would not run as its Slurm job's user."""
RUN_LABEL = "bench.slurm-k8s-bridge/run"
"""On the run's Jobs and their pods: what the watch, the checks and the clean-up select."""
OPEN_STATES = ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "REQUEUED", "SUSPENDED", "RESIZING")


def k8s_job_manifest(name: str, pods: int, run: str, run_time: str) -> dict[str, Any]:
    """A Job of `pods` pods at once (parallelism = completions: one gang, so one Slurm job), no retry;
    each pod ends 0 after `run_time` through kwok, as the sbatch run's tasks do. The pod asks for little
    (one Slurm CPU per task either way), with limits (the bridge sizes the Slurm job from them), and
    runs as alice without escalation: else the bridge refuses it."""
    annotations = {"slurm-k8s-bridge/partition": "sim",
                   "pod-complete.stage.kwok.x-k8s.io/delay": run_time,
                   "pod-complete.stage.kwok.x-k8s.io/exit-code": "0"}
    container = {"name": "main", "image": "sandbox.local/busybox:1", "command": ["true"],
                 "resources": {"requests": {"cpu": "100m", "memory": "32Mi"},
                               "limits": {"cpu": "100m", "memory": "32Mi"}},
                 "securityContext": {"runAsUser": K8S_UID_GID, "runAsGroup": K8S_UID_GID,
                                     "runAsNonRoot": True, "allowPrivilegeEscalation": False}}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "labels": {RUN_LABEL: run}},
            "spec": {"parallelism": pods, "completions": pods, "backoffLimit": 0,
                     "template": {"metadata": {"labels": {RUN_LABEL: run}, "annotations": annotations},
                                  "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                                           "containers": [container]}}}}


@dataclass
class PodTimes:
    """What the benchmark's watch saw of one pod, in time.time() seconds."""

    name: str
    seen: float
    bound: float | None = None
    ended: float | None = None
    phase: str = ""


class PodWatch:
    """`kubectl get pods --watch` of the run's pods, read in a thread: when each pod was first seen,
    first seen bound (spec.nodeName) and first seen Succeeded or Failed. The API server's own stamps
    (creationTimestamp, PodScheduled's lastTransitionTime) are whole seconds, too coarse for
    latencies of a few seconds; a watch event comes within milliseconds. One watch, on a label: the
    API server serves it from its cache, and the polling of 300 pods a second it saves would weigh
    on the API server that the daemon is measured against."""

    def __init__(self, sandbox: Sandbox, namespace: str, selector: str) -> None:
        self.pods: dict[str, PodTimes] = {}
        self._lock = threading.Lock()
        self._proc = subprocess.Popen(
            ["kubectl", "get", "pods", "-n", namespace, "-l", selector, "--watch", "--output-watch-events",
             "-o", "json"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=sandbox.environ())
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        # With --output-watch-events kubectl prints each event as one line of JSON; should a version
        # indent it, the lines are gathered until they make a whole document.
        assert self._proc.stdout is not None
        lines: list[str] = []
        for line in self._proc.stdout:
            lines.append(line)
            if not line.rstrip().endswith("}"):
                continue
            try:
                event = json.loads("".join(lines))
            except ValueError:
                continue  # not whole yet: read on
            lines = []
            if isinstance(event, dict):
                self._apply(event, time.time())

    def _apply(self, event: dict[str, Any], now: float) -> None:
        pod = event.get("object") or {}
        if event.get("type") not in ("ADDED", "MODIFIED") or pod.get("kind") != "Pod":
            return
        meta = pod.get("metadata") or {}
        with self._lock:
            times = self.pods.setdefault(meta.get("uid", ""), PodTimes(meta.get("name", ""), now))
            if times.bound is None and (pod.get("spec") or {}).get("nodeName"):
                times.bound = now
            phase = (pod.get("status") or {}).get("phase", "")
            if times.ended is None and phase in ("Succeeded", "Failed"):
                times.ended, times.phase = now, phase

    def snapshot(self) -> dict[str, PodTimes]:
        with self._lock:
            return {uid: PodTimes(t.name, t.seen, t.bound, t.ended, t.phase) for uid, t in self.pods.items()}

    def alive(self) -> bool:
        return self._proc.poll() is None

    def stop(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._thread.join(timeout=10)


def api_time(text: str | None) -> float | None:
    """An API server timestamp (RFC 3339, UTC) in time.time() seconds."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() if text else None


def pod_bound_lines(offset: int) -> dict[str, list[float]]:
    """`namespace/pod` → the stamps of the daemon's `pod.bound` lines from `offset` of its log on: one
    each, or the pod was bound twice."""
    with LOG.open("rb") as log:
        log.seek(offset)
        text = log.read().decode(errors="replace")
    bound: dict[str, list[float]] = {}
    for line in text.splitlines():
        if '"pod.bound"' not in line:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        stamp = api_time(record.get("timestamp"))
        if record.get("event") == "pod.bound" and stamp is not None:
            bound.setdefault(str(record.get("pod")), []).append(stamp)
    return bound


def refusals(offset: int, prefix: str) -> list[str]:
    """The reasons of the daemon's `gang.refused` lines, from `offset` of its log on, for gangs whose
    pods' names start with `prefix`."""
    with LOG.open("rb") as log:
        log.seek(offset)
        text = log.read().decode(errors="replace")
    reasons = []
    for line in text.splitlines():
        if '"gang.refused"' not in line:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if any(str(name).startswith(prefix) for name in record.get("pods") or []):
            reasons.append(str(record.get("reason")))
    return reasons


def sacct_by_name(sandbox: Sandbox, names: list[str], since: float) -> dict[str, list[tuple[str, str, str]]]:
    """Job name → its Slurm jobs (JobID, State, ExitCode), every user's, that ran after `since`: a Job's
    Slurm job is named `<namespace>/<Job>`, so a duplicate shows as a second row of that name."""
    start = datetime.fromtimestamp(since - 60).strftime("%Y-%m-%dT%H:%M:%S")
    out = sandbox.slurm("sacct", "-a", "-X", "-n", "-P", "-S", start, "--name", ",".join(names),
                        "-o", "JobID,JobName,State,ExitCode", check=False).stdout
    rows: dict[str, list[tuple[str, str, str]]] = {}
    for line in out.splitlines():
        fields = line.split("|")
        if len(fields) == 4 and fields[1] in names:
            state = fields[2].split()[0] if fields[2] else ""  # "CANCELLED by 0"
            rows.setdefault(fields[1], []).append((fields[0], state, fields[3]))
    return rows


@dataclass
class K8sRun:
    """What the Kubernetes-submitted run measured."""

    pods: int
    jobs: int
    pods_s: float | None
    """First create → the last pod seen Succeeded (or Failed)."""
    pods_succeeded: int
    slurm_s: float | None
    """First create → every Slurm job of the run final in sacct, polled each second as the sbatch
    run's array is (None: not all were in time)."""
    pending_to_bound: list[float]
    """Per pod: its creation → its binding."""
    create_to_bound: list[float]
    """Per pod: the run's first create (the Jobs') → its binding, as the sbatch run's submission → pod."""
    bound_to_end: list[float]
    requests_per_pod: dict[str, float] | None
    slurmrestd_per_pod: dict[str, float] | None
    slurm_jobs_seen: int
    duplicates: int
    missing: int
    wrong_states: int
    jobs_complete: int
    jobs_failed: int
    pods_not_succeeded: int
    pods_bound_twice: int
    bridge_cpu_cores: float
    hosts_cpu_ms_per_job: float | None


def k8s_run(sandbox: Sandbox, hosts: JobHosts, pods: int, pods_per_job: int, run_time: str) -> K8sRun:
    """`pods` pods as Jobs of `pods_per_job` (the last one smaller if they do not divide), created at
    once by alice in team-alice, into `sim`. It waits until every Slurm job is final in sacct and every
    pod has ended (or every Job has, some pods never having run; or the sbatch run's deadline passed),
    then deletes the Jobs, and counts the daemon's requests once their pods are gone (a deletion is
    part of a pod's life)."""
    run = f"{os.getpid()}-{int(time.time()) % 100000}"
    sizes = [pods_per_job] * (pods // pods_per_job) + ([pods % pods_per_job] if pods % pods_per_job else [])
    names = [f"bench-k8s-{run}-{i:03d}" for i in range(len(sizes))]
    slurm_names = [f"{K8S_NAMESPACE}/{name}" for name in names]
    body = json.dumps({"apiVersion": "v1", "kind": "List",
                       "items": [k8s_job_manifest(n, size, run, run_time) for n, size in zip(names, sizes,
                                                                                              strict=True)]})
    selector = f"{RUN_LABEL}={run}"
    watch = PodWatch(sandbox, K8S_NAMESPACE, selector)
    time.sleep(2)  # the watch's initial (empty) list is done: every pod of the run is an event to it
    log_offset, rest_offset = log_size(LOG), log_size(SLURMRESTD_LOG)
    pid = daemon_pid()
    requests_before, cpu_before = kube_requests_by_verb(sandbox), cpu_seconds(pid)
    hosts_before = hosts.cpu_seconds()
    started, started_mono = time.time(), time.monotonic()
    pods_s: float | None = None
    slurm_s: float | None = None
    rows: dict[str, list[tuple[str, str, str]]] = {}
    jobs: list[dict[str, Any]] = []
    listed: list[dict[str, Any]] = []
    try:
        subprocess.run(["kubectl", "create", "-n", K8S_NAMESPACE, "-f", "-", *K8S_AS], input=body, check=True,
                       capture_output=True, text=True, timeout=120, env=sandbox.environ())
        deadline = started_mono + max(600.0, 3.0 * pods)
        last_end: float | None = None  # the last pod's end so far, as the watch saw it
        ended_count, all_ended = 0, False
        while time.monotonic() < deadline:
            if not all_ended and watch.alive():
                ended = [t.ended for t in watch.snapshot().values() if t.ended is not None]
                last_end = max(ended, default=None)
                all_ended = len(ended) >= pods
            elif not all_ended:  # the watch ended (the API server closed it): ask each second
                phases = [(pod.get("status") or {}).get("phase") for pod in sandbox.kubectl_json(
                    "get", "pods", "-n", K8S_NAMESPACE, "-l", selector)["items"]]
                count = sum(phase in ("Succeeded", "Failed") for phase in phases)
                if count > ended_count:
                    ended_count, last_end = count, time.time()
                all_ended = count >= pods
            if slurm_s is None:
                rows = sacct_by_name(sandbox, slurm_names, started)
                if len(rows) == len(slurm_names) and all(state not in OPEN_STATES
                                                         for found in rows.values() for _, state, _ in found):
                    slurm_s = time.monotonic() - started_mono
            # A gang the bridge refused (the pods' spec no longer what it accepts) never ends: say
            # why now, not at the deadline.
            refused = refusals(log_offset, f"bench-k8s-{run}-")
            if refused:
                print(f"kubernetes: the bridge refused {len(refused)} of the run's gangs, e.g.: {refused[0]}")
                break
            # Every Slurm job over and every Job ended, though some pods never did (deleted before
            # they ran): nothing more will end, so waiting on would only dilute the per-pod counts.
            if slurm_s is not None and (all_ended or jobs_over(k8s_jobs(sandbox, selector), len(names))):
                break
            time.sleep(1)
        pods_s = last_end - started if last_end is not None else None
        cpu = (cpu_seconds(pid) - cpu_before) / (time.monotonic() - started_mono)
        hosts_ms = per_job(hosts, hosts_before, len(names))
        # The Job controller marks a Job Complete shortly after its last pod; give it that while.
        for _ in range(30):
            jobs = k8s_jobs(sandbox, selector)
            if jobs_over(jobs, len(names)):
                break
            time.sleep(1)
        listed = sandbox.kubectl_json("get", "pods", "-n", K8S_NAMESPACE, "-l", selector)["items"]
        rows = sacct_by_name(sandbox, slurm_names, started)
    finally:
        watch.stop()
        k8s_clean_up(sandbox, selector, slurm_names)
    time.sleep(2)  # the daemon's answers to the deletions
    requests_after = kube_requests_by_verb(sandbox)

    seen = watch.snapshot()
    bound_lines = pod_bound_lines(log_offset)
    pending_to_bound: list[float] = []
    create_to_bound: list[float] = []
    bound_to_end: list[float] = []
    for pod in listed:
        meta, status = pod["metadata"], pod.get("status") or {}
        times = seen.get(meta["uid"])
        created = api_time(meta.get("creationTimestamp"))
        # The watch's first sight, unless it came more than the stamp's second late (a watch that
        # started late would shorten pending → bound).
        if created is not None:
            created = min(times.seen, created + 1.0) if times is not None else created + 0.5
        scheduled = next((api_time(c.get("lastTransitionTime")) for c in status.get("conditions") or []
                          if c.get("type") == "PodScheduled" and c.get("status") == "True"), None)
        # The daemon's own stamp of the binding first, then the watch's, then the API server's second.
        stamps = bound_lines.get(f"{K8S_NAMESPACE}/{meta['name']}")
        bound = stamps[0] if stamps else (times.bound if times is not None and times.bound else scheduled)
        if created is not None and bound is not None:
            pending_to_bound.append(bound - created)
        if bound is not None:
            create_to_bound.append(bound - started)
        if bound is not None and times is not None and times.ended is not None:
            bound_to_end.append(times.ended - bound)
    ids = [job_id for found in rows.values() for job_id, _, _ in found]
    succeeded = sum(1 for pod in listed if (pod.get("status") or {}).get("phase") == "Succeeded")
    return K8sRun(
        pods=pods, jobs=len(names), pods_s=pods_s, slurm_s=slurm_s,
        pending_to_bound=pending_to_bound, create_to_bound=create_to_bound, bound_to_end=bound_to_end,
        requests_per_pod=requests_per_pod(requests_before, requests_after, pods, log_offset),
        slurmrestd_per_pod=rest_per_pod(slurmrestd_requests(rest_offset), pods),
        slurm_jobs_seen=len(set(ids)),
        duplicates=sum(len(found) - 1 for found in rows.values()),
        missing=sum(1 for name in slurm_names if name not in rows),
        wrong_states=sum(1 for found in rows.values() for _, state, code in found
                         if (state, code) != ("COMPLETED", "0:0")),
        jobs_complete=sum(map(job_complete, jobs)),
        jobs_failed=sum(job_ended(job) == "Failed" for job in jobs),
        pods_succeeded=succeeded,
        pods_not_succeeded=pods - succeeded,
        pods_bound_twice=sum(1 for stamps in bound_lines.values() if len(stamps) > 1),
        bridge_cpu_cores=round(cpu, 3),
        hosts_cpu_ms_per_job=hosts_ms,
    )


def job_ended(job: dict[str, Any]) -> str | None:
    """"Complete" or "Failed" once the Job controller has said so."""
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") in ("Complete", "Failed") and condition.get("status") == "True":
            return str(condition["type"])
    return None


def job_complete(job: dict[str, Any]) -> bool:
    return job_ended(job) == "Complete"


def jobs_over(jobs: list[dict[str, Any]], count: int) -> bool:
    """All `count` Jobs of the run exist and have ended, Complete or Failed."""
    return len(jobs) >= count and all(job_ended(job) is not None for job in jobs)


def k8s_jobs(sandbox: Sandbox, selector: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = sandbox.kubectl_json("get", "jobs", "-n", K8S_NAMESPACE, "-l",
                                                       selector)["items"]
    return items


def k8s_clean_up(sandbox: Sandbox, selector: str, slurm_names: list[str]) -> None:
    """The run's Jobs with their pods (a pod still pending takes its Slurm job with it: the daemon
    cancels it), then any Slurm job of theirs still open, so the next run has sim to itself."""
    sandbox.kubectl("delete", "jobs", "-n", K8S_NAMESPACE, "-l", selector, "--cascade=background",
                    "--wait=false", "--ignore-not-found", check=False)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        left = sandbox.kubectl("get", "pods", "-n", K8S_NAMESPACE, "-l", selector, "--no-headers",
                               check=False).stdout
        if not left.strip():
            break
        time.sleep(2)
    open_jobs = sandbox.slurm("squeue", "-h", "-a", "--name", ",".join(slurm_names), "-o", "%i",
                              check=False).stdout.split()
    if open_jobs:
        print(f"kubernetes: Slurm jobs {' '.join(open_jobs)} still open after the run's Jobs were deleted: "
              "cancelled")
        sandbox.slurm("scancel", *open_jobs, check=False)


def seconds_ms(values: list[float], q: float) -> float | None:
    """The q-quantile of latencies in seconds, in ms (as the other latencies of the JSON line)."""
    return percentile([v * 1000 for v in values], q)


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
    k8s_tasks = os.environ.get("BENCH_K8S_TASKS")
    parser.add_argument("--k8s-tasks", type=int, default=int(k8s_tasks) if k8s_tasks else None,
                        help="pods of the Kubernetes-submitted run, as batch/v1 Jobs in team-alice (default: "
                        "--tasks; 0: skip it)")
    parser.add_argument("--k8s-pods-per-job", type=int,
                        default=int(os.environ.get("BENCH_K8S_PODS_PER_JOB", "4")),
                        help="pods of each Job of that run (each Job is one Slurm job)")
    parser.add_argument("--job-hosts-weight", type=int,
                        default=int(os.environ.get("BENCH_JOB_HOSTS_WEIGHT", "100")))
    args = parser.parse_args()
    if args.k8s_tasks is None:
        args.k8s_tasks = args.tasks
    if args.k8s_pods_per_job < 1:
        parser.error("--k8s-pods-per-job must be at least 1")
    with slurmds_in_cpu_group(args.job_hosts_weight) as hosts:
        run(args, hosts)


def per_job(hosts: JobHosts, before: float | None, jobs: int) -> float | None:
    """CPU milliseconds per job that the slurmds and all they started used since `before`."""
    after = hosts.cpu_seconds()
    return round((after - before) * 1000 / jobs, 1) if after is not None and before is not None else None


def print_parties(hosts_ms: float | None, bridged: dict[str, float], native_hosts_ms: float | None,
                  native: dict[str, float]) -> None:
    """Each party's CPU per job, bridged and native, and the jobs/s one core of it would sustain."""
    names = ("job_hosts", *parties.PARTIES)
    bridged_all = {"job_hosts": hosts_ms, **bridged}
    native_all = {"job_hosts": native_hosts_ms, **native}
    print("CPU ms per job (bridged / native), and jobs/s one core of that party sustains:")
    for name in names:
        mine, theirs = bridged_all[name], native_all[name]
        print(f"  {name:17} {mine} / {theirs} ms; {parties.jobs_per_core_second(mine)} / "
              f"{parties.jobs_per_core_second(theirs)} jobs/s per core")


def rate(count: int, seconds: float | None) -> float | None:
    return round(count / seconds, 2) if seconds else None


def verbs_text(per_pod: dict[str, float] | None) -> str:
    """"4.1 (GET 1.0, PATCH 2.1, ...)" of a by-verb count per pod; "unknown" without one."""
    if per_pod is None:
        return "unknown"
    return f"{per_pod['all']} ({', '.join(f'{v} {n}' for v, n in per_pod.items() if v != 'all')})"


def print_k8s(k8s: K8sRun, sim_nodes: int, sbatch_rate: float, submit_to_pod: list[float],
              sbatch_requests: dict[str, float] | None, sbatch_rest: dict[str, float] | None) -> None:
    """The run's lines, each with the sbatch run's figure beside it."""
    def p(values: list[float], q: float) -> str:
        found = seconds_ms(values, q)
        return f"{found / 1000:.1f}s" if found is not None else "-"

    over = (f"in {k8s.pods_s:.1f}s ({k8s.pods_succeeded / k8s.pods_s:.2f} pods/s" if k8s.pods_s
            else "(no pod ended")
    slurm = (f"{k8s.jobs / k8s.slurm_s:.2f} Slurm jobs/s" if k8s.slurm_s
             else "not all Slurm jobs final in time")
    print(f"kubernetes: {k8s.pods} pods as {k8s.jobs} Jobs on {sim_nodes} sim nodes {over}, {slurm}; "
          f"sbatch {sbatch_rate:.2f} jobs/s of one pod)")
    print(f"  pending → bound p50 {p(k8s.pending_to_bound, 0.5)} p99 {p(k8s.pending_to_bound, 0.99)}, "
          f"first create → bound p50 {p(k8s.create_to_bound, 0.5)} p99 {p(k8s.create_to_bound, 0.99)} "
          f"(sbatch → pod p50 {p(submit_to_pod, 0.5)} p99 {p(submit_to_pod, 0.99)}), bound → Succeeded "
          f"p50 {p(k8s.bound_to_end, 0.5)} p99 {p(k8s.bound_to_end, 0.99)}")
    print(f"  API requests per pod {verbs_text(k8s.requests_per_pod)}; sbatch {verbs_text(sbatch_requests)}")
    print(f"  slurmrestd requests per pod {verbs_text(k8s.slurmrestd_per_pod)}; "
          f"sbatch {verbs_text(sbatch_rest)}")
    print(f"  {k8s.slurm_jobs_seen} Slurm jobs in sacct for {k8s.jobs} Jobs ({k8s.duplicates} duplicates, "
          f"{k8s.missing} missing), {k8s.wrong_states} not COMPLETED 0:0, {k8s.jobs_complete} of {k8s.jobs} "
          f"Jobs Complete ({k8s.jobs_failed} Failed), {k8s.pods_not_succeeded} pods not Succeeded, "
          f"{k8s.pods_bound_twice} bound twice; the bridge {k8s.bridge_cpu_cores} cores")


def k8s_result(k8s: K8sRun | None, pods_per_job: int) -> dict[str, Any]:
    """The Kubernetes-submitted run's keys of the JSON line (None each when it was skipped)."""
    if k8s is None:
        return {"k8s_pods": None}
    return {
        "k8s_pods": k8s.pods,
        "k8s_jobs": k8s.jobs,
        "k8s_pods_per_job": pods_per_job,
        # First create → last pod Succeeded (the watch's stamp), over the pods that did.
        "k8s_pods_per_s": rate(k8s.pods_succeeded, k8s.pods_s),
        # First create → every Slurm job final in sacct, as jobs_per_s is measured.
        "k8s_slurm_jobs_per_s": rate(k8s.jobs, k8s.slurm_s),
        "k8s_pending_to_bound_ms_p50": seconds_ms(k8s.pending_to_bound, 0.5),
        "k8s_pending_to_bound_ms_p99": seconds_ms(k8s.pending_to_bound, 0.99),
        "k8s_create_to_bound_ms_p50": seconds_ms(k8s.create_to_bound, 0.5),
        "k8s_create_to_bound_ms_p99": seconds_ms(k8s.create_to_bound, 0.99),
        "k8s_bound_to_succeeded_ms_p50": seconds_ms(k8s.bound_to_end, 0.5),
        "k8s_bound_to_succeeded_ms_p99": seconds_ms(k8s.bound_to_end, 0.99),
        "k8s_api_requests_per_pod": k8s.requests_per_pod,
        "k8s_slurmrestd_requests_per_pod": k8s.slurmrestd_per_pod,
        "k8s_slurm_jobs_seen": k8s.slurm_jobs_seen,
        "k8s_duplicate_slurm_jobs": k8s.duplicates,
        "k8s_missing_slurm_jobs": k8s.missing,
        "k8s_wrong_states": k8s.wrong_states,
        "k8s_jobs_complete": k8s.jobs_complete,
        "k8s_jobs_failed": k8s.jobs_failed,
        "k8s_pods_not_succeeded": k8s.pods_not_succeeded,
        "k8s_pods_bound_twice": k8s.pods_bound_twice,
        "k8s_bridge_cpu_cores": k8s.bridge_cpu_cores,
        "k8s_job_hosts_cpu_ms_per_job": k8s.hosts_cpu_ms_per_job,
    }


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
            samples["waiter"] += pss_kb(r"/slurm-k8s-bridge-waiter( |$)")  # the compiled one
            samples["slurmd"] += pss_kb(r"(^|/)slurmd ")
            samples["slurmstepd"] += pss_kb(r"^slurmstepd")

    sampler = threading.Thread(target=sample, daemon=True)
    since, cpu_before, by_verb_before = time.time(), cpu_seconds(pid), kube_requests_by_verb(sandbox)
    requests_before = sum(by_verb_before.values()) if by_verb_before is not None else None
    rest_offset, log_offset = log_size(SLURMRESTD_LOG), log_size(LOG)
    sampler.start()
    hosts_before, parties_before = hosts.cpu_seconds(), parties.cpu_by_party()
    bridged_s, _, wrong = run_array(sandbox, "sim", args.tasks, script,
                                    f"SIM_RUN_TIME={args.run_time},SIM_EXIT_CODE=0")
    stop.set()
    bridged_hosts_ms = per_job(hosts, hosts_before, args.tasks)
    bridged_parties = parties.ms_per_job(parties_before, parties.cpu_by_party(), args.tasks)
    cpu = (cpu_seconds(pid) - cpu_before) / bridged_s
    requests_after = kube_requests_sent(sandbox)
    requests_per_s = None  # unknown, or the daemon restarted meanwhile (its count began again)
    if requests_before is not None and requests_after is not None and requests_after >= requests_before:
        requests_per_s = round((requests_after - requests_before) / bridged_s, 1)
    running_to_pod, attach_to_pod, to_end = latencies(since)
    # The sbatch path's pending → pod: from the array's submission to each task's pod, created bound.
    submit_to_pod = [stamp - since for stamp in pod_creations(since).values()]
    print(f"bridged: {args.tasks} tasks on {sim_nodes} sim nodes in {bridged_s:.1f}s "
          f"({args.tasks / bridged_s:.2f} jobs/s), {wrong} wrong exit codes, "
          f"{requests_per_s} API requests/s from the bridge")
    wait_for_no_pods(sandbox)
    # Per pod, as the Kubernetes-submitted run counts them: once the daemon has deleted its pods.
    time.sleep(2)
    sbatch_requests = requests_per_pod(by_verb_before, kube_requests_by_verb(sandbox), args.tasks, log_offset)
    sbatch_rest = rest_per_pod(slurmrestd_requests(rest_offset), args.tasks)

    k8s: K8sRun | None = None
    if args.k8s_tasks > 0:
        k8s = k8s_run(sandbox, hosts, args.k8s_tasks, args.k8s_pods_per_job, args.run_time)
        print_k8s(k8s, sim_nodes, args.tasks / bridged_s, submit_to_pod, sbatch_requests, sbatch_rest)

    with native_partition_over(sandbox, sim_hostlist) as native_partition:
        native_script = bench_work_dir() / "native.sh"
        native_script.write_text(f"#!/bin/sh\nsleep {seconds_of(args.run_time)}\nexit 0\n")
        hosts_before, parties_before = hosts.cpu_seconds(), parties.cpu_by_party()
        native_s, _, native_wrong = run_array(sandbox, native_partition, args.tasks, native_script,
                                              "BENCH=1", user="root")
        native_hosts_ms = per_job(hosts, hosts_before, args.tasks)
        native_parties = parties.ms_per_job(parties_before, parties.cpu_by_party(), args.tasks)
        print(f"native: {args.tasks} tasks on the same {sim_nodes} nodes in {native_s:.1f}s "
              f"({args.tasks / native_s:.2f} jobs/s), {native_wrong} wrong exit codes")
        print_parties(bridged_hosts_ms, bridged_parties, native_hosts_ms, native_parties)
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
        # From the array's submission to each task's pod (created bound): the sbatch path's
        # pending → bound, beside the Kubernetes-submitted run's.
        "submit_to_pod_ms_p50": seconds_ms(submit_to_pod, 0.5),
        "submit_to_pod_ms_p99": seconds_ms(submit_to_pod, 0.99),
        # The daemon's API requests per task (all verbs, by verb), its pods' deletes included; and
        # the requests slurmrestd logged meanwhile (only the daemon uses it during the benchmark).
        "api_requests_per_pod": sbatch_requests,
        "slurmrestd_requests_per_pod": sbatch_rest,
        **k8s_result(k8s, args.k8s_pods_per_job),
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
        # Each party's CPU per job, apart, and what one core of it would sustain (jobs/s per core).
        "parties_cpu_ms_per_job": {"job_hosts": bridged_hosts_ms, **bridged_parties},
        "native_parties_cpu_ms_per_job": {"job_hosts": native_hosts_ms, **native_parties},
        "jobs_per_s_per_job_host_core": parties.jobs_per_core_second(bridged_hosts_ms),
        "native_jobs_per_s_per_job_host_core": parties.jobs_per_core_second(native_hosts_ms),
        "jobs_per_s_per_control_plane_core": parties.jobs_per_core_second(bridged_parties["control_plane"]),
        "jobs_per_s_per_bridge_daemon_core": parties.jobs_per_core_second(bridged_parties["bridge_daemon"]),
        "job_hosts_cpu_group": hosts.group,
        "job_hosts_weight": args.job_hosts_weight if hosts.group else None,
    }
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
