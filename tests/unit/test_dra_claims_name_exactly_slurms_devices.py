"""The `dra` GPU mode, pure parts: Slurm's GRES indices name exactly one published device each (by
index, minor or PCI bus order), the pod waits unbound for its claim, the claim and its allocation
hold exactly those devices for that pod, and a device another claim holds is found."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.clients.kube.dra import ClaimCache
from bridge.core import wellknown
from bridge.core.config import PartitionConfig, parse_config
from bridge.core.config_errors import ConfigError
from bridge.core.device_claims import (
    DeviceMappingError,
    claim_manifest,
    claim_status,
    current_devices,
    devices_for,
    holders,
    trim_claim,
    trim_slice,
)
from bridge.core.directives import Directives
from bridge.core.gres import gpu_count
from bridge.core.translate import desired_pods
from bridge.manager.doctor_gpus import gpu_problems

from .builders import allocation, config, payload

DRIVER = "gpu.example.com"
DRA = PartitionConfig(gpu_mode="dra", dra_driver=DRIVER)


def a_slice(node: str, devices: list[dict[str, Any]], generation: int = 1, name: str = "") -> dict[str, Any]:
    return {
        "metadata": {"name": name or f"{node}-{DRIVER}-{generation}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation},
            "devices": devices,
        },
    }


def gpu(n: int, **attributes: Any) -> dict[str, Any]:
    kinds = {int: "int", str: "string", bool: "bool"}
    attrs = {"index": {"int": n}, "uuid": {"string": f"gpu-uuid-{n}"}}
    attrs.update({key: {kinds[type(value)]: value} for key, value in attributes.items()})
    return {"name": f"gpu-{n}", "attributes": attrs}


def test_indices_name_the_devices_with_that_index_attribute() -> None:
    devices = trim_slice(a_slice("kreal1", [gpu(n) for n in range(4)])).devices
    chosen = devices_for((1, 3), devices, "index", driver=DRIVER, node="kreal1")
    assert [(d.pool, d.name) for d in chosen] == [("kreal1", "gpu-1"), ("kreal1", "gpu-3")]


def test_minor_and_pci_bus_order_map_where_no_index_is_published() -> None:
    # NVIDIA's driver: names by minor, no index attribute; Slurm's nvml order is PCI bus order.
    published = [
        {"name": "gpu-7", "attributes": {"minor": {"int": 0}, "pciBusID": {"string": "0000:b1:00.0"}}},
        {"name": "gpu-2", "attributes": {"minor": {"int": 1}, "pciBusID": {"string": "0000:1a:00.0"}}},
    ]
    devices = trim_slice(a_slice("n", published)).devices
    assert [d.name for d in devices_for((1,), devices, "minor", driver=DRIVER, node="n")] == ["gpu-2"]
    assert [d.name for d in devices_for((0, 1), devices, "pciBusID", driver=DRIVER, node="n")] == [
        "gpu-2",
        "gpu-7",
    ]


def test_attributes_qualified_by_the_drivers_domain_count_as_bare() -> None:
    piece = a_slice("n", [{"name": "gpu-0", "attributes": {f"{DRIVER}/index": {"int": 0}}}])
    assert devices_for((0,), trim_slice(piece).devices, "index", driver=DRIVER, node="n")[0].name == "gpu-0"


@pytest.mark.parametrize(
    ("published", "indices", "message"),
    [
        ([], (0,), "publishes no devices of DRA driver gpu.example.com"),
        (
            [gpu(0), gpu(1)],
            (0, 3),
            "Slurm gave GPU index 3 on n, but driver gpu.example.com publishes no device",
        ),
        ([gpu(0), {"name": "gpu-9", "attributes": {"index": {"int": 0}}}], (0,), "names 2 devices"),
    ],
)
def test_a_mapping_that_is_not_one_to_one_is_refused_with_its_reason(
    published: list[dict[str, Any]], indices: tuple[int, ...], message: str
) -> None:
    with pytest.raises(DeviceMappingError, match=message):
        devices_for(indices, trim_slice(a_slice("n", published)).devices, "index", driver=DRIVER, node="n")


def test_only_the_newest_generation_of_a_pool_counts() -> None:
    old = trim_slice(a_slice("n", [gpu(0), gpu(1)], generation=1))
    new = trim_slice(a_slice("n", [gpu(0)], generation=2))
    assert [d.name for d in current_devices([old, new])] == ["gpu-0"]


def test_the_pod_waits_unbound_for_its_claim_and_requests_no_gpu_resource() -> None:
    first, second = desired_pods(allocation(), payload(), Directives(image="debian:12"), DRA, config())
    spec, container = first["spec"], first["spec"]["containers"][0]
    assert "nodeName" not in spec
    assert spec["schedulerName"] == wellknown.SCHEDULER_NAME
    assert first["metadata"]["annotations"][wellknown.ANNOTATION_KUBE_NODE] == "kube1"
    assert spec["resourceClaims"] == [
        {"name": "gpus", "resourceClaimName": first["metadata"]["name"] + "-gpus"}
    ]
    assert container["resources"]["claims"] == [{"name": "gpus"}]
    assert wellknown.GPU_RESOURCE not in container["resources"]["limits"]
    env = {e["name"]: e["value"] for e in container["env"]}
    # The devices come from the claim; an image's NVIDIA_VISIBLE_DEVICES=all must not add others.
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert (env["SLURM_JOB_GPUS"], env["CUDA_VISIBLE_DEVICES"]) == ("1,3", "0,1")
    # The node without GPUs is pinned as ever: no claim, no wait.
    assert second["spec"]["nodeName"] == "kube2" and "resourceClaims" not in second["spec"]


def test_the_claim_holds_exactly_the_devices_for_exactly_that_pod() -> None:
    devices = devices_for(
        (1, 3),
        trim_slice(a_slice("kreal1", [gpu(n) for n in range(4)])).devices,
        "index",
        driver=DRIVER,
        node="kreal1",
    )
    claim = claim_manifest("slurm-7-0", "uid-7", "slurm-jobs", {"a": "b"}, DRIVER, devices, "index")
    assert claim["metadata"]["name"] == "slurm-7-0-gpus"
    assert claim["metadata"]["ownerReferences"][0]["uid"] == "uid-7"
    request = claim["spec"]["devices"]["requests"][0]
    assert request["exactly"]["count"] == 2
    assert request["exactly"]["selectors"] == [
        {"cel": {"expression": f"device.attributes['{DRIVER}'].index in [1, 3]"}}
    ]
    status = claim_status("slurm-7-0", "uid-7", "kreal1", devices)
    assert [r["device"] for r in status["allocation"]["devices"]["results"]] == ["gpu-1", "gpu-3"]
    assert status["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [
        "kreal1"
    ]
    assert status["reservedFor"] == [{"resource": "pods", "name": "slurm-7-0", "uid": "uid-7"}]
    held = trim_claim({**claim, "status": status})
    assert held.owner_pod_uid == "uid-7" and held.reserved_for == {"uid-7"}
    assert held.devices == {(DRIVER, "kreal1", "gpu-1"), (DRIVER, "kreal1", "gpu-3")}


def test_another_claim_holding_a_wanted_device_is_found() -> None:
    devices = trim_slice(a_slice("n", [gpu(n) for n in range(4)])).devices
    other = trim_claim(
        {
            "metadata": {"namespace": "ml", "name": "theirs"},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [{"request": "r", "driver": DRIVER, "pool": "n", "device": "gpu-2"}]
                    }
                }
            },
        }
    )
    assert not other.ours
    assert holders(devices[:2], [other], "slurm-jobs/mine") == []
    ((device, holder),) = holders(devices[1:3], [other], "slurm-jobs/mine")
    assert (device.name, holder.key) == ("gpu-2", "ml/theirs")
    assert holders(devices, [other], "ml/theirs") == []  # its own claim is no other holder


def test_dra_mode_needs_its_driver() -> None:
    text = 'cluster = "c"\n[slurm]\nurl = "http://x"\n[partitions.p]\ngpu_mode = "dra"\n'
    with pytest.raises(ConfigError, match=r"partitions\.p\.dra_driver: required when gpu_mode is 'dra'"):
        parse_config(text)
    assert (
        parse_config(text + 'dra_driver = "gpu.example.com"\n').partitions["p"].dra_device_identity == "index"
    )


def test_gpu_counts_read_from_slurms_gres() -> None:
    assert [
        gpu_count(g) for g in ("gpu:4", "gpu:a100:2(S:0),nic:1", "", "nic:2", "gpu:tesla:1,gpu:k80:2")
    ] == [4, 2, 0, 0, 3]


def test_doctor_fails_a_broken_mapping_and_warns_about_env_mode() -> None:
    slices = [
        trim_slice(a_slice("kreal1", [gpu(n) for n in range(4)])),
        trim_slice(a_slice("kreal2", [gpu(0), gpu(1)])),
    ]
    nodes = {"kreal1": ("gpu:4", ["dra", "k8s"]), "kreal2": ("gpu:4", ["dra", "k8s"])}
    problems, notes = gpu_problems({"dra": DRA, "k8s": PartitionConfig()}, nodes, slices)
    assert problems == [
        "partition dra: GPU index 2 of node kreal2 names 0 device(s) of gpu.example.com by index "
        "(exactly one needed; 2 published)",
        "partition dra: GPU index 3 of node kreal2 names 0 device(s) of gpu.example.com by index "
        "(exactly one needed; 2 published)",
    ]
    assert notes[0].startswith('partition k8s: warning: gpu_mode "env"')
    whole = [slices[0], trim_slice(a_slice("kreal2", [gpu(n) for n in range(4)]))]
    problems, notes = gpu_problems({"dra": DRA}, nodes, whole)
    assert problems == [] and notes == [
        "partition dra: 8 GPU(s) on 2 node(s) map to gpu.example.com's devices by index"
    ]
    problems, _ = gpu_problems({"dra": DRA}, nodes, whole[:1])
    assert problems == [
        "partition dra: node kreal2 has 4 GPU(s) in Slurm but driver gpu.example.com publishes "
        "no device there (is the driver running?)"
    ]


def test_pci_bus_order_reads_the_standard_attribute_counts_whole_gpus_and_refuses_a_shared_bus() -> None:
    published = [
        {
            "name": "gpu-1",
            "attributes": {
                "resource.kubernetes.io/pciBusID": {"string": "0000:B1:00.0"},
                "type": {"string": "gpu"},
            },
        },
        {
            "name": "gpu-0",
            "attributes": {
                "resource.kubernetes.io/pciBusID": {"string": "0000:1a:00.0"},
                "type": {"string": "gpu"},
            },
        },
        # A MIG slice carries its parent's bus id: not a GPU of Slurm's count.
        {
            "name": "gpu-0-mig-1g",
            "attributes": {
                "resource.kubernetes.io/pciBusID": {"string": "0000:1a:00.0"},
                "type": {"string": "mig"},
            },
        },
    ]
    devices = trim_slice(a_slice("n", published)).devices
    chosen = devices_for((0, 1), devices, "pciBusID", driver=DRIVER, node="n")
    assert [d.name for d in chosen] == ["gpu-0", "gpu-1"]
    claim = claim_manifest("p", "u", "ns", {}, DRIVER, chosen, "pciBusID")
    expression = claim["spec"]["devices"]["requests"][0]["exactly"]["selectors"][0]["cel"]["expression"]
    assert (
        expression
        == "device.attributes['resource.kubernetes.io'].pciBusID in ['0000:1a:00.0', '0000:b1:00.0']"
    )
    # NVIDIA's own attribute, in its domain.
    nvidia = trim_slice(
        a_slice("n", [{"name": "gpu-3", "attributes": {f"{DRIVER}/pcieBusID": {"string": "0000:02:00.0"}}}])
    ).devices
    assert [d.name for d in devices_for((0,), nvidia, "pciBusID", driver=DRIVER, node="n")] == ["gpu-3"]
    shared = [{"name": f"gpu-{n}", "attributes": {"pciBusID": {"string": "0000:02:00.0"}}} for n in range(2)]
    with pytest.raises(DeviceMappingError, match="names 2 devices"):
        devices_for((0,), trim_slice(a_slice("n", shared)).devices, "pciBusID", driver=DRIVER, node="n")


def test_a_pool_of_several_slices_counts_only_once_all_have_arrived() -> None:
    def piece(name: str, devices: list[dict[str, Any]]) -> dict[str, Any]:
        obj = a_slice("n", devices, generation=2, name=name)
        obj["spec"]["pool"]["resourceSliceCount"] = 2
        return obj

    first = trim_slice(piece("a", [gpu(0), gpu(1)]))
    second = trim_slice(piece("b", [gpu(2), gpu(3)]))
    assert current_devices([first]) == []
    assert [d.name for d in current_devices([first, second])] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]


def test_the_claim_watch_queues_only_this_bridges_jobs() -> None:
    cache = ClaimCache("slurm-jobs", "sandbox")

    def claim(namespace: str, cluster: str, job: str) -> dict[str, Any]:
        labels = {
            wellknown.LABEL_MANAGED_BY: wellknown.MANAGER,
            wellknown.LABEL_CLUSTER: cluster,
            wellknown.LABEL_JOB_ID: job,
        }
        return {"metadata": {"namespace": namespace, "name": f"c{job}", "labels": labels}}

    assert cache.apply("ADDED", claim("slurm-jobs", "sandbox", "7")) == {7}
    assert cache.apply("ADDED", claim("slurm-jobs", "other-cluster", "8")) == set()
    assert cache.apply("ADDED", claim("users-ns", "sandbox", "9")) == set()  # a forged label elsewhere
    assert cache.apply("DELETED", claim("slurm-jobs", "sandbox", "7")) == {7}


def test_doctor_warns_of_gpus_slurm_does_not_count_and_refuses_them_by_bus_order() -> None:
    six = [trim_slice(a_slice("kreal1", [gpu(n, pciBusID=f"0000:0{n}:00.0") for n in range(6)]))]
    nodes = {"kreal1": ("gpu:4", ["dra"])}
    problems, notes = gpu_problems({"dra": DRA}, nodes, six)
    assert problems == [] and notes[0].startswith("warning: partition dra: node kreal1 publishes 6 GPU(s)")
    by_bus = PartitionConfig(gpu_mode="dra", dra_driver=DRIVER, dra_device_identity="pciBusID")
    problems, _ = gpu_problems({"dra": by_bus}, nodes, six)
    assert problems == [
        "partition dra: node kreal1 publishes 6 GPU(s) of gpu.example.com named by pciBusID, "
        "Slurm counts 4: positions by bus id would name GPUs other than Slurm's"
    ]
