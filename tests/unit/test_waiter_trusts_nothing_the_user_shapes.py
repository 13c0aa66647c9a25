"""The waiter runs on the slurmd host as the user: it binds its credential to the request, runs
nothing from the user's PATH or cwd, imports nothing but the standard library, and gives the pods
back the variables the SPANK guard held out of its way."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from bridge.core import wellknown
from bridge.core.waiter_protocol import request_digest
from bridge.waiter import attach as waiter
from bridge.waiter import build, environment, munge

WAITER = Path(waiter.__file__)
ROOT = WAITER.parents[2]


def test_the_digest_binds_method_path_job_and_body() -> None:
    base = request_digest("POST", "/v1/jobs/7/cancel", 7, b"{}")
    assert base.startswith("slurm-k8s-bridge-v1:")
    others = {
        request_digest("GET", "/v1/jobs/7/cancel", 7, b"{}"),
        request_digest("POST", "/v1/jobs/7/attach", 7, b"{}"),
        request_digest("POST", "/v1/jobs/7/cancel", 8, b"{}"),
        request_digest("POST", "/v1/jobs/7/cancel", 7, b"{ }"),
    }
    assert base not in others and len(others) == 4


def test_held_variables_get_their_names_back_for_the_pods() -> None:
    environ = {"SLURM_K8S_BRIDGE_HELD_LD_PRELOAD": "/x.so", "SLURM_K8S_BRIDGE_HELD_PYTHONPATH": "/p",
               "HOME": "/home/alice", "SLURM_K8S_BRIDGE_HELD_": "nameless"}
    expected = {"LD_PRELOAD": "/x.so", "PYTHONPATH": "/p", "HOME": "/home/alice"}
    assert environment.job_environment(environ) == expected


def test_where_the_guard_held_the_environment_only_held_and_slurm_variables_count() -> None:
    environ = {"SLURM_K8S_BRIDGE_ENV_HELD": "1", "LC_CTYPE": "C.UTF-8", "SLURM_JOB_ID": "7",
               "SLURM_K8S_BRIDGE_HELD_HOME": "/home/alice", "SLURM_K8S_BRIDGE_HELD_OPENSSL_CONF": "/x"}
    expected = {"SLURM_JOB_ID": "7", "HOME": "/home/alice", "OPENSSL_CONF": "/x"}
    assert environment.job_environment(environ) == expected


def test_munge_is_never_looked_up_on_the_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "munge"
    fake.write_text("#!/bin/sh\necho planted\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(munge, "MUNGE_PATHS", ("/nonexistent/munge",))
    with pytest.raises(OSError, match="munge is not installed"):
        munge.munge_binary()


def test_munge_runs_with_a_fixed_environment_in_the_root_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, object] = {}

    def fake_run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[bytes]:
        seen.update(kwargs, argv=argv)
        return subprocess.CompletedProcess(argv, 0, b"MUNGE:x\n", b"")

    monkeypatch.setattr(munge, "munge_binary", lambda: "/usr/bin/munge")
    monkeypatch.setattr(munge.subprocess, "run", fake_run)
    monkeypatch.setenv("LD_PRELOAD", "/home/alice/evil.so")
    assert munge.munge_credential("digest") == "MUNGE:x"
    assert seen["argv"] == ["/usr/bin/munge"]
    assert seen["env"] == environment.SAFE_ENVIRONMENT and seen["cwd"] == "/"
    assert seen["input"] == b"digest"


@pytest.mark.parametrize("module", build.modules())
def test_the_waiter_imports_only_the_standard_library(module: str) -> None:
    """Each module the waiter's archive holds imports the standard library and modules the archive
    holds, nothing else."""
    tree = ast.parse((ROOT / module).read_text())
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    names |= {node.module for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
    archived = {path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
                for path in build.modules()}
    # Python's own SHA-256 is `_sha2` from 3.12 on, `_sha256` before: each is stdlib on its own Python.
    stdlib = set(sys.stdlib_module_names) | {"_sha2", "_sha256"}
    foreign = {name for name in names if name.split(".")[0] not in stdlib
               and name not in archived and name not in ("bridge", "bridge.core")}
    assert foreign == set()


def test_the_digest_loads_no_openssl_where_pythons_own_sha256_is_named_sha2() -> None:
    """Python 3.12 renamed `_sha256` to `_sha2`: the digest every request carries must still come
    from Python's own module, not hashlib (OpenSSL, its start-up cost, and OPENSSL_* steering)."""
    program = (
        "import sys, types\n"
        "from _sha256 import sha256\n"  # this Python's own, offered under 3.12's name only
        "sys.modules['_sha2'] = types.SimpleNamespace(sha256=sha256)\n"
        "sys.modules['_sha256'] = sys.modules['hashlib'] = sys.modules['_hashlib'] = None\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from bridge.core.waiter_protocol import request_digest\n"
        "print(request_digest('POST', '/v1/jobs/7/cancel', 7, b'{}'))\n"
    )
    result = subprocess.run([sys.executable, "-I", "-S", "-c", program], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == request_digest("POST", "/v1/jobs/7/cancel", 7, b"{}")


def test_the_digest_loads_no_openssl_on_this_python() -> None:
    program = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
               "from bridge.core.waiter_protocol import request_digest\n"
               "request_digest('POST', '/v1/jobs/7/cancel', 7, b'{}')\n"
               "print(sorted({'hashlib', '_hashlib'} & set(sys.modules)))\n")
    result = subprocess.run([sys.executable, "-I", "-S", "-c", program], capture_output=True, text=True,
                            timeout=60, check=True)
    assert result.stdout.strip() == "[]"


def test_the_marker_is_the_one_job_submit_writes() -> None:
    assert waiter.MARKER == wellknown.ATTACH_MARKER
    lua = (WAITER.parents[2] / "deploy" / "slurm" / "job_submit.lua").read_text()
    assert f'local MARKER = "{waiter.MARKER}"' in lua


def test_the_first_marker_wins() -> None:
    planted = f"#!/bin/sh\necho user\n{waiter.MARKER}\necho planted\n"
    rewritten = f"#!/bin/sh\nexec waiter \"$0\"\n{waiter.MARKER}\n{planted}"
    assert waiter.original_script(rewritten) == planted


def test_isolated_mode_keeps_the_cwd_and_pythonpath_off_sys_path(tmp_path: Path) -> None:
    """What `python3 -I -S /abs/waiter.py` gives: a planted ./bridge or PYTHONPATH is never imported."""
    (tmp_path / "json.py").write_text("raise SystemExit('planted json imported')\n")
    result = subprocess.run(
        [sys.executable, "-I", "-S", "-c", "import json, sys; print(sys.path[0])"],
        cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)}, capture_output=True, text=True, check=True,
    )
    assert str(tmp_path) not in result.stdout
