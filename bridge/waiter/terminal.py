"""The user-step proxy's terminal (`srun --pty`, salloc's interactive shell): slurmstepd gives the
task a pseudo-terminal; this passes it through to a terminal of the task in the pod.

One HTTP/1.1 request carries both ways: its chunked body the terminal's input and window sizes
(frames signed under the key the request's munge credential carries, as the step-output relay's),
its answer the task's output and then its exit code. This end's terminal is put in raw mode, so
every byte (Ctrl-C, Ctrl-Z, Ctrl-\\ included) reaches the pod's terminal, whose line discipline
acts on it there, as the compute node's would natively. Used by user_step.py; the daemon's side is
bridge/manager/user_steps_api.py."""

from __future__ import annotations

import binascii
import contextlib
import json
import os
import signal

from bridge.core.waiter_protocol import request_digest, sign_output_frame
from bridge.waiter import munge
from bridge.waiter.http_client import chunk, connect, host_header, read_answer_head, read_chunk
from bridge.waiter.output import say, write_all

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

INPUT_FD, RESIZE_FD = 0, 3
"""Frame kinds of the input stream: bytes typed (empty: end of input), a new window size."""
ANSWER_TIMEOUT_S = 60.0


def window_size(fd: int = 0) -> tuple[int, int]:
    """(rows, cols) of the terminal on `fd`; (0, 0) when it has none."""
    import fcntl
    import struct
    import termios

    try:
        rows, cols, _, _ = struct.unpack("HHHH", fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8))
    except OSError:
        return 0, 0
    return rows, cols


def run_terminal_task(
    url: tuple[str, str, int], ca_file: str | None, job_id: int, path: str, body: dict[str, object],
    pass_on: Callable[[int, object], None], end_as_the_task: Callable[[int], int],
) -> int:
    """Run the task in the pod with this process's terminal as its own; its exit code."""
    import termios
    import threading
    import tty

    rows, cols = window_size()
    header = json.dumps({**body, "rows": rows, "cols": cols}).encode() + b"\n"
    stream_key = os.urandom(32)
    credential = munge.munge_credential(request_digest("POST", path, job_id, header) + " " + stream_key.hex())
    sock = connect(url, ANSWER_TIMEOUT_S, ca_file)
    _, host, port = url
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: {host_header(host, port)}\r\nConnection: close\r\n"
        "Content-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n"
        f"X-Munge-Credential: {credential}\r\n\r\n".encode() + chunk(header))
    reader = sock.makefile("rb", buffering=0)
    status, first = read_answer_head(reader)
    if status != 200:
        say(first.decode("utf-8", "replace").strip() or f"the bridge answered {status}")
        return 1
    sock.settimeout(None)  # a quiet shell is no reason to give up
    sending = threading.Lock()
    seq = 0

    def send(kind: int, data: bytes) -> None:
        nonlocal seq
        with sending:
            sock.sendall(chunk(sign_output_frame(stream_key, seq, kind, data)))
            seq += 1

    def pump() -> None:
        # The terminal's input, as typed; its end (the user's terminal went away) ends the input.
        with contextlib.suppress(OSError):
            while data := os.read(0, 4096):
                send(INPUT_FD, data)
            send(INPUT_FD, b"")

    def resized(_signum: int, _frame: object) -> None:
        rows, cols = window_size()
        with contextlib.suppress(OSError):
            send(RESIZE_FD, json.dumps({"rows": rows, "cols": cols}).encode())

    saved = termios.tcgetattr(0)
    tty.setraw(0)
    signal.signal(signal.SIGWINCH, resized)
    # In raw mode the terminal sends no SIGINT here; slurmstepd's signals still come (scancel;
    # the others were set by the caller), and a hang-up of this end goes on too.
    signal.signal(signal.SIGHUP, pass_on)
    threading.Thread(target=pump, daemon=True).start()
    try:
        pending = first
        while True:
            lines = pending.split(b"\n")
            pending = lines.pop()
            for line in lines:
                if not line.strip():
                    continue
                event = json.loads(line)
                if "fd" in event:
                    write_all(int(event["fd"]), binascii.a2b_base64(event["data"]))
                elif "exit" in event:
                    termios.tcsetattr(0, termios.TCSADRAIN, saved)
                    return end_as_the_task(int(event["exit"]))
            more = read_chunk(reader)
            if not more:
                say("the bridge stopped streaming this task before it ended")
                return 1
            pending += more
    except (OSError, ValueError) as error:
        say(f"lost the bridge while the task ran: {error}")
        return 1
    finally:
        with contextlib.suppress(termios.error, OSError):
            termios.tcsetattr(0, termios.TCSADRAIN, saved)
