"""Builds the waiter's one installed file: a zipapp of this package and the pure core modules it
imports (bridge/core/waiter_protocol.py, srun_options.py, slurm_commands.py), nothing else, which
the slurmds run as `/usr/bin/python3 -I -S /usr/libexec/slurm-k8s-bridge/waiter.py ...` (the
default attach_command; a zipapp runs under any file name). Called by
`slurm-k8s-bridge waiter-build DEST`, by `python3 -m bridge.waiter.build DEST` from a checkout, and
by the sandbox's install_waiter (containers/bridge/common.sh). Not itself part of the archive.

The archive holds each module's source and its bytecode, compiled by the Python the slurmds run
(`python`): Python compiles a script it is given at every start, and a module of a zip archive
without usable bytecode too, so bytecode the hosts' Python can read keeps the waiter's start-up
short. Another Python version reads the sources instead. The package roots (bridge/__init__.py,
bridge/core/__init__.py) are stand-ins that import nothing. Its __main__.py starts the waiter
again, once, when a reinstall replaced the file while it started (MAIN).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
import tempfile
import zipapp
import zipfile
from pathlib import Path

BRIDGE = Path(__file__).resolve().parents[1]
ENTRY = "bridge/waiter/main.py"
REEXEC = "SLURM_K8S_BRIDGE_WAITER_REEXEC"
"""Set by the waiter's __main__ for the one start it makes again; popped first thing, so it never
reaches the job's environment (the waiter sends that to the pods)."""
MAIN = f'''"""The job-side waiter of slurm-k8s-bridge, built by bridge/waiter/build.py."""
import os
import sys

started_again = os.environ.pop({REEXEC!r}, None)
try:
    from bridge.waiter.main import main
except Exception:
    # zipimport read this archive's directory at start and reopens the file for each module: a
    # reinstall that replaced the file in between gives `bad local file header` (or another
    # module's bytes). Start again, once, from the new file. Nothing before this unblocked a
    # signal: the ones the step guard holds stay pending across the exec.
    if started_again is not None:
        raise
    os.environ[{REEXEC!r}] = "1"
    os.execv(sys.executable, getattr(sys, "orig_argv", [sys.executable, "-I", "-S", *sys.argv]))

sys.exit(main(sys.argv[1:]))
'''
PACKAGE_ROOTS = {
    "bridge/__init__.py": '"""slurm-k8s-bridge: here only the job-side waiter and what it imports."""\n',
    "bridge/core/__init__.py": '"""The pure core modules the waiter shares with the daemon."""\n',
    "bridge/waiter/__init__.py": None,  # its own: a docstring only
}
COMPILE = (
    "import py_compile, sys\n"
    "for path, shown in zip(sys.argv[1::2], sys.argv[2::2]):\n"
    "    py_compile.compile(path, path + 'c', shown, doraise=True,\n"
    "                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)\n"
)


def modules() -> list[str]:
    """The bridge modules the waiter runs, as paths under the repository root: main.py and every
    bridge module it imports, directly or not."""
    seen: set[str] = set()
    todo = [ENTRY]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in _bridge_imports(BRIDGE.parent / path):
            todo.append(_module_path(name))
    return sorted(seen)


def _bridge_imports(path: Path) -> set[str]:
    """Dotted names of the bridge modules `path` imports (absolute imports only: the waiter uses
    no relative ones), each package in the name included."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in found:
            parts = name.split(".")
            if parts[0] != "bridge":
                continue
            for end in range(2, len(parts) + 1):
                dotted = ".".join(parts[:end])
                if (BRIDGE.parent / _module_path(dotted)).exists():
                    names.add(dotted)
    return names


def _module_path(dotted: str) -> str:
    as_path = dotted.replace(".", "/")
    return f"{as_path}/__init__.py" if (BRIDGE.parent / as_path).is_dir() else f"{as_path}.py"


def staged_sources() -> dict[str, bytes]:
    """The sources the archive holds, by their names in it: each module's file of this checkout, or
    its stand-in (the package roots, __main__.py)."""
    sources: dict[str, bytes] = {}
    for relative in [*sorted(set(modules()) | set(PACKAGE_ROOTS)), "__main__.py"]:
        stand_in = MAIN if relative == "__main__.py" else PACKAGE_ROOTS.get(relative)
        sources[relative] = (BRIDGE.parent / relative).read_bytes() if stand_in is None else stand_in.encode()
    return sources


def archive_problems(
    archive: zipfile.ZipFile, sources: dict[str, bytes], *, bytecode: bool = True
) -> list[str]:
    """How `archive` differs from a build of `sources` (staged_sources()): a source missing, added
    or not the same, or bytecode that was not compiled from the source beside it (the source hash
    its unchecked-hash header carries). Empty when it is that build. Bytecode is checked by this
    Python, so it must be of this Python's version; `bytecode=False` leaves it to the Python that
    compiled it (the slurmds' may be another version than the checker's)."""
    problems: list[str] = []
    names = {name for name in archive.namelist() if not name.endswith("/")}
    expected = set(sources) | {name + "c" for name in sources}
    problems += [f"{name}: missing" for name in sorted(expected - names)]
    problems += [f"{name}: not the waiter's" for name in sorted(names - expected)]
    for name in sorted(set(sources) & names):
        if archive.read(name) != sources[name]:
            problems.append(f"{name}: not this checkout's")
        if name + "c" not in names or not bytecode:
            continue
        header = archive.read(name + "c")[:16]
        if header[:4] != importlib.util.MAGIC_NUMBER:
            problems.append(f"{name}c: bytecode of another Python than this check's")
        elif int.from_bytes(header[4:8], "little") != 0b01:  # hash-based, unchecked
            problems.append(f"{name}c: not unchecked-hash bytecode")
        elif header[8:16] != importlib.util.source_hash(sources[name]):
            problems.append(f"{name}c: not compiled from {name}")
    return problems


SLURMD_PYTHON = "/usr/bin/python3"
"""The Python the default attach_command runs the waiter with."""


def default_python() -> str:
    """The Python to compile the waiter's bytecode with when none is named: the slurmds' (the
    default attach_command's), where this host has it, else this one (a venv's, maybe)."""
    return SLURMD_PYTHON if os.access(SLURMD_PYTHON, os.X_OK) else sys.executable


def build(dest: str | os.PathLike[str], python: str | None = None) -> Path:
    """Write the waiter's zipapp to `dest` (replaced at once: a slurmd never runs half of it), mode
    644, its bytecode compiled by `python` (default_python() if None). Returns its path."""
    python = python or default_python()
    target = Path(dest).absolute()
    target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="waiter-build-") as tmp:
        stage = Path(tmp) / "waiter"
        sources = staged_sources()
        for relative, source in sources.items():
            staged = stage / relative
            staged.parent.mkdir(parents=True, exist_ok=True)
            staged.write_bytes(source)
        # Each module compiled under its installed name (the archive's path, as zipimport names
        # its source): with a relative name, a traceback would print lines of a file by that name
        # in the current directory, the user's at start.
        pairs = [word for relative in sources for word in (str(stage / relative), f"{target}/{relative}")]
        subprocess.run([python, "-I", "-S", "-c", COMPILE, *pairs], check=True, timeout=120)
        partial = target.with_name(f".{target.name}.new")
        zipapp.create_archive(stage, partial)
    os.chmod(partial, 0o644)
    os.replace(partial, target)
    return target


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: python3 -m bridge.waiter.build DEST [PYTHON]")
    compiler = sys.argv[2] if len(sys.argv) == 3 else default_python()
    print(f"{build(sys.argv[1], compiler)} (bytecode compiled by {compiler})")
