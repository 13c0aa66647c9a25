"""JSON lines between the test process (host) and the pyslurm server (Slurm rootfs).

Lossless for JobAllocation and JobListing (a decoded record compares equal to the original), so the
tests compare what the pyslurm backend really returned. Imports nothing but the bridge's pure layer,
bridge.core.errors and bridge.clients.slurm's records: this file also runs in the rootfs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from bridge.clients.slurm import JobListing
from bridge.core import errors
from bridge.core.model import JobAllocation, NodeAllocation


def allocation_to_json(alloc: JobAllocation) -> dict[str, Any]:
    data = dataclasses.asdict(alloc)
    data["state_flags"] = sorted(alloc.state_flags)
    data["nodes"] = [{**dataclasses.asdict(n), "gpu_indices": list(n.gpu_indices)} for n in alloc.nodes]
    return data


def allocation_from_json(data: dict[str, Any]) -> JobAllocation:
    nodes = tuple(
        NodeAllocation(**{**n, "gpu_indices": tuple(n["gpu_indices"])}) for n in data["nodes"]
    )
    return JobAllocation(**{**data, "state_flags": frozenset(data["state_flags"]), "nodes": nodes})


def listing_to_json(listing: JobListing) -> dict[str, Any]:
    return {"read_at": listing.read_at, "jobs": [allocation_to_json(j) for j in listing.jobs],
            "unreadable": sorted(listing.unreadable)}


def listing_from_json(data: dict[str, Any]) -> JobListing:
    return JobListing(read_at=data["read_at"], jobs=tuple(allocation_from_json(j) for j in data["jobs"]),
                      unreadable=frozenset(data["unreadable"]))


def error_to_json(error: BaseException) -> dict[str, Any]:
    return {
        "type": type(error).__name__,
        "bases": [cls.__name__ for cls in type(error).__mro__],
        "message": str(error),
        "errno": getattr(error, "errno", None),
    }


class RemoteError(errors.BridgeError):
    """An error the pyslurm server raised; `kind` is its class name there."""

    def __init__(self, kind: str, message: str, errno: int | None) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.errno = errno


# The shared classes a verb's error is re-raised as on the host: its nearest one of these.
_KNOWN: dict[str, type[errors.BridgeError]] = {
    cls.__name__: cls
    for cls in (errors.SlurmUnavailable, errors.SlurmAuthError, errors.TemporaryError, errors.PermanentError)
}


def error_from_json(data: dict[str, Any]) -> errors.BridgeError:
    """The error as its nearest shared class (SlurmUnavailable, PermanentError...), else RemoteError."""
    for name in data.get("bases", [data["type"]]):
        if name in _KNOWN:
            return _KNOWN[name](f"{data['type']}: {data['message']}")
    return RemoteError(data["type"], data["message"], data.get("errno"))
