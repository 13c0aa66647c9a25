"""Crashes of what runs a job, while jobs stream output: a real node's kubelet and containerd, and
slurmctld, each killed -9 and started again by an idempotent sandbox-up. Natively slurmctld's crash
changes nothing for a running job; a bridged job on the crashed kubelet's node must lose no line of
its -o/-e files, double none and keep its exit code, as the same jobs in native do through the same
slurmctld crash. (The daemon, slurmrestd, munged and the API server are the faults of
test_every_exit_code_right_under_load.)

Wall times are printed (run with -s), never asserted."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.e2e.sandbox import REPO, Sandbox, job_trail, wait_until, write_script

RUN = Path("/var/lib/slurm-k8s-sandbox/run")
BUSYBOX = "#K8S image=sandbox.local/busybox:1\n"
CODES = (0, 3, 0, 7)
STREAMING = (
    "#!/bin/sh\n" + BUSYBOX
    # Until the test says the crashes are over (a file in the shared home), so that every crash
    # comes mid-stream however slow the machine.
    + 'i=0\nwhile [ ! -e "$2" ]; do echo "line $i"; echo "err $i" >&2; i=$((i+1)); sleep 0.05; done\n'
    + 'printf "last after %d lines" "$i"\nexit "$1"\n'
)
LAST_LINE = re.compile(rb"last after ([0-9]+) lines\Z")
FAULTS = ("kubelet-kreal1", "containerd-kreal1", "slurmctld")


def _crash_and_restart(name: str) -> float:
    """kill -9 of one sandbox daemon, then sandbox-up starts just that one again; the seconds it
    was down."""
    pid = int((RUN / f"{name}.pid").read_text())
    started = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    wait_until(f"{name} ({pid}) gone", lambda: not Path(f"/proc/{pid}").exists() or None, timeout=30)
    up = subprocess.run(["make", "-s", "-C", str(REPO), "sandbox-up"], capture_output=True, text=True,
                        timeout=300)
    assert up.returncode == 0, f"sandbox-up after {name}'s crash failed:\n{up.stdout}{up.stderr}"
    return time.monotonic() - started


def _lines_so_far(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def test_crashed_kubelet_containerd_and_slurmctld_lose_no_line_and_no_exit_code(bridge: Sandbox) -> None:
    directory = bridge.home("alice") / f"crashes-{int(time.time())}"
    bridge.slurm("mkdir", str(directory), user="alice")
    script = write_script(bridge, "alice", "crashes-streaming.sh", STREAMING)
    crashes_over = directory / "crashes-over"
    jobs: dict[tuple[str, int], int] = {}
    for partition, where in (("native", ()), ("k8s", ("-w", "kreal1"))):
        for index, code in enumerate(CODES):
            out, err = (directory / f"{partition}-{index}.{kind}" for kind in ("out", "err"))
            jobs[partition, index] = bridge.sbatch("-p", partition, *where, "--mem=100M", "-o", str(out),
                                                   "-e", str(err), str(script), str(code), str(crashes_over))
    # Every stream live before the first crash: each bridged job has written some lines.
    outputs = [directory / f"{partition}-{index}.out" for partition, index in jobs]
    wait_until("every job streaming", lambda: all(_lines_so_far(out) >= 20 for out in outputs), timeout=180)
    downtimes = {name: _crash_and_restart(name) for name in FAULTS}
    bridge.slurm("touch", str(crashes_over), user="alice")
    with ThreadPoolExecutor(len(jobs)) as pool:
        finals = dict(zip(jobs, pool.map(lambda job: bridge.wait_job_final(job, timeout=300), jobs.values()),
                          strict=True))
    for index, code in enumerate(CODES):
        native, bridged = finals["native", index], finals["k8s", index]
        trail = job_trail(jobs["k8s", index])
        assert (bridged["State"], bridged["ExitCode"]) == (native["State"], native["ExitCode"]), \
            f"{bridged} vs {native}\n{trail}"
        assert native["ExitCode"] == f"{code}:0"
        for partition in ("native", "k8s"):
            out, err = ((directory / f"{partition}-{index}.{kind}").read_bytes() for kind in ("out", "err"))
            last = LAST_LINE.search(out)
            assert last, f"{partition} job {index}'s -o file does not end with its last line\n{trail}"
            lines = int(last.group(1))
            # Each line once, in order, none lost (the same holds of native's, whatever its count).
            assert out == "".join(f"line {i}\n" for i in range(lines)).encode() + last.group(), \
                f"{partition} job {index}'s -o file lost or doubled lines\n{trail}"
            assert err == "".join(f"err {i}\n" for i in range(lines)).encode(), \
                f"{partition} job {index}'s -e file lost or doubled lines\n{trail}"
    print("\ndown (kill -9 to restarted): " + ", ".join(f"{name} {s:.1f}s" for name, s in downtimes.items()))
