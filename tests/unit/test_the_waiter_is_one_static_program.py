"""The waiter is installed as one file: the compiled agent/cmd/waiter, static and stripped, which
the slurmds run by its absolute path (any file name works). It says how to call it, refuses a
batch script job_submit.lua did not rewrite, reads nothing of the submit directory but the
script, and runs a job to its pods' exit code. (It replaces the zipapp of bridge/waiter.)"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from bridge.core.waiter_protocol import request_digest

from .waiter_runs import (
    Exchange,
    FakeDaemon,
    built_go_waiter,
    fakes,
    go_waiter,
    require_namespaces,
    run_waiter,
    streaming,
)

require_namespaces()

USAGE = "usage: waiter [--api URL] [--ca CA_FILE] BATCH_SCRIPT [ARG...] | task KEY | step -- ARGV..."


@pytest.fixture(scope="module")
def waiter(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return go_waiter(tmp_path_factory.mktemp("libexec"))


def _run(
    waiter: list[str], *args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*waiter, *args], capture_output=True, text=True, timeout=60, check=False, cwd=cwd,
                          env={"PATH": "/usr/bin:/bin"} if env is None else env)


def test_it_is_one_static_stripped_program() -> None:
    """No dynamic loader or libraries (nothing on the slurmd host it depends on, nothing to
    preload into), no symbols or debug sections (as it ships: -s -w)."""
    binary = str(built_go_waiter())
    program_headers = subprocess.run(["readelf", "-lW", binary], capture_output=True, check=True).stdout
    assert b"INTERP" not in program_headers and b"DYNAMIC" not in program_headers
    sections = subprocess.run(["readelf", "-SW", binary], capture_output=True, check=True).stdout
    assert b".symtab" not in sections and b".debug_" not in sections


def test_it_says_how_to_call_it(waiter: list[str]) -> None:
    result = _run(waiter)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == f"slurm-k8s-bridge: {USAGE}\n"


def test_an_error_reads_nothing_of_the_submit_directory(waiter: list[str], tmp_path: Path) -> None:
    """A missing script is told in one line; no file of the submit directory (where the Python
    waiter's traceback once looked for its sources) is read or shown."""
    for name in ("bridge/waiter/main.py", "main.go", "cmd/waiter/main.go"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("PLANTED LINE\n" * 200)
    result = _run(waiter, "no-such-script", cwd=tmp_path, env={"SLURM_JOB_ID": "7"})
    assert result.returncode == 1
    assert result.stderr == "FileNotFoundError: [Errno 2] No such file or directory: 'no-such-script'\n"


def test_a_planted_bridge_in_the_submit_directory_changes_nothing(waiter: list[str], tmp_path: Path) -> None:
    for name in ("bridge/__init__.py", "bridge/waiter/__init__.py", "bridge/waiter/main.py", "json.py",
                 "waiter", "munge"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("#!/bin/sh\necho planted\nexit 9\n")
        (tmp_path / name).chmod(0o755)
    result = _run(waiter, cwd=tmp_path, env={"PATH": ".", "PYTHONPATH": "."})
    assert (result.returncode, result.stderr) == (2, f"slurm-k8s-bridge: {USAGE}\n")


def test_it_runs_under_any_name_from_a_new_directory(waiter: list[str], tmp_path: Path) -> None:
    installed = tmp_path / "libexec" / "slurm-k8s-bridge" / "waiter.py"  # the old default's name
    installed.parent.mkdir(parents=True)
    shutil.copy2(waiter[0], installed)
    result = _run([str(installed)])
    assert (result.returncode, result.stderr) == (2, f"slurm-k8s-bridge: {USAGE}\n")


def test_a_job_run_by_it_ends_with_its_pods_code(waiter: list[str], tmp_path: Path) -> None:
    """Attach (HTTP/1.0, the credential carrying the request's digest: munge is the stand-in
    bound over /opt), print the pods' log, exit with their code."""
    heads: list[bytes] = []
    answer = streaming({"type": "log", "pod": 0, "ts": "t1", "line": "hello from the pod"},
                       {"type": "exit", "code": 3, "signal": None})

    def attach(exchange: Exchange) -> None:
        heads.append(exchange.head)
        answer(exchange)

    daemon = FakeDaemon([attach])
    script = tmp_path / "slurm_script"
    script.write_text("#!/bin/sh\necho hi\n")
    try:
        ran = run_waiter(waiter, daemon, args=[str(script)], env={"SLURM_JOB_ID": "42"}, cwd=tmp_path,
                         opt=fakes(tmp_path))
    finally:
        daemon.close()
    assert (ran.returncode, ran.stdout, ran.stderr) == (3, b"hello from the pod\n", b"")
    (path, body), = ran.requests
    assert path == "/v1/jobs/42/attach"
    assert heads[0].startswith(b"POST /v1/jobs/42/attach HTTP/1.0\r\n")
    assert json.loads(body)["script"] == "#!/bin/sh\necho hi\n"
    credential = heads[0].split(b"X-Munge-Credential: ")[1].split(b"\r\n")[0].decode()
    assert credential == "MUNGE:" + request_digest("POST", "/v1/jobs/42/attach", 42, body)
