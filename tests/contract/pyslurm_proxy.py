"""Host side of the pyslurm backend under test: build it, stage the code, run it in the rootfs.

The real PyslurmSlurmClient runs in tests/contract/pyslurm_server.py inside the Slurm rootfs (its
libslurm needs the rootfs's glibc); PyslurmProxyClient forwards each SlurmClient verb to it, so the
same tests drive both backends from this process.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import shutil
import subprocess
import threading
import uuid
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bridge.clients.slurm import JobListing
from bridge.core.model import JobAllocation
from tests.contract import wire

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "containers" / "pyslurm" / "build.sh"
IN_NS = REPO / "containers" / "slurm" / "in-ns.sh"
SETTINGS = REPO / "containers" / "sandbox" / "settings.sh"

CALL_TIMEOUT_S = 60.0


def build_pyslurm() -> str:
    """The pyslurm venv's path inside the rootfs; builds it first if needed (~2 min, else ~0.1 s)."""
    out = subprocess.run([str(BUILD)], check=True, stdout=subprocess.PIPE, text=True, timeout=1200)
    return out.stdout.strip().splitlines()[-1]


def sandbox_state_dir() -> Path:
    """$SBX_STATE: bind-mounted at the same path inside the rootfs."""
    out = subprocess.run(
        ["bash", "-c", f'. "{SETTINGS}"; echo "$SBX_STATE"'], check=True, capture_output=True, text=True
    )
    return Path(out.stdout.strip())


@contextmanager
def staged_code() -> Iterator[Path]:
    """A copy of the bridge package and the server where the rootfs sees it (/work is not visible)."""
    stage = sandbox_state_dir() / "pyslurm-run" / f"contract-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(REPO / "bridge", stage / "bridge", ignore=ignore)
    (stage / "tests" / "contract").mkdir(parents=True)
    shutil.copy(REPO / "tests" / "__init__.py", stage / "tests")
    for name in ("__init__.py", "wire.py", "pyslurm_server.py"):
        shutil.copy(REPO / "tests" / "contract" / name, stage / "tests" / "contract")
    try:
        yield stage
    finally:
        shutil.rmtree(stage, ignore_errors=True)


class PyslurmServer:
    """The rootfs process running PyslurmSlurmClient; one per test session, one call at a time."""

    def __init__(self, venv: str, stage: Path) -> None:
        self._proc = subprocess.Popen(
            [
                str(IN_NS), "env", f"PYTHONPATH={stage}", "PYTHONDONTWRITEBYTECODE=1",
                f"{venv}/bin/python", "-X", "faulthandler", "-m", "tests.contract.pyslurm_server",
            ],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # stderr (the server's logs, a crash's trace) goes where pytest captures it
        self._lock = threading.Lock()

    def call(self, verb: str, *args: Any) -> Any:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        with self._lock:
            self._proc.stdin.write(json.dumps({"verb": verb, "args": list(args)}) + "\n")
            self._proc.stdin.flush()
            ready, _, _ = select.select([self._proc.stdout], [], [], CALL_TIMEOUT_S)
            if not ready:
                raise TimeoutError(f"pyslurm server: no answer to {verb} in {CALL_TIMEOUT_S:.0f}s")
            line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"pyslurm server exited (rc {self._proc.wait(5)}) during {verb}")
        reply = json.loads(line)
        if "error" in reply:
            raise wire.error_from_json(reply["error"])
        return reply["result"]

    def stop(self) -> None:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.close()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc.stdout.close()


class PyslurmProxyClient:
    """A SlurmClient whose verbs run in the pyslurm server: the real PyslurmSlurmClient, one hop away."""

    def __init__(self, server: PyslurmServer) -> None:
        self._server = server

    async def _call(self, verb: str, *args: Any) -> Any:
        return await asyncio.to_thread(self._server.call, verb, *args)

    async def open(self) -> None:
        """A fresh client in the server (no update time remembered)."""
        await self._call("open")

    async def changed_jobs(self, partitions: Collection[str] | None = None) -> JobListing | None:
        listing = await self._call("changed_jobs", *([sorted(partitions)] if partitions is not None else []))
        return None if listing is None else wire.listing_from_json(listing)

    async def job(self, job_id: int) -> JobAllocation | None:
        job = await self._call("job", job_id)
        return None if job is None else wire.allocation_from_json(job)

    async def signal_job(self, job_id: int, signal: str) -> None:
        await self._call("signal_job", job_id, signal)

    async def set_comment(self, job_id: int, comment: str) -> None:
        await self._call("set_comment", job_id, comment)

    async def close(self) -> None:
        await self._call("close")
