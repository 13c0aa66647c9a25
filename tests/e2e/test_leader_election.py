"""Only one replica acts: the Lease on the real API server, and two daemons side by side."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from bridge.clients.kube.client import make_api_client
from bridge.manager.leader import LeaderElector, LeaseSettings
from tests.e2e.conftest import bridge_ready
from tests.e2e.sandbox import REPO, Sandbox, wait_until

STATE = Path("/var/lib/slurm-k8s-sandbox")


def _settings(name: str, identity: str, lease_s: float) -> LeaseSettings:
    return LeaseSettings(
        namespace="default",
        name=name,
        identity=identity,
        lease_duration_s=lease_s,
        renew_deadline_s=lease_s * 2 / 3,
        retry_period_s=0.3,
    )


async def _holder_and_standby(
    api: Any, lease_s: float
) -> tuple[LeaderElector, asyncio.Task[None], LeaderElector, asyncio.Task[None]]:
    """Two electors on a fresh Lease: the first holds it, the second stands by."""
    name = f"test-lease-{uuid.uuid4().hex[:8]}"
    first, second = (
        LeaderElector(api, _settings(name, "a", lease_s)),
        LeaderElector(api, _settings(name, "b", lease_s)),
    )
    first_task = asyncio.create_task(first.run())
    await asyncio.wait_for(first.is_leader.wait(), 10)
    second_task = asyncio.create_task(second.run())
    await asyncio.sleep(1.0)
    assert first.is_leader.is_set() and not second.is_leader.is_set(), "never two leaders"
    return first, first_task, second, second_task


async def test_a_standby_takes_over_only_once_the_silent_holders_lease_expired(sandbox: Sandbox) -> None:
    api = await make_api_client(sandbox.kubeconfig)
    _first, first_task, second, second_task = await _holder_and_standby(api, lease_s=3.0)

    first_task.cancel()  # the holder stops renewing, as if it had died
    silent_at = time.monotonic()
    await asyncio.wait_for(second.is_leader.wait(), 30)
    took = time.monotonic() - silent_at

    # Not before the lease could have expired (minus one renew period): never two leaders.
    assert took >= 3.0 - 0.6, f"took over after {took:.1f}s, before the 3s lease expired"
    await second.release()
    second_task.cancel()
    await api.close()


async def test_a_released_lease_is_taken_without_waiting_for_it_to_expire(sandbox: Sandbox) -> None:
    api = await make_api_client(sandbox.kubeconfig)
    first, first_task, second, second_task = await _holder_and_standby(api, lease_s=20.0)

    first_task.cancel()
    await first.release()
    released_at = time.monotonic()
    await asyncio.wait_for(second.is_leader.wait(), 30)

    assert time.monotonic() - released_at < 10.0, "taken well before the 20s lease would expire"
    second_task.cancel()
    await api.close()


def _readyz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return 0


def test_a_second_daemon_stands_by_until_the_leader_stops(bridge: Sandbox) -> None:
    config = (
        (STATE / "bridge" / "config.toml")
        .read_text()
        .replace('listen = "127.0.0.1:8470"', 'listen = "127.0.0.1:8471"')
    )
    second_config = STATE / "bridge" / "config-standby.toml"
    second_config.write_text(config)
    log = open(STATE / "log" / "bridge-standby.log", "ab")  # noqa: SIM115 - handed to the child
    command = [str(REPO / ".venv" / "bin" / "slurm-k8s-bridge"), "run", "-c", str(second_config)]
    standby = subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True)
    try:
        wait_until("the standby to serve", lambda: _readyz(8471) == 503, timeout=30)
        time.sleep(3)
        assert (_readyz(8470), _readyz(8471)) == (200, 503), "exactly one replica acts"

        leader_pid = int((STATE / "run" / "bridge.pid").read_text())
        os.kill(leader_pid, signal.SIGTERM)  # a clean stop hands the Lease over
        stopped_at = time.monotonic()
        wait_until("the standby to take over", lambda: _readyz(8471) == 200, timeout=20)
        assert time.monotonic() - stopped_at < 15
    finally:
        standby.send_signal(signal.SIGTERM)
        standby.wait(timeout=30)
        log.close()
        subprocess.run([str(REPO / "containers" / "bridge" / "up.sh")], check=True, capture_output=True)
    assert bridge_ready()
