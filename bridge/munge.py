"""Check munge credentials sent by waiters: who (uid/gid) is on the other end.

The daemon runs the site's `unmunge`, which asks the local munged to decode the
credential; a credential is only valid for the munge key of this cluster and
for a few minutes, and cannot be forged by a user.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from bridge.errors import PermanentError


class MungeError(PermanentError):
    """The credential is invalid, expired, replayed, or munged is unreachable."""


@dataclass(frozen=True)
class MungeIdentity:
    uid: int
    gid: int


async def verify(credential: str, unmunge_command: Sequence[str] = ("unmunge",)) -> MungeIdentity:
    """Decode `credential` with unmunge; raise MungeError when it is not valid."""
    process = await asyncio.create_subprocess_exec(
        *unmunge_command, "--keys=uid,gid", "--output=/dev/null",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(credential.encode()), timeout=10)
    if process.returncode != 0:
        raise MungeError(f"munge credential rejected: {stderr.decode(errors='replace').strip()}")
    return parse_unmunge_metadata(stdout.decode())


def parse_unmunge_metadata(text: str) -> MungeIdentity:
    """Read UID/GID from unmunge's metadata lines (`UID:  alice (2001)`)."""
    ids: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("UID", "GID") and "(" in value:
            ids[key.strip()] = int(value.rsplit("(", 1)[1].rstrip(") \t"))
    if set(ids) != {"UID", "GID"}:
        raise MungeError(f"unexpected unmunge output: {text.strip()!r}")
    return MungeIdentity(uid=ids["UID"], gid=ids["GID"])
