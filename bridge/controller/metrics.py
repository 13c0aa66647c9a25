"""The daemon's metrics, through prometheus_client: counters, gauges read at scrape time, latency
histograms and the process' own (CPU, memory, open files). One registry per Metrics, so tests and
a second daemon in one process never share series."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

disable_created_metrics()  # the *_created series only add noise to every scrape

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
    "suspend_failures_total": "Pods whose processes could not be stopped or continued (suspend/resume).",
    "claims_created_total": "GPU ResourceClaims created (dra GPU mode).",
    "claims_allocated_total": "GPU ResourceClaim allocations written (dra GPU mode).",
    "claims_swept_total": "GPU ResourceClaims deleted because their pod was gone.",
    "pods_bound_total": "Pods bound to their node by the bridge once their claim was allocated.",
    "batch_ends_told_by_agent_total": "Batch jobs ended on their agent's word, before their kubelet's.",
    "pod_creations_held_total": "Jobs whose pods waited for an ended run's pods to stop on their node.",
}

HISTOGRAMS = {
    "attach_to_pod_seconds": "From a waiter's attach to its job's pods created.",
    "pod_end_to_job_end_seconds": "From the first pod's container end to the waiter told the outcome.",
    "event_loop_lag_seconds": "How late the daemon's event loop ran a timer (a busy or starved loop).",
}
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._counters: dict[str, Counter] = {}
        self._histograms: dict[str, Histogram] = {}
        self._gauges: set[str] = set()
        for name, help_text in HELP.items():
            self._counter(name, help_text)
        for name, help_text in HISTOGRAMS.items():
            self._histograms[name] = Histogram(
                PREFIX + name, help_text, registry=self.registry, buckets=LATENCY_BUCKETS)
        ProcessCollector(namespace=PREFIX.rstrip("_"), registry=self.registry)

    def _counter(self, name: str, help_text: str) -> Counter:
        # prometheus_client adds the _total suffix itself.
        counter = Counter(PREFIX + name.removesuffix("_total"), help_text, registry=self.registry)
        self._counters[name] = counter
        return counter

    def inc(self, name: str, amount: float = 1.0) -> None:
        counter = self._counters.get(name) or self._counter(name, name)
        counter.inc(amount)

    def value(self, name: str) -> float:
        counter = self._counters.get(name)
        if counter is None:
            return 0.0
        value = self.registry.get_sample_value(PREFIX + name.removesuffix("_total") + "_total")
        return float(value or 0.0)

    def observe(self, name: str, seconds: float) -> None:
        """One latency (see HISTOGRAMS)."""
        self._histograms[name].observe(max(0.0, seconds))

    def gauge(self, name: str, help_text: str, read: Callable[[], float]) -> None:
        """A value read when scraped (queue depth, cache size, leadership...)."""
        if name in self._gauges:
            return
        self._gauges.add(name)
        Gauge(PREFIX + name, help_text, registry=self.registry).set_function(read)

    def counters_from(self, name: str, help_text: str, label: str,
                      read: Callable[[], Mapping[str, float]]) -> None:
        """A counter that another layer keeps (`read` gives its totals by `label` value), read
        when scraped: e.g. the API requests the Kubernetes client sent."""
        if name in self._gauges:
            return
        self._gauges.add(name)
        self.registry.register(_CountersRead(PREFIX + name.removesuffix("_total"), help_text, label, read))

    def render(self) -> str:
        return generate_latest(self.registry).decode()


class _CountersRead(Collector):
    def __init__(self, name: str, help_text: str, label: str,
                 read: Callable[[], Mapping[str, float]]) -> None:
        self._name, self._help, self._label, self._read = name, help_text, label, read

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(self._name, self._help, labels=[self._label])
        for value, total in sorted(self._read().items()):
            family.add_metric([value], total)
        yield family
