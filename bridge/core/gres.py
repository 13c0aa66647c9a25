"""GPU indices from slurmrestd's per-node `gres_detail` strings.

slurmrestd reports, for every allocated node in node order, one string such as
`gpu:2(IDX:0-1)`, `gpu:tesla:1(IDX:3)`, `gpu:4(IDX:0-3),nic:1(IDX:0)` or `gpu(IDX:0,2)`;
only the `gpu` entries matter to the bridge.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from bridge.core.errors import PermanentError

GPU_GRES = "gpu"

# name[:type][:count][(IDX:list)] ; the type may itself not be a number, the count always is.
_ITEM = re.compile(
    r"""^(?P<name>[^:()]+)
        (?::(?P<type>[^:()]+?))??
        (?::(?P<count>[0-9]+))?
        (?:\((?P<paren>[^()]*)\))?$""",
    re.VERBOSE,
)


class GresError(PermanentError, ValueError):
    """A gres_detail string cannot be read, or names GPUs without their indices."""


def gpu_indices(detail: str) -> tuple[int, ...]:
    """Sorted, de-duplicated GPU indices in one node's `gres_detail` string (empty if none).

    A GPU count without indices (`IDX:N/A`, gres.conf without File=) raises GresError: pods pinned
    to no GPU would silently run a GPU job without GPUs.
    """
    found: set[int] = set()
    for item in _split_items(detail):
        m = _ITEM.match(item)
        if not m:
            raise GresError(f"unreadable gres entry {item!r} in {detail!r}")
        if m.group("name") != GPU_GRES:
            continue
        count = int(m.group("count")) if m.group("count") is not None else None
        idx = _idx_field(m.group("paren"))
        if idx is None or idx == "N/A":
            if count:
                raise GresError(
                    f"{detail!r} allocates {count} GPU(s) without indices; "
                    "give the GPUs File= entries in gres.conf so that Slurm tracks indices"
                )
            continue
        found.update(_parse_index_list(idx, detail))
    return tuple(sorted(found))


def gpu_indices_per_node(details: Sequence[str] | None, node_count: int) -> list[tuple[int, ...]]:
    """GPU indices for each of `node_count` nodes; a short or missing list means no GPUs there.

    slurmrestd sends an empty `gres_detail` list for jobs without GRES, so missing entries are
    the normal case, not an error.
    """
    details = list(details or [])
    if len(details) > node_count:
        raise GresError(f"{len(details)} gres_detail entries for {node_count} node(s)")
    details += [""] * (node_count - len(details))
    return [gpu_indices(d) for d in details]


def _split_items(detail: str) -> list[str]:
    """Split on commas outside parentheses (index lists contain commas too)."""
    items: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(detail):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(depth - 1, 0)
        elif ch == "," and depth == 0:
            items.append(detail[start:i])
            start = i + 1
    items.append(detail[start:])
    return [item.strip() for item in items if item.strip()]


def _idx_field(paren: str | None) -> str | None:
    """The value of `IDX:` inside the parentheses, if any."""
    if paren is None:
        return None
    paren = paren.strip()
    if not paren.startswith("IDX:"):
        return None
    return paren[len("IDX:") :].strip()


def _parse_index_list(idx: str, detail: str) -> set[int]:
    out: set[int] = set()
    for part in idx.split(","):
        lo_s, sep, hi_s = part.strip().partition("-")
        try:
            lo = int(lo_s)
            hi = int(hi_s) if sep else lo
        except ValueError:
            raise GresError(f"bad GPU index {part!r} in {detail!r}") from None
        if lo < 0 or hi < lo:
            raise GresError(f"bad GPU index range {part!r} in {detail!r}")
        out.update(range(lo, hi + 1))
    return out


def gpu_count(gres: str) -> int:
    """GPUs a node's configured `gres` string declares (`gpu:4`, `gpu:a100:2(S:0),nic:1`); 0 if none
    or unreadable."""
    total = 0
    for item in _split_items(gres):
        m = _ITEM.match(item)
        if m and m.group("name") == GPU_GRES and m.group("count") is not None:
            total += int(m.group("count"))
    return total
