"""doctor's workloads check (bridge.manager.doctor_workloads): a node of a managed namespace's
partition whose Slurm CPUs or memory exceed its kubelet's allocatable is reported (a pod Slurm places
there would be refused OutOfcpu); a node that admits what Slurm offers, or of another partition, not."""

from __future__ import annotations

from typing import Any

from bridge.manager.doctor_workloads import capacity_notes


def kube(cpu: str, memory: str) -> dict[str, Any]:
    return {"status": {"allocatable": {"cpu": cpu, "memory": memory}}}


def test_a_node_offering_more_than_its_kubelet_admits_is_reported() -> None:
    slurm = [{"name": "kreal1", "cpus": 8, "real_memory": 8192, "partitions": ["k8s"]},
             {"name": "kreal2", "cpus": 2, "real_memory": 8192, "partitions": ["k8s"]},
             {"name": "big", "cpus": 2, "real_memory": 65536, "partitions": ["k8s"]},
             {"name": "other", "cpus": 99, "real_memory": 1, "partitions": ["native"]}]
    kubes = {"kreal1": kube("2", "24478992Ki"), "kreal2": kube("2000m", "24478992Ki"),
             "big": kube("4", "32Gi"), "other": kube("1", "1Mi")}
    notes = capacity_notes({"k8s"}, slurm, kubes)
    assert len(notes) == 2, notes
    assert "node big: Slurm offers 2 CPUs and 65536 MiB, its kubelet admits pods up to 4 CPUs and 32768 MiB" \
        in notes[0]
    assert "node kreal1: Slurm offers 8 CPUs" in notes[1] and "OutOfcpu" in notes[1]
    assert capacity_notes({"sim"}, slurm, kubes) == []
