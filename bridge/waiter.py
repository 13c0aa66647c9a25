"""The job-side waiter: `slurm-k8s-bridge attach SCRIPT`.

job_submit.lua turned the batch script of a bridged job into a call of this
waiter, so the slurmd of a bridged node never runs user code. The waiter:

1. reads the original script from its own batch script (after the marker) and
   takes its own environment (the job's exported environment plus SLURM_*);
2. proves to the daemon that it is this job's process with a munge credential
   (its uid must be the job's uid);
3. prints the pods' log lines to stdout, which Slurm writes to slurm-<id>.out;
4. exits with the pods' exit code, or dies by the same signal, so sacct is true.

On SIGTERM/SIGINT (scancel, time limit) it asks the daemon to delete the pods
and exits only once they are gone. If the daemon restarts, it reconnects and
resumes the logs where they stopped.

Only the standard library is imported: this runs once per job on the slurmd
host and its start-up time is part of the job's start latency.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import IO, Any

from bridge import wellknown

MARKER = wellknown.ATTACH_MARKER
DEFAULT_API_URL = "http://127.0.0.1:8470"
OUTAGE_NOTICE_S = 60.0
MUNGE_PATHS = ("/usr/bin/munge", "/usr/local/bin/munge", "/opt/munge/bin/munge")
RECONNECT_DELAYS_S = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0)



class AttachState:
    """What survives a reconnect: the last log timestamp printed per pod index."""

    def __init__(self) -> None:
        self.last_log: dict[str, str] = {}
        self.cancel_requested = False


class DaemonError(OSError):
    """The daemon answered with an HTTP error status (5xx: retry; 4xx: refused for good)."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"HTTP {status}: {text}")
        self.status, self.text = status, text


def post(host: str, port: int, path: str, body: dict[str, Any], timeout: float | None) -> IO[bytes]:
    """POST JSON over HTTP/1.0 (so the answer streams unchunked until the server closes); return
    the body as a binary file positioned after the headers. http.client would cost this short-lived
    process ~20 ms of imports at every job start."""
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.0\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nX-Munge-Credential: {munge_credential()}\r\n\r\n"
    ).encode()
    sock = socket.create_connection((host, port), timeout=10)
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


def split_url(url: str) -> tuple[str, int]:
    """`http://host:port[/]` -> (host, port)."""
    rest = url.split("://", 1)[-1].rstrip("/")
    host, _, port = rest.rpartition(":") if rest.count(":") == 1 or rest.startswith("[") else (rest, "", "")
    host = host.strip("[]") or "127.0.0.1"
    return host, int(port) if port else 80


def original_script(batch_script: str) -> str:
    """The user's script embedded after the marker line by job_submit.lua."""
    _, sep, tail = batch_script.partition(MARKER + "\n")
    if not sep:
        raise ValueError("this batch script was not rewritten by the bridge's job_submit.lua")
    return tail


def munge_binary() -> str:
    """munge from the system, not from the job's PATH (which is the user's to shape)."""
    for path in MUNGE_PATHS:
        if os.access(path, os.X_OK):
            return path
    return "munge"


def munge_credential() -> str:
    """A munge credential for this process's uid/gid (the daemon checks it)."""
    result = subprocess.run([munge_binary(), "--no-input"], capture_output=True, check=False, timeout=10)
    if result.returncode != 0:
        # munged down is an outage like the daemon's: the caller retries.
        raise OSError(f"munge failed: {result.stderr.decode(errors='replace').strip()}")
    return result.stdout.decode().strip()


class Waiter:
    def __init__(self, api_url: str, job_id: int, script: str) -> None:
        self._host, self._port = split_url(api_url)
        self._job_id = job_id
        self._script = script
        self._state = AttachState()

    def request_cancel(self) -> None:
        """Ask the daemon to delete the pods; the attach stream reports when they are gone."""
        self._state.cancel_requested = True
        try:
            post(self._host, self._port, f"/v1/jobs/{self._job_id}/cancel", {}, timeout=5).close()
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
                    return self._finish({"type": "exit", "code": 1, "reason": error.text})
                outcome, failure = None, error
            except OSError as error:
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
                time.sleep(RECONNECT_DELAYS_S[min(attempt, len(RECONNECT_DELAYS_S) - 1)])
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
            "environment": dict(os.environ),
            "work_dir": os.getcwd(),
            "uid": os.getuid(),
            "gid": os.getgid(),
            "last_log": self._state.last_log,
            "cancel": self._state.cancel_requested,
        }
        with post(self._host, self._port, f"/v1/jobs/{self._job_id}/attach", body, timeout=None) as stream:
            for raw in stream:
                if not raw.endswith(b"\n"):
                    break  # cut off mid-line: the daemon went away
                event = json.loads(raw)
                kind = event.get("type")
                if kind == "log":
                    sys.stdout.write(event["line"] + "\n")
                    sys.stdout.flush()
                    self._state.last_log[str(event["pod"])] = event["ts"]
                elif kind == "message":
                    _stderr(event["text"])
                elif kind == "exit":
                    return event
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


def _stderr(text: str) -> None:
    sys.stderr.write(f"slurm-k8s-bridge: {text}\n")
    sys.stderr.flush()


def main(argv: list[str]) -> int:
    api_url = DEFAULT_API_URL
    if len(argv) >= 2 and argv[0] == "--api":
        api_url, argv = argv[1], argv[2:]
    if len(argv) != 1:
        _stderr("usage: slurm-k8s-bridge attach [--api URL] BATCH_SCRIPT")
        return 2
    job_id = int(os.environ["SLURM_JOB_ID"])
    with open(argv[0], encoding="utf-8", errors="surrogateescape") as file:
        script = original_script(file.read())
    waiter = Waiter(api_url, job_id, script)

    def on_terminate(signum: int, _frame: object) -> None:
        if not waiter._state.cancel_requested:
            _stderr(f"got signal {signum}: stopping the job's pods")
            waiter.request_cancel()

    signal.signal(signal.SIGTERM, on_terminate)
    signal.signal(signal.SIGINT, on_terminate)
    return waiter.run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
