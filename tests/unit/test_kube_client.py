"""The kube client against a small fake API server: exact control of chunks, 410s, 5xx and 403s.

The fake speaks just enough of the pods API (paged list, watch as NDJSON, log, create, delete) to
drive each path of PodWatcher and KubeActions deterministically; tests/e2e/test_kube_client.py
runs the same code against the real API server.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes_asyncio.client import ApiClient

from bridge.clients.kube import (
    KubeActions,
    KubeConfigError,
    KubeForbidden,
    LogsNotReady,
    PodCache,
    PodWatcher,
    make_api_client,
)
from bridge.clients.kube.lines import MAX_LINE
from bridge.core import wellknown
from bridge.core.errors import KubeUnavailable

NS = "slurm"
SELECTOR = f"{wellknown.LABEL_MANAGED_BY}={wellknown.MANAGER}"


def pod(name: str, job_id: int, rv: str, phase: str = "Pending") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name, "namespace": NS, "resourceVersion": rv,
            "labels": {wellknown.LABEL_MANAGED_BY: wellknown.MANAGER, wellknown.LABEL_JOB_ID: str(job_id)},
        },
        "spec": {"nodeName": "n1"},
        "status": {"phase": phase},
    }


def event(kind: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode() + b"\n"


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason,
            "message": message}


Stream = list[bytes] | web.Response
"""What the fake answers to one watch or log request: chunks to stream (then EOF), or a response."""


@dataclass
class FakeApi:
    pods: list[dict[str, Any]] = field(default_factory=list)
    list_rv: str = "100"
    list_answers: list[web.Response] = field(default_factory=list)
    """Served (and consumed) before the normal paged list."""
    later: list[tuple[list[dict[str, Any]], str]] = field(default_factory=list)
    """(pods, list_rv) the server moves to after each complete list, one step per list."""
    watches: list[Stream] = field(default_factory=list)
    """One entry per watch request; when exhausted, a watch hangs until the client goes away."""
    logs: list[Stream] = field(default_factory=list)
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    bodies: list[Any] = field(default_factory=list)
    existing: set[str] = field(default_factory=set)
    watch_hanging: asyncio.Event = field(default_factory=asyncio.Event)
    stall_logs: bool = False
    """After a log step's chunks, keep the connection open and silent (a half-open stream)."""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get(f"/api/v1/namespaces/{NS}/pods", self.list_or_watch)
        app.router.add_post(f"/api/v1/namespaces/{NS}/pods", self.create)
        app.router.add_delete(f"/api/v1/namespaces/{NS}/pods/{{name}}", self.delete)
        app.router.add_get(f"/api/v1/namespaces/{NS}/pods/{{name}}/log", self.log)
        return app

    def seen(self, request: web.Request) -> None:
        self.requests.append((request.method, request.path, dict(request.query)))

    def calls(self, kind: str) -> list[dict[str, str]]:
        """Query strings of the list ("list") or watch ("watch") requests, in order."""
        return [
            q for m, p, q in self.requests
            if m == "GET" and p.endswith("/pods") and (q.get("watch") == "true") == (kind == "watch")
        ]

    async def list_or_watch(self, request: web.Request) -> web.StreamResponse:
        self.seen(request)
        if request.query.get("watch") == "true":
            return await self.stream(request, self.watches, hang=True)
        if self.list_answers:
            return self.list_answers.pop(0)
        limit = int(request.query.get("limit", "1000000"))
        start = int(request.query.get("continue", "0"))
        page = self.pods[start : start + limit]
        meta = {"resourceVersion": self.list_rv}
        if start + limit < len(self.pods):
            meta["continue"] = str(start + limit)
        elif self.later:
            self.pods, self.list_rv = self.later.pop(0)
        return web.json_response({"kind": "PodList", "metadata": meta, "items": page})

    async def log(self, request: web.Request) -> web.StreamResponse:
        self.seen(request)
        return await self.stream(request, self.logs, hang=False, stall=self.stall_logs)

    async def stream(
        self, request: web.Request, script: list[Stream], hang: bool, stall: bool = False
    ) -> web.StreamResponse:
        if not script:
            if not hang:
                return web.Response(text="")
            response = web.StreamResponse()
            await response.prepare(request)
            self.watch_hanging.set()
            while request.transport is not None and not request.transport.is_closing():
                await asyncio.sleep(0.02)  # until the client goes away
            return response
        step = script.pop(0)
        if isinstance(step, web.Response):
            return step
        response = web.StreamResponse()
        await response.prepare(request)
        for chunk in step:
            await response.write(chunk)
            await asyncio.sleep(0.005)  # separate TCP writes: the client sees the cuts
        while stall and request.transport is not None and not request.transport.is_closing():
            await asyncio.sleep(0.02)
        await response.write_eof()
        return response

    async def create(self, request: web.Request) -> web.Response:
        self.seen(request)
        body = await request.json()
        self.bodies.append(body)
        name = body["metadata"]["name"]
        if name in self.existing:
            exists = status(409, "AlreadyExists", f'pods "{name}" already exists')
            return web.json_response(exists, status=409)
        if name == "forbidden":
            message = f'pods is forbidden: User "bridge" cannot create resource "pods" in namespace "{NS}"'
            return web.json_response(status(403, "Forbidden", message), status=403)
        self.existing.add(name)
        return web.json_response(body, status=201)

    async def delete(self, request: web.Request) -> web.Response:
        self.seen(request)
        self.bodies.append(await request.json())
        name = request.match_info["name"]
        if name not in self.existing:
            return web.json_response(status(404, "NotFound", f'pods "{name}" not found'), status=404)
        self.existing.discard(name)
        return web.json_response({"metadata": {"name": name}})


