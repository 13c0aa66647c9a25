"""Issue 8, cause 4 and the waiter's half of cause 5: what can pass (munged, slurmrestd or the
daemon's token down) answers 503 and the waiter retries it with jittered backoff; 4xx only for
what can never succeed. Attach streams carry heartbeats; the waiter reads with a timeout, so a
half-open connection is dropped and re-attached instead of waited on forever."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from bridge.clients.kube.cache import PodCache
from bridge.controller.metrics import Metrics
from bridge.controller.reconcile import Reconciler
from bridge.core.errors import SlurmAuthError, SlurmUnavailable
from bridge.core.model import JobAllocation
from bridge.core.waiter_protocol import request_digest
from bridge.manager import api as api_module
from bridge.manager import auth as auth_module
from bridge.manager.api import Api
from bridge.waiter import attach as waiter
from bridge.waiter import http_client, munge

from .builders import allocation, config

BODY = b'{"script": "#!/bin/sh\\n", "environment": {}, "work_dir": "/", "uid": 1000, "gid": 100}'
PATH = "/v1/jobs/42/attach"

# unmunge stand-ins: `ok` decodes alice's credential (the payload is the credential itself).
UNMUNGE_OK = (
    "import sys\nsys.stdout.write('UID: alice (1000)\\nGID: users (100)\\n\\n' + sys.stdin.read())\n"
)
UNMUNGE_SOCKET_DOWN = (
    "import sys\nsys.stderr.write('unmunge: Error: Failed to access socket\\n'); sys.exit(6)\n"
)
UNMUNGE_REPLAYED = "import sys\nsys.exit(17)\n"


class Slurm:
    def __init__(self, error: Exception | None = None) -> None:
        self.error = error

    async def job(self, job_id: int) -> JobAllocation | None:
        if self.error is not None:
            raise self.error
        return allocation(job_id=job_id)


async def _post(tmp_path: Path, unmunge: str, slurm: Slurm, credential: str) -> tuple[int, str]:
    script = tmp_path / "unmunge.py"
    script.write_text(unmunge)
    reconciler = Reconciler(config(), slurm, None, PodCache(), Metrics(), lambda _: None)  # type: ignore[arg-type]
    api = Api(reconciler, Metrics(), lambda _: None, lambda: True, (sys.executable, str(script)))
    async with TestClient(TestServer(api.app())) as client:
        response = await client.post(PATH, data=BODY, headers={"X-Munge-Credential": credential})
        return response.status, await response.text()


GOOD = request_digest("POST", PATH, 42, BODY)


@pytest.mark.parametrize(
    ("unmunge", "slurm", "status", "text"),
    [
        (UNMUNGE_SOCKET_DOWN, Slurm(), 503, "munged unavailable"),
        (UNMUNGE_OK, Slurm(SlurmUnavailable("slurmrestd did not answer")), 503, "Slurm unavailable"),
        (UNMUNGE_OK, Slurm(SlurmAuthError("token refused")), 503, "Slurm refuses the bridge"),
        (UNMUNGE_REPLAYED, Slurm(), 403, "replayed"),
    ],
)
async def test_outages_are_503_and_a_bad_credential_403(
    tmp_path: Path, unmunge: str, slurm: Slurm, status: int, text: str
) -> None:
    got = await _post(tmp_path, unmunge, slurm, GOOD)
    assert got[0] == status and text in got[1], got


class Server:
    """Answers each connection from a list: an HTTP status (with a short body), or "hang" (headers
    of a 200, then silence: a half-open connection), or an NDJSON exit event."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.requests = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.thread.join(timeout=5)
        for conn in self.held:
            conn.close()
        self.listener.close()

    def _serve(self) -> None:
        for answer in self.answers:
            conn, _ = self.listener.accept()
            self.requests += 1
            conn.recv(65536)
            if answer == "hang":
                conn.sendall(b"HTTP/1.0 200 OK\r\n\r\n")
                self.held.append(conn)  # never answered, never closed (until the test ends)
            elif isinstance(answer, int):
                conn.sendall(f"HTTP/1.0 {answer} X\r\n\r\nbusy {answer}".encode())
                conn.close()
            else:
                conn.sendall(b"HTTP/1.0 200 OK\r\n\r\n" + answer + b"\n")
                conn.close()


def _waiter_against(server: Server, monkeypatch: pytest.MonkeyPatch) -> waiter.Waiter:
    monkeypatch.setattr(munge, "munge_credential", lambda payload: "MUNGE:x")
    monkeypatch.setattr(http_client, "RECONNECT_BASE_S", 0.01)
    monkeypatch.setattr(waiter, "STREAM_READ_TIMEOUT_S", 0.5)
    return waiter.Waiter(f"http://127.0.0.1:{server.port}", 42, "#!/bin/sh\n", {}, "/")


def _served(answers: list[Any], monkeypatch: pytest.MonkeyPatch) -> tuple[int, Server]:
    server = Server(answers)
    try:
        return _waiter_against(server, monkeypatch).run(), server
    finally:
        server.close()


def test_the_waiter_retries_503_until_the_job_can_start(monkeypatch: pytest.MonkeyPatch) -> None:
    code, server = _served([503, 503, 502, b'{"type": "exit", "code": 4, "signal": null}'], monkeypatch)
    assert (code, server.requests) == (4, 4)


