"""slurmrestd backend: the one door to slurmrestd (JWT from a file over aiohttp, retries, the verbs).

The incremental job listing behind `changed_jobs` (job states polled, only changed jobs read) is
job_listing.py's; it reads through this client.
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
    slurm_node,
)
from bridge.clients.slurm.job_listing import IncrementalJobListing
from bridge.core import json_text
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
        self._listing = IncrementalJobListing(self)
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

    async def get(self, path: str) -> dict[str, Any]:
        """One GET of slurmrestd's API (`path` under its version's root), retried through a blip."""
        return await self._request("GET", f"/slurm/{API_VERSION}{path}")

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
        """The jobs of `partitions` if any job changed since the previous call, else None (the
        incremental listing of job_listing.py, read through this client)."""
        return await self._listing.changed_jobs(partitions)

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


async def decode_json(raw: bytes) -> Any:
    """slurmrestd's answer as JSON (None for an empty body). Decoding stays on the loop: the C
    decoder holds the GIL throughout, so a thread would not free the loop (a 10,000-job listing
    is ~26 MB, ~1 s); reading less from slurmrestd is what helps there."""
    if not raw.strip():
        return None
    return json_text.loads(raw)


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
