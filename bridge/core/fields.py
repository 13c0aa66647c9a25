"""Reading fields of Kubernetes API dicts defensively: a missing or mistyped field reads as empty.
Shared by the pure modules that read pods (outcome) and nodes (nodehealth)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def as_map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def as_list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def as_str(value: object) -> str:
    return value if isinstance(value, str) else ""


def as_int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def because(reason: str, message: str) -> str:
    """"Reason: message", or whichever of the two there is."""
    return f"{reason}: {message}" if reason and message else reason or message
