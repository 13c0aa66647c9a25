"""The CPU each party of a benchmark run used, apart (issue 22): on one VM the sandbox mixes costs
that live on different machines in production. Job hosts come from scale.JobHosts' cgroup; the
other parties are found by process name here: the control plane (kube-apiserver and etcd), the
Slurm controller side (slurmctld, slurmdbd, slurmrestd), the bridge daemon and kwok (which plays
the sim nodes' kubelets).

Per job, in CPU milliseconds, and as the throughput one core of that party would give: jobs per
second per core = 1000 / (ms per job)."""

from __future__ import annotations

import os
from pathlib import Path

PARTIES: dict[str, tuple[str, ...]] = {
    "control_plane": ("kube-apiserver", "etcd"),
    "slurm_controller": ("slurmctld", "slurmdbd", "slurmrestd"),
    "bridge_daemon": ("slurm-k8s-bridg",),  # comm is cut at 15 characters
    "kwok": ("kwok",),
}


def _comm_and_cpu(stat_path: Path) -> tuple[str, float] | None:
    try:
        text = stat_path.read_text()
    except OSError:
        return None
    name = text[text.find("(") + 1:text.rfind(")")]
    fields = text.rsplit(")", 1)[1].split()
    # utime and stime (fields 14, 15 of stat(5)), and what each reaped (cutime, cstime).
    ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))
    return name, ticks / os.sysconf("SC_CLK_TCK")


def cpu_by_party() -> dict[str, float]:
    """CPU seconds so far of every party's live processes."""
    totals = dict.fromkeys(PARTIES, 0.0)
    owners = {name: party for party, names in PARTIES.items() for name in names}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        found = _comm_and_cpu(entry / "stat")
        if found is not None and found[0] in owners:
            totals[owners[found[0]]] += found[1]
        elif found is not None and found[0] == "python3" and _is_daemon(entry):
            totals["bridge_daemon"] += found[1]
    return totals


def _is_daemon(proc: Path) -> bool:
    """The bridge daemon runs as `python3 .../slurm-k8s-bridge run`: its comm is the interpreter's."""
    try:
        argv = (proc / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(arg.endswith(b"slurm-k8s-bridge") for arg in argv[1:2]) and b"run" in argv


def ms_per_job(before: dict[str, float], after: dict[str, float], jobs: int) -> dict[str, float]:
    """Each party's CPU milliseconds per job between two readings."""
    return {party: round((after[party] - before[party]) * 1000 / jobs, 1) for party in PARTIES}


def jobs_per_core_second(ms: float | None) -> float | None:
    """What one core of a party would sustain, from its CPU milliseconds per job."""
    return round(1000 / ms, 1) if ms else None
