"""The waiter's HTTP client to the daemon: a POST over HTTP/1.0 (or HTTPS) that carries a munge
credential bound to the request, the daemon's error answers, and the jittered backoff every part
of the waiter retries with. Hand-written on purpose: http.client would cost this short-lived
process ~20 ms of imports at every job start. Used by the batch waiter (attach), the task proxy
(task) and the step-output relay (relay), which speaks chunked HTTP/1.1 with the helpers here."""

from __future__ import annotations

import json
import os
import socket

from bridge.core.waiter_protocol import request_digest
from bridge.waiter import munge

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import IO, Any, Protocol

    PostAction = Callable[[str, dict[str, Any], float | None], IO[bytes]]
    """A POST of one action of the waiter's job (`attach`, `signal`, `step-done`...): body, timeout."""

    class ByteReader(Protocol):
        """What an answer is read from: a buffered file of the socket, or an unbuffered one."""

        def readline(self, size: int = -1, /) -> bytes: ...

        def read(self, size: int = -1, /) -> bytes | None: ...

        def close(self) -> None: ...

DEFAULT_API_URL = "http://127.0.0.1:8470"
RECONNECT_BASE_S, RECONNECT_CAP_S = 0.1, 5.0

class DaemonError(OSError):
    """The daemon answered with an HTTP error status (5xx: retry; 4xx: refused for good)."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"HTTP {status}: {text}")
        self.status, self.text = status, text


def reconnect_delay(attempt: int) -> float:
    """Jittered exponential backoff: thousands of waiters must not retry in step after an outage.
    os.urandom, not random: that module's import costs every job start."""
    jitter = 0.5 + int.from_bytes(os.urandom(2), "big") / 65536  # in [0.5, 1.5)
    return min(RECONNECT_CAP_S, RECONNECT_BASE_S * 2 ** min(attempt, 10)) * jitter


def split_url(url: str) -> tuple[str, str, int]:
    """`http[s]://host[:port][/]` -> (scheme, host, port); an IPv6 host is written in brackets,
    `[fd00::1]` or `[fd00::1]:8470`, and comes back without them."""
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower() if sep else "http"
    rest = (rest if sep else url).rstrip("/")
    if rest.startswith("["):
        host, _, after = rest[1:].partition("]")
        port = after[1:] if after.startswith(":") else ""
    else:
        host, _, port = rest.rpartition(":") if rest.count(":") == 1 else (rest, "", "")
    return scheme, host or "127.0.0.1", int(port) if port else (443 if scheme == "https" else 80)


def host_header(host: str, port: int) -> str:
    """The Host header's value: an IPv6 address in brackets, as in the URL."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def post(
    url: tuple[str, str, int], path: str, job_id: int, body: dict[str, Any], timeout: float | None,
    ca_file: str | None = None,
) -> IO[bytes]:
    """POST JSON over HTTP/1.0 (so the answer streams unchunked until the server closes), with a
    munge credential bound to this request; return the body as a binary file positioned after the
    headers."""
    _, host, port = url
    data = json.dumps(body).encode()
    credential = munge.munge_credential(request_digest("POST", path, job_id, data))
    head = (
        f"POST {path} HTTP/1.0\r\nHost: {host_header(host, port)}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nX-Munge-Credential: {credential}\r\n\r\n"
    ).encode()
    sock = connect(url, 10, ca_file)
    sock.settimeout(timeout)
    sock.sendall(head + data)
    reader = sock.makefile("rb")
    sock.close()  # the file keeps the connection open until it is closed itself
    status_line = reader.readline().split()
    if len(status_line) < 2 or not status_line[1].isdigit():
        reader.close()
        raise OSError(f"bad HTTP answer from the bridge: {status_line!r}")
    while reader.readline() not in (b"\r\n", b"\n", b""):
        pass  # headers: nothing in them matters here
    status = int(status_line[1])
    if status != 200:
        text = reader.read().decode(errors="replace").strip()
        reader.close()
        raise DaemonError(status, text)
    return reader


def connect(url: tuple[str, str, int], timeout: float, ca_file: str | None) -> socket.socket:
    """A connection to the daemon, TLS when the URL is https://."""
    scheme, host, port = url
    sock = socket.create_connection((host, port), timeout=timeout)
    # Long streams (a step's output, an attach) notice a peer that vanished without a FIN.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 6)):
        if hasattr(socket, option):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
    if scheme == "https":
        import ssl  # only when the daemon serves TLS: its import costs start-up time

        context = ssl.create_default_context(cafile=ca_file)
        sock = context.wrap_socket(sock, server_hostname=host)
    sock.settimeout(timeout)
    return sock


def json_object(line: bytes) -> dict[str, Any]:
    """A JSON object the daemon answered, or {} for anything else."""
    try:
        answer = json.loads(line)
    except ValueError:
        return {}
    return answer if isinstance(answer, dict) else {}


def chunk(data: bytes) -> bytes:
    """`data` as one chunk of a chunked HTTP/1.1 body."""
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def read_answer_head(reader: ByteReader) -> tuple[int, bytes]:
    """Status and first line of an answer (chunked when 200, whole otherwise)."""
    status_line = reader.readline().split()
    if len(status_line) < 2 or not status_line[1].isdigit():
        raise OSError(f"bad HTTP answer from the bridge: {status_line!r}")
    chunked, length = False, 0
    while (line := reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        chunked |= name.strip().lower() == "transfer-encoding" and "chunked" in value.lower()
        if name.strip().lower() == "content-length" and value.strip().isdigit():
            length = min(int(value), 65536)
    status = int(status_line[1])
    return status, read_chunk(reader) if chunked else reader.read(length) or b""


def read_chunk(reader: ByteReader) -> bytes:
    """One chunk of a chunked body, from an unbuffered reader."""
    line = reader.readline().strip()
    try:
        size = int(line or b"0", 16)
    except ValueError:
        raise OSError(f"bad chunk from the bridge: {line[:40]!r}") from None
    data = b""
    while len(data) < size:  # the reader is unbuffered: a read returns what has arrived
        more = reader.read(size - len(data))
        if not more:
            raise OSError("the bridge's answer was cut off")
        data += more
    reader.readline()
    return data
