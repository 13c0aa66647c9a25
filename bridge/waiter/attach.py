"""The job-side waiter, started as `/usr/bin/python3 -I -S /path/to/waiter.py [--api URL] SCRIPT`.

job_submit.lua turned the batch script of a bridged job into a call of this
waiter, so the slurmd of a bridged node never runs user code. The waiter:

1. reads the original script from its own batch script (after the marker) and
   takes its own environment (the job's exported environment plus SLURM_*);
2. proves to the daemon that it is this job's process with a munge credential
   (its uid must be the job's uid) that carries a digest of the request, so a
   captured credential cannot be replayed for another job or body;
3. prints the pods' log lines to stdout, which Slurm writes to slurm-<id>.out;
4. exits with the pods' exit code, or dies by the same signal, so sacct is true.

On SIGTERM/SIGINT (scancel, time limit) it asks the daemon to delete the pods
and exits only once they are gone. If the daemon restarts, it reconnects and
resumes the logs where they stopped.

It runs on the slurmd host as the user, so it trusts nothing the user shapes:
it is started by absolute path in isolated mode, the SPANK guard strips LD_* and
PYTHON* before it is exec'd, it runs munge by absolute path with a fixed
environment, and it leaves the submit directory once it has read it.

Only the standard library is imported: this runs once per job on the slurmd
host and its start-up time is part of the job's start latency.
"""

from __future__ import annotations

import binascii
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping

# Every job starts one waiter, on hosts that start hundreds at once: what it imports is paid per
# job (bench-scale: 40 ms of CPU to start, 15 of them imports). typing (only for annotations),
# hashlib (OpenSSL: SHA-256 comes from Python's own module) and random are not imported.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import IO, Any

# The waiter is installed as one file and started by absolute path with `python3 -I -S`
# (no PYTHONPATH, no user site, no cwd on sys.path): it imports nothing from the bridge package.
MARKER = "#SLURM-K8S-BRIDGE ORIGINAL SCRIPT"
"""= bridge.core.wellknown.ATTACH_MARKER (a unit test keeps them equal)."""
HELD_PREFIX = "SLURM_K8S_BRIDGE_HELD_"
"""The SPANK step guard moves every variable but SLURM_* out of the waiter's way under this
prefix (LD_PRELOAD, OPENSSL_CONF, ... would steer the loader or libcrypto); the pods get them
back under their own names."""
HELD_MARKER = "SLURM_K8S_BRIDGE_ENV_HELD"
"""Set by the guard once it has held the environment."""
DIGEST_PREFIX = "slurm-k8s-bridge-v1:"
DEFAULT_API_URL = "http://127.0.0.1:8470"
OUTAGE_NOTICE_S = 60.0
MUNGE_PATHS = ("/usr/bin/munge", "/usr/local/bin/munge", "/opt/munge/bin/munge")
SAFE_ENVIRONMENT = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}
"""What the waiter's own helper (munge) runs with: nothing of the user's."""
FORWARDED = (signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM)
"""Signals Slurm sends the batch script (scancel -s SIG --batch, --signal=B:SIG@TIME) that the
waiter passes on to the script in the pods. SIGTERM and SIGINT stop the job (its pods are deleted
and the kubelet signals the script); SIGKILL and SIGSTOP cannot be caught."""
HELD_SIGNALS = frozenset(FORWARDED)
"""Blocked by the step guard when it starts the waiter (slurm_spank_task_init): one of these that
comes while Python starts waits, pending, until main() has handlers for it and unblocks them (its
default action would end the waiter, and the job with it, before the script even started).
SIGTERM and SIGINT are not held: a site's TaskProlog runs with the guard's mask too, and an early
TERM that ends the waiter ends the job as the cancel or time limit it stands for."""
EARLY_KEPT = HELD_SIGNALS | {signal.SIGTERM, signal.SIGINT}
RECONNECT_BASE_S, RECONNECT_CAP_S = 0.1, 5.0
TASK_SIGNAL_ATTEMPTS = 5
"""A task proxy asks this often (jittered backoff, a few seconds) to have a signal passed on."""
TASK_SIGNAL_TIMEOUT_S = 150.0
"""How long a proxy waits for the daemon's answer: longer than the daemon may take (4 execs of
at most 30 s and their pauses), so a slow delivery is never asked for a second time."""
STREAM_READ_TIMEOUT_S = 45.0
"""The daemon sends a heartbeat every 10 s; silence this long means a half-open connection."""


# srun options a step of a bridged job may use: layout, labels and exit handling. Anything else
# (--prolog, --task-prolog, --bcast, --export, ...) would run or place something on the slurmd
# host, or has no meaning for pods; it is refused with srun's own wording.
SRUN_VALUE_OPTIONS = frozenset({
    "-N", "--nodes", "-n", "--ntasks", "--ntasks-per-node", "-c", "--cpus-per-task", "-w", "--nodelist",
    "-x", "--exclude", "-J", "--job-name", "-t", "--time", "--mem", "--mem-per-cpu", "--gres", "--gpus",
    "--gpus-per-node", "--gpus-per-task", "-m", "--distribution", "--mpi", "--cpu-bind", "--network",
})
SRUN_FLAG_OPTIONS = frozenset({
    "--overlap", "--exclusive", "-l", "--label", "-K", "--kill-on-bad-exit", "-u", "--unbuffered",
    "-Q", "--quiet", "-v", "--verbose", "-X", "--disable-status", "--whole",
    "--external-launcher",  # what mpirun (Open MPI, MPICH hydra) adds to start its daemons
})


