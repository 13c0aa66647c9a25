"""Kubernetes node health becomes a Slurm node state (bridge.core.nodehealth, pure): the trimmed
view of a Node, Kubernetes' toleration rules, the verdict per node, the Slurm updates that follow
(never over an admin's state), and the SlurmUnavailable condition shown the other way round."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.core import nodehealth, wellknown
from bridge.core.nodehealth import (
    OUT_OF_SERVICE_TAINT,
    REASON_MAX,
    REASON_PREFIX,
    SLURM_CONDITION,
    Health,
    KubeNode,
    NodeUpdate,
    SlurmNode,
    Taint,
    after,
    assess,
    condition_needs_update,
    disagreement,
    kube_node,
    plan_updates,
    slurm_reason,
    tolerated,
    wanted_condition,
)

GRACE = 60.0
OURS = f"{REASON_PREFIX} Kubernetes node kube1 is cordoned"


def node_dict(
    name: str = "kube1",
    *,
    ready: str | None = "True",
    unschedulable: Any = None,
    taints: list[dict[str, Any]] | None = None,
    labels: dict[str, Any] | None = None,
    extra_conditions: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A Node as the API server sends it (with fields the bridge does not keep)."""
    conditions: list[dict[str, Any]] = [
        {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory"},
    ]
    if ready is not None:
        conditions.append({
            "type": "Ready", "status": ready, "reason": "KubeletReady",
            "message": "kubelet is posting ready status",
            "lastHeartbeatTime": "2025-12-01T12:00:00Z",
        })
    conditions += extra_conditions or []
    spec: dict[str, Any] = {"podCIDR": "10.244.1.0/24"}
    if unschedulable is not None:
        spec["unschedulable"] = unschedulable
    if taints is not None:
        spec["taints"] = taints
    return {
        "kind": "Node",
        "metadata": {
            "name": name,
            "resourceVersion": "123",
            "labels": labels if labels is not None else {"kubernetes.io/hostname": name},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": spec,
        "status": {
            "conditions": conditions,
            "images": [{"names": ["registry.k8s.io/pause:3.9"], "sizeBytes": 321}],
            "addresses": [{"type": "InternalIP", "address": "192.168.0.11"}],
        },
    }


def twin(**changes: Any) -> KubeNode:
    base: dict[str, Any] = {"name": "kube1", "ready": "True"}
    return KubeNode(**{**base, **changes})


def slurm(states: set[str] | frozenset[str], reason: str = "", name: str = "kube1") -> SlurmNode:
    return SlurmNode(name, frozenset(states), reason, ("k8s",))


# -- kube_node --------------------------------------------------------------------------------


def test_a_node_dict_is_trimmed_to_what_the_bridge_reads() -> None:
    obj = node_dict(
        unschedulable=True,
        taints=[
            {"key": "gpu", "value": "a100", "effect": "NoSchedule", "timeAdded": "2025-12-01T00:00:00Z"},
            {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
        ],
        labels={"kubernetes.io/hostname": "kube1", "example.org/slurm-node": "n1", "zone": "a"},
        extra_conditions=[
            {"type": SLURM_CONDITION, "status": "True", "reason": "SlurmNodeDrained", "message": "m"},
        ],
    )

    node = kube_node(obj, ["example.org/slurm-node"])

    assert node == KubeNode(
        name="kube1",
        labels={"example.org/slurm-node": "n1"},
        unschedulable=True,
        taints=(Taint("gpu", "a100", "NoSchedule"), Taint("node.kubernetes.io/unreachable", "", "NoExecute")),
        ready="True",
        ready_reason="KubeletReady",
        ready_message="kubelet is posting ready status",
        slurm_condition=("True", "SlurmNodeDrained", "m"),
    )


def test_without_label_keys_every_string_label_is_kept() -> None:
    obj = node_dict(labels={"a": "1", "b": "2", "weird": 3})
    assert kube_node(obj).labels == {"a": "1", "b": "2"}


def test_an_empty_label_key_list_keeps_no_label() -> None:
    assert kube_node(node_dict(labels={"a": "1"}), []).labels == {}


def test_a_node_without_a_ready_condition_reads_as_not_ready_yet() -> None:
    node = kube_node(node_dict(ready=None))
    assert (node.ready, node.ready_reason, node.ready_message, node.slurm_condition) == ("", "", "", None)


@pytest.mark.parametrize("value", ["true", 1, "yes"])
def test_only_a_literal_true_means_cordoned(value: Any) -> None:
    assert kube_node(node_dict(unschedulable=value)).unschedulable is False


def test_unschedulable_true_means_cordoned() -> None:
    assert kube_node(node_dict(unschedulable=True)).unschedulable is True
    assert kube_node(node_dict()).unschedulable is False


def test_odd_and_empty_dicts_give_an_empty_node() -> None:
    odd = {"metadata": {"name": 5, "labels": ["x"]}, "spec": {"taints": "no"}, "status": None}
    assert kube_node(odd) == KubeNode(name="")
    assert kube_node({}) == KubeNode(name="")


def test_a_taint_prints_like_kubectl() -> None:
    assert str(Taint("gpu", "a100", "NoSchedule")) == "gpu=a100:NoSchedule"
    assert str(Taint("gpu", "", "NoExecute")) == "gpu:NoExecute"


# -- tolerated --------------------------------------------------------------------------------

GPU = Taint("gpu", "a100", "NoSchedule")

TOLERATION_CASES: list[tuple[str, list[dict[str, Any]], bool]] = [
    ("no tolerations", [], False),
    ("empty key with Exists matches all", [{"operator": "Exists"}], True),
    ("empty key with Exists respects the effect", [{"operator": "Exists", "effect": "NoExecute"}], False),
    ("empty key with Equal matches nothing", [{"operator": "Equal", "value": "a100"}], False),
    ("key Exists, any value", [{"key": "gpu", "operator": "Exists"}], True),
    ("key Equal, same value", [{"key": "gpu", "operator": "Equal", "value": "a100"}], True),
    ("key Equal, other value", [{"key": "gpu", "operator": "Equal", "value": "h100"}], False),
    ("operator defaults to Equal", [{"key": "gpu", "value": "a100"}], True),
    ("operator defaults to Equal, no value", [{"key": "gpu"}], False),
    ("other key", [{"key": "fpga", "operator": "Exists"}], False),
    ("empty effect matches any effect", [{"key": "gpu", "operator": "Exists", "effect": ""}], True),
    ("same effect", [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}], True),
    ("other effect", [{"key": "gpu", "operator": "Exists", "effect": "NoExecute"}], False),
    (
        "any one toleration suffices",
        [{"key": "fpga", "operator": "Exists"}, {"key": "gpu", "value": "a100", "effect": "NoSchedule"}],
        True,
    ),
]


@pytest.mark.parametrize(
    ("tolerations", "expected"), [c[1:] for c in TOLERATION_CASES], ids=[c[0] for c in TOLERATION_CASES]
)
def test_tolerations_match_taints_by_kubernetes_rules(
    tolerations: list[dict[str, Any]], expected: bool
) -> None:
    assert tolerated(GPU, tolerations) is expected


def test_equal_with_no_value_tolerates_a_taint_without_value() -> None:
    assert tolerated(Taint("dedicated", "", "NoSchedule"), [{"key": "dedicated", "operator": "Equal"}])


# -- assess -----------------------------------------------------------------------------------


def test_no_twin_waits_out_the_grace_then_goes_down() -> None:
    why = "no Kubernetes node kube9"
    assert assess(None, "kube9", not_ready_for_s=None, grace_s=GRACE) == Health("wait", why, GRACE)
    assert assess(None, "kube9", not_ready_for_s=20.0, grace_s=GRACE) == Health("wait", why, 40.0)
    assert assess(None, "kube9", not_ready_for_s=GRACE - 0.5, grace_s=GRACE).verdict == "wait"
    assert assess(None, "kube9", not_ready_for_s=GRACE, grace_s=GRACE) == Health("down", why)
    assert assess(None, "kube9", not_ready_for_s=GRACE * 10, grace_s=GRACE) == Health("down", why)


@pytest.mark.parametrize(("ready", "shown"), [("False", "NotReady"), ("Unknown", "Unknown")])
def test_not_ready_waits_out_the_grace_then_goes_down(ready: str, shown: str) -> None:
    node = twin(ready=ready, ready_reason="NodeStatusUnknown", ready_message="Kubelet stopped posting")
    why = f"Kubernetes node kube1 is {shown} (NodeStatusUnknown: Kubelet stopped posting)"

    assert assess(node, "kube1", not_ready_for_s=20.0, grace_s=GRACE) == Health("wait", why, 40.0)
    assert assess(node, "kube1", not_ready_for_s=GRACE, grace_s=GRACE) == Health("down", f"{why} for 60s")
    assert assess(node, "kube1", not_ready_for_s=75.4, grace_s=GRACE) == Health("down", f"{why} for 75s")


def test_not_ready_without_a_recorded_start_waits_the_whole_grace() -> None:
    health = assess(twin(ready="False"), "kube1", not_ready_for_s=None, grace_s=GRACE)
    assert (health.verdict, health.recheck_in_s) == ("wait", GRACE)


def test_a_node_without_a_ready_condition_yet_waits() -> None:
    health = assess(twin(ready=""), "kube1", not_ready_for_s=1.0, grace_s=GRACE)
    assert health == Health("wait", "Kubernetes node kube1 is not Ready yet", recheck_in_s=59.0)


def test_not_ready_beats_a_cordon() -> None:
    health = assess(twin(ready="False", unschedulable=True), "kube1", not_ready_for_s=100.0, grace_s=GRACE)
    assert health.verdict == "down"


def test_a_cordoned_node_is_drained() -> None:
    assert assess(twin(unschedulable=True), "kube1", not_ready_for_s=None, grace_s=GRACE) == Health(
        "drain", "Kubernetes node kube1 is cordoned"
    )


@pytest.mark.parametrize("effect", ["NoSchedule", "NoExecute"])
def test_an_untolerated_hard_taint_drains(effect: str) -> None:
    node = twin(taints=(Taint("gpu", "broken", effect),))
    assert assess(node, "kube1", not_ready_for_s=None, grace_s=GRACE) == Health(
        "drain", f"Kubernetes node kube1 has taint gpu=broken:{effect}"
    )


IGNORED_TAINTS = [
    Taint(wellknown.TAINT_BRIDGED, "", "NoSchedule"),
    Taint(wellknown.TAINT_BRIDGED, "true", "NoExecute"),
    Taint("node.kubernetes.io/not-ready", "", "NoExecute"),
    Taint("node.kubernetes.io/unreachable", "", "NoExecute"),
    Taint("node.kubernetes.io/unschedulable", "", "NoSchedule"),
    Taint("node.kubernetes.io/memory-pressure", "", "NoSchedule"),
    Taint("node.kubernetes.io/disk-pressure", "", "NoSchedule"),
    Taint("node.kubernetes.io/pid-pressure", "", "NoSchedule"),
    Taint("node.kubernetes.io/network-unavailable", "", "NoSchedule"),
    Taint("node.kubernetes.io/some-future-condition", "x", "NoExecute"),
    Taint("gpu", "broken", "PreferNoSchedule"),
]


@pytest.mark.parametrize("taint", IGNORED_TAINTS, ids=str)
def test_taints_the_bridge_ignores_leave_the_node_ok(taint: Taint) -> None:
    node = twin(taints=(taint,))
    assert assess(node, "kube1", not_ready_for_s=None, grace_s=GRACE) == Health("ok")


@pytest.mark.parametrize(
    "key", ["node.kubernetes.io", "node.kubernetes.io.example.org/x", "example.org/node.kubernetes.io/x"]
)
def test_only_the_kubernetes_condition_prefix_is_ignored(key: str) -> None:
    node = twin(taints=(Taint(key, "", "NoSchedule"),))
    assert assess(node, "kube1", not_ready_for_s=None, grace_s=GRACE).verdict == "drain"


@pytest.mark.parametrize("effect", ["NoExecute", "NoSchedule"])
def test_the_out_of_service_taint_means_down_at_once(effect: str) -> None:
    why = f"Kubernetes node kube1 is out of service ({OUT_OF_SERVICE_TAINT})"
    for node in (
        twin(taints=(Taint(OUT_OF_SERVICE_TAINT, "nodeshutdown", effect),)),
        twin(unschedulable=True,
             taints=(Taint("gpu", "", "NoSchedule"), Taint(OUT_OF_SERVICE_TAINT, "", effect))),
    ):
        assert assess(node, "kube1", not_ready_for_s=None, grace_s=GRACE) == Health("down", why)


def test_the_out_of_service_taint_is_not_tolerated_away() -> None:
    node = twin(taints=(Taint(OUT_OF_SERVICE_TAINT, "nodeshutdown", "NoExecute"),))
    health = assess(node, "kube1", not_ready_for_s=None, grace_s=GRACE, tolerations=[{"operator": "Exists"}])
    assert health.verdict == "down"


def test_a_taint_the_partition_tolerates_leaves_the_node_ok() -> None:
    node = twin(taints=(Taint("gpu", "a100", "NoSchedule"),))
    tolerations = [{"key": "gpu", "operator": "Equal", "value": "a100", "effect": "NoSchedule"}]
    assert assess(node, "kube1", not_ready_for_s=None, grace_s=GRACE, tolerations=tolerations) == Health("ok")
    other = [{"key": "gpu", "operator": "Equal", "value": "h100"}]
    assert assess(node, "kube1", not_ready_for_s=None, grace_s=GRACE, tolerations=other).verdict == "drain"


def test_one_untolerated_taint_among_tolerated_ones_drains() -> None:
    node = twin(taints=(Taint(wellknown.TAINT_BRIDGED, "", "NoSchedule"), Taint("gpu", "", "NoSchedule"),
                        Taint("maint", "", "NoExecute")))
    health = assess(node, "kube1", not_ready_for_s=None, grace_s=GRACE,
                    tolerations=[{"key": "gpu", "operator": "Exists"}])
    assert health == Health("drain", "Kubernetes node kube1 has taint maint:NoExecute")


def test_a_ready_untainted_node_is_ok() -> None:
    assert assess(twin(), "kube1", not_ready_for_s=None, grace_s=GRACE) == Health("ok")


# -- plan_updates -----------------------------------------------------------------------------

DOWN = Health("down", "no Kubernetes node kube1")
DRAIN = Health("drain", "Kubernetes node kube1 is cordoned")
OK = Health("ok")
WAIT = Health("wait", "Kubernetes node kube1 is NotReady", recheck_in_s=10.0)


@pytest.mark.parametrize("health", [DOWN, DRAIN, OK, WAIT], ids=lambda h: h.verdict)
@pytest.mark.parametrize(
    "states", [{"DOWN"}, {"IDLE", "DRAIN"}, {"ALLOCATED", "DRAIN"}, {"FAIL"}, {"DOWN", "NOT_RESPONDING"}],
    ids=lambda states: "+".join(sorted(states)),
)
@pytest.mark.parametrize("reason", ["maintenance", "", "Not responding", "slurm-k8s-bridge no colon"])
@pytest.mark.parametrize("drain_with_down", [False, True], ids=["down alone", "drain with down"])
def test_an_admins_state_is_never_overridden(
    health: Health, states: set[str], reason: str, drain_with_down: bool
) -> None:
    assert plan_updates(slurm(states, reason), health, drain_with_down=drain_with_down) == []


NOT_MANAGED = ["FUTURE", "CLOUD", "POWERED_DOWN", "POWERING_DOWN", "POWERING_UP", "POWER_DOWN",
               "REBOOT_REQUESTED", "REBOOT_ISSUED"]


@pytest.mark.parametrize("flag", NOT_MANAGED)
@pytest.mark.parametrize("health", [DOWN, DRAIN, OK], ids=lambda h: h.verdict)
@pytest.mark.parametrize(
    ("base", "reason"), [({"IDLE"}, ""), ({"DOWN"}, OURS), ({"IDLE", "DRAIN"}, OURS)],
    ids=["in service", "bridge down", "bridge drain"],
)
@pytest.mark.parametrize("drain_with_down", [False, True], ids=["down alone", "drain with down"])
def test_power_saving_future_and_rebooting_nodes_are_left_to_slurm(
    flag: str, health: Health, base: set[str], reason: str, drain_with_down: bool
) -> None:
    node = slurm(base | {flag}, reason)
    assert plan_updates(node, health, drain_with_down=drain_with_down) == []
    assert disagreement(node, health) is None


def test_the_same_node_without_such_a_state_is_managed() -> None:
    assert plan_updates(slurm({"IDLE"}), DOWN) != []
    assert plan_updates(slurm({"DOWN"}, OURS), OK) != []
    assert plan_updates(slurm({"ALLOCATED", "COMPLETING"}), DOWN) != []  # only the listed states


def test_wait_changes_nothing_whatever_the_state() -> None:
    for node in (slurm({"IDLE"}), slurm({"DOWN"}, OURS), slurm({"IDLE", "DRAIN"}, OURS)):
        assert plan_updates(node, WAIT) == []
        assert disagreement(node, WAIT) is None


def test_the_bridges_own_drain_is_resumed_once_healthy() -> None:
    assert plan_updates(slurm({"IDLE", "DRAIN"}, OURS), OK) == [NodeUpdate("kube1", "RESUME")]
    assert plan_updates(slurm({"DOWN"}, OURS), OK) == [NodeUpdate("kube1", "RESUME")]


def test_a_healthy_node_in_service_needs_nothing() -> None:
    assert plan_updates(slurm({"IDLE"}), OK) == []
    assert plan_updates(slurm({"MIXED"}, OURS), OK) == []


def test_a_node_in_service_is_downed_or_drained_with_a_prefixed_reason() -> None:
    assert plan_updates(slurm({"IDLE"}), DOWN) == [
        NodeUpdate("kube1", "DOWN", f"{REASON_PREFIX} no Kubernetes node kube1")
    ]
    assert plan_updates(slurm({"ALLOCATED"}), DRAIN) == [
        NodeUpdate("kube1", "DRAIN", f"{REASON_PREFIX} Kubernetes node kube1 is cordoned")
    ]


def test_the_bridges_own_down_with_a_drain_verdict_is_resumed_then_drained() -> None:
    assert plan_updates(slurm({"DOWN"}, OURS), DRAIN) == [
        NodeUpdate("kube1", "RESUME"),
        NodeUpdate("kube1", "DRAIN", f"{REASON_PREFIX} Kubernetes node kube1 is cordoned"),
    ]


def test_the_bridges_own_drain_is_downed_when_the_node_dies() -> None:
    assert plan_updates(slurm({"IDLE", "DRAIN"}, OURS), DOWN) == [
        NodeUpdate("kube1", "DOWN", f"{REASON_PREFIX} no Kubernetes node kube1")
    ]


def test_what_the_bridge_already_set_is_not_sent_again() -> None:
    assert plan_updates(slurm({"DOWN"}, OURS), DOWN) == []
    assert plan_updates(slurm({"IDLE", "DRAIN"}, OURS), DRAIN) == []


DOWN_REASON = f"{REASON_PREFIX} no Kubernetes node kube1"


@pytest.mark.parametrize(
    "node",
    [slurm({"IDLE"}), slurm({"ALLOCATED"}), slurm({"DOWN"}, OURS), slurm({"DOWN", "NOT_RESPONDING"}, OURS)],
    ids=["idle", "allocated", "bridge down", "bridge down, not responding"],
)
def test_drain_with_down_drains_first_then_downs(node: SlurmNode) -> None:
    assert plan_updates(node, DOWN, drain_with_down=True) == [
        NodeUpdate("kube1", "DRAIN", DOWN_REASON), NodeUpdate("kube1", "DOWN", DOWN_REASON),
    ]


@pytest.mark.parametrize(
    "states", [{"IDLE", "DRAIN"}, {"ALLOCATED", "DRAIN"}, {"DOWN", "DRAIN"}],
    ids=lambda states: "+".join(sorted(states)),
)
def test_drain_with_down_sends_nothing_to_a_node_with_the_bridges_drain(states: set[str]) -> None:
    # Each registration lifts DOWN and leaves DRAIN: downing it again would loop for ever.
    assert plan_updates(slurm(states, DOWN_REASON), DOWN, drain_with_down=True, downed=True) == []


def test_a_node_the_bridge_drained_for_a_cordon_is_still_downed_when_it_dies() -> None:
    """Found in review: with drain_with_down the bridge's own DRAIN (for a cordon) must not stand
    for a DOWN that never happened, or the jobs on a dead node would never end."""
    cordoned = slurm({"ALLOCATED", "DRAIN"}, f"{REASON_PREFIX} Kubernetes node kube1 is cordoned")
    assert plan_updates(cordoned, DOWN, drain_with_down=True, downed=False) == [
        NodeUpdate("kube1", "DOWN", DOWN_REASON),
    ]


def test_drain_with_down_changes_nothing_for_other_verdicts() -> None:
    for node in (slurm({"IDLE"}), slurm({"DOWN"}, OURS), slurm({"IDLE", "DRAIN"}, OURS)):
        for health in (DRAIN, OK, WAIT):
            assert plan_updates(node, health, drain_with_down=True) == plan_updates(node, health)


# -- slurm_reason -------------------------------------------------------------------------------


def test_a_reason_is_the_prefix_then_the_text() -> None:
    assert slurm_reason("no Kubernetes node kube1") == f"{REASON_PREFIX} no Kubernetes node kube1"


def test_a_reason_is_put_on_one_printable_line() -> None:
    assert slurm_reason("a\nb\r\nc\td\x00e\x1bf\u2028g") == f"{REASON_PREFIX} a b  c d e f g"
    assert slurm_reason("Knoten kaputt: Lüfter") == f"{REASON_PREFIX} Knoten kaputt: Lüfter"


def test_a_reason_that_fits_is_not_cut() -> None:
    why = "x" * (REASON_MAX - len(REASON_PREFIX) - 1)
    assert slurm_reason(why) == f"{REASON_PREFIX} {why}"
    assert len(slurm_reason(why)) == REASON_MAX


def test_a_long_reason_is_cut_to_the_maximum_with_an_ellipsis() -> None:
    why = "y" * (REASON_MAX - len(REASON_PREFIX))  # one character too many
    text = slurm_reason(why)
    assert len(text) == REASON_MAX == 200
    assert text == f"{REASON_PREFIX} " + "y" * (REASON_MAX - len(REASON_PREFIX) - 4) + "..."
    huge = slurm_reason("line\n" * 1000)
    assert len(huge) == REASON_MAX
    assert huge.startswith(f"{REASON_PREFIX} line line")
    assert huge.endswith("...")
    assert huge.isprintable()


def test_the_planned_updates_carry_the_cut_reason() -> None:
    why = "Kubernetes node kube1 is NotReady (KubeletNotReady: " + "container runtime down\n" * 20 + ")"
    (update,) = plan_updates(slurm({"IDLE"}), Health("down", why))
    assert update.reason == slurm_reason(why)
    assert len(update.reason) <= REASON_MAX
    assert "\n" not in update.reason
    node = after(slurm({"IDLE"}), [update])
    assert node.set_by_bridge  # the cut reason still marks the bridge's own state
    assert plan_updates(node, Health("down", why)) == []


# -- after ------------------------------------------------------------------------------------


def test_after_a_drain_the_node_is_out_by_the_bridge() -> None:
    updates = plan_updates(slurm({"IDLE"}), DRAIN)
    node = after(slurm({"IDLE"}), updates)
    assert (node.states, node.reason, node.out, node.set_by_bridge) == (
        frozenset({"IDLE", "DRAIN"}), updates[0].reason, True, True,
    )
    assert plan_updates(node, DRAIN) == []
    assert node.partitions == ("k8s",)


def test_after_a_resume_the_node_is_back_in_service_without_a_reason() -> None:
    node = after(slurm({"DOWN", "NOT_RESPONDING"}, OURS), [NodeUpdate("kube1", "RESUME")])
    assert (node.states, node.reason, node.out) == (frozenset({"IDLE", "NOT_RESPONDING"}), "", False)
    busy = after(slurm({"MIXED", "DRAIN"}, OURS), [NodeUpdate("kube1", "RESUME")])
    assert busy.states == frozenset({"MIXED"})


def test_after_resume_then_drain_the_node_is_drained_not_down() -> None:
    updates = plan_updates(slurm({"DOWN"}, OURS), DRAIN)
    node = after(slurm({"DOWN"}, OURS), updates)
    assert "DOWN" not in node.states
    assert "DRAIN" in node.states
    assert node.reason == f"{REASON_PREFIX} Kubernetes node kube1 is cordoned"
    assert plan_updates(node, DRAIN) == []


def test_after_nothing_the_node_is_unchanged() -> None:
    node = slurm({"IDLE", "DRAIN"}, "maintenance")
    assert after(node, []) == node


# -- the SlurmUnavailable condition --------------------------------------------------------------


def test_an_admins_drain_is_wanted_as_a_true_condition() -> None:
    assert wanted_condition(slurm({"IDLE", "DRAIN"}, "disk swap")) == (
        "True", "SlurmNodeDrained", "Slurm node kube1 is DRAIN: disk swap",
    )
    assert wanted_condition(slurm({"DOWN", "DRAIN"}, "")) == (
        "True", "SlurmNodeDown", "Slurm node kube1 is DOWN: no reason given",
    )
    assert wanted_condition(slurm({"FAIL"}, "bad dimm")) == (
        "True", "SlurmNodeFailed", "Slurm node kube1 is FAIL: bad dimm",
    )


def test_an_admins_reason_is_shown_on_one_line_and_cut() -> None:
    status, reason, message = wanted_condition(slurm({"IDLE", "DRAIN"}, "swap\ndisk\t3\x00"))
    assert (status, reason) == ("True", "SlurmNodeDrained")
    assert message == "Slurm node kube1 is DRAIN: swap disk 3 "
    long = "z" * 1000
    message = wanted_condition(slurm({"DOWN"}, long))[2]
    head = "Slurm node kube1 is DOWN: "
    assert message.startswith(head + "z" * 100)
    assert len(message) <= len(head) + REASON_MAX
    assert wanted_condition(slurm({"DOWN"}, "\n" * 5))[2].isprintable()


@pytest.mark.parametrize(
    "node", [None, slurm({"IDLE"}), slurm({"DOWN"}, OURS), slurm({"IDLE", "DRAIN"}, OURS)],
    ids=["no slurm node", "in service", "bridge down", "bridge drain"],
)
def test_nodes_in_service_or_out_by_the_bridge_want_a_false_condition(node: SlurmNode | None) -> None:
    assert wanted_condition(node) == ("False", "SlurmNodeAvailable", "")


def test_a_twin_without_the_condition_gets_it_only_once_it_says_true() -> None:
    bare = twin()
    assert condition_needs_update(bare, ("True", "SlurmNodeDrained", "x")) is True
    assert condition_needs_update(bare, ("False", "SlurmNodeAvailable", "")) is False


def test_a_twin_with_the_condition_is_updated_only_when_it_differs() -> None:
    drained = ("True", "SlurmNodeDrained", "Slurm node kube1 is DRAIN: a")
    shown = twin(slurm_condition=drained)
    assert condition_needs_update(shown, drained) is False
    assert condition_needs_update(shown, ("True", "SlurmNodeDrained", "Slurm node kube1 is DRAIN: b")) is True
    assert condition_needs_update(shown, ("False", "SlurmNodeAvailable", "")) is True


def test_the_condition_read_back_from_a_node_dict_stops_further_updates() -> None:
    wanted = wanted_condition(slurm({"IDLE", "DRAIN"}, "disk swap"))
    status, reason, message = wanted
    cond = {"type": SLURM_CONDITION, "status": status, "reason": reason, "message": message}
    assert condition_needs_update(kube_node(node_dict(extra_conditions=[cond])), wanted) is False


# -- disagreement (doctor) ----------------------------------------------------------------------


def test_agreement_and_an_admins_state_are_no_disagreement() -> None:
    assert disagreement(slurm({"IDLE"}), OK) is None
    assert disagreement(slurm({"DOWN"}, OURS), DOWN) is None
    assert disagreement(slurm({"IDLE", "DRAIN"}, "maintenance"), DOWN) is None


def test_a_node_the_bridge_would_resume_is_reported() -> None:
    assert disagreement(slurm({"IDLE", "DRAIN"}, OURS), OK) == (
        f"kube1: Slurm DRAIN+IDLE ({OURS}) but its Kubernetes node is healthy"
    )


def test_a_node_the_bridge_would_take_out_is_reported() -> None:
    assert disagreement(slurm({"IDLE"}), DOWN) == (
        "kube1: Slurm IDLE but no Kubernetes node kube1 (the bridge would set DOWN)"
    )
    assert disagreement(slurm({"DOWN"}, OURS), DRAIN) == (
        "kube1: Slurm DOWN but Kubernetes node kube1 is cordoned (the bridge would set DRAIN)"
    )


def test_a_node_without_states_shows_a_question_mark() -> None:
    assert disagreement(slurm(set()), DOWN) == (
        "kube1: Slurm ? but no Kubernetes node kube1 (the bridge would set DOWN)"
    )


def test_the_reason_prefix_is_what_marks_the_bridges_own_state() -> None:
    assert slurm({"DOWN"}, f"{REASON_PREFIX}x").set_by_bridge
    assert not slurm({"DOWN"}, f"admin: {REASON_PREFIX}").set_by_bridge
    assert nodehealth.REASON_PREFIX == "slurm-k8s-bridge:"


def test_a_noexecute_toleration_with_toleration_seconds_only_delays_eviction_so_the_node_drains() -> None:
    taint = Taint("maint", "", "NoExecute")
    for_a_while = {"key": "maint", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60}
    for_good = {"key": "maint", "operator": "Exists", "effect": "NoExecute"}

    assert not tolerated(taint, [for_a_while])
    assert tolerated(taint, [for_good])
    twin = KubeNode("kube1", ready="True", taints=(taint,))
    health = assess(twin, "kube1", not_ready_for_s=None, grace_s=60, tolerations=[for_a_while])
    assert health.verdict == "drain"
