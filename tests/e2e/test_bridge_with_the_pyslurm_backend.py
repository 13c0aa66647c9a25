"""The daemon with `backend = "pyslurm"` (running inside the Slurm rootfs, libslurm in-process)
bridges jobs exactly as with slurmrestd."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.sandbox import REPO, Sandbox, job_pods, wait_until, write_script

BRIDGE = REPO / "containers" / "bridge"
CONFIG = Path("/var/lib/slurm-k8s-sandbox/bridge/config.toml")


def _restart_bridge(backend: str) -> None:
    subprocess.run([str(BRIDGE / "down.sh")], check=True, capture_output=True)
    subprocess.run([str(BRIDGE / "up.sh")], check=True, capture_output=True,
                   env={**os.environ, "SBX_BRIDGE_BACKEND": backend})


@pytest.fixture(scope="module")
def pyslurm_bridge(bridge: Sandbox) -> Iterator[Sandbox]:
    _restart_bridge("pyslurm")
    try:
        yield bridge
    finally:
        _restart_bridge("rest")


def test_the_daemon_runs_on_pyslurm(pyslurm_bridge: Sandbox) -> None:
    assert 'backend = "pyslurm"' in CONFIG.read_text()


def test_exit_code_and_output_with_pyslurm(pyslurm_bridge: Sandbox) -> None:
    script = write_script(pyslurm_bridge, "alice", "via-pyslurm.sh",
                          "#!/bin/sh\n#K8S image=sandbox.local/busybox:1\n"
                          'echo "gpus=$SLURM_JOB_GPUS on $SLURMD_NODENAME"\nexit 4\n')
    job_id = pyslurm_bridge.sbatch("-p", "k8s", "--gres=gpu:1", "-w", "kreal2", str(script))

    row = pyslurm_bridge.wait_job_final(job_id)

    assert (row["State"], row["ExitCode"]) == ("FAILED", "4:0")
    out = (pyslurm_bridge.home("alice") / f"slurm-{job_id}.out").read_text()
    assert out == "gpus=0 on kreal2\n"


def test_scancel_with_pyslurm(pyslurm_bridge: Sandbox) -> None:
    script = write_script(pyslurm_bridge, "bob", "long-pyslurm.sh",
                          "#!/bin/sh\n#K8S image=sandbox.local/busybox:1\nsleep 300\n")
    job_id = pyslurm_bridge.sbatch("-p", "k8s", str(script), user="bob")
    wait_until("its pod to run", lambda: any(p["status"].get("phase") == "Running"
                                             for p in job_pods(pyslurm_bridge, job_id)), timeout=60)

    pyslurm_bridge.slurm("scancel", str(job_id))

    wait_until("the pod to be gone", lambda: not job_pods(pyslurm_bridge, job_id), timeout=10)
    assert pyslurm_bridge.wait_job_final(job_id)["State"].startswith("CANCELLED")
