"""A path through a partition's volumes, either way: the pods' path of a slurmd host's file, or the
host's path of a pod's file. Pure."""

from __future__ import annotations

import posixpath
from collections.abc import Iterable


def through_volumes(path: str, roots: Iterable[tuple[str, str]]) -> str | None:
    """`path` (absolute, normalised) moved from the side of each (from_root, to_root) pair to the
    other, through the pair whose from_root holds it most closely; None outside every one."""
    best: tuple[str, str] | None = None
    for source, target in roots:
        source = posixpath.normpath(source)
        if (path == source or path.startswith(source.rstrip("/") + "/")) and (
                best is None or len(source) > len(best[0])):
            best = (source, posixpath.normpath(target))
    if best is None:
        return None
    rest = path[len(best[0]):].lstrip("/")
    return posixpath.join(best[1], rest) if rest else best[1]
