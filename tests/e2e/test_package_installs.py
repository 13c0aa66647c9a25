"""`pip install .` into a fresh venv gives a working `slurm-k8s-bridge` command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.e2e.sandbox import REPO

# Not beside others: pip builds the checkout in place (build/, *.egg-info), as the daemon image's
# build in test_daemon_image does; two at once may clean up each other's staging directory.


def test_pip_install_gives_a_working_command(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    install = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(REPO)],
                             capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr

    help_text = subprocess.run([str(venv / "bin" / "slurm-k8s-bridge"), "--help"],
                               capture_output=True, text=True, check=True).stdout
    version = subprocess.run([str(venv / "bin" / "slurm-k8s-bridge"), "version"],
                             capture_output=True, text=True, check=True).stdout.strip()
    imports = subprocess.run([str(venv / "bin" / "python"), "-c",
                              "import importlib.util, bridge.manager.daemon, bridge.manager.doctor;"
                              " print(importlib.util.find_spec('bridge.waiter'))"],
                             capture_output=True, text=True, cwd=tmp_path)

    for command in ("run", "doctor", "version", "job-submit-conf"):
        assert command in help_text
    # The waiter is the compiled agent/cmd/waiter (deploy/slurm/install-waiter.sh): no Python one.
    for command in ("attach", "waiter-build"):
        assert command not in help_text
    source = (REPO / "bridge" / "__init__.py").read_text()
    assert f'__version__ = "{version}"' in source
    assert imports.stdout.strip() == "None", imports.stderr
