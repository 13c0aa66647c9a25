"""Payload Secrets: the Secret with a job's script and exported environment, shared by every job
with the same content (an array's tasks, a requeued job's runs).

Owns what this daemon knows of them (which it made or found, and when), one lock per Secret (so
the sweep never deletes one a job is making), and the sweep of Secrets nothing names any more.
`ensure` is called by the reconciler as it creates a run's pods; `sweep` by the daemon's sweep
loop, on the leader only.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import structlog

from bridge.clients.kube.actions import KubeActions
from bridge.clients.kube.cache import PodCache
from bridge.controller.sessions import SessionRegistry
from bridge.core.errors import BridgeError
from bridge.core.pod_identity import payload_secret_of
from bridge.core.pod_view import parse_time

log = structlog.get_logger(__name__)

SECRET_KNOWN_S = 30.0
"""How long a payload Secret this daemon made or found is taken to exist without asking again."""
SECRET_SWEEP_MIN_AGE_S = 300.0
"""A payload Secret that no pod or session names is deleted by the sweep only once this old."""


class PayloadSecrets:
    def __init__(self, kube: KubeActions, cache: PodCache, sessions: SessionRegistry) -> None:
        self._kube = kube
        self._cache = cache
        self._sessions = sessions
        self._known: dict[str, float] = {}
        """Payload Secrets this daemon made or found, and when (monotonic)."""
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    async def ensure(self, secret: dict[str, Any], bound: Any) -> None:
        """The Secret exists once this returns: made now, or already there (the same content, by
        its name). Once per Secret and daemon: an array's tasks share one."""
        name = secret["metadata"]["name"]
        if self._is_known(name):
            return
        async with self._lock(name):  # never while the sweep decides about it
            if self._is_known(name):  # made by the job that held the lock before us
                return
            if await self._kube.create_secret(secret):
                bound.info("secret.created", secret=name)
            self._known[name] = time.monotonic()

    def _is_known(self, name: str) -> bool:
        """Made or found a moment ago: an array's burst of tasks sends one request. Trusted only
        for SECRET_KNOWN_S, so one deleted behind the daemon's back is made again soon."""
        seen = self._known.get(name)
        return seen is not None and time.monotonic() - seen < SECRET_KNOWN_S

    @contextlib.asynccontextmanager
    async def _lock(self, name: str) -> AsyncIterator[None]:
        """One Secret's lock, kept while anyone holds or waits for it."""
        lock, users = self._locks.get(name, (asyncio.Lock(), 0))
        self._locks[name] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[name]
            if users == 1:
                del self._locks[name]
            else:
                self._locks[name] = (lock, users - 1)

    def _in_use(self) -> set[str]:
        """Payload Secrets that a cached pod or a live session names."""
        used = {s.payload_secret for s in self._sessions if s.payload_secret}
        for job_id in self._cache.job_ids():
            used.update(filter(None, map(payload_secret_of, self._cache.pods_of(job_id))))
        return used

    async def sweep(self, selector: str) -> int:
        """Delete the payload Secrets that no cached pod and no session names, made over
        SECRET_SWEEP_MIN_AGE_S ago. A job that starts later with the same script and environment
        (an array's next task) makes its Secret again. Returns how many went."""
        now = datetime.now(UTC)
        removed = 0
        listed = await self._kube.secrets_metadata(selector)
        existing = {meta.get("name") for meta in listed}
        self._known = {name: seen for name, seen in self._known.items()
                       if name in existing and time.monotonic() - seen < SECRET_KNOWN_S}
        used = self._in_use()
        for meta in listed:
            name, created = meta.get("name"), parse_time(meta.get("creationTimestamp"))
            if not isinstance(name, str) or created is None or name in used:
                continue
            if (now - created).total_seconds() < SECRET_SWEEP_MIN_AGE_S:
                continue
            async with self._lock(name):
                # Asked again under the lock: a job may have come for it since the list.
                if any(s.payload_secret == name for s in self._sessions):
                    continue
                self._known.pop(name, None)
                # Only the listed incarnation: one made again meanwhile stays.
                try:
                    deleted = await self._kube.delete_secret(name, uid=meta.get("uid"))
                except BridgeError as error:  # this one next time; the others now
                    log.warning("secret.sweep_failed", secret=name, error=repr(error))
                    continue
                if deleted:
                    removed += 1
                    log.info("secret.swept", secret=name)
        return removed
