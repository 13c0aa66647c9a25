"""A user step's task with a terminal (srun --pty: `waiter step -- ARGV` on a pseudo-terminal) runs
from the compiled waiter as the protocol says (as the retired Python waiter did): its request
(with the window's size), the terminal in raw mode (as Python's tty.setraw makes it) while the
task runs and as it was after, what is typed (Ctrl-C included) and the new window size on
SIGWINCH sent in signed frames, the task's output written to the terminal, its exit code."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import signal
import socket
import struct
import subprocess
import termios
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .waiter_runs import (
    Exchange,
    FakeDaemon,
    Handler,
    answering,
    assert_request,
    chunk,
    fakes,
    go_waiter,
    namespaced,
    require_namespaces,
    start_limits,
)

require_namespaces()

ENV = {"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "node-1", "SLURM_STEP_ID": "3", "SLURM_PROCID": "0",
       "HOME": "/home/alice", "TERM": "xterm", "LC_ALL": "C.UTF-8", "PATH": "/usr/bin:/bin"}
TYPED = b"typed\r\x03"


@pytest.fixture(scope="module")
def waiter(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return go_waiter(tmp_path_factory.mktemp("waiter"))


@dataclass
class TerminalRun:
    returncode: int
    shown: bytes
    """What the waiter wrote to its terminal."""
    requests: list[tuple[str, bytes]]
    frames: list[tuple[int, bytes]] = field(default_factory=list)
    raw_mode: list[object] | None = None
    after: list[object] | None = None
    before: list[object] | None = None


def set_window(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def terminal_task(frames: list[tuple[int, bytes]], typed: threading.Event) -> Handler:
    """The daemon's user-task-tty endpoint: writes a line, takes the input until Ctrl-C and a
    resize, then ends the task with 3."""
    def answer(exchange: Exchange) -> None:
        hello = json.dumps({"fd": 1, "data": base64.b64encode(b"hello\r\n").decode()}).encode() + b"\n"
        exchange.stream_chunked(hello)
        seq, got = 0, b""
        while True:
            kind, data = exchange.read_frame(seq)
            frames.append((kind, data))
            seq += 1
            got += data if kind == 0 else b""
            if got == TYPED:
                typed.set()
            if kind == 3:
                break
        bye = json.dumps({"fd": 2, "data": base64.b64encode(b"bye\r\n").decode()})
        exchange.conn.sendall(chunk(f'{bye}\n{{"exit": 3}}\n'.encode()) + b"0\r\n\r\n")
    return answer


def run_on_a_terminal(command: list[str], directory: Path, handler: Handler, interact: bool) -> TerminalRun:
    frames: list[tuple[int, bytes]] = []
    typed = threading.Event()
    daemon = FakeDaemon([], {"user-task-tty": handler})
    if interact:
        daemon.handlers["user-task-tty"] = terminal_task(frames, typed)
    master, slave = os.openpty()
    set_window(master, 24, 80)
    before = termios.tcgetattr(master)
    run = TerminalRun(0, b"", [], frames, before=before)
    try:
        proc = subprocess.Popen(
            namespaced(fakes(directory), [*command, "--api", f"http://127.0.0.1:{daemon.port}", "step", "--",
                                          "bash", "-l"]),
            stdin=slave, stdout=slave, stderr=slave, cwd=directory, env=ENV)
        if interact:
            threading.Thread(target=type_and_resize, args=(master, proc, typed, run), daemon=True).start()
        run.returncode = proc.wait(timeout=60)
        run.after = termios.tcgetattr(master)
        os.close(slave)
        slave = -1
        run.shown = drain(master)
        run.requests = list(daemon.requests)
    finally:
        daemon.close()
        for fd in (master, slave):
            if fd >= 0:
                os.close(fd)
    return run


def type_and_resize(
    master: int, proc: subprocess.Popen[bytes], typed: threading.Event, run: TerminalRun,
) -> None:
    """Once the waiter put its terminal in raw mode: type, then resize the window."""
    for _ in range(2000):
        mode = termios.tcgetattr(master)
        if not mode[3] & termios.ICANON:
            run.raw_mode = mode
            break
        threading.Event().wait(0.01)
    os.write(master, TYPED)
    assert typed.wait(20), "the typed bytes never reached the daemon"
    set_window(master, 33, 101)
    proc.send_signal(signal.SIGWINCH)


def drain(master: int) -> bytes:
    shown = b""
    while select.select([master], [], [], 1.0)[0]:
        try:
            more = os.read(master, 65536)
        except OSError:  # EIO: the terminal's other end is closed
            break
        if not more:
            break
        shown += more
    return shown


def run(waiter: list[str], tmp_path: Path, handler: Handler, interact: bool = False) -> TerminalRun:
    """The terminal task's run in tmp_path/submit; its one request is checked to be its task's."""
    directory = tmp_path / "submit"
    directory.mkdir()
    ran = run_on_a_terminal(waiter, directory, handler, interact)
    (path, body), = ran.requests
    assert path == "/v1/jobs/42/user-task-tty" and body.endswith(b"\n"), "the stream's first line"
    assert_request(body[:-1], {
        "step": "3", "node": "node-1", "argv": ["bash", "-l"], "cwd": str(directory),
        "env": {**ENV, "PWD": str(directory), **start_limits()},
        "tty": True, "rows": 24, "cols": 80})
    return ran


def raw(mode: list[object]) -> list[object]:
    """`mode` made raw as Python's tty.setraw makes it (what the Python waiter did)."""
    iflag, oflag, cflag, lflag, ispeed, ospeed, cc = mode
    assert isinstance(iflag, int) and isinstance(oflag, int) and isinstance(cflag, int)
    assert isinstance(lflag, int) and isinstance(cc, list)
    cc = list(cc)
    cc[termios.VMIN], cc[termios.VTIME] = 1, 0
    return [iflag & ~(termios.BRKINT | termios.ICRNL | termios.INPCK | termios.ISTRIP | termios.IXON),
            oflag & ~termios.OPOST, cflag & ~(termios.CSIZE | termios.PARENB) | termios.CS8,
            lflag & ~(termios.ECHO | termios.ICANON | termios.IEXTEN | termios.ISIG), ispeed, ospeed, cc]


