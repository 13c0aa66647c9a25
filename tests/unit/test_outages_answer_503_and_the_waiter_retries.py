"""Issue 8, cause 4 and the waiter's half of cause 5: what can pass (munged, slurmrestd or the
daemon's token down) answers 503 and the waiter retries it with jittered backoff; 4xx only for
what can never succeed. Attach streams carry heartbeats; the waiter reads with a timeout, so a
half-open connection is dropped and re-attached instead of waited on forever. The waiter here is
the compiled one (agent/cmd/waiter), run as a slurmd starts it with a stand-in munge bound over
/opt (waiter_runs.py)."""

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

from .builders import allocation, config
from .waiter_runs import fakes, go_constants, go_test, go_waiter, namespaced, require_namespaces

require_namespaces()

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
    """Answers each connection from a list: an HTTP status (with a short body), or an NDJSON exit
    event."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.requests = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.thread.join(timeout=5)
        self.listener.close()

    def _serve(self) -> None:
        for answer in self.answers:
            conn, _ = self.listener.accept()
            self.requests += 1
            conn.recv(65536)
            if isinstance(answer, int):
                conn.sendall(f"HTTP/1.0 {answer} X\r\n\r\nbusy {answer}".encode())
                conn.close()
            else:
                conn.sendall(b"HTTP/1.0 200 OK\r\n\r\n" + answer + b"\n")
                conn.close()


@pytest.fixture(scope="module")
def waiter(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return go_waiter(tmp_path_factory.mktemp("waiter"))


def run_against(waiter: list[str], server: Server, tmp_path: Path) -> subprocess.CompletedProcess[bytes]:
    """The waiter's job attached to `server` until it ends."""
    script = tmp_path / "slurm_script"
    script.write_text("#!/bin/sh\n")
    opt = fakes(tmp_path)
    try:
        api = f"http://127.0.0.1:{server.port}"
        return subprocess.run(namespaced(opt, [*waiter, "--api", api, str(script)]), cwd=tmp_path,
                              env={"SLURM_JOB_ID": "42", "PATH": "/usr/bin:/bin"}, capture_output=True,
                              timeout=120)
    finally:
        server.close()


def test_the_waiter_retries_503_until_the_job_can_start(waiter: list[str], tmp_path: Path) -> None:
    server = Server([503, 503, 502, b'{"type": "exit", "code": 4, "signal": null}'])
    ran = run_against(waiter, server, tmp_path)
    assert (ran.returncode, ran.stdout, ran.stderr, server.requests) == (4, b"", b"", 4)


def test_the_waiter_gives_up_only_on_4xx(waiter: list[str], tmp_path: Path) -> None:
    server = Server([503, 403])
    ran = run_against(waiter, server, tmp_path)
    assert (ran.returncode, ran.stdout, server.requests) == (1, b"", 2)
    assert ran.stderr == b"slurm-k8s-bridge: busy 403\n"


def test_a_silent_connection_is_dropped_and_re_attached(tmp_path: Path) -> None:
    """The daemon sends a heartbeat every 10 s: after 45 s of silence the waiter takes the
    connection for dead and attaches again. Checked in the Go test process with a shorter
    timeout (agent/internal/waiter/outages_test.go), and the real one is 45 s."""
    go_test("TestASilentAttachIsDroppedAndAttachedAgain")
    timeouts = go_constants(tmp_path, "TestTimeoutConstantsDump", "WAITER_TIMEOUT_CONSTANTS_OUT")
    assert timeouts["stream_timeout_s"] == 45


def test_backoff_is_jittered_and_capped() -> None:
    """From 100 ms, doubling, capped at 5 s, each within half of it either way, and spread:
    thousands of waiters must not retry in step (agent/internal/waiter)."""
    go_test("TestBackoffIsJitteredAndCapped")
    go_test("TestBackoffDelaysAreSpread")


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


def test_a_munge_that_times_out_is_an_outage_the_waiter_waits_out(tmp_path: Path) -> None:
    """bench-scale on 1,000 nodes (load 146): munge took over 10 s once, the uncaught
    TimeoutExpired ended the waiter and its job FAILED 1:0 without a word. Now it asks again.
    Checked in the Go test process with a shorter timeout (agent/internal/waiter/outages_test.go),
    and the real one is 10 s."""
    go_test("TestAMungeThatTimesOutIsAnOutageTheWaiterWaitsOut")
    timeouts = go_constants(tmp_path, "TestTimeoutConstantsDump", "WAITER_TIMEOUT_CONSTANTS_OUT")
    assert timeouts["munge_timeout_s"] == 10


def test_a_hung_munge_is_given_up_on_even_if_a_child_holds_its_output() -> None:
    """Killed at its timeout, a munge whose child still holds its output: the waiter does not wait
    for that child (it once waited the child's 30 s), it asks munge again (in the Go test
    process, with a shorter timeout)."""
    go_test("TestAHungMungeIsGivenUpOnEvenIfAChildHoldsItsOutput")
