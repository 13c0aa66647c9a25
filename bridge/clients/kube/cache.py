"""In-memory copy of the bridge's pods, indexed by Slurm job id; fed by the watcher, read by reconcile.

Pods are kept as trimmed raw dicts (only what reconcile and users need), so memory stays bounded:
about 1-2 KB per pod instead of 5-10 KB for a full pod, and no script copies. Pure: no I/O, no
clock; the watcher calls `replace_all` after each list and `apply` for each watch event.

The dicts handed out are the cache's own: treat them as read-only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Iterable
from collections.abc import Set as AbstractSet
from datetime import datetime
from typing import Any, Final

from bridge.core import wellknown

KEEP_METADATA: Final = (
    "name", "namespace", "uid", "resourceVersion", "creationTimestamp", "deletionTimestamp",
    "labels", "annotations",
)
KEEP_SPEC: Final = ("nodeName",)
KEEP_STATUS: Final = (
    "phase", "reason", "message", "conditions", "containerStatuses", "initContainerStatuses", "startTime",
    "podIP",
)

DROP_ANNOTATIONS: Final = frozenset(
    {wellknown.ANNOTATION_SCRIPT, "kubectl.kubernetes.io/last-applied-configuration"}
)
"""Annotations not cached: large, and not needed once the pod exists (the script can be 100s of KB)."""


def trim_pod(pod: dict[str, Any], drop_annotations: AbstractSet[str] = DROP_ANNOTATIONS) -> dict[str, Any]:
    """A copy of `pod` with only the fields the bridge reads (see KEEP_*), minus `drop_annotations`."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    trimmed_meta = {key: meta[key] for key in KEEP_METADATA if key in meta}
    annotations = trimmed_meta.get("annotations")
    if annotations and drop_annotations and not drop_annotations.isdisjoint(annotations):
        trimmed_meta["annotations"] = {k: v for k, v in annotations.items() if k not in drop_annotations}
    return {
        "metadata": trimmed_meta,
        "spec": {key: spec[key] for key in KEEP_SPEC if key in spec},
        "status": {key: status[key] for key in KEEP_STATUS if key in status},
    }


class PodCache:
    """The bridge's pods in one namespace, by name and by Slurm job id (label `job_label`)."""

    def __init__(
        self,
        job_label: str = wellknown.LABEL_JOB_ID,
        drop_annotations: Collection[str] = DROP_ANNOTATIONS,
    ) -> None:
        self.job_label = job_label
        self._drop = frozenset(drop_annotations)
        self._pods: dict[str, dict[str, Any]] = {}
        self._job_of: dict[str, int] = {}
        self._by_job: dict[int, set[str]] = {}
        self.synced = asyncio.Event()
        """Set once the first full list is in: before that, "no pods" means "not known yet"."""
        self.trouble_at: datetime | None = None
        """When the API server last failed the watch that fills this cache (set by the watcher):
        the kubelets could not reach it either, and their start errors of then may pass."""
        self._on_seen: list[Callable[[str], None]] = []

    def on_seen(self, listener: Callable[[str], None]) -> None:
        """Call `listener(pod name)` whenever the cache stores a pod (event or list); it must be
        quick and must not raise. Create expectations are satisfied this way."""
        self._on_seen.append(listener)

    # -- reads --------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._pods)

    def __contains__(self, name: object) -> bool:
        return name in self._pods

    def get(self, name: str) -> dict[str, Any] | None:
        return self._pods.get(name)

    def pods_of(self, job_id: int) -> list[dict[str, Any]]:
        """The cached pods labelled with `job_id`, sorted by name."""
        return [self._pods[name] for name in sorted(self._by_job.get(job_id, ()))]

    def job_ids(self) -> set[int]:
        """Every job id that has at least one cached pod."""
        return set(self._by_job)

    def job_id_of(self, pod: dict[str, Any]) -> int | None:
        """The Slurm job id in the pod's label, or None if absent or not a number."""
        value = ((pod.get("metadata") or {}).get("labels") or {}).get(self.job_label)
        try:
            return int(value) if value is not None else None
        except ValueError:
            return None

    def trim(self, pod: dict[str, Any]) -> dict[str, Any]:
        """`pod` trimmed the way this cache stores it (lets a lister drop full pods page by page)."""
        return trim_pod(pod, self._drop)

    # -- writes -------------------------------------------------------------------------------
    def apply(self, event_type: str, pod: dict[str, Any]) -> set[int]:
        """Apply one watch event (ADDED, MODIFIED, DELETED); return the job ids it touched.

        Other event types (BOOKMARK, ERROR) are the watcher's business and change nothing here.
        Usually one id; two if a pod's job label changed; none for a pod without a job label.
        """
        name = (pod.get("metadata") or {}).get("name")
        if not name:
            return set()
        if event_type in ("ADDED", "MODIFIED"):
            return self._put(name, trim_pod(pod, self._drop))
        if event_type == "DELETED":
            # A pod created and deleted between two looks is still news to its job.
            job_id = self.job_id_of(pod)
            return self._remove(name) or ({job_id} if job_id is not None else set())
        return set()

    def replace_all(self, pods: Iterable[dict[str, Any]]) -> set[int]:
        """Make the cache exactly `pods` (a fresh full list); return the job ids whose pods changed.

        A job counts as changed if one of its pods appeared, vanished or differs (after trimming).
        Sets `synced`.
        """
        fresh: dict[str, dict[str, Any]] = {}
        for pod in pods:
            name = (pod.get("metadata") or {}).get("name")
            if name:
                fresh[name] = trim_pod(pod, self._drop)
        changed: set[int] = set()
        for name in [name for name in self._pods if name not in fresh]:
            changed |= self._remove(name)
        for name, trimmed in fresh.items():
            if self._pods.get(name) != trimmed:
                changed |= self._put(name, trimmed)
        self.synced.set()
        return changed

    def _put(self, name: str, trimmed: dict[str, Any]) -> set[int]:
        touched: set[int] = set()
        old_job = self._job_of.get(name)
        new_job = self.job_id_of(trimmed)
        if old_job is not None and old_job != new_job:
            self._unindex(name, old_job)
            touched.add(old_job)
        self._pods[name] = trimmed
        for listener in self._on_seen:
            listener(name)
        if new_job is not None:
            self._job_of[name] = new_job
            self._by_job.setdefault(new_job, set()).add(name)
            touched.add(new_job)
        return touched

    def _remove(self, name: str) -> set[int]:
        if self._pods.pop(name, None) is None:
            return set()
        job_id = self._job_of.get(name)
        if job_id is None:
            return set()
        self._unindex(name, job_id)
        return {job_id}

    def _unindex(self, name: str, job_id: int) -> None:
        self._job_of.pop(name, None)
        names = self._by_job.get(job_id)
        if names is not None:
            names.discard(name)
            if not names:
                del self._by_job[job_id]
