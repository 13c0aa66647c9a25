"""deploy/systemd units pass `systemd-analyze verify` (in a scratch root holding the binaries they
name) and the daemon's unit keeps its hardening."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UNITS = REPO / "deploy" / "systemd"


@pytest.fixture
def scratch_root(tmp_path: Path) -> Path:
    """A root with systemd's own units, the units under test and stand-ins for their binaries."""
    shutil.copytree("/usr/lib/systemd/system", tmp_path / "usr/lib/systemd/system", symlinks=True)
    for binary in ("opt/slurm-k8s-bridge/bin/slurm-k8s-bridge", "usr/sbin/slurmd"):
        path = tmp_path / binary
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    target = tmp_path / "etc/systemd/system"
    target.mkdir(parents=True)
    for unit in UNITS.glob("*.service"):
        shutil.copy(unit, target)
    return tmp_path


def _verify(root: Path, *units: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["systemd-analyze", "verify", "--man=no", f"--root={root}", *units],
                          capture_output=True, text=True, timeout=60)


def test_the_units_verify(scratch_root: Path) -> None:
    result = _verify(scratch_root, "slurm-k8s-bridge.service", "slurmd-bridged@gpu-node-01.service")
    assert result.returncode == 0, result.stderr


def test_verify_does_catch_a_broken_unit(scratch_root: Path) -> None:
    unit = scratch_root / "etc/systemd/system/slurm-k8s-bridge.service"
    unit.write_text(unit.read_text().replace("ExecStart=/opt/", "ExecStart=/nonexistent/"))
    assert _verify(scratch_root, "slurm-k8s-bridge.service").returncode != 0


def test_the_daemon_runs_unprivileged_and_hardened() -> None:
    text = (UNITS / "slurm-k8s-bridge.service").read_text()
    for setting in ("User=slurm-k8s-bridge", "NoNewPrivileges=yes", "ProtectSystem=strict",
                    "CapabilityBoundingSet=\n", "ReadOnlyPaths=/etc/slurm-k8s-bridge", "UMask=0077"):
        assert setting in text, setting


def test_the_bridged_slurmd_keeps_files_users_copy_there_off_the_hosts_tmp() -> None:
    # sbcast to a bridged job's node still writes, as the user, on the slurmds' (= slurmctld's) host.
    text = (UNITS / "slurmd-bridged@.service").read_text()
    for setting in ("PrivateTmp=yes", "ProtectSystem=full"):
        assert f"\n{setting}\n" in text, setting
