"""The step-output relay: Slurm's srun for a step of the script writes into pipes; this carries what
it writes to the daemon, which hands it to the script's srun in the pod, so `srun ... | sort`,
`$(srun hostname)` and `srun > file` see it as natively. Used by the step launcher (steps.py); the
daemon's side is the step-output endpoint of bridge/manager/api.py."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time

from bridge.core.waiter_protocol import MAX_OUTPUT_FRAME, request_digest, sign_output_frame
from bridge.waiter import munge
from bridge.waiter.http_client import (
    chunk,
    connect,
    host_header,
    json_object,
    read_answer_head,
    read_chunk,
    reconnect_delay,
)
from bridge.waiter.output import write_all

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
    from collections.abc import Callable
    from typing import IO

    from bridge.waiter.http_client import ByteReader

STREAM_OPEN_ATTEMPTS = 30
"""A step's output stream is asked for this often (jittered backoff, ~2 min) before its output
goes to the job's files instead."""
STREAM_ANSWER_TIMEOUT_S = 60.0
STREAM_END_TIMEOUT_S = 300.0


class StepOutputRelay:
    """One step's output stream to the daemon. Should the daemon not take it, srun's output goes to
    the job's -o/-e files as before, and the exit code by step-done."""

    def __init__(self, url: tuple[str, str, int], job_id: int, key: str, ca_file: str | None) -> None:
        self._url, self._job_id, self._key, self._ca_file = url, job_id, key, ca_file
        self._sock: socket.socket | None = None
        self._reader: ByteReader | None = None
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
            reader: socket.SocketIO | None = None
            status = 0
            try:
                payload = request_digest("POST", path, self._job_id, header) + " " + self._stream_key.hex()
                credential = munge.munge_credential(payload)
                sock = connect(self._url, STREAM_ANSWER_TIMEOUT_S, self._ca_file)
                _, host, port = self._url
                sock.sendall(
                    f"POST {path} HTTP/1.1\r\nHost: {host_header(host, port)}\r\nConnection: close\r\n"
                    "Content-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n"
                    f"X-Munge-Credential: {credential}\r\n\r\n".encode() + chunk(header))
                # Unbuffered, so that select() on the socket sees every byte of an early answer.
                reader = sock.makefile("rb", buffering=0)
                status, answer = read_answer_head(reader)
                if status == 200 and json_object(answer).get("accepted") is True:
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
                self._sock.sendall(chunk(sign_output_frame(self._stream_key, self._seq, fd, part)))
                self._seq += 1
            except OSError:
                self._drop()
                write_all(fd, data[start:])
                return

    def finish(self, code: int) -> None:
        if self._sock is None or self._answered():
            return
        try:
            self._sock.sendall(chunk(sign_output_frame(self._stream_key, self._seq, 0, str(code).encode()))
                               + b"0\r\n\r\n")
            # The answer comes once the script's srun took the end; should it not come, step-done
            # tells the exit code instead (the script's srun takes whichever comes first).
            self._sock.settimeout(STREAM_END_TIMEOUT_S)
            answer = json_object(read_chunk(self._reader) if self._reader else b"")
            self.delivered = answer.get("done") is True
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
            answer = json_object(read_chunk(self._reader) if self._reader else b"")
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


class Bounds:
    """What a Slurm command (commands.py) may take: output bytes and seconds; None, no bound."""

    def __init__(self, output: int | None = None, seconds: float | None = None) -> None:
        self.output, self.seconds = output, seconds


def run_relayed(
    command: list[str], env: dict[str, str], relay: StepOutputRelay,
    started: Callable[[subprocess.Popen[bytes]], None] | None = None,
    stdin: int = subprocess.DEVNULL, pass_fds: tuple[int, ...] = (), bounds: Bounds | None = None,
) -> int:
    """Run Slurm's srun (or one of its commands) with its stdout and stderr through `relay`; its
    exit code, as a shell reports it (128+N when a signal ended it)."""
    import queue
    import threading

    proc = subprocess.Popen(command, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            cwd="/", pass_fds=pass_fds)
    bounds = bounds or Bounds()
    deadline = None if bounds.seconds is None else time.monotonic() + bounds.seconds
    sent = 0
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
            if bounds.output is not None and sent + len(data) > bounds.output:
                data = data[:max(0, bounds.output - sent)]
                if not terminated:
                    relay.send(fd, data)
                    relay.send(2, f"slurm-k8s-bridge: output beyond {bounds.output} bytes: "
                                  "the command was stopped\n".encode())
                    proc.kill()
                    terminated = True
                continue
            sent += len(data)
            relay.send(fd, data)
        if deadline is not None and time.monotonic() > deadline and not terminated:
            relay.send(2, f"slurm-k8s-bridge: the command ran {bounds.seconds:.0f} s: stopped\n".encode())
            proc.terminate()
            terminated = True
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
