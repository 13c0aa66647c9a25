"""Check munge credentials sent by waiters: who (uid/gid) is on the other end.

The daemon runs the site's `unmunge`, which asks the local munged to decode the
credential; a credential is only valid for the munge key of this cluster and
for a few minutes, and cannot be forged by a user.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from bridge.core.errors import PermanentError, TemporaryError


class MungeError(PermanentError):
    """The credential is invalid, expired, replayed, or for another request: never retried."""


class MungeUnavailable(TemporaryError):
    """munged (or unmunge) did not answer: the same credential's sender may simply retry."""


# unmunge exit codes (munge_err_t) that say nothing about the credential itself.
_UNAVAILABLE_CODES = frozenset({1, 5, 6, 7})  # snafu, no memory, socket, timeout
# What the others say (unmunge prints no text for some of them when asked for --keys only).
_REJECTION_REASONS = {
    2: "bad argument", 3: "bad length", 8: "not a munge credential", 9: "bad version", 10: "bad cipher",
    11: "bad MAC: made with another key", 12: "bad compression", 13: "bad realm", 14: "invalid",
    15: "expired", 16: "rewound (issued in the future)", 17: "replayed: a credential is good for one request",
    18: "unauthorized",
}


@dataclass(frozen=True)
class MungeIdentity:
    uid: int
    gid: int
    payload: bytes = b""
    """What the sender put into the credential (the waiters: a digest of their request)."""
    encode_host: str = ""
    """The address of the host whose munged made the credential (unmunge's ENCODE_HOST)."""


async def verify(credential: str, unmunge_command: Sequence[str] = ("unmunge",)) -> MungeIdentity:
    """Decode `credential` with unmunge; MungeError when it is not valid, MungeUnavailable when
    munged cannot tell."""
    try:
        process = await asyncio.create_subprocess_exec(
            *unmunge_command, "--keys=uid,gid,encode_host",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
    except OSError as error:
        raise MungeUnavailable(f"cannot run {unmunge_command[0]}: {error}") from None
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(credential.encode()), timeout=10)
    except TimeoutError:
        process.kill()
        raise MungeUnavailable("unmunge did not answer within 10 s") from None
    if process.returncode != 0:
        message = stderr.decode(errors="replace").strip()
        if process.returncode in _UNAVAILABLE_CODES:
            raise MungeUnavailable(f"munged unavailable: {message}")
        reason = _REJECTION_REASONS.get(process.returncode or 0, f"unmunge exit code {process.returncode}")
        raise MungeError(f"munge credential rejected: {reason}" + (f" ({message})" if message else ""))
    return parse_unmunge_output(stdout)


def parse_unmunge_output(output: bytes) -> MungeIdentity:
    """unmunge prints the metadata lines, one empty line, then the payload."""
    head, _, payload = output.partition(b"\n\n")
    identity = parse_unmunge_metadata(head.decode(errors="replace"))
    return MungeIdentity(identity.uid, identity.gid, payload=payload, encode_host=identity.encode_host)


def parse_unmunge_metadata(text: str) -> MungeIdentity:
    """Read UID/GID from unmunge's metadata lines (`UID:  alice (2001)`)."""
    ids: dict[str, int] = {}
    host = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("UID", "GID") and "(" in value:
            ids[key.strip()] = int(value.rsplit("(", 1)[1].rstrip(") \t"))
        elif key.strip() == "ENCODE_HOST" and "(" in value:
            host = value.rsplit("(", 1)[1].rstrip(") \t")
    if set(ids) != {"UID", "GID"}:
        raise MungeError(f"unexpected unmunge output: {text.strip()!r}")
    return MungeIdentity(uid=ids["UID"], gid=ids["GID"], encode_host=host)
