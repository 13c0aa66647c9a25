"""NodeCache: every Kubernetes node, trimmed to what the bridge reads; watch events and relists
report only the nodes that changed in a way the bridge reads (heartbeats change nothing), the
label index follows relabels and deletions, and 1000 full nodes leave a small cache behind."""

from __future__ import annotations

import copy
import gc
import json
import tracemalloc
from typing import Any

import pytest

from bridge.clients.kube.nodes import NodeCache
from bridge.core.nodehealth import OUT_OF_SERVICE_TAINT, KubeNode, Taint

SLURM = "example.org/slurm-node"


def node(
    name: str,
    slurm_name: str | None = None,
    *,
    ready: str = "True",
    heartbeat: str = "2025-12-01T12:00:00Z",
    images: int = 3,
    rv: str = "1",
    zone: str = "a",
    unschedulable: bool = False,
    taints: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A Node as the API server sends it, with the fields the cache must not keep."""
    labels = {"kubernetes.io/hostname": name, "topology.kubernetes.io/zone": zone}
    if slurm_name is not None:
        labels[SLURM] = slurm_name
    spec: dict[str, Any] = {"podCIDR": "10.244.0.0/24"}
    if unschedulable:
        spec["unschedulable"] = True
    if taints:
        spec["taints"] = taints
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {"name": name, "resourceVersion": rv, "labels": labels},
        "spec": spec,
        "status": {
            "conditions": [
                {"type": "MemoryPressure", "status": "False", "lastHeartbeatTime": heartbeat},
                {
                    "type": "Ready", "status": ready, "reason": "KubeletReady",
                    "message": "kubelet is posting ready status", "lastHeartbeatTime": heartbeat,
                },
            ],
            "images": [{"names": [f"registry.example.org/img{i}:1"], "sizeBytes": i} for i in range(images)],
        },
    }


@pytest.fixture
def cache() -> NodeCache:
    return NodeCache([SLURM])


# -- what a change is -------------------------------------------------------------------------


def test_trim_keeps_only_the_mapping_labels(cache: NodeCache) -> None:
    trimmed = cache.trim(node("k1", "n1"))
    assert trimmed == KubeNode(
        name="k1", labels={SLURM: "n1"}, ready="True", ready_reason="KubeletReady",
        ready_message="kubelet is posting ready status",
    )


def test_a_new_node_is_a_change_and_is_kept(cache: NodeCache) -> None:
    assert cache.apply("ADDED", node("k1", "n1")) == {"k1"}
    assert cache.get("k1") == cache.trim(node("k1", "n1"))
    assert (len(cache), cache.names()) == (1, ["k1"])


@pytest.mark.parametrize(
    "changes",
    [
        {"heartbeat": "2025-12-01T12:00:40Z"},
        {"images": 30},
        {"rv": "2"},
        {"zone": "b"},
        {"heartbeat": "2025-12-01T12:00:40Z", "images": 0, "rv": "3", "zone": "c"},
    ],
    ids=["heartbeat", "images", "resourceVersion", "unmapped label", "all of them"],
)
def test_changes_the_bridge_does_not_read_are_no_change(cache: NodeCache, changes: dict[str, Any]) -> None:
    cache.apply("ADDED", node("k1", "n1"))
    assert cache.apply("MODIFIED", node("k1", "n1", **changes)) == set()
    assert cache.replace_all([cache.trim(node("k1", "n1", **changes))]) == set()


@pytest.mark.parametrize(
    "changes",
    [
        {"ready": "False"},
        {"ready": "Unknown"},
        {"unschedulable": True},
        {"taints": [{"key": "gpu", "effect": "NoSchedule"}]},
        {"slurm_name": "n2"},
    ],
    ids=["NotReady", "Unknown", "cordon", "taint", "mapping label"],
)
def test_changes_the_bridge_reads_are_a_change(cache: NodeCache, changes: dict[str, Any]) -> None:
    cache.apply("ADDED", node("k1", "n1"))
    fields = {"slurm_name": "n1", **changes}
    assert cache.apply("MODIFIED", node("k1", **fields)) == {"k1"}
    assert cache.get("k1") == cache.trim(node("k1", **fields))


def test_a_taint_with_a_new_time_added_is_no_change(cache: NodeCache) -> None:
    taint = {"key": "gpu", "effect": "NoExecute", "timeAdded": "2025-12-01T12:00:00Z"}
    cache.apply("ADDED", node("k1", taints=[taint]))
    again = {**taint, "timeAdded": "2025-12-01T12:05:00Z"}
    assert cache.apply("MODIFIED", node("k1", taints=[again])) == set()
    got = cache.get("k1")
    assert got is not None
    assert got.taints == (Taint("gpu", "", "NoExecute"),)


def test_the_out_of_service_taint_is_kept_and_its_removal_is_a_change(cache: NodeCache) -> None:
    """node_is_dead reads it from the cache: it must arrive, and its removal too."""
    oos = {"key": OUT_OF_SERVICE_TAINT, "value": "nodeshutdown", "effect": "NoExecute",
           "timeAdded": "2025-12-01T12:00:00Z"}
    cache.apply("ADDED", node("k1", ready="False"))
    assert cache.apply("MODIFIED", node("k1", ready="False", taints=[oos])) == {"k1"}
    got = cache.get("k1")
    assert got is not None
    assert got.taints == (Taint(OUT_OF_SERVICE_TAINT, "nodeshutdown", "NoExecute"),)
    assert cache.apply("MODIFIED", node("k1", ready="False")) == {"k1"}
    got = cache.get("k1")
    assert got is not None
    assert got.taints == ()


def test_a_deleted_node_is_a_change_once(cache: NodeCache) -> None:
    cache.apply("ADDED", node("k1", "n1"))
    assert cache.apply("DELETED", node("k1", "n1")) == {"k1"}
    assert cache.get("k1") is None
    assert cache.apply("DELETED", node("k1", "n1")) == set()


def test_events_without_a_name_or_of_other_types_change_nothing(cache: NodeCache) -> None:
    assert cache.apply("ADDED", {"metadata": {}}) == set()
    assert cache.apply("ADDED", {}) == set()
    assert cache.apply("BOOKMARK", node("k1")) == set()
    assert len(cache) == 0


# -- replace_all ------------------------------------------------------------------------------


def test_the_first_full_list_changes_every_node_and_syncs_the_cache(cache: NodeCache) -> None:
    assert not cache.synced.is_set()
    assert cache.replace_all([cache.trim(node("k1", "n1")), cache.trim(node("k2", "n2"))]) == {"k1", "k2"}
    assert cache.synced.is_set()
    assert cache.names() == ["k1", "k2"]


def test_an_empty_full_list_syncs_the_cache_too(cache: NodeCache) -> None:
    assert cache.replace_all([]) == set()
    assert cache.synced.is_set()


def test_a_relist_reports_only_added_removed_and_really_changed_nodes(cache: NodeCache) -> None:
    cache.replace_all([cache.trim(node(name, f"n-{name}")) for name in ("k1", "k2", "k3")])
    fresh = [
        node("k1", "n-k1", heartbeat="2025-12-01T13:00:00Z", images=30),  # heartbeat only
        node("k2", "n-k2", unschedulable=True),  # cordoned
        node("k4", "n-k4"),  # new
    ]  # k3 is gone

    assert cache.replace_all([cache.trim(obj) for obj in fresh]) == {"k2", "k3", "k4"}
    assert cache.names() == ["k1", "k2", "k4"]
    assert dict(cache.by_label(SLURM)) == {"n-k1": "k1", "n-k2": "k2", "n-k4": "k4"}


def test_nameless_nodes_in_a_full_list_are_skipped(cache: NodeCache) -> None:
    assert cache.replace_all([KubeNode(name=""), cache.trim(node("k1"))]) == {"k1"}
    assert cache.names() == ["k1"]


# -- the label index --------------------------------------------------------------------------


def test_the_label_index_maps_slurm_names_to_kubernetes_nodes(cache: NodeCache) -> None:
    cache.apply("ADDED", node("k1", "n1"))
    cache.apply("ADDED", node("k2"))
    assert dict(cache.by_label(SLURM)) == {"n1": "k1"}


def test_a_relabelled_node_moves_in_the_index(cache: NodeCache) -> None:
    cache.apply("ADDED", node("k1", "n1"))
    cache.apply("MODIFIED", node("k1", "n7"))
    assert dict(cache.by_label(SLURM)) == {"n7": "k1"}
    cache.apply("MODIFIED", node("k1"))
    assert dict(cache.by_label(SLURM)) == {}


def test_two_nodes_swapping_labels_keep_the_index_right(cache: NodeCache) -> None:
    cache.replace_all([cache.trim(node("k1", "n1")), cache.trim(node("k2", "n2"))])
    cache.apply("MODIFIED", node("k1", "n2"))
    cache.apply("MODIFIED", node("k2", "n1"))
    assert dict(cache.by_label(SLURM)) == {"n1": "k2", "n2": "k1"}


def test_a_deleted_node_leaves_the_index(cache: NodeCache) -> None:
    cache.apply("ADDED", node("k1", "n1"))
    cache.apply("ADDED", node("k2", "n2"))
    cache.apply("DELETED", node("k1", "n1"))
    assert dict(cache.by_label(SLURM)) == {"n2": "k2"}
    cache.replace_all([])
    assert dict(cache.by_label(SLURM)) == {}


def test_a_replacement_node_keeps_the_label_when_the_old_one_goes(cache: NodeCache) -> None:
    cache.apply("ADDED", node("old", "n1"))
    cache.apply("ADDED", node("new", "n1"))
    cache.apply("DELETED", node("old", "n1"))
    assert dict(cache.by_label(SLURM)) == {"n1": "new"}


def test_a_label_nobody_maps_by_has_an_empty_index(cache: NodeCache) -> None:
    cache.apply("ADDED", node("k1", "n1"))
    assert dict(cache.by_label("kubernetes.io/hostname")) == {}
    assert cache.get("k1") is not None
    assert dict(NodeCache().by_label(SLURM)) == {}


# -- memory -----------------------------------------------------------------------------------

NODES = 1000
RETAINED_LIMIT = 2_000_000


def realistic_node(i: int) -> dict[str, Any]:
    """A Node about the size a real cluster sends (5-10 KB as JSON)."""
    name = f"worker-{i:04d}.compute.example.org"
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": "gpu.8xlarge",
        "topology.kubernetes.io/region": "eu-west-1",
        "topology.kubernetes.io/zone": f"eu-west-1{'abc'[i % 3]}",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
        SLURM: f"gpu{i:04d}",
    }
    heartbeat = "2025-12-01T12:00:00Z"
    conditions = [
        {"type": kind, "status": "False", "reason": f"KubeletHasSufficient{kind}", "message": "ok",
         "lastHeartbeatTime": heartbeat, "lastTransitionTime": "2025-11-01T00:00:00Z"}
        for kind in ("MemoryPressure", "DiskPressure", "PIDPressure")
    ]
    conditions.append({
        "type": "Ready", "status": "True", "reason": "KubeletReady",
        "message": "kubelet is posting ready status", "lastHeartbeatTime": heartbeat,
        "lastTransitionTime": "2025-11-01T00:00:00Z",
    })
    images = [
        {
            "names": [
                f"registry.example.org/team{j}/image{j}@sha256:{(i * 31 + j) :064x}",
                f"registry.example.org/team{j}/image{j}:v{j}.{i % 7}",
            ],
            "sizeBytes": 100_000_000 + j * 12_345,
        }
        for j in range(30)
    ]
    resources = {"cpu": "64", "memory": "527983412Ki", "ephemeral-storage": "1844284036Ki",
                 "nvidia.com/gpu": "8", "pods": "110", "hugepages-2Mi": "0"}
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": f"{i:08d}-0000-4000-8000-000000000000",
            "resourceVersion": str(1_000_000 + i),
            "creationTimestamp": "2025-11-01T00:00:00Z",
            "labels": labels,
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                "csi.volume.kubernetes.io/nodeid": json.dumps({"ebs.csi.aws.com": f"i-{i:017x}"}),
            },
        },
        "spec": {
            "podCIDR": f"10.{i // 256}.{i % 256}.0/24",
            "providerID": f"aws:///eu-west-1a/i-{i:017x}",
            "taints": [{"key": "slurm-k8s-bridge/bridged", "effect": "NoSchedule"}],
        },
        "status": {
            "capacity": resources,
            "allocatable": dict(resources),
            "conditions": conditions,
            "addresses": [
                {"type": "InternalIP", "address": f"10.0.{i // 256}.{i % 256}"},
                {"type": "ExternalIP", "address": f"52.1.{i // 256}.{i % 256}"},
                {"type": "Hostname", "address": name},
                {"type": "InternalDNS", "address": f"ip-10-0-{i // 256}-{i % 256}.internal"},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": f"{i:032x}", "systemUUID": f"{i:08x}-aaaa-bbbb-cccc-dddddddddddd",
                "bootID": f"{i:08x}-1111-2222-3333-444444444444", "kernelVersion": "6.1.0-27-amd64",
                "osImage": "Debian GNU/Linux 12 (bookworm)", "containerRuntimeVersion": "containerd://1.7.22",
                "kubeletVersion": "v1.31.2", "kubeProxyVersion": "v1.31.2", "operatingSystem": "linux",
                "architecture": "amd64",
            },
            "images": images,
        },
    }


def test_a_thousand_full_nodes_leave_less_than_2_mb_in_the_cache() -> None:
    # Serialized first, outside the measurement: decoding is what the watcher does with a list page,
    # and it gives every node its own strings, as the API server's answer does.
    page = json.dumps({"items": [realistic_node(i) for i in range(NODES)]}).encode()
    gc.collect()

    tracemalloc.start()
    try:
        cache = NodeCache([SLURM])
        items = json.loads(page)["items"]
        full_size, _ = tracemalloc.get_traced_memory()
        changed = cache.replace_all([cache.trim(obj) for obj in items])
        del items
        gc.collect()
        retained, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert len(changed) == len(cache) == NODES
    assert cache.by_label(SLURM)["gpu0999"] == "worker-0999.compute.example.org"
    # The measurement saw the full nodes (else a cache keeping them whole would pass as well)...
    assert full_size > 5 * RETAINED_LIMIT, full_size
    # ...and what stays behind is small: about 2 KB per node at most.
    assert retained < RETAINED_LIMIT, f"the cache retains {retained} bytes for {NODES} nodes"


def test_the_trimmed_view_shares_nothing_mutable_with_the_full_node(cache: NodeCache) -> None:
    obj = node("k1", "n1", taints=[{"key": "gpu", "effect": "NoSchedule"}])
    before = copy.deepcopy(obj)
    cache.apply("ADDED", obj)
    obj["metadata"]["labels"][SLURM] = "changed"
    obj["spec"]["taints"].append({"key": "x", "effect": "NoSchedule"})
    assert cache.get("k1") == cache.trim(before)


def test_a_label_value_briefly_shared_by_two_nodes_stays_mapped_to_the_one_that_keeps_it() -> None:
    label = "example.org/slurm-node"
    cache = NodeCache([label])

    def node(name: str, value: str) -> dict[str, object]:
        return {"metadata": {"name": name, "labels": {label: value}}, "spec": {}, "status": {}}

    cache.apply("ADDED", node("worker-a", "n1"))
    cache.apply("ADDED", node("worker-b", "n1"))  # mislabelled by mistake
    cache.apply("MODIFIED", node("worker-b", "n2"))  # and fixed

    assert dict(cache.by_label(label)) == {"n1": "worker-a", "n2": "worker-b"}
    cache.apply("DELETED", node("worker-a", "n1"))
    assert dict(cache.by_label(label)) == {"n2": "worker-b"}
