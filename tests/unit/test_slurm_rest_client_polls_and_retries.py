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

from bridge.clients.slurm import job_listing, rest
from bridge.clients.slurm.rest import RestSlurmClient
from bridge.core.errors import SlurmAuthError

DATA = Path(__file__).parent / "data" / "rest_job_running.json"


class FakeRestd:
    def __init__(self) -> None:
        self.jobs: list[dict[str, Any]] = [json.loads(DATA.read_text())]
        self.valid_token = "good"
        self.failures_left = 0
        self.requests: list[tuple[str, str, str]] = []

    def _refusal(self, request: web.Request) -> web.Response | None:
        self.requests.append((request.method, request.path, request.query.get("update_time", "")))
        if request.headers.get("X-SLURM-USER-TOKEN", "") != self.valid_token:
            return web.json_response({"errors": [{"error": "auth"}]}, status=401)
        if self.failures_left:
            self.failures_left -= 1
            return web.json_response({"errors": [{"error": "busy"}]}, status=503)
        return None

    async def jobs_handler(self, request: web.Request) -> web.Response:
        if (refused := self._refusal(request)) is not None:
            return refused
        return web.json_response({"jobs": self.jobs, "last_update": {"set": True, "number": 1000},
                                  "warnings": [], "errors": []})

    async def states_handler(self, request: web.Request) -> web.Response:
        """slurmctld's printed ids: "N" for a plain job, "N_T" for task T of an array."""
        if (refused := self._refusal(request)) is not None:
            return refused
        states = []
        for job in self.jobs:
            task = (job.get("array_task_id") or {})
            printed = f"{job['job_id']}_{task['number']}" if task.get("set") else str(job["job_id"])
            states.append({"job_id": printed, "state": job.get("job_state") or []})
        return web.json_response({"jobs": states, "warnings": [], "errors": []})

    async def job_handler(self, request: web.Request) -> web.Response:
        if (refused := self._refusal(request)) is not None:
            return refused
        wanted = int(request.match_info["job_id"])
        return web.json_response({"jobs": [job for job in self.jobs if job["job_id"] == wanted],
                                  "warnings": [], "errors": []})

    def paths(self) -> list[str]:
        return [path.removeprefix("/slurm/v0.0.45") for _, path, _ in self.requests]


@pytest.fixture
async def restd(tmp_path: Path) -> AsyncIterator[tuple[FakeRestd, str]]:
    fake = FakeRestd()
    app = web.Application()
    app.router.add_get("/slurm/v0.0.45/jobs/", fake.jobs_handler)
    app.router.add_get("/slurm/v0.0.45/jobs/state/", fake.states_handler)
    app.router.add_get("/slurm/v0.0.45/job/{job_id}", fake.job_handler)
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


async def test_the_first_poll_lists_everything_then_only_changed_jobs_are_read(
    restd: tuple[FakeRestd, str], tmp_path: Path
) -> None:
    """Issue 11: after any change `GET /jobs/` returns every job (~27 KB each in v0.0.45: 16 MB
    for 600 jobs held the loop for seconds and cost the Lease). The poll reads job states and
    then only the jobs whose state changed."""
    fake, url = restd
    running = fake.jobs[0]
    fake.jobs = [running, *({**running, "job_id": 5000 + i} for i in range(50))]
    client, _ = _client(url, tmp_path)

    first = await client.changed_jobs({"sim"})
    fake.requests.clear()
    idle = await client.changed_jobs({"sim"})
    fake.jobs[7] = {**fake.jobs[7], "job_state": ["SUSPENDED"]}
    fake.jobs.append({**running, "job_id": 6000, "job_state": ["PENDING"]})
    changed = await client.changed_jobs({"sim"})
    await client.close()

    assert first is not None and len(first.jobs) == 51
    assert idle is None
    assert changed is not None
    assert {job.job_id: job.state for job in changed.jobs}[5006] == "SUSPENDED"
    assert len(changed.jobs) == 52, "the listing stays complete: unchanged jobs keep their view"
    assert sorted(fake.paths()) == ["/job/5006", "/job/6000", "/jobs/state/", "/jobs/state/"]


async def test_a_job_that_leaves_slurmctld_leaves_the_listing(
    restd: tuple[FakeRestd, str], tmp_path: Path
) -> None:
    fake, url = restd
    fake.jobs = [fake.jobs[0], {**fake.jobs[0], "job_id": 77}]
    client, _ = _client(url, tmp_path)

    await client.changed_jobs({"sim"})
    del fake.jobs[1]
    after = await client.changed_jobs({"sim"})
    await client.close()

    assert after is not None and [job.job_id for job in after.jobs] == [fake.jobs[0]["job_id"]]


