"""The pods' usage, handed to Slurm's accounting: the in-pod agent samples the batch script's
processes as jobacct_gather/linux would on a host ("u" frames: bridge/controller/log_relay.py),
and the waiter writes each sample into the usage file the step guard made for this task. Slurm's
jobacct_gather/linux_k8s_bridge (deploy/slurm/jobacct) reads it in place of the waiter's own figures, so
`sacct`, `sstat` and `seff` report what the job's processes used.

The file is made by root at the task's fork and given to the job's user, in directories only root
writes (one per slurmstepd): the waiter writes into it and never creates one. Without it (a slurmd
without the guard's usage files, or another JobAcctGatherType) the figures are dropped and Slurm
keeps its own.
"""

from __future__ import annotations

import binascii
import os

USAGE_DIR = "/run/slurm-k8s-bridge/usage"
USAGE_MAGIC = "k8s-bridge-usage-v1"
USAGE_FIELDS = 9
"""user µs, system µs, RSS, max RSS, virtual size, max virtual size (bytes), characters read,
written, major page faults: the order of the agent's frame (agent/usage.go) and of the plugin,
which then reads the waiter's own user and system µs."""
UNKNOWN = "-"
"""A figure the pod could not read: Slurm keeps its own, nothing is made up."""
RECORD_SIZE = 256
"""Every record is this long (padded with spaces), so one write replaces the last whole."""


def usage_record(figures: str, own_cpu_us: tuple[int, int]) -> bytes | None:
    """The usage file's record for one "u" frame's text, or None for a frame that is not
    USAGE_FIELDS whole numbers (or UNKNOWN). Then the waiter's own user and system CPU so far (µs, its reaped
    children's included): when the task ends, slurmstepd keeps the larger of the seconds but
    always the waiter's microseconds (its wait4 rusage), and the plugin, knowing them, rounds the
    pod's seconds so that the sum stays the pod's. The last field is the sum of all, modulo 2^64:
    the plugin reads no record it caught half-written."""
    parts = figures.split()
    if len(parts) != USAGE_FIELDS or not all(part == UNKNOWN or (part.isascii() and part.isdigit())
                                              for part in parts):
        return None
    parts += [str(max(0, value)) for value in own_cpu_us]
    values = [int(part) for part in parts if part != UNKNOWN]
    if any(value >= 1 << 64 for value in values):
        return None
    line = " ".join([USAGE_MAGIC, *parts, str(sum(values) % (1 << 64))])
    if len(line) >= RECORD_SIZE:
        return None
    return (line + " " * (RECORD_SIZE - 1 - len(line)) + "\n").encode()


def own_cpu_us() -> tuple[int, int]:
    """This process's user and system CPU so far, with its reaped children's (munge), in µs: what
    slurmstepd's wait4 rusage of the waiter will hold."""
    import resource  # only for jobs whose pods send usage

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return (round((own.ru_utime + children.ru_utime) * 1e6), round((own.ru_stime + children.ru_stime) * 1e6))


class UsageFile:
    """This task's usage file, `USAGE_DIR/<slurmstepd's pid>/<this pid>` (slurmstepd forks the
    task, and the batch script's wrapper execs the waiter: its parent is its slurmstepd), opened
    on the first sample, and only if the guard made it."""

    def __init__(self, directory: str = USAGE_DIR, stepd: int | None = None, pid: int | None = None) -> None:
        self._path = os.path.join(directory, str(stepd if stepd is not None else os.getppid()),
                                  str(pid if pid is not None else os.getpid()))
        self._fd: int | None = None
        self._missing = False

    def record_frame(self, data: str) -> None:
        """Write one "u" frame's sample (its base64 text, as the daemon passes it on)."""
        try:
            figures = binascii.a2b_base64(data).decode("ascii")
        except ValueError:  # not base64 (binascii.Error), not ASCII on either side
            return
        self.record(figures)

    def record(self, figures: str) -> None:
        """Write one sample over the last."""
        record = usage_record(figures, own_cpu_us())
        if record is None or self._missing:
            return
        if self._fd is None:
            try:
                # Never created here, and never through a link: the file is the guard's.
                self._fd = os.open(self._path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                self._missing = True
                return
        try:
            os.pwrite(self._fd, record, 0)
        except OSError:
            self._missing = True
