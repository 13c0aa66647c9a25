"""Issue 11: the daemon's metrics come from prometheus_client (counters, gauges read at scrape
time, latency histograms and the process' CPU, memory and open files), in the text format every
Prometheus scraper reads."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from bridge.controller.metrics import Metrics


def test_counters_gauges_histograms_and_process_metrics_render_as_prometheus_text() -> None:
    metrics = Metrics()
    metrics.inc("pods_created_total", 2)
    metrics.inc("pods_created_total")
    metrics.gauge("queue_depth", "Job ids waiting to be reconciled.", lambda: 7.0)
    metrics.observe("attach_to_pod_seconds", 0.02)
    metrics.observe("attach_to_pod_seconds", 3.0)

    families = {family.name: family for family in text_string_to_metric_families(metrics.render())}
    samples = {sample.name: sample.value for family in families.values() for sample in family.samples
               if not sample.labels or sample.labels.get("le") in (None, "0.025")}

    assert families["slurm_k8s_bridge_pods_created"].type == "counter"
    assert samples["slurm_k8s_bridge_pods_created_total"] == 3.0 == metrics.value("pods_created_total")
    assert samples["slurm_k8s_bridge_queue_depth"] == 7.0
    assert samples["slurm_k8s_bridge_attach_to_pod_seconds_count"] == 2.0
    assert samples["slurm_k8s_bridge_attach_to_pod_seconds_bucket"] == 1.0  # le=0.025
    assert samples["slurm_k8s_bridge_process_resident_memory_bytes"] > 0
    assert not any(name.endswith("_created") for name in samples), "no *_created noise"


def test_two_daemons_in_one_process_do_not_share_series() -> None:
    first, second = Metrics(), Metrics()
    first.inc("reconciles_total")
    assert (first.value("reconciles_total"), second.value("reconciles_total")) == (1.0, 0.0)
