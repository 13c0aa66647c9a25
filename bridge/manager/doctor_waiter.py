"""doctor's waiter check: the program `[waiter] attach_command` starts on a slurmd host.

It runs as the job's user, in the user's environment: a program that anyone but root may replace,
or that sits in a directory anyone may write, runs their code there; and a dynamically linked one
lets the job's environment steer its program interpreter (LD_PRELOAD, LD_LIBRARY_PATH). The waiter
is the compiled, static one (agent/cmd/waiter) that deploy/slurm/install-waiter.sh installs.
"""

from __future__ import annotations

import os
import stat
import struct
from pathlib import Path

from bridge.core.attach_command import attach_command_ca_file, attach_command_files

PT_INTERP = 3
"""The program header type of a dynamically linked program: the path of its interpreter (ld.so)."""


def waiter_install_problems(
    command: str, trusted_uids: frozenset[int] = frozenset({0}), *, ca_file: str | Path | None = None
) -> list[str]:
    """What is wrong with the program `attach_command` runs, and with the CA files its waiters
    trust (its own --ca, and `ca_file`: `[waiter] ca_file`, which job-submit-conf passes as --ca),
    as far as this host has them (config already checked their form). A missing file is not a
    problem here: the slurmds may run on other hosts."""
    problems = []
    for path in map(Path, attach_command_files(command)):
        if not path.exists() and not path.is_symlink():
            continue
        if path.is_symlink():
            # Whoever may write any directory on the link's target's way could swap the program.
            problems.append(f"{path} is a symbolic link: name the installed program itself")
            continue
        info = path.lstat()
        problems += _owner_problems(path, info, trusted_uids)
        if info.st_mode & (stat.S_ISUID | stat.S_ISGID):
            problems.append(f"{path} is set-user-ID or set-group-ID: it would run the job's "
                            "environment with another's rights")
        if _has_file_capabilities(path):
            problems.append(f"{path} has file capabilities: it would run the job's environment "
                            "with more than the user's rights")
        # Every directory up to /: anyone who may write one could rename what is below it away
        # and put their own in its place. A sticky one (/tmp) lets others rename only their own.
        for directory in path.parents:
            info = directory.lstat()
            sticky_above = directory != path.parent and info.st_mode & stat.S_ISVTX
            problems += _owner_problems(directory, info, trusted_uids, sticky_above)
        linking = static_elf_problem(path)
        if linking:
            problems.append(linking)
    for trusted_ca in dict.fromkeys(str(name) for name in (attach_command_ca_file(command), ca_file) if name):
        problems += ca_file_problems(Path(trusted_ca), trusted_uids)
    return problems


def ca_file_problems(ca_file: Path, trusted_uids: frozenset[int] = frozenset({0})) -> list[str]:
    """Whoever may write the waiter's --ca file, or a directory on its way, may have the waiters
    trust a daemon of theirs (and hand it every job's output and signals). A link is followed, as
    the waiter follows it: the directories of the path as written count (whoever may write the
    link's may point it elsewhere), and so do the file it ends at and that file's directories."""
    if not ca_file.exists():
        return []  # the slurmds may run on other hosts
    target = ca_file.resolve()
    problems = _owner_problems(target, target.stat(), trusted_uids)
    for path in (ca_file.absolute(), target):
        for directory in path.parents:
            info = directory.lstat()
            if stat.S_ISLNK(info.st_mode):
                continue  # a link's mode means nothing; its directory and its target are checked
            sticky_above = directory != path.parent and info.st_mode & stat.S_ISVTX
            problems += _owner_problems(directory, info, trusted_uids, sticky_above)
    return [f"the --ca file {problem}" for problem in dict.fromkeys(problems)]


def _owner_problems(
    item: Path, info: os.stat_result, trusted_uids: frozenset[int], sticky: bool | int = False
) -> list[str]:
    problems = []
    if info.st_uid not in trusted_uids:
        problems.append(f"{item} is owned by uid {info.st_uid}, not root")
    if info.st_mode & 0o022 and not sticky:
        problems.append(f"{item} is writable by group or others (mode {info.st_mode & 0o777:o})")
    return problems


def _has_file_capabilities(path: Path) -> bool:
    try:
        os.getxattr(path, "security.capability", follow_symlinks=False)
    except OSError:
        return False  # none (ENODATA), or a file system without extended attributes
    return True


def static_elf_problem(path: Path) -> str | None:
    """Why `path` is not a static ELF program (one without a PT_INTERP program header), or None."""
    try:
        with path.open("rb") as program:
            header = program.read(64)
            elf = len(header) == 64 and header[:4] == b"\x7fELF"
            if not elf or header[4] not in (1, 2) or header[5] not in (1, 2):  # (32|64-bit, LE|BE)
                return f"{path} is not an ELF program: the waiter is the compiled one"
            order = "<" if header[5] == 1 else ">"
            if header[4] == 2:  # 64-bit
                (table_at,) = struct.unpack_from(order + "Q", header, 32)
                entry_size, entries = struct.unpack_from(order + "HH", header, 54)
            else:
                (table_at,) = struct.unpack_from(order + "I", header, 28)
                entry_size, entries = struct.unpack_from(order + "HH", header, 42)
            program.seek(table_at)
            table = program.read(entry_size * entries)
    except OSError as error:
        return f"{path} cannot be read ({error.strerror})"
    if entry_size < 4 or len(table) < entry_size * entries:
        return f"{path} is a truncated or malformed ELF program"
    types = {struct.unpack_from(order + "I", table, at)[0] for at in range(0, len(table), entry_size)}
    if PT_INTERP in types:
        return (f"{path} is dynamically linked: its program interpreter would follow the job's "
                "LD_PRELOAD and LD_LIBRARY_PATH")
    return None
