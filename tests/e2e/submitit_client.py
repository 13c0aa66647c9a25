"""A researcher's submitit program (github.com/facebookincubator/submitit), run as the user with
the system's python3 by tests/e2e/test_real_clients_submitit.py: a function, an array by
map_array, and a checkpointable job interrupted as Slurm preempts it (scancel --signal TERM, then
USR2), which requeues itself with `scontrol requeue` from inside its task and resumes. Prints one
JSON object: what came back and Slurm's job ids.

Usage: python3 submitit_client.py PARTITION FOLDER
"""

from __future__ import annotations

import json
import os
import sys
import time

import submitit  # type: ignore[import-not-found]
from submitit_jobs import Counter, fails, square  # type: ignore[import-not-found]


def main() -> None:
    partition, folder = sys.argv[1], sys.argv[2]
    executor = submitit.AutoExecutor(folder=folder, cluster="slurm", slurm_python="/usr/bin/python3")
    executor.update_parameters(slurm_partition=partition, timeout_min=5, slurm_mem="200M")
    report: dict[str, object] = {}

    one = executor.submit(square, 7)
    array = executor.map_array(square, range(6))
    failing = executor.submit(fails)
    marker = os.path.join(folder, "counter-started")
    counter = executor.submit(Counter(), marker)
    report["ids"] = {"one": one.job_id, "array": [job.job_id for job in array], "failing": failing.job_id,
                     "counter": counter.job_id}

    deadline = time.monotonic() + 240
    while not os.path.exists(marker + ".1"):
        if time.monotonic() > deadline:
            raise SystemExit(f"the checkpointable job never started: {counter.state}")
        time.sleep(0.5)
    counter._interrupt()  # as a preemption: TERM, then submitit's USR2

    report["one"] = one.result()
    report["array"] = [job.result() for job in array]
    try:
        failing.result()
        report["failing"] = "no error"
    except submitit.core.utils.FailedJobError as error:
        report["failing"] = "ValueError: refused on purpose" in str(error)
    report["counter"] = counter.result()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
