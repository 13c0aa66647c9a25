"""Issue 11, items 1 and 2: followed logs (one per running pod, for as long as it runs) use a
client of their own with no pool cap, so past the control pool's size they neither wait for a
slot and time out (losing the job's output) nor hold up the watch, the creates and the deletes;
and the daemon lifts its soft open-files limit to the hard one at start."""

from __future__ import annotations

import asyncio
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bridge.clients.kube import pod_logs as logs_module
from bridge.clients.kube.actions import KubeActions
from bridge.clients.kube.client import make_api_client
from bridge.manager import daemon

REPO = Path(__file__).resolve().parents[2]


async def test_followed_logs_go_through_the_stream_client(monkeypatch: pytest.MonkeyPatch) -> None:
    control, streams = object(), object()
    used: list[Any] = []

    async def request(api: Any, method: str, path: str, what: str, **_kwargs: Any) -> Any:
        used.append((api, path))
        raise logs_module.KubeInvalid("not started", status=400, reason="BadRequest", what=what)

    monkeypatch.setattr(logs_module, "request", request)
    kube = KubeActions(control, "jobs", streams=streams)  # type: ignore[arg-type]
    with pytest.raises(logs_module.LogsNotReady):
        async for _ in kube.stream_logs("slurm-1-0"):
            pass

    assert used == [(streams, "/api/v1/namespaces/jobs/pods/slurm-1-0/log")]


async def test_a_client_of_zero_connections_has_no_pool_cap(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "current-context: x\n")
    client = await make_api_client(str(kubeconfig), max_connections=0)
    try:
        assert client.rest_client.pool_manager.connector.limit == 0  # aiohttp: no limit
    finally:
        await client.close()


def test_the_daemon_lifts_its_soft_open_files_limit_to_the_hard_one() -> None:
    code = (
        "import resource\n"
        "from bridge.manager.process_health import raise_open_files_limit\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
        "print(*raise_open_files_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=REPO, timeout=60).stdout.split()
    soft, hard, now = (int(word) for word in out)

    assert soft == now
    assert soft == (daemon.OPEN_FILES_WANTED if hard == resource.RLIM_INFINITY else hard)


async def test_at_most_a_few_log_streams_are_being_opened_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A thousand relays starting (or resuming) together must not bury the API server."""
    opening = peak = 0

    async def request(api: Any, method: str, path: str, what: str, **_kwargs: Any) -> Any:
        nonlocal opening, peak
        opening += 1
        peak = max(peak, opening)
        await asyncio.sleep(0.01)
        opening -= 1
        raise logs_module.KubeInvalid("not started", status=400, reason="BadRequest", what=what)

    async def read(kube: KubeActions, name: str) -> None:
        with pytest.raises(logs_module.LogsNotReady):
            async for _ in kube.stream_logs(name):
                pass

    monkeypatch.setattr(logs_module, "request", request)
    kube = KubeActions(object(), "jobs", streams=object())  # type: ignore[arg-type]
    await asyncio.gather(*(read(kube, f"slurm-{i}-0") for i in range(200)))

    assert peak == logs_module.STREAM_OPENS_AT_ONCE
