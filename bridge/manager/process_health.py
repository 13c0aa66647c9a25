"""The daemon process's own resources: its open-file limit, how asyncio learns of its children's
ends, and how late its event loop runs. Each guards the one loop every job shares (a starved loop
loses the Lease); the daemon sets them up at start and reads nothing else of them.
"""

from __future__ import annotations

import asyncio
import os
import resource
import sys
import warnings

import structlog

from bridge.controller.metrics import Metrics

log = structlog.get_logger(__name__)

OPEN_FILES_WANTED = 1_048_576
"""The soft limit of open files asked for when the hard one is unlimited."""

def raise_open_files_limit() -> tuple[int, int]:
    """Lift the soft limit of open files to the hard one (systemd's LimitNOFILE, the container
    runtime's): every attached waiter, task proxy and followed log holds a socket, and the usual
    soft 1024 is reached near 1,000 jobs. Returns (soft, hard) as they are now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, OPEN_FILES_WANTED)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as error:
            log.warning("daemon.open_files_limit", soft=soft, hard=hard, error=str(error))
    return soft, hard


def watch_children_without_threads() -> bool:
    """Have asyncio learn of its subprocesses' ends (unmunge, one per waiter request) through
    pidfds on the loop, not a thread blocked in waitpid per child (Python 3.11's default). Under a
    burst of attaches on a starved host, dozens of such threads passed the GIL around while the
    loop waited: 8 s late, and the Lease lost. Python 3.12 and later do this on their own."""
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:  # a kernel before 5.3, or a seccomp filter: keep the default
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        asyncio.set_child_watcher(asyncio.PidfdChildWatcher())
    return True


LOOP_LAG_PROBE_S = 0.5
LOOP_LAG_WARN_S = 1.0
"""A Lease renewal has renew_deadline_s (10 s): a loop running timers this late is on the way to
losing it, and the log should say so before it happens."""


async def watch_loop_lag(metrics: Metrics, probe_s: float = LOOP_LAG_PROBE_S) -> None:
    """Record how late the loop wakes from a short sleep; warn when it is over LOOP_LAG_WARN_S
    (a blocking call on the loop, or a host whose CPUs are starved)."""
    loop = asyncio.get_running_loop()
    while True:
        asked = loop.time()
        await asyncio.sleep(probe_s)
        lag = max(0.0, loop.time() - asked - probe_s)
        metrics.observe("event_loop_lag_seconds", lag)
        if lag >= LOOP_LAG_WARN_S:
            log.warning("daemon.loop_lagged", lag_s=round(lag, 2), load_1m=round(os.getloadavg()[0], 1))
