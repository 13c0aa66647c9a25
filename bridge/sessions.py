"""Per-job runtime state of attached waiters. Lost on restart by design: the
waiter re-attaches and re-sends everything here (payload, log positions)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from bridge.model import JobPayload

Event = dict[str, Any]


@dataclass
class JobSession:
    job_id: int
    payload: JobPayload | None = None
    cancel_requested: bool = False
    last_log: dict[str, str] = field(default_factory=dict)
    """Timestamp of the last log line the waiter printed, by pod index."""
    listener: asyncio.Queue[Event] | None = None
    log_tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    logs_done: set[str] = field(default_factory=set)
    created: bool = False
    """This daemon created (or found) the pods; a missing pod afterwards is a failure."""
    final: Event | None = None
    """The exit event, once decided; re-sent to a waiter that re-attaches."""

    def attach(self, last_log: dict[str, str]) -> asyncio.Queue[Event]:
        """A new waiter connection replaces any older one (and its log relays)."""
        self.detach()
        self.last_log = dict(last_log)
        self.listener = asyncio.Queue()
        if self.final is not None:
            self.listener.put_nowait(self.final)
        return self.listener

    def detach(self, queue: asyncio.Queue[Event] | None = None) -> None:
        if queue is not None and queue is not self.listener:
            return
        self.listener = None
        for task in self.log_tasks.values():
            task.cancel()
        self.log_tasks.clear()
        self.logs_done.clear()

    @property
    def attached(self) -> bool:
        return self.listener is not None

    def publish(self, event: Event) -> None:
        if self.listener is not None:
            self.listener.put_nowait(event)

    def finish(self, event: Event) -> None:
        """Decide the job's end once; the waiter exits when it reads it."""
        if self.final is None:
            self.final = event
            self.publish(event)

