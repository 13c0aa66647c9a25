"""Session fixtures for end-to-end tests: bring the sandbox (and the bridge) up once, or attach."""

from __future__ import annotations

import subprocess
import urllib.request

import pytest

from tests.e2e.sandbox import BRIDGE_UP, Sandbox


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
        # Whatever half-state is left (e.g. the Deployment of `make bridge-deploy`) goes first.
        subprocess.run([str(BRIDGE_UP.with_name("down.sh"))], check=True)
        subprocess.run([str(BRIDGE_UP)], check=True)
    return sandbox