@pytest.fixture
def fake() -> FakeApi:
    return FakeApi()


def write_kubeconfig(path: Path, server: str) -> str:
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": "bridge", "user": {"token": "secret-token"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "bridge"}}],
    }
    path.write_text(json.dumps(config))
    return str(path)


@pytest_asyncio.fixture
async def api(fake: FakeApi, tmp_path: Path) -> AsyncIterator[ApiClient]:
    server = TestServer(fake.app())
    await server.start_server()
    client = await make_api_client(write_kubeconfig(tmp_path / "kubeconfig", str(server.make_url(""))))
    try:
        yield client
    finally:
        await client.close()
        await server.close()


class Recorder:
    def __init__(self) -> None:
        self.jobs: list[int] = []

    def __call__(self, job_id: int) -> None:
        self.jobs.append(job_id)


def watcher(api: ApiClient, cache: PodCache, notify: Callable[[int], None], **kwargs: Any) -> PodWatcher:
    kwargs.setdefault("backoff", (0.01,))
    return PodWatcher(api, NS, SELECTOR, cache, notify, **kwargs)


async def until(what: str, probe: Callable[[], object], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not probe():
            await asyncio.sleep(0.01)


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# -- watcher -----------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_paged_list_fills_the_cache_then_watch_events_notify_their_jobs(
    api: ApiClient, fake: FakeApi
) -> None:
    fake.pods = [pod("a", 1, "90"), pod("b", 1, "91"), pod("c", 2, "92")]
    stream = b"".join([
        event("ADDED", pod("d", 3, "101")),
        event("MODIFIED", pod("a", 1, "102", "Running")),
        event("DELETED", pod("c", 2, "103")),
        event("BOOKMARK", {"kind": "Pod", "metadata": {"resourceVersion": "150"}}),
    ])
    fake.watches = [[stream[:7], stream[7:130], stream[130:131], stream[131:]]]  # cuts inside lines
    cache, seen = PodCache(), Recorder()
    w = watcher(api, cache, seen, page_size=2)

    task = asyncio.create_task(w.run())
    await until("second watch", fake.watch_hanging.is_set)
    await stop(task)

    assert seen.jobs == [1, 2, 3, 1, 2]  # list (sorted), then one per event
    assert {n: p["status"]["phase"] for n, p in ((p["metadata"]["name"], p) for p in cache.pods_of(1))} == {
        "a": "Running", "b": "Pending",
    }
    assert cache.job_ids() == {1, 3}
    assert [q.get("continue") for q in fake.calls("list")] == [None, "2"]
    assert {q["limit"] for q in fake.calls("list")} == {"2"}
    watches = fake.calls("watch")
    assert [q["resourceVersion"] for q in watches] == ["100", "150"]  # resumed after the bookmark
    assert watches[0]["allowWatchBookmarks"] == "true"
    assert watches[0]["labelSelector"] == SELECTOR
    assert w.counters() == {"events": 3, "relists": 1, "errors": 0, "bookmarks": 1}
    assert cache.synced.is_set()


