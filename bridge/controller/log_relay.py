"""The log relay: each pod's log, read from the API server, becomes the waiter's output events.

With the agent in the pod, log lines are frames: "o <base64>" the script's stdout, "e <base64>"
its stderr, "s <base64>" a step request of the script's srun and "k <base64>" a signal it got (these
two only from the first node's pod; they go to controller.steps), "c <base64>" one of Slurm's
commands run in that pod (to controller.commands), "u <base64>" a sample of its usage and "x <base64>"
how the script ended, the agent's last line (these from the first pod only). Without it, each line
is output.

Owns the relay tasks, the pods whose log is fully relayed, and the position (timestamp of the last
line relayed) per pod index: LogBook, held by each JobSession and written only here (the position
comes from the waiter at attach, through `restart`). Started and read by the reconciler; a relay
that ends wakes its job through `wake` (it is an event source, like the pod watch).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import structlog

from bridge.clients.kube.actions import KubeActions
from bridge.clients.kube.cache import PodCache
from bridge.clients.kube.errors import KubeNotFound
from bridge.controller.commands import Commands
from bridge.controller.metrics import Metrics
from bridge.controller.steps import Steps, check_step_signal
from bridge.core.agent_protocol import ScriptEnding, parse_ending
from bridge.core.errors import PermanentError
from bridge.core.pod_view import PodView, pod_view

if TYPE_CHECKING:
    from bridge.controller.sessions import JobSession

log = structlog.get_logger(__name__)

LOG_RESUME_DELAYS_S = (0.0, 0.1, 0.2, 0.5, 1.0, 2.0)
"""A log relay whose stream ended while its container still runs resumes after these pauses."""
LOG_ATTEMPTS_AFTER_END = 3
"""Failed reads tolerated once the container has ended, before its remaining lines are given up."""
LOG_NOT_FOUND_ATTEMPTS = 10
"""404s for the log of a pod the watch has, asked again before the relay gives up on it."""


class LogBook:
    """One run's log relays: running ones by pod, pods fully relayed, and positions by pod index."""

    def __init__(self) -> None:
        self.positions: dict[str, str] = {}
        """Timestamp of the last log line the waiter printed, by pod index."""
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.done: set[str] = set()
        self.ending: tuple[str, str, ScriptEnding] | None = None
        """The batch script's end as its agent told it (pod, log timestamp, how), once relayed."""

    def restart(self, positions: dict[str, str]) -> None:
        """A waiter attached: relays start again from the positions it printed."""
        self.forget()
        self.positions = dict(positions)

    def forget(self) -> None:
        """The waiter went: stop the relays; the next waiter's are started afresh."""
        self.stop()
        self.done.clear()
        self.ending = None

    def stop(self) -> None:
        """Stop the running relays (the run is over)."""
        for task in self.tasks.values():
            task.cancel()
        self.tasks.clear()


