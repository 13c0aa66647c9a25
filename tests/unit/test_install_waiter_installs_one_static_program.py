"""deploy/slurm/install-waiter.sh DEST builds the compiled waiter (agent/cmd/waiter) and installs it
where `[waiter] attach_command` names it: static, root-owned, mode 755, by one rename; it refuses a
directory that anyone but root may write (whoever could, could replace the waiter)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from bridge.manager.doctor_waiter import waiter_install_problems

SCRIPT = Path(__file__).parents[2] / "deploy" / "slurm" / "install-waiter.sh"


def _install(dest: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    assert os.geteuid() == 0, "install-waiter.sh installs a root-owned program: this test needs root"
    return subprocess.run([str(SCRIPT), str(dest)], capture_output=True, text=True, timeout=600, env=env)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("root") / "libexec" / "slurm-k8s-bridge" / "waiter"
    result = _install(dest)
    assert result.returncode == 0, f"install-waiter.sh failed (needs Go and gcc with libc.a): {result.stderr}"
    assert result.stdout == f"{dest}\n"
    return dest


def test_it_installs_a_root_owned_static_program_that_doctor_passes(installed: Path) -> None:
    info = installed.stat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, 0, 0o755)
    assert stat.S_IMODE(installed.parent.stat().st_mode) == 0o755, "the directory it made: root's alone"
    readelf = subprocess.run(["readelf", "-l", str(installed)], capture_output=True, text=True, check=True)
    assert "INTERP" not in readelf.stdout and "LOAD" in readelf.stdout, "static: no program interpreter"
    assert waiter_install_problems(str(installed)) == []
    assert [p.name for p in installed.parent.iterdir()] == ["waiter"], "no build file left beside it"


def test_the_installed_program_is_the_waiter(installed: Path) -> None:
    result = subprocess.run([str(installed)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert result.stderr.startswith("slurm-k8s-bridge: usage: waiter [--api URL] [--ca CA_FILE] BATCH_SCRIPT")


def test_a_reinstall_replaces_the_file_by_a_rename(installed: Path) -> None:
    # A job starting meanwhile runs the old or the new program: the old inode stays whole.
    before = installed.stat().st_ino
    result = _install(installed)
    assert result.returncode == 0, result.stderr
    assert installed.stat().st_ino != before
    assert waiter_install_problems(str(installed)) == []


@pytest.mark.parametrize("mode", [0o775, 0o757, 0o1777])
def test_a_directory_others_may_write_is_refused(tmp_path: Path, mode: int) -> None:
    libexec = tmp_path / "libexec"
    libexec.mkdir()
    libexec.chmod(mode)
    result = _install(libexec / "waiter")
    assert result.returncode == 1
    assert result.stderr == (f"install-waiter.sh: {libexec} is writable by group or others (mode {mode:o}): "
                             "anyone could replace the waiter\n")
    assert list(libexec.iterdir()) == []


def test_a_directory_of_another_owner_is_refused(tmp_path: Path) -> None:
    libexec = tmp_path / "libexec"
    libexec.mkdir(mode=0o755)
    os.chown(libexec, 4242, 4242)
    result = _install(libexec / "waiter")
    assert result.returncode == 1
    assert f"{libexec} is owned by uid 4242, not root" in result.stderr
    assert list(libexec.iterdir()) == []


def test_a_relative_destination_is_refused(tmp_path: Path) -> None:
    result = _install(Path("waiter"))
    assert (result.returncode, result.stderr) == (
        1, "install-waiter.sh: DEST must be an absolute path, not 'waiter' (attach_command names it so)\n")


def test_a_build_that_is_not_static_is_refused(tmp_path: Path) -> None:
    # A Go whose build asks for ld.so (here: one that writes /bin/true), first on the PATH.
    fake = tmp_path / "bin" / "go"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\nwhile [ $# -gt 0 ]; do [ "$1" = -o ] && out=$2; shift; done\n'
                    'cp /bin/true "$out"\n')
    fake.chmod(0o755)
    libexec = tmp_path / "libexec"
    libexec.mkdir(mode=0o755)
    result = _install(libexec / "waiter", {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"})
    assert (result.returncode, result.stderr) == (
        1, "install-waiter.sh: the build is not static (it asks for a program interpreter)\n")
    assert list(libexec.iterdir()) == [], "nothing installed, no build file left"


def test_a_directory_others_may_write_above_the_destination_is_refused(tmp_path: Path) -> None:
    # Whoever may write it can rename libexec/ away and put their own in its place.
    above = tmp_path / "usr"
    libexec = above / "libexec"
    libexec.mkdir(parents=True, mode=0o755)
    above.chmod(0o777)
    result = _install(libexec / "waiter")
    assert result.returncode == 1
    assert result.stderr == (f"install-waiter.sh: {above} is writable by group or others (mode 777): "
                             "anyone could replace the waiter\n")
    assert list(libexec.iterdir()) == []
    above.chmod(0o1777)  # sticky, as /tmp: others may rename only their own entries
    result = _install(libexec / "waiter")
    assert result.returncode == 0, result.stderr
