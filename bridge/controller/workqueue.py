"""A de-duplicating work queue of keys (job ids; node names for the node health sync),
controller-runtime style.

A key is only a job id; whatever event produced it is irrelevant because
reconcile re-reads both sides. A key queued many times before a worker takes it
is processed once; a key is never processed by two workers at once (if it is
queued again meanwhile, it runs again after the current pass). Failures are
retried later with a capped exponential backoff. A pass that wants to look again later (a
deadline with no event to wake it) returns a Result with `requeue_after`; the worker, not the
reconciler, schedules it, as controller-runtime's Result{RequeueAfter}.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

import structlog

from bridge.core.errors import PermanentError

log = structlog.get_logger(__name__)

BACKOFF_S = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)


@dataclass(frozen=True)
class Result:
    """What one reconcile pass asks of its worker: to be run again after `requeue_after` seconds
    (None: only when an event comes)."""

    requeue_after: float | None = None

    def sooner(self, delay_s: float | None) -> Result:
        """This result, or one that looks again after `delay_s` if that comes first."""
        if delay_s is None or (self.requeue_after is not None and self.requeue_after <= delay_s):
            return self
        return Result(delay_s)


DONE = Result()
"""A pass that needs no later look of its own."""


K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    def __init__(self) -> None:
        self._queue: asyncio.Queue[K] = asyncio.Queue()
        self._queued: set[K] = set()
        self._active: set[K] = set()
        self._dirty_while_active: set[K] = set()
        self._failures: dict[K, int] = {}
        self._delayed: dict[K, asyncio.TimerHandle] = {}
        self.processed = 0
        self.errors = 0

    def add(self, key: K) -> None:
        """Queue `key` unless it is already waiting; safe to call from any callback."""
        if key in self._active:
            self._dirty_while_active.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)

    def add_after(self, key: K, delay_s: float) -> None:
        """Queue `key` after `delay_s` (a later call for the same key replaces the timer)."""
        if (timer := self._delayed.pop(key, None)) is not None:
            timer.cancel()
        loop = asyncio.get_running_loop()
        self._delayed[key] = loop.call_later(delay_s, self._fire_delayed, key)

    def _fire_delayed(self, key: K) -> None:
        self._delayed.pop(key, None)
        self.add(key)

    def __len__(self) -> int:
        return len(self._queued)

    async def run_worker(self, reconcile: Callable[[K], Awaitable[Result | None]]) -> None:
        """Take keys forever and reconcile them one at a time (run several workers for parallelism).
        A pass's Result decides whether the key comes back after a delay; a failure backs off."""
        while True:
            key = await self._queue.get()
            self._queued.discard(key)
            self._active.add(key)
            try:
                result = await reconcile(key)
            except asyncio.CancelledError:
                raise
            except PermanentError as error:
                self.errors += 1
                log.error("reconcile.failed_permanently", job_id=key, error=str(error))
                self._failures.pop(key, None)
            except Exception as error:  # a worker must survive any one key's failure
                self.errors += 1
                count = self._failures.get(key, 0)
                self._failures[key] = count + 1
                delay = BACKOFF_S[min(count, len(BACKOFF_S) - 1)]
                log.warning("reconcile.retry", job_id=key, error=repr(error), retry_in_s=delay)
                self.add_after(key, delay)
            else:
                self._failures.pop(key, None)
                if result is not None and result.requeue_after is not None:
                    self.add_after(key, result.requeue_after)
            finally:
                self.processed += 1
                self._active.discard(key)
                if key in self._dirty_while_active:
                    self._dirty_while_active.discard(key)
                    self.add(key)