class LogRelay:
    def __init__(
        self, kube: KubeActions, cache: PodCache, metrics: Metrics, steps: Steps, wake: Callable[[int], None]
    ) -> None:
        self._kube = kube
        self._cache = cache
        self._metrics = metrics
        self._steps = steps
        self._commands = Commands(steps)
        self._wake = wake

    def ensure(self, session: JobSession, pods: Iterable[PodView]) -> None:
        """A relay for each started pod that carries output, while a waiter is attached."""
        if not session.attached:
            return
        book = session.logs
        for pod in pods:
            if pod.name in book.tasks or pod.name in book.done or not pod.carries_output or not pod.started:
                continue
            book.tasks[pod.name] = asyncio.create_task(
                self._relay(session, pod.name, pod.index), name=f"logs:{pod.name}")

    def drained(self, session: JobSession, pods: Iterable[PodView]) -> bool:
        """Every line of every pod that carries output reached the attached waiter's queue."""
        if not session.attached:
            return False
        return all(pod.name in session.logs.done for pod in pods if pod.carries_output and pod.started)

    async def _relay(self, session: JobSession, pod_name: str, index: int) -> None:
        """Relay one pod's log to the waiter until its container has terminated and every line is out.

        A stream can end, or stall (stream_logs has a read deadline), while the container still runs:
        the kubelet or API server restarted, a half-open connection. Then the relay resumes after the
        last line it relayed (stream_logs yields only lines after `since`, so nothing is printed
        twice). It is done after a read that began once the container had terminated and ran to
        its end: only such a read is sure to have every line.
        """
        bound = log.bind(job_id=session.job_id, pod=pod_name)
        book = session.logs
        pauses = failures_after_end = not_found = 0
        while True:
            raw = self._cache.get(pod_name)
            if raw is None:
                break  # deleted: nothing left to read
            pod = pod_view(raw)
            ended = pod.container_ended
            since = book.positions.get(str(index))
            told = False
            try:
                lines = self._kube.stream_logs(pod_name, since_time=since)
                async with contextlib.aclosing(lines):  # a break closes the stream at once
                    async for stamp, line in lines:
                        book.positions[str(index)] = stamp
                        event = (output_event(index, stamp, line) if pod.runs_agent else
                                 {"type": "log", "pod": index, "ts": stamp, "line": line})
                        if event["type"] == "ending":
                            ending = event["ending"]
                            if not isinstance(ending, ScriptEnding):
                                continue
                            # The agent's last frame: every line is out (nothing follows it).
                            book.ending = (pod_name, stamp, ending)
                            told = True
                            break
                        if event["type"] == "step":
                            self._steps.register(session, event, bound)
                        elif event["type"] == "step-signal":
                            check_step_signal(session, event, bound)
                        elif event["type"] == "command":
                            self._commands.register(session, event, bound)
                        await session.publish_output(event)
                        self._metrics.inc("log_lines_total")
                        pauses = 0
            except asyncio.CancelledError:
                raise
            except PermanentError as error:  # the pod is gone, or its log can never be read
                # ... unless it is a 404 for a pod the watch still has: a fresh pod the API
                # server's cache does not show yet. Asked again, a few times.
                if not (isinstance(error, KubeNotFound) and self._cache.get(pod_name) is not None
                        and not_found < LOG_NOT_FOUND_ATTEMPTS):
                    bound.warning("logs.unavailable", error=repr(error))
                    break
                not_found += 1
                bound.info("logs.not_found_yet", error=repr(error), attempt=not_found)
            except Exception as error:
                if ended:
                    failures_after_end += 1
                    if failures_after_end >= LOG_ATTEMPTS_AFTER_END:
                        bound.warning("logs.unavailable", error=repr(error), attempts=failures_after_end)
                        break
                bound.info("logs.resuming", error=repr(error), container_ended=ended)
            else:
                if ended or told:
                    break
            self._metrics.inc("log_relay_resumes_total")
            await asyncio.sleep(LOG_RESUME_DELAYS_S[min(pauses, len(LOG_RESUME_DELAYS_S) - 1)])
            pauses += 1
        book.tasks.pop(pod_name, None)
        book.done.add(pod_name)
        self._wake(session.job_id)


def output_event(index: int, stamp: str, line: str) -> dict[str, Any]:
    """One log line of the in-pod agent as the waiter's event: "o <base64>" is the script's stdout,
    "e <base64>" its stderr (passed on still encoded: the waiter writes the bytes); on the first
    pod, "s", "c" and "k" are the script's srun, Slurm commands and step signals, "u" a sample of
    its processes' usage (agent/usage.go), "x" how the script ended (agent/ending.go). Anything
    else is the agent's own complaint (it could not start the script), a line of stderr."""
    tag, sep, data = line.partition(" ")
    if sep and tag in ("o", "e"):
        return {"type": "out", "pod": index, "ts": stamp, "fd": 1 if tag == "o" else 2, "data": data}
    if sep and tag == "s" and index == 0:
        return {"type": "step", "pod": index, "ts": stamp, "data": data}
    if sep and tag == "c" and index == 0:
        return {"type": "command", "pod": index, "ts": stamp, "data": data}
    if sep and tag == "u" and index == 0:
        return {"type": "usage", "pod": index, "ts": stamp, "data": data}
    if sep and tag == "k" and index == 0:
        return {"type": "step-signal", "pod": index, "ts": stamp, "data": data}
    if sep and tag == "x" and index == 0:
        # None: not an ending this daemon reads (a newer agent's): dropped, never output.
        return {"type": "ending", "pod": index, "ts": stamp, "ending": parse_ending(data)}
    text = base64.b64encode((line + "\n").encode("utf-8", "surrogateescape")).decode()
    return {"type": "out", "pod": index, "ts": stamp, "fd": 2, "data": text}
