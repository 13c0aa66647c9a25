"""doctor flags the Slurm configurations that would bring a user's script to a bridged slurmd
unwrapped: a bridged node in a non-bridged partition, an Alternate across the boundary."""

from __future__ import annotations

from bridge.manager.doctor import partition_boundary_problems

NODES = {"native": ["n1", "n2"], "k8s": ["kreal1", "kreal2"], "sim": ["ksim1"]}


def test_separate_partitions_pass() -> None:
    assert partition_boundary_problems(NODES, {"k8s": "sim"}, {"k8s", "sim"}) == []


def test_a_bridged_node_in_a_plain_partition_is_named() -> None:
    nodes = {**NODES, "all": ["n1", "kreal2", "ksim1"]}
    (problem,) = partition_boundary_problems(nodes, {}, {"k8s", "sim"})
    assert problem.startswith("partition all is not bridged but holds bridged node(s) kreal2,ksim1")


def test_an_alternate_across_the_boundary_is_named() -> None:
    problems = partition_boundary_problems(NODES, {"native": "k8s", "sim": "native"}, {"k8s", "sim"})
    assert [p.split(":")[0] for p in problems] == [
        "partition native has Alternate=k8s across the bridged/non-bridged line",
        "partition sim has Alternate=native across the bridged/non-bridged line",
    ]
