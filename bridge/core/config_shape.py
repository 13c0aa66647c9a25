"""How the configuration models' types read as TOML: which are tables, which arrays, what they hold.
Pure; config_errors reads it to word an error, manager/config_reference to write the reference.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, NotRequired, Required, Union, get_args, get_origin, get_type_hints

from typing_extensions import is_typeddict

_ARRAYS = (tuple, frozenset, list, set)
_TABLES_OF = (Mapping, dict)


def bare(kind: Any) -> Any:
    """The type inside Annotated[X, ...], NotRequired[X] and `X | None`."""
    while True:
        if get_origin(kind) in (typing.Annotated, NotRequired, Required):
            kind = get_args(kind)[0]
        elif get_origin(kind) in (Union, types.UnionType):
            kind = next(arg for arg in get_args(kind) if arg is not type(None))
        else:
            return kind


def is_table(kind: Any) -> bool:
    """A model (a config dataclass or a TypedDict): a TOML table with keys of its own."""
    return (isinstance(kind, type) and dataclasses.is_dataclass(kind)) or is_typeddict(kind)


def is_mapping(kind: Any) -> bool:
    """A table of any keys (partitions by name, annotations)."""
    return get_origin(kind) in _TABLES_OF


def item_type(kind: Any) -> Any:
    """What an array holds, or the values of a table of any keys (bare); None for anything else."""
    origin, args = get_origin(kind), get_args(kind)
    if origin in _ARRAYS and args:
        return bare(args[0])
    if origin in _TABLES_OF and len(args) == 2:
        return bare(args[1])
    return None


def table_fields(kind: Any) -> dict[str, Any]:
    """A model's TOML keys (aliases where set) and their types, in order; {} for anything else."""
    if is_typeddict(kind):
        return dict(get_type_hints(kind, include_extras=True))
    if not is_table(kind):
        return {}
    hints = get_type_hints(kind, include_extras=True)
    infos = getattr(kind, "__pydantic_fields__", {})
    return {(infos[f.name].alias if f.name in infos and infos[f.name].alias else f.name): hints[f.name]
            for f in dataclasses.fields(kind)}


def type_at(root: Any, loc: tuple[int | str, ...]) -> Any:
    """The type that validates what is at `loc` (a pydantic error's location) below `root`; None
    where the path leaves the models."""
    kind = bare(root)
    for part in loc:
        fields = table_fields(kind)
        kind = bare(fields.get(str(part))) if fields else item_type(kind)
        if kind is None:
            return None
    return kind


def literal_choices(kind: Any) -> tuple[Any, ...]:
    """The values of a Literal type (() for any other)."""
    return get_args(kind) if get_origin(kind) is Literal else ()
