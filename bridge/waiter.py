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
import http.client
import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from bridge import wellknown

MARKER = wellknown.ATTACH_MARKER
DEFAULT_API_URL = "http://127.0.0.1:8470"
OUTAGE_NOTICE_S = 60.0
RECONNECT_DELAYS_S = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
EXIT_DAEMON_UNREACHABLE = 1

# Variables describing the slurmd host or this process, not the job.
_HOST_ONLY_ENV = frozenset({"PWD", "OLDPWD", "SHLVL", "_"})


@dataclass
class AttachState:
    """What survives a reconnect: the last log timestamp printed per pod index."""

    last_log: dict[str, str] = field(default_factory=dict)
    cancel_requested: bool = False


def original_script(batch_script: str) -> str:
    """The user's script embedded after the marker line by job_submit.lua."""
    _, sep, tail = batch_script.partition(MARKER + "\n")
    if not sep:
        raise ValueError("this batch script was not rewritten by the bridge's job_submit.lua")
    return tail


def munge_credential() -> str:
    """A munge credential for this process's uid/gid (the daemon checks it)."""
    result = subprocess.run(["munge", "--no-input"], capture_output=True, check=False, timeout=10)
    if result.returncode != 0:
        raise RuntimeError(f"munge failed: {result.stderr.decode(errors='replace').strip()}")
    return result.stdout.decode().strip()


def job_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _HOST_ONLY_ENV}


class Waiter:
    def __init__(self, api_url: str, job_id: int, script: str) -> None:
        parsed = urllib.parse.urlsplit(api_url)
        self._host = parsed.hostname or "127.0.0.1"
        self._port = parsed.port or 80
        self._job_id = job_id
        self._script = script
        self._state = AttachState()

    # -- HTTP -----------------------------------------------------------------
    def _connection(self, timeout: float | None = None) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)

    def _post(
        self, path: str, body: dict[str, Any], timeout: float | None = None
    ) -> http.client.HTTPResponse:
        conn = self._connection(timeout)
        data = json.dumps(body).encode()
        conn.request("POST", path, body=data, headers={
            "Content-Type": "application/json",
            "X-Munge-Credential": munge_credential(),
        })
        return conn.getresponse()

    def request_cancel(self) -> None:
        """Ask the daemon to delete the pods; the attach stream reports when they are gone."""
        self._state.cancel_requested = True
        try:
            response = self._post(f"/v1/jobs/{self._job_id}/cancel", {}, timeout=5)
            response.read()
        except OSError as error:
            _stderr(f"could not reach the bridge to cancel: {error}")

    # -- the attach loop --------------------------------------------------------
    def run(self) -> int:
        """Attach until the daemon reports the end; returns an exit code or raises SystemExit."""
        attempt, outage_started, told_at = 0, 0.0, 0.0
        while True:
            try:
                outcome = self._attach_once()
            except (OSError, http.client.HTTPException) as error:
                now = time.monotonic()
                outage_started = outage_started or now
                # A daemon restart takes seconds and needs no word in the job's output; a long
                # outage does, now and then, so the user knows why nothing happens.
                if now - outage_started >= OUTAGE_NOTICE_S and now - told_at >= OUTAGE_NOTICE_S * 10:
                    _stderr(f"waiting for the bridge daemon since {now - outage_started:.0f}s ({error})")
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
            "environment": job_environment(),
            "work_dir": os.getcwd(),
            "uid": os.getuid(),
            "gid": os.getgid(),
            "last_log": self._state.last_log,
            "cancel": self._state.cancel_requested,
        }
        response = self._post(f"/v1/jobs/{self._job_id}/attach", body)
        if response.status != 200:
            text = response.read().decode(errors="replace").strip()
            if 400 <= response.status < 500:
                # The daemon refused this job for good (e.g. bad directive, identity mismatch).
                return {"type": "exit", "code": 1, "reason": text or f"HTTP {response.status}"}
            raise http.client.HTTPException(f"HTTP {response.status}: {text}")
        for raw in response:
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
