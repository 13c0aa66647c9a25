"""Session fixtures for end-to-end tests: bring the sandbox (and the bridge) up once, or attach."""

from __future__ import annotations

import os
import re
import subprocess
import time
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.sandbox import BRIDGE_UP, DAEMON_LOG, Sandbox, daemon_log_since, daemon_log_size, one_starter


def bridge_ready() -> bool:
    try:
        with urllib.request.urlopen("http://127.0.0.1:8470/readyz", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def restart_bridge() -> None:
    # Whatever half-state is left (e.g. the Deployment of `make bridge-deploy`) goes first.
    subprocess.run([str(BRIDGE_UP.with_name("down.sh"))], check=True)
    subprocess.run([str(BRIDGE_UP)], check=True)


BRIDGE_PID = Path("/var/lib/slurm-k8s-sandbox/run/bridge.pid")


def daemon_alive() -> bool:
    """The host daemon `make bridge-up` started still runs."""
    try:
        os.kill(int(BRIDGE_PID.read_text()), 0)
    except (OSError, ValueError):
        return False
    return True


@pytest.fixture(scope="session")
def bridge(sandbox: Sandbox) -> Sandbox:
    """The sandbox with the bridge daemon, its slurmds and job_submit.lua running."""
    with one_starter():
        # A daemon re-taking its Lease, or busy, is ready again within this: restarting it would
        # stop what the other workers' tests run.
        deadline = time.monotonic() + 30
        while not bridge_ready() and daemon_alive() and time.monotonic() < deadline:
            time.sleep(1)
        if not bridge_ready():
            restart_bridge()
    return sandbox


# Fixtures that run the daemon their own way (in a Deployment, on pyslurm) for a whole module:
# their tests must not get the host daemon back in between.
OWN_DAEMON_FIXTURES = frozenset({"deployed", "deployed_with_pyslurm", "pyslurm_bridge"})


@pytest.fixture(autouse=True)
def bridge_still_up(request: pytest.FixtureRequest) -> None:
    """Before each test on the bridge, the daemon must still act. In production systemd restarts
    it (Restart=always): one that exited (a Lease lost to a VM paused for longer than the lease,
    seen on these machines) is started again here, loudly, instead of failing every later test."""
    names = set(request.fixturenames)
    if "bridge" not in names or names & OWN_DAEMON_FIXTURES:
        return
    deadline = time.monotonic() + 30  # a replica re-taking its Lease is ready again within it
    while not bridge_ready():
        if time.monotonic() > deadline:
            with one_starter():
                if bridge_ready():  # another worker started it meanwhile
                    return
                log = DAEMON_LOG.read_text(errors="replace") if DAEMON_LOG.exists() else ""
                tail = log.splitlines()[-15:]
                warnings.warn("the bridge daemon no longer acted before " + request.node.nodeid
                              + ": started again; its log ended with:\n" + "\n".join(tail), stacklevel=1)
                restart_bridge()
            return
        time.sleep(1)


CALL_FAILED = pytest.StashKey[bool]()
DAEMON_LOG_AT_START = pytest.StashKey[int]()
# What of the daemon's log a failure report shows: its complaints, and every node health decision.
TELLING_LOG_LINE = re.compile(r'"level": "(warning|error|critical)"|"event": "node\.')
LOG_LINES_SHOWN = 60


def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[DAEMON_LOG_AT_START] = daemon_log_size()


def daemon_log_told(offset: int) -> str:
    """The telling lines the daemon logged from `offset` on (the last LOG_LINES_SHOWN of them)."""
    telling = [line[:400] for line in daemon_log_since(offset) if TELLING_LOG_LINE.search(line)]
    return "\n".join(telling[-LOG_LINES_SHOWN:])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport:
    report: pytest.TestReport = yield
    if report.when == "call":
        item.stash[CALL_FAILED] = report.failed
        # CI keeps no daemon log: a failure carries what the daemon said meanwhile (a node that never
        # went down once left nothing to go on).
        if report.failed and item.get_closest_marker("e2e") and DAEMON_LOG_AT_START in item.stash:
            told = daemon_log_told(item.stash[DAEMON_LOG_AT_START])
            if told:
                report.sections.append(("the bridge daemon's warnings and node decisions meanwhile", told))
    return report


@pytest.fixture(autouse=True)
def no_job_outlives_a_failed_test_that_ran_alone(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that ran alone (not `shares_the_cluster`) failed, its jobs are cancelled: one
    left running (CI: an MPI job that hung, without a time limit) held the real nodes, and the next
    test that needed one exclusively failed too. Tests that share the cluster run beside others,
    whose jobs these would be too."""
    yield
    failed = request.node.stash.get(CALL_FAILED, False)
    if not failed or request.node.get_closest_marker("shares_the_cluster"):
        return
    if not {"bridge", "sandbox"} & set(request.fixturenames):
        return
    sandbox: Sandbox = request.getfixturevalue("sandbox")
    left = sandbox.slurm("squeue", "-h", "-o", "%A", check=False).stdout.split()
    if left:
        sandbox.slurm("scancel", *sorted(set(left)), check=False)
        # Printed, not warned: warnings are errors here, and the test's own failure is the news.
        print(f"{request.node.nodeid} failed with jobs left in Slurm: cancelled {sorted(set(left))}")