def split_srun_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """srun's own options and the command, as srun reads them; ValueError for an option a
    bridged step cannot take, or no command."""
    options: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            i += 1
            break
        if not word.startswith("-") or word == "-":
            break
        name, eq, value = word.partition("=")
        attached = len(name) > 2 and not name.startswith("--") and name[:2] in SRUN_VALUE_OPTIONS  # -n4
        if name == "--mpi":
            # slurmstepd's PMI server lives on the slurmd host, out of the pods' reach.
            mpi = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            if mpi != "none":
                raise ValueError(f"srun: error: --mpi={mpi} is not available in a job that runs in "
                                 "Kubernetes: start MPI programs with mpirun (it starts its daemons by srun)")
        if (name in SRUN_FLAG_OPTIONS and not eq) or (name in SRUN_VALUE_OPTIONS and eq) or attached:
            options.append(word)
        elif name in SRUN_VALUE_OPTIONS and i + 1 < len(argv):
            options += [word, argv[i + 1]]
            i += 1
        else:
            raise ValueError(f"srun: error: option {word} is not available in a job that runs in Kubernetes")
        i += 1
    command = argv[i:]
    if not command:
        raise ValueError("srun: fatal: No command given to execute.")
    return options, command


def request_digest(method: str, path: str, job_id: int, body: bytes) -> str:
    """What the munge credential of a request carries: it binds the credential to this one request
    (a captured credential is refused for another job, path or body). The daemon checks it."""
    digest = sha256(f"{method}\n{path}\n{job_id}\n".encode())
    digest.update(body)
    return DIGEST_PREFIX + digest.hexdigest()


def sha256(data: bytes) -> Any:
    """A SHA-256 hash object: Python's own implementation where it has one (3.11's `_sha256`), which
    loads no OpenSSL; hashlib otherwise."""
    try:
        from _sha256 import sha256 as new  # type: ignore[import-not-found]
    except ImportError:
        from hashlib import sha256 as new
    return new(data)


def reconnect_delay(attempt: int) -> float:
    """Jittered exponential backoff: thousands of waiters must not retry in step after an outage."""
    jitter = 0.5 + int.from_bytes(os.urandom(2), "big") / 65536  # in [0.5, 1.5)
    return min(RECONNECT_CAP_S, RECONNECT_BASE_S * 2 ** min(attempt, 10)) * jitter


def job_environment(environ: dict[str, str]) -> dict[str, str]:
    """The job's environment as the user exported it: held variables get their names back. Where
    the guard held the environment, any other variable but SLURM_* is the waiter's own (Python's
    C locale coercion sets LC_CTYPE), not the user's, and stays out."""
    guarded = environ.get(HELD_MARKER) == "1"
    held = {k[len(HELD_PREFIX):]: v for k, v in environ.items() if k.startswith(HELD_PREFIX)}
    env = {k: v for k, v in environ.items()
           if not k.startswith(HELD_PREFIX) and k != HELD_MARKER and (not guarded or k.startswith("SLURM_"))}
    env.update({k: v for k, v in held.items() if k})
    return env


class AttachState:
    """What survives a reconnect: the last log timestamp printed per pod index."""

    def __init__(self) -> None:
        self.last_log: dict[str, str] = {}
        self.cancel_requested = False
        self.steps_started: set[str] = set()


class DaemonError(OSError):
    """The daemon answered with an HTTP error status (5xx: retry; 4xx: refused for good)."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"HTTP {status}: {text}")
        self.status, self.text = status, text


def post(
    url: tuple[str, str, int], path: str, job_id: int, body: dict[str, Any], timeout: float | None,
    ca_file: str | None = None,
) -> IO[bytes]:
    """POST JSON over HTTP/1.0 (so the answer streams unchunked until the server closes), with a
    munge credential bound to this request; return the body as a binary file positioned after the
    headers. http.client would cost this short-lived process ~20 ms of imports at every job start."""
    _, host, port = url
    data = json.dumps(body).encode()
    credential = munge_credential(request_digest("POST", path, job_id, data))
    head = (
        f"POST {path} HTTP/1.0\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nX-Munge-Credential: {credential}\r\n\r\n"
    ).encode()
    sock = _connect(url, 10, ca_file)
    sock.settimeout(timeout)
    sock.sendall(head + data)
    reader = sock.makefile("rb")
    sock.close()  # the file keeps the connection open until it is closed itself
    status_line = reader.readline().split()
    if len(status_line) < 2 or not status_line[1].isdigit():
        reader.close()
        raise OSError(f"bad HTTP answer from the bridge: {status_line!r}")
    while reader.readline() not in (b"\r\n", b"\n", b""):
        pass  # headers: nothing in them matters here
    status = int(status_line[1])
    if status != 200:
        text = reader.read().decode(errors="replace").strip()
        reader.close()
        raise DaemonError(status, text)
    return reader


def split_url(url: str) -> tuple[str, str, int]:
    """`http[s]://host:port[/]` -> (scheme, host, port)."""
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower() if sep else "http"
    rest = (rest if sep else url).rstrip("/")
    host, _, port = rest.rpartition(":") if rest.count(":") == 1 or rest.startswith("[") else (rest, "", "")
    host = host.strip("[]") or "127.0.0.1"
    return scheme, host, int(port) if port else (443 if scheme == "https" else 80)


def original_script(batch_script: str) -> str:
    """The user's script embedded after the marker line by job_submit.lua."""
    _, sep, tail = batch_script.partition(MARKER + "\n")
    if not sep:
        raise ValueError("this batch script was not rewritten by the bridge's job_submit.lua")
    return tail


