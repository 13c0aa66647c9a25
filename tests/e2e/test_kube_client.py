"""bridge.clients.kube against the sandbox's real API server, kubelet and containerd.

Each test gets a fresh namespace `bridge-test-<random>` (deleted afterwards) and pins its pods to
a real node (`type=real`), tolerating the bridged-node taint, as the bridge does.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio
from kubernetes_asyncio.client import ApiClient

from bridge.clients.kube import (
    KubeActions,
    KubeForbidden,
    KubeNotFound,
    LogsNotReady,
    PodCache,
    PodWatcher,
    make_api_client,
    server_version,
)
from bridge.clients.kube.lines import rfc3339_to_ns
from bridge.core import wellknown
from tests.e2e.sandbox import Sandbox, wait_until

pytestmark = pytest.mark.shares_the_cluster

SELECTOR = f"{wellknown.LABEL_MANAGED_BY}={wellknown.MANAGER}"


@dataclass
class Kube:
    api: ApiClient
    actions: KubeActions
    namespace: str
    node: str
    notified: list[int] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def manifest(self, name: str, job_id: int, command: str = "sleep 3600", **spec: Any) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "labels": {
                    wellknown.LABEL_MANAGED_BY: wellknown.MANAGER,
                    wellknown.LABEL_JOB_ID: str(job_id),
                },
            },
            "spec": {
                "nodeName": self.node,
                "restartPolicy": "Never",
                "dnsPolicy": "Default",  # the sandbox has no cluster DNS: avoid a Warning event per pod
                "terminationGracePeriodSeconds": 1,
                "tolerations": [
                    {
                        "key": wellknown.TAINT_BRIDGED,
                        "operator": "Exists",
                        "effect": wellknown.TAINT_BRIDGED_EFFECT,
                    }
                ],
                "containers": [
                    {
                        "name": wellknown.CONTAINER_NAME,
                        "image": "sandbox.local/busybox:1",
                        "imagePullPolicy": "IfNotPresent",
                        "command": ["sh", "-c", command],
                    }
                ],
                **spec,
            },
        }

    def watcher(self, cache: PodCache) -> PodWatcher:
        return PodWatcher(self.api, self.namespace, SELECTOR, cache, self.notified.append, backoff=(0.2,))

    def start(self, watcher: PodWatcher) -> asyncio.Task[None]:
        task = asyncio.create_task(watcher.run(), name=f"watch-{self.namespace}")
        self.tasks.append(task)
        return task


@pytest_asyncio.fixture
async def kube(sandbox: Sandbox) -> AsyncIterator[Kube]:
    namespace = f"bridge-test-{uuid.uuid4().hex[:8]}"
    node = sandbox.kubectl_json("get", "nodes", "-l", "type=real")["items"][0]["metadata"]["name"]
    api = await make_api_client(sandbox.kubeconfig)
    kube = Kube(api, KubeActions(api, namespace), namespace, node)
    try:
        assert await kube.actions.ensure_namespace() is True
        # Pods are refused until the namespace's default service account exists.
        wait_until(
            "the default service account",
            lambda: sandbox.kubectl("get", "sa", "default", "-n", namespace, check=False).returncode == 0,
        )
        yield kube
    finally:
        for task in kube.tasks:
            task.cancel()
        await asyncio.gather(*kube.tasks, return_exceptions=True)
        await api.close()
        sandbox.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


async def eventually(what: str, probe: Callable[[], object], timeout: float = 60.0) -> None:
    try:
        async with asyncio.timeout(timeout):
            while not probe():
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}") from None


def phases(cache: PodCache, job_id: int) -> dict[str, str]:
    return {p["metadata"]["name"]: p["status"].get("phase", "") for p in cache.pods_of(job_id)}


def new_job_id() -> int:
    return random.randrange(100_000, 999_999)


@pytest.mark.asyncio
async def test_the_api_server_answers_with_its_version(kube: Kube) -> None:
    assert (await server_version(kube.api)).startswith("v1.")


@pytest.mark.asyncio
async def test_watched_cache_follows_pods_created_and_deleted_without_duplicates(
    kube: Kube, sandbox: Sandbox
) -> None:
    cache = PodCache()
    watcher = kube.watcher(cache)
    kube.start(watcher)
    await asyncio.wait_for(cache.synced.wait(), 30)
    job_id, other_job = new_job_id(), new_job_id()
    names = [f"job-{job_id}-0", f"job-{job_id}-1"]

    created = [await kube.actions.create_pod(kube.manifest(name, job_id)) for name in names]
    again = await kube.actions.create_pod(kube.manifest(names[0], job_id))
    await kube.actions.create_pod(kube.manifest(f"job-{other_job}-0", other_job))

    assert created == [True, True]
    assert again is False
    await eventually("both pods running", lambda: set(phases(cache, job_id).values()) == {"Running"})
    assert sorted(phases(cache, job_id)) == names
    assert cache.job_ids() == {job_id, other_job}
    assert job_id in kube.notified and other_job in kube.notified
    listed = sandbox.kubectl_json("get", "pods", "-n", kube.namespace, "-l", SELECTOR)["items"]
    assert sorted(p["metadata"]["name"] for p in listed) == sorted([*names, f"job-{other_job}-0"])
    assert cache.get(names[0])["spec"]["nodeName"] == kube.node

    notified_before = len(kube.notified)
    assert [await kube.actions.delete_pod(name, grace_seconds=1) for name in names] == [True, True]
    await eventually("the job's pods to leave the cache", lambda: not cache.pods_of(job_id))

    assert cache.job_ids() == {other_job}
    assert job_id in kube.notified[notified_before:]
    assert await kube.actions.delete_pod(names[0]) is False  # already gone: fine
    assert watcher.relists == 1 and watcher.errors == 0
    assert watcher.events >= 6  # 3 ADDED, status updates, 2 DELETED


@pytest.mark.asyncio
async def test_followed_logs_give_every_line_in_order_and_end_when_the_container_exits(kube: Kube) -> None:
    name = f"job-{new_job_id()}-0"
    script = "echo one; sleep 1; echo 'two  spaced'; sleep 1; printf three"  # last line has no newline
    await kube.actions.create_pod(kube.manifest(name, 1, script))

    lines: list[tuple[str, str]] = []
    async with asyncio.timeout(90):
        while True:
            try:
                lines = [line async for line in kube.actions.stream_logs(name)]
                break
            except (LogsNotReady, KubeNotFound):  # a 404 just after the create: not seen yet
                await asyncio.sleep(0.2)

    assert [text for _, text in lines] == ["one", "two  spaced", "three"]
    stamps = [rfc3339_to_ns(stamp) for stamp, _ in lines]
    assert stamps == sorted(stamps) and stamps[2] - stamps[0] >= 1_500_000_000  # really followed, 2 s apart
    resumed = [text async for _, text in kube.actions.stream_logs(name, since_time=lines[0][0])]
    assert resumed == ["two  spaced", "three"]


@pytest.mark.asyncio
async def test_a_relist_reports_what_changed_while_not_watching(kube: Kube, sandbox: Sandbox) -> None:
    kept, removed, added = new_job_id(), new_job_id(), new_job_id()
    for job_id in (kept, removed):
        await kube.actions.create_pod(kube.manifest(f"job-{job_id}-0", job_id))
    cache = PodCache()
    watcher = kube.watcher(cache)
    task = kube.start(watcher)
    await eventually("both jobs cached", lambda: cache.job_ids() == {kept, removed})
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)

    # While nobody watches: one job's pod goes away, another job's pod appears.
    sandbox.kubectl("delete", "pod", f"job-{removed}-0", "-n", kube.namespace, "--grace-period=0", "--force")
    await kube.actions.create_pod(kube.manifest(f"job-{added}-0", added))
    kube.notified.clear()
    changed = await watcher.relist()

    assert {removed, added} <= changed
    assert cache.job_ids() == {kept, added}
    assert set(kube.notified) == changed

    # Watching resumes from the relist's resourceVersion, not from scratch.
    kube.start(watcher)
    late = new_job_id()
    await kube.actions.create_pod(kube.manifest(f"job-{late}-0", late))
    await eventually("the watch to see a new job", lambda: late in cache.job_ids())
    assert watcher.relists == 2


@pytest.mark.asyncio
async def test_a_watch_from_an_ancient_resource_version_still_ends_with_the_right_cache(kube: Kube) -> None:
    # On a long-running cluster the server answers 410 Gone and the watcher lists again; on a young
    # one it may still replay history from there. Either way the cache must end up right.
    job_id = new_job_id()
    await kube.actions.create_pod(kube.manifest(f"job-{job_id}-0", job_id))
    cache = PodCache()
    watcher = kube.watcher(cache)
    watcher.resource_version = "1"

    kube.start(watcher)
    await eventually("the pod", lambda: job_id in cache.job_ids())

    assert job_id in kube.notified
    assert watcher.errors == 0


@pytest.mark.asyncio
async def test_a_pod_the_kubelet_rejects_is_explained_by_its_warning_event(kube: Kube) -> None:
    name = f"job-{new_job_id()}-0"
    too_big = {"requests": {"cpu": "100000"}}
    manifest = kube.manifest(name, 1, "true")
    manifest["spec"]["containers"][0]["resources"] = too_big
    await kube.actions.create_pod(manifest)

    reason: str | None = None
    async with asyncio.timeout(60):
        while reason is None:
            reason = await kube.actions.pod_events_reason(name)
            await asyncio.sleep(0.2)

    assert reason.startswith("OutOfcpu: ")
    assert await kube.actions.pod_events_reason("no-such-pod") is None


@pytest.mark.asyncio
async def test_missing_rbac_permission_is_a_permanent_error_naming_verb_and_namespace(kube: Kube) -> None:
    kube.api.set_default_header("Impersonate-User", "nobody")  # a user with no RBAC grants at all

    with pytest.raises(KubeForbidden) as caught:
        await kube.actions.create_pod(kube.manifest("job-1-0", 1))

    assert f"forbids the bridge to create pods in namespace {kube.namespace}" in str(caught.value)
    assert 'User "nobody" cannot create resource "pods"' in str(caught.value)
    kube.api.default_headers.pop("Impersonate-User")
