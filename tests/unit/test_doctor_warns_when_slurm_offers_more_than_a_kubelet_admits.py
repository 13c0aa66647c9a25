"""doctor's workloads check (bridge.manager.doctor_workloads): a node of a managed namespace's
partition whose Slurm CPUs or memory exceed its kubelet's allocatable is reported (a pod Slurm places
there would be refused OutOfcpu); a node that admits what Slurm offers, or of another partition, not."""

from __future__ import annotations

from typing import Any

from bridge.manager.doctor_workloads import capacity_notes, not_slurms


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


def daemon_pod(node: str, cpu: str, memory: str, *, phase: str = "Running",
               owner: str = "DaemonSet") -> dict[str, Any]:
    requests = {"requests": {"cpu": cpu, "memory": memory}}
    return {"metadata": {"ownerReferences": [{"kind": owner, "name": "x"}]},
            "spec": {"nodeName": node, "containers": [{"resources": requests}]}, "status": {"phase": phase}}


def test_what_daemonsets_request_on_a_node_is_not_slurms_to_offer() -> None:
    """A node whose kubelet admits 4 CPUs and 8 GiB, with DaemonSets holding 1.5 CPUs and 1 GiB: Slurm
    may offer 2 CPUs and 7 GiB there, not 3; the note says what to set. A Job's pod, or a DaemonSet's pod
    that ended, holds nothing Slurm should leave."""
    held = not_slurms([daemon_pod("n1", "1", "512Mi"), daemon_pod("n1", "500m", "512Mi"),
                       daemon_pod("n1", "4", "1Gi", phase="Succeeded"),
                       daemon_pod("n1", "4", "1Gi", owner="Job")])
    assert held == {"n1": (1.5, 2**30)}
    kubes = {"n1": kube("4", "8Gi")}
    fits = [{"name": "n1", "cpus": 2, "real_memory": 7168, "partitions": ["k8s"]}]
    assert capacity_notes({"k8s"}, fits, kubes, held) == []
    (note,) = capacity_notes({"k8s"}, [{**fits[0], "cpus": 3}], kubes, held)
    assert "less 1.5 CPUs and 1024 MiB its DaemonSets' pods request" in note, note
    assert "CPUs=2 RealMemory=7168" in note, note
    assert capacity_notes({"k8s"}, [{**fits[0], "cpus": 3}], kubes) == []  # without them, 3 fit
