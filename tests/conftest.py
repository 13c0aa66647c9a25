"""Shared pytest configuration: tests under tests/e2e and tests/contract are marked `e2e` (they
need the real sandbox), and the session fixture that brings the sandbox up or attaches to it."""

from __future__ import annotations

import subprocess

import pytest

from tests.e2e.sandbox import SANDBOX_SCRIPT, Sandbox, one_starter, sandbox_env


@pytest.fixture(scope="session")
def sandbox() -> Sandbox:
    """The running sandbox; started here if `make sandbox-up` was not run first."""
    with one_starter():
        status = subprocess.run([str(SANDBOX_SCRIPT), "status"], capture_output=True, text=True)
        if status.returncode != 0:
            subprocess.run([str(SANDBOX_SCRIPT), "up"], check=True)
    return Sandbox(env=sandbox_env())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/tests/e2e/" in str(item.path) or "/tests/contract/" in str(item.path):
            item.add_marker(pytest.mark.e2e)
