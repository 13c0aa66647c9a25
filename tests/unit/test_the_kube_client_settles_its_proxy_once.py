"""The kube client reads HTTPS_PROXY/HTTP_PROXY, NO_PROXY and ~/.netrc once, when it is made, and
not before every request (kubernetes_asyncio's session did, in a worker thread, twice a request).

Against small aiohttp servers: an API server, and a plain HTTP proxy that answers in its place.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp.client
import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestServer

from bridge.clients.kube import make_api_client
from bridge.clients.kube.actions import KubeActions
from bridge.clients.kube.client import request_json
from bridge.core.errors import BridgeError, KubeUnavailable

PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy",
                   "ALL_PROXY", "all_proxy", "NETRC")


def write_kubeconfig(path: Path, server: str) -> str:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "secret-token"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    }))
    return str(path)


class Seen:
    def __init__(self) -> None:
        self.requests: list[tuple[str, str | None, str | None]] = []
        """(the request line's target, Authorization, Proxy-Authorization)."""

    async def answer(self, request: web.Request) -> web.Response:
        headers = request.headers
        login, proxy_login = headers.get("Authorization"), headers.get("Proxy-Authorization")
        self.requests.append((request.raw_path, login, proxy_login))
        return web.json_response({"kind": "PodList", "items": []})


@pytest_asyncio.fixture
async def server() -> AsyncIterator[tuple[TestServer, Seen]]:
    seen = Seen()
    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", seen.answer)
    running = TestServer(app)
    await running.start_server()
    yield running, seen
    await running.close()


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc of the machine's


async def list_pods_three_times(kubeconfig: str) -> None:
    api = await make_api_client(kubeconfig)
    try:
        for _ in range(3):
            await request_json(api, "GET", "/api/v1/namespaces/slurm/pods", "list pods")
    finally:
        await api.close()


async def test_no_request_looks_up_the_proxy_or_netrc_again(
    server: tuple[TestServer, Seen], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    running, seen = server
    lookups: list[object] = []
    real = aiohttp.client.get_env_proxy_for_url
    monkeypatch.setattr(aiohttp.client, "get_env_proxy_for_url", lambda url: lookups.append(url) or real(url))
    monkeypatch.setattr(aiohttp.ClientSession, "_get_netrc_auth", lambda self, host: lookups.append(host))

    await list_pods_three_times(write_kubeconfig(tmp_path / "kubeconfig", str(running.make_url(""))))

    assert len(seen.requests) == 3
    assert lookups == [], "the session looked the environment up per request"


async def test_a_netrc_login_for_the_api_server_no_longer_breaks_its_bearer_token(
    server: tuple[TestServer, Seen], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the environment trusted per request, a ~/.netrc entry for the API server's host became
    Basic auth beside the bearer token, and aiohttp refused every request (ValueError)."""
    running, seen = server
    netrc = tmp_path / ".netrc"
    netrc.write_text(f"machine {running.host} login someone password other\n")
    netrc.chmod(0o600)

    await list_pods_three_times(write_kubeconfig(tmp_path / "kubeconfig", str(running.make_url(""))))

    assert [auth for _, auth, _ in seen.requests] == ["Bearer secret-token"] * 3


class RefusingConnectProxy:
    """An HTTP proxy that answers each CONNECT with 407, keeping what it was sent."""

    def __init__(self) -> None:
        self.connects: list[dict[str, str]] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        request_line, *lines = head.strip().split("\r\n")
        headers = dict(line.split(": ", 1) for line in lines)
        self.connects.append({"request": request_line, **headers})
        writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()


async def test_the_environments_proxy_gets_its_login_on_connect_and_no_error_shows_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    proxy = RefusingConnectProxy()
    listening = await asyncio.start_server(proxy.serve, "127.0.0.1", 0)
    port = listening.sockets[0].getsockname()[1]
    monkeypatch.setenv("HTTPS_PROXY", f"http://squid:s3cr%40t@127.0.0.1:{port}")
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", "https://api.example.invalid:6443")
    api = await make_api_client(kubeconfig)
    try:
        for _ in range(2):
            with pytest.raises(KubeUnavailable) as refused:
                await request_json(api, "GET", "/api/v1/namespaces/slurm/pods", "list pods")
            assert "s3cr" not in str(refused.value) and "squid" not in str(refused.value), refused.value
    finally:
        await api.close()
        listening.close()

    expected_login = "Basic " + base64.b64encode(b"squid:s3cr@t").decode()
    assert [c["request"] for c in proxy.connects] == ["CONNECT api.example.invalid:6443 HTTP/1.1"] * 2
    assert [c.get("Proxy-Authorization") for c in proxy.connects] == [expected_login] * 2


async def test_no_proxy_naming_the_api_server_goes_to_it_directly(
    server: tuple[TestServer, Seen], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    running, seen = server
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # the discard port: nothing answers there
    monkeypatch.setenv("NO_PROXY", running.host)

    await list_pods_three_times(write_kubeconfig(tmp_path / "kubeconfig", str(running.make_url(""))))

    assert [target for target, _, _ in seen.requests] == ["/api/v1/namespaces/slurm/pods"] * 3


async def test_an_exec_with_a_netrc_login_for_the_api_server_fails_as_the_bridge_says_not_as_aiohttp(
    tmp_path: Path,
) -> None:
    """An exec (a websocket of its own client) refused by the server is a BridgeError; with the
    environment trusted, the netrc login clashed with the token first: a ValueError no caller
    catches."""
    async def refuse_exec(_request: web.Request) -> web.Response:
        return web.Response(status=500, text="container not running")

    app = web.Application()
    app.router.add_route("*", "/api/v1/namespaces/ns/pods/p/exec", refuse_exec)
    async with TestServer(app) as running:
        netrc = tmp_path / ".netrc"
        netrc.write_text(f"machine {running.host} login someone password other\n")
        netrc.chmod(0o600)
        api = await make_api_client(write_kubeconfig(tmp_path / "kubeconfig", str(running.make_url(""))))
        try:
            with pytest.raises(BridgeError):
                await KubeActions(api, "ns").exec_in_pod("p", ["true"])
        finally:
            await api.close()
