"""The waiter's munge credentials: what proves to the daemon that a request comes from a process of
the job's user on a slurmd host. munge runs by absolute path with a fixed environment, never from
the job's PATH. Used by the HTTP client (http_client.post) and the step-output relay."""

from __future__ import annotations

import os
import subprocess

from bridge.waiter.environment import SAFE_ENVIRONMENT

MUNGE_PATHS = ("/usr/bin/munge", "/usr/local/bin/munge", "/opt/munge/bin/munge")


def munge_binary() -> str:
    """munge from the system, never from the job's PATH (which is the user's to shape)."""
    for path in MUNGE_PATHS:
        if os.access(path, os.X_OK):
            return path
    raise OSError(f"munge is not installed on this host (looked for {', '.join(MUNGE_PATHS)})")


def munge_credential(payload: str) -> str:
    """A munge credential for this process's uid/gid, carrying `payload` (the daemon checks both).
    Every failure is an OSError, which the callers take as an outage and retry."""
    try:
        result = subprocess.run(
            [munge_binary()], input=payload.encode(), capture_output=True, check=False, timeout=10,
            env=SAFE_ENVIRONMENT, cwd="/",
        )
    except subprocess.TimeoutExpired:
        # A host so loaded that munge takes over 10 s (bench-scale, 1,000 nodes: load 146): the
        # uncaught TimeoutExpired ended the waiter, and its job FAILED 1:0 without a word.
        raise OSError("munge did not answer within 10 s") from None
    if result.returncode != 0:
        # munged down is an outage like the daemon's: the caller retries.
        raise OSError(f"munge failed: {result.stderr.decode(errors='replace').strip()}")
    return result.stdout.decode().strip()