STEP_SIGNALS = frozenset(int(s) for s in (
    signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
    signal.SIGALRM, signal.SIGCONT))
"""= bridge.controller.reconcile.SIGNALS_FOR_SRUN: what the script's srun passes on to Slurm's."""
STEP_TOKEN = "SLURM_K8S_BRIDGE_STEP_TOKEN"
MAX_CONCURRENT_STEPS = 64
"""Real sruns a waiter runs at once for its script (each is a slurmctld RPC and a slurmstepd)."""
SRUN_LAYOUT_VARIABLES = frozenset({
    "SLURM_JOB_ID", "SLURM_JOBID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NNODES", "SLURM_JOB_NUM_NODES",
    "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_NTASKS_PER_CORE", "SLURM_NTASKS_PER_SOCKET",
    "SLURM_CPUS_PER_TASK", "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_JOB_CPUS_PER_NODE",
    "SLURM_CPUS_ON_NODE", "SLURM_MEM_PER_CPU", "SLURM_MEM_PER_NODE", "SLURM_MEM_PER_GPU", "SLURM_GPUS",
    "SLURM_GPUS_PER_NODE", "SLURM_GPUS_PER_TASK", "SLURM_CLUSTER_NAME", "SLURM_JOB_PARTITION",
    "SLURM_JOB_NAME", "SLURM_DISTRIBUTION", "SLURM_OVERCOMMIT", "SLURM_THREADS_PER_CORE",
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
SRUN_PATHS = ("/usr/bin/srun", "/usr/local/bin/srun", "/opt/slurm/bin/srun")


def srun_binary() -> str:
    """Slurm's srun by absolute path, never from the job's PATH."""
    for path in SRUN_PATHS:
        if os.access(path, os.X_OK):
            return path
    raise OSError(f"srun is not installed on this host (looked for {', '.join(SRUN_PATHS)})")


# Signals whose default action ends a process: a task that exits 128+N with one of them was ended
# by it (the pod's exec reports a death by signal N as 128+N, as a shell does).
ENDING_SIGNALS = frozenset(int(s) for s in (
    signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGILL, signal.SIGTRAP, signal.SIGABRT,
    signal.SIGBUS, signal.SIGFPE, signal.SIGKILL, signal.SIGUSR1, signal.SIGSEGV, signal.SIGUSR2,
    signal.SIGPIPE, signal.SIGALRM, signal.SIGTERM, signal.SIGXCPU, signal.SIGXFSZ, signal.SIGSYS))


PR_SET_DUMPABLE = 4


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
    """A task proxy (`waiter.py task KEY`), started by Slurm's srun as one task of a step: the
    daemon runs the task in the pod of this node; its output comes back here, and srun gathers it
    (--label and all) as it would a native task's. Exits with the task's exit code."""
    environ = dict(os.environ)
    job_id = int(environ["SLURM_JOB_ID"])
    body = {
        "key": key, "node": environ.get("SLURMD_NODENAME", ""),
        "env": {k: v for k, v in environ.items()
                if k.startswith("SLURM") and not k.startswith("SLURM_K8S_BRIDGE")},
    }
    os.chdir("/")
    url = split_url(api_url)

    def pass_on(signum: int, _frame: object) -> None:
        # slurmstepd signals the step's tasks (scancel -s SIG, --signal=SIG@T, a step cancel):
        # the task in the pod gets it; its output and exit still come through the stream.
        signal_body = {"key": key, "procid": environ.get("SLURM_PROCID", "0"), "node": body["node"],
                       "signal": int(signum)}
        for attempt in range(TASK_SIGNAL_ATTEMPTS):
            try:
                post(url, f"/v1/jobs/{job_id}/task-signal", job_id, signal_body, TASK_SIGNAL_TIMEOUT_S,
                     ca_file).close()
                return
            except DaemonError as error:
                if error.status == 202:
                    return  # kept by the daemon for the task's start
                if 400 <= error.status < 500:
                    _stderr(f"the bridge refused signal {signum} for this task: {error.text}")
                    return
            except OSError:
                pass  # the daemon busy or restarting: ask again, briefly
            time.sleep(reconnect_delay(attempt))

    for signum in (*FORWARDED, signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, pass_on)
    for signum in take_early_signals(early):
        pass_on(signum, None)
    for attempt in range(60):
        started = False
        try:
            with post(url, f"/v1/jobs/{job_id}/task", job_id, body, None, ca_file) as stream:
                started = True
                for raw in stream:
                    event = json.loads(raw)
                    if "fd" in event:
                        write_all(int(event["fd"]), binascii.a2b_base64(event["data"]))
                    elif "exit" in event:
                        return end_as_the_task(int(event["exit"]))
            _stderr("the bridge stopped streaming this task before it ended")
            return 1
        except DaemonError as error:
            if 400 <= error.status < 500:
                _stderr(error.text)
                return 1
        except (OSError, ValueError) as error:
            if started:
                # The task runs (or ran) in the pod: asking again would run it twice.
                _stderr(f"lost the bridge while the task ran: {error}")
                return 1
        time.sleep(reconnect_delay(attempt))
    _stderr("could not reach the bridge to run this task")
    return 1


MAX_OUTPUT_FRAME = 64 * 1024
"""Bytes of srun output in one frame of a step's output stream (the daemon refuses more)."""
STREAM_OPEN_ATTEMPTS = 30
"""A step's output stream is asked for this often (jittered backoff, ~2 min) before its output
goes to the job's files instead."""
STREAM_ANSWER_TIMEOUT_S = 60.0
STREAM_END_TIMEOUT_S = 300.0


def sign_output_frame(stream_key: bytes, seq: int, fd: int, data: bytes) -> bytes:
    """One frame of a step's output stream: fd (1, 2, or 0 for the end, whose data is srun's exit
    code), a 4-byte length, the data, then an HMAC-SHA256 under the key the stream's munge
    credential carries, over the frame's sequence number and content (nothing can be replayed,
    reordered, dropped unseen or changed on the way)."""
    import hashlib  # only for jobs that use srun
    import hmac

    head = bytes([fd]) + len(data).to_bytes(4, "big")
    mac = hmac.new(stream_key, seq.to_bytes(8, "big") + head + data, hashlib.sha256).digest()
    return head + data + mac


class StepOutputRelay:
    """Slurm's srun for a step writes into pipes; this carries what it writes to the daemon, which
    hands it to the script's srun in the pod: `srun ... | sort`, `$(srun hostname)` and `srun >
    file` see it as natively. Should the daemon not take it, it goes to the job's -o/-e files as
    before, and the exit code by step-done."""

    def __init__(self, url: tuple[str, str, int], job_id: int, key: str, ca_file: str | None) -> None:
        self._url, self._job_id, self._key, self._ca_file = url, job_id, key, ca_file
        self._sock: socket.socket | None = None
        self._reader: IO[bytes] | None = None
        self._stream_key = b""
        self._seq = 0
        self.delivered = False
        self.gone = False

    def open(self) -> None:
        """Start the stream; on failure, output is written locally. A daemon that is busy or
        restarting (5xx) is asked again for a while: srun's output waits in its pipes meanwhile."""
        path = f"/v1/jobs/{self._job_id}/step-output"
        header = json.dumps({"key": self._key}).encode() + b"\n"
        for attempt in range(STREAM_OPEN_ATTEMPTS):
            self._stream_key = os.urandom(32)
            sock: socket.socket | None = None
            reader: IO[bytes] | None = None
            status = 0
            try:
                payload = request_digest("POST", path, self._job_id, header) + " " + self._stream_key.hex()
                credential = munge_credential(payload)
                sock = _connect(self._url, STREAM_ANSWER_TIMEOUT_S, self._ca_file)
                _, host, port = self._url
                sock.sendall(
                    f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n"
                    "Content-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n"
                    f"X-Munge-Credential: {credential}\r\n\r\n".encode() + _chunk(header))
                # Unbuffered, so that select() on the socket sees every byte of an early answer.
                reader = sock.makefile("rb", buffering=0)
                status, answer = _read_answer_head(reader)
                if status == 200 and _answer(answer).get("accepted") is True:
                    sock.settimeout(None)  # a slow reader in the pod holds srun, as natively
                    self._sock, self._reader = sock, reader
                    return
            except Exception:  # munge timing out, a reset, a bad answer: all mean ask again
                pass
            for closable in (reader, sock):
                if closable is not None:
                    with contextlib.suppress(OSError):
                        closable.close()
            if 400 <= status < 500:
                return  # refused for good (an older daemon, the step unknown): written here
            time.sleep(reconnect_delay(attempt))

    def send(self, fd: int, data: bytes) -> None:
        # Once the script's srun is gone, what Slurm's srun still says (the step's end) goes to
        # the job's files, where native srun's stderr would be.
        if self._sock is None or self._answered():
            write_all(fd, data)
            return
        for start in range(0, len(data), MAX_OUTPUT_FRAME):
            part = data[start:start + MAX_OUTPUT_FRAME]
            try:
                self._sock.sendall(_chunk(sign_output_frame(self._stream_key, self._seq, fd, part)))
                self._seq += 1
            except OSError:
                self._drop()
                write_all(fd, data[start:])
                return

    def finish(self, code: int) -> None:
        if self._sock is None or self._answered():
            return
        try:
            self._sock.sendall(_chunk(sign_output_frame(self._stream_key, self._seq, 0, str(code).encode()))
                               + b"0\r\n\r\n")
            # The answer comes once the script's srun took the end; should it not come, step-done
            # tells the exit code instead (the script's srun takes whichever comes first).
            self._sock.settimeout(STREAM_END_TIMEOUT_S)
            self.delivered = _answer(_read_chunk(self._reader) if self._reader else b"").get("done") is True
        except OSError:
            pass
        self._drop()

    def check(self) -> None:
        """Look for an early answer while srun is quiet."""
        self._answered()

    def _answered(self) -> bool:
        """The daemon spoke before the end: the script's srun is gone (killed, its pipe closed),
        or the pod could not be reached."""
        import select

        if self._sock is None:
            return False
        pending = self._sock.pending() if hasattr(self._sock, "pending") else 0  # TLS buffers
        if not pending and not select.select([self._sock], [], [], 0)[0]:
            return False
        try:
            answer = _answer(_read_chunk(self._reader) if self._reader else b"")
        except OSError:
            answer = {}
        self.gone = "gone" in answer
        self._drop()
        return True

    def _drop(self) -> None:
        for closable in (self._reader, self._sock):
            with contextlib.suppress(OSError):
                if closable is not None:
                    closable.close()
        self._sock = self._reader = None


def _connect(url: tuple[str, str, int], timeout: float, ca_file: str | None) -> socket.socket:
    scheme, host, port = url
    sock = socket.create_connection((host, port), timeout=timeout)
    # Long streams (a step's output, an attach) notice a peer that vanished without a FIN.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 6)):
        if hasattr(socket, option):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
    if scheme == "https":
        import ssl  # only when the daemon serves TLS: its import costs start-up time

        context = ssl.create_default_context(cafile=ca_file)
        sock = context.wrap_socket(sock, server_hostname=host)
    sock.settimeout(timeout)
    return sock


def _answer(line: bytes) -> dict[str, Any]:
    try:
        answer = json.loads(line)
    except ValueError:
        return {}
    return answer if isinstance(answer, dict) else {}


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _read_answer_head(reader: IO[bytes]) -> tuple[int, bytes]:
    """Status and first line of an answer (chunked when 200, whole otherwise)."""
    status_line = reader.readline().split()
    if len(status_line) < 2 or not status_line[1].isdigit():
        raise OSError(f"bad HTTP answer from the bridge: {status_line!r}")
    chunked, length = False, 0
    while (line := reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        chunked |= name.strip().lower() == "transfer-encoding" and "chunked" in value.lower()
        if name.strip().lower() == "content-length" and value.strip().isdigit():
            length = min(int(value), 65536)
    status = int(status_line[1])
    return status, _read_chunk(reader) if chunked else reader.read(length)


def _read_chunk(reader: IO[bytes]) -> bytes:
    line = reader.readline().strip()
    try:
        size = int(line or b"0", 16)
    except ValueError:
        raise OSError(f"bad chunk from the bridge: {line[:40]!r}") from None
    data = b""
    while len(data) < size:  # the reader is unbuffered: a read returns what has arrived
        more = reader.read(size - len(data))
        if not more:
            raise OSError("the bridge's answer was cut off")
        data += more
    reader.readline()
    return data


def munge_binary() -> str:
    """munge from the system, never from the job's PATH (which is the user's to shape)."""
    for path in MUNGE_PATHS:
        if os.access(path, os.X_OK):
            return path
    raise OSError(f"munge is not installed on this host (looked for {', '.join(MUNGE_PATHS)})")


def munge_credential(payload: str) -> str:
    """A munge credential for this process's uid/gid, carrying `payload` (the daemon checks both).
    Every failure is an OSError, which the callers take as an outage and retry."""
    try:
        result = subprocess.run(
            [munge_binary()], input=payload.encode(), capture_output=True, check=False, timeout=10,
            env=SAFE_ENVIRONMENT, cwd="/",
        )
    except subprocess.TimeoutExpired:
        # A host so loaded that munge takes over 10 s (bench-scale, 1,000 nodes: load 146): the
        # uncaught TimeoutExpired ended the waiter, and its job FAILED 1:0 without a word.
        raise OSError("munge did not answer within 10 s") from None
    if result.returncode != 0:
        # munged down is an outage like the daemon's: the caller retries.
        raise OSError(f"munge failed: {result.stderr.decode(errors='replace').strip()}")
    return result.stdout.decode().strip()


def run_relayed(
    command: list[str], env: dict[str, str], relay: StepOutputRelay,
    started: Callable[[subprocess.Popen[bytes]], None] | None = None,
) -> int:
    """Run Slurm's srun with its stdout and stderr through `relay`; its exit code, as a shell
    reports it (128+N when a signal ended it)."""
    import queue
    import threading

    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, cwd="/")
    if started is not None:
        started(proc)
    chunks: queue.Queue[tuple[int, bytes]] = queue.Queue(maxsize=32)  # holds srun when full

    def read(fd: int, pipe: IO[bytes]) -> None:
        while data := os.read(pipe.fileno(), 65536):
            chunks.put((fd, data))
        chunks.put((fd, b""))

    for fd, pipe in ((1, proc.stdout), (2, proc.stderr)):
        threading.Thread(target=read, args=(fd, pipe), daemon=True).start()
    relay.open()
    open_streams = 2
    terminated = False
    while open_streams:
        # Whatever the relay meets, srun's pipes are drained to the end and srun is waited for.
        try:
            fd, data = chunks.get(timeout=1.0)
        except queue.Empty:
            relay.check()
        else:
            if not data:
                open_streams -= 1
                continue
            relay.send(fd, data)
        if relay.gone and not terminated and proc.poll() is None:
            proc.terminate()  # the script's srun is gone: so is the step, as natively
            terminated = True
    code = proc.wait()
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    code = 128 - code if code < 0 else code
    relay.finish(code)
    return code


class Waiter:
    def __init__(
        self, api_url: str, job_id: int, script: str, environment: dict[str, str], work_dir: str,
        ca_file: str | None = None,
    ) -> None:
        self._url = split_url(api_url)
        self._job_id = job_id
        self._script = script
        self._environment = environment
        self._work_dir = work_dir
        self._ca_file = ca_file
        self._state = AttachState()
        self._merged = output_merged()
        self._active_steps = 0
        self._step_procs: dict[str, subprocess.Popen[bytes]] = {}
        # Signals for the script the daemon has not taken yet, by sequence number: kept until it
        # does (its answer to /signal, or the next attach, which carries them), so none is lost
        # to a waiter that has not attached yet or a daemon that answered 503 for a moment.
        self._unsent_signals: dict[int, int] = {}
        # ... and, by signal, the newest sequence number it took but has not reported delivered
        # ("signal-done"): a daemon that restarts (or fails over) before it delivered one gets
        # it again with the next attach. One per kind: the daemon keeps a signal pending once,
        # so the newest stands for the older ones of its kind.
        self._undelivered_signals: dict[int, int] = {}
        self._signal_seq = 0
        self._sending_signals = False
        # How this waiter was started, less its batch script: the task proxies of a step are the
        # same command (the SPANK guard lets exactly that through as a step of a bridged job).
        self._own_command = list(getattr(sys, "orig_argv", [sys.executable, "-I", "-S", __file__]))[:-1]

    def _post(self, action: str, body: dict[str, Any], timeout: float | None) -> IO[bytes]:
        path = f"/v1/jobs/{self._job_id}/{action}"
        return post(self._url, path, self._job_id, body, timeout, self._ca_file)

    def forward_signal(self, signum: int) -> None:
        """Pass a signal on to the script in the pods (the daemon runs the agent there). Runs in
        a signal handler: one that interrupts a send only adds its signal, which the send in
        progress takes along, so the daemon gets them in order."""
        if int(signum) not in self._unsent_signals.values():  # pending once, as in the kernel
            self._signal_seq += 1
            self._unsent_signals[self._signal_seq] = int(signum)
        self.send_signals()

    def send_signals(self) -> None:
        """Send the signals the daemon has not taken, oldest first; stop at the first that it
        cannot take now (not attached yet: 409; an outage): the next attach or heartbeat tries
        again. The sequence number lets the daemon drop one it took already."""
        if self._sending_signals:
            return
        self._sending_signals = True
        try:
            taken_all = self._send_kept_signals()
        finally:
            self._sending_signals = False
        if taken_all and self._unsent_signals:
            self.send_signals()  # one came between the last send and the flag's reset

    def _send_kept_signals(self) -> bool:
        """True when the daemon took every kept signal, False at the first it could not take."""
        while self._unsent_signals:
            seq = min(self._unsent_signals)
            body = {"signal": self._unsent_signals[seq], "seq": seq}
            try:
                self._post("signal", body, timeout=10).close()
            except DaemonError as error:
                if 400 <= error.status < 500 and error.status != 409:
                    _stderr(f"the bridge refused signal {body['signal']}: {error.text}")
                    self._unsent_signals.pop(seq, None)
                    continue
                return False
            except OSError:
                return False
            self._taken(seq, self._unsent_signals.pop(seq))
        return True

    def _taken(self, seq: int, signum: int) -> None:
        self._undelivered_signals[signum] = max(seq, self._undelivered_signals.get(signum, 0))

    def _kept_for_attach(self) -> list[tuple[int, int]]:
        """The signals an attach carries, as [seq, signal]: every one not taken yet, and the
        newest of each kind taken but not reported delivered."""
        kept = {seq: signum for signum, seq in list(self._undelivered_signals.items())}
        kept.update(self._unsent_signals)
        return sorted(kept.items())

    def _signals_delivered(self, signum: object, seq: object) -> None:
        """The daemon delivered (or could never deliver) `signum` taken as `seq`: that one and
        the older ones of its kind, which it stood for, are done."""
        if not isinstance(signum, int) or not isinstance(seq, int):
            return
        # Held meanwhile: a handler that sends one (and changes these dicts) waits till after.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
        try:
            if self._undelivered_signals.get(signum, seq + 1) <= seq:
                del self._undelivered_signals[signum]
            for kept, kind in list(self._unsent_signals.items()):
                if kind == signum and kept <= seq:
                    self._unsent_signals.pop(kept, None)  # its /signal went through, its answer did not
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)

    def _start_step(self, data: str, token: str) -> None:
        """The script ran srun: run Slurm's srun for it here, a real step whose tasks are the
        bridge's task proxies (this same file, `task KEY`); its output goes where the script's
        goes, and its exit code back to the script's srun. On the slurmd host nothing of the user
        runs: the proxies only stream what the daemon runs in the pods."""
        import threading  # only for jobs that use srun

        try:
            request = json.loads(binascii.a2b_base64(data))
            key = str(int(request["key"]))
            argv = [str(a) for a in request["argv"]]
        except (ValueError, KeyError, TypeError, binascii.Error):
            return  # not a step request of the agent's: nothing to run
        try:
            options, _command = split_srun_args(argv)
        except ValueError as error:
            write_all(2, f"{error}\n".encode())
            threading.Thread(target=self._step_done, args=(key, 1), daemon=True).start()
            return
        if key in self._state.steps_started:
            return  # seen before a reconnect
        self._state.steps_started.add(key)
        if not token or self._active_steps >= MAX_CONCURRENT_STEPS:
            write_all(2, b"srun: error: this step was not started (too many at once, or not signed)\n")
            threading.Thread(target=self._step_done, args=(key, 1), daemon=True).start()
            return
        try:
            srun = srun_binary()
        except OSError as error:
            write_all(2, f"srun: error: {error}\n".encode())
            threading.Thread(target=self._step_done, args=(key, 1), daemon=True).start()
            return
        command = [srun, f"--jobid={os.environ.get('SLURM_JOB_ID', '')}", *options, "--chdir=/",
                   *self._own_command, "task", key]
        env = srun_environment(os.environ)
        env[STEP_TOKEN] = token  # the SPANK guard checks it (the daemon signed this very step)
        self._active_steps += 1

        def run() -> None:
            relay = StepOutputRelay(self._url, self._job_id, key, self._ca_file)
            try:
                code = run_relayed(command, env, relay, lambda proc: self._step_procs.__setitem__(key, proc))
            except (OSError, ValueError) as error:  # ValueError: a NUL byte in an argument
                write_all(2, f"srun: error: {error}\n".encode())
                code = 1
            self._step_procs.pop(key, None)
            self._active_steps -= 1
            if not relay.delivered:
                self._step_done(key, code)

        threading.Thread(target=run, name=f"step-{key}", daemon=True).start()

    def _signal_step(self, key: str, signum: object) -> None:
        """The script's srun got `signum`: Slurm's srun of that step gets it, and does what it
        does natively (cancels the step on TERM, passes USR1 on to the tasks, ...)."""
        proc = self._step_procs.get(key)
        if proc is None or not isinstance(signum, int) or signum not in STEP_SIGNALS:
            return
        if proc.poll() is not None:
            return
        with contextlib.suppress(OSError):
            proc.send_signal(signum)

    def _step_done(self, key: str, code: int) -> None:
        for attempt in range(20):
            try:
                self._post("step-done", {"key": key, "code": code}, timeout=10).close()
                return
            except DaemonError as error:
                if 400 <= error.status < 500:
                    return
            except OSError:
                pass
            time.sleep(reconnect_delay(attempt))

    def request_cancel(self) -> None:
        """Ask the daemon to delete the pods; the attach stream reports when they are gone."""
        self._state.cancel_requested = True
        try:
            self._post("cancel", {}, timeout=5).close()
        except OSError as error:
            _stderr(f"could not reach the bridge to cancel: {error}")

    # -- the attach loop --------------------------------------------------------
    def run(self) -> int:
        """Attach until the daemon reports the end; returns an exit code or raises SystemExit."""
        attempt, outage_started, told_at = 0, 0.0, 0.0
        while True:
            try:
                outcome = self._attach_once()
            except DaemonError as error:
                if 400 <= error.status < 500:
                    # Refused for good (identity mismatch, unknown job...): say why and fail the job.
                    # Whatever may pass (daemon, slurmrestd or munged restarting) answers 5xx.
                    return self._finish({"type": "exit", "code": 1, "reason": error.text})
                outcome, failure = None, error
            except (OSError, ValueError) as error:  # ValueError: a garbled line (json)
                outcome, failure = None, error
            else:
                failure = None
            if failure is not None:
                now = time.monotonic()
                outage_started = outage_started or now
                # A daemon restart takes seconds and needs no word in the job's output; a long
                # outage does, now and then, so the user knows why nothing happens.
                if now - outage_started >= OUTAGE_NOTICE_S and now - told_at >= OUTAGE_NOTICE_S * 10:
                    _stderr(f"waiting for the bridge daemon since {now - outage_started:.0f}s ({failure})")
                    told_at = now
                time.sleep(reconnect_delay(attempt))
                attempt += 1
                continue
            if outcome is not None:
                return self._finish(outcome)
            # The stream ended without an outcome: the daemon went away; reconnect.
            attempt, outage_started = 0, 0.0

    def _attach_once(self) -> dict[str, Any] | None:
        body = {
            "script": self._script,
            # All of it: the daemon drops what describes the slurmd host (translate.job_environment).
            "environment": self._environment,
            "work_dir": self._work_dir,
            "uid": os.getuid(),
            "gid": os.getgid(),
            "output_merged": self._merged,
            "last_log": self._state.last_log,
            "cancel": self._state.cancel_requested,
            "signals": self._kept_for_attach(),
        }
        # A read timeout: the daemon sends heartbeats, so silence means a half-open connection.
        with self._post("attach", body, timeout=STREAM_READ_TIMEOUT_S) as stream:
            for seq, signum in body["signals"]:
                # The session took them with the attach; they are done once it says so.
                self._unsent_signals.pop(seq, None)
                self._taken(seq, signum)
            for raw in stream:
                if not raw.endswith(b"\n"):
                    break  # cut off mid-line: the daemon went away
                if self._unsent_signals:
                    self.send_signals()  # one refused a moment ago (daemon busy or restarting)
                event = json.loads(raw)
                kind = event.get("type")
                if kind == "out":
                    # The script's own bytes, to the file Slurm opened for that stream.
                    write_all(event["fd"], binascii.a2b_base64(event["data"]))
                    self._state.last_log[str(event["pod"])] = event["ts"]
                elif kind == "log":
                    sys.stdout.write(event["line"] + "\n")
                    sys.stdout.flush()
                    self._state.last_log[str(event["pod"])] = event["ts"]
                elif kind == "step":
                    self._start_step(event["data"], str(event.get("token", "")))
                    self._state.last_log[str(event["pod"])] = event["ts"]
                elif kind == "step-signal":
                    self._signal_step(str(event.get("key")), event.get("signal"))
                    self._state.last_log[str(event["pod"])] = event["ts"]
                elif kind == "signal-done":
                    self._signals_delivered(event.get("signal"), event.get("seq"))
                elif kind == "message":
                    _stderr(event["text"])
                elif kind == "exit":
                    return event
                # "heartbeat" and unknown kinds only prove the connection is alive.
        return None

    def _finish(self, outcome: dict[str, Any]) -> int:
        sys.stdout.flush()
        if outcome.get("reason"):
            _stderr(outcome["reason"])
        signum = outcome.get("signal")
        if signum:
            # Die by the same signal so Slurm records it (sacct shows e.g. 0:9).
            sys.stderr.flush()
            with contextlib.suppress(OSError, ValueError):  # SIGKILL/SIGSTOP cannot be handled anyway
                signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            time.sleep(1)
        return int(outcome.get("code", 0))


def write_all(fd: int, data: bytes) -> None:
    """Write every byte to `fd` (1 or 2: what slurmstepd opened for -o and -e)."""
    if fd not in (1, 2):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def output_merged() -> bool:
    """stdout and stderr are one file (no -e, or -e naming the -o file): the pods then keep the
    order between the two streams."""
    try:
        out, err = os.fstat(1), os.fstat(2)
    except OSError:
        return True
    return (out.st_dev, out.st_ino) == (err.st_dev, err.st_ino)


def _stderr(text: str) -> None:
    sys.stderr.write(f"slurm-k8s-bridge: {text}\n")
    sys.stderr.flush()


def hold_early_signals() -> list[int]:
    """Keep, in order, the signals that come before the waiter can act on them, and unblock what
    the step guard blocked for the waiter's start: every later process (munge, srun) starts
    with none blocked."""
    early: list[int] = []
    for signum in EARLY_KEPT:
        signal.signal(signum, lambda number, _frame: early.append(number))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, EARLY_KEPT)
    return early


