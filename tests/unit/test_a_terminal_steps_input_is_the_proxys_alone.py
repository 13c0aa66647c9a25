"""srun --pty into a bridged job (issue 18): what is typed reaches the task's terminal in the pod
only in frames signed under the key the proxy's munge credential carried, in order; window sizes
become the exec protocol's resize messages; anything else ends the input."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import structlog

from bridge.core.waiter_protocol import sign_output_frame
from bridge.manager.user_steps_api import _read_terminal

KEY = b"k" * 32


def _feed(frames: list[bytes], end: bool = True) -> list[tuple[int, bytes]]:
    async def run() -> list[tuple[int, bytes]]:
        content = asyncio.StreamReader()
        for frame in frames:
            content.feed_data(frame)
        if end:
            content.feed_eof()
        terminal: asyncio.Queue[tuple[int, bytes]] = asyncio.Queue()
        await asyncio.wait_for(_read_terminal(SimpleNamespace(content=content), KEY, terminal,  # type: ignore[arg-type]
                                              structlog.get_logger()), timeout=5)
        got = []
        while not terminal.empty():
            got.append(terminal.get_nowait())
        return got

    return asyncio.run(run())


def test_typed_bytes_and_window_sizes_reach_the_pods_terminal_in_order() -> None:
    frames = [sign_output_frame(KEY, 0, 0, b"ls\r"),
              sign_output_frame(KEY, 1, 3, b'{"rows": 40, "cols": 120}'),
              sign_output_frame(KEY, 2, 0, b"\x03")]
    got = _feed(frames)
    assert got[0] == (0, b"ls\r")
    assert got[1][0] == 4 and json.loads(got[1][1]) == {"Width": 120, "Height": 40}
    assert got[2] == (0, b"\x03")


def test_a_frame_not_signed_with_the_requests_key_ends_the_input() -> None:
    forged = sign_output_frame(b"x" * 32, 1, 0, b"rm -rf ~\r")
    frames = [sign_output_frame(KEY, 0, 0, b"a"), forged, sign_output_frame(KEY, 2, 0, b"b")]
    assert _feed(frames) == [(0, b"a")]


def test_a_replayed_or_reordered_frame_ends_the_input() -> None:
    first = sign_output_frame(KEY, 0, 0, b"a")
    assert _feed([first, first]) == [(0, b"a")]
    assert _feed([sign_output_frame(KEY, 1, 0, b"b")]) == []


def test_an_empty_input_frame_is_the_end_and_other_kinds_are_refused() -> None:
    assert _feed([sign_output_frame(KEY, 0, 0, b""), sign_output_frame(KEY, 1, 0, b"late")]) == []
    assert _feed([sign_output_frame(KEY, 0, 1, b"output is not input")]) == []
    assert _feed([sign_output_frame(KEY, 0, 3, b"not json")]) == []
