"""slurmrestd backend: JWT over aiohttp, polling job states and reading only changed jobs.

`GET /jobs/?update_time=T` returns the full list (not a delta) after any change, ~27 KB a job in
v0.0.45, so the poll reads `GET /jobs/state/` (~85 bytes a job) instead and then each job whose
state changed; the full list is read at start and as a periodic safety net (FULL_RESYNC_S).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import structlog
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from bridge.clients.slurm import (
    ESLURM_TRANSITION_STATE_NO_UPDATE,
    SIGNAL_RETRY_DELAYS_S,
    JobListing,
    parse_listing,
    slurm_node,
)
from bridge.core.errors import PermanentError, SlurmAuthError, SlurmRefused, SlurmUnavailable
from bridge.core.model import JobAllocation, allocation_from_rest
from bridge.core.nodehealth import SlurmNode

log = structlog.get_logger(__name__)

API_VERSION = "v0.0.45"
GET_ATTEMPTS = 3


class RestSlurmClient:
    """Talks to slurmrestd as one Slurm user (an operator: SlurmUser or root)."""

    def __init__(self, url: str, user: str, token_file: Path, timeout_s: float = 10.0) -> None:
        self._url = url.rstrip("/")
        self._user = user
        self._token_file = token_file
        self._token: str | None = None
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._states: dict[str, tuple[str, ...]] | None = None
        """The job states of the last poll, by slurmctld's printed id (None before the first)."""
        self._bridged: dict[int, JobAllocation] = {}
        """The last full view of every listed job of the wanted partitions."""
        self._unreadable: set[int] = set()
        self._foreign: dict[str, bool] = {}
        """Jobs of other partitions, by printed id: True while PENDING (may still become ours)."""
        self._full_read_at = 0.0
        self._reported: set[int] = set()
        self._nodes_last_update = 0
        self._nodes_recheck_second: int | None = None

    # -- plumbing ---------------------------------------------------------
    def _read_token(self) -> str:
        """Read the JWT from its file each time it may have been rotated."""
        text = self._token_file.read_text().strip()
        return text.removeprefix("SLURM_JWT=")

    async def _request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        if method != "GET":
            return await self._request_once(method, path, **kwargs)
        # Reads are idempotent: ride out a slurmctld/slurmrestd blip before failing the caller.
        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type(SlurmUnavailable),
            wait=wait_exponential(multiplier=0.05, max=1.0),
            stop=stop_after_attempt(GET_ATTEMPTS),
            reraise=True,
        ):
            with attempt:
                return await self._request_once(method, path, **kwargs)
        raise AssertionError("unreachable")

    async def _request_once(self, method: str, path: str, *, as_user: str | None = None,
                            **kwargs: Any) -> dict[str, Any]:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        for attempt in (1, 2):
            if self._token is None:
                self._token = self._read_token()
            # An operator's token may act as another user (auth/jwt lets SlurmUser and root do so):
            # a gang's job is then that user's own, as if they had submitted it.
            headers = {"X-SLURM-USER-NAME": as_user or self._user, "X-SLURM-USER-TOKEN": self._token}
            try:
                async with self._session.request(
                    method, f"{self._url}{path}", headers=headers, **kwargs
                ) as response:
                    if response.status in (401, 403, 511):
                        # The token file may have been rotated: re-read it once.
                        self._token = None
                        if attempt == 1:
                            continue
                        raise SlurmAuthError(
                            f"slurmrestd refused the token for user {self._user!r} "
                            f"(HTTP {response.status}); check {self._token_file} (expired?)"
                        )
                    body = await decode_json(await response.read())
                    if response.status >= 500:
                        raise SlurmRequestFailed(method, path, response.status, body)
                    return body if isinstance(body, dict) else {}
            except aiohttp.ClientResponseError as error:
                # slurmrestd 26.05 sends more than its Content-Length on some error answers (a
                # refused token; an unknown job id gets a second response on the connection), so
                # aiohttp rejects them before their status is seen.
                raise MalformedAnswer(
                    f"slurmrestd sent a malformed answer to {method} {path} ({error.message}); it does "
                    f"that when it refuses the token: check {self._token_file} (expired? wrong user?)"
                ) from error
            except (aiohttp.ClientError, TimeoutError) as error:
                raise SlurmUnavailable(f"slurmrestd {method} {path}: {error}") from error
        raise AssertionError("unreachable")

    # -- the SlurmClient verbs --------------------------------------------
    async def changed_jobs(self, partitions: Collection[str] | None = None) -> JobListing | None:
        """The jobs of `partitions` if any job changed since the previous call, else None.

        Every call reads slurmctld's job states (`/jobs/state/`: ~85 bytes a job), and then the
        full record only of the jobs whose state changed or that are new; a full listing (~27 KB a
        job: 16 MB for 600 jobs, which held the event loop for seconds under load and cost the
        Lease) is read only at the first call and every FULL_RESYNC_S. A job of another partition
        is read once, and again only when it leaves PENDING (its partition may change until then).
        """
        wanted = None if partitions is None else frozenset(partitions)
        if self._states is None:
            return await self._read_everything(wanted)
        if time.monotonic() - self._full_read_at >= FULL_RESYNC_S:
            try:
                return await self._read_everything(wanted)
            except SlurmUnavailable as error:
                # The big read failing (under the load that makes it slow) must not stop the
                # small ones: try it again later, poll the states meanwhile.
                self._full_read_at = time.monotonic() - FULL_RESYNC_S + FULL_RESYNC_RETRY_S
                log.warning("slurm.full_listing_failed", error=str(error))
        read_at = time.monotonic()
        states = await self._job_states()
        previous = self._states
        if states == previous:
            return None
        changed = [key for key, state in states.items() if previous.get(key) != state]
        # A job of another partition that ran there can never become ours, unless it is pending
        # again (requeued), when `scontrol update Partition=` may move it.
        by_id: dict[int, list[str]] = {}
        for key in changed:
            if self._foreign.get(key, True) or "PENDING" in states[key]:
                by_id.setdefault(_id_of(key), []).append(key)
        # One read per job: a pending array's tasks share its id until they start.
        reads = asyncio.Semaphore(READS_AT_ONCE)

        async def read(job_id: int) -> JobAllocation | BaseException | None:
            async with reads:
                try:
                    return await self.job(job_id)
                except (SlurmAuthError, PermanentError):
                    raise
                except Exception as error:  # this job's read failed or its record is unparseable
                    return error

        try:
            async with asyncio.TaskGroup() as group:  # one failing for good cancels the others
                tasks = {job_id: group.create_task(read(job_id)) for job_id in by_id}
        except BaseExceptionGroup as failed:
            self._states = None  # nothing of this poll is committed: read everything next time
            raise failed.exceptions[0] from None
        # Commit only now, and only what was read: a key whose read failed keeps its old state,
        # so the next poll reads it again.
        unread = {job_id for job_id, task in tasks.items()
                  if not self._record_read(job_id, task.result(), by_id[job_id], states, wanted)}
        committed = dict(states)
        for job_id in unread:
            for key in by_id[job_id]:
                if key in previous:
                    committed[key] = previous[key]
                else:
                    committed.pop(key, None)
        for key in changed:
            if _id_of(key) not in by_id:
                self._foreign[key] = False
        listed_ids = {_id_of(key) for key in states}
        for key in previous.keys() - states.keys():
            self._foreign.pop(key, None)
            job_id = _id_of(key)
            if job_id not in listed_ids:
                self._bridged.pop(job_id, None)
                self._unreadable.discard(job_id)
        self._states = committed
        self._unreadable = (self._unreadable - set(tasks)) | unread
        self._unreadable &= listed_ids
        return JobListing(read_at=read_at, jobs=tuple(self._bridged.values()),
                          unreadable=frozenset(self._unreadable))

    def _record_read(
        self, job_id: int, outcome: JobAllocation | BaseException | None, keys: list[str],
        states: dict[str, tuple[str, ...]], wanted: frozenset[str] | None,
    ) -> bool:
        """Keep what one job's read found; False if the read failed (then it is listed without
        a view: its old one must not come back stamped as new)."""
        if isinstance(outcome, BaseException):
            self._bridged.pop(job_id, None)
            if not isinstance(outcome, SlurmUnavailable) and job_id not in self._reported:
                self._reported.add(job_id)
                log.warning("slurm.record_skipped", job_id=job_id, error=repr(outcome))
            return False
        self._reported.discard(job_id)
        elsewhere = outcome is not None and wanted is not None and outcome.partition not in wanted
        if outcome is not None and not elsewhere:
            self._bridged[job_id] = outcome
        else:
            self._bridged.pop(job_id, None)
        for key in keys:
            if elsewhere:
                self._foreign[key] = "PENDING" in states[key]
            else:
                self._foreign.pop(key, None)
        return True

    async def _job_states(self) -> dict[str, tuple[str, ...]]:
        """slurmctld's job ids as it prints them ("408_3": task 3 of an array, job 408 while it
        is pending with its array, its own id once it started; "124+1": a heterogeneous job's
        component) and their states."""
        body = await self._request("GET", f"/slurm/{API_VERSION}/jobs/state/")
        if body.get("errors") or not isinstance(body.get("jobs", []), list | None):
            raise SlurmUnavailable(f"slurmrestd could not list job states: {body.get('errors')}")
        states: dict[str, tuple[str, ...]] = {}
        for entry in body.get("jobs") or []:
            key = str(entry.get("job_id", "")) if isinstance(entry, Mapping) else ""
            if _LEADING_DIGITS.match(key):
                states[key] = tuple(str(part) for part in entry.get("state") or ())
        return states

    async def _read_everything(self, wanted: frozenset[str] | None) -> JobListing:
        """States first, then the full listing: a change between the two reads is newer in the
        listing than in the states, so the next poll reads that job again (never misses it)."""
        states = await self._job_states()
        read_at = time.monotonic()
        body = await self._request("GET", f"/slurm/{API_VERSION}/jobs/")
        if body.get("errors"):
            raise SlurmUnavailable(f"slurmrestd could not list jobs: {body['errors']}")
        records = body.get("jobs") or []

        def parse() -> JobListing:
            return parse_listing(
                records, read_at=read_at, partitions=wanted,
                partition_of=lambda raw: str(_field(raw, "partition") or ""),
                job_id_of=lambda raw: _field(raw, "job_id"),
                parse=lambda raw: allocation_from_rest(raw, read_at), reported=self._reported,
            )

        # Thousands of records take seconds to parse: in a thread, whose Python code lets the
        # event loop (every attach, log relay and Lease renewal) run between its steps. (Only
        # this poll touches _reported: no race.)
        listing = await asyncio.to_thread(parse) if len(records) > OFF_LOOP_RECORDS else parse()
        self._bridged = {alloc.job_id: alloc for alloc in listing.jobs}
        self._unreadable = set(listing.unreadable)
        ours = set(self._bridged) | self._unreadable
        self._foreign = {key: "PENDING" in state for key, state in states.items() if _id_of(key) not in ours}
        self._states = states
        self._full_read_at = read_at
        return listing

    async def job(self, job_id: int) -> JobAllocation | None:
        read_at = time.monotonic()
        try:
            body = await self._request("GET", f"/slurm/{API_VERSION}/job/{job_id}")
        except MalformedAnswer:
            # Either the token was refused or the job is unknown: the state endpoint answers
            # an unknown id cleanly (and raises MalformedAnswer again for a refused token).
            state = await self._request("GET", f"/slurm/{API_VERSION}/jobs/state/", params={"job_id": job_id})
            if not state.get("jobs"):
                return None
            raise

        for job in body.get("jobs") or []:
            if int(job.get("job_id", 0)) == job_id:
                return allocation_from_rest(job, read_at)
        return None

    async def signal_job(self, job_id: int, signal: str) -> None:
        params = {"signal": signal, "flags": "BATCH_JOB"}
        for delay in (*SIGNAL_RETRY_DELAYS_S, None):
            try:
                body = await self._request("DELETE", f"/slurm/{API_VERSION}/job/{job_id}", params=params)
            except SlurmRequestFailed as failure:
                body = failure.body
            errors = body.get("errors") or []
            if ESLURM_TRANSITION_STATE_NO_UPDATE not in {e.get("error_number") for e in errors}:
                return
            if delay is None:
                log.warning("slurm.signal_failed", job_id=job_id, signal=signal, errors=errors)
                return
            await asyncio.sleep(delay)

    async def submit_job(self, user: str, job: Mapping[str, Any]) -> int:
        # Not retried: a submission that timed out may have been made (the caller looks for its
        # job by comment before submitting again).
        try:
            body = await self._request_once("POST", f"/slurm/{API_VERSION}/job/submit", as_user=user,
                                            json={"job": dict(job)})
        except MalformedAnswer as answer:
            # slurmrestd 26.05 sends a refusal (HTTP 422) with more than its Content-Length; the
            # refusal's own words are in what aiohttp quotes of it.
            said = refusal_words(str(answer))
            if not said:
                raise
            raise SlurmRefused(said) from None
        job_id = body.get("job_id")
        if isinstance(job_id, int) and job_id > 0:
            return job_id
        raise SlurmRefused(refusal_words(json.dumps(body)) or "slurmctld refused the job without saying why")

    async def cancel_job(self, job_id: int) -> None:
        try:
            await self._request("DELETE", f"/slurm/{API_VERSION}/job/{job_id}")
        except SlurmRequestFailed as failure:
            log.info("slurm.cancel_refused", job_id=job_id, errors=failure.body.get("errors"))

    async def set_comment(self, job_id: int, comment: str) -> None:
        body = await self._request("POST", f"/slurm/{API_VERSION}/job/{job_id}", json={"comment": comment})
        errors = body.get("errors") or []
        if errors:
            log.warning("slurm.comment_failed", job_id=job_id, errors=errors)

    async def changed_nodes(self, partitions: Collection[str]) -> list[SlurmNode] | None:
        since = self._nodes_last_update
        if self._nodes_recheck_second is not None and time.time() >= self._nodes_recheck_second + 1:
            # update_time has one-second resolution: a change later in the same second as the last
            # read would look "unchanged"; once that second is over, read from just before it.
            since, self._nodes_recheck_second = self._nodes_recheck_second - 1, None
        body = await self._request("GET", f"/slurm/{API_VERSION}/nodes/", params={"update_time": str(since)})
        if body.get("errors"):
            raise SlurmUnavailable(f"slurmrestd could not list nodes: {body['errors']}")
        raw_nodes = body.get("nodes") or []
        if not raw_nodes:
            return None
        last = int((body.get("last_update") or {}).get("number") or time.time())
        self._nodes_recheck_second = None if last == self._nodes_last_update else last
        self._nodes_last_update = last
        wanted = set(partitions)
        nodes = []
        for raw in raw_nodes:
            parts = [str(p) for p in raw.get("partitions") or []]
            if wanted.isdisjoint(parts) or not raw.get("name"):
                continue
            nodes.append(slurm_node(str(raw["name"]), raw.get("state") or [], raw.get("reason"), parts))
        return nodes

    async def node(self, name: str) -> SlurmNode | None:
        try:
            body = await self._request("GET", f"/slurm/{API_VERSION}/node/{name}")
        except SlurmRequestFailed as failure:
            if _refused(failure.body):
                return None
            raise
        for raw in body.get("nodes") or []:
            if raw.get("name") == name:
                return slurm_node(name, raw.get("state") or [], raw.get("reason"),
                                  [str(p) for p in raw.get("partitions") or []])
        return None

    async def update_node(self, name: str, state: str, reason: str = "") -> None:
        body: dict[str, Any] = {"state": [state]}
        if reason:
            body["reason"] = reason
        try:
            answer = await self._request("POST", f"/slurm/{API_VERSION}/node/{name}", json=body)
        except SlurmRequestFailed as failure:
            answer = failure.body if isinstance(failure.body, dict) else {}
            if not answer.get("errors"):
                raise  # a 5xx without a word: not done
        errors = answer.get("errors") or []
        if errors and _refused(answer):
            # An unknown node or a refusal of the bridge's user: retrying cannot help.
            raise SlurmNodeRefused(f"slurmctld refused to set node {name} {state}: {errors}")
        if errors:
            raise SlurmUnavailable(f"slurmrestd could not set node {name} {state}: {errors}")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class SlurmRequestFailed(SlurmUnavailable):
    """slurmrestd answered 5xx; `body` keeps its `errors` (slurmctld's error numbers)."""

    def __init__(self, method: str, path: str, status: int, body: Any) -> None:
        self.body: dict[str, Any] = body if isinstance(body, dict) else {}
        detail = "; ".join(str(e.get("description") or e.get("error")) for e in self.body.get("errors") or [])
        super().__init__(f"slurmrestd {method} {path}: HTTP {status}" + (f": {detail}" if detail else ""))


