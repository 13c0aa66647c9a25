"""What a pod's start costs on the real kubelets, bridged against a bare pod, and a 64-task array at
8 at a time, native against bridged: prints numbers, asserts nothing (issue 22's floors).

1. created → script running, on kreal1, one pod at a time:
   - bare: a pod created with kubectl (no bridge, no init container), cached image;
   - bridged: an sbatch job in `k8s` pinned to kreal1 (the daemon's `pod.created` → the script's
     first instruction).
   Both scripts read /proc/uptime first; the host shares the kernel's clock, so its boot time turns
   that into this host's epoch time (10 ms resolution).
2. `--array=0-63%8` of a script that reads the clock: native on the native slurmds, bridged in `k8s`;
   the wall time, the time of a wave (8 tasks) = wall / 8, and where a task's time goes, leg by
   leg (bench/waves.py: slurmctld's and the daemon's logs, and the script's clock).

Usage (sandbox and bridge up):  .venv/bin/python bench/kubelet_start.py [--pods 10] [--tasks 64]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
import uuid
from datetime import datetime
from pathlib import Path

from bench.scale import LOG, run_array
from bench.waves import legs, print_legs
from tests.e2e.sandbox import Sandbox, sandbox_env, wait_until, write_script

IMAGE = "sandbox.local/busybox:1"
READ_CLOCK = "cut -d' ' -f1 /proc/uptime"


def boot_epoch() -> float:
    """This host's epoch time of the kernel's boot (what /proc/uptime counts from)."""
    return time.time() - float(Path("/proc/uptime").read_text().split()[0])


def bare_pod_start(sandbox: Sandbox, namespace: str) -> float:
    """Seconds from `kubectl create` to the script's first instruction, for one bare pod on kreal1."""
    name = f"bench-bare-{uuid.uuid4().hex[:6]}"
    manifest = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
                "spec": {"nodeName": "kreal1", "restartPolicy": "Never",
                         "tolerations": [{"operator": "Exists"}],
                         "containers": [{"name": "main", "image": IMAGE, "imagePullPolicy": "Never",
                                         "command": ["sh", "-c", READ_CLOCK]}]}}
    created = time.time()
    sandbox.kubectl_create(manifest)
    wait_until("the bare pod to end", lambda: sandbox.kubectl(
        "get", "pod", "-n", namespace, name, "-o", "jsonpath={.status.phase}").stdout
        in ("Succeeded", "Failed"), timeout=60)
    started = boot_epoch() + float(sandbox.kubectl("logs", "-n", namespace, name).stdout.split()[0])
    sandbox.kubectl("delete", "pod", "-n", namespace, name, "--wait=false", check=False)
    return started - created


def pod_created_at(job_id: int) -> float | None:
    for line in LOG.read_text().splitlines():
        if f'"job_id": {job_id},' in line and '"pod.created"' in line:
            stamp = json.loads(line)["timestamp"].replace("Z", "+00:00")
            return datetime.fromisoformat(stamp).timestamp()
    return None


def bridged_pod_start(sandbox: Sandbox, script: Path) -> float:
    """Seconds from the daemon's pod creation to the script's first instruction, one job on kreal1."""
    out = script.parent / f"bench-start-{uuid.uuid4().hex[:6]}.out"
    job_id = sandbox.sbatch("-p", "k8s", "-w", "kreal1", "-o", str(out), str(script))
    sandbox.wait_job_final(job_id, timeout=120)
    created = wait_until("the daemon's pod.created line", lambda: pod_created_at(job_id), timeout=10)
    started = boot_epoch() + float(out.read_text().split()[0])
    return started - created


def summary(values: list[float]) -> str:
    ms = sorted(v * 1000 for v in values)
    return f"median {statistics.median(ms):6.0f} ms  min {ms[0]:6.0f}  max {ms[-1]:6.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=10)
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--at-once", type=int, default=8)
    args = parser.parse_args()
    sandbox = Sandbox(env=sandbox_env())
    script = write_script(sandbox, "alice", "bench-start.sh",
                          f"#!/bin/sh\n#K8S image={IMAGE}\n{READ_CLOCK}\n")
    # A kubelet relists its containers each second and starts the job container after the one
    # that notices the init container's end: pods created at one phase of that second all take
    # alike. A random pause before each spreads the phases, bare and bridged alike.
    spread = random.Random(22)
    bare, bridged = [], []
    for _ in range(args.pods):
        time.sleep(spread.random())
        bare.append(bare_pod_start(sandbox, "default"))
    for _ in range(args.pods):
        time.sleep(spread.random())
        bridged.append(bridged_pod_start(sandbox, script))
    print(f"created → script running on kreal1, {args.pods} pods one at a time:")
    print(f"  bare pod (kubectl, no bridge)  {summary(bare)}")
    print(f"  bridged (sbatch -p k8s)        {summary(bridged)}")
    print(f"  ratio of medians {statistics.median(bridged) / statistics.median(bare):.2f}")
    # The script's first instruction reads the clock: the breakdown's "script running" moment.
    array = write_script(sandbox, "alice", "bench-array.sh", f"#!/bin/sh\n#K8S image={IMAGE}\n{READ_CLOCK}\n")
    waves = args.tasks / args.at_once
    results = {"bare_start_ms": statistics.median(bare) * 1000,
               "bridged_start_ms": statistics.median(bridged) * 1000}
    print(f"--array=0-{args.tasks - 1}%{args.at_once} of reading the clock:")
    breakdowns = {}
    home = sandbox.home("alice")
    for partition in ("native", "k8s"):
        wall, array_id, wrong = run_array(sandbox, partition, args.tasks, array, "BENCH=1",
                                          at_once=args.at_once, output=str(home / "wave-%A-%a.out"))
        print(f"  {partition:7} wall {wall:6.1f} s, a wave {wall / waves:5.2f} s, not COMPLETED 0:0: {wrong}")
        results[f"{partition}_array_s"] = wall
        breakdowns[partition] = legs(array_id, home, boot_epoch())
        for old in home.glob(f"wave-{array_id}-*.out"):
            old.unlink()
    print(f"  bridged / native wall time {results['k8s_array_s'] / results['native_array_s']:.2f}")
    for partition, found in breakdowns.items():
        print_legs(f"a task's legs, {partition} (from slurmctld's and the daemon's logs):", found)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
