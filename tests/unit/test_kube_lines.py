"""Line splitting across chunk boundaries and parsing of `timestamps=true` log lines."""

from __future__ import annotations

import pytest

from bridge.clients.kube.lines import LineSplitter, ns_to_rfc3339, rfc3339_to_ns, split_log_line


def split(chunks: list[bytes], max_line: int = 1 << 20) -> list[bytes]:
    splitter = LineSplitter(max_line)
    lines = [line for chunk in chunks for line in splitter.feed(chunk)]
    last = splitter.flush()
    return lines if last is None else [*lines, last]


def test_lines_cut_anywhere_by_chunks_come_out_whole() -> None:
    data = b'{"a": 1}\n{"b": 2}\n\n{"c": "\xc3\xa9"}\n'
    expected = [b'{"a": 1}', b'{"b": 2}', b"", b'{"c": "\xc3\xa9"}']

    for cut in range(len(data) + 1):
        assert split([data[:cut], data[cut:]]) == expected, cut
    assert split([bytes([b]) for b in data]) == expected


def test_a_last_line_without_newline_is_flushed_at_the_end() -> None:
    assert split([b"one\ntw", b"o\nthree"]) == [b"one", b"two", b"three"]


def test_nothing_to_flush_after_a_final_newline() -> None:
    splitter = LineSplitter()
    assert splitter.feed(b"x\n") == [b"x"]
    assert splitter.flush() is None


def test_an_endless_line_is_cut_instead_of_buffered_forever() -> None:
    # What is buffered without a newline never exceeds max_line; a line completed by the
    # next chunk is handed out whole.
    assert split([b"a" * 10, b"b" * 5 + b"\nc"], max_line=4) == [b"aaaa", b"aaaa", b"aabbbbb", b"c"]


def test_chunks_without_newline_accumulate_up_to_the_limit() -> None:
    splitter = LineSplitter(max_line=8)

    assert splitter.feed(b"abcd") == []
    assert splitter.feed(b"efgh") == []
    assert splitter.feed(b"ij") == [b"abcdefgh"]
    assert splitter.flush() == b"ij"


@pytest.mark.parametrize(
    ("stamp", "ns"),
    [
        ("1970-01-01T00:00:00Z", 0),
        ("1970-01-01T00:00:01.5Z", 1_500_000_000),
        ("1970-01-01T00:00:01.000000001Z", 1_000_000_001),
        ("1970-01-01T01:00:01.25+01:00", 1_250_000_000),
        ("2024-05-01T12:00:00.123456789Z", 1_714_564_800_123_456_789),
    ],
)
def test_rfc3339_nano_parses_to_integer_nanoseconds(stamp: str, ns: int) -> None:
    assert rfc3339_to_ns(stamp) == ns


def test_trimmed_fractions_compare_correctly_where_strings_would_not() -> None:
    shorter, longer = "2024-05-01T12:00:00.1234Z", "2024-05-01T12:00:00.12345Z"

    assert shorter > longer  # as strings: wrong
    assert rfc3339_to_ns(shorter) < rfc3339_to_ns(longer)


@pytest.mark.parametrize("bad", ["", "yesterday", "2024-05-01T12:00:00.abcZ"])
def test_bad_times_raise_value_error(bad: str) -> None:
    with pytest.raises(ValueError):
        rfc3339_to_ns(bad)


def test_seconds_for_the_server_are_truncated_utc() -> None:
    assert ns_to_rfc3339(rfc3339_to_ns("2024-05-01T12:00:05.999Z")) == "2024-05-01T12:00:05Z"


def test_log_lines_split_into_timestamp_and_text() -> None:
    stamp = "2024-05-01T12:00:00.1Z"
    assert split_log_line(f"{stamp} hello  world ".encode()) == (stamp, "hello  world ")
    assert split_log_line(f"{stamp} ".encode()) == (stamp, "")
    assert split_log_line(f"{stamp} caf\u00e9".encode()) == (stamp, "caf\u00e9")


def test_log_lines_without_a_timestamp_keep_their_text() -> None:
    assert split_log_line(b"no-stamp here") == ("", "no-stamp here")
    assert split_log_line(b"") == ("", "")
