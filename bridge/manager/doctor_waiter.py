"""doctor's waiter check: the program `[waiter] attach_command` starts on a slurmd host.

It runs as the job's user, in the user's environment: a program that anyone but root may replace,
or that sits in a directory anyone may write, runs their code there; and a dynamically linked one
lets the job's environment steer its program interpreter (LD_PRELOAD, LD_LIBRARY_PATH). The waiter
is the compiled, static one (agent/cmd/waiter) that deploy/slurm/install-waiter.sh installs.
"""

from __future__ import annotations

import struct
from pathlib import Path

from bridge.core.attach_command import attach_command_files

PT_INTERP = 3
"""The program header type of a dynamically linked program: the path of its interpreter (ld.so)."""


def waiter_install_problems(command: str, trusted_uids: frozenset[int] = frozenset({0})) -> list[str]:
    """What is wrong with the program `attach_command` runs, as far as this host has it (config
    already checked its form). A missing file is not a problem here: the slurmds may run on other
    hosts."""
    problems = []
    for path in map(Path, attach_command_files(command)):
        if not path.exists():
            continue
        for item in (path, path.parent):
            info = item.stat()
            if info.st_uid not in trusted_uids:
                problems.append(f"{item} is owned by uid {info.st_uid}, not root")
            if info.st_mode & 0o022:
                problems.append(f"{item} is writable by group or others (mode {info.st_mode & 0o777:o})")
        linking = static_elf_problem(path)
        if linking:
            problems.append(linking)
    return problems


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
