"""How a configuration error reads: `<file>: <key path>: <what is wrong>`, one line per problem. Pure.

pydantic finds the problems (bridge.core.config's models); this module words them the way an
operator reads a TOML file: keys by their TOML names (`partitions.k8s.volumes[0].name`), types
as TOML calls them, the choices of a closed set and the keys a table knows. Validators raise
KeyProblem when the key at fault is not the one being validated (a cross-field check).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from bridge.core.config_shape import is_table, literal_choices, table_fields, type_at
from bridge.core.errors import PermanentError


class ConfigError(PermanentError, ValueError):
    """The configuration is invalid; the message names the file and the key."""


class KeyProblem(ValueError):
    """A validator's finding about `key` (a dotted path below the object being validated; empty:
    the object itself)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


_TYPE_ERRORS = {
    "string_type": "a string", "bool_type": "true or false", "int_type": "an integer",
    "float_type": "a number", "path_type": "a string",
}
_TABLE_ERRORS = frozenset(
    {"dict_type", "dataclass_type", "dataclass_exact_type", "model_type", "typed_dict_type"}
)
_ARRAY_ERRORS = frozenset({"tuple_type", "list_type", "frozen_set_type", "set_type"})


def config_error(error: ValidationError, root: type, source: str) -> ConfigError:
    """One ConfigError for every problem pydantic found validating `root` from TOML."""
    return ConfigError("\n".join(f"{source}: {_describe(detail, root)}" for detail in error.errors()))


def _describe(detail: ErrorDetails, root: type) -> str:
    loc = tuple(detail["loc"])
    kind = detail["type"]
    ctx = detail.get("ctx") or {}
    value = detail.get("input")
    if kind == "value_error" and isinstance(ctx.get("error"), KeyProblem):
        problem: KeyProblem = ctx["error"]
        return f"{_path(loc + tuple(problem.key.split('.') if problem.key else ()))}: {problem}"
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):
        known = ", ".join(sorted(table_fields(type_at(root, loc[:-1]))))
        return f"{_path(loc)}: unknown key (known here: {known or 'none'})"
    return f"{_path(loc)}: {_message(kind, ctx, value, detail['msg'], root, loc)}"


def _message(kind: str, ctx: Mapping[str, Any], value: object, fallback: str, root: type,
             loc: tuple[int | str, ...]) -> str:
    got = f"got {type(value).__name__} {value!r}"
    if kind == "value_error":
        return str(ctx.get("error") or fallback)
    if kind == "missing":
        return "required"
    if kind in _TYPE_ERRORS:
        return f"expected {_TYPE_ERRORS[kind]}, {got}"
    if kind in _TABLE_ERRORS:
        return f"expected a table, {got}"
    if kind in _ARRAY_ERRORS:
        tables = is_table(type_at(root, (*loc, 0)))
        return f"expected an array{' of tables' if tables else ''}, {got}"
    if kind == "string_too_short" or (kind == "literal_error" and value == ""):
        return "must not be empty"
    if kind == "literal_error":
        choices = ", ".join(map(repr, literal_choices(type_at(root, loc))))
        return f"must be one of {choices}, got {value!r}"
    if kind == "greater_than":
        return f"must be greater than {ctx['gt']}"
    if kind == "greater_than_equal":
        return f"must be at least {ctx['ge']}"
    if kind == "less_than_equal":
        return f"must be at most {ctx['le']}"
    return fallback


def _path(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "top level"
