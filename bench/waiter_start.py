"""Start-up cost of the waiter as the slurmds run it (`python3 -I -S FILE`): prints, asserts nothing.

Each FILE is started with no arguments (it imports every module it needs, prints its usage and
exits 2), in turn, RUNS times after 3 warm-ups; CPU is the child's user + system time.

Usage:  python3 bench/waiter_start.py [--runs 40] [--python /usr/bin/python3] FILE [FILE ...]
e.g. the waiter before the zipapp against today's:
  git show 87150fc:bridge/waiter/attach.py > /tmp/attach-before.py
  python3 -m bridge.waiter.build /tmp/waiter.pyz
  python3 bench/waiter_start.py /tmp/attach-before.py /tmp/waiter.pyz
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
    parser.add_argument("--python", default="/usr/bin/python3")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    cpu_ms: dict[str, list[float]] = {f: [] for f in args.files}
    wall_ms: dict[str, list[float]] = {f: [] for f in args.files}
    for run in range(WARM_UP + args.runs):
        for name in args.files:  # in turn, so that a drift of the machine's speed hits all alike
            cpu, wall = child_cpu_s(), time.perf_counter()
            subprocess.run([args.python, "-I", "-S", name], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, check=False)
            if run >= WARM_UP:
                wall_ms[name].append((time.perf_counter() - wall) * 1000)
                cpu_ms[name].append((child_cpu_s() - cpu) * 1000)
    summary = {}
    for name in args.files:
        cpu, wall = cpu_ms[name], wall_ms[name]
        print(f"{name}: CPU ms min/median/max {min(cpu):.1f}/{statistics.median(cpu):.1f}/{max(cpu):.1f}"
              f"  wall ms {min(wall):.1f}/{statistics.median(wall):.1f}/{max(wall):.1f}")
        summary[name] = {"cpu_ms_median": round(statistics.median(cpu), 1),
                         "wall_ms_median": round(statistics.median(wall), 1)}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
