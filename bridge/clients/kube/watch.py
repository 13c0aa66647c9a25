"""One list+watch per resource: the bridge's pods feed the PodCache (and tell reconcile which jobs
changed), the cluster's nodes feed the NodeCache (and tell the node health sync which nodes did).

The client-go informer loop, reduced to what the bridge needs:

    list (paged, raw JSON) -> cache.replace_all -> notify changed jobs
    watch from the list's resourceVersion (bookmarks on) -> cache.apply -> notify the event's job
    watch ended by the server's timeout  -> watch again from the last resourceVersion seen
    410 Gone / "too old resource version" -> list again
    transport error, 5xx, 429            -> wait (capped exponential backoff), resume from the last rv

Never a per-job poll, never a list per event. Cancelling the task running `run()` stops it at once
and closes its connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any, Final, Generic, Protocol, TypeVar

import aiohttp
import structlog
from kubernetes_asyncio.client import ApiClient

from bridge.clients.kube.cache import PodCache
from bridge.clients.kube.client import iter_lines, request, request_json
from bridge.clients.kube.errors import ResourceVersionExpired, error_for_status
from bridge.core import json_text
from bridge.core.errors import KubeUnavailable, TemporaryError

log = structlog.get_logger(__name__)

Key = TypeVar("Key")

BACKOFF: Final = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
"""Seconds to wait after the 1st, 2nd, ... consecutive failure; the last value repeats. ±20% jitter."""

LIST_TIMEOUT: Final = aiohttp.ClientTimeout(total=120, connect=10)

QUICK_END_S: Final = 1.0
"""A watch that ends empty sooner than this counts as a failure (backoff) rather than a normal end."""


class WatchedCache(Protocol[Key]):
    """What a ListWatcher feeds: it trims objects, takes full lists and single events, and says
    which keys (job ids, node names) each one changed."""

    def trim(self, obj: dict[str, Any]) -> Any: ...

    def replace_all(self, objs: Iterable[Any]) -> set[Key]: ...

    def apply(self, event_type: str, obj: dict[str, Any]) -> set[Key]: ...


class ListWatcher(Generic[Key]):
    """Keeps `cache` equal to the objects at `path` matching `label_selector`.

    `on_changed(key)` is called (synchronously, so it must be quick and must not raise) for every
    key the cache reports changed; typically it puts the key on a work queue. Counters (`events`,
    `relists`, `errors`, `bookmarks`) are plain ints.
    """

    def __init__(
        self,
        api_client: ApiClient,
        path: str,
        resource: str,
        label_selector: str,
        cache: WatchedCache[Key],
        on_changed: Callable[[Key], None],
        *,
        watch_timeout_s: int = 300,
        page_size: int = 500,
        backoff: tuple[float, ...] = BACKOFF,
        field_selector: str = "",
    ) -> None:
        self._api = api_client
        self.field_selector = field_selector
        self.resource = resource
        """What is watched, for messages: "pods in namespace slurm-jobs", "nodes"."""
        self.label_selector = label_selector
        self._cache = cache
        self._on_changed = on_changed
        self._watch_timeout_s = watch_timeout_s
        self._page_size = page_size
        self._backoff = backoff
        self._path = path
        self._log = log.bind(resource=resource, selector=label_selector)
        self.resource_version: str | None = None
        """Where the next watch starts; None means "list first"."""
        self.events = 0
        """Watch events applied to the cache (ADDED, MODIFIED, DELETED)."""
        self.relists = 0
        """Full lists done (the first one included)."""
        self.errors = 0
        """Failures that made the watcher wait before trying again."""
        self.bookmarks = 0
        self.listed = asyncio.Event()
        """Set once the first list is in the cache."""
        self.failing = False
        """The last attempt failed and the watcher is waiting to try again: the cache may be older
        than the API server's objects. Cleared once a list or a watch is answered again."""

    def counters(self) -> dict[str, int]:
        return {
            "events": self.events,
            "relists": self.relists,
            "errors": self.errors,
            "bookmarks": self.bookmarks,
        }

    async def run(self) -> None:
        """List, then watch forever. Returns only by cancellation; raises PermanentError (e.g. RBAC)."""
        failures = 0
        self._log.info("kube.watch.start")
        try:
            while True:
                try:
                    if self.resource_version is None:
                        await self.relist()
                    started = asyncio.get_running_loop().time()
                    if await self._watch():
                        failures = 0
                    elif asyncio.get_running_loop().time() - started < QUICK_END_S:
                        # Ended at once with nothing (a proxy or a sick server): do not hammer it.
                        quick = KubeUnavailable("watch ended at once without any event")
                        failures = await self._pause(failures, quick)
                except ResourceVersionExpired as error:
                    if self.resource_version is not None:
                        self._log.info("kube.watch.expired", resource_version=self.resource_version)
                        self.resource_version = None
                        continue  # list again at once
                    # The list itself expired (a paging token outlived the server's history).
                    failures = await self._pause(failures, error)
                except TemporaryError as error:
                    failures = await self._pause(failures, error)
        finally:
            self._log.info("kube.watch.stop", **self.counters())

    async def relist(self) -> set[Key]:
        """List all matching objects (paged), replace the cache, notify and return the changed keys."""
        objs: list[Any] = []
        query: dict[str, str | int] = {"limit": self._page_size}
        if self.label_selector:
            query["labelSelector"] = self.label_selector
        if self.field_selector:
            query["fieldSelector"] = self.field_selector
        what = f"list {self.resource}"
        while True:
            body = await request_json(self._api, "GET", self._path, what, query=query, timeout=LIST_TIMEOUT)
            # Trimmed page by page: a full list of big objects is never held at once.
            objs.extend(self._cache.trim(obj) for obj in body.get("items") or ())
            meta = body.get("metadata") or {}
            if not meta.get("continue"):
                break
            query["continue"] = meta["continue"]
        changed = self._cache.replace_all(objs)
        self.resource_version = str(meta.get("resourceVersion") or "") or None
        self.relists += 1
        self.failing = False
        self._log.info(
            "kube.watch.listed", objects=len(objs), keys_changed=len(changed),
            resource_version=self.resource_version,
        )
        self.listed.set()
        for key in sorted(changed, key=str):  # keys may mix kinds (a gang's, a job's)
            self._on_changed(key)
        return changed

    async def _watch(self) -> bool:
        """One watch request, applied until the server ends it; True if it delivered anything."""
        what = f"watch {self.resource}"
        query: dict[str, str | int] = {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": self._watch_timeout_s,
        }
        if self.label_selector:
            query["labelSelector"] = self.label_selector
        if self.field_selector:
            query["fieldSelector"] = self.field_selector
        if self.resource_version:
            query["resourceVersion"] = self.resource_version
        # A silent connection longer than the server's own timeout (plus bookmarks) is a dead one.
        timeout = aiohttp.ClientTimeout(connect=10, sock_read=self._watch_timeout_s + 60)
        response = await request(self._api, "GET", self._path, what, query=query, timeout=timeout)
        # Answered from the last resourceVersion: what was missed comes first on this stream.
        self.failing = False
        delivered = False
        async with contextlib.aclosing(iter_lines(response, what)) as lines:
            async for line in lines:
                if line.strip():
                    self._apply_line(line, what)
                    delivered = True
        return delivered

    def _apply_line(self, line: bytes, what: str) -> None:
        try:
            event = json_text.loads(line)
            kind = event["type"]
            obj = event["object"]
        except (ValueError, KeyError, TypeError) as error:
            raise KubeUnavailable(f"cannot {what}: garbled event {line[:200]!r}") from error
        if kind == "ERROR":
            raise error_for_status(int(obj.get("code") or 500), obj, what)
        meta = obj.get("metadata") or {}
        if meta.get("resourceVersion"):
            self.resource_version = meta["resourceVersion"]
        if kind == "BOOKMARK":
            self.bookmarks += 1
            return
        touched = self._cache.apply(kind, obj)
        self.events += 1
        self._log.debug("kube.watch_event", type=kind, name=meta.get("name"), keys=sorted(touched, key=str))
        for key in sorted(touched, key=str):
            self._on_changed(key)

    async def _pause(self, failures: int, error: Exception) -> int:
        self.errors += 1
        self.failing = True
        delay = self._backoff[min(failures, len(self._backoff) - 1)] * random.uniform(0.8, 1.2)
        self._log.warning(
            "kube.watch.retry", error=str(error), failures=failures + 1, delay_s=round(delay, 2),
            resource_version=self.resource_version,
        )
        await asyncio.sleep(delay)
        return failures + 1


class PodWatcher(ListWatcher[int]):
    """The bridge's pods in `namespace` (matching `label_selector`) into a PodCache; `on_job_changed`
    gets every job id whose pods appeared, changed or vanished."""

    def __init__(
        self,
        api_client: ApiClient,
        namespace: str,
        label_selector: str,
        cache: PodCache,
        on_job_changed: Callable[[int], None],
        **options: Any,
    ) -> None:
        super().__init__(
            api_client, f"/api/v1/namespaces/{namespace}/pods", f"pods in namespace {namespace}",
            label_selector, cache, on_job_changed, **options,
        )
        self.namespace = namespace
        self._pod_cache = cache

    async def _pause(self, failures: int, error: Exception) -> int:
        self._pod_cache.trouble_at = datetime.now(UTC)
        return await super()._pause(failures, error)
