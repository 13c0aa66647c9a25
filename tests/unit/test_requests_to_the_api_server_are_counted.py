"""The benchmark's `apiserver_requests_per_s` comes from the daemon's own count of the requests it
sent, by verb, on /metrics: every REST call, watch and log stream (through `request`) and every
exec (a websocket upgrade of its own)."""

from __future__ import annotations

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes_asyncio.client import ApiClient, Configuration

from bridge.clients.kube import client as kube_client
from bridge.clients.kube.actions import KubeActions
from bridge.controller.metrics import Metrics
from bridge.core.errors import BridgeError


async def test_each_request_and_exec_counts_once_by_verb_and_shows_in_the_metrics() -> None:
    async def pod(_request: web.Request) -> web.Response:
        return web.json_response({"metadata": {"name": "p"}})

    async def refuse_exec(_request: web.Request) -> web.Response:
        return web.Response(status=500, text="container not running")

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/ns/pods/p", pod)
    app.router.add_route("*", "/api/v1/namespaces/ns/pods/p/exec", refuse_exec)
    before = dict(kube_client.REQUESTS_SENT)
    metrics = Metrics()
    metrics.counters_from("kube_requests_total", "Requests.", "verb", lambda: dict(kube_client.REQUESTS_SENT))
    async with TestServer(app) as server:
        configuration = Configuration(host=str(server.make_url("")).rstrip("/"))
        async with ApiClient(configuration) as api:
            for _ in range(3):
                await kube_client.request_json(api, "GET", "/api/v1/namespaces/ns/pods/p", "get pod p")
            actions = KubeActions(api, "ns")
            with pytest.raises(BridgeError):  # refused: still one upgrade sent
                await actions.exec_in_pod("p", ["true"])

    sent = {verb: kube_client.REQUESTS_SENT[verb] - before.get(verb, 0) for verb in ("GET", "EXEC")}
    assert sent == {"GET": 3, "EXEC": 1}
    rendered = metrics.render()
    line = f'slurm_k8s_bridge_kube_requests_total{{verb="GET"}} {float(kube_client.REQUESTS_SENT["GET"])}'
    assert line in rendered.splitlines()
