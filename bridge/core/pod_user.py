"""Who the job's processes are in its pods: the securityContext's uid, gid and groups, and the
/etc/passwd and /etc/group that name them. Pure.

Natively a job runs on a host whose NSS knows its user: `whoami`, `id`, `ls -l`, `~alice`, Python's
`pwd.getpwuid` and ssh all find a name. An image's /etc/passwd knows none of a site's users, so
without these files `id -un` says "cannot find name for user ID 2001" and programs that look their
user up fail. The daemon writes the files from the NSS answer it already resolved for the job's
groups (bridge.clients.identity: Slurm's user name and ids, never the waiter's payload), puts them
in the job's payload Secret and mounts them read-only over the image's. The image's other entries
are hidden: a job runs as its user, never as the image's own accounts; root and nobody are kept.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from bridge.core import wellknown
from bridge.core.model import JobAllocation

PASSWD_KEY = wellknown.SECRET_PASSWD_KEY
GROUP_KEY = wellknown.SECRET_GROUP_KEY
FILES = {PASSWD_KEY: "/etc/passwd", GROUP_KEY: "/etc/group"}
"""Each key of the payload Secret and where its file is mounted (its key's value in the env)."""

_ROOT_USER = "root:x:0:0:root:/root:/bin/sh"
_NOBODY_USER = "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin"
_ROOT_GROUP = "root:x:0:"
_NOBODY_GROUP = "nogroup:x:65534:"


@dataclass(frozen=True)
class UserAccount:
    """The job user's NSS entry and the names of their groups, as the daemon's host resolved them."""

    name: str
    uid: int
    gid: int
    """The user's primary gid as NSS has it (the job's may be another: `sg proj -c sbatch`)."""
    home: str = ""
    shell: str = ""
    gecos: str = ""
    group_names: Mapping[int, str] = field(default_factory=dict)
    """gid -> name, of the primary group and the supplementary ones NSS named."""


def _field(value: str) -> str:
    """A passwd/group field: no separator, no line break (NSS never gives them; a lookup source
    that did must not add lines of its own)."""
    return "".join(char for char in value if char not in ":\n\r\0")


def passwd_text(account: UserAccount) -> str:
    user = (f"{_field(account.name)}:x:{account.uid}:{account.gid}:{_field(account.gecos)}:"
            f"{_field(account.home) or '/'}:{_field(account.shell) or '/bin/sh'}")
    lines = [_ROOT_USER, user] if account.uid not in (0, 65534) else [_ROOT_USER]
    return "\n".join([*lines, _NOBODY_USER]) + "\n"


def group_text(account: UserAccount, job_gid: int, supplementary: Collection[int]) -> str:
    """root's and nobody's groups, the job's and the user's primary group and each supplementary
    one NSS could name, the user a member of the latter (as natively: `id` and `groups` list them)."""
    lines = [_ROOT_GROUP]
    taken = {0, 65534}
    for gid in dict.fromkeys((job_gid, account.gid)):
        name = account.group_names.get(gid)
        if name and gid not in taken:
            lines.append(f"{_field(name)}:x:{gid}:")
            taken.add(gid)
    for gid in sorted(supplementary):
        name = account.group_names.get(gid)
        if name and gid not in taken:
            lines.append(f"{_field(name)}:x:{gid}:{_field(account.name)}")
            taken.add(gid)
    return "\n".join([*lines, _NOBODY_GROUP]) + "\n"


def user_files(account: UserAccount | None, alloc: JobAllocation, groups: Collection[int]) -> dict[str, str]:
    """The payload Secret's two files for the job, or none when NSS gave no account for its user
    (unknown here, or another uid: the image's files stay)."""
    if account is None or account.name != alloc.user or account.uid != alloc.uid or alloc.gid is None:
        return {}
    return {PASSWD_KEY: passwd_text(account), GROUP_KEY: group_text(account, alloc.gid, groups)}


def files_bytes(files: Mapping[str, str]) -> int:
    return sum(len(text.encode("utf-8")) for text in files.values())


def mount_user_files(files: Collection[str], volume: dict[str, Any], mounts: list[dict[str, Any]]) -> None:
    """Each file (by its key) as an item of the Secret's volume, mounted read-only over the image's."""
    for key in sorted(files):
        item = f"etc-{FILES[key].rsplit('/', 1)[1]}"
        volume["secret"]["items"].append({"key": key, "path": item})
        mounts.append({"name": wellknown.SCRIPT_VOLUME, "mountPath": FILES[key], "subPath": item,
                       "readOnly": True})


def groups_policy(configured: str, node: str, strict_nodes: Collection[str]) -> str:
    """The supplementalGroupsPolicy of a pod on `node` ("" = unset)."""
    if configured == "auto":
        return "Strict" if node in strict_nodes else ""
    return configured


def pod_security(alloc: JobAllocation, groups: list[int], policy: str) -> dict[str, Any]:
    security: dict[str, Any] = {
        "runAsUser": alloc.uid,
        "runAsGroup": alloc.gid,
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if groups:
        security["supplementalGroups"] = groups
    if policy:
        # Strict: the image's /etc/group adds no groups to the job's uid (Merge, the default, would).
        security["supplementalGroupsPolicy"] = policy
    return security
