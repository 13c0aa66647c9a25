"""Start-up cost of the compiled waiter as the slurmds run it (by absolute path): prints, asserts
nothing.

Each PROGRAM is started with no arguments (it prints its usage and exits 2), in turn, RUNS times
after 3 warm-ups; CPU is the child's user + system time.

Usage:  python3 bench/waiter_start.py [--runs 40] PROGRAM [PROGRAM ...]
e.g. the installed waiter against this checkout's (deploy/slurm/install-waiter.sh builds it, as root):
  deploy/slurm/install-waiter.sh /root/bench/waiter
  python3 bench/waiter_start.py /usr/libexec/slurm-k8s-bridge/waiter /root/bench/waiter
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import time

WARM_UP = 3


def child_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("programs", nargs="+")
    args = parser.parse_args()
    cpu_ms: dict[str, list[float]] = {p: [] for p in args.programs}
    wall_ms: dict[str, list[float]] = {p: [] for p in args.programs}
    for run in range(WARM_UP + args.runs):
        for name in args.programs:  # in turn, so that a drift of the machine's speed hits all alike
            cpu, wall = child_cpu_s(), time.perf_counter()
            subprocess.run([name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
            if run >= WARM_UP:
                wall_ms[name].append((time.perf_counter() - wall) * 1000)
                cpu_ms[name].append((child_cpu_s() - cpu) * 1000)
    summary = {}
    for name in args.programs:
        cpu, wall = cpu_ms[name], wall_ms[name]
        print(f"{name}: CPU ms min/median/max {min(cpu):.2f}/{statistics.median(cpu):.2f}/{max(cpu):.2f}"
              f"  wall ms {min(wall):.2f}/{statistics.median(wall):.2f}/{max(wall):.2f}")
        summary[name] = {"cpu_ms_median": round(statistics.median(cpu), 2),
                         "wall_ms_median": round(statistics.median(wall), 2)}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
