"""The waiter's entry point: `waiter [--api URL] [--ca CA_FILE] BATCH_SCRIPT [ARG...] | task KEY |
step -- ARGV...`,
as the
slurmds run it (by default `/usr/bin/python3 -I -S /usr/libexec/slurm-k8s-bridge/waiter.py ...`,
the zipapp bridge/waiter/build.py makes of this package; any file name works). The batch script's
form runs the batch waiter (attach.py); `task KEY` is a task proxy (task.py) that Slurm's srun
starts for a step of the script; `step -- ARGV` is what the SPANK guard makes of a task of a step
the user started (user_step.py).

It runs on the slurmd host as the user, so it trusts nothing the user shapes: it is started by
absolute path in isolated mode, the SPANK guard strips LD_* and PYTHON* before it is exec'd, it runs
munge and srun by absolute path with a fixed environment, and it leaves the submit directory once
it has read it.

Only the standard library is imported: this runs once per job on the slurmd host and its start-up
time is part of the job's start latency. Every job starts one waiter, on hosts that start hundreds
at once: what it imports is paid per job (bench-scale: 40 ms of CPU to start, 15 of them imports).
So no module of the waiter imports typing (only for annotations), hashlib (OpenSSL: SHA-256 comes
from Python's own module) or random at run time, and ssl, threading, queue and select only when a
job needs them.
"""

from __future__ import annotations

import os
import signal
import sys

from bridge.core.waiter_protocol import FORWARDED
from bridge.waiter.attach import Waiter, original_script
from bridge.waiter.early_signals import hold_early_signals, take_early_signals
from bridge.waiter.environment import job_environment
from bridge.waiter.http_client import DEFAULT_API_URL
from bridge.waiter.output import say
from bridge.waiter.task import run_task
from bridge.waiter.user_step import run_user_step

USAGE = "usage: waiter [--api URL] [--ca CA_FILE] BATCH_SCRIPT [ARG...] | task KEY | step -- ARGV..."


def main(argv: list[str]) -> int:
    """Run the waiter or a task proxy as `argv` says; the process's exit code."""
    early = hold_early_signals()
    # What the job runs with is taken first; then the waiter leaves the user's directory, so
    # nothing it does afterwards can resolve a path there.
    environment = job_environment(dict(os.environ))
    work_dir = os.getcwd()
    api_url, ca_file = DEFAULT_API_URL, None
    while len(argv) >= 2 and argv[0] in ("--api", "--ca"):
        if argv[0] == "--api":
            api_url = argv[1]
        else:
            ca_file = argv[1]
        argv = argv[2:]
    if len(argv) == 2 and argv[0] == "task":
        return run_task(api_url, ca_file, argv[1], early)
    if len(argv) >= 3 and argv[:2] == ["step", "--"]:
        return run_user_step(api_url, ca_file, argv[2:], environment, work_dir, early)
    if not argv:
        say(USAGE)
        return 2
    # The batch script (slurmd's copy), then the arguments sbatch gave it ("$@" of the wrapper).
    arguments = argv[1:]
    job_id = int(environment["SLURM_JOB_ID"])
    with open(argv[0], encoding="utf-8", errors="surrogateescape") as file:
        script = original_script(file.read())
    os.chdir("/")
    waiter = Waiter(api_url, job_id, script, environment, work_dir, ca_file, arguments)

    def on_terminate(signum: int, _frame: object) -> None:
        # Silent, as a native batch script is: slurmstepd reports a cancel or a time limit itself.
        if not waiter.cancel_requested:
            waiter.request_cancel()

    signal.signal(signal.SIGTERM, on_terminate)
    signal.signal(signal.SIGINT, on_terminate)
    for signum in FORWARDED:
        signal.signal(signum, lambda number, _frame: waiter.forward_signal(number))
    for early_signum in take_early_signals(early):
        if early_signum in (signal.SIGTERM, signal.SIGINT):
            on_terminate(early_signum, None)
        else:
            waiter.forward_signal(early_signum)
    return waiter.run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
