"""Slurm hostlist expressions: `node[1-3,7],gpu[01-02]` <-> a list of host names."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable

from bridge.core.errors import PermanentError

_TRAILING_DIGITS = re.compile(r"^(.*?)([0-9]+)$")
_DIGITS = re.compile(r"[0-9]+")

MAX_RANGE = 64 * 1024
"""Largest bracket range accepted (Slurm's own MAX_RANGE): a typo must not exhaust memory."""


class HostlistError(PermanentError, ValueError):
    """A hostlist expression is malformed."""


def expand(expr: str) -> list[str]:
    """All host names of `expr`, in order, duplicates kept (as Slurm's hostlist_create does).

    Every bracket group is a comma list of numbers or `lo-hi` ranges; a lower bound written with
    leading zeros fixes the width of every number in its range (`[08-10]` -> 08, 09, 10). Several
    bracket groups in one name multiply out (`r[1-2]n[1-2]` -> r1n1, r1n2, r2n1, r2n2).
    """
    hosts: list[str] = []
    for item in _split_top_level(expr):
        hosts.extend(_expand_one(item))
    return hosts


def compress(hosts: Iterable[str]) -> str:
    """The shortest Slurm hostlist for `hosts` with trailing-number runs folded into brackets.

    Names are grouped by prefix and number width; groups keep the order of their first name and
    numbers are sorted and de-duplicated inside a group, so `expand(compress(x))` is `x` for a
    sorted, duplicate-free `x` (Slurm's node order), and covers the same set otherwise.
    """
    names = list(dict.fromkeys(h.strip() for h in hosts if h.strip()))
    padded_widths: dict[str, set[int]] = {}
    for name in names:
        m = _TRAILING_DIGITS.match(name)
        if m and _is_padded(m.group(2)):
            padded_widths.setdefault(m.group(1), set()).add(len(m.group(2)))

    # Group key (prefix, width); width 0 = unpadded numbers. An unpadded number whose length equals
    # a padded width of the same prefix (10 next to 09) joins that group, so node[01-16] survives.
    groups: dict[tuple[str, int] | str, list[int]] = {}
    for name in names:
        m = _TRAILING_DIGITS.match(name)
        if not m:
            groups.setdefault(name, [])
            continue
        prefix, digits = m.group(1), m.group(2)
        width = len(digits)
        if not _is_padded(digits) and width not in padded_widths.get(prefix, set()):
            width = 0
        groups.setdefault((prefix, width), []).append(int(digits))

    parts: list[str] = []
    for key, numbers in groups.items():
        if isinstance(key, str):
            parts.append(key)
            continue
        prefix, width = key
        runs = _runs(sorted(set(numbers)))
        if len(runs) == 1 and runs[0][0] == runs[0][1]:
            parts.append(f"{prefix}{runs[0][0]:0{width}d}")
            continue
        ranges = ",".join(
            f"{lo:0{width}d}" if lo == hi else f"{lo:0{width}d}-{hi:0{width}d}" for lo, hi in runs
        )
        parts.append(f"{prefix}[{ranges}]")
    return ",".join(parts)


def _is_padded(digits: str) -> bool:
    return len(digits) > 1 and digits.startswith("0")


def _runs(numbers: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for n in numbers:
        if runs and runs[-1][1] == n - 1:
            runs[-1] = (runs[-1][0], n)
        else:
            runs.append((n, n))
    return runs


def _split_top_level(expr: str) -> list[str]:
    """Split on commas outside brackets; reject unbalanced or nested brackets."""
    items: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(expr):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"nested '[' at position {i} in hostlist {expr!r}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unmatched ']' at position {i} in hostlist {expr!r}")
        elif ch == "," and depth == 0:
            items.append(expr[start:i])
            start = i + 1
    if depth:
        raise HostlistError(f"unclosed '[' in hostlist {expr!r}")
    items.append(expr[start:])
    return [item.strip() for item in items if item.strip()]


def _expand_one(item: str) -> list[str]:
    # re.split with a capture group alternates literal text and bracket contents.
    pieces = re.split(r"\[([^\]]*)\]", item)
    choices: list[list[str]] = []
    for i, piece in enumerate(pieces):
        if i % 2 == 0:
            if any(c in piece for c in " \t"):
                raise HostlistError(f"whitespace inside host name {item!r}")
            choices.append([piece])
        else:
            choices.append(_expand_ranges(piece, item))
    return ["".join(combo) for combo in itertools.product(*choices)]


def _expand_ranges(body: str, item: str) -> list[str]:
    out: list[str] = []
    for part in body.split(","):
        part = part.strip()
        lo_s, sep, hi_s = part.partition("-")
        if not _DIGITS.fullmatch(lo_s) or (sep and not _DIGITS.fullmatch(hi_s)):
            raise HostlistError(f"bad range {part!r} in {item!r}: expected N or LO-HI with digits")
        lo = int(lo_s)
        hi = int(hi_s) if sep else lo
        if hi < lo:
            raise HostlistError(f"descending range {part!r} in {item!r}")
        if hi - lo >= MAX_RANGE:
            raise HostlistError(f"range {part!r} in {item!r} has more than {MAX_RANGE} hosts")
        width = len(lo_s) if _is_padded(lo_s) else 0
        out.extend(f"{n:0{width}d}" for n in range(lo, hi + 1))
    return out
