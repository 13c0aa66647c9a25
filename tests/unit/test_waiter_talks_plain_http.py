"""The waiter's tiny HTTP/1.0 client and script extraction, against a local socket server."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator

import pytest

from bridge.core import wellknown
from bridge.core.waiter_protocol import request_digest
from bridge.waiter import attach as waiter
from bridge.waiter import http_client, munge


def test_original_script_is_what_follows_the_marker() -> None:
    rewritten = f"#!/bin/sh\nexec attach \"$0\"\n{wellknown.ATTACH_MARKER}\n#!/bin/bash\necho hi\n"
    assert waiter.original_script(rewritten) == "#!/bin/bash\necho hi\n"


def test_a_script_without_marker_is_refused() -> None:
    with pytest.raises(ValueError, match=r"job_submit\.lua"):
        waiter.original_script("#!/bin/sh\necho hi\n")


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://127.0.0.1:8470", ("http", "127.0.0.1", 8470)),
        ("http://bridge.example:9000/", ("http", "bridge.example", 9000)),
        ("http://[::1]:8470", ("http", "::1", 8470)),
        ("http://host", ("http", "host", 80)),
        ("https://bridge.example", ("https", "bridge.example", 443)),
        ("HTTPS://bridge.example:8443/", ("https", "bridge.example", 8443)),
        # IPv6 literals, which the config accepts as api_url: with and without a port.
        ("https://[fd00::1]", ("https", "fd00::1", 443)),
        ("http://[fd00::1]/", ("http", "fd00::1", 80)),
        ("https://[fd00::1]:8443", ("https", "fd00::1", 8443)),
    ],
)
def test_split_url(url: str, expected: tuple[str, int]) -> None:
    assert http_client.split_url(url) == expected


def test_the_host_header_writes_an_ipv6_address_in_brackets() -> None:
    assert http_client.host_header("fd00::1", 8470) == "[fd00::1]:8470"
    assert http_client.host_header("bridge.example", 443) == "bridge.example:443"


@pytest.fixture
def one_shot_server() -> Iterator[tuple[int, dict[str, bytes]]]:
    """Answers one request with a streamed NDJSON body, like aiohttp does for HTTP/1.0."""
    listener = socket.create_server(("127.0.0.1", 0))
    seen: dict[str, bytes] = {}

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            while len(body) < length:
                body += conn.recv(65536)
            seen["head"], seen["body"] = head, body
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: application/x-ndjson\r\n\r\n")
            for event in ({"type": "log", "pod": 0, "ts": "t1", "line": "a"},
                          {"type": "exit", "code": 3, "signal": None}):
                conn.sendall(json.dumps(event).encode() + b"\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[1], seen
    thread.join(timeout=5)
    listener.close()


def test_post_streams_the_answer_line_by_line(
    one_shot_server: tuple[int, dict[str, bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    port, seen = one_shot_server
    payloads: list[str] = []

    def fake_munge(payload: str) -> str:
        payloads.append(payload)
        return "MUNGE:cred"

    monkeypatch.setattr(munge, "munge_credential", fake_munge)

    with http_client.post(("http", "127.0.0.1", port), "/v1/jobs/7/attach", 7, {"x": 1}, timeout=5) as stream:
        lines = [json.loads(line) for line in stream]

    assert [e["type"] for e in lines] == ["log", "exit"]
    assert seen["head"].startswith(b"POST /v1/jobs/7/attach HTTP/1.0\r\n")
    assert b"X-Munge-Credential: MUNGE:cred" in seen["head"]
    assert json.loads(seen["body"]) == {"x": 1}
    # The credential carries the digest of exactly the request that was sent.
    assert payloads == [request_digest("POST", "/v1/jobs/7/attach", 7, seen["body"])]
