"""The functions tests/e2e/submitit_client.py submits, in a module of their own: submitit
pickles them by reference (module and name), as a researcher's own package, so that the job's
python3 needs only to import this module, whatever its version (the sandbox's native nodes run the
Slurm rootfs's python3, its pods and login host another).
"""

from __future__ import annotations

import os
import time

import submitit  # type: ignore[import-not-found]


def square(x: int) -> tuple[int, int, str]:
    return x * x, int(os.environ["SLURM_PROCID"]), os.environ["SLURM_JOB_PARTITION"]


def fails() -> None:
    raise ValueError("refused on purpose")


class Counter(submitit.helpers.Checkpointable):  # type: ignore[misc]
    """Counts its starts; the first one waits to be interrupted."""

    def __init__(self) -> None:
        self.starts = 0

    def __call__(self, marker: str) -> tuple[int, str]:
        self.starts += 1
        with open(f"{marker}.{self.starts}", "w") as out:
            out.write(os.environ.get("SLURM_RESTART_COUNT", "0"))
        if self.starts == 1:
            time.sleep(600)
        return self.starts, os.environ.get("SLURM_RESTART_COUNT", "")
