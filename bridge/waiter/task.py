"""The task proxy (`waiter task KEY`): started by Slurm's srun as one task of a step of the script,
it has the daemon run that task in the pod of this node, streams its output back here for srun to
gather (--label and all) as it would a native task's, passes on the signals slurmstepd sends the
task, and ends as the task ended. Started by main; the daemon's side is the task endpoints of
bridge/manager/api.py."""

from __future__ import annotations

import binascii
import contextlib
import json
import os
import signal
import sys
import time

from bridge.core.waiter_protocol import FORWARDED, USAGE_FD
from bridge.waiter.early_signals import take_early_signals
from bridge.waiter.http_client import DaemonError, post, reconnect_delay, split_url
from bridge.waiter.output import say, write_all
from bridge.waiter.usage import UsageFile

TASK_SIGNAL_ATTEMPTS = 5
"""A task proxy asks this often (jittered backoff, a few seconds) to have a signal passed on."""
TASK_SIGNAL_TIMEOUT_S = 150.0
"""How long a proxy waits for the daemon's answer: longer than the daemon may take (4 execs of
at most 30 s and their pauses), so a slow delivery is never asked for a second time."""

# Signals whose default action ends a process: a task that exits 128+N with one of them was ended
# by it (the pod's exec reports a death by signal N as 128+N, as a shell does).
ENDING_SIGNALS = frozenset(int(s) for s in (
    signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGILL, signal.SIGTRAP, signal.SIGABRT,
    signal.SIGBUS, signal.SIGFPE, signal.SIGKILL, signal.SIGUSR1, signal.SIGSEGV, signal.SIGUSR2,
    signal.SIGPIPE, signal.SIGALRM, signal.SIGTERM, signal.SIGXCPU, signal.SIGXFSZ, signal.SIGSYS))

PR_SET_DUMPABLE = 4
MAX_TASK_INPUT = 4 * 1024 * 1024
"""The most of a task's --input file a proxy sends along (it goes in the task request's body)."""

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable


def task_input() -> bytes | None:
    """The task's stdin as slurmstepd gave it to this proxy (srun --input: a file, or what srun
    read and sends), read to its end; None when there is none (/dev/null, or srun's own stdin, which
    is /dev/null here). ValueError for more than MAX_TASK_INPUT."""
    try:
        if os.isatty(0):
            return None
        data = b""
        while len(data) <= MAX_TASK_INPUT:
            more = os.read(0, MAX_TASK_INPUT + 1 - len(data))
            if not more:
                break
            data += more
    except OSError:
        return None
    if len(data) > MAX_TASK_INPUT:
        raise ValueError(f"the task's input is larger than the {MAX_TASK_INPUT >> 20} MiB a task "
                         "of a job that runs in Kubernetes can be given")
    return data or None


