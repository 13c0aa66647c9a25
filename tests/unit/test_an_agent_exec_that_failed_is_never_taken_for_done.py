"""`exec_in_pod` runs the agent (`signal`, `step-done`) and used to return what it printed,
whatever its exit status: an agent that could not signal (a torn pid file, a runtime that failed
the exec, reported only on the status channel) looked exactly like a signal sent, and the daemon
dropped a batch signal it had never delivered. The status channel now decides."""

from __future__ import annotations

import json

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes_asyncio.client import ApiClient, Configuration

from bridge.clients.kube.actions import KubeActions
from bridge.core.errors import ExecCommandFailed, ExecOutcomeUnknown

SUCCESS = json.dumps({"metadata": {}, "status": "Success"}).encode()
EXIT_2 = json.dumps({
    "metadata": {}, "status": "Failure", "message": "command terminated with non-zero exit code",
    "reason": "NonZeroExitCode", "details": {"causes": [{"reason": "ExitCode", "message": "2"}]},
}).encode()
RUNTIME_FAILED = json.dumps({
    "metadata": {}, "status": "Failure", "reason": "InternalError",
    "message": "OCI runtime exec failed: exec failed: unable to start container process",
}).encode()


def _kubelet(frames: list[bytes]) -> web.RequestHandler:
    """An exec endpoint that upgrades, sends these v4 channel frames and closes."""
    async def handler(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(protocols=("v4.channel.k8s.io",))
        await ws.prepare(request)
        for frame in frames:
            await ws.send_bytes(frame)
        await ws.close()
        return ws
    return handler


async def _exec(frames: list[bytes]) -> str | BaseException:
    app = web.Application()
    app.router.add_route("*", "/api/v1/namespaces/jobs/pods/{name}/exec", _kubelet(frames))
    async with TestServer(app) as server:
        configuration = Configuration(host=str(server.make_url("")).rstrip("/"))
        async with ApiClient(configuration) as api_client:
            try:
                actions = KubeActions(api_client, "jobs")
                return await actions.exec_in_pod("pod-0", ["agent", "signal", "f", "10"])
            except Exception as error:  # the outcome under test
                return error


@pytest.mark.asyncio
async def test_an_agent_that_exited_0_returns_what_it_printed() -> None:
    assert await _exec([b"\x01ok\n", b"\x03" + SUCCESS]) == "ok\n"


@pytest.mark.asyncio
async def test_an_agent_that_exited_non_zero_raises_with_its_code_and_output() -> None:
    printed = b"slurm-k8s-bridge-agent: bad pid file /slurm-k8s-bridge-bin/script.pid\n"
    outcome = await _exec([b"\x02" + printed, b"\x03" + EXIT_2])

    assert isinstance(outcome, ExecCommandFailed)
    assert outcome.code == 2 and outcome.ran
    assert "bad pid file" in outcome.output and "bad pid file" in str(outcome)


@pytest.mark.asyncio
async def test_a_command_the_runtime_could_not_start_raises_with_the_runtimes_message() -> None:
    outcome = await _exec([b"\x03" + RUNTIME_FAILED])

    assert isinstance(outcome, ExecCommandFailed)
    assert outcome.code == 1 and outcome.output == "" and not outcome.ran
    assert "OCI runtime exec failed" in str(outcome)


@pytest.mark.asyncio
async def test_an_exec_closed_without_a_status_is_of_unknown_outcome() -> None:
    outcome = await _exec([b"\x01half"])

    assert isinstance(outcome, ExecOutcomeUnknown)


@pytest.mark.asyncio
async def test_what_a_replaced_agent_prints_is_kept_only_up_to_a_limit() -> None:
    flood = [b"\x01" + b"y" * 60000] * 10
    outcome = await _exec([*flood, b"\x03" + SUCCESS])

    assert isinstance(outcome, str) and len(outcome) <= 2 * 65536
