"""PodCache: pods by name and by Slurm job id, trimmed; diffs after a relist; deletes."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from bridge.clients.kube.cache import PodCache, trim_pod
from bridge.core import wellknown
from bridge.core.pod_view import pod_view

JOB = wellknown.LABEL_JOB_ID


def pod(
    name: str, job_id: int | str | None, phase: str = "Pending", rv: str = "1", **extra: Any
) -> dict[str, Any]:
    """A pod as the API server sends it: full of fields the cache should not keep."""
    labels = {wellknown.LABEL_MANAGED_BY: wellknown.MANAGER}
    if job_id is not None:
        labels[JOB] = str(job_id)
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": "slurm",
            "uid": f"uid-{name}",
            "resourceVersion": rv,
            "creationTimestamp": "2024-05-01T12:00:00Z",
            "labels": labels,
            "annotations": {
                wellknown.ANNOTATION_NODE_INDEX: "0",
                wellknown.ANNOTATION_SCRIPT: "#!/bin/sh\n" + "echo big\n" * 10_000,
            },
            "managedFields": [{"manager": "bridge", "fieldsV1": {"f:spec": {}}}],
            "ownerReferences": [],
        },
        "spec": {
            "nodeName": "kreal1",
            "containers": [{"name": "job", "image": "busybox", "env": [{"name": "X", "value": "y"}]}],
            "volumes": [{"name": "v", "emptyDir": {}}],
            "tolerations": [{"key": "k", "operator": "Exists"}],
        },
        "status": {
            "phase": phase,
            "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [{"name": "job", "ready": False, "restartCount": 0}],
            "podIP": "10.0.0.1",
            "hostIP": "192.168.0.1",
            "qosClass": "BestEffort",
            "startTime": "2024-05-01T12:00:01Z",
        },
        **extra,
    }


@pytest.mark.parametrize("event", ["ADDED", "MODIFIED"])
def test_added_or_modified_pods_are_indexed_by_their_job_id(event: str) -> None:
    cache = PodCache()

    touched = cache.apply(event, pod("j7-0", 7))
    cache.apply(event, pod("j7-1", 7))
    cache.apply(event, pod("j8-0", 8))

    assert touched == {7}
    assert [p["metadata"]["name"] for p in cache.pods_of(7)] == ["j7-0", "j7-1"]
    assert cache.job_ids() == {7, 8}
    assert len(cache) == 3
    assert cache.get("j8-0") is cache.pods_of(8)[0]


def test_a_job_without_pods_has_an_empty_list() -> None:
    assert PodCache().pods_of(1) == []


def test_modified_replaces_the_stored_pod() -> None:
    cache = PodCache()
    cache.apply("ADDED", pod("a", 1, "Pending", rv="1"))

    cache.apply("MODIFIED", pod("a", 1, "Running", rv="2"))

    assert cache.get("a")["status"]["phase"] == "Running"
    assert cache.get("a")["metadata"]["resourceVersion"] == "2"
    assert len(cache) == 1


def test_deleted_pods_leave_the_cache_and_their_job_index() -> None:
    cache = PodCache()
    cache.apply("ADDED", pod("a", 1))
    cache.apply("ADDED", pod("b", 1))

    assert cache.apply("DELETED", pod("a", 1)) == {1}
    assert [p["metadata"]["name"] for p in cache.pods_of(1)] == ["b"]
    assert cache.apply("DELETED", pod("b", 1)) == {1}
    assert cache.job_ids() == set()
    assert cache.get("b") is None
    assert "b" not in cache
    assert len(cache) == 0


def test_deleting_a_pod_never_seen_still_names_its_job() -> None:
    cache = PodCache()

    assert cache.apply("DELETED", pod("ghost", 5)) == {5}
    assert len(cache) == 0


def test_bookmark_and_unknown_events_change_nothing() -> None:
    cache = PodCache()
    cache.apply("ADDED", pod("a", 1))

    assert cache.apply("BOOKMARK", {"metadata": {"resourceVersion": "9"}}) == set()
    assert cache.apply("ERROR", {"code": 410}) == set()
    assert len(cache) == 1


def test_pods_without_a_usable_job_label_are_cached_but_not_indexed() -> None:
    cache = PodCache()

    assert cache.apply("ADDED", pod("nolabel", None)) == set()
    assert cache.apply("ADDED", pod("garbage", "not-a-number")) == set()
    assert len(cache) == 2
    assert cache.job_ids() == set()


def test_a_pod_whose_job_label_changes_moves_to_the_new_job() -> None:
    cache = PodCache()
    cache.apply("ADDED", pod("a", 1))

    assert cache.apply("MODIFIED", pod("a", 2)) == {1, 2}
    assert cache.pods_of(1) == []
    assert [p["metadata"]["name"] for p in cache.pods_of(2)] == ["a"]


def test_the_job_label_key_is_a_parameter() -> None:
    cache = PodCache(job_label="example.org/job")
    p = pod("a", None)
    p["metadata"]["labels"]["example.org/job"] = "3"

    cache.apply("ADDED", p)

    assert cache.job_ids() == {3}


def test_trimming_keeps_what_reconcile_reads_and_drops_the_rest() -> None:
    full = pod("a", 1, "Running")
    full["metadata"]["deletionTimestamp"] = "2024-05-01T13:00:00Z"
    original = copy.deepcopy(full)

    trimmed = trim_pod(full)

    assert full == original, "trimming must not modify its input"
    assert set(trimmed) == {"metadata", "spec", "status"}
    assert set(trimmed["metadata"]) == {
        "name", "namespace", "uid", "resourceVersion", "creationTimestamp", "deletionTimestamp",
        "labels", "annotations",
    }
    assert trimmed["metadata"]["annotations"] == {wellknown.ANNOTATION_NODE_INDEX: "0"}
    assert trimmed["spec"] == {"nodeName": "kreal1"}
    # podIP: the first pod's address, which the others' host alias names (core.rendezvous).
    assert set(trimmed["status"]) == {"phase", "conditions", "containerStatuses", "startTime", "podIP"}


def test_a_cached_pod_reads_as_the_pod_itself() -> None:
    """The typed view of a cached (trimmed) pod is the view of the pod the API server sent: an agent
    init container that cannot start (its image unpullable) fails the job at once, and a pod's age
    counts from its start, not from its creation."""
    full = pod("a", 1, "Pending")
    full["status"]["startTime"] = "2024-05-01T12:05:00Z"
    full["status"]["initContainerStatuses"] = [{
        "name": wellknown.INIT_CONTAINER_NAME,
        "state": {"waiting": {"reason": "ErrImagePull", "message": "pull access denied"}},
    }]

    view, uncached = pod_view(trim_pod(full)), pod_view(full)

    assert (view.init_failure, view.since) == (uncached.init_failure, uncached.since)
    assert "ErrImagePull" in view.init_failure
    assert view.since is not None and view.since.minute == 5


def test_the_cache_stores_trimmed_pods() -> None:
    cache = PodCache()
    cache.apply("ADDED", pod("a", 1))

    stored = cache.get("a")

    assert stored == trim_pod(pod("a", 1))
    assert "managedFields" not in stored["metadata"]
    assert len(repr(stored)) < 1_000 < len(repr(pod("a", 1)))


def test_dropped_annotations_are_a_parameter() -> None:
    cache = PodCache(drop_annotations=())

    cache.apply("ADDED", pod("a", 1))

    assert wellknown.ANNOTATION_SCRIPT in cache.get("a")["metadata"]["annotations"]


def test_replace_all_reports_jobs_whose_pods_appeared_vanished_or_changed() -> None:
    cache = PodCache()
    for p in (pod("same", 1), pod("changes", 2, rv="1"), pod("vanishes", 3), pod("stays-with-4", 4)):
        cache.apply("ADDED", p)

    changed = cache.replace_all(
        [pod("same", 1), pod("changes", 2, "Running", rv="2"), pod("stays-with-4", 4), pod("appears", 5)]
    )

    assert changed == {2, 3, 5}
    assert cache.job_ids() == {1, 2, 4, 5}
    assert cache.get("vanishes") is None
    assert cache.get("changes")["status"]["phase"] == "Running"
    assert len(cache) == 4


def test_replace_all_of_an_identical_list_changes_nothing() -> None:
    cache = PodCache()
    pods = [pod(f"p{i}", i // 2) for i in range(10)]
    cache.replace_all(pods)

    assert cache.replace_all(copy.deepcopy(pods)) == set()


def test_replace_all_with_nothing_empties_the_cache() -> None:
    cache = PodCache()
    cache.replace_all([pod("a", 1), pod("b", 2)])

    assert cache.replace_all([]) == {1, 2}
    assert len(cache) == 0
    assert cache.job_ids() == set()


def test_synced_is_set_by_the_first_full_list_only() -> None:
    cache = PodCache()
    cache.apply("ADDED", pod("a", 1))
    assert not cache.synced.is_set()

    cache.replace_all([])

    assert cache.synced.is_set()


def test_ten_thousand_jobs_stay_small_and_fast_to_index() -> None:
    cache = PodCache()

    changed = cache.replace_all(pod(f"job-{i}-{n}", i) for i in range(10_000) for n in range(2))

    assert len(changed) == 10_000
    assert len(cache) == 20_000
    assert len(cache.pods_of(9_999)) == 2
