"""The srun steps of a batch script. The script's srun in the pod asks, through the daemon's attach
stream, for a step; the batch waiter (attach.Waiter) hands the request here, and this runs Slurm's
srun for it on the slurmd host: a real step whose tasks are the bridge's task proxies (task.py).
Its output goes back to the script's srun through the step-output relay (relay.py), its end by
step-done. On the slurmd host nothing of the user runs: the proxies only stream what the daemon
runs in the pods, and srun gets the job's layout and nothing else of its environment."""

from __future__ import annotations

import binascii
import contextlib
import json
import os
import signal
import subprocess
import time

from bridge.core.srun_options import host_io_options, refused_exit_code, split_srun_args
from bridge.waiter.environment import SAFE_ENVIRONMENT
from bridge.waiter.http_client import DaemonError, reconnect_delay
from bridge.waiter.output import write_all
from bridge.waiter.relay import StepOutputRelay, run_relayed

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from bridge.waiter.http_client import PostAction

STEP_SIGNALS = frozenset(int(s) for s in (
    signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
    signal.SIGALRM, signal.SIGCONT))
"""= bridge.controller.steps.SIGNALS_FOR_SRUN: what the script's srun passes on to Slurm's."""
STEP_TOKEN = "SLURM_K8S_BRIDGE_STEP_TOKEN"
MAX_CONCURRENT_STEPS = 64
"""Real sruns a waiter runs at once for its script (each is a slurmctld RPC and a slurmstepd)."""
SRUN_PATHS = ("/usr/bin/srun", "/usr/local/bin/srun", "/opt/slurm/bin/srun")
SRUN_LAYOUT_VARIABLES = frozenset({
    "SLURM_JOB_ID", "SLURM_JOBID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NNODES", "SLURM_JOB_NUM_NODES",
    "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_NTASKS_PER_CORE", "SLURM_NTASKS_PER_SOCKET",
    "SLURM_CPUS_PER_TASK", "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_JOB_CPUS_PER_NODE",
    "SLURM_CPUS_ON_NODE", "SLURM_MEM_PER_CPU", "SLURM_MEM_PER_NODE", "SLURM_MEM_PER_GPU", "SLURM_GPUS",
    "SLURM_GPUS_PER_NODE", "SLURM_GPUS_PER_TASK", "SLURM_CLUSTER_NAME", "SLURM_JOB_PARTITION",
    "SLURM_JOB_NAME", "SLURM_DISTRIBUTION", "SLURM_OVERCOMMIT", "SLURM_THREADS_PER_CORE",
    # The job's GPUs per task and their binding (sbatch --gpus-per-task, --gpu-bind), which
    # Slurm 26.05 hands its sruns as TRES strings: without them every task got the step's GPUs.
    "SLURM_TRES_PER_TASK", "SLURM_TRES_BIND", "SLURM_GPU_BIND", "SLURM_GPUS_PER_SOCKET",
    "SLURM_CPUS_PER_GPU",
})
"""What Slurm's srun is started with of the batch environment: the job's layout, nothing else.
Many other SLURM_* variables are srun options (SLURM_PROLOG, SLURM_TASK_PROLOG, SLURM_CONTAINER,
SLURM_BCAST, SLURM_MPI_TYPE, SLURM_EXPORT_ENV, ...) that would run or place the user's things on
this host, and a job may export any of them."""