def end_as_the_task(code: int) -> int:
    """End the proxy as its task in the pod ended: by signal N when that ended it, so that srun
    and sacct see what they see natively ("task 0: Terminated", a step's exit code from the tasks
    that exited). Returns the exit code otherwise."""
    signum = code - 128
    if signum in ENDING_SIGNALS:
        sys.stdout.flush()
        sys.stderr.flush()
        # The user picks the code: a SEGV or ABRT must not leave a core of this process on the
        # slurmd host (nor reach a core-dump helper).
        import resource

        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        with contextlib.suppress(OSError, AttributeError):
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        if signum != signal.SIGKILL:  # its action cannot be changed, nor need it be
            signal.signal(signum, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
        os.kill(os.getpid(), signum)
    return code


def run_task(api_url: str, ca_file: str | None, key: str, early: list[int] | None = None) -> int:
    """Run task `key` of a step of the script in the pod of this node; the task's exit code."""
    environ = dict(os.environ)
    job_id = int(environ["SLURM_JOB_ID"])
    body: dict[str, object] = {
        "key": key, "node": environ.get("SLURMD_NODENAME", ""),
        "env": {k: v for k, v in environ.items()
                if k.startswith("SLURM") and not k.startswith("SLURM_K8S_BRIDGE")},
    }
    try:
        stdin = task_input()
    except (OSError, ValueError) as error:
        say(str(error))
        return 1
    if stdin is not None:
        body["stdin"] = binascii.b2a_base64(stdin, newline=False).decode()
    signal_fields: dict[str, object] = {
        "key": key, "procid": environ.get("SLURM_PROCID", "0"), "node": body["node"]}
    return proxy_task(api_url, ca_file, job_id, (f"/v1/jobs/{job_id}/task", body),
                      (f"/v1/jobs/{job_id}/task-signal", signal_fields), early)


def signal_passer(
    url: tuple[str, str, int], ca_file: str | None, job_id: int, signals: tuple[str, dict[str, object]],
) -> Callable[[int, object], None]:
    """A signal handler that has the daemon pass the signal to the task in the pod (POST
    `signals` with its number)."""
    signal_path, signal_fields = signals

    def pass_on(signum: int, _frame: object) -> None:
        # slurmstepd signals the step's tasks (scancel -s SIG, --signal=SIG@T, a step cancel):
        # the task in the pod gets it; its output and exit still come through the stream.
        signal_body = {**signal_fields, "signal": int(signum)}
        for attempt in range(TASK_SIGNAL_ATTEMPTS):
            try:
                post(url, signal_path, job_id, signal_body, TASK_SIGNAL_TIMEOUT_S, ca_file).close()
                return
            except DaemonError as error:
                if error.status == 202:
                    return  # kept by the daemon for the task's start
                if 400 <= error.status < 500:
                    say(f"the bridge refused signal {signum} for this task: {error.text}")
                    return
            except OSError:
                pass  # the daemon busy or restarting: ask again, briefly
            time.sleep(reconnect_delay(attempt))

    return pass_on


def start_signal_passing(
    api_url: str, ca_file: str | None, job_id: int, signals: tuple[str, dict[str, object]],
    early: list[int] | None,
) -> tuple[tuple[str, str, int], Callable[[int, object], None]]:
    """Leave the user's directory, pass every signal slurmstepd sends a task on to the task in
    the pod (those that came while this started included); the daemon's URL and the handler."""
    os.chdir("/")
    url = split_url(api_url)
    pass_on = signal_passer(url, ca_file, job_id, signals)
    for signum in (*FORWARDED, signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, pass_on)
    for early_signum in take_early_signals(early):
        pass_on(early_signum, None)
    return url, pass_on


def proxy_task(
    api_url: str, ca_file: str | None, job_id: int, start: tuple[str, dict[str, object]],
    signals: tuple[str, dict[str, object]], early: list[int] | None = None,
) -> int:
    """Have the daemon run one task in the pod of this node (POST `start`), write its output to
    fds 1 and 2 as it comes, pass on the signals this process gets (POST `signals` with the
    number) and end as the task ended; the task's exit code. A script step's task proxy and a
    user step's share it."""
    start_path, body = start
    url, _ = start_signal_passing(api_url, ca_file, job_id, signals, early)
    usage = UsageFile()  # what the task used, for Slurm's accounting of this step
    for attempt in range(60):
        started = False
        try:
            with post(url, start_path, job_id, body, None, ca_file) as stream:
                started = True
                for raw in stream:
                    event = json.loads(raw)
                    if event.get("fd") == USAGE_FD:
                        usage.record_frame(str(event.get("data", "")))
                    elif "fd" in event:
                        write_all(int(event["fd"]), binascii.a2b_base64(event["data"]))
                    elif "exit" in event:
                        return end_as_the_task(int(event["exit"]))
            say("the bridge stopped streaming this task before it ended")
            return 1
        except DaemonError as error:
            if 400 <= error.status < 500:
                say(error.text)
                return 1
        except (OSError, ValueError) as error:
            if started:
                # The task runs (or ran) in the pod: asking again would run it twice.
                say(f"lost the bridge while the task ran: {error}")
                return 1
        time.sleep(reconnect_delay(attempt))
    say("could not reach the bridge to run this task")
    return 1
