"""Split a byte stream into lines, whatever the chunk boundaries (watch NDJSON, follow-mode logs).

Also the small parsers for `timestamps=true` log lines.

Pure: fed chunks, returns complete lines, so it is tested without a server. Splitting happens on
bytes, before decoding, so a multi-byte character cut by a chunk boundary is never damaged.
"""

from __future__ import annotations

import calendar
from datetime import UTC, datetime

MAX_LINE = 1 << 20
"""Longer lines are handed out in pieces of exactly this many bytes (the rest follows)."""


class LineSplitter:
    """Accumulates chunks; hands out every line completed by `\\n` (without it).

    A line longer than `max_line` bytes is handed out in `max_line`-sized pieces rather than
    buffered without bound (a program printing megabytes without a newline must not grow memory).
    """

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self._buffer = bytearray()
        self._max_line = max_line

    def feed(self, chunk: bytes) -> list[bytes]:
        """Add `chunk`; return the lines it completed, in order."""
        return [line for line, _ in self.feed_pieces(chunk)]

    def feed_pieces(self, chunk: bytes) -> list[tuple[bytes, bool]]:
        """As `feed`, each with whether it ends its line (False: a piece of a longer one, whose
        rest comes next)."""
        self._buffer += chunk
        if b"\n" not in chunk and len(self._buffer) <= self._max_line:
            return []
        *complete, rest = self._buffer.split(b"\n")
        lines = [(bytes(line), True) for line in complete]
        while len(rest) > self._max_line:
            lines.append((bytes(rest[: self._max_line]), False))
            rest = rest[self._max_line :]
        self._buffer = bytearray(rest)
        return lines

    def flush(self) -> bytes | None:
        """At end of stream: the last line if it had no trailing newline, else None."""
        if not self._buffer:
            return None
        rest, self._buffer = bytes(self._buffer), bytearray()
        return rest


def rfc3339_to_ns(stamp: str) -> int:
    """Nanoseconds since the epoch of an RFC 3339 time with up to 9 fraction digits ("...Z" or "...+hh:mm").

    Log timestamps cannot be compared as strings: RFC3339Nano drops trailing zeros of the fraction.
    Raises ValueError if `stamp` is not such a time.
    """
    if stamp.endswith(("Z", "z")):
        body, zone = stamp[:-1], "+00:00"
    else:
        body, zone = stamp[:-6], stamp[-6:]
    body, _, fraction = body.partition(".")
    if fraction and not fraction.isdigit():
        raise ValueError(f"not an RFC 3339 time: {stamp!r}")
    moment = datetime.fromisoformat(body + zone)
    return calendar.timegm(moment.utctimetuple()) * 1_000_000_000 + int(fraction[:9].ljust(9, "0"))


def ns_to_rfc3339(ns: int) -> str:
    """Whole seconds, UTC ("2024-05-01T12:00:00Z"): the precision the log endpoint's sinceTime keeps."""
    return datetime.fromtimestamp(ns // 1_000_000_000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def split_log_line(line: bytes) -> tuple[str, str]:
    """(timestamp, text) of a line of `timestamps=true` logs; timestamp "" if the line has none."""
    stamp, space, text = line.partition(b" ")
    if not space or not stamp[:1].isdigit():
        return "", line.decode("utf-8", errors="replace")
    return stamp.decode("ascii", errors="replace"), text.decode("utf-8", errors="replace")
