"""The batch waiter: what job_submit.lua turned a bridged job's batch script into, so the slurmd of a
bridged node never runs user code. Started by main (`waiter [--api URL] [--ca CA] BATCH_SCRIPT`), it

1. reads the original script from its own batch script (after the marker) and takes its own
   environment (the job's exported environment plus SLURM_*);
2. attaches to the daemon with a munge credential (its uid must be the job's uid) that carries a
   digest of the request, so a captured credential cannot be replayed for another job or body;
3. prints the pods' log lines to stdout, which Slurm writes to slurm-<id>.out, runs the script's
   srun steps (steps.py) and passes signals on to the script (script_signals.py);
4. exits with the pods' exit code, or dies by the same signal, so sacct is true.

On SIGTERM/SIGINT (scancel, time limit) it asks the daemon to delete the pods and exits only once
they are gone. If the daemon restarts, it reconnects and resumes the logs where they stopped. The
daemon's side is the attach endpoint of bridge/manager/api.py.
"""

from __future__ import annotations

import binascii
import contextlib
import json
import os
import signal
import sys
import time

from bridge.waiter.commands import ScriptCommands
from bridge.waiter.http_client import DaemonError, post, reconnect_delay, split_url
from bridge.waiter.output import output_merged, say, write_all
from bridge.waiter.script_signals import ScriptSignals
from bridge.waiter.steps import ScriptSteps
from bridge.waiter.usage import UsageFile

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import IO, Any

MARKER = "#SLURM-K8S-BRIDGE ORIGINAL SCRIPT"
"""= bridge.core.wellknown.ATTACH_MARKER (a unit test keeps them equal)."""
OUTAGE_NOTICE_S = 60.0
STREAM_READ_TIMEOUT_S = 45.0
"""The daemon sends a heartbeat every 10 s; silence this long means a half-open connection."""


def original_script(batch_script: str) -> str:
    """The user's script embedded after the marker line by job_submit.lua."""
    _, sep, tail = batch_script.partition(MARKER + "\n")
    if not sep:
        raise ValueError("this batch script was not rewritten by the bridge's job_submit.lua")
    return tail


class AttachState:
    """What survives a reconnect: the last log timestamp printed per pod index."""

    def __init__(self) -> None:
        self.last_log: dict[str, str] = {}
        self.cancel_requested = False


