"""Issue 11: a run's script and shared environment live in one Secret, not in its pods. The Secret
is made before the pods (they mount it), goes when the run's pods go, a requeued run has its own,
one Kubernetes refuses fails the job with the reason, and the leader's sweep removes only the
Secrets no run needs (a daemon stopped between a run's end and the deletion leaves one)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from bridge.clients.kube.errors import KubeInvalid

from .builders import allocation, payload
from .test_reconcile_acts_on_both_views import _attach, _pod, _see
from .test_reconcile_acts_on_both_views import world as world


async def test_the_secret_comes_before_the_pods_and_goes_with_them(world: Any) -> None:
    reconciler, kube, _slurm, cache, _ = world
    created_before: list[bool] = []
    create_pod = kube.create_pod

    async def recording_create_pod(manifest: dict[str, Any]) -> bool:
        secret = manifest["metadata"]["annotations"]["slurm-k8s-bridge/payload-secret"]
        created_before.append(secret in kube.__dict__.get("secrets", {}))
        return await create_pod(manifest)

    kube.create_pod = recording_create_pod
    _see(reconciler, allocation())
    _attach(reconciler)
    await reconciler.reconcile(42)
    assert created_before == [True, True], "a pod was created before the Secret it mounts"
    for manifest in kube.created:
        cache.apply("ADDED", _pod(manifest, phase="Running"))

    (secret,) = kube.secrets
    assert secret.startswith("slurm-42-")
    _see(reconciler, replace(allocation(), state="COMPLETED"))
    await reconciler.reconcile(42)
    assert kube.secrets == {}, "the run is over and its pods are going: the Secret goes"
    for manifest in kube.created:
        cache.apply("DELETED", _pod(manifest))
    await reconciler.reconcile(42)
    assert kube.secrets_deleted == [secret], "deleted once"


async def test_a_requeued_run_gets_a_secret_of_its_own(world: Any) -> None:
    reconciler, kube, _slurm, cache, _ = world
    _see(reconciler, allocation())
    _attach(reconciler)
    await reconciler.reconcile(42)
    (first,) = kube.secrets
    for manifest in kube.created:
        cache.apply("ADDED", _pod(manifest, phase="Running"))
    _see(reconciler, replace(allocation(), run=1))  # requeued: run 0 is over, run 1 runs
    await reconciler.reconcile(42)
    for manifest in list(kube.created):
        cache.apply("DELETED", _pod(manifest))
    rerun = payload(environment={"HOME": "/home/alice", "SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": "1"})
    reconciler.attach_session(42, rerun).payload = rerun
    await reconciler.reconcile(42)
    (second,) = kube.secrets
    assert second.startswith("slurm-42-r1-")
    assert kube.secrets_deleted == [first]


async def test_a_secret_kubernetes_refuses_fails_the_job_with_the_reason(world: Any) -> None:
    reconciler, kube, slurm, _cache, _ = world

    async def refuse(manifest: dict[str, Any]) -> bool:
        raise KubeInvalid("create secrets: HTTP 422: Secret \"slurm-42\" is invalid: data: Too long",
                          status=422, reason="Invalid", what="create secrets")

    kube.create_secret = refuse
    _see(reconciler, allocation())
    queue = _attach(reconciler)
    await reconciler.reconcile(42)

    assert kube.created == [], "no pod without its Secret"
    event = queue.get_nowait()
    assert event["type"] == "exit" and event["code"] != 0
    assert "Too long" in event["reason"] and "Too long" in slurm.comments[42]


async def test_the_sweep_removes_old_secrets_no_run_needs_and_nothing_else(world: Any) -> None:
    reconciler, kube, _slurm, cache, _ = world
    _see(reconciler, allocation())
    _attach(reconciler)
    await reconciler.reconcile(42)  # job 42 run 0: a session and pods
    for manifest in kube.created:
        cache.apply("ADDED", _pod(manifest, phase="Running"))
    old = (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    young = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    (live,) = kube.secrets
    labels = dict(kube.secrets[live]["metadata"]["labels"])
    kube.secrets[live]["metadata"]["creationTimestamp"] = old
    for name, job, stamp in (("slurm-7-a", "7", old), ("slurm-8-a", "8", young), ("slurm-9-a", "9", old)):
        kube.secrets[name] = {"metadata": {"name": name, "creationTimestamp": stamp,
                                           "labels": {**labels, "slurm-k8s-bridge/job-id": job}}}
    # Job 9 is running in Slurm with no session and no pods yet (a waiter not attached again
    # after a takeover): its Secret stays.
    _see(reconciler, replace(allocation(), job_id=9))

    removed = await reconciler.sweep_payload_secrets("selector")

    assert removed == 1 and sorted(kube.secrets) == sorted([live, "slurm-8-a", "slurm-9-a"])
    reconciler.sessions.end(reconciler.sessions.of_job(42)[0], {"type": "exit", "code": 0})
    _see(reconciler, replace(allocation(), state="COMPLETED"))
    assert await reconciler.sweep_payload_secrets("selector") == 0, "its pods still need it"
    for manifest in kube.created:
        cache.apply("DELETED", _pod(manifest))
    assert await reconciler.sweep_payload_secrets("selector") == 1
    assert sorted(kube.secrets) == ["slurm-8-a", "slurm-9-a"]
