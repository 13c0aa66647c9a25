"""A partition's pod annotations as templates: `${NAME}` and `${NAME:-default}` expanded from the job's
environment, as sh does. Pure; called by translate for every pod.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def expand_annotations(templates: Mapping[str, str], environment: Mapping[str, str]) -> dict[str, str]:
    """The partition's pod annotations with `${NAME}` replaced by the job's variable NAME, and
    `${NAME:-default}` by the default (which may hold `${...}` itself) when NAME is unset or
    empty, as in sh. Values from the job are inserted as they are, never expanded again."""
    return {key: _expand(value, environment) for key, value in templates.items()}


def _expand(text: str, environment: Mapping[str, str]) -> str:
    out, _ = _expand_until(text, 0, environment, closing=False)
    return out


def _expand_until(text: str, pos: int, env: Mapping[str, str], *, closing: bool) -> tuple[str, int]:
    """Expand from `pos` to the end, or (closing) to the `}` that ends a default; return the text
    and the position after it."""
    out: list[str] = []
    while pos < len(text):
        if closing and text[pos] == "}":
            return "".join(out), pos + 1
        name = _NAME.match(text, pos + 2) if text.startswith("${", pos) else None
        if name is None:
            out.append(text[pos])
            pos += 1
            continue
        pos = name.end()
        default = ""
        if text.startswith(":-", pos):
            default, pos = _expand_until(text, pos + 2, env, closing=True)
        elif text.startswith("}", pos):
            pos += 1
        else:  # not a reference after all: keep it literally
            out.append(text[name.start() - 2:pos])
            continue
        out.append(env.get(name.group()) or default)
    return "".join(out), pos
