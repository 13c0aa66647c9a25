"""The job user's supplementary groups, for the pods' securityContext.supplementalGroups.

Resolved where the daemon runs, through NSS (the same passwd/group sources as the cluster's hosts,
LDAP/sssd included), from the user name and uid/gid Slurm reports for the job. Never from the
waiter's payload: the user writes that. Inside the pod the image's /etc/group knows nothing of the
site's groups, so without this a job could not use its groups' files on shared volumes.

NSS calls block (and may go over the network), so they run in a thread and their answers are
cached for a while: a burst of jobs of one user costs one lookup, not one per job.
"""

from __future__ import annotations

import asyncio
import grp
import os
import pwd
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from bridge.core.model import JobAllocation
from bridge.core.pod_user import UserAccount

log = structlog.get_logger(__name__)

TTL_S = 60.0
"""How long an answer is believed: group changes reach new jobs within a minute."""
MAX_ENTRIES = 4096
"""Users remembered at most (least recently used go first): memory stays bounded."""


@dataclass(frozen=True)
class Resolution:
    groups: tuple[int, ...] = ()
    problem: str | None = None
    """Why the user has no groups here (unknown to NSS, another uid): warned about once."""
    home: str | None = None
    """The user's home directory, as NSS has it (a job exported without HOME gets it, as a
    native job's login environment would)."""
    account: UserAccount | None = None
    """The user's NSS entry and group names, for the pods' /etc/passwd and /etc/group."""


def supplementary(groups: list[int] | tuple[int, ...], gid: int) -> tuple[int, ...]:
    """Sorted, without the primary gid (runAsGroup already is it) and never root's group 0."""
    return tuple(sorted({g for g in groups if g > 0 and g != gid}))


def nss_groups(user: str, uid: int, gid: int) -> Resolution:
    """The groups NSS lists for `user`, if NSS knows that name as `uid` too. A name that maps to
    another uid on this host is another person here: none of their groups are given."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        return Resolution(problem=f"user {user!r} is unknown to this host's NSS")
    if entry.pw_uid != uid:
        return Resolution(problem=f"user {user!r} is uid {entry.pw_uid} here, but uid {uid} in Slurm")
    home = getattr(entry, "pw_dir", None) or None
    groups = supplementary(os.getgrouplist(user, gid), gid)
    primary = getattr(entry, "pw_gid", gid)  # the job's gid may be another (sg proj -c sbatch ...)
    account = UserAccount(name=user, uid=uid, gid=primary, home=home or "",
                          shell=getattr(entry, "pw_shell", ""), gecos=getattr(entry, "pw_gecos", ""),
                          group_names=_group_names(tuple(dict.fromkeys((gid, primary, *groups)))))
    return Resolution(groups, home=home, account=account)


def _group_names(gids: tuple[int, ...]) -> dict[int, str]:
    """The names NSS has for `gids`; a gid without one is left out (`id` then shows its number)."""
    names = {}
    for gid in gids:
        try:
            names[gid] = grp.getgrgid(gid).gr_name
        except KeyError:
            continue
    return names


Lookup = Callable[[str, int, int], Resolution]


class SupplementalGroups:
    """`await groups.of(alloc)`: the supplementary gids for the job's pods (cached, bounded)."""

    def __init__(
        self,
        mode: str = "nss",
        *,
        lookup: Lookup = nss_groups,
        ttl_s: float = TTL_S,
        max_entries: int = MAX_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.mode = mode
        self._lookup = lookup
        self._ttl_s = ttl_s
        self._max = max_entries
        self._clock = clock
        self._cache: OrderedDict[tuple[str, int, int], tuple[float, Resolution]] = OrderedDict()
        self._pending: dict[tuple[str, int, int], asyncio.Future[Resolution]] = {}
        self._warned: OrderedDict[str, None] = OrderedDict()
        self.lookups = 0

    def __len__(self) -> int:
        return len(self._cache)

    async def of(self, alloc: JobAllocation) -> tuple[int, ...]:
        if self.mode == "none":
            return ()
        return self.given(await self.resolve(alloc))

    def given(self, resolution: Resolution) -> tuple[int, ...]:
        """The supplementary gids the pods get of `resolution` (none in mode `none`)."""
        return () if self.mode == "none" else resolution.groups

    async def resolve(self, alloc: JobAllocation) -> Resolution:
        """The job user's NSS answer (groups, home), cached; empty when NSS cannot tell."""
        if not alloc.user or alloc.uid is None or alloc.gid is None:
            return Resolution()
        key = (alloc.user, alloc.uid, alloc.gid)
        try:
            resolution = await self._resolve(key)
        except OSError as error:
            # NSS itself failed (sssd down...): this job gets no groups; not cached, so the next
            # one asks again.
            log.warning("groups.lookup_failed", job_id=alloc.job_id, user=alloc.user, error=str(error))
            return Resolution()
        if resolution.problem is not None and alloc.user not in self._warned:
            self._warned[alloc.user] = None
            if len(self._warned) > self._max:
                self._warned.popitem(last=False)
            log.warning("groups.unresolved", job_id=alloc.job_id, user=alloc.user, reason=resolution.problem,
                        note="the job's pods get no supplementary groups and keep their image's /etc/passwd")
        return resolution

    async def _resolve(self, key: tuple[str, int, int]) -> Resolution:
        hit = self._cache.get(key)
        if hit is not None and self._clock() - hit[0] < self._ttl_s:
            self._cache.move_to_end(key)
            return hit[1]
        task = self._pending.get(key)
        if task is None:
            # One lookup per user at a time, shared by the jobs of that user starting together; a
            # task of its own, so a cancelled caller does not cancel it for the others.
            self.lookups += 1
            task = self._pending[key] = asyncio.ensure_future(asyncio.to_thread(self._lookup, *key))
            task.add_done_callback(lambda done: self._store(key, done))
        return await asyncio.shield(task)

    def _store(self, key: tuple[str, int, int], done: asyncio.Future[Resolution]) -> None:
        del self._pending[key]
        if done.cancelled() or done.exception() is not None:
            return  # failures are not remembered: the next job asks again
        self._cache[key] = (self._clock(), done.result())
        self._cache.move_to_end(key)
        while len(self._cache) > self._max:
            self._cache.popitem(last=False)
