"""MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1) (issue 18, the DDP idiom):
every pod of a multi-node job resolves the first Slurm node's name to the first pod. The first pod
is that host; the others are created once it has an address, with the name as a host alias of it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from bridge.clients.kube.cache import PodCache
from bridge.controller.metrics import Metrics
from bridge.controller.reconcile import Reconciler
from bridge.core.config import PartitionConfig
from bridge.core.directives import parse_directives
from bridge.core.model import NodeAllocation
from bridge.core.rendezvous import pods_to_create
from bridge.core.translate import desired_objects

from .builders import allocation, config, payload
from .test_reconcile_acts_on_both_views import FakeKube, FakeSlurm, _attach, _pod, _see

ON = PartitionConfig(default_image="img:1")


def _manifests(part: PartitionConfig = ON, nodes: int = 2) -> tuple[Any, list[dict[str, Any]]]:
    alloc = allocation()
    alloc = replace(alloc, nodes=tuple(NodeAllocation(name=f"kube{i + 1}", cpus=2, memory_mb=1024)
                                       for i in range(nodes)))
    made = payload()
    _, pods = desired_objects(alloc, made, parse_directives(made.script), part,
                              config(partitions={"k8s": part}))
    return alloc, pods


def _env(manifest: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in manifest["spec"]["containers"][0]["env"]}


def test_the_first_pod_goes_alone_until_it_has_an_address() -> None:
    alloc, pods = _manifests()
    assert [p["metadata"]["name"] for p in pods_to_create(pods, alloc, ON, "")] == ["slurm-42-0"]


def test_the_others_then_resolve_the_first_nodes_name_to_it() -> None:
    alloc, pods = _manifests(nodes=3)
    made = pods_to_create(pods, alloc, ON, "10.244.1.7")
    assert [p["metadata"]["name"] for p in made] == ["slurm-42-0", "slurm-42-1", "slurm-42-2"]
    assert "hostAliases" not in made[0]["spec"]  # it is that host: its own hostname
    assert made[0]["spec"]["hostname"] == "kube1"
    for later in made[1:]:
        assert later["spec"]["hostAliases"] == [{"ip": "10.244.1.7", "hostnames": ["kube1"]}]
    assert "hostAliases" not in pods[1]["spec"], "the desired manifests are not changed"


def test_the_first_node_is_found_by_its_slurm_name_not_by_a_variable_of_the_bridges() -> None:
    """`MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)` is the script's
    own, as natively: the pods resolve that name, and set no MASTER_ADDR of their own."""
    _, pods = _manifests()
    assert [p["spec"]["hostname"] for p in pods] == ["kube1", "kube2"]
    assert all("MASTER_ADDR" not in _env(p) for p in pods)


@pytest.mark.parametrize(("part", "nodes"), [
    (ON, 1),  # one pod: nothing to wait for
    (replace(ON, host_network=True), 2),  # the nodes' own names resolve
    (replace(ON, resolve_first_node=False), 2),  # the site turned it off
])
def test_all_pods_at_once_where_there_is_nothing_to_resolve(part: PartitionConfig, nodes: int) -> None:
    alloc, pods = _manifests(part, nodes)
    made = pods_to_create(pods, alloc, part, "")
    assert made == pods
    assert all("hostAliases" not in p["spec"] for p in made)


def test_a_first_pod_that_ended_without_an_address_keeps_no_one_waiting() -> None:
    alloc, pods = _manifests()
    assert pods_to_create(pods, alloc, ON, "", first_pod_ended=True) == pods


def test_a_simulated_partition_starts_all_at_once() -> None:
    part = replace(ON, simulated=True)
    alloc, pods = _manifests(part)
    assert pods_to_create(pods, alloc, part, "") == pods


def test_a_first_node_name_that_is_no_hostname_starts_all_at_once() -> None:
    alloc, pods = _manifests()
    alloc = replace(alloc, nodes=(replace(alloc.nodes[0], name="Node_1"), alloc.nodes[1]))
    assert pods_to_create(pods, alloc, ON, "") == pods


async def test_reconcile_makes_the_others_once_the_watch_shows_the_first_pods_address() -> None:
    cache = PodCache()
    kube, slurm = FakeKube(cache), FakeSlurm()
    reconciler = Reconciler(config(partitions={"k8s": ON}), slurm, kube, cache, Metrics(),  # type: ignore[arg-type]
                            lambda _key: None)
    _see(reconciler, allocation())
    _attach(reconciler)

    await reconciler.reconcile(42)
    assert [m["metadata"]["name"] for m in kube.created] == ["slurm-42-0"]
    first = kube.created[0]
    cache.apply("ADDED", _pod(first, phase="Pending"))
    await reconciler.reconcile(42)
    assert len(kube.created) == 1, "nothing more before the first pod has an address"

    cache.apply("MODIFIED", _pod(first, phase="Pending", podIP="10.244.1.7"))
    await reconciler.reconcile(42)
    assert [m["metadata"]["name"] for m in kube.created] == ["slurm-42-0", "slurm-42-1"]
    assert kube.created[1]["spec"]["hostAliases"] == [{"ip": "10.244.1.7", "hostnames": ["kube1"]}]
