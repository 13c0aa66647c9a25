"""The slurmrestd client against a small local stand-in server: polling, token rotation, retries.

(The contract tests in tests/contract run it against the real slurmrestd.)
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from bridge.clients.slurm import rest
from bridge.clients.slurm.rest import RestSlurmClient
from bridge.core.errors import SlurmAuthError

DATA = Path(__file__).parent / "data" / "rest_job_running.json"


class FakeRestd:
    def __init__(self) -> None:
        self.last_update = 1000
        self.jobs: list[dict[str, Any]] = [json.loads(DATA.read_text())]
        self.valid_token = "good"
        self.failures_left = 0
        self.requests: list[tuple[str, str, str]] = []

    async def jobs_handler(self, request: web.Request) -> web.Response:
        token = request.headers.get("X-SLURM-USER-TOKEN", "")
        self.requests.append((request.method, request.path, request.query.get("update_time", "")))
        if token != self.valid_token:
            return web.json_response({"errors": [{"error": "auth"}]}, status=401)
        if self.failures_left:
            self.failures_left -= 1
            return web.json_response({"errors": [{"error": "busy"}]}, status=503)
        since = int(request.query.get("update_time", "0"))
        if since >= self.last_update:
            return web.json_response({
                "jobs": [], "last_update": {"set": True, "number": 0},
                "warnings": [{"description": f"No job changes since update_time[{since}]"}],
            })
        return web.json_response({"jobs": self.jobs, "last_update": {"set": True, "number": self.last_update},
                                  "warnings": [], "errors": []})


@pytest.fixture
async def restd(tmp_path: Path) -> AsyncIterator[tuple[FakeRestd, str]]:
    fake = FakeRestd()
    app = web.Application()
    app.router.add_get("/slurm/v0.0.45/jobs/", fake.jobs_handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield fake, f"http://127.0.0.1:{port}"
    await runner.cleanup()


def _client(url: str, tmp_path: Path, token: str = "good") -> tuple[RestSlurmClient, Path]:
    token_file = tmp_path / "jwt"
    token_file.write_text(f"SLURM_JWT={token}\n")
    return RestSlurmClient(url, "slurm", token_file), token_file


async def test_polls_list_jobs_once_per_change_and_none_in_between(
    restd: tuple[FakeRestd, str], tmp_path: Path
) -> None:
    fake, url = restd
    client, _ = _client(url, tmp_path)

    first = await client.changed_jobs()
    recheck = await client.changed_jobs()  # once the second of the last change is over
    idle = await client.changed_jobs()
    fake.last_update = 1001
    changed = await client.changed_jobs()
    await client.close()

    assert first is not None and [j.job_id for j in first.jobs] == [fake.jobs[0]["job_id"]]
    assert recheck is not None, "a change later in the same second as the last read is not lost"
    assert idle is None
    assert changed is not None and len(changed.jobs) == 1
    assert [q for _, _, q in fake.requests[:3]] == ["0", "999", "1000"], "slurmctld's clock, not ours"


async def test_a_bad_record_is_skipped_and_other_partitions_are_never_parsed(
    restd: tuple[FakeRestd, str], tmp_path: Path
) -> None:
    fake, url = restd
    good = fake.jobs[0]  # partition "sim"
    # GPU gres without its File= indices (the real-world case) makes the record unparseable.
    broken_elsewhere = {**good, "job_id": 7, "partition": "gpu", "gres_detail": ["gpu:2"]}
    broken_here = {**good, "job_id": 8, "gres_detail": ["gpu:2"]}
    fake.jobs = [broken_elsewhere, good, broken_here]
    client, _ = _client(url, tmp_path)

    listing = await client.changed_jobs({"sim"})
    await client.close()

    assert listing is not None
    assert [j.job_id for j in listing.jobs] == [good["job_id"]], "one bad record must not hide the others"
    assert listing.unreadable == {8}, "a bad record of ours is listed (not gone), just unreadable"
    assert listing.read_at > 0


async def test_records_carry_when_they_were_asked_for_and_their_run(
    restd: tuple[FakeRestd, str], tmp_path: Path
) -> None:
    fake, url = restd
    fake.jobs = [{**fake.jobs[0], "restart_cnt": 2}]
    client, _ = _client(url, tmp_path)

    before = time.monotonic()
    listing = await client.changed_jobs()
    await client.close()

    assert listing is not None
    (job,) = listing.jobs
    assert job.run == 2
    assert before <= job.read_at == listing.read_at <= time.monotonic()


async def test_a_rotated_token_file_is_read_again_after_a_401(
    restd: tuple[FakeRestd, str], tmp_path: Path
) -> None:
    fake, url = restd
    client, token_file = _client(url, tmp_path, token="old")
    token_file.write_text("new\n")
    fake.valid_token = "new"

    jobs = await client.changed_jobs()
    await client.close()

    assert jobs is not None


async def test_a_refused_token_is_a_permanent_error_naming_the_file(
    restd: tuple[FakeRestd, str], tmp_path: Path
) -> None:
    _fake, url = restd
    client, token_file = _client(url, tmp_path, token="wrong")

    with pytest.raises(SlurmAuthError, match=str(token_file)):
        await client.changed_jobs()
    await client.close()


async def test_reads_ride_out_a_short_slurmrestd_outage(restd: tuple[FakeRestd, str], tmp_path: Path) -> None:
    fake, url = restd
    fake.failures_left = 2
    client, _ = _client(url, tmp_path)

    jobs = await client.changed_jobs()
    await client.close()

    assert jobs is not None
    assert len(fake.requests) == 3


async def test_a_big_listing_is_parsed_off_the_event_loop(
    restd: tuple[FakeRestd, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 11, item 3: at 10,000 jobs parsing a listing takes seconds, which on the event loop
    would stall every attach, relay and Lease renewal; in a thread, its Python code lets the loop
    run between its steps."""
    fake, url = restd
    fake.jobs = [{**fake.jobs[0], "job_id": 5000 + i} for i in range(400)]
    on_loop: list[bool] = []
    parse = rest.allocation_from_rest

    def recording_parse(raw: Any, read_at: float) -> Any:
        on_loop.append(threading.current_thread() is threading.main_thread())
        return parse(raw, read_at)

    monkeypatch.setattr(rest, "allocation_from_rest", recording_parse)
    client, _ = _client(url, tmp_path)
    listing = await client.changed_jobs()
    await client.close()

    assert listing is not None and len(listing.jobs) == 400
    assert len(on_loop) == 400 and not any(on_loop)
