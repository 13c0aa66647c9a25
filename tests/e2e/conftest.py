"""Session fixtures for end-to-end tests: bring the sandbox up once, or attach to it."""

from __future__ import annotations

import subprocess

import pytest

from tests.e2e.sandbox import SANDBOX_SCRIPT, Sandbox, sandbox_env


@pytest.fixture(scope="session")
def sandbox() -> Sandbox:
    """The running sandbox; started here if `make sandbox-up` was not run first."""
    status = subprocess.run([str(SANDBOX_SCRIPT), "status"], capture_output=True, text=True)
    if status.returncode != 0:
        subprocess.run([str(SANDBOX_SCRIPT), "up"], check=True)
    return Sandbox(env=sandbox_env())