@pytest.mark.asyncio
async def test_an_expired_watch_lists_again_and_notifies_only_what_changed(
    api: ApiClient, fake: FakeApi
) -> None:
    fake.pods = [pod("a", 1, "90"), pod("b", 2, "91")]
    expired = status(410, "Expired", "too old resource version: 100 (200)")
    fake.watches = [[event("ERROR", expired)]]
    fake.later = [([pod("a", 1, "90"), pod("c", 3, "201")], "210")]  # b vanishes, c appears
    cache, seen = PodCache(), Recorder()
    w = watcher(api, cache, seen)

    task = asyncio.create_task(w.run())
    await until("the relist and its watch", fake.watch_hanging.is_set)
    await stop(task)

    assert seen.jobs == [1, 2, 2, 3]
    assert cache.job_ids() == {1, 3}
    assert [q["resourceVersion"] for q in fake.calls("watch")] == ["100", "210"]
    assert (w.relists, w.errors) == (2, 0)


@pytest.mark.asyncio
async def test_an_http_410_answer_to_the_watch_also_relists(api: ApiClient, fake: FakeApi) -> None:
    fake.watches = [web.json_response(status(410, "Gone", "too old"), status=410)]
    w = watcher(api, PodCache(), Recorder())

    task = asyncio.create_task(w.run())
    await until("the relist and its watch", fake.watch_hanging.is_set)
    await stop(task)

    assert (w.relists, w.errors) == (2, 0)


@pytest.mark.asyncio
async def test_server_errors_back_off_and_resume_from_the_last_resource_version(
    api: ApiClient, fake: FakeApi
) -> None:
    fake.watches = [
        [event("ADDED", pod("a", 1, "101"))],
        web.json_response(status(500, "InternalError", "etcd is sad"), status=500),
        [b'{"type": "ADDED", "obj'],  # garbled, then cut
        web.json_response(status(429, "TooManyRequests", "slow down"), status=429),
    ]
    fake.list_answers = [web.json_response(status(503, "ServiceUnavailable", "starting"), status=503)]
    w = watcher(api, PodCache(), Recorder())
    failing_seen: list[bool] = []
    pause = w._pause

    async def recording_pause(failures: int, error: Exception) -> int:
        failures = await pause(failures, error)
        failing_seen.append(w.failing)
        return failures

    w._pause = recording_pause  # type: ignore[method-assign]
    task = asyncio.create_task(w.run())
    await until("the watch after the errors", fake.watch_hanging.is_set)
    assert not w.failing, "a watch answered again is current"
    await stop(task)
    assert failing_seen == [True, True, True, True], "failing while it waits to try again"

    assert [q["resourceVersion"] for q in fake.calls("watch")] == ["100", "101", "101", "101", "101"]
    assert (w.relists, w.errors, w.events) == (1, 4, 1)


