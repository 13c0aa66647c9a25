"""Issue 10: Slurm's srun for a step runs on the slurmd host, but its output belongs to the srun
the script called in the pod (`srun ... | sort`, `$(srun hostname)`, `srun > file`). The waiter
streams it to the daemon in frames signed with a key only its munge credential carries; the
daemon checks every frame and relays it into the first node's pod (`agent step-output KEY`)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from bridge.controller import tasks as tasks_module
from bridge.controller.metrics import Metrics
from bridge.controller.step_streams import StepStreams
from bridge.controller.tasks import Tasks
from bridge.core.agent_protocol import AGENT
from bridge.core.errors import ExecNotStarted
from bridge.core.model import JobAllocation
from bridge.core.waiter_protocol import MAX_OUTPUT_FRAME, request_digest, sign_output_frame
from bridge.manager.api import Api

from .builders import allocation, config
from .waiter_runs import shared_go_test_binary

UNMUNGE_OK = (
    "import sys\nsys.stdout.write('UID: alice (1000)\\nGID: users (100)\\n\\n' + sys.stdin.read())\n"
)
PATH = "/v1/jobs/42/step-output"


class PodAgent:
    """`agent step-output KEY` as the daemon sees it: it takes frames until the end frame, then
    exits `exit_code`; with `gone_after`, it ends early (the script's srun went away)."""

    def __init__(
        self, exit_code: int = 0, gone_after: int | None = None, gone_in_s: float | None = None
    ) -> None:
        self.frames: list[tuple[int, bytes]] = []
        self.commands: list[list[str]] = []
        self.exit_code, self.gone_after, self.gone_in_s = exit_code, gone_after, gone_in_s

    async def exec_feeding(
        self, pod: str, command: list[str], feed: asyncio.Queue[bytes | None],
        on_output: Callable[[bytes], None] | None = None,
    ) -> int:
        self.commands.append([pod, *command])
        note = on_output or (lambda _: None)
        note(b"from 0\n")  # the script's srun wrote nothing before this stream
        if self.gone_in_s is not None:
            await asyncio.sleep(self.gone_in_s)  # the script's srun was killed while quiet
            return 3
        if self.exit_code not in (0, 3):
            await feed.get()
            return self.exit_code  # the exec broke off (an apiserver restart, an idle timeout)
        while (chunk := await feed.get()) is not None:
            self.frames.append((chunk[0], chunk[5:]))
            if chunk[0]:
                note(f"k {len(self.frames)}\n".encode())
            if self.gone_after is not None and len(self.frames) >= self.gone_after:
                return 3
        return self.exit_code


class Reconciler:
    def __init__(self, kube: PodAgent) -> None:
        self.cfg = config()
        self.kube = kube
        self.closed: list[str] = []
        self.open_steps = {"7"}
        self.tasks = Tasks(kube, self)  # type: ignore[arg-type]
        self.step_streams = StepStreams(kube, self)  # type: ignore[arg-type]

    async def read_job(self, job_id: int) -> JobAllocation:
        return allocation(job_id=job_id)

    def record_job(self, _alloc: JobAllocation) -> None:
        pass

    def is_bridged(self, _alloc: JobAllocation) -> bool:
        return True

    def step_run(self, _job_id: int, key: str) -> int | None:
        return 0 if key in self.open_steps else None

    def task_pod_of_index(self, job_id: int, index: int, run: int | None = None) -> str | None:
        return f"slurm-{job_id}-{index}" if not run else f"slurm-{job_id}-r{run}-{index}"

    def close_step(self, _job_id: int, key: str) -> None:
        self.closed.append(key)
        self.open_steps.discard(key)


# The waiter's side is the compiled waiter's relay (agent/internal/waiter/relay.go), run by its
# test program (relay_driver_test.go) as the waiter runs Slurm's srun for a step; its munge writes
# its payload back, which the daemon's stand-in unmunge takes as the credential's payload.


@pytest.fixture(scope="module")
def relay_program() -> list[str]:
    program = shared_go_test_binary()
    return [str(program), "-test.run", "^TestRelayedRunAgainstTheDaemon$"]


@dataclass
class Relayed:
    """How the relayed run went: srun's exit code, the relay's end, what went to the job's files."""

    code: int
    delivered: bool
    gone: bool
    seconds: float
    out: bytes
    err: bytes


async def run_relay(program: list[str], tmp_path: Path, **settings: str) -> Relayed:
    """The relay driver with WAITER_RELAY_<NAME> settings; run beside the daemon this loop serves."""
    out = tmp_path / "relayed.json"
    env = {**os.environ, "WAITER_RELAY_OUT": str(out),
           **{f"WAITER_RELAY_{name.upper()}": value for name, value in settings.items()}}
    proc = await asyncio.create_subprocess_exec(*program, env=env, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, stdout + stderr
    outcome = json.loads(out.read_text())
    return Relayed(outcome["code"], outcome["delivered"], outcome["gone"], outcome["seconds"], stdout, stderr)


async def _serve(tmp_path: Path, reconciler: Reconciler) -> TestClient:
    script = tmp_path / "unmunge.py"
    script.write_text(UNMUNGE_OK)
    api = Api(reconciler, Metrics(), lambda _: None, lambda: True,  # type: ignore[arg-type]
              (sys.executable, str(script)))
    client = TestClient(TestServer(api.app()))
    await client.start_server()
    return client


async def _relay(
    program: list[str], tmp_path: Path, client: TestClient, script: str, key: str = "7"
) -> Relayed:
    return await run_relay(program, tmp_path, api=f"http://127.0.0.1:{client.server.port}", key=key,
                           script=script)


def _by_fd(frames: list[tuple[int, bytes]]) -> dict[int, bytes]:
    joined: dict[int, bytes] = {}
    for fd, data in frames:
        joined[fd] = joined.get(fd, b"") + data
    return joined


async def test_srun_output_and_exit_code_reach_the_pod_in_order_per_stream(
    relay_program: list[str], tmp_path: Path
) -> None:
    agent = PodAgent()
    reconciler = Reconciler(agent)
    client = await _serve(tmp_path, reconciler)
    try:
        relayed = await _relay(
            relay_program, tmp_path, client,
            "printf 'one\\n'; printf 'err\\n' >&2; printf 'two\\377\\n'; head -c 3000000 /dev/zero; exit 3")
    finally:
        await client.close()

    assert relayed.code == 3
    assert relayed.delivered
    assert agent.commands == [["slurm-42-0", AGENT, "step-output", "7"]]
    streams = _by_fd(agent.frames)
    assert streams[1] == b"one\ntwo\xff\n" + b"\0" * 3_000_000
    assert streams[2] == b"err\n"
    assert agent.frames[-1] == (0, b"3")
    assert all(len(data) <= MAX_OUTPUT_FRAME for _, data in agent.frames)
    assert reconciler.closed == ["7"]


class PodAgentBehindABusyKubelet(PodAgent):
    """The kubelet refuses the first two execs before they open (HTTP 500 under load)."""

    def __init__(self) -> None:
        super().__init__()
        self.refused = 0

    async def exec_feeding(
        self, pod: str, command: list[str], feed: asyncio.Queue[bytes | None],
        on_output: Callable[[bytes], None] | None = None,
    ) -> int:
        if self.refused < 2:
            self.refused += 1
            raise ExecNotStarted(f"cannot exec in pod {pod}: 500, message='Invalid response status'")
        return await super().exec_feeding(pod, command, feed, on_output)


async def test_a_relay_whose_exec_was_refused_before_it_opened_is_opened_again(
    relay_program: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tasks_module, "TASK_START_FIRST_RETRY_S", 0.01)
    agent = PodAgentBehindABusyKubelet()
    client = await _serve(tmp_path, Reconciler(agent))
    try:
        relayed = await _relay(relay_program, tmp_path, client, "printf 'kept in the pipe\\n'; exit 4")
    finally:
        await client.close()

    assert agent.refused == 2
    assert relayed.code == 4 and relayed.delivered
    assert _by_fd(agent.frames)[1] == b"kept in the pipe\n"


async def test_when_the_scripts_srun_is_gone_the_real_srun_is_ended(
    relay_program: list[str], tmp_path: Path
) -> None:
    agent = PodAgent(gone_after=1)
    client = await _serve(tmp_path, Reconciler(agent))
    try:
        relayed = await _relay(relay_program, tmp_path, client,
                               "echo first; sleep 1; echo second; exec sleep 60")
    finally:
        await client.close()

    assert relayed.gone and not relayed.delivered
    assert relayed.code == 143 and relayed.seconds < 30


async def test_a_quiet_step_whose_scripts_srun_is_gone_is_ended_too(
    relay_program: list[str], tmp_path: Path
) -> None:
    """`timeout 5 srun sleep 100`: natively the step ends with its srun, output or not."""
    agent = PodAgent(gone_in_s=0.5)
    client = await _serve(tmp_path, Reconciler(agent))
    try:
        relayed = await _relay(relay_program, tmp_path, client, "exec sleep 60")
    finally:
        await client.close()

    assert relayed.gone and not relayed.delivered
    assert relayed.code == 143 and relayed.seconds < 30


async def test_output_the_daemon_will_not_take_goes_to_the_job_files(
    relay_program: list[str], tmp_path: Path
) -> None:
    agent = PodAgent()
    client = await _serve(tmp_path, Reconciler(agent))
    try:
        relayed = await _relay(
            relay_program, tmp_path, client, "echo to-the-out-file; echo to-the-err-file >&2; exit 4",
            key="8")
    finally:
        await client.close()

    assert relayed.code == 4 and not relayed.delivered and agent.frames == []
    assert b"to-the-out-file\n" in relayed.out and b"to-the-err-file\n" in relayed.err


async def _raw_stream(client: TestClient, payload_of: Any, frames: bytes) -> list[dict[str, Any]]:
    header = b'{"key": "7"}\n'
    response = await client.post(PATH, data=header + frames,
                                 headers={"X-Munge-Credential": payload_of(header)})
    assert response.status == 200, await response.text()
    return [json.loads(line) for line in (await response.text()).splitlines()]


async def test_a_frame_not_signed_with_the_credentials_key_is_refused(tmp_path: Path) -> None:
    agent = PodAgent()
    client = await _serve(tmp_path, Reconciler(agent))
    key, other = b"k" * 32, b"x" * 32
    try:
        answers = await _raw_stream(
            client, lambda header: request_digest("POST", PATH, 42, header) + " " + key.hex(),
            sign_output_frame(key, 0, 1, b"fine\n")
            + sign_output_frame(other, 1, 1, b"forged\n"))
    finally:
        await client.close()

    assert answers[0] == {"accepted": True}
    assert "signature" in answers[-1]["failed"]
    assert agent.frames == [(1, b"fine\n")]


async def test_a_replayed_frame_out_of_sequence_is_refused(tmp_path: Path) -> None:
    agent = PodAgent()
    client = await _serve(tmp_path, Reconciler(agent))
    key = b"k" * 32
    frame = sign_output_frame(key, 0, 1, b"once\n")
    try:
        answers = await _raw_stream(
            client, lambda header: request_digest("POST", PATH, 42, header) + " " + key.hex(),
            frame + frame)
    finally:
        await client.close()

    assert "signature" in answers[-1]["failed"]
    assert agent.frames == [(1, b"once\n")]


async def test_a_credential_without_a_stream_key_is_refused(tmp_path: Path) -> None:
    agent = PodAgent()
    client = await _serve(tmp_path, Reconciler(agent))
    header = b'{"key": "7"}\n'
    try:
        response = await client.post(PATH, data=header, headers={
            "X-Munge-Credential": request_digest("POST", PATH, 42, header)})
        status, text = response.status, await response.text()
    finally:
        await client.close()

    assert status == 403 and "not made for this request" in text
    assert agent.commands == []


async def test_a_broken_relay_never_ends_the_step_and_the_rest_goes_to_the_job_files(
    relay_program: list[str], tmp_path: Path
) -> None:
    """Only the agent's own "srun is gone" (exit 3) ends a step; an exec that broke off (status
    1, no status) means: carry on, and write the rest where srun's output would go natively."""
    agent = PodAgent(exit_code=1)
    client = await _serve(tmp_path, Reconciler(agent))
    try:
        relayed = await _relay(relay_program, tmp_path, client, "echo first; sleep 1.5; echo second; exit 5")
    finally:
        await client.close()

    assert relayed.code == 5 and not relayed.gone and not relayed.delivered
    assert b"second\n" in relayed.out


async def test_a_second_stream_for_a_step_that_streams_is_refused(tmp_path: Path) -> None:
    script = tmp_path / "unmunge.py"
    script.write_text(UNMUNGE_OK)
    api = Api(Reconciler(PodAgent()), Metrics(), lambda _: None, lambda: True,  # type: ignore[arg-type]
              (sys.executable, str(script)))
    header = b'{"key": "7"}\n'
    with api.step_streams.claim(42, 0, "7"):  # the step's output streams already
        async with TestClient(TestServer(api.app())) as client:
            response = await client.post(PATH, data=header, headers={
                "X-Munge-Credential": request_digest("POST", PATH, 42, header) + " " + "ab" * 32})
            status, text = response.status, await response.text()

    assert status == 409 and "already streams" in text


async def test_a_munge_that_hangs_leaves_the_output_to_the_job_files(
    relay_program: list[str], tmp_path: Path
) -> None:
    hung = tmp_path / "munge"
    hung.write_text("#!/bin/sh\nexec sleep 60\n")
    hung.chmod(0o755)

    # Twice, without pausing, and munge given 1 s: the waiter's 30 tries of 10 s would take long.
    relayed = await run_relay(relay_program, tmp_path, munge=str(hung), quick="1",
                              script="echo still-here; exit 6")

    assert relayed.code == 6 and not relayed.delivered
    assert b"still-here\n" in relayed.out


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def test_an_early_answer_that_came_with_the_acceptance_is_seen(
    relay_program: list[str], tmp_path: Path
) -> None:
    """"accepted" and "gone" in one segment: the second must not hide in a read buffer."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def daemon() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            lines = [b'{"accepted": true}\n', b'{"gone": "the script\'s srun is gone"}\n']
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                         + b"".join(_chunk(line) for line in lines))
            time.sleep(1)

    thread = threading.Thread(target=daemon)
    thread.start()
    try:
        relayed = await run_relay(relay_program, tmp_path, mode="open-then-check",
                                  api=f"http://127.0.0.1:{server.getsockname()[1]}")
    finally:
        thread.join()
        server.close()

    assert relayed.gone


async def test_a_relay_that_ends_with_frames_still_queued_does_not_hold_the_stream(tmp_path: Path) -> None:
    """The script's srun killed while its output is still queued for it: the handler answers, and
    the step's stream slot is free again."""
    class GoneAtTheEnd(PodAgent):
        async def exec_feeding(
            self, pod: str, command: list[str], feed: asyncio.Queue[bytes | None],
            on_output: Callable[[bytes], None] | None = None,
        ) -> int:
            while feed.qsize() < 8:  # full: output and the end, nobody reading
                await asyncio.sleep(0.01)
            return 3

    agent = GoneAtTheEnd()
    script = tmp_path / "unmunge.py"
    script.write_text(UNMUNGE_OK)
    api = Api(Reconciler(agent), Metrics(), lambda _: None, lambda: True,  # type: ignore[arg-type]
              (sys.executable, str(script)))
    key = b"k" * 32
    frames = b"".join(sign_output_frame(key, i, 1, b"line\n") for i in range(7))
    frames += sign_output_frame(key, 7, 0, b"0")
    header = b'{"key": "7"}\n'
    async with TestClient(TestServer(api.app())) as client:
        response = await asyncio.wait_for(client.post(PATH, data=header + frames, headers={
            "X-Munge-Credential": request_digest("POST", PATH, 42, header) + " " + key.hex()}), 10)
        answers = [json.loads(line) for line in (await asyncio.wait_for(response.text(), 10)).splitlines()]

    assert "gone" in answers[-1]
    assert api.step_streams.streaming() == set()