def take_early_signals(early: list[int] | None) -> list[int]:
    """The kept signals, once the real handlers are set (the list is emptied)."""
    if not early:
        return []
    taken = list(early)
    del early[:len(taken)]
    return taken


def main(argv: list[str]) -> int:
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
    if len(argv) != 1:
        _stderr("usage: waiter.py [--api URL] [--ca CA_FILE] BATCH_SCRIPT | task KEY")
        return 2
    job_id = int(environment["SLURM_JOB_ID"])
    with open(argv[0], encoding="utf-8", errors="surrogateescape") as file:
        script = original_script(file.read())
    os.chdir("/")
    waiter = Waiter(api_url, job_id, script, environment, work_dir, ca_file)

    def on_terminate(signum: int, _frame: object) -> None:
        # Silent, as a native batch script is: slurmstepd reports a cancel or a time limit itself.
        if not waiter._state.cancel_requested:
            waiter.request_cancel()

    signal.signal(signal.SIGTERM, on_terminate)
    signal.signal(signal.SIGINT, on_terminate)
    for signum in FORWARDED:
        signal.signal(signum, lambda number, _frame: waiter.forward_signal(number))
    for signum in take_early_signals(early):
        if signum in (signal.SIGTERM, signal.SIGINT):
            on_terminate(signum, None)
        else:
            waiter.forward_signal(signum)
    return waiter.run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