@pytest.mark.asyncio
async def test_watches_that_end_at_once_are_retried_with_backoff_not_in_a_tight_loop(
    api: ApiClient, fake: FakeApi
) -> None:
    fake.watches = [[], [], []]
    w = watcher(api, PodCache(), Recorder())

    task = asyncio.create_task(w.run())
    await until("the fourth watch", fake.watch_hanging.is_set)
    await stop(task)

    assert (w.relists, w.errors) == (1, 3)


@pytest.mark.asyncio
async def test_a_forbidden_list_stops_the_watcher_with_a_clear_permanent_error(
    api: ApiClient, fake: FakeApi
) -> None:
    message = f'pods is forbidden: User "bridge" cannot list resource "pods" in namespace "{NS}"'
    fake.list_answers = [web.json_response(status(403, "Forbidden", message), status=403)]

    with pytest.raises(KubeForbidden) as caught:
        await asyncio.wait_for(watcher(api, PodCache(), Recorder()).run(), 5)

    assert f"list pods in namespace {NS}" in str(caught.value)
    assert message in str(caught.value)
    assert caught.value.status == 403


@pytest.mark.asyncio
async def test_an_unreachable_server_is_temporary_and_the_watcher_keeps_trying(tmp_path: Path) -> None:
    server = TestServer(web.Application())
    await server.start_server()
    url = str(server.make_url(""))
    await server.close()  # nothing listens there any more
    api = await make_api_client(write_kubeconfig(tmp_path / "kubeconfig", url))
    try:
        with pytest.raises(KubeUnavailable):
            await KubeActions(api, NS).delete_pod("x")
        w = watcher(api, PodCache(), Recorder())
        task = asyncio.create_task(w.run())
        await until("a few failed attempts", lambda: w.errors >= 3)
        await stop(task)
    finally:
        await api.close()


# -- configuration -----------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_missing_kubeconfig_is_a_permanent_config_error(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match="nowhere"):
        await make_api_client(str(tmp_path / "nowhere"))


@pytest.mark.asyncio
async def test_in_cluster_config_outside_a_cluster_is_a_permanent_config_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)

    with pytest.raises(KubeConfigError, match="in-cluster"):
        await make_api_client(None)


# -- actions -----------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_create_reports_already_existing_pods_as_not_created(api: ApiClient, fake: FakeApi) -> None:
    actions = KubeActions(api, NS)
    manifest = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {}}

    assert await actions.create_pod(manifest) is True
    assert await actions.create_pod(manifest) is False
    assert fake.bodies[0] == manifest


@pytest.mark.asyncio
async def test_create_forbidden_names_the_verb_and_namespace(api: ApiClient) -> None:
    with pytest.raises(KubeForbidden, match=f"forbids the bridge to create pods in namespace {NS}"):
        await KubeActions(api, NS).create_pod({"metadata": {"name": "forbidden"}})


@pytest.mark.asyncio
async def test_delete_of_a_missing_pod_is_not_an_error(api: ApiClient, fake: FakeApi) -> None:
    fake.existing = {"p"}
    actions = KubeActions(api, NS)

    assert await actions.delete_pod("p", grace_seconds=5, uid="u1") is True
    assert await actions.delete_pod("p") is False
    assert fake.bodies[0] == {
        "apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background",
        "gracePeriodSeconds": 5, "preconditions": {"uid": "u1"},
    }


@pytest.mark.asyncio
async def test_log_lines_come_whole_in_order_including_an_unterminated_last_one(
    api: ApiClient, fake: FakeApi
) -> None:
    text = (
        "2024-05-01T12:00:00.100000000Z one\n"
        "2024-05-01T12:00:00.200000000Z two has  spaces\n"
        "2024-05-01T12:00:01.000000000Z caf\u00e9"
    ).encode()
    cut = text.index("\u00e9".encode()) + 1  # inside the two-byte é
    fake.logs = [[text[:20], text[20:60], text[60:cut], text[cut:]]]

    lines = [line async for line in KubeActions(api, NS).stream_logs("p")]

    assert lines == [
        ("2024-05-01T12:00:00.100000000Z", "one"),
        ("2024-05-01T12:00:00.200000000Z", "two has  spaces"),
        ("2024-05-01T12:00:01.000000000Z", "caf\u00e9"),
    ]
    query = fake.requests[-1][2]
    assert query == {"container": wellknown.CONTAINER_NAME, "follow": "true", "timestamps": "true"}