def test_a_terminal_task_types_resizes_and_ends(waiter: list[str], tmp_path: Path) -> None:
    ran = run(waiter, tmp_path, answering(500, "unused"), interact=True)
    assert ran.before is not None
    assert ran.raw_mode == raw(ran.before) and ran.after == ran.before
    assert ran.returncode == 3 and ran.shown == b"hello\r\nbye\r\n"
    assert ran.frames == [(0, TYPED), (3, b'{"rows": 33, "cols": 101}')]


@pytest.mark.parametrize(("handler", "shown"), [
    (answering(404, "job 42 has no step 3 on node node-1"), b"slurm-k8s-bridge: the bridge answered 404\r\n"),
    (answering(403, ""), b"slurm-k8s-bridge: the bridge answered 403\r\n"),
    (lambda exchange: exchange.conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                                            + chunk(b'{"fd": 1, "data": "aGFsZgo="}\n') + b"0\r\n\r\n"),
     b"half\nslurm-k8s-bridge: the bridge stopped streaming this task before it ended\n"),
])
def test_a_refused_or_cut_off_terminal_task_fails(
    waiter: list[str], tmp_path: Path, handler: Callable[[Exchange], None], shown: bytes,
) -> None:
    ran = run(waiter, tmp_path, handler)
    assert (ran.returncode, ran.shown, ran.frames) == (1, shown, [])
    assert ran.after == ran.before


def test_a_terminal_task_whose_daemon_is_down_says_so_in_words(waiter: list[str], tmp_path: Path) -> None:
    # The first waiter ended with Python's "ConnectionRefusedError: [Errno 111] Connection refused".
    with socket.socket() as placeholder:  # a port nothing listens on once it is closed
        placeholder.bind(("127.0.0.1", 0))
        port = placeholder.getsockname()[1]
    master, slave = os.openpty()
    try:
        proc = subprocess.run(
            namespaced(fakes(tmp_path), [*waiter, "--api", f"http://127.0.0.1:{port}", "step", "--", "bash"]),
            stdin=slave, stdout=slave, stderr=slave, cwd=tmp_path, env=ENV, timeout=60, check=False)
        os.close(slave)
        slave = -1
        shown = drain(master)
    finally:
        for fd in (master, slave):
            if fd >= 0:
                os.close(fd)
    assert proc.returncode == 1
    assert shown == b"slurm-k8s-bridge: could not reach the bridge to run this task: " \
                    b"[Errno 111] Connection refused\r\n"
