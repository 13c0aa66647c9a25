"""The waiter is installed as one file: a zipapp of bridge/waiter and the pure core modules it shares
with the daemon, which the slurmds run as `/usr/bin/python3 -I -S /usr/libexec/slurm-k8s-bridge/waiter.py`
(any file name works). It holds those modules and
nothing else, imports only the standard library when it runs, and carries bytecode so that its
start-up compiles nothing."""

from __future__ import annotations

import ast
import io
import json
import socket
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest

from bridge.core.waiter_protocol import request_digest
from bridge.manager import cli
from bridge.waiter import build
from bridge.waiter.attach import MARKER
from bridge.waiter.main import USAGE

ROOT = Path(__file__).resolve().parents[2]
# Never imported on the way to the waiter's first act: typing (annotations only), hashlib and
# OpenSSL (SHA-256 is Python's own), random (os.urandom), and what only some jobs need.
HEAVY = {"typing", "hashlib", "_hashlib", "random", "http", "http.client", "ssl", "queue",
         "urllib", "email", "bridge.waiter.build", "bridge.manager", "bridge.core.config"}


@pytest.fixture(scope="module")
def waiter_pyz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("libexec") / "waiter.pyz"
    # Compiled by the Python running these tests: its bytecode is checked below.
    assert cli.main(["waiter-build", "--python", sys.executable, str(dest)]) == 0
    return dest


def _run(
    pyz: Path, *args: str, flags: tuple[str, ...] = (), cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *flags, "-I", "-S", str(pyz), *args], capture_output=True,
                          text=True, timeout=60, check=False, cwd=cwd, env={"PATH": "/usr/bin:/bin"})


def test_the_archive_holds_the_waiters_modules_and_nothing_else(waiter_pyz: Path) -> None:
    with zipfile.ZipFile(waiter_pyz) as archive:
        names = {name for name in archive.namelist() if not name.endswith("/")}
    sources = {name for name in names if name.endswith(".py")}
    assert sources == {*build.modules(), "bridge/__init__.py", "__main__.py"}
    assert {name for name in sources if name.startswith("bridge/core/")} == {
        "bridge/core/__init__.py", "bridge/core/waiter_protocol.py", "bridge/core/srun_options.py",
        "bridge/core/slurm_commands.py"}
    assert "bridge/waiter/build.py" not in sources and "bridge/core/config.py" not in sources
    assert names - sources == {name + "c" for name in sources}, "each module's bytecode beside it"
    assert waiter_pyz.stat().st_mode & 0o777 == 0o644


def test_the_archive_is_the_staged_sources_and_their_bytecode(waiter_pyz: Path) -> None:
    """What the e2e suite checks of the installed waiter against its checkout: the stand-ins are
    the archive's, and each module's bytecode is compiled from the source beside it."""
    sources = build.staged_sources()
    assert sources["bridge/core/__init__.py"] != (ROOT / "bridge/core/__init__.py").read_bytes()
    assert sources["bridge/waiter/main.py"] == (ROOT / "bridge/waiter/main.py").read_bytes()
    assert sources["__main__.py"] == build.MAIN.encode()
    with zipfile.ZipFile(waiter_pyz) as archive:
        assert build.archive_problems(archive, sources) == []
        entries = {name: archive.read(name) for name in archive.namelist() if not name.endswith("/")}

    def problems(changed: dict[str, bytes | None]) -> list[str]:
        copy = io.BytesIO()
        with zipfile.ZipFile(copy, "w") as target:
            for name, data in {**entries, **changed}.items():
                if data is not None:
                    target.writestr(name, data)
        with zipfile.ZipFile(copy) as archive:
            return build.archive_problems(archive, sources)

    main_pyc = entries["bridge/waiter/main.pyc"]
    assert problems({"bridge/waiter/main.py": b"print('other')\n"}) == [
        "bridge/waiter/main.py: not this checkout's"]
    assert problems({"bridge/waiter/main.pyc": entries["bridge/waiter/task.pyc"]}) == [
        "bridge/waiter/main.pyc: not compiled from bridge/waiter/main.py"]
    assert problems({"bridge/waiter/main.pyc": main_pyc[:4] + b"\0\0\0\0" + main_pyc[8:]}) == [
        "bridge/waiter/main.pyc: not unchecked-hash bytecode"]
    assert problems({"bridge/waiter/main.pyc": b"\0\0\r\n" + main_pyc[4:]}) == [
        "bridge/waiter/main.pyc: bytecode of another Python than this check's"]
    assert problems({"bridge/waiter/task.py": None, "bridge/extra.py": b""}) == [
        "bridge/waiter/task.py: missing", "bridge/extra.py: not the waiter's"]


