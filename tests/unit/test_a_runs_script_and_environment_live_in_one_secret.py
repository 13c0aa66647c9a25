"""Issue 11: a job's script and the environment its user exported live in one Secret, not in its
pods, named by its content: the tasks of an array share one (one write for the array). It is made
before the pods (they mount it), once per daemon; one Kubernetes refuses fails the job with the
reason; and the leader's sweep removes those no pod and no session names any more."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from bridge.clients.kube.cache import PodCache
from bridge.clients.kube.errors import KubeForbidden, KubeInvalid, KubeRejected
from bridge.controller import payload_secrets as payload_secrets_module
from bridge.controller.sessions import SessionRegistry
from bridge.core.errors import PermanentError, TemporaryError

from .builders import allocation, payload
from .test_reconcile_acts_on_both_views import _attach, _pod, _see
from .test_reconcile_acts_on_both_views import world as world  # the fixture

ANNOTATION = "slurm-k8s-bridge/payload-secret"


def _task(reconciler: Any, index: int) -> None:
    """Task `index` of array 100 running, its waiter attached (same script, same exported
    environment as every other task)."""
    job_id = 100 + index
    _see(reconciler, allocation(job_id=job_id, array_job_id=100, array_task_id=index))
    task_payload = payload(environment={"HOME": "/home/alice", "SLURM_JOB_ID": str(job_id),
                                        "SLURM_ARRAY_TASK_ID": str(index)})
    reconciler.attach_session(job_id, task_payload).payload = task_payload


async def test_the_secret_comes_before_the_pods(world: Any) -> None:
    reconciler, kube, _slurm, _cache, _ = world
    created_before: list[bool] = []
    create_pod = kube.create_pod

    async def recording_create_pod(manifest: dict[str, Any]) -> bool:
        secret = manifest["metadata"]["annotations"][ANNOTATION]
        created_before.append(secret in kube.__dict__.get("secrets", {}))
        return await create_pod(manifest)

    kube.create_pod = recording_create_pod
    _see(reconciler, allocation())
    _attach(reconciler)
    await reconciler.reconcile(42)
    assert created_before == [True, True], "a pod was created before the Secret it mounts"


async def test_the_tasks_of_an_array_make_one_secret_with_one_request(world: Any) -> None:
    reconciler, kube, *_ = world
    requests: list[str] = []
    create_secret = kube.create_secret

    async def counting_create_secret(manifest: dict[str, Any]) -> bool:
        requests.append(manifest["metadata"]["name"])
        return await create_secret(manifest)

    kube.create_secret = counting_create_secret
    for index in range(5):
        _task(reconciler, index)
        await reconciler.reconcile(100 + index)

    assert len(kube.created) == 10 and len(requests) == 1 and list(kube.secrets) == requests
    assert {m["metadata"]["annotations"][ANNOTATION] for m in kube.created} == set(requests)


async def test_a_secret_kubernetes_refuses_fails_the_job_with_the_reason(world: Any) -> None:
    reconciler, kube, slurm, _cache, _ = world

    async def refuse(manifest: dict[str, Any]) -> bool:
        raise KubeInvalid("create secrets: HTTP 422: admission webhook denied the request: no tokens",
                          status=422, reason="Invalid", what="create secrets")

    kube.create_secret = refuse
    _see(reconciler, allocation())
    queue = _attach(reconciler)
    await reconciler.reconcile(42)

    assert kube.created == [], "no pod without its Secret"
    event = queue.get_nowait()
    assert event["type"] == "exit" and event["code"] != 0
    assert "no tokens" in event["reason"] and "no tokens" in slurm.comments[42]


def _stamp(delta: timedelta) -> str:
    return (datetime.now(UTC) + delta).strftime("%Y-%m-%dT%H:%M:%SZ")


async def test_the_sweep_removes_only_old_secrets_no_pod_or_session_names(world: Any) -> None:
    reconciler, kube, _slurm, cache, _ = world
    _see(reconciler, allocation())
    _attach(reconciler)
    await reconciler.reconcile(42)  # job 42: a session, and pods once the watch shows them
    (live,) = kube.secrets
    for manifest in kube.created:
        cache.apply("ADDED", _pod(manifest, phase="Running"))
    labels = dict(kube.secrets[live]["metadata"]["labels"])
    kube.secrets[live]["metadata"]["creationTimestamp"] = _stamp(-timedelta(hours=1))
    for name, age in (("slurm-payload-old", timedelta(hours=1)), ("slurm-payload-young", timedelta(0))):
        kube.secrets[name] = {"metadata": {"name": name, "creationTimestamp": _stamp(-age), "labels": labels}}

    assert await reconciler.sweep_payload_secrets("selector") == 1
    assert sorted(kube.secrets) == sorted([live, "slurm-payload-young"])

    # The run ends: its pods go, then its session.
    _see(reconciler, replace(allocation(), state="COMPLETED"))
    await reconciler.reconcile(42)
    assert await reconciler.sweep_payload_secrets("selector") == 0, "its pods still name it"
    for manifest in kube.created:
        cache.apply("DELETED", _pod(manifest))
    await reconciler.reconcile(42)
    assert reconciler.sessions.of_job(42) == []
    assert await reconciler.sweep_payload_secrets("selector") == 1
    assert sorted(kube.secrets) == ["slurm-payload-young"]


async def test_a_job_after_the_sweep_makes_its_secret_again(world: Any) -> None:
    reconciler, kube, *_ = world
    _task(reconciler, 0)
    await reconciler.reconcile(100)
    (name,) = kube.secrets
    kube.secrets[name]["metadata"]["creationTimestamp"] = _stamp(-timedelta(hours=1))
    for session in list(reconciler.sessions):
        reconciler.sessions.end(session, {"type": "exit", "code": 0})
    assert await reconciler.sweep_payload_secrets("selector") == 1 and kube.secrets == {}

    _task(reconciler, 1)  # the array's next task starts later
    await reconciler.reconcile(101)
    assert list(kube.secrets) == [name], "its pods would not start without it"


async def test_tasks_that_start_together_send_one_request(world: Any) -> None:
    """A burst: every task misses the 'made a moment ago' check at once; the first makes the
    Secret, the others, queued on its lock, find it made and send nothing."""
    reconciler, kube, *_ = world
    requests: list[str] = []
    create_secret = kube.create_secret

    async def slow_create_secret(manifest: dict[str, Any]) -> bool:
        requests.append(manifest["metadata"]["name"])
        await asyncio.sleep(0.05)
        return await create_secret(manifest)

    kube.create_secret = slow_create_secret
    for index in range(8):
        _task(reconciler, index)
    await asyncio.gather(*(reconciler.reconcile(100 + index) for index in range(8)))

    assert len(requests) == 1 and len(kube.created) == 16


async def test_a_secret_deleted_behind_the_daemons_back_is_made_again(
    world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    reconciler, kube, *_ = world
    monkeypatch.setattr(payload_secrets_module, "SECRET_KNOWN_S", 0.0)
    _task(reconciler, 0)
    await reconciler.reconcile(100)
    kube.secrets.clear()  # kubectl delete secret ...

    _task(reconciler, 1)
    await reconciler.reconcile(101)
    assert len(kube.secrets) == 1, "the next task's pods would never start"


async def test_cached_pods_alone_keep_their_secret(world: Any) -> None:
    """A new leader: no sessions until the waiters attach again, but the watch has the pods."""
    reconciler, kube, _slurm, cache, _ = world
    _task(reconciler, 0)
    await reconciler.reconcile(100)
    (name,) = kube.secrets
    kube.secrets[name]["metadata"]["creationTimestamp"] = _stamp(-timedelta(hours=1))
    for manifest in kube.created:
        cache.apply("ADDED", _pod(manifest, phase="Pending"))
    for session in list(reconciler.sessions):
        reconciler.sessions.end(session, {"type": "exit", "code": 0})

    assert await reconciler.sweep_payload_secrets("selector") == 0 and name in kube.secrets


async def test_a_pod_kubernetes_refuses_fails_the_job_with_the_reason(world: Any) -> None:
    reconciler, kube, slurm, _cache, _ = world

    async def refuse(manifest: dict[str, Any]) -> bool:
        raise KubeRejected("create pods: HTTP 413: request entity too large", status=413,
                           reason="RequestEntityTooLarge", what="create pods")

    kube.create_pod = refuse
    _see(reconciler, allocation())
    queue = _attach(reconciler)
    await reconciler.reconcile(42)

    event = queue.get_nowait()
    assert event["type"] == "exit" and event["code"] != 0 and "too large" in event["reason"]
    assert "too large" in slurm.comments[42]


async def test_the_bridges_own_credentials_refused_fail_no_job(world: Any) -> None:
    """A 401 is the bridge's token (being renewed, say), not the job: the job waits, retried."""
    reconciler, kube, *_ = world

    async def unauthorized(manifest: dict[str, Any]) -> bool:
        raise KubeForbidden("Kubernetes rejected the bridge's credentials", status=401,
                            reason="Unauthorized", what="create pods")

    kube.create_pod = unauthorized
    _see(reconciler, allocation())
    queue = _attach(reconciler)
    with pytest.raises(TemporaryError) as raised:  # the work queue tries it again with backoff
        await reconciler.reconcile(42)
    assert not isinstance(raised.value, PermanentError), "a permanent error is never tried again"
    assert isinstance(raised.value.__cause__, KubeForbidden)
    assert queue.empty(), "the job was ended for the bridge's own credentials"