def test_the_waiter_gives_up_only_on_4xx(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, server = _served([503, 403], monkeypatch)
    assert (code, server.requests) == (1, 2)
    assert "busy 403" in capsys.readouterr().err


def test_a_silent_connection_is_dropped_and_re_attached(monkeypatch: pytest.MonkeyPatch) -> None:
    code, server = _served(["hang", b'{"type": "exit", "code": 0, "signal": null}'], monkeypatch)
    assert (code, server.requests) == (0, 2)


def test_backoff_is_jittered_and_capped() -> None:
    delays = {http_client.reconnect_delay(3) for _ in range(50)}
    assert len(delays) > 10, "thousands of waiters must not retry in step"
    assert all(0.4 <= d <= 1.2 for d in delays)
    assert max(http_client.reconnect_delay(30) for _ in range(50)) <= http_client.RECONNECT_CAP_S * 1.5


async def test_a_quiet_attach_stream_carries_heartbeats(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(api_module, "HEARTBEAT_S", 0.05)
    script = tmp_path / "unmunge.py"
    script.write_text(UNMUNGE_OK)
    reconciler = Reconciler(config(), Slurm(), None, PodCache(), Metrics(), lambda _: None)  # type: ignore[arg-type]
    api = Api(reconciler, Metrics(), lambda _: None, lambda: True, (sys.executable, str(script)))
    async with TestClient(TestServer(api.app())) as client:
        response = await client.post(PATH, data=BODY, headers={"X-Munge-Credential": GOOD})
        assert response.status == 200
        first = await asyncio.wait_for(response.content.readline(), 5)
        second = await asyncio.wait_for(response.content.readline(), 5)
        assert first == second == b'{"type": "heartbeat"}\n'
        response.close()


def _api_with_slow_unmunge(tmp_path: Path, seconds: float) -> Api:
    """An Api whose unmunge takes `seconds` for each credential."""
    script = tmp_path / "unmunge.py"
    script.write_text(f"import sys, time\ntime.sleep({seconds})\n" + UNMUNGE_OK)
    reconciler = Reconciler(config(), Slurm(), None, PodCache(), Metrics(), lambda _: None)  # type: ignore[arg-type]
    return Api(reconciler, Metrics(), lambda _: None, lambda: True, (sys.executable, str(script)))


async def test_credential_checks_are_capped_and_the_rest_retried(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Anyone may send requests and each check runs unmunge: beyond the cap and the requests
    allowed to wait for it, 503 (retried)."""
    monkeypatch.setattr(auth_module, "MAX_CONCURRENT_VERIFY", 1)
    monkeypatch.setattr(auth_module, "MAX_WAITING_VERIFY", 0)
    async with TestClient(TestServer(_api_with_slow_unmunge(tmp_path, 1.0).app())) as client:
        cancel = "/v1/jobs/42/cancel"
        slow = asyncio.ensure_future(client.post(cancel, data=b"{}", headers={"X-Munge-Credential": "x"}))
        await asyncio.sleep(0.3)
        second = await client.post(cancel, data=b"{}", headers={"X-Munge-Credential": "y"})
        assert second.status == 503 and "busy" in await second.text()
        first = await slow
        assert first.status == 403  # its credential carries no digest of the request
        first.release()


async def test_a_burst_of_credential_checks_waits_for_a_slot_instead_of_failing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """300 waiters attaching at once: beyond the unmunge slots, requests wait (up to
    MAX_WAITING_VERIFY) rather than each coming back later with a new connection and fork."""
    monkeypatch.setattr(auth_module, "MAX_CONCURRENT_VERIFY", 1)
    async with TestClient(TestServer(_api_with_slow_unmunge(tmp_path, 0.3).app())) as client:
        cancel = "/v1/jobs/42/cancel"
        answers = await asyncio.gather(*(
            client.post(cancel, data=b"{}", headers={"X-Munge-Credential": f"c{i}"}) for i in range(3)))
        statuses = [answer.status for answer in answers]
        for answer in answers:
            answer.release()

    assert statuses == [403, 403, 403], "each was checked (and refused: no digest), none turned away"


def test_a_munge_that_times_out_is_an_outage_the_waiter_waits_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """bench-scale on 1,000 nodes (load 146): munge took over 10 s once, the uncaught
    TimeoutExpired ended the waiter and its job FAILED 1:0 without a word. Now it asks again."""
    real_munge_credential = munge.munge_credential
    server = Server([b'{"type": "exit", "code": 4, "signal": null}'])
    calls: list[int] = []

    def slow_then_fine(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
        calls.append(1)
        if len(calls) == 1:
            raise subprocess.TimeoutExpired(argv, 10)
        return subprocess.CompletedProcess(argv, 0, b"MUNGE:x\n", b"")

    try:
        waiting = _waiter_against(server, monkeypatch)
        monkeypatch.setattr(munge, "munge_credential", real_munge_credential)
        monkeypatch.setattr(munge, "munge_binary", lambda: "/usr/bin/munge")
        monkeypatch.setattr(munge.subprocess, "run", slow_then_fine)
        code = waiting.run()
    finally:
        server.close()
    assert (code, len(calls), server.requests) == (4, 2, 1)