def srun_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of the waiter's srun: the job's layout variables, a fixed PATH and locale,
    and SLURM_CONF only if root owns it and only root can write it (a user may export their own)."""
    env = {k: v for k, v in environ.items() if k in SRUN_LAYOUT_VARIABLES}
    env.update(SAFE_ENVIRONMENT)
    conf = environ.get("SLURM_CONF", "")
    if conf.startswith("/") and root_controlled(conf):
        env["SLURM_CONF"] = conf
    return env


def root_controlled(path: str) -> bool:
    """The file and every directory above it are owned by root and writable by nobody else, and
    none of them is a symlink: what is read there now and later is root's (Slurm also reads files
    beside it, plugstack.conf)."""
    current = path
    while True:
        try:
            info = os.lstat(current)
        except OSError:
            return False
        if (info.st_mode & 0o170000) == 0o120000 or info.st_uid != 0 or info.st_mode & 0o022:
            return False
        parent = os.path.dirname(current)
        if parent == current:
            return True
        current = parent


def srun_binary() -> str:
    """Slurm's srun by absolute path, never from the job's PATH."""
    for path in SRUN_PATHS:
        if os.access(path, os.X_OK):
            return path
    raise OSError(f"srun is not installed on this host (looked for {', '.join(SRUN_PATHS)})")


class ScriptSteps:
    """The steps one batch waiter runs for its script: the one owner of which were started (a
    request seen again after a reconnect is not run twice), how many run, and their sruns."""

    def __init__(
        self, url: tuple[str, str, int], job_id: int, ca_file: str | None, own_command: list[str],
        post: PostAction,
    ) -> None:
        self._url, self._job_id, self._ca_file = url, job_id, ca_file
        # How the waiter was started, less its batch script: the task proxies of a step are the
        # same command (the SPANK guard lets exactly that through as a step of a bridged job).
        self.own_command = own_command
        self._post = post
        self._started: set[str] = set()
        self.active = 0
        self.sruns: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, data: str, token: str, io: object = ()) -> None:
        """The script ran srun: run Slurm's srun for it here; its output goes where the script's
        goes, and its exit code back to the script's srun. `io`: the step's file options as the
        daemon made them (the files' paths on this host, see bridge/core/step_request.py)."""
        import threading  # only for jobs that use srun

        try:
            request = json.loads(binascii.a2b_base64(data))
            key = str(int(request["key"]))
            argv = [str(a) for a in request["argv"]]
        except (ValueError, KeyError, TypeError, binascii.Error):
            return  # not a step request of the agent's: nothing to run
        try:
            options, _command = split_srun_args(argv)
            options += host_io_options(list(io) if isinstance(io, list | tuple) else None)
        except ValueError as error:
            write_all(2, f"{error}\n".encode())
            threading.Thread(target=self.done, args=(key, refused_exit_code(error)), daemon=True).start()
            return
        if key in self._started:
            return  # seen before a reconnect
        self._started.add(key)
        if not token or self.active >= MAX_CONCURRENT_STEPS:
            write_all(2, b"srun: error: this step was not started (too many at once, or not signed)\n")
            threading.Thread(target=self.done, args=(key, 1), daemon=True).start()
            return
        try:
            srun = srun_binary()
        except OSError as error:
            write_all(2, f"srun: error: {error}\n".encode())
            threading.Thread(target=self.done, args=(key, 1), daemon=True).start()
            return
        command = [srun, f"--jobid={os.environ.get('SLURM_JOB_ID', '')}", *options, "--chdir=/",
                   *self.own_command, "task", key]
        env = srun_environment(os.environ)
        env[STEP_TOKEN] = token  # the SPANK guard checks it (the daemon signed this very step)
        self.active += 1

        def run() -> None:
            relay = StepOutputRelay(self._url, self._job_id, key, self._ca_file)
            try:
                code = run_relayed(command, env, relay, lambda proc: self.sruns.__setitem__(key, proc))
            except (OSError, ValueError) as error:  # ValueError: a NUL byte in an argument
                write_all(2, f"srun: error: {error}\n".encode())
                code = 1
            self.sruns.pop(key, None)
            self.active -= 1
            if not relay.delivered:
                self.done(key, code)

        threading.Thread(target=run, name=f"step-{key}", daemon=True).start()

    def signal(self, key: str, signum: object) -> None:
        """The script's srun got `signum`: Slurm's srun of that step gets it, and does what it
        does natively (cancels the step on TERM, passes USR1 on to the tasks, ...)."""
        proc = self.sruns.get(key)
        if proc is None or not isinstance(signum, int) or signum not in STEP_SIGNALS:
            return
        if proc.poll() is not None:
            return
        with contextlib.suppress(OSError):
            proc.send_signal(signum)

    def done(self, key: str, code: int) -> None:
        """Tell the daemon the step ended with `code` (the script's srun exits with it)."""
        for attempt in range(20):
            try:
                self._post("step-done", {"key": key, "code": code}, 10).close()
                return
            except DaemonError as error:
                if 400 <= error.status < 500:
                    return
            except OSError:
                pass
            time.sleep(reconnect_delay(attempt))
