"""Checking the compiled waiter (agent/cmd/waiter, agent/internal/waiter) from pytest: its Go tests
run by name (for what a test checks of one of its functions, against fakes in the Go test
process); a fake daemon that speaks the waiter's side of bridge/manager/api.py, and the runs of
the built waiter as a slurmd would start it, against it; and a request helper that speaks to the
daemon's API as the waiter does. Shared by the waiter's protocol tests
(test_the_waiter_answers_the_daemon_as_the_protocol_says.py and its neighbours) and
bench/waiter_cost.py.

The waiter runs munge (and Slurm's srun) by absolute path only, as it must: each run is
started in a mount namespace of its own where a directory of fakes is bound over /opt, so
/opt/munge/bin/munge (the last place it looks) is a stand-in that writes `MUNGE:` and its
payload (root's, in directories only root may write, or the waiter would not run it). The daemon
checks that payload is the digest of the very request it came with, as bridge/manager/auth.py
does with unmunge's answer."""

from __future__ import annotations

import atexit
import hmac
import json
import os
import resource
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient

from bridge.core.waiter_protocol import request_digest, sign_output_frame

JOB_ID = 42
FAKE_MUNGE = "#!/bin/sh\nprintf 'MUNGE:'\nexec cat\n"
MARKER = "#SLURM-K8S-BRIDGE ORIGINAL SCRIPT"
ROOT = Path(__file__).resolve().parents[2]
GO_CANDIDATES = ("/usr/local/go/bin/go",)


class Exchange:
    """One request to the fake daemon, and its answer."""

    def __init__(self, conn: socket.socket, path: str, head: bytes, body: bytes, rest: bytes = b"") -> None:
        self.conn, self.path, self.head, self.body = conn, path, head, body
        self.rest = rest
        """What came after the body's first chunk (a chunked request), unread."""
        self.stream_key = b""
        """The key a keyed credential carries (step-output), which signs the frames."""

    def read_chunk(self) -> bytes:
        """The next chunk of a chunked request."""
        data, self.rest = take_chunk(self.conn, self.rest)
        return data

    def read_frame(self, seq: int) -> tuple[int, bytes]:
        """The next frame of a signed stream (step-output, user-task-tty), the `seq`th: its kind
        (the fd) and data, once its signature is checked."""
        frame = self.read_chunk()
        kind, size = frame[0], int.from_bytes(frame[1:5], "big")
        data, mac = frame[5:5 + size], frame[5 + size:]
        assert hmac.compare_digest(sign_output_frame(self.stream_key, seq, kind, data)[-32:], mac)
        return kind, data

    def stream_chunked(self, first: bytes) -> None:
        """The head of a chunked NDJSON answer (a signed stream's), and its first chunk."""
        self.conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n"
                          b"Transfer-Encoding: chunked\r\n\r\n" + chunk(first))

    @property
    def json(self) -> dict[str, object]:
        answer = json.loads(self.body)
        assert isinstance(answer, dict)
        return answer

    def answer(self, status: int, text: str) -> None:
        """A whole answer, as aiohttp gives one to HTTP/1.0: the body until the connection closes."""
        reason = {200: "OK", 202: "Accepted", 403: "Forbidden", 409: "Conflict", 503: "Unavailable"}
        self.conn.sendall(f"HTTP/1.1 {status} {reason.get(status, 'X')}\r\nContent-Type: text/plain\r\n"
                          f"Connection: close\r\n\r\n{text}".encode())

    def stream(self, *events: dict[str, object]) -> None:
        """The attach stream's head, and `events` if given."""
        self.conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n"
                          b"Connection: close\r\n\r\n"
                          + b"".join(json.dumps(event).encode() + b"\n" for event in events))

    def send(self, event: dict[str, object]) -> None:
        self.conn.sendall(json.dumps(event).encode() + b"\n")

    def send_raw(self, data: bytes) -> None:
        self.conn.sendall(data)


Handler = Callable[[Exchange], None]


def take_chunk(conn: socket.socket, buffer: bytes) -> tuple[bytes, bytes]:
    """One chunk of a chunked body from `buffer` and `conn`; the chunk and what is left."""
    while b"\r\n" not in buffer:
        more = conn.recv(65536)
        if not more:
            raise ConnectionError("the chunked body was cut off")
        buffer += more
    size_line, _, buffer = buffer.partition(b"\r\n")
    size = int(size_line, 16)
    while len(buffer) < size + 2:
        more = conn.recv(65536)
        if not more:
            raise ConnectionError("the chunked body was cut off")
        buffer += more
    return buffer[:size], buffer[size + 2:]


