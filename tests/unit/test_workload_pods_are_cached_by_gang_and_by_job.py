"""The cache of managed namespaces' pods (bridge.clients.kube.workload_pods): only those namespaces'
pods, indexed by gang and by Slurm job, and every change names both keys (so that a pod deleted by its
owner wakes its job)."""

from __future__ import annotations

from typing import Any

from bridge.clients.kube.workload_pods import WorkloadPodCache


def pod(name: str, namespace: str = "team-alice", job: str | None = None) -> dict[str, Any]:
    annotations = {"slurm-k8s-bridge/slurm-job-id": job} if job else {}
    return {"metadata": {"name": name, "namespace": namespace, "uid": f"u-{name}",
                         "annotations": annotations,
                         "ownerReferences": [
                             {"kind": "Job", "name": "train", "uid": "j1", "controller": True}]},
            "spec": {"schedulerName": "slurm-k8s-bridge", "containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Pending"}}


def test_pods_are_indexed_by_gang_and_job_and_changes_name_both() -> None:
    cache = WorkloadPodCache(["team-alice"], "slurm-jobs")
    listed = cache.replace_all([cache.trim(pod("a")), cache.trim(pod("b")),
                                cache.trim(pod("x", namespace="slurm-jobs")),
                                cache.trim(pod("y", "elsewhere"))])
    assert listed == {"team-alice/job/j1"}
    assert sorted(p.name for p in cache.gang("team-alice/job/j1")) == ["a", "b"]
    assert len(cache) == 2  # the job namespace's and unmanaged namespaces' pods are not ours
    assert cache.apply("MODIFIED", pod("a", job="42")) == {"team-alice/job/j1", 42}
    assert [p.name for p in cache.of_job(42)] == ["a"] and cache.job_ids() == {42}
    # Deleted: gone from both indexes, and its job hears of it.
    assert cache.apply("DELETED", pod("a", job="42")) == {"team-alice/job/j1", 42}
    assert cache.of_job(42) == [] and cache.job_ids() == set()
    assert [p.name for p in cache.gang("team-alice/job/j1")] == ["b"]
    cache.apply("DELETED", pod("b"))
    assert cache.gangs() == set() and len(cache) == 0
