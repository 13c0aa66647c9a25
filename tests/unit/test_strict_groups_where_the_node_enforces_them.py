"""supplementalGroupsPolicy `auto` (the default): Strict on the nodes that report they enforce it,
so an image's /etc/group can add no groups there, and unset elsewhere (a kubelet whose runtime
cannot enforce Strict refuses such a pod: SupplementalGroupsPolicyNotSupported)."""

from __future__ import annotations

from typing import Any

from bridge.clients.kube.node_features import StrictGroupsNodes
from bridge.core.config import PodsConfig
from bridge.core.directives import Directives
from bridge.core.errors import KubeUnavailable
from bridge.core.model import NodeAllocation
from bridge.core.translate import desired_pods

from .builders import allocation, config, payload

TWO_NODES = allocation(nodes=(NodeAllocation("kube1", cpus=2, memory_mb=1024, gpu_indices=()),
                              NodeAllocation("kube2", cpus=2, memory_mb=1024, gpu_indices=())))


def _policies(policy: str, strict: set[str]) -> list[str | None]:
    cfg = config(pods=PodsConfig(supplemental_groups_policy=policy))
    pods = desired_pods(TWO_NODES, payload(), Directives(image="i"), cfg.partitions["k8s"], cfg,
                        strict_groups_nodes=strict)
    return [pod["spec"]["securityContext"].get("supplementalGroupsPolicy") for pod in pods]


def test_auto_is_strict_exactly_on_the_nodes_that_enforce_it() -> None:
    assert _policies("auto", {"kube2"}) == [None, "Strict"]
    assert _policies("auto", set()) == [None, None]


def test_a_configured_policy_applies_everywhere() -> None:
    assert _policies("Strict", set()) == ["Strict", "Strict"]
    assert _policies("", {"kube1"}) == [None, None]


async def test_nodes_are_asked_once_per_ttl_and_an_unreadable_one_is_not_strict() -> None:
    asked: list[str] = []

    async def get_node(name: str) -> dict[str, Any]:
        asked.append(name)
        if name == "down":
            raise KubeUnavailable("API server down")
        return {"status": {"features": {"supplementalGroupsPolicy": name == "new"}}}

    nodes = StrictGroupsNodes(get_node, ttl_s=60)
    assert await nodes.among(["new", "old", "new", "down"]) == {"new"}
    assert await nodes.among(["new", "old"]) == {"new"}
    assert asked == ["new", "old", "down"], "cached per node; the unreadable one asked again next time"
    assert await nodes.among(["down"]) == set()
    assert asked[-1] == "down"
