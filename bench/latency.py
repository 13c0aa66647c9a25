"""Latency of the bridge on the sandbox: prints numbers, asserts nothing.

For N sequential jobs in the `k8s` partition it measures, on one clock (this host's):
  sbatch→running sbatch called → Slurm shows the job RUNNING (submit, job_submit.lua, scheduling)
  running→pod    Slurm shows the job RUNNING → the daemon has created its pod
  attach→pod     the waiter attached → pod created (the daemon's own share)
  pod→end        pod created → the daemon saw the container end (the kubelet's share: start, run, report)
  end→slurm      the daemon saw the container end → Slurm no longer shows the job RUNNING
  sbatch→end     wall time of the whole job (script: `exit 0`)

Usage (sandbox and bridge up):  .venv/bin/python bench/latency.py [--jobs 10]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import threading
import time
from datetime import datetime
from pathlib import Path

from tests.e2e.sandbox import Sandbox, sandbox_env, write_script

LOG = Path("/var/lib/slurm-k8s-sandbox/log/bridge.log")


def squeue_state(env: dict[str, str], job_id: int) -> str:
    out = subprocess.run(["squeue", "-h", "-j", str(job_id), "-o", "%T"], env=env,
                         capture_output=True, text=True).stdout.strip()
    return out or "GONE"


def watch_states(env: dict[str, str], job_id: int, seen: dict[str, float], stop: threading.Event) -> None:
    """Record the first time (epoch s) each squeue state of the job is seen, polling fast."""
    while not stop.is_set():
        state = squeue_state(env, job_id)
        seen.setdefault(state, time.time())
        if state not in ("PENDING", "RUNNING", "CONFIGURING"):
            return
        time.sleep(0.005)


def log_events(job_id: int) -> dict[str, float]:
    events: dict[str, float] = {}
    for line in LOG.read_text().splitlines():
        if f'"job_id": {job_id},' not in line and f'"job_id": {job_id}}}' not in line:
            continue
        record = json.loads(line)
        stamp = datetime.fromisoformat(record["timestamp"].replace("Z", "+00:00")).timestamp()
        events.setdefault(record["event"], stamp)
    return events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10)
    args = parser.parse_args()
    sandbox = Sandbox(env=sandbox_env())
    env = sandbox.environ()
    script = write_script(sandbox, "alice", "bench-latency.sh",
                          "#!/bin/sh\n#K8S image=sandbox.local/busybox:1\nexit 0\n")
    rows: dict[str, list[float]] = {"sbatch→running": [], "running→pod": [], "attach→pod": [], "pod→end": [],
                                    "end→slurm": [], "sbatch→end": []}
    for _ in range(args.jobs):
        t0 = time.time()
        job_id = sandbox.sbatch("-p", "k8s", str(script))
        seen: dict[str, float] = {}
        stop = threading.Event()
        watcher = threading.Thread(target=watch_states, args=(env, job_id, seen, stop))
        watcher.start()
        watcher.join(timeout=60)
        stop.set()
        time.sleep(0.3)  # let the daemon flush its log
        events = log_events(job_id)
        ended = min(v for k, v in seen.items() if k not in ("PENDING", "RUNNING", "CONFIGURING"))
        rows["sbatch→running"].append(seen.get("RUNNING", events["pod.created"]) - t0)
        rows["running→pod"].append(events["pod.created"] - seen.get("RUNNING", events["pod.created"]))
        rows["attach→pod"].append(events["pod.created"] - events["attach.accepted"])
        rows["pod→end"].append(events["job.finished"] - events["pod.created"])
        rows["end→slurm"].append(ended - events["job.finished"])
        rows["sbatch→end"].append(ended - t0)
    print(f"{args.jobs} jobs, one at a time, partition k8s (real kubelets), times in ms")
    print(f"{'':15}{'median':>10}{'p90':>10}{'max':>10}")
    for name, values in rows.items():
        ms = sorted(v * 1000 for v in values)
        p90 = ms[min(len(ms) - 1, int(len(ms) * 0.9))]
        print(f"{name:15}{statistics.median(ms):10.0f}{p90:10.0f}{ms[-1]:10.0f}")


if __name__ == "__main__":
    main()
