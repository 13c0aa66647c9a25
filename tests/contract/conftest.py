"""Fixtures: the live sandbox, both Slurm backends, and a job submitter that cleans up.

`backend` runs a test once per backend: RestSlurmClient against slurmrestd, and the pyslurm backend
in the Slurm rootfs behind PyslurmProxyClient (built first if needed: containers/pyslurm/build.sh).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from bridge.clients.slurm import SlurmClient
from bridge.clients.slurm.rest import RestSlurmClient
from tests.contract.jobs import Jobs
from tests.contract.pyslurm_proxy import PyslurmProxyClient, PyslurmServer, build_pyslurm, staged_code
from tests.e2e.sandbox import Sandbox

BACKENDS = ("rest", "pyslurm")


@pytest.fixture(scope="session")
def token_file(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A JWT for SlurmUser `slurm`, in a file only root can read (as the daemon's config expects)."""
    path = tmp_path_factory.mktemp("slurm-token") / "slurm.jwt"
    path.touch(mode=0o600)
    path.write_text(sandbox.token("slurm", 3600) + "\n")
    assert os.stat(path).st_mode & 0o777 == 0o600
    return path


@pytest.fixture(scope="session")
def pyslurm_server(sandbox: Sandbox) -> Iterator[PyslurmServer]:
    venv = build_pyslurm()
    with staged_code() as stage:
        server = PyslurmServer(venv, stage)
        try:
            yield server
        finally:
            server.stop()


async def _open(name: str, sandbox: Sandbox, token_file: Path, server: PyslurmServer) -> SlurmClient:
    if name == "rest":
        return RestSlurmClient(sandbox.rest_url, "slurm", token_file)
    client = PyslurmProxyClient(server)
    await client.open()
    return client


@pytest_asyncio.fixture(params=BACKENDS)
async def backend(
    request: pytest.FixtureRequest, sandbox: Sandbox, token_file: Path, pyslurm_server: PyslurmServer
) -> AsyncIterator[SlurmClient]:
    """A fresh client of each backend in turn (no update time remembered)."""
    client = await _open(request.param, sandbox, token_file, pyslurm_server)
    try:
        yield client
    finally:
        await client.close()


@pytest_asyncio.fixture
async def both(
    sandbox: Sandbox, token_file: Path, pyslurm_server: PyslurmServer
) -> AsyncIterator[dict[str, SlurmClient]]:
    """One fresh client of each backend, by name."""
    clients = {name: await _open(name, sandbox, token_file, pyslurm_server) for name in BACKENDS}
    try:
        yield clients
    finally:
        for client in clients.values():
            await client.close()


@pytest.fixture
def jobs(sandbox: Sandbox) -> Iterator[Jobs]:
    submitter = Jobs(sandbox)
    try:
        yield submitter
    finally:
        submitter.cancel_all()
