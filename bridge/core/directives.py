"""`#K8S key=value ...` directives and the shebang of a job's original batch script.

Directives follow #SBATCH's rules: they are read only from the leading comment block, i.e. from
the lines after the shebang up to the first line that is neither blank nor a comment. `#K8S` must
start the line; any other comment (including `#k8s`) is just a comment.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, fields

from bridge.core.errors import PermanentError

PREFIX = "#K8S"
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
DEFAULT_INTERPRETER = ("/bin/sh",)

# Kubernetes resource quantity (the subset that makes sense for a size): 512Mi, 8Gi, 1.5G, 1000000.
_QUANTITY = re.compile(r"^(?P<number>[0-9]+(\.[0-9]+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?$")


class DirectiveError(PermanentError, ValueError):
    """A #K8S line is malformed or names an unknown key."""


@dataclass(frozen=True)
class Directives:
    """What the job asked of Kubernetes; None means "not given" (the partition default applies)."""

    image: str | None = None
    """Container image to run the script in."""
    pull_policy: str | None = None
    """imagePullPolicy: one of PULL_POLICIES."""
    workdir: str | None = None
    """Absolute working directory in the container, for images that lack the submit directory."""
    shm_size: str | None = None
    """Size of a memory-backed /dev/shm (counts against the job's memory); the runtime gives 64Mi."""


KEYS = tuple(f.name for f in fields(Directives))


def parse_directives(script: str) -> Directives:
    """The #K8S directives of `script`; raises DirectiveError naming the line on any mistake."""
    values: dict[str, str] = {}
    seen_on: dict[str, int] = {}
    for lineno, line in _leading_comment_block(script):
        if not (line == PREFIX or line.startswith((PREFIX + " ", PREFIX + "\t"))):
            continue
        try:
            words = shlex.split(line[len(PREFIX) :], comments=True)
        except ValueError as exc:
            raise DirectiveError(f"line {lineno}: {exc}: {line!r}") from None
        if not words:
            raise DirectiveError(f"line {lineno}: #K8S without key=value; allowed keys: {_allowed()}")
        for word in words:
            key, sep, value = word.partition("=")
            if not sep:
                raise DirectiveError(
                    f"line {lineno}: expected key=value, got {word!r}; allowed keys: {_allowed()}"
                )
            if key not in KEYS:
                raise DirectiveError(f"line {lineno}: unknown key {key!r}; allowed keys: {_allowed()}")
            if key in seen_on:
                raise DirectiveError(f"line {lineno}: {key} already given on line {seen_on[key]}")
            _check_value(key, value, lineno)
            values[key] = value
            seen_on[key] = lineno
    return Directives(**values)


def interpreter_of(script: str) -> tuple[str, ...]:
    """The command that runs `script`, from its shebang the way Linux reads it.

    Linux passes everything after the interpreter path as one argument (`#!/usr/bin/env -S a b`
    -> ("/usr/bin/env", "-S a b")). A script without a shebang (sbatch refuses those, but the
    payload is input) runs with /bin/sh like execvp's fallback.
    """
    first = script.split("\n", 1)[0].rstrip("\r")
    if not first.startswith("#!"):
        return DEFAULT_INTERPRETER
    parts = first[2:].strip().split(maxsplit=1)
    if not parts:
        return DEFAULT_INTERPRETER
    return tuple(parts)


def _leading_comment_block(script: str) -> list[tuple[int, str]]:
    """(1-based line number, line) of the comment/blank lines that open the script."""
    block: list[tuple[int, str]] = []
    # Split on "\n" only, like the shell; str.splitlines would also split on \f, \x1c and friends.
    for lineno, raw in enumerate(script.split("\n"), start=1):
        line = raw.rstrip()
        if lineno == 1 and line.startswith("#!"):
            continue
        stripped = line.lstrip()
        if stripped and not stripped.startswith("#"):
            break
        block.append((lineno, line))
    return block


def _check_value(key: str, value: str, lineno: int) -> None:
    if not value:
        raise DirectiveError(f"line {lineno}: {key} needs a value")
    if key == "image" and any(c.isspace() for c in value):
        raise DirectiveError(f"line {lineno}: image {value!r} contains whitespace")
    if key == "pull_policy" and value not in PULL_POLICIES:
        raise DirectiveError(
            f"line {lineno}: pull_policy must be one of {', '.join(PULL_POLICIES)}, got {value!r}"
        )
    if key == "workdir" and not value.startswith("/"):
        raise DirectiveError(f"line {lineno}: workdir must be an absolute path, got {value!r}")
    if key == "shm_size" and not _positive_quantity(value):
        raise DirectiveError(f"line {lineno}: shm_size must be a size such as 512Mi or 8Gi, got {value!r}")


def _positive_quantity(value: str) -> bool:
    m = _QUANTITY.match(value)
    return m is not None and float(m.group("number")) > 0


def _allowed() -> str:
    return ", ".join(KEYS)