@pytest.mark.asyncio
async def test_resuming_logs_skips_lines_up_to_the_last_one_seen(api: ApiClient, fake: FakeApi) -> None:
    fake.logs = [[
        b"2024-05-01T12:00:00.1Z old\n2024-05-01T12:00:00.2Z seen\n2024-05-01T12:00:00.25Z new\n"
        b"2024-05-01T12:00:03Z newer\n"
    ]]

    stream = KubeActions(api, NS).stream_logs("p", since_time="2024-05-01T12:00:00.2Z")
    lines = [text async for _, text in stream]

    assert lines == ["new", "newer"]
    assert fake.requests[-1][2]["sinceTime"] == "2024-05-01T12:00:00Z"


@pytest.mark.asyncio
async def test_the_kubelets_error_written_into_a_begun_log_body_is_never_relayed_as_output(
    api: ApiClient, fake: FakeApi
) -> None:
    # The kubelet answers 200 and then, the container gone (a cancelled job's pod), appends its
    # error to the body: the parity suite found it at the end of a job's -o file.
    fake.logs = [[
        b"2024-05-01T12:00:00.1Z cleaned-up\n",
        b"unable to retrieve container logs for containerd://2eb762025ec5c17b8e1ead0e9483\n",
    ]]
    seen: list[str] = []

    with pytest.raises(KubeUnavailable, match="unable to retrieve container logs"):
        async for _, text in KubeActions(api, NS).stream_logs("p"):
            seen.append(text)

    assert seen == ["cleaned-up"]


@pytest.mark.asyncio
async def test_a_line_longer_than_a_piece_comes_whole_in_pieces_and_the_next_lines_follow(
    api: ApiClient, fake: FakeApi
) -> None:
    # The kubelet joins a long line's partial entries: one stamp, then megabytes (a progress bar
    # redrawn with \r, a JSON dump); the client hands it out in MAX_LINE pieces.
    long_text = "x" * (MAX_LINE * 2 + 5)
    body = f"2024-05-01T12:00:00.1Z {long_text}\n2024-05-01T12:00:00.2Z after\n".encode()
    fake.logs = [[body[i:i + 65536] for i in range(0, len(body), 65536)]]

    lines = [line async for line in KubeActions(api, NS).stream_logs("p")]

    assert "".join(text for stamp, text in lines[:-1]) == long_text
    assert {stamp for stamp, _ in lines[:-1]} == {"2024-05-01T12:00:00.1Z"}
    assert lines[-1] == ("2024-05-01T12:00:00.2Z", "after")


@pytest.mark.asyncio
async def test_logs_of_a_container_not_started_yet_are_a_temporary_error(
    api: ApiClient, fake: FakeApi
) -> None:
    message = 'container "job" in pod "p" is waiting to start: ContainerCreating'
    fake.logs = [web.json_response(status(400, "BadRequest", message), status=400)]

    with pytest.raises(LogsNotReady, match="waiting to start"):
        async for _ in KubeActions(api, NS).stream_logs("p"):
            pass


@pytest.mark.asyncio
async def test_a_log_stream_that_goes_silent_is_broken_off_at_the_read_deadline(
    api: ApiClient, fake: FakeApi
) -> None:
    fake.logs = [[b"2024-05-01T12:00:00.1Z one\n"]]
    fake.stall_logs = True
    seen: list[str] = []

    with pytest.raises(KubeUnavailable, match="stream broke"):
        async with asyncio.timeout(5):  # without a read deadline this would hang for ever
            async for _, text in KubeActions(api, NS, log_read_timeout_s=0.3).stream_logs("p"):
                seen.append(text)

    assert seen == ["one"]
