"""The Secret verbs against a real HTTP server: an existing Secret is no error, a gone one neither,
and the sweep's list asks for metadata only (a Secret's data never crosses the wire for it), page
by page."""

from __future__ import annotations

from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes_asyncio.client import ApiClient, Configuration

from bridge.clients.kube.actions import KubeActions
from bridge.clients.kube.objects import METADATA_LIST

PATH = "/api/v1/namespaces/jobs/secrets"


async def test_create_delete_and_a_paged_metadata_only_list() -> None:
    seen: list[tuple[str, str, dict[str, str]]] = []
    existing = {"slurm-1"}

    async def secrets(request: web.Request) -> web.Response:
        seen.append((request.method, request.headers.get("Accept", ""), dict(request.query)))
        if request.method == "POST":
            name = (await request.json())["metadata"]["name"]
            if name in existing:
                exists = {"kind": "Status", "reason": "AlreadyExists", "code": 409}
                return web.json_response(exists, status=409)
            existing.add(name)
            return web.json_response({}, status=201)
        if "continue" not in request.query:
            first = {"items": [{"metadata": {"name": "slurm-1"}}], "metadata": {"continue": "t"}}
            return web.json_response(first)
        return web.json_response({"items": [{"metadata": {"name": "slurm-2"}}], "metadata": {}})

    async def one(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in existing:
            return web.json_response({"kind": "Status", "reason": "NotFound", "code": 404}, status=404)
        existing.discard(name)
        return web.json_response({})

    app = web.Application()
    app.router.add_route("*", PATH, secrets)
    app.router.add_delete(PATH + "/{name}", one)
    async with TestServer(app) as server:
        configuration = Configuration(host=str(server.make_url("")).rstrip("/"))
        async with ApiClient(configuration) as api:
            kube = KubeActions(api, "jobs")
            assert await kube.create_secret({"metadata": {"name": "slurm-2"}, "data": {}}) is True
            assert await kube.create_secret({"metadata": {"name": "slurm-1"}, "data": {}}) is False
            listed = await kube.secrets_metadata("a=b")
            assert await kube.delete_secret("slurm-1") is True
            assert await kube.delete_secret("slurm-1") is False

    assert [m["name"] for m in listed] == ["slurm-1", "slurm-2"]
    lists = [(accept, query) for method, accept, query in seen if method == "GET"]
    assert [accept for accept, _ in lists] == [METADATA_LIST, METADATA_LIST]
    assert lists[0][1]["labelSelector"] == "a=b" and lists[1][1]["continue"] == "t"
