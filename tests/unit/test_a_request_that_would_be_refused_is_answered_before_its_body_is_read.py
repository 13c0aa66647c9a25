"""A waiter's request may carry a body of up to 8 MB. One that authentication would refuse anyway
(this replica is a standby or still syncing; unmunge is busy and its queue full) is answered 503
before anything of its body is read: hundreds of requests queued for unmunge must not each hold
one. Here the body is never sent: the answer must come all the same."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from aiohttp.test_utils import BaseTestServer, TestClient, TestServer

from bridge.clients.kube.cache import PodCache
from bridge.controller.metrics import Metrics
from bridge.controller.reconcile import Reconciler
from bridge.manager import auth as auth_module
from bridge.manager.api import Api

from .builders import config
from .test_outages_answer_503_and_the_waiter_retries import UNMUNGE_OK, Slurm

ANSWER_TIMEOUT_S = 5.0
BODY_SIZE = 8 * 1024 * 1024 - 1


def _api(unmunge: Path, ready: bool = True) -> Api:
    reconciler = Reconciler(config(), Slurm(), None, PodCache(), Metrics(), lambda _: None)  # type: ignore[arg-type]
    return Api(reconciler, Metrics(), lambda _: None, lambda: ready, (sys.executable, str(unmunge)))


async def _answer_to_headers_alone(server: BaseTestServer, path: str) -> tuple[int, str]:
    """Send a request's headers, announcing a large body that never comes; its answer."""
    assert server.port is not None
    reader, writer = await asyncio.open_connection(server.host, server.port)
    try:
        writer.write((f"POST {path} HTTP/1.1\r\nHost: bridge\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {BODY_SIZE}\r\nX-Munge-Credential: MUNGE:x\r\n\r\n").encode())
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), ANSWER_TIMEOUT_S)
        lines = head.decode().split("\r\n")
        headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
        text = await asyncio.wait_for(reader.readexactly(int(headers["Content-Length"])), ANSWER_TIMEOUT_S)
        return int(lines[0].split()[1]), text.decode()
    finally:
        writer.close()


@pytest.mark.parametrize("path", ["/v1/jobs/42/attach", "/v1/jobs/42/cancel", "/v1/jobs/42/signal",
                                  "/v1/jobs/42/task", "/v1/jobs/42/step-done", "/v1/jobs/42/step-output",
                                  "/v1/jobs/42/task-signal"])
async def test_a_standby_answers_before_it_reads_the_body(tmp_path: Path, path: str) -> None:
    unmunge = tmp_path / "unmunge.py"
    unmunge.write_text(UNMUNGE_OK)
    async with TestServer(_api(unmunge, ready=False).app()) as server:
        status, text = await _answer_to_headers_alone(server, path)

    assert status == 503
    assert auth_module.NOT_ACTING in text


async def test_with_unmunge_busy_and_its_queue_full_the_answer_comes_before_the_body_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(auth_module, "MAX_CONCURRENT_VERIFY", 1)
    monkeypatch.setattr(auth_module, "MAX_WAITING_VERIFY", 0)
    started, go = tmp_path / "started", tmp_path / "go"
    unmunge = tmp_path / "unmunge.py"
    # Holds the one unmunge slot until the test lets it go.
    unmunge.write_text(f"import os, time\nopen({str(started)!r}, 'w').close()\n"
                       f"while not os.path.exists({str(go)!r}):\n    time.sleep(0.01)\n" + UNMUNGE_OK)
    async with TestClient(TestServer(_api(unmunge).app())) as client:
        busy = asyncio.ensure_future(client.post("/v1/jobs/42/cancel", data=b"{}",
                                                 headers={"X-Munge-Credential": "MUNGE:first"}))
        try:
            for _ in range(1000):
                if started.exists():
                    break
                await asyncio.sleep(0.01)
            status, text = await _answer_to_headers_alone(client.server, "/v1/jobs/42/attach")
        finally:
            go.touch()
        (await busy).release()

    assert status == 503
    assert auth_module.BUSY in text
