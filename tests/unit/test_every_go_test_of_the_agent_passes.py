"""Every Go test of agent/ runs here, not only those other tests pick by name (`go_test`): a Go
test that nothing names would otherwise never run in `make test`."""

from __future__ import annotations

import subprocess

from .waiter_runs import ROOT, go_binary


def test_go_test_of_every_package_passes() -> None:
    result = subprocess.run([go_binary(), "test", "-count=1", "./..."], cwd=ROOT / "agent",
                            capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    ran = [line for line in result.stdout.splitlines() if line.startswith("ok ")]
    assert any("agent/internal/waiter" in line for line in ran), result.stdout
    assert any("agent/internal/earlysignals" in line for line in ran), result.stdout