async def test_jobs_of_other_partitions_are_read_again_only_until_they_leave_pending(
    restd: tuple[FakeRestd, str], tmp_path: Path
) -> None:
    """A pending job's partition may still change (`scontrol update Partition=`), so it is read
    when its state changes; once it ran elsewhere it can never be ours and is not read again."""
    fake, url = restd
    elsewhere = {**fake.jobs[0], "job_id": 90, "partition": "cpu", "job_state": ["PENDING"]}
    moved = {**fake.jobs[0], "job_id": 91, "partition": "cpu", "job_state": ["PENDING"]}
    fake.jobs = [elsewhere, moved]
    client, _ = _client(url, tmp_path)

    first = await client.changed_jobs({"sim"})
    moved_here = {**moved, "partition": "sim", "job_state": ["RUNNING"]}
    fake.jobs = [{**elsewhere, "job_state": ["RUNNING"]}, moved_here]
    fake.requests.clear()
    started = await client.changed_jobs({"sim"})
    fake.jobs = [{**elsewhere, "job_state": ["SUSPENDED"]}, moved_here]
    reads_before = len(fake.requests)
    ended_elsewhere = await client.changed_jobs({"sim"})
    await client.close()

    assert first is not None and first.jobs == ()
    assert started is not None and [job.job_id for job in started.jobs] == [91]
    assert sorted(fake.paths()[:reads_before]) == ["/job/90", "/job/91", "/jobs/state/"]
    assert fake.paths()[reads_before:] == ["/jobs/state/"], "job 90 ran elsewhere: never read again"
    assert ended_elsewhere is not None and [job.job_id for job in ended_elsewhere.jobs] == [91]


async def test_a_job_that_could_not_be_read_is_read_at_the_next_poll(
    restd: tuple[FakeRestd, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, url = restd
    monkeypatch.setattr(rest, "GET_ATTEMPTS", 1)
    client, _ = _client(url, tmp_path)
    await client.changed_jobs({"sim"})
    fake.jobs = [{**fake.jobs[0], "job_state": ["SUSPENDED"]}]

    real_job = client.job
    fails = [True]

    async def flaky_job(job_id: int) -> Any:
        if fails.pop(0) if fails else False:
            raise rest.SlurmUnavailable("slurmrestd GET /job: timeout")
        return await real_job(job_id)

    monkeypatch.setattr(client, "job", flaky_job)
    unread = await client.changed_jobs({"sim"})
    again = await client.changed_jobs({"sim"})
    await client.close()

    job_id = fake.jobs[0]["job_id"]
    assert unread is not None and unread.jobs == (), "its old view must not come back as new"
    assert unread.unreadable == {job_id}, "listed (not gone), without a view"
    assert again is not None and [job.state for job in again.jobs] == ["SUSPENDED"]
    assert again.unreadable == frozenset()


async def test_a_poll_that_fails_for_good_loses_no_change(
    restd: tuple[FakeRestd, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five jobs end and reading one of them is refused: the poll fails, and the next one must
    still see all five endings (a review found them lost until the 5-minute full listing)."""
    fake, url = restd
    running = fake.jobs[0]
    fake.jobs = [{**running, "job_id": 700 + i} for i in range(5)]
    client, _ = _client(url, tmp_path)
    await client.changed_jobs({"sim"})
    fake.jobs = [{**job, "job_state": ["SUSPENDED"]} for job in fake.jobs]
    real_job = client.job

    async def refused_once(job_id: int) -> Any:
        if job_id == 702 and not refused:
            refused.append(job_id)
            raise rest.MalformedAnswer("slurmrestd sent a malformed answer")
        return await real_job(job_id)

    refused: list[int] = []
    monkeypatch.setattr(client, "job", refused_once)
    with pytest.raises(rest.MalformedAnswer):
        await client.changed_jobs({"sim"})
    after = await client.changed_jobs({"sim"})
    await client.close()

    assert after is not None
    assert {job.job_id: job.state for job in after.jobs} == {700 + i: "SUSPENDED" for i in range(5)}


async def test_a_pending_array_is_read_once_not_once_per_task(
    restd: tuple[FakeRestd, str], tmp_path: Path
) -> None:
    """slurmrestd lists a pending array task by task ("408_0" ... "408_599"), all job 408."""
    fake, url = restd
    client, _ = _client(url, tmp_path)
    await client.changed_jobs({"sim"})
    array = {**fake.jobs[0], "job_id": 408, "job_state": ["PENDING"]}
    tasks = ({**array, "array_task_id": {"set": True, "number": task}} for task in range(60))
    fake.jobs = [fake.jobs[0], *tasks]
    fake.requests.clear()

    listing = await client.changed_jobs({"sim"})
    await client.close()

    assert listing is not None and 408 in {job.job_id for job in listing.jobs}
    assert sorted(fake.paths()) == ["/job/408", "/jobs/state/"]


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
    assert len(fake.requests) == 4  # two refused, then states and the listing


async def test_a_big_listing_is_parsed_off_the_event_loop(
    restd: tuple[FakeRestd, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 11, item 3: at 10,000 jobs parsing a listing takes seconds, which on the event loop
    would stall every attach, relay and Lease renewal; in a thread, its Python code lets the loop
    run between its steps."""
    fake, url = restd
    fake.jobs = [{**fake.jobs[0], "job_id": 5000 + i} for i in range(400)]
    on_loop: list[bool] = []
    parse = job_listing.allocation_from_rest

    def recording_parse(raw: Any, read_at: float) -> Any:
        on_loop.append(threading.current_thread() is threading.main_thread())
        return parse(raw, read_at)

    monkeypatch.setattr(job_listing, "allocation_from_rest", recording_parse)
    client, _ = _client(url, tmp_path)
    listing = await client.changed_jobs()
    await client.close()

    assert listing is not None and len(listing.jobs) == 400
    assert len(on_loop) == 400 and not any(on_loop)