async def test_a_secret_a_job_came_for_while_the_sweep_ran_is_kept() -> None:
    """The sweep decides from one listing; a job whose run names a listed Secret may come while
    the sweep deletes another (it awaits Kubernetes). Asked again under that Secret's lock, the
    sweep keeps it: else the job's pods would mount a Secret that is gone."""
    sessions = SessionRegistry()
    old = _stamp(-timedelta(hours=1))

    class Kube:
        def __init__(self) -> None:
            self.secrets = {name: {"name": name, "uid": f"uid-{name}", "creationTimestamp": old}
                            for name in ("slurm-payload-first", "slurm-payload-second")}

        async def secrets_metadata(self, _selector: str) -> list[dict[str, Any]]:
            return list(self.secrets.values())

        async def delete_secret(self, name: str, uid: str | None = None) -> bool:
            del self.secrets[name]
            if name == "slurm-payload-first":  # meanwhile a job starts whose run names the second
                sessions.open(43, 0).payload_secret = "slurm-payload-second"
            return True

    kube = Kube()
    secrets = payload_secrets_module.PayloadSecrets(kube, PodCache(), sessions)  # type: ignore[arg-type]

    assert await secrets.sweep("selector") == 1
    assert list(kube.secrets) == ["slurm-payload-second"]
