"""The layers of docs/architecture.md are folders of bridge/, and imports only point down:
core <- clients <- controller <- manager. (The waiter that runs on the slurmd hosts is the compiled
agent/cmd/waiter, no part of bridge/.)"""

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
}


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
    for line, name in _bridge_imports(path):
        if name.split(".")[1] not in MAY_IMPORT[layer]:
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


def test_the_checker_sees_the_controller_import_the_manager(tmp_path: Path) -> None:
    bad = BRIDGE / "controller" / "_probe_violation.py"
    bad.write_text("from bridge.core.wellknown import PREFIX\n"
                   "from bridge.manager.api import serve\n")
    try:
        with pytest.raises(AssertionError, match=r"line 2: bridge\.manager\.api"):
            test_imports_point_down(bad)
    finally:
        bad.unlink()