class SlurmNodeRefused(PermanentError):
    """slurmctld refused a node update for good (unknown node, no permission)."""


OFF_LOOP_RECORDS = 200
"""Listings with more records are parsed in a worker thread."""
FULL_RESYNC_S = 300.0
"""How often the whole job listing is read (a safety net: between two, job states decide)."""
FULL_RESYNC_RETRY_S = 30.0
"""After a failed full listing, how long the poll reads only states before trying it again."""
READS_AT_ONCE = 16
"""Single-job reads in flight at once after a poll found changed jobs."""
_LEADING_DIGITS = re.compile(r"[0-9]+")


def _id_of(printed: str) -> int:
    """The numeric job id in slurmctld's printed one ("408_3" is job 408, task 3 of its array;
    "123+1" is component 1 of heterogeneous job 123)."""
    match = _LEADING_DIGITS.match(printed)
    return int(match.group()) if match else 0


async def decode_json(raw: bytes) -> Any:
    """slurmrestd's answer as JSON (None for an empty body). Decoding stays on the loop: the C
    decoder holds the GIL throughout, so a thread would not free the loop (a 10,000-job listing
    is ~26 MB, ~1 s); reading less from slurmrestd is what helps there."""
    if not raw.strip():
        return None
    return json.loads(raw)


_ANSWER_FIELD = re.compile(r'\\?"(job_submit_user_msg|error)\\?": \\?"((?:[^"\\]|\\\\.)*?)\\?"')


def refusal_words(text: str) -> str:
    """What a slurmrestd answer says against a request (job_submit's message to the user, then the
    `error` fields), found in `text`: the answer, or an exception's message quoting it."""
    found = sorted(((match.group(1) != "job_submit_user_msg", match.group(2))
                    for match in _ANSWER_FIELD.finditer(text)), key=lambda item: item[0])
    words = (said.replace("\\\\/", "/").replace("\\/", "/").replace("\\\\n", " ").replace("\\n", " ")
             for _, said in found)
    return "; ".join(dict.fromkeys(word.strip() for word in words if word.strip()))


def _refused(body: object) -> bool:
    text = str((body or {}).get("errors") if isinstance(body, dict) else "").lower()
    return any(word in text for word in ("invalid node", "access denied", "permission", "not found"))


class MalformedAnswer(SlurmAuthError):
    """slurmrestd's answer could not be parsed; in practice a refused token or an unknown job."""


def _field(raw: object, key: str) -> object:
    return raw.get(key) if isinstance(raw, Mapping) else None