def test_a_traceback_shows_the_archives_lines_not_the_submit_directorys(
    waiter_pyz: Path, tmp_path: Path
) -> None:
    """Compiled under its installed name: a traceback before the waiter leaves the submit directory
    reads no file there."""
    planted = tmp_path / "bridge" / "waiter" / "main.py"
    planted.parent.mkdir(parents=True)
    planted.write_text("PLANTED LINE\n" * 200)
    result = subprocess.run([sys.executable, "-I", "-S", str(waiter_pyz), "no-such-script"],
                            capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path,
                            env={"SLURM_JOB_ID": "7"})
    assert result.returncode == 1 and "FileNotFoundError" in result.stderr
    assert f'File "{waiter_pyz}/bridge/waiter/main.py", line ' in result.stderr
    assert "PLANTED" not in result.stderr


def test_the_archives_package_roots_import_nothing(waiter_pyz: Path) -> None:
    with zipfile.ZipFile(waiter_pyz) as archive:
        for name in ("bridge/__init__.py", "bridge/core/__init__.py", "bridge/waiter/__init__.py"):
            tree = ast.parse(archive.read(name))
            assert [type(node).__name__ for node in tree.body] == ["Expr"], f"{name}: a docstring only"


def test_it_runs_isolated_and_says_how_to_call_it(waiter_pyz: Path) -> None:
    result = _run(waiter_pyz)
    assert result.returncode == 2
    assert result.stderr == f"slurm-k8s-bridge: {USAGE}\n"
    assert "[--api URL] [--ca CA_FILE] BATCH_SCRIPT [ARG...] | task KEY" in USAGE


