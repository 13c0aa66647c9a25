"""What one waiter costs on a slurmd host: the compiled waiter of this checkout, built and installed
by deploy/slurm/install-waiter.sh as a site does (into a temporary directory). Prints, asserts
nothing; the last line is one JSON object. (Until issue 22 it compared the Python waiter too:
docs/benchmarks.md keeps those figures.)

The waiter runs RUNS times (after a warm-up) as a batch waiter against the fake daemon
of the unit tests (tests/unit/waiter_runs.py) for a job whose pod "sleeps" `--sleep` seconds:
attach, one log line, then the exit. Measured per run:

- start CPU: the waiter's own CPU (every thread's, /proc/PID/task/*/schedstat, ns) when its
  attach reaches the daemon, less the mean CPU of the wrapper that starts it (unshare, sh and
  mount, which bind the fake munge over /opt: measured alone, with /bin/true in its place);
- total CPU: user + system of the whole run (wait4), children (munge) included;
- PSS: /proc/PID/smaps_rollup mid-run, while `--parallel` waiters run at once (a host runs
  hundreds: their shared pages, the binary's text, are split among them), with its anonymous
  (private) and file-backed (shared) parts.

Needs root (mount namespaces, a root-owned install), Go and gcc.

Usage: PYTHONPATH=. .venv/bin/python bench/waiter_cost.py [--runs 5] [--parallel 20] [--sleep 2]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tests.unit.waiter_runs import Exchange, FakeDaemon, batch_script, fakes, namespaced

INSTALL_WAITER = Path(__file__).resolve().parents[1] / "deploy" / "slurm" / "install-waiter.sh"
ENV = {"SLURM_JOB_ID": "42", "HOME": "/", "LC_ALL": "C.UTF-8", "PATH": "/usr/bin:/bin"}


def cpu_ns(pid: int) -> int:
    """CPU time of every thread of `pid` so far (the first field of each schedstat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):  # a thread that just ended
            total += int((task / "schedstat").read_text().split()[0])
    return total


def pss_kb(pid: int) -> dict[str, float]:
    """Pss, Pss_Anon and Pss_File of `pid`, in kB."""
    found: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("Pss", "Pss_Anon", "Pss_File"):
            found[name.lower() + "_kb"] = int(value.split()[0])
    return found


def sleeping_job(seconds: float) -> Callable[[Exchange], None]:
    def attach(exchange: Exchange) -> None:
        exchange.stream()
        exchange.send({"type": "log", "pod": 0, "ts": "t1", "line": "sleeping"})
        time.sleep(seconds)
        exchange.send({"type": "exit", "code": 0, "signal": None})
    return attach


def wrapper_cpu_ns(opt: Path) -> float:
    """The mean CPU of the namespace wrapper alone."""
    samples = []
    for _ in range(5):
        proc = subprocess.Popen(namespaced(opt, ["/bin/true"]))
        _, _, usage = os.wait4(proc.pid, 0)
        proc.returncode = 0
        samples.append((usage.ru_utime + usage.ru_stime) * 1e9)
    return statistics.mean(samples)


def start(command: list[str], directory: Path, opt: Path, sleep_s: float) -> Callable[[], dict[str, float]]:
    """Start one waiter; what to call to wait for its end and get its figures."""
    daemon = FakeDaemon([sleeping_job(sleep_s)])
    script = directory / "slurm_script"
    api = f"http://127.0.0.1:{daemon.port}"
    proc = subprocess.Popen(namespaced(opt, [*command, "--api", api, str(script)]),
                            cwd=directory, env=ENV, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    sample: dict[str, float] = {}

    def measure() -> None:
        if daemon.event("attach-0").wait(60):
            sample["attach_cpu_ns"] = cpu_ns(proc.pid)
            time.sleep(sleep_s / 2)
            sample.update(pss_kb(proc.pid))

    watcher = threading.Thread(target=measure)
    watcher.start()

    def finish() -> dict[str, float]:
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        watcher.join()
        daemon.close()
        sample["total_cpu_ms"] = (usage.ru_utime + usage.ru_stime) * 1e3
        return sample

    return finish


def one_batch(
    command: list[str], directory: Path, opt: Path, sleep_s: float, parallel: int,
) -> list[dict[str, float]]:
    finishes = [start(command, directory, opt, sleep_s) for _ in range(parallel)]
    return [finish() for finish in finishes]


def installed_waiter(directory: Path) -> list[str]:
    """The waiter as install-waiter.sh puts it in place on a slurmd host."""
    dest = directory / "libexec" / "waiter"
    subprocess.run([str(INSTALL_WAITER), str(dest)], check=True, stdout=subprocess.DEVNULL, timeout=600)
    return [str(dest)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--parallel", type=int, default=20)
    parser.add_argument("--sleep", type=float, default=2.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        command = installed_waiter(directory)
        opt = fakes(directory)
        batch_script(directory, b"#!/bin/sh\nsleep 2\n")
        wrapper = wrapper_cpu_ns(opt)
        runs: list[dict[str, float]] = []
        for run in range(args.runs + 1):
            batch = one_batch(command, directory, opt, args.sleep, args.parallel)
            if run > 0:  # the first is the warm-up
                runs += batch
        start_ms = [(s["attach_cpu_ns"] - wrapper) / 1e6 for s in runs]
        figures = {
            "start_cpu_ms": round(statistics.median(start_ms), 2),
            "total_cpu_ms": round(statistics.median(s["total_cpu_ms"] for s in runs), 2),
            **{key: statistics.median(s[key] for s in runs)
               for key in ("pss_kb", "pss_anon_kb", "pss_file_kb")},
        }
        print(f"waiter: start CPU {figures['start_cpu_ms']} ms (to its attach, wrapper less), "
              f"whole run {figures['total_cpu_ms']} ms CPU with munge, PSS {figures['pss_kb']} kB "
              f"(anon {figures['pss_anon_kb']}, file {figures['pss_file_kb']}; {args.parallel} at once), "
              f"medians of {len(runs)}")
        print(f"wrapper (unshare, sh, mount): {wrapper / 1e6:.2f} ms CPU, subtracted from start CPU")
        print(json.dumps({"go": figures, "wrapper_cpu_ms": round(wrapper / 1e6, 2),
                          "parallel": args.parallel}))


if __name__ == "__main__":
    main()
