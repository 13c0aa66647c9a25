"""slurmstepd starts a bridged job's batch step only if its script begins with exactly the wrapper
job_submit.lua writes: the guard (C) and job_submit.lua (Lua) must agree on those lines."""

from __future__ import annotations

import re
from pathlib import Path

DEPLOY = Path(__file__).parents[2] / "deploy" / "slurm"


def _lua_wrapper_lines() -> list[str]:
    lua = (DEPLOY / "job_submit.lua").read_text()
    header = re.search(r'local WRAPPER_HEADER = "([^"]*)"', lua).group(1)  # type: ignore[union-attr]
    rewrite = lua[lua.index('job_desc.script = "#!/bin/sh\\n"'):]
    rewrite = rewrite[: rewrite.index("return slurm.SUCCESS")]
    # The literal pieces of the concatenation, WRAPPER_HEADER substituted.
    pieces = re.findall(r'"((?:[^"\\]|\\.)*)"|(WRAPPER_HEADER)', rewrite)
    text = "".join(header if name else literal for literal, name in pieces)
    return text.encode().decode("unicode_escape").split("\n")[:3]


def _guard_wrapper_lines() -> list[str]:
    guard = (DEPLOY / "spank" / "slurm_k8s_bridge_guard.c").read_text()
    lines = [re.search(rf'#define WRAPPER_LINE{i} "(.*)"\n', guard).group(1) for i in (1, 2, 3)]  # type: ignore[union-attr]
    return [line.encode().decode("unicode_escape").rstrip("\n") for line in lines]


def test_the_guard_expects_the_lines_job_submit_writes() -> None:
    lua = _lua_wrapper_lines()
    assert lua[0] == "#!/bin/sh" and lua[1].startswith("# slurm-k8s-bridge: rewritten batch script")
    assert _guard_wrapper_lines() == lua
