"""A de-duplicating work queue of job ids, controller-runtime style.

A key is only a job id; whatever event produced it is irrelevant because
reconcile re-reads both sides. A key queued many times before a worker takes it
is processed once; a key is never processed by two workers at once (if it is
queued again meanwhile, it runs again after the current pass). Failures are
retried later with a capped exponential backoff.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

from bridge.core.errors import PermanentError

log = structlog.get_logger(__name__)

BACKOFF_S = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)


class WorkQueue:
    def __init__(self) -> None:
        self._queue: asyncio.Queue[int] = asyncio.Queue()
        self._queued: set[int] = set()
        self._active: set[int] = set()
        self._dirty_while_active: set[int] = set()
        self._failures: dict[int, int] = {}
        self._delayed: dict[int, asyncio.TimerHandle] = {}
        self.processed = 0
        self.errors = 0

    def add(self, key: int) -> None:
        """Queue `key` unless it is already waiting; safe to call from any callback."""
        if key in self._active:
            self._dirty_while_active.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)

    def add_after(self, key: int, delay_s: float) -> None:
        """Queue `key` after `delay_s` (a later call for the same key replaces the timer)."""
        if (timer := self._delayed.pop(key, None)) is not None:
            timer.cancel()
        loop = asyncio.get_running_loop()
        self._delayed[key] = loop.call_later(delay_s, self._fire_delayed, key)

    def _fire_delayed(self, key: int) -> None:
        self._delayed.pop(key, None)
        self.add(key)

    def __len__(self) -> int:
        return len(self._queued)

    async def run_worker(self, reconcile: Callable[[int], Awaitable[None]]) -> None:
        """Take keys forever and reconcile them one at a time (run several workers for parallelism)."""
        while True:
            key = await self._queue.get()
            self._queued.discard(key)
            self._active.add(key)
            try:
                await reconcile(key)
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
            finally:
                self.processed += 1
                self._active.discard(key)
                if key in self._dirty_while_active:
                    self._dirty_while_active.discard(key)
                    self.add(key)
