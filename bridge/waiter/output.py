"""The job's own output files, as the waiter writes them: what slurmstepd opened for -o and -e on
fds 1 and 2, and the waiter's few words of its own there. Used by every part of the waiter."""

from __future__ import annotations

import os
import sys


def write_all(fd: int, data: bytes) -> None:
    """Write every byte to `fd` (1 or 2: what slurmstepd opened for -o and -e)."""
    if fd not in (1, 2):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def output_merged() -> bool:
    """stdout and stderr are one file (no -e, or -e naming the -o file): the pods then keep the
    order between the two streams."""
    try:
        out, err = os.fstat(1), os.fstat(2)
    except OSError:
        return True
    return (out.st_dev, out.st_ino) == (err.st_dev, err.st_ino)


def say(text: str) -> None:
    """One line of the bridge's own to the job's stderr, marked as the bridge's."""
    sys.stderr.write(f"slurm-k8s-bridge: {text}\n")
    sys.stderr.flush()
