"""The building blocks every configuration model shares: how strict they are, and the value types
they repeat. Pure; used by bridge.core.config and bridge.core.config_sections.

Every value is strict (StrictStr & co.: TOML's `true` is never a number, `1` never a string, a
date never a string); only the shapes convert, as TOML needs: an array becomes a tuple or a set,
a table a model. Unknown keys are errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BeforeValidator, ConfigDict, StringConstraints

MODEL_CONFIG = ConfigDict(
    extra="forbid",  # a misspelt key is an error, not a silently ignored default
    validate_by_name=True,  # code builds the models by attribute name; the file uses the aliases
    validate_by_alias=True,
)

NonEmpty = Annotated[str, StringConstraints(strict=True, min_length=1)]
"""A string that must say something: an empty one is always a mistake in this file."""


def _path_text(value: object) -> object:
    if value == "":
        raise ValueError("must not be empty")
    if not isinstance(value, str | Path):
        raise ValueError(f"expected a string, got {type(value).__name__} {value!r}")
    return value


FilePath = Annotated[Path, BeforeValidator(_path_text)]
"""A file's path, written as a string."""
