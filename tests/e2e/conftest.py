"""Session fixtures for end-to-end tests: bring the sandbox (and the bridge) up once, or attach."""

from __future__ import annotations

import subprocess
import urllib.request

import pytest

from tests.e2e.sandbox import BRIDGE_UP, SANDBOX_SCRIPT, Sandbox, sandbox_env


@pytest.fixture(scope="session")
def sandbox() -> Sandbox:
    """The running sandbox; started here if `make sandbox-up` was not run first."""
    status = subprocess.run([str(SANDBOX_SCRIPT), "status"], capture_output=True, text=True)
    if status.returncode != 0:
        subprocess.run([str(SANDBOX_SCRIPT), "up"], check=True)
    return Sandbox(env=sandbox_env())


def bridge_ready() -> bool:
    try:
        with urllib.request.urlopen("http://127.0.0.1:8470/readyz", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture(scope="session")
def bridge(sandbox: Sandbox) -> Sandbox:
    """The sandbox with the bridge daemon, its slurmds and job_submit.lua running."""
    if not bridge_ready():
        subprocess.run([str(BRIDGE_UP)], check=True)
    return sandbox
