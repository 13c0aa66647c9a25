"""Under load on the sandbox the leader lost its Lease with nothing in the log before it: the loop
or the host was starved, and nobody could tell which. The daemon measures how late its loop runs
timers (a histogram) and warns once a timer is a second late."""

from __future__ import annotations

import asyncio
import time

import structlog

from bridge.controller.metrics import Metrics
from bridge.manager import process_health


async def test_a_blocked_loop_is_measured_and_logged() -> None:
    metrics = Metrics()
    with structlog.testing.capture_logs() as logs:
        probe = asyncio.create_task(process_health.watch_loop_lag(metrics, probe_s=0.05))
        await asyncio.sleep(0.1)
        time.sleep(1.3)  # a blocking call on the loop
        await asyncio.sleep(0.2)
        probe.cancel()

    lagged = [entry for entry in logs if entry["event"] == "daemon.loop_lagged"]
    assert len(lagged) == 1, logs
    assert lagged[0]["lag_s"] >= 1.0
    rendered = metrics.render()
    assert 'slurm_k8s_bridge_event_loop_lag_seconds_bucket{le="1.0"}' in rendered
    count = next(line for line in rendered.splitlines()
                 if line.startswith("slurm_k8s_bridge_event_loop_lag_seconds_count"))
    assert float(count.split()[1]) >= 3


async def test_an_idle_loop_warns_of_nothing() -> None:
    metrics = Metrics()
    with structlog.testing.capture_logs() as logs:
        probe = asyncio.create_task(process_health.watch_loop_lag(metrics, probe_s=0.02))
        await asyncio.sleep(0.3)
        probe.cancel()

    assert not [entry for entry in logs if entry["event"] == "daemon.loop_lagged"]
