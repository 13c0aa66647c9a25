"""bridge/core/json_text.py: orjson's speed, the standard library's answers, for what the API
servers send and for what orjson alone would refuse."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bridge.core import json_text

DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("*.json")))
def test_every_recorded_answer_decodes_to_what_json_loads_gives(name: str) -> None:
    raw = (DATA / name).read_bytes()

    assert json_text.loads(raw) == json.loads(raw)
    assert json_text.loads(raw.decode()) == json.loads(raw)


@pytest.mark.parametrize("raw", [
    b'{"cpus": NaN, "limit": Infinity}',  # json's extensions, which orjson refuses
    b'[-Infinity]',
])
def test_what_orjson_refuses_is_decoded_as_json_decodes_it(raw: bytes) -> None:
    decoded = json_text.loads(raw)

    assert repr(decoded) == repr(json.loads(raw))


def test_64_bit_integers_stay_exact_and_only_larger_ones_become_floats() -> None:
    """Slurm's NO_VAL64 and INFINITE64 and Go's int64 extremes are exact ints, as with json; only
    an integer no API server can send reads as a float (the documented difference)."""
    edges = [18446744073709551615, 18446744073709551614, 9223372036854775807, -9223372036854775808, 0]

    assert json_text.loads(json.dumps(edges)) == edges
    assert all(type(value) is int for value in json_text.loads(json.dumps(edges)))
    assert json_text.loads(b"[18446744073709551616]") == [float(18446744073709551616)]


@pytest.mark.parametrize("raw", [b"", b"{", b'{"a": 1} trailing', b"\xff\xfe", "{'single': 1}"])
def test_what_is_not_json_raises_the_value_error_json_raises(raw: bytes | str) -> None:
    with pytest.raises(ValueError) as expected:
        json.loads(raw)
    with pytest.raises(ValueError) as raised:
        json_text.loads(raw)

    assert type(raised.value) is type(expected.value)


def test_orjson_does_the_work_for_valid_json(monkeypatch: pytest.MonkeyPatch) -> None:
    """The standard library is only the fallback: a valid answer never reaches it."""
    def refuse(raw: object) -> object:
        raise AssertionError("json.loads was used for valid JSON")

    monkeypatch.setattr(json_text.json, "loads", refuse)

    assert json_text.loads(b'{"jobs": [{"job_id": 4242}]}') == {"jobs": [{"job_id": 4242}]}