def test_it_refuses_a_batch_script_job_submit_did_not_rewrite(waiter_pyz: Path, tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    result = subprocess.run([sys.executable, "-I", "-S", str(waiter_pyz), str(script)], capture_output=True,
                            text=True, timeout=60, check=False, env={"SLURM_JOB_ID": "7"})
    assert result.returncode == 1
    assert "was not rewritten by the bridge's job_submit.lua" in result.stderr


def test_it_imports_only_the_standard_library_and_its_own_modules(waiter_pyz: Path) -> None:
    result = _run(waiter_pyz, flags=("-X", "importtime"))
    imported = {line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines()
                if line.startswith("import time:") and "|" in line}
    imported.discard("imported package")  # the header line
    archived = {path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
                for path in build.modules()} | {"bridge"}
    own = {name for name in imported if name.split(".")[0] == "bridge"}
    assert own == archived, "it loads every module it holds, and nothing else of the bridge"
    # Python's own SHA-256 module is `_sha2` from 3.12 on, `_sha256` before.
    stdlib = set(sys.stdlib_module_names) | {"_sha2", "_sha256"}
    assert {name for name in imported - own if name.split(".")[0] not in stdlib} == set()
    assert imported & HEAVY == set()


def test_a_planted_bridge_in_the_submit_directory_is_never_imported(waiter_pyz: Path, tmp_path: Path) -> None:
    for name in ("bridge/__init__.py", "bridge/waiter/__init__.py", "bridge/waiter/main.py", "json.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("raise SystemExit('planted module imported')\n")
    result = _run(waiter_pyz, cwd=tmp_path)
    assert "planted" not in result.stderr and result.returncode == 2


def test_its_modules_come_from_their_bytecode(waiter_pyz: Path) -> None:
    """Compiled by the Python that runs it (here: the build's): nothing is compiled at start-up."""
    probe = (f"import sys; sys.path.insert(0, {str(waiter_pyz)!r}); import bridge.waiter.main\n"
             "print(sorted(m.__file__.rsplit('/', 1)[1] for n, m in sys.modules.items()\n"
             "             if n.startswith('bridge')))")
    result = subprocess.run([sys.executable, "-I", "-S", "-c", probe], capture_output=True, text=True,
                            timeout=60, check=True)
    loaded = eval(result.stdout)  # a list of file names, printed by the probe above
    assert len(loaded) == len(build.modules()) + 1
    assert all(name.endswith(".pyc") for name in loaded), loaded


def test_it_is_compiled_by_the_slurmds_python_unless_told(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not by the venv's Python the CLI runs in: by the default attach_command's, where this host
    has it, and it says which."""
    used = tmp_path / "used"
    slurmd_python = tmp_path / "python3"
    slurmd_python.write_text(f"#!/bin/sh\necho \"$@\" >> {used}\nexec {sys.executable} \"$@\"\n")
    slurmd_python.chmod(0o755)
    monkeypatch.setattr(build, "SLURMD_PYTHON", str(slurmd_python))
    assert cli.main(["waiter-build", str(tmp_path / "waiter.py")]) == 0
    assert capsys.readouterr().out == f"{tmp_path / 'waiter.py'} (bytecode compiled by {slurmd_python})\n"
    assert "py_compile" in used.read_text()
    used.unlink()
    monkeypatch.setattr(build, "SLURMD_PYTHON", str(tmp_path / "absent"))
    assert cli.main(["waiter-build", str(tmp_path / "waiter.py")]) == 0
    assert capsys.readouterr().out == f"{tmp_path / 'waiter.py'} (bytecode compiled by {sys.executable})\n"
    assert cli.main(["waiter-build", "--python", str(slurmd_python), str(tmp_path / "waiter.py")]) == 0
    assert capsys.readouterr().out.endswith(f" (bytecode compiled by {slurmd_python})\n")
    assert "py_compile" in used.read_text()


def test_it_is_built_into_a_new_directory_too(tmp_path: Path) -> None:
    dest = tmp_path / "libexec" / "slurm-k8s-bridge" / "waiter.py"  # the default config's path
    assert cli.main(["waiter-build", "--python", sys.executable, str(dest)]) == 0
    assert _run(dest).returncode == 2, "a zipapp runs under any name"
    assert dest.parent.stat().st_mode & 0o022 == 0


def test_a_rebuild_replaces_the_file_whole(tmp_path: Path) -> None:
    dest = tmp_path / "waiter.pyz"
    dest.write_text("an older waiter\n")
    build.build(dest)
    assert zipfile.is_zipfile(dest)
    assert [p.name for p in tmp_path.iterdir()] == ["waiter.pyz"], "no partial file left beside it"


def test_bytecode_of_another_python_falls_back_to_the_sources(waiter_pyz: Path, tmp_path: Path) -> None:
    """Built by a Python whose bytecode the slurmds' cannot read: it still runs, from its sources."""
    other = tmp_path / "waiter.pyz"
    with zipfile.ZipFile(waiter_pyz) as source, zipfile.ZipFile(other, "w") as target:
        for name in source.namelist():
            data = source.read(name)
            if name.endswith(".pyc"):
                data = b"\x00\x00\r\n" + data[4:]  # no Python's magic number
            target.writestr(name, data)
    result = _run(other)
    assert result.returncode == 2 and result.stderr == f"slurm-k8s-bridge: {USAGE}\n"


def test_a_job_run_from_the_archive_ends_with_its_pods_code(waiter_pyz: Path, tmp_path: Path) -> None:
    """The archive's modules together: attach, print the pods' log, exit with their code. munge is
    the one stand-in (none on this host): it returns the digest it was asked to carry."""
    listener = socket.create_server(("127.0.0.1", 0))
    requests: list[bytes] = []

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            while len(body) < length:
                body += conn.recv(65536)
            requests.append(head + b"\r\n\r\n" + body)
            conn.sendall(b"HTTP/1.0 200 OK\r\n\r\n" + b"".join(json.dumps(e).encode() + b"\n" for e in (
                {"type": "log", "pod": 0, "ts": "t1", "line": "hello from the pod"},
                {"type": "exit", "code": 3, "signal": None})))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    script = tmp_path / "slurm_script"
    script.write_text(f"#!/bin/sh\nexec waiter \"$0\"\n{MARKER}\n#!/bin/sh\necho hi\n")
    api = f"http://127.0.0.1:{listener.getsockname()[1]}"
    program = (f"import sys; sys.path.insert(0, {str(waiter_pyz)!r})\n"
               "from bridge.waiter import munge\n"
               "munge.munge_credential = lambda payload: payload\n"
               "from bridge.waiter.main import main\n"
               f"sys.exit(main(['--api', {api!r}, {str(script)!r}]))\n")
    try:
        result = subprocess.run([sys.executable, "-I", "-S", "-c", program], capture_output=True, text=True,
                                timeout=60, check=False, cwd=tmp_path, env={"SLURM_JOB_ID": "42"})
    finally:
        thread.join(timeout=10)
        listener.close()

    assert (result.returncode, result.stdout) == (3, "hello from the pod\n"), result.stderr
    head, _, body = requests[0].partition(b"\r\n\r\n")
    assert head.startswith(b"POST /v1/jobs/42/attach HTTP/1.0\r\n")
    assert json.loads(body)["script"] == "#!/bin/sh\necho hi\n"
    credential = head.split(b"X-Munge-Credential: ")[1].split(b"\r\n")[0].decode()
    assert credential == request_digest("POST", "/v1/jobs/42/attach", 42, body)
