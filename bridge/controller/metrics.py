"""Counters and gauges in Prometheus' text format (a handful; no client library needed)."""

from __future__ import annotations

from collections.abc import Callable

PREFIX = "slurm_k8s_bridge_"

HELP = {
    "reconciles_total": "Reconcile passes run.",
    "pods_created_total": "Pods created.",
    "pods_deleted_total": "Pods deleted.",
    "jobs_failed_before_start_total": "Jobs ended because their script could not start.",
    "log_lines_total": "Log lines relayed to waiters.",
    "slurm_polls_total": "Polls of Slurm for job changes.",
    "slurm_poll_changes_total": "Polls that returned changed jobs.",
    "slurm_errors_total": "Failed Slurm requests.",
    "slurm_records_skipped_total": "Job records of bridged partitions that could not be parsed (skipped).",
    "slurm_confirm_reads_total": "Reads of one job to confirm that it is gone before acting on its absence.",
    "sessions_ended_total": "Waiter sessions ended because Slurm showed their run over.",
    "log_relay_resumes_total": "Log relays resumed after their stream ended or stalled early.",
    "attach_requests_total": "Waiter attach requests accepted.",
    "attach_rejected_total": "Waiter requests rejected (identity, unknown job, bad payload).",
    "slurm_node_polls_total": "Polls of Slurm for node changes.",
    "slurm_node_updates_total": "Slurm node updates sent (DOWN, DRAIN, RESUME).",
    "node_mass_failure_brakes_total": "DOWNs turned into DRAINs: over half the bridged nodes unhealthy.",
}


class Metrics:
    def __init__(self) -> None:
        self._counters: dict[str, float] = dict.fromkeys(HELP, 0.0)
        self._gauges: dict[str, tuple[str, Callable[[], float]]] = {}

    def inc(self, name: str, amount: float = 1.0) -> None:
        self._counters[name] = self._counters.get(name, 0.0) + amount

    def value(self, name: str) -> float:
        return self._counters.get(name, 0.0)

    def gauge(self, name: str, help_text: str, read: Callable[[], float]) -> None:
        """A value read when scraped (queue depth, cache size, leadership...)."""
        self._gauges[name] = (help_text, read)

    def render(self) -> str:
        lines: list[str] = []
        for name, value in sorted(self._counters.items()):
            lines += [f"# HELP {PREFIX}{name} {HELP.get(name, name)}", f"# TYPE {PREFIX}{name} counter",
                      f"{PREFIX}{name} {value:g}"]
        for name, (help_text, read) in sorted(self._gauges.items()):
            lines += [f"# HELP {PREFIX}{name} {help_text}", f"# TYPE {PREFIX}{name} gauge",
                      f"{PREFIX}{name} {read():g}"]
        return "\n".join(lines) + "\n"
