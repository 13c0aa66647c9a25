"""Checking the compiled waiter (agent/cmd/waiter, agent/internal/waiter) from pytest: its Go
tests run by name (for what a test checks of one of its functions, against fakes in the Go test
process), and a request helper that speaks to the daemon's API as the waiter does, its munge
credential bound to the request by bridge/core/waiter_protocol.py's digest."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp.test_utils import TestClient

from bridge.core.waiter_protocol import request_digest

ROOT = Path(__file__).resolve().parents[2]
GO_CANDIDATES = ("/usr/local/go/bin/go",)
JOB_ID = 42


def go_binary() -> str:
    """Go, which these tests need: its absence fails them (CI has it), never skips them."""
    go = shutil.which("go") or next((c for c in GO_CANDIDATES if os.access(c, os.X_OK)), None)
    if go is None:
        raise AssertionError("Go is not installed (looked on PATH and in /usr/local/go/bin): "
                             "the Go waiter's tests cannot run")
    return go


def go_test(name: str, env: dict[str, str] | None = None, package: str = "./internal/waiter/") -> str:
    """Runs the one Go test `name` of `package` (under agent/); fails with its output if it fails
    or did not run at all. Its verbose output."""
    result = subprocess.run([go_binary(), "test", "-count=1", "-v", "-run", f"^{name}$", package],
                            cwd=ROOT / "agent", env={**os.environ, **(env or {})}, capture_output=True,
                            text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"--- PASS: {name} " in result.stdout, f"{name} did not run:\n{result.stdout}"
    return result.stdout


def go_test_binary(directory: Path, package: str = "./internal/waiter/") -> Path:
    """`package`'s Go tests compiled into one program, for a test to run with the fds, the
    environment or the namespace a case needs (`-test.run ^NAME$` picks the test)."""
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


# -- the built binary, run as a slurmd runs it, against a fake daemon ------------------------------
# As tests/unit/waiter_runs.py does (which the Python zipapp's build still ties to bridge/waiter):
# each run is in a mount namespace of its own where a directory of fakes is bound over /opt, so
# /opt/munge/bin/munge, the last place the waiter looks, writes `MUNGE:` and its payload.

FAKE_MUNGE = "#!/bin/sh\nprintf 'MUNGE:'\nexec cat\n"
MARKER = "#SLURM-K8S-BRIDGE ORIGINAL SCRIPT"


def go_waiter(directory: Path) -> list[str]:
    """The Go waiter, built here as it ships (static, stripped; cmd/waiter/main.go says how)."""
    binary = directory / "waiter"
    if not binary.exists():
        # cgo for internal/earlysignals' C constructor; static, with Go's own resolver (no NSS).
        static = "-ldflags=-s -w -linkmode external -extldflags -static"
        subprocess.run([go_binary(), "build", "-trimpath", "-tags", "netgo,osusergo", static,
                        "-o", str(binary), "./cmd/waiter"],
                       cwd=ROOT / "agent", env={**os.environ, "CGO_ENABLED": "1"}, check=True, timeout=600)
    return [str(binary)]


def namespaces_work() -> bool:
    try:
        return subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def fakes(directory: Path, munge: str = FAKE_MUNGE, binaries: dict[str, str] | None = None) -> Path:
    """The directory bound over /opt for a run: `munge` as munge, and `binaries` (path under /opt
    -> script)."""
    opt = directory / "opt"
    for name, text in {"munge/bin/munge": munge, **(binaries or {})}.items():
        path = opt / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o755)
    return opt


def namespaced(opt: Path, command: list[str]) -> list[str]:
    """`command` in a mount namespace of its own where `opt` is /opt; it ends up exec'd, so its
    pid is the waiter's."""
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", 'mount --bind "$0" /opt && exec "$@"',
            str(opt), *command]


def batch_script(directory: Path, user_script: bytes) -> Path:
    """The batch script job_submit.lua writes: its wrapper, the marker, the user's script."""
    path = directory / "slurm_script"
    path.write_bytes(b"#!/bin/sh\nexec waiter \"$0\" \"$@\"\n" + MARKER.encode() + b"\n" + user_script)
    return path


@dataclass
class Exchange:
    """One request to the fake daemon, which its handler answers."""

    conn: socket.socket
    path: str
    body: bytes

    @property
    def json(self) -> dict[str, object]:
        answer = json.loads(self.body)
        assert isinstance(answer, dict)
        return answer

    def answer(self, status: int, text: str) -> None:
        """A whole answer, as aiohttp gives one to HTTP/1.0: the body until the connection closes."""
        self.conn.sendall(f"HTTP/1.1 {status} X\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n"
                          f"{text}".encode())

    def stream(self, *events: dict[str, object]) -> None:
        self.conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n"
                          b"Connection: close\r\n\r\n"
                          + b"".join(json.dumps(event).encode() + b"\n" for event in events))


Handler = Callable[[Exchange], None]


@dataclass
class FakeDaemon:
    """Answers each action (the last part of its path) with its handler (default: 200 `{}`) once
    its credential carries the request's digest; records every request."""

    handlers: dict[str, Handler]
    requests: list[tuple[str, bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

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
            headers = {name.strip().lower(): value.strip()
                       for name, _, value in (line.partition(":") for line in lines[1:])}
            while len(body) < int(headers.get("content-length", "0")):
                body += conn.recv(65536)
            self.requests.append((path, body))
            exchange = Exchange(conn, path, body)
            if headers.get("x-munge-credential") != "MUNGE:" + request_digest("POST", path, JOB_ID, body):
                exchange.answer(403, "the credential does not carry this request's digest")
                return
            self.handlers.get(path.rsplit("/", 1)[1], lambda ex: ex.answer(200, "{}"))(exchange)


def run_waiter(command: list[str], daemon: FakeDaemon, *, args: list[str], env: dict[str, str], cwd: Path,
               opt: Path) -> subprocess.CompletedProcess[bytes]:
    """`command` (the waiter, or what execs it) run to its end against `daemon`, with `opt` as /opt."""
    return subprocess.run(namespaced(opt, [*command, "--api", f"http://127.0.0.1:{daemon.port}", *args]),
                          cwd=cwd, env=env, capture_output=True, stdin=subprocess.DEVNULL, timeout=60,
                          check=False)