def answering(status: int, text: str) -> Handler:
    """A handler that answers every request alike."""
    return lambda exchange: exchange.answer(status, text)


def streaming(*events: dict[str, object], raw: bytes = b"") -> Handler:
    """An attach handler that streams `events`, then `raw`, then closes."""
    def attach(exchange: Exchange) -> None:
        exchange.stream()
        for event in events:
            exchange.send(event)
        exchange.send_raw(raw)
    return attach


@dataclass
class FakeDaemon:
    """Answers each action with its handler; attaches with `attaches` in turn (the last again)."""

    attaches: list[Handler]
    handlers: dict[str, Handler] = field(default_factory=dict)
    requests: list[tuple[str, bytes]] = field(default_factory=list)
    events: dict[str, threading.Event] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._lock = threading.Lock()
        self._attach_count = 0
        self.handlers.setdefault("cancel", answering(200, '{"cancelling": 42}'))
        threading.Thread(target=self._serve, daemon=True).start()

    def event(self, name: str) -> threading.Event:
        with self._lock:
            return self.events.setdefault(name, threading.Event())

    def paths(self) -> list[str]:
        return [path for path, _ in self.requests]

    def close(self) -> None:
        self.listener.close()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                more = conn.recv(65536)
                if not more:
                    return
                data += more
            head, _, body = data.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            path = lines[0].split()[1]
            fields = (line.partition(":") for line in lines[1:])
            headers = {name.strip().lower(): value.strip() for name, _, value in fields}
            rest = b""
            if "chunked" in headers.get("transfer-encoding", ""):
                body, rest = take_chunk(conn, body)  # the first line: what the stream is for
            length = int(headers.get("content-length", "0"))
            while len(body) < length:
                body += conn.recv(65536)
            expected = "MUNGE:" + request_digest("POST", path, JOB_ID, body)
            credential, _, key = headers.get("x-munge-credential", "").partition(" ")
            action = path.rsplit("/", 1)[1]
            with self._lock:
                self.requests.append((path, body))
                index = self._attach_count
                if action == "attach":
                    self._attach_count += 1
            exchange = Exchange(conn, path, head, body, rest)
            exchange.stream_key = bytes.fromhex(key) if rest or key else b""
            if credential != expected:
                exchange.answer(403, "the credential does not carry this request's digest")
            elif action == "attach":
                self.event(f"attach-{index}").set()
                self.attaches[min(index, len(self.attaches) - 1)](exchange)
            else:
                self.event(action).set()
                self.handlers.get(action, lambda ex: ex.answer(200, "{}"))(exchange)


@dataclass
class Run:
    """What a waiter did: as Slurm and sacct see it, and what it asked the daemon."""

    returncode: int
    stdout: bytes
    stderr: bytes
    requests: list[tuple[str, bytes]]
    ended_at: float


def go_binary() -> str:
    """Go, which these tests need: its absence fails them (CI has it), never skips them."""
    go = shutil.which("go") or next((c for c in GO_CANDIDATES if os.access(c, os.X_OK)), None)
    if go is None:
        raise AssertionError("Go is not installed (looked on PATH and in /usr/local/go/bin): "
                             "the Go waiter and its tests cannot be built")
    return go


_built: dict[str, Path] = {}


def built_go_waiter() -> Path:
    """The Go waiter, built once per test session as it ships (static, stripped; cmd/waiter/main.go
    says how)."""
    if "waiter" not in _built:
        binary = Path(tempfile.mkdtemp(prefix="go-waiter-")) / "waiter"
        # cgo for internal/earlysignals' C constructors; static, with Go's own resolver (no NSS).
        static = "-ldflags=-s -w -linkmode external -extldflags -static"
        subprocess.run([go_binary(), "build", "-trimpath", "-tags", "netgo,osusergo", static,
                        "-o", str(binary), "./cmd/waiter"],
                       cwd=ROOT / "agent", env={**os.environ, "CGO_ENABLED": "1"}, check=True, timeout=600)
        _built["waiter"] = binary
    return _built["waiter"]


