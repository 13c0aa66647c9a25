"""Under load, a kubelet may refuse a task's exec before its websocket opens (CI saw `500,
message='Invalid response status'` for the second pod of a `-N 2` job whose container was still
starting). Such an exec ran nothing, so the daemon tries it again; an exec that failed after it
opened may have run the task, so it is never run twice."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes_asyncio.client import ApiClient, Configuration

from bridge.clients.kube.actions import KubeActions
from bridge.controller import tasks as tasks_module
from bridge.core.errors import ExecNotStarted, KubeUnavailable

from .test_a_signal_before_its_task_runs_is_kept_for_it import _post, _served

TASK = {"key": "7", "node": "kube1", "env": {"SLURM_PROCID": "0"}}


class FlakyKubelet:
    """Refuses the first `refusals` execs before they open, then runs the task, or breaks it
    off after its first output when `break_after_output`."""

    def __init__(self, refusals: int, *, break_after_output: bool = False) -> None:
        self.refusals = refusals
        self.break_after_output = break_after_output
        self.attempts = 0

    async def exec_in_pod(self, pod: str, command: list[str]) -> str:
        return ""

    async def exec_stream(
        self, pod: str, command: list[str], terminal: object = None, stdin: object = None,
        feed: object = None,
    ) -> AsyncIterator[tuple[int, bytes]]:
        self.attempts += 1
        if self.attempts <= self.refusals:
            raise ExecNotStarted(f"cannot exec in pod {pod}: 500, message='Invalid response status'")
        yield 1, b"task ran\n"
        if self.break_after_output:
            raise KubeUnavailable(f"cannot exec in pod {pod}: connection reset")
        yield 0, b"0"


def _lines(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines()]


@pytest.fixture(autouse=True)
def _quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tasks_module, "TASK_START_FIRST_RETRY_S", 0.01)


async def test_an_exec_refused_before_it_opened_is_tried_again_and_the_task_runs_once(tmp_path: Path) -> None:
    kubelet = FlakyKubelet(refusals=3)
    async with await _served(tmp_path, kubelet) as client:  # type: ignore[arg-type]
        status, text = await _post(client, "/v1/jobs/42/task", TASK)

    assert status == 200, text
    assert kubelet.attempts == 4
    lines = _lines(text)
    assert [line for line in lines if "data" in line] == [{"fd": 1, "data": "dGFzayByYW4K"}]
    assert lines[-1] == {"exit": 0}


async def test_an_exec_that_broke_after_it_opened_is_not_run_again(tmp_path: Path) -> None:
    kubelet = FlakyKubelet(refusals=0, break_after_output=True)
    async with await _served(tmp_path, kubelet) as client:  # type: ignore[arg-type]
        status, text = await _post(client, "/v1/jobs/42/task", TASK)

    assert status == 200, text
    assert kubelet.attempts == 1
    lines = _lines(text)
    assert lines[-1] == {"exit": 1}
    assert any(line.get("fd") == 2 for line in lines), lines


async def test_refusals_past_the_deadline_end_the_task_with_the_reason_on_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tasks_module, "TASK_START_DEADLINE_S", 0.2)
    kubelet = FlakyKubelet(refusals=10_000)
    async with await _served(tmp_path, kubelet) as client:  # type: ignore[arg-type]
        status, text = await _post(client, "/v1/jobs/42/task", TASK)

    assert status == 200, text
    assert 2 <= kubelet.attempts < 100
    lines = _lines(text)
    assert lines[-1] == {"exit": 1}
    errors = [line for line in lines if line.get("fd") == 2]
    assert len(errors) == 1, lines


async def _exec_against(handler: web.RequestHandler) -> tuple[type[BaseException], list[tuple[int, bytes]]]:
    app = web.Application()
    app.router.add_route("*", "/api/v1/namespaces/jobs/pods/{name}/exec", handler)
    yielded: list[tuple[int, bytes]] = []
    async with TestServer(app) as server:
        configuration = Configuration(host=str(server.make_url("")).rstrip("/"))
        async with ApiClient(configuration) as api_client:
            actions = KubeActions(api_client, "jobs")
            try:
                async for item in actions.exec_stream("pod-0", ["true"]):
                    yielded.append(item)
            except KubeUnavailable as error:
                return type(error), yielded
    return type(None), yielded


async def test_the_exec_says_not_started_for_a_refused_upgrade_only() -> None:
    async def refuse(_request: web.Request) -> web.Response:
        return web.Response(status=500, text="container not found")

    async def open_then_drop(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(protocols=("v4.channel.k8s.io",))
        await ws.prepare(request)
        await ws.send_bytes(b"\x01started\n")
        assert request.transport is not None
        request.transport.abort()
        return ws

    refused, nothing = await _exec_against(refuse)
    dropped, output = await _exec_against(open_then_drop)

    assert refused is ExecNotStarted and nothing == []
    assert output[:1] == [(1, b"started\n")]
    assert dropped is not ExecNotStarted


def test_only_errors_that_prove_the_command_never_ran_count_as_not_started() -> None:
    """A timeout or a dropped connection during the upgrade may come after the kubelet started
    the command (running it again would run the task twice); 401/403/404 cannot get better."""
    import aiohttp
    from aiohttp.client_reqrep import ConnectionKey
    from kubernetes_asyncio.client.exceptions import ApiException

    from bridge.clients.kube.pod_exec import _refused_before_running

    def handshake(status: int) -> aiohttp.WSServerHandshakeError:
        return aiohttp.WSServerHandshakeError(None, (), status=status)  # type: ignore[arg-type]

    key = ConnectionKey("127.0.0.1", 6443, True, None, None, None, None)
    assert _refused_before_running(handshake(500))
    assert _refused_before_running(handshake(400))
    assert _refused_before_running(ApiException(status=503))
    assert _refused_before_running(aiohttp.ClientConnectorError(key, OSError(111, "refused")))
    assert not _refused_before_running(handshake(403))
    assert not _refused_before_running(ApiException(status=404))
    assert not _refused_before_running(TimeoutError())
    assert not _refused_before_running(aiohttp.ServerDisconnectedError())


async def test_a_task_whose_step_ended_while_its_exec_was_refused_stops_waiting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """srun gave up on the step (it ended, or was cancelled): its task must not go on asking for
    a pod exec until the deadline."""
    waits: list[float] = []

    async def no_wait(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) > 20:  # the deadline is a minute of real time away; fail, do not hang
            raise AssertionError("still waiting for a step that has ended")

    monkeypatch.setattr(tasks_module, "_sleep", no_wait)
    steps = OneStep()
    kubelet = FlakyKubelet(refusals=10_000)
    exec_stream = kubelet.exec_stream

    def closing_on_the_second_refusal(
        pod: str, command: list[str], terminal: object = None, stdin: object = None,
        feed: object = None,
    ) -> AsyncIterator[tuple[int, bytes]]:
        if kubelet.attempts == 1:
            steps.open = False
        return exec_stream(pod, command)

    kubelet.exec_stream = closing_on_the_second_refusal  # type: ignore[method-assign]

    async def write(_fd: int, _data: bytes) -> None:
        pass

    with pytest.raises(ExecNotStarted):
        await tasks_module.Tasks(kubelet, steps).run(  # type: ignore[arg-type]
            (42, "7", "0"), "slurm-42-0", ["agent", "task"], write)

    assert kubelet.attempts == 2
    assert len(waits) == 1


class OneStep:
    """Step 7 of job 42, open until `open` is cleared."""

    def __init__(self) -> None:
        self.open = True

    def step_of(self, job_id: int, key: str) -> dict[str, object] | None:
        return {"argv": [], "env": {}, "cwd": "/"} if self.open and (job_id, key) == (42, "7") else None


def _status_then_close(*frames: bytes) -> web.RequestHandler:
    async def handler(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(protocols=("v4.channel.k8s.io",))
        await ws.prepare(request)
        for frame in frames:
            await ws.send_bytes(frame)
        await ws.close()
        return ws
    return handler


NO_PROGRAM = json.dumps({
    "status": "Failure", "reason": "InternalError",
    "message": 'Internal error occurred: error executing command in container: failed to exec in container: '
               'failed to start exec "x": OCI runtime exec failed: exec failed: unable to start container '
               'process: exec: "/slurm-k8s-bridge-bin/slurm-k8s-bridge-agent": stat '
               '/slurm-k8s-bridge-bin/slurm-k8s-bridge-agent: no such file or directory: unknown',
}).encode()
EXIT_1 = json.dumps({"status": "Failure", "reason": "NonZeroExitCode", "message": "command terminated",
                     "details": {"causes": [{"reason": "ExitCode", "message": "1"}]}}).encode()


async def test_an_exec_whose_program_is_not_there_yet_ran_nothing_and_is_tried_again() -> None:
    """Issue 22: with the agent from the node, a pod's copy appears just after its container
    starts; an exec before that finds no program (the runtime's status, no exit code)."""
    missing, nothing = await _exec_against(_status_then_close(b"\x03" + NO_PROGRAM))
    exited, _ = await _exec_against(_status_then_close(b"\x03" + EXIT_1))
    ran, output = await _exec_against(_status_then_close(b"\x01ran\n", b"\x03" + NO_PROGRAM))

    assert missing is ExecNotStarted and nothing == []
    assert exited is type(None)
    assert ran is type(None) and output == [(1, b"ran\n"), (0, b"1")]
