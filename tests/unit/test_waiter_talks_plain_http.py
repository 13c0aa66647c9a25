"""The compiled waiter's tiny HTTP/1.0 client and script extraction, against a local socket server:
the waiter runs as a slurmd starts it, with a stand-in munge bound over /opt (waiter_runs.py)."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge.core.waiter_protocol import request_digest

from .waiter_runs import fakes, go_test, go_waiter, namespaced, require_namespaces

require_namespaces()


@pytest.fixture(scope="module")
def waiter(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return go_waiter(tmp_path_factory.mktemp("waiter"))


class OneShotServer:
    """Answers one request with a streamed NDJSON body, as aiohttp does for HTTP/1.0; keeps the
    request's head and body."""

    def __init__(self, family: socket.AddressFamily = socket.AF_INET) -> None:
        self.listener = socket.create_server(("::1" if family == socket.AF_INET6 else "127.0.0.1", 0),
                                             family=family)
        self.port = self.listener.getsockname()[1]
        self.head = self.body = b""
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            while len(body) < length:
                body += conn.recv(65536)
            self.head, self.body = head, body
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: application/x-ndjson\r\n\r\n")
            for event in ({"type": "log", "pod": 0, "ts": "t1", "line": "a"},
                          {"type": "exit", "code": 3, "signal": None}):
                conn.sendall(json.dumps(event).encode() + b"\n")

    def close(self) -> None:
        self.thread.join(timeout=5)
        self.listener.close()


@pytest.fixture
def server() -> Iterator[OneShotServer]:
    one = OneShotServer()
    yield one
    one.close()


def run(waiter: list[str], tmp_path: Path, api: str, script: str) -> subprocess.CompletedProcess[bytes]:
    path = tmp_path / "slurm_script"
    path.write_text(script)
    return subprocess.run(namespaced(fakes(tmp_path), [*waiter, "--api", api, str(path)]), cwd=tmp_path,
                          env={"SLURM_JOB_ID": "7", "PATH": "/usr/bin:/bin"}, capture_output=True, timeout=60)


SCRIPT = "#!/bin/bash\necho hi\n"


def test_the_batch_script_is_sent_whole(
    waiter: list[str], tmp_path: Path, server: OneShotServer,
) -> None:
    ran = run(waiter, tmp_path, f"http://127.0.0.1:{server.port}", SCRIPT)
    assert ran.returncode == 3, ran.stderr
    assert json.loads(server.body)["script"] == "#!/bin/bash\necho hi\n"
    go_test("TestTheScriptIsTheUsersOwnAndAMarkerInItIsInert")


def test_split_url() -> None:
    """http and https, IPv6 literals with and without a port (the config accepts them as api_url),
    a trailing slash, an upper-case scheme, default ports (agent/internal/waiter/waiter_test.go)."""
    go_test("TestSplitURL")


@pytest.mark.parametrize("api", ["http://127.0.0.1:{port}", "http://127.0.0.1:{port}/",
                                 "HTTP://127.0.0.1:{port}/"])
def test_the_api_url_is_where_it_connects(
    waiter: list[str], tmp_path: Path, server: OneShotServer, api: str,
) -> None:
    ran = run(waiter, tmp_path, api.format(port=server.port), SCRIPT)
    assert (ran.returncode, ran.stdout) == (3, b"a\n"), ran.stderr
    assert f"\r\nHost: 127.0.0.1:{server.port}\r\n".encode() in server.head


def test_the_host_header_writes_an_ipv6_address_in_brackets(waiter: list[str], tmp_path: Path) -> None:
    server = OneShotServer(socket.AF_INET6)
    try:
        ran = run(waiter, tmp_path, f"http://[::1]:{server.port}", SCRIPT)
    finally:
        server.close()
    assert (ran.returncode, ran.stdout) == (3, b"a\n"), ran.stderr
    assert f"\r\nHost: [::1]:{server.port}\r\n".encode() in server.head


def test_post_streams_the_answer_line_by_line(
    waiter: list[str], tmp_path: Path, server: OneShotServer,
) -> None:
    ran = run(waiter, tmp_path, f"http://127.0.0.1:{server.port}", SCRIPT)
    assert (ran.returncode, ran.stdout, ran.stderr) == (3, b"a\n", b"")
    assert server.head.startswith(b"POST /v1/jobs/7/attach HTTP/1.0\r\n")
    # The credential carries the digest of exactly the request that was sent (the stand-in munge
    # writes MUNGE: and what it was asked to carry).
    credential = request_digest("POST", "/v1/jobs/7/attach", 7, server.body)
    assert f"\r\nX-Munge-Credential: MUNGE:{credential}\r\n".encode() in server.head + b"\r\n"
    assert json.loads(server.body)["work_dir"] == str(tmp_path)
