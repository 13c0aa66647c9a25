"""Where an array task's time goes, from the logs of the parties (issue 22's per-wave breakdown).

Each stamp comes from the party that saw the moment, in milliseconds:
- slurmctld.log: Slurm's decision (`sched: Allocate JobId=A_i(J)`) and the job's end
  (`_job_complete: JobId=A_i(J) done`);
- bridge.log: the waiter's attach, the pod's creation and the daemon's `job.finished`;
- the task's own output: the script's first instruction reads /proc/uptime (the host's clock, as
  bench/kubelet_start.py's single pods).
Prints medians of each leg; asserts nothing.
"""

from __future__ import annotations

import itertools
import json
import re
import statistics
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

SLURMCTLD_LOG = Path("/var/lib/slurm-k8s-sandbox/log/slurmctld.log")
BRIDGE_LOG = Path("/var/lib/slurm-k8s-sandbox/log/bridge.log")
CTLD_LINE = re.compile(r"^\[([0-9T:.-]+)\] (sched: Allocate|_job_complete:) JobId=(\d+)_(\d+)\((\d+)\)")
BRIDGE_EVENTS = {"attach.accepted": "attach", "pod.created": "created", "job.finished": "finished"}


def _epoch(stamp: str) -> float:
    """Seconds since the epoch; a stamp without a zone is this host's local time (slurmctld's)."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def slurm_moments(array_id: int) -> dict[int, dict[str, float]]:
    """job id -> {"allocated", "completed"} of one array's tasks (slurmctld's local time)."""
    moments: dict[int, dict[str, float]] = {}
    for line in SLURMCTLD_LOG.read_text(errors="replace").splitlines():
        if (match := CTLD_LINE.match(line)) is None or int(match.group(3)) != array_id:
            continue
        if match.group(2) == "_job_complete:" and not line.rstrip().endswith(" done"):
            continue
        key = "allocated" if match.group(2).startswith("sched") else "completed"
        moments.setdefault(int(match.group(5)), {})[key] = _epoch(match.group(1))
    return moments


def bridge_moments(job_ids: set[int]) -> dict[int, dict[str, float]]:
    """job id -> {"attach", "created", "finished"} from the daemon's log (UTC stamps)."""
    moments: dict[int, dict[str, float]] = {}
    for line in BRIDGE_LOG.read_text(errors="replace").splitlines():
        if '"job_id": ' not in line or not any(f'"{event}"' in line for event in BRIDGE_EVENTS):
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        job = record.get("job_id")
        if job in job_ids and record.get("event") in BRIDGE_EVENTS:
            moment = BRIDGE_EVENTS[record["event"]]
            moments.setdefault(job, {}).setdefault(moment, _epoch(record["timestamp"]))
    return moments


def script_starts(
        outputs: Path, array_id: int, boot_epoch: float, task_of: dict[int, int]) -> dict[int, float]:
    """job id -> the script's first instruction, from its output file (`uptime` seconds)."""
    starts: dict[int, float] = {}
    for job, task in task_of.items():
        path = outputs / f"wave-{array_id}-{task}.out"
        try:
            starts[job] = boot_epoch + float(path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return starts


def legs(array_id: int, outputs: Path | None, boot_epoch: float) -> list[tuple[str, list[float]]]:
    """Each leg of a task's life with its durations in seconds, in order."""
    slurm = slurm_moments(array_id)
    moments = {job: dict(m) for job, m in slurm.items()}
    for job, found in bridge_moments(set(slurm)).items():
        moments[job].update(found)
    if outputs is not None:
        task_of = {job: task for job, task in _tasks(array_id).items() if job in slurm}
        for job, start in script_starts(outputs, array_id, boot_epoch, task_of).items():
            moments[job]["script"] = start
    order = ["allocated", "attach", "created", "script", "finished", "completed"]
    names = {
        ("allocated", "attach"): "Slurm decision -> waiter attached (slurmd, slurmstepd, waiter)",
        ("attach", "created"): "attached -> pod created (daemon)",
        ("created", "script"): "pod created -> script's first instruction (kubelet)",
        ("script", "finished"): "script start -> daemon knows its end (script + end detection)",
        ("finished", "completed"): "daemon knows the end -> Slurm job complete (waiter, slurmstepd)",
        ("created", "finished"): "pod created -> daemon knows the end (kubelet, script, end detection)",
        ("allocated", "completed"): "Slurm decision -> Slurm job complete (all of it)",
    }
    result: list[tuple[str, list[float]]] = []
    present = [key for key in order if any(key in m for m in moments.values())]
    pairs = [*itertools.pairwise(present), ("allocated", "completed")]
    for start, end in pairs:
        took = [m[end] - m[start] for m in moments.values() if start in m and end in m]
        if took:
            result.append((names.get((start, end), f"{start} -> {end}"), took))
    # Slurm's turnaround: each end to the next task's start (the %N throttle's slot refilled).
    ends = sorted(m["completed"] for m in moments.values() if "completed" in m)
    starts = sorted(m["allocated"] for m in moments.values() if "allocated" in m)
    gaps = [next_start - end for end in ends if (next_start := next((s for s in starts if s >= end), None))]
    if gaps:
        result.append(("Slurm job complete -> next task's decision (Slurm)", gaps))
    return result


def _tasks(array_id: int) -> dict[int, int]:
    tasks: dict[int, int] = {}
    for line in SLURMCTLD_LOG.read_text(errors="replace").splitlines():
        if (match := CTLD_LINE.match(line)) is not None and int(match.group(3)) == array_id:
            tasks[int(match.group(5))] = int(match.group(4))
    return tasks


def print_legs(title: str, found: list[tuple[str, list[float]]], out: Callable[[str], None] = print) -> None:
    out(title)
    for name, took in found:
        out(f"  {name:66} median {statistics.median(took) * 1000:6.0f} ms  "
            f"p90 {sorted(took)[int(0.9 * (len(took) - 1))] * 1000:6.0f} ms  ({len(took)})")
