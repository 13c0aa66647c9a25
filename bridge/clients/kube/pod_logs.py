"""Following a container's log, resumable after the last line seen.

Mixed into KubeActions (bridge.clients.kube.actions); the controller's log relays call it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator

import aiohttp
from kubernetes_asyncio.client import ApiClient

from bridge.clients.kube.client import iter_pieces, request
from bridge.clients.kube.errors import KubeInvalid, LogsNotReady
from bridge.clients.kube.lines import ns_to_rfc3339, rfc3339_to_ns, split_log_line
from bridge.core import wellknown
from bridge.core.errors import KubeUnavailable

LOG_READ_TIMEOUT_S = 60.0
"""A followed log silent this long is broken off: a half-open connection (a restarted API server or
kubelet, a lost network path) would otherwise hang for ever. A job that computes quietly for hours
is fine: its relay resumes after the last line it saw."""
STREAM_OPENS_AT_ONCE = 32
"""How many followed logs may be being opened at once (see LogVerbs._opening_streams)."""


class LogVerbs:
    """Follow the logs of the namespace's pods."""

    namespace: str
    _pods: str
    _streams: ApiClient
    """Long-lived reads (followed logs): their own pool, if the caller gave one."""
    _opening_streams: asyncio.Semaphore
    """Streams once open are not capped, but at most STREAM_OPENS_AT_ONCE are being opened at
    once: a thousand relays (re)starting together must not bury the API server, whose slowness
    would cost the Lease (each open is a request the server routes to a kubelet)."""
    _log_timeout: aiohttp.ClientTimeout

    async def stream_logs(
        self, pod_name: str, container: str = wellknown.CONTAINER_NAME, since_time: str | None = None
    ) -> AsyncGenerator[tuple[str, str], None]:
        """Follow the container's log: yield (RFC 3339 nano timestamp, line without its newline).

        Ends when the container exits (the server closes the stream), or raises KubeUnavailable when
        the connection breaks or stays silent for `log_read_timeout_s`; to resume, call again with
        `since_time` = the last timestamp seen: only lines stamped strictly after it are yielded
        (the server keeps whole seconds, so lines of that second are filtered here). Raises
        LogsNotReady while the container has not started. Consumers that may stop early should
        wrap it in `contextlib.aclosing` so the connection is closed at once rather than when the
        generator is garbage-collected.
        """
        query: dict[str, str | int] = {"container": container, "follow": "true", "timestamps": "true"}
        after_ns: int | None = None
        if since_time:
            after_ns = rfc3339_to_ns(since_time)
            query["sinceTime"] = ns_to_rfc3339(after_ns)
        what = f"read the log of container {container} of pod {pod_name} in namespace {self.namespace}"
        try:
            async with self._opening_streams:
                response = await request(
                    self._streams, "GET", f"{self._pods}/{pod_name}/log", what, query=query,
                    timeout=self._log_timeout,
                )
        except KubeInvalid as error:
            raise LogsNotReady(str(error)) from error
        continues = ""  # the stamp of a line too long to hold, while its pieces come
        # aclosing: an abandoned stream is closed at once, not when the collector finds it.
        async with contextlib.aclosing(iter_pieces(response, what)) as pieces:
            async for line, ended in pieces:
                if continues:
                    # A piece of one long line: only its first carried the stamp.
                    stamp = continues
                    continues = "" if ended else continues
                    if after_ns is None or rfc3339_to_ns(stamp) > after_ns:
                        yield stamp, line.decode("utf-8", errors="replace")
                    continue
                stamp, text = split_log_line(line)
                stamp_ns = timestamp_ns_or_none(stamp) if stamp else None
                if stamp_ns is None:
                    # With timestamps=true every line of the container's log carries one. A line
                    # without is the kubelet's own error, written into a body it had begun with a
                    # 200 ("unable to retrieve container logs for containerd://..." once the
                    # container is gone): never the job's output.
                    raise KubeUnavailable(f"cannot {what}: the log stream ended with {text[:200]!r}")
                if not ended:
                    continues = stamp
                if after_ns is not None and stamp_ns <= after_ns:
                    continue
                yield stamp, text


def timestamp_ns_or_none(stamp: str) -> int | None:
    """The RFC 3339 stamp in nanoseconds since the epoch, None if it does not parse."""
    try:
        return rfc3339_to_ns(stamp)
    except ValueError:
        return None
