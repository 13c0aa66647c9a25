"""The layers of docs/architecture.md are folders of bridge/, and imports only point down:
core <- clients <- controller <- manager. The waiter runs alone on the slurmd hosts (a zipapp of
bridge/waiter): it imports itself and the pure core modules it shares with the daemon, nothing
else; of the rest, only the command line imports the waiter (to run it, or build it)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

BRIDGE = Path(__file__).parents[2] / "bridge"
LAYERS = ("core", "clients", "controller", "manager")
MAY_IMPORT = {
    "core": {"core"},
    "clients": {"core", "clients"},
    "controller": {"core", "clients", "controller"},
    "manager": {"core", "clients", "controller", "manager"},
    "waiter": {"waiter"},
}
WAITER_SHARES = {"bridge.core.waiter_protocol", "bridge.core.srun_options", "bridge.core.slurm_commands"}
"""The core modules the waiter imports: pure and standard library only, as the waiter is."""
WAITER_IMPORTERS = {"manager/cli.py"}


def _modules() -> list[Path]:
    return sorted(p for p in BRIDGE.rglob("*.py") if "__pycache__" not in p.parts)


def _layer_of(path: Path) -> str | None:
    relative = path.relative_to(BRIDGE).parts
    return relative[0] if len(relative) > 1 else None


def _bridge_imports(path: Path) -> list[tuple[int, str]]:
    """(line, dotted module) of every import of a bridge module, relative ones resolved."""
    package = ["bridge", *path.relative_to(BRIDGE).parts[:-1]]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{alias.name}" for alias in node.names] if base in ("bridge",) else [base]
            found += [(node.lineno, name) for name in names]
    # The package root holds only __version__: anyone may read it.
    return [(line, name) for line, name in found
            if name.startswith("bridge.") and name != "bridge.__version__"]


def test_every_module_lives_in_a_layer() -> None:
    loose = [p.name for p in _modules() if _layer_of(p) is None and p.name != "__init__.py"]
    assert loose == [], f"modules outside the layer folders: {loose}"
    assert {p.name for p in BRIDGE.iterdir() if p.is_dir() and p.name != "__pycache__"} == set(MAY_IMPORT)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(BRIDGE)))
def test_imports_point_down(path: Path) -> None:
    layer = _layer_of(path)
    if layer is None:
        assert _bridge_imports(path) == [], "bridge/__init__.py imports nothing"
        return
    wrong = []
    relative = path.relative_to(BRIDGE).as_posix()
    for line, name in _bridge_imports(path):
        allowed = name.split(".")[1] in MAY_IMPORT[layer]
        allowed |= layer == "waiter" and any(name == m or name.startswith(m + ".") for m in WAITER_SHARES)
        allowed |= relative in WAITER_IMPORTERS and name.split(".")[1] == "waiter"
        if not allowed:
            wrong.append(f"line {line}: {name}")
    assert wrong == [], f"{layer} may import only {sorted(MAY_IMPORT[layer])}"


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    """The rule can fail: a core module importing the controller is caught."""
    bad = BRIDGE / "core" / "_probe_violation.py"
    bad.write_text("from bridge.controller import reconcile\n")
    try:
        with pytest.raises(AssertionError, match="core may import only"):
            test_imports_point_down(bad)
    finally:
        bad.unlink()


def test_the_checker_sees_the_waiter_import_more_of_the_core(tmp_path: Path) -> None:
    """The waiter may import the core modules it shares, not the rest of the core."""
    bad = BRIDGE / "waiter" / "_probe_violation.py"
    bad.write_text("from bridge.core.waiter_protocol import FORWARDED\n"
                   "from bridge.core.wellknown import PREFIX\n")
    try:
        with pytest.raises(AssertionError, match=r"line 2: bridge\.core\.wellknown"):
            test_imports_point_down(bad)
    finally:
        bad.unlink()


def test_the_checker_sees_the_daemon_import_the_waiter(tmp_path: Path) -> None:
    bad = BRIDGE / "manager" / "_probe_violation.py"
    bad.write_text("from bridge.waiter.http_client import post\n")
    try:
        with pytest.raises(AssertionError, match="manager may import only"):
            test_imports_point_down(bad)
    finally:
        bad.unlink()
