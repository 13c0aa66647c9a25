"""The API parses the waiters' bodies with strict, closed pydantic models (manager/bodies.py): a
field no waiter ever sent, or a value of the wrong kind, is refused with the endpoint's own 400
message, as before; every body a waiter sends, old or new, still fits."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from bridge.controller.metrics import Metrics
from bridge.controller.step_streams import StepStreams
from bridge.controller.tasks import Tasks
from bridge.core.model import JobAllocation
from bridge.core.waiter_protocol import request_digest
from bridge.manager.api import Api
from bridge.manager.bodies import (
    AttachBody,
    BadBody,
    SignalBody,
    StepDoneBody,
    TaskBody,
    TaskSignalBody,
    parse,
)

from .builders import allocation, config

USR1 = int(signal.SIGUSR1)
UNMUNGE_OK = (
    "import sys\nsys.stdout.write('UID: alice (1000)\\nGID: users (100)\\n\\n' + sys.stdin.read())\n"
)


class Controller:
    """The controller as the API sees it (controller.facade), recording what it is handed."""

    def __init__(self) -> None:
        self.cfg = config()
        self.taken: list[tuple[int, int, int | None]] = []
        self.finished: list[tuple[int, str, int, int | None]] = []
        self.tasks = Tasks(self, self)  # type: ignore[arg-type]
        self.step_streams = StepStreams(self, self)  # type: ignore[arg-type]

    async def read_job(self, job_id: int) -> JobAllocation:
        return allocation(job_id=job_id)

    def record_job(self, _alloc: JobAllocation) -> None:
        pass

    def is_bridged(self, _alloc: JobAllocation) -> bool:
        return True

    def signal_batch_script(self, job_id: int, signum: int, seq: int | None) -> bool:
        self.taken.append((job_id, signum, seq))
        return True

    async def finish_step(self, job_id: int, key: str, code: int, run: int | None = None) -> None:
        self.finished.append((job_id, key, code, run))

    def step_of(self, _job_id: int, key: str) -> dict[str, Any] | None:
        return {"argv": ["--", "true"], "env": {}, "cwd": "/"} if key == "7" else None


async def _post(tmp_path: Path, controller: Controller, path: str, body: Any) -> tuple[int, str]:
    script = tmp_path / "unmunge.py"
    script.write_text(UNMUNGE_OK)
    api = Api(controller, Metrics(), lambda _: None, lambda: True,  # type: ignore[arg-type]
              (sys.executable, str(script)))
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with TestClient(TestServer(api.app())) as client:
        response = await client.post(path, data=raw, headers={
            "X-Munge-Credential": request_digest("POST", path, 42, raw)})
        return response.status, await response.text()


@pytest.mark.parametrize("body", [
    {"signal": USR1, "seq": 3},
    {"signal": USR1},  # a waiter older than sequence numbers
])
async def test_the_bodies_waiters_send_for_a_batch_signal_are_taken(tmp_path: Path, body: Any) -> None:
    controller = Controller()

    status, text = await _post(tmp_path, controller, "/v1/jobs/42/signal", body)

    assert status == 200, text
    assert controller.taken == [(42, USR1, body.get("seq"))]


@pytest.mark.parametrize("body", [
    {"signal": USR1, "seq": 3, "extra": 1},
    {"signal": str(USR1)},
    {"signal": True},
    {"signal": 9},
    {"signal": USR1, "seq": 0},
    [USR1],
    b"not json",
])
async def test_a_crafted_batch_signal_is_refused_with_its_message(tmp_path: Path, body: Any) -> None:
    controller = Controller()

    status, text = await _post(tmp_path, controller, "/v1/jobs/42/signal", body)

    assert status == 400
    assert text.startswith("signal must be one of ")
    assert controller.taken == []


async def test_a_step_end_takes_the_key_as_text_or_number(tmp_path: Path) -> None:
    controller = Controller()

    as_text = await _post(tmp_path, controller, "/v1/jobs/42/step-done", {"key": "007", "code": 3})
    as_number = await _post(tmp_path, controller, "/v1/jobs/42/step-done", {"key": 8, "code": 0})

    assert as_text[0] == as_number[0] == 200
    with_run = await _post(tmp_path, controller, "/v1/jobs/42/step-done", {"key": "9", "code": 1, "run": 2})
    assert with_run[0] == 200
    assert controller.finished == [(42, "7", 3, None), (42, "8", 0, None), (42, "9", 1, 2)]


@pytest.mark.parametrize("body", [
    {"key": "7"}, {"code": 1}, {"key": "seven", "code": 1}, {"key": "7", "code": "1"},
    {"key": "7", "code": 1, "pod": "slurm-43-0"}, {"key": True, "code": 1},
])
async def test_a_crafted_step_end_is_refused_with_its_message(tmp_path: Path, body: Any) -> None:
    controller = Controller()

    status, text = await _post(tmp_path, controller, "/v1/jobs/42/step-done", body)

    assert (status, text) == (400, "step-done needs key and code")
    assert controller.finished == []


async def test_a_task_signal_with_a_field_no_waiter_sends_is_refused(tmp_path: Path) -> None:
    body = {"key": "7", "procid": "0", "node": "kube1", "signal": USR1, "pid": 1}

    status, text = await _post(tmp_path, Controller(), "/v1/jobs/42/task-signal", body)

    assert (status, text) == (400, "task-signal needs key, procid, node and signal")


async def test_an_attach_with_a_field_no_waiter_sends_is_refused(tmp_path: Path) -> None:
    body = {"script": "#!/bin/sh\ntrue\n", "environment": {}, "work_dir": "/tmp", "uid": 1000, "gid": 100,
            "privileged": True}

    status, text = await _post(tmp_path, Controller(), "/v1/jobs/42/attach", body)

    assert status == 400
    assert text.startswith("bad attach request: ") and "privileged" in text


async def test_an_attach_keeps_naming_the_bad_payload_field(tmp_path: Path) -> None:
    body = {"script": "", "environment": {}, "work_dir": "/tmp", "uid": 1000, "gid": 100}

    status, text = await _post(tmp_path, Controller(), "/v1/jobs/42/attach", body)

    assert (status, text) == (400, "bad attach request: payload.script must be a non-empty string")


def test_task_ids_are_kept_as_canonical_decimal_text() -> None:
    body = parse(TaskSignalBody, b'{"key": 7, "procid": "03", "node": "kube1", "signal": 10}')

    assert (body.key, body.procid) == ("7", "3")
    with pytest.raises(BadBody):
        parse(StepDoneBody, b'{"key": 1.5, "code": 0}')


def test_bytes_that_are_not_utf8_reach_the_daemon_as_the_waiter_sent_them() -> None:
    """The waiter reads a script, a path or a variable that is not UTF-8 with surrogateescape, and
    json.dumps writes each such byte as a lone surrogate (\\udcXX): a Latin-1 submit directory or
    job name must not cost the job its start (translate makes them U+FFFD in the pod)."""
    attach = json.dumps({"script": "#!/bin/sh\necho caf\udce9\n", "environment": {"X": "caf\udce9"},
                         "work_dir": "/home/alice/r\udce9sum\u00e9", "uid": 1000, "gid": 100}).encode()
    task = json.dumps({"key": "7", "node": "kreal1", "env": {"SLURM_JOB_NAME": "r\udce9sum"}}).encode()

    body = parse(AttachBody, attach)

    assert body.environment == {"X": "caf\udce9"} and body.work_dir == "/home/alice/r\udce9sum\u00e9"
    assert parse(TaskBody, task).env == {"SLURM_JOB_NAME": "r\udce9sum"}


@pytest.mark.parametrize("raw", [b"[" * 100_000 + b"]" * 100_000, b"\xff\xfe{}", b"{", b""])
def test_what_is_not_a_json_object_is_a_bad_body_not_a_crash(raw: bytes) -> None:
    with pytest.raises(BadBody):
        parse(SignalBody, raw)
