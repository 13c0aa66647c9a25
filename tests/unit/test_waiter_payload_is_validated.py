"""The waiter's JSON payload is validated field by field and survives a round trip."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.core.model import JobPayload, ModelError, payload_from_json, payload_to_json

GOOD: dict[str, Any] = {
    "script": "#!/bin/sh\necho hi\n",
    "environment": {"HOME": "/home/alice", "SLURM_JOB_ID": "5"},
    "work_dir": "/home/alice",
    "uid": 1000,
    "gid": 1000,
}


def test_round_trip() -> None:
    payload = payload_from_json(GOOD)
    assert payload == JobPayload(GOOD["script"], GOOD["environment"], "/home/alice", 1000, 1000)
    assert payload_to_json(payload) == {**GOOD, "output_merged": True}  # what an older waiter meant


def test_a_waiter_says_whether_stdout_and_stderr_share_one_file() -> None:
    assert payload_from_json({**GOOD, "output_merged": False}).output_merged is False
    with pytest.raises(ModelError, match="output_merged"):
        payload_from_json({**GOOD, "output_merged": "yes"})


def test_extra_fields_of_the_attach_request_are_ignored() -> None:
    assert payload_from_json({**GOOD, "last_log": {}, "cancel": False}).uid == 1000


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"script": ""}, "payload.script"),
        ({"script": None}, "payload.script"),
        ({"environment": {"A": 1}}, "payload.environment"),
        ({"environment": ["A=1"]}, "payload.environment"),
        ({"work_dir": "relative"}, "payload.work_dir"),
        ({"uid": -1}, "payload.uid"),
        ({"uid": True}, "payload.uid"),
        ({"gid": "1000"}, "payload.gid"),
    ],
)
def test_bad_fields_are_named(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ModelError, match=message):
        payload_from_json({**GOOD, **change})


def test_non_object_is_rejected() -> None:
    with pytest.raises(ModelError, match="JSON object"):
        payload_from_json(["script"])