class Waiter:
    """One job's batch waiter: attaches until the daemon reports the job's end."""

    def __init__(
        self, api_url: str, job_id: int, script: str, environment: dict[str, str], work_dir: str,
        ca_file: str | None = None, arguments: list[str] | None = None,
    ) -> None:
        self._url = split_url(api_url)
        self._arguments = list(arguments or [])
        """What sbatch passed the script (`sbatch job.sh a b`): the pod's script gets them."""
        self._job_id = job_id
        self._script = script
        self._environment = environment
        self._work_dir = work_dir
        self._ca_file = ca_file
        self._state = AttachState()
        self._merged = output_merged()
        self._signals = ScriptSignals(self._post)
        # How this waiter was started, less its batch script and its arguments (the task proxies'
        # command).
        started_as = list(getattr(sys, "orig_argv", [sys.executable, "-I", "-S", *sys.argv]))
        own_command = started_as[:len(started_as) - 1 - len(self._arguments)]
        self._steps = ScriptSteps(self._url, job_id, ca_file, own_command, self._post)
        self._usage = UsageFile()
        self._commands = ScriptCommands(self._url, job_id, ca_file, self._steps.done)

    def _post(self, action: str, body: dict[str, Any], timeout: float | None) -> IO[bytes]:
        path = f"/v1/jobs/{self._job_id}/{action}"
        return post(self._url, path, self._job_id, body, timeout, self._ca_file)

    def forward_signal(self, signum: int) -> None:
        """Pass a signal on to the script in the pods; runs in a signal handler."""
        self._signals.forward(signum)

    def request_cancel(self) -> None:
        """Ask the daemon to delete the pods; the attach stream reports when they are gone."""
        self._state.cancel_requested = True
        try:
            self._post("cancel", {}, 5).close()
        except OSError as error:
            say(f"could not reach the bridge to cancel: {error}")

    @property
    def cancel_requested(self) -> bool:
        """The pods' deletion was asked for (scancel, a time limit): every later attach says so."""
        return self._state.cancel_requested

    def run(self) -> int:
        """Attach until the daemon reports the end; returns an exit code or raises SystemExit."""
        attempt, outage_started, told_at = 0, 0.0, 0.0
        while True:
            failure: Exception | None = None
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
            if failure is not None:
                now = time.monotonic()
                outage_started = outage_started or now
                # A daemon restart takes seconds and needs no word in the job's output; a long
                # outage does, now and then, so the user knows why nothing happens.
                if now - outage_started >= OUTAGE_NOTICE_S and now - told_at >= OUTAGE_NOTICE_S * 10:
                    say(f"waiting for the bridge daemon since {now - outage_started:.0f}s ({failure})")
                    told_at = now
                time.sleep(reconnect_delay(attempt))
                attempt += 1
                continue
            if outcome is not None:
                return self._finish(outcome)
            # The stream ended without an outcome: the daemon went away; reconnect.
            attempt, outage_started = 0, 0.0

    def _attach_once(self) -> dict[str, Any] | None:
        signals = self._signals.for_attach()
        body = {
            "script": self._script,
            # All of it: the daemon drops what describes the slurmd host (job_environment.job_environment).
            "environment": self._environment,
            "work_dir": self._work_dir,
            "uid": os.getuid(),
            "gid": os.getgid(),
            "output_merged": self._merged,
            **({"arguments": self._arguments} if self._arguments else {}),
            "last_log": self._state.last_log,
            "cancel": self._state.cancel_requested,
            "signals": signals,
        }
        # A read timeout: the daemon sends heartbeats, so silence means a half-open connection.
        with self._post("attach", body, STREAM_READ_TIMEOUT_S) as stream:
            self._signals.taken_with_attach(signals)
            for raw in stream:
                if not raw.endswith(b"\n"):
                    break  # cut off mid-line: the daemon went away
                if self._signals.unsent:
                    self._signals.send()  # one refused a moment ago (daemon busy or restarting)
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
                    self._steps.start(event["data"], str(event.get("token", "")), event.get("io", []))
                    self._state.last_log[str(event["pod"])] = event["ts"]
                elif kind == "command":
                    self._commands.start(event)
                    self._state.last_log[str(event["pod"])] = event["ts"]
                elif kind == "usage":
                    self._usage.record_frame(str(event.get("data", "")))
                    self._state.last_log[str(event["pod"])] = event["ts"]
                elif kind == "step-signal":
                    self._steps.signal(str(event.get("key")), event.get("signal"))
                    self._state.last_log[str(event["pod"])] = event["ts"]
                elif kind == "signal-done":
                    self._signals.delivered(event.get("signal"), event.get("seq"))
                elif kind == "message":
                    say(event["text"])
                elif kind == "exit":
                    return event
                # "heartbeat" and unknown kinds only prove the connection is alive.
        return None

    def _finish(self, outcome: dict[str, Any]) -> int:
        sys.stdout.flush()
        if outcome.get("reason"):
            say(outcome["reason"])
        signum = outcome.get("signal")
        if signum:
            # Die by the same signal so Slurm records it (sacct shows e.g. 0:9).
            sys.stderr.flush()
            with contextlib.suppress(OSError, ValueError):  # SIGKILL/SIGSTOP cannot be handled anyway
                signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            time.sleep(1)
        return int(outcome.get("code", 0))


if __name__ == "__main__":  # `python3 -I -m bridge.waiter.attach`, an installed package's waiter
    from bridge.waiter.main import main

    sys.exit(main(sys.argv[1:]))
