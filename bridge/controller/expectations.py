"""Create expectations, as controller-runtime's: pods created but not seen in the cache yet.

A create returns before the pod's ADDED event reaches the watch cache. A reconcile in that gap
sees no pod although one exists, and must not read it as "deleted outside Slurm" (nor create it
again). So every create is expected first; the cache seeing the pod satisfies the expectation;
one the cache has not shown within `timeout_s` (a watch that is down for long, a pod deleted
before we ever saw it) expires, and then the absence is believed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import structlog

log = structlog.get_logger(__name__)

DEFAULT_TIMEOUT_S = 60.0
"""Well past a watch reconnect and relist; short enough that a really lost pod fails its job soon."""


class CreateExpectations:
    """Pod names created by this daemon and not yet seen by the pod cache, each with a deadline."""

    def __init__(
        self, timeout_s: float = DEFAULT_TIMEOUT_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.timeout_s = timeout_s
        self._clock = clock
        self._deadlines: dict[str, float] = {}

    def expect(self, names: Iterable[str]) -> None:
        """Call before sending the creates: the event may be applied before a create returns."""
        deadline = self._clock() + self.timeout_s
        for name in names:
            self._deadlines[name] = deadline

    def observed(self, name: str) -> None:
        """The cache has the pod (wired to PodCache.on_seen)."""
        self._deadlines.pop(name, None)

    def forget(self, names: Iterable[str]) -> None:
        """Creates that failed: nothing is coming."""
        for name in names:
            self._deadlines.pop(name, None)

    def pending(self, names: Iterable[str]) -> dict[str, float]:
        """Of `names`, those still expected, with the seconds left; expired ones are dropped."""
        now = self._clock()
        left: dict[str, float] = {}
        for name in names:
            deadline = self._deadlines.get(name)
            if deadline is None:
                continue
            if deadline <= now:
                del self._deadlines[name]
                log.warning("pod.expectation_expired", pod=name, timeout_s=self.timeout_s)
                continue
            left[name] = deadline - now
        return left

    def __len__(self) -> int:
        return len(self._deadlines)
