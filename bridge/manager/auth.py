"""Who calls the API: a waiter proves with munge that it runs as the job's user, on a bridged
slurmd host, and that its credential was made for this very request.

Owns the unmunge concurrency limits (at most MAX_CONCURRENT_VERIFY at once, MAX_WAITING_VERIFY
waiting, each for VERIFY_WAIT_S). Called by the API for every /v1/ request, before it reads
anything of the body but the bytes the credential is bound to.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Sequence
from typing import Protocol

from aiohttp import web

from bridge.clients import munge
from bridge.core.errors import BridgeError, TemporaryError
from bridge.core.model import JobAllocation

MAX_CONCURRENT_VERIFY = 16
"""unmunge processes at most at once: more only add forks on a busy host (munged has few threads)."""
MAX_WAITING_VERIFY = 512
"""Requests that may wait for an unmunge slot; beyond, they answer 503 and are retried."""
VERIFY_WAIT_S = 10.0
"""How long a request waits for an unmunge slot before it answers 503 (and is retried)."""
NOT_ACTING = "this bridge replica is not acting (standby or syncing)"
BUSY = "busy checking other credentials; retry"


class JobOwners(Protocol):
    """What authentication asks of the controller about a job (controller.facade)."""

    async def read_job(self, job_id: int) -> JobAllocation | None: ...

    def is_bridged(self, alloc: JobAllocation) -> bool: ...

    def record_job(self, alloc: JobAllocation) -> None: ...


RequestDigest = Callable[[str, str, int, bytes], str]
"""The digest a waiter puts in its credential: of method, path, job id and body (the waiter's
request_digest; the API hands it in)."""


class Authenticator:
    def __init__(
        self, jobs: JobOwners, slurmd_hosts: Collection[str], unmunge_command: Sequence[str],
        ready: Callable[[], bool], request_digest: RequestDigest,
    ) -> None:
        self._jobs = jobs
        self._request_digest = request_digest
        self._slurmd_hosts = frozenset(slurmd_hosts)
        self._unmunge_command = tuple(unmunge_command)
        self._ready = ready
        self._verifying = asyncio.Semaphore(MAX_CONCURRENT_VERIFY)
        self._verify_waiting = 0

    def turn_away_early(self) -> None:
        """Raise what `authorise` would raise anyway, before a handler reads a body of up to
        8 MB: hundreds of requests queued for unmunge must not each hold one."""
        if not self._ready():
            raise web.HTTPServiceUnavailable(text=NOT_ACTING)
        if self._saturated():
            raise web.HTTPServiceUnavailable(text=BUSY)

    def _saturated(self) -> bool:
        return self._verifying.locked() and self._verify_waiting >= MAX_WAITING_VERIFY

    async def identify(self, request: web.Request, job_id: int, body: bytes) -> int:
        uid, _ = await self.authorise(request, job_id, body, keyed=False)
        return uid

    async def authorise(
        self, request: web.Request, job_id: int, body: bytes, *, keyed: bool
    ) -> tuple[int, bytes]:
        """The job's uid, once the caller proved with munge that it runs as that uid and that the
        credential was made for this very request (method, path, job id and body). A keyed
        credential also carries a key after the digest, for a streamed body whose frames the
        caller signs with it: only munged can read it out of the credential.

        Errors are classified once: what may pass (a standby, munged or Slurm restarting) is 503 and
        the waiter retries; 4xx only for what can never succeed."""
        if not self._ready():
            # A standby (or a replica still syncing) must not act; the waiter retries, and the
            # Service (selecting the leader's pod label, or routing on /readyz) finds the leader.
            raise web.HTTPServiceUnavailable(text=NOT_ACTING)
        credential = request.headers.get("X-Munge-Credential", "")
        if self._saturated():
            # Each check runs unmunge: a flood of requests (anyone may send them) must neither
            # fork nor queue without bound. Waiters retry a 503 with backoff.
            raise web.HTTPServiceUnavailable(text=BUSY)
        self._verify_waiting += 1
        try:
            async with asyncio.timeout(VERIFY_WAIT_S):
                await self._verifying.acquire()
        except TimeoutError:
            raise web.HTTPServiceUnavailable(text=BUSY) from None
        finally:
            self._verify_waiting -= 1
        if not self._ready():
            # It lost the Lease while this request waited.
            self._verifying.release()
            raise web.HTTPServiceUnavailable(text=NOT_ACTING)
        try:
            who = await munge.verify(credential, self._unmunge_command)
        except munge.MungeUnavailable as error:
            raise web.HTTPServiceUnavailable(text=str(error)) from None
        except munge.MungeError as error:
            raise web.HTTPForbidden(text=str(error)) from None
        finally:
            self._verifying.release()
        if self._slurmd_hosts and who.encode_host not in self._slurmd_hosts:
            raise web.HTTPForbidden(
                text=f"munge credential of uid {who.uid} was made on {who.encode_host or 'an unknown host'}, "
                "not on a host of the bridged slurmds ([waiter] slurmd_hosts)"
            )
        expected = self._request_digest(request.method, request.path, job_id, body)
        digest, _, stream_key = who.payload.strip().partition(b" ")
        if digest != expected.encode() or keyed != bool(stream_key) or (keyed and len(stream_key) != 64):
            raise web.HTTPForbidden(
                text=f"munge credential of uid {who.uid} was not made for this request ({request.method} "
                f"{request.path}): credentials are bound to one request and cannot be reused"
            )
        try:
            alloc = await self._jobs.read_job(job_id)
        except BridgeError as error:
            # Down, or the daemon's own token refused: either way the operator's to fix, and the
            # job will run once it is (the waiter keeps retrying).
            kind = "unavailable" if isinstance(error, TemporaryError) else "refuses the bridge"
            raise web.HTTPServiceUnavailable(text=f"Slurm {kind}: {error}") from None
        if alloc is None:
            raise web.HTTPNotFound(text=f"Slurm does not know job {job_id}")
        if not self._jobs.is_bridged(alloc):
            raise web.HTTPBadRequest(text=f"job {job_id} is in partition {alloc.partition}, not bridged")
        if alloc.uid != who.uid:
            raise web.HTTPForbidden(text=f"job {job_id} belongs to uid {alloc.uid}, not to uid {who.uid}")
        self._jobs.record_job(alloc)
        return who.uid, bytes.fromhex(stream_key.decode()) if keyed else b""