def go_test(name: str, env: dict[str, str] | None = None, package: str = "./internal/waiter/") -> str:
    """Runs the one Go test `name` of `package` (under agent/), as `go test -run` would (in the
    package's directory; its tests compiled once per session, see shared_go_test_binary); fails
    with its output if it fails or did not run at all. Its verbose output."""
    result = subprocess.run([str(shared_go_test_binary(package)), "-test.count=1", "-test.v",
                             "-test.timeout=10m", "-test.run", f"^{name}$"],
                            cwd=ROOT / "agent" / package, env={**os.environ, **(env or {})},
                            capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"--- PASS: {name} " in result.stdout, f"{name} did not run:\n{result.stdout}"
    return result.stdout


def shared_go_test_binary(package: str = "./internal/waiter/") -> Path:
    """`package`'s Go tests compiled once per test session (linking them for each `go test -run`
    took about a second a test): for go_test, and for a test to run with the fds, the environment
    or the namespace a case needs (`-test.run ^NAME$` picks the test)."""
    if package not in _built:
        directory = tempfile.mkdtemp(prefix="go-tests-")
        atexit.register(shutil.rmtree, directory, True)
        _built[package] = go_test_binary(Path(directory), package)
    return _built[package]


def go_test_binary(directory: Path, package: str = "./internal/waiter/") -> Path:
    """`package`'s Go tests compiled into one program in `directory`."""
    binary = directory / "waiter.test"
    if not binary.exists():
        subprocess.run([go_binary(), "test", "-c", "-o", str(binary), package], cwd=ROOT / "agent",
                       check=True, capture_output=True, timeout=600)
    return binary


def go_constants(tmp_path: Path, test: str, variable: str) -> dict[str, object]:
    """What the Go test `test` wrote as JSON to the file named by the environment `variable`."""
    out = tmp_path / f"{test}.json"
    go_test(test, {variable: str(out)})
    constants = json.loads(out.read_text())
    assert isinstance(constants, dict)
    return constants


async def post_as_the_waiter(
    client: TestClient, path: str, body: dict[str, object], job_id: int = JOB_ID
) -> tuple[int, str]:
    """POST `body` as the waiter of `job_id` does; with the fake unmunge the tests give the
    daemon, the credential is the request's digest itself. Status and text of the answer."""
    raw = json.dumps(body).encode()
    credential = request_digest("POST", path, job_id, raw)
    response = await client.post(path, data=raw, headers={"X-Munge-Credential": credential})
    return response.status, await response.text()


def go_waiter(directory: Path) -> list[str]:
    """The command that runs the Go waiter, copied into `directory` (its own file, which a test
    may replace or rename; the session's build stays whole)."""
    binary = directory / "waiter"
    if not binary.exists():
        shutil.copy2(built_go_waiter(), binary)
    return [str(binary)]


def fakes(
    directory: Path, srun: str | None = None, slurm: dict[str, str] | None = None, *, munge: str = FAKE_MUNGE
) -> Path:
    """The directory bound over /opt for a run: `munge` as munge (default: the fake that writes
    `MUNGE:` and its payload), and a fake srun and other Slurm binaries (`slurm`: name -> script)
    if given. Each and the directories up to /opt are mode 755 whatever the umask: the waiter runs
    only what root alone controls (the runs are root's)."""
    opt = directory / "opt"
    binaries = [("munge/bin/munge", munge), ("slurm/bin/srun", srun),
                *((f"slurm/bin/{name}", text) for name, text in (slurm or {}).items())]
    for name, text in binaries:
        if text is not None:
            path = opt / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            for made in (path, path.parent, path.parent.parent, opt):
                made.chmod(0o755)
    return opt


def namespaced(opt: Path, command: list[str]) -> list[str]:
    """`command` in a mount namespace of its own where `opt` is /opt; it ends up exec'd, so its
    pid is the waiter's."""
    # By absolute path: the run's PATH may be one a test planted.
    unshare, mount = (shutil.which(name) or name for name in ("unshare", "mount"))
    return [unshare, "-m", "--propagation", "private", "/bin/sh", "-c",
            f'{mount} --bind "$0" /opt && exec "$@"', str(opt), *command]


LIMIT_RESOURCES = ("CPU", "FSIZE", "DATA", "STACK", "CORE", "RSS", "NPROC", "NOFILE", "MEMLOCK", "AS",
                   "LOCKS", "SIGPENDING", "MSGQUEUE", "NICE", "RTPRIO", "RTTIME")
"""The limits the waiter passes on (agent/internal/earlysignals/limits.go), in its order."""


def start_limits() -> dict[str, str]:
    """The SLURM_RLIMIT_<NAME> variables and SLURM_UMASK a waiter started from this process
    appends to the environment it sends: its soft limits and umask at its start, which it
    inherits from here."""
    limits = {}
    for name in LIMIT_RESOURCES:
        soft = resource.getrlimit(LIMIT_RESOURCES.index(name))[0]  # Linux's numbers, in this order
        limits[f"SLURM_RLIMIT_{name}"] = str(2**64 - 1 if soft == resource.RLIM_INFINITY else soft)
    mask = os.umask(0)
    os.umask(mask)
    return {**limits, "SLURM_UMASK": f"{mask:04o}"}


def attach_body(
    script: str, environment: dict[str, str], work_dir: Path | str, *, output_merged: bool = False,
    last_log: dict[str, str] | None = None, cancel: bool = False, signals: list[list[int]] | None = None,
) -> dict[str, object]:
    """The attach request's fields, in the order the protocol sends them."""
    return {"script": script, "environment": environment, "work_dir": str(work_dir), "uid": os.getuid(),
            "gid": os.getgid(), "output_merged": output_merged, "last_log": last_log or {}, "cancel": cancel,
            "signals": signals or []}


def assert_request(body: bytes, expected: dict[str, object]) -> None:
    """`body` is `expected` as the daemon's json module writes it: the same fields in the same
    order, the same spacing and escapes (the credential's digest is over these bytes)."""
    decoded = json.loads(body)
    assert decoded == expected
    assert list(decoded) == list(expected)
    assert body == json.dumps(decoded).encode(), "not json.dumps' bytes"


def environ_order(opt: Path, env: dict[str, str], cwd: Path) -> list[str]:
    """The names of the environment the waiter is given (sh's order, PWD included), as it starts
    there: the order its attach request keeps."""
    listed = subprocess.run(namespaced(opt, ["/usr/bin/env", "-0"]), env=env, cwd=cwd, capture_output=True,
                            check=True, timeout=30).stdout
    return [entry.partition(b"=")[0].decode() for entry in listed.split(b"\0") if entry]


def namespaces_work() -> bool:
    try:
        return subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def require_namespaces() -> None:
    """Fails the calling test module when mount namespaces (root) are missing: the fakes of munge,
    srun and Slurm's commands are bound over /opt in one. Not a skip: CI runs as root, and a
    machine that cannot must not pass these quietly."""
    if not namespaces_work():
        pytest.fail("needs mount namespaces (root) for the fake munge, srun and Slurm", pytrace=False)


def batch_script(directory: Path, user_script: bytes) -> Path:
    """The batch script as slurmd keeps it: the user's own (the guard starts the waiter in its place)."""
    path = directory / "slurm_script"
    path.write_bytes(user_script)
    return path


def run_waiter(
    command: list[str], daemon: FakeDaemon, *, args: list[str], env: dict[str, str], cwd: Path, opt: Path,
    during: Callable[[subprocess.Popen[bytes]], None] | None = None, merged: bool = False,
    stdin: bytes | None = None,
) -> Run:
    """Run a waiter to its end against `daemon` (`during` acts on it meanwhile), with `stdin`
    as its input (none: /dev/null)."""
    proc = subprocess.Popen(namespaced(opt, [*command, "--api", f"http://127.0.0.1:{daemon.port}", *args]),
                            cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if merged else subprocess.PIPE,
                            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE)
    if during is not None:
        threading.Thread(target=during, args=(proc,), daemon=True).start()
    try:
        stdout, stderr = proc.communicate(stdin, timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return Run(proc.returncode, stdout, stderr or b"", list(daemon.requests), time.monotonic())


def wait_then(event: threading.Event, action: Callable[[], object], timeout: float = 20) -> None:
    assert event.wait(timeout), "the waiter never got that far"
    action()


def signal_when(event: threading.Event, signum: int) -> Callable[[subprocess.Popen[bytes]], None]:
    """A `during` that sends `signum` to the waiter once `event` is set."""
    return lambda proc: wait_then(event, lambda: proc.send_signal(signum))


def lines_after(last: str | None, lines: list[tuple[str, str]]) -> Iterator[tuple[str, str]]:
    """The (ts, line) pairs a daemon sends again after a reconnect: those after `last`."""
    return iter([(ts, line) for ts, line in lines if last is None or ts > last])


def relayed_frames(frames: list[tuple[int, bytes]], ended: Callable[[], object]) -> Handler:
    """The daemon's step-output endpoint: takes the stream, checks every frame's signature."""
    def step_output(exchange: Exchange) -> None:
        exchange.stream_chunked(b'{"accepted": true}\n')
        seq = 0
        while True:
            fd, data = exchange.read_frame(seq)
            frames.append((fd, data))
            seq += 1
            if fd == 0:
                break
        exchange.conn.sendall(chunk(b'{"done": true}\n') + b"0\r\n\r\n")
        ended()
    return step_output


def chunk(data: bytes) -> bytes:
    """`data` as one chunk of a chunked HTTP/1.1 body."""
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"
