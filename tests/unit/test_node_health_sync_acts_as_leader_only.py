"""NodeHealthSync against in-memory Slurm and Kubernetes (the real NodeCache and WorkQueue): what
it writes to Slurm and to the Kubernetes node for each twin state, that it writes nothing unless
it leads, that it never sends the same update twice, and when a node counts as dead."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import pytest

from bridge.clients.kube.nodes import NodeCache
from bridge.controller import nodesync
from bridge.controller.metrics import Metrics
from bridge.controller.nodesync import NodeHealthSync
from bridge.controller.workqueue import WorkQueue
from bridge.core.config import BridgeConfig, parse_config
from bridge.core.errors import SlurmAuthError, TemporaryError
from bridge.core.nodehealth import OUT_OF_SERVICE_TAINT, REASON_PREFIX, SLURM_CONDITION, SlurmNode

GRACE = 60.0
MAPPED_BY = "example.org/slurm-node"

CONFIG = f"""
cluster = "c1"
[slurm]
url = "http://127.0.0.1:6820"
[nodes]
not_ready_grace_s = {GRACE}
poll_interval_s = 0.5
[partitions.k8s]
tolerations = [{{key = "gpu", operator = "Exists", effect = "NoSchedule"}}]
[partitions.mapped]
node_label = "{MAPPED_BY}"
"""


class Clock:
    """Stands in for the `time` module inside bridge.controller.nodesync (the event loop keeps
    its own clock)."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now


class FakeSlurm:
    """slurmctld in memory: `current` is its view of now (what node() answers, and what updates
    change); `nodes` is what the next poll answers, which may lag behind it."""

    def __init__(self, log: list[tuple[Any, ...]]) -> None:
        self.nodes: list[SlurmNode] | None = []
        """What the next changed_nodes() answers (None: nothing changed)."""
        self.current: dict[str, SlurmNode] = {}
        """What node() answers now (a name missing: slurmctld does not know it)."""
        self.asked: list[list[str]] = []
        self.reads: list[str] = []
        self.after_update: Callable[[], None] | None = None
        self.log = log

    async def changed_nodes(self, partitions: Collection[str]) -> list[SlurmNode] | None:
        self.asked.append(sorted(partitions))
        return None if self.nodes is None else list(self.nodes)

    async def node(self, name: str) -> SlurmNode | None:
        self.reads.append(name)
        return self.current.get(name)

    async def update_node(self, name: str, state: str, reason: str = "") -> None:
        self.log.append(("update", name, state, reason))
        node = self.current.get(name)
        if node is not None:
            states = set(node.states)
            if state == "RESUME":
                states -= {"DOWN", "DRAIN", "FAIL"}
                states |= set() if states & {"IDLE", "ALLOCATED", "MIXED"} else {"IDLE"}
                reason = ""
            elif state == "DOWN":
                states = (states - {"IDLE", "ALLOCATED", "MIXED"}) | {"DOWN"}
            else:
                states.add(state)
            self.current[name] = SlurmNode(name, frozenset(states), reason, node.partitions)
        if self.after_update is not None:
            self.after_update()

    @property
    def updates(self) -> list[tuple[str, str, str]]:
        return [(entry[1], entry[2], entry[3]) for entry in self.log if entry[0] == "update"]


class FakeKube:
    def __init__(self) -> None:
        self.conditions: list[tuple[str, str, str, str, str]] = []

    async def set_node_condition(
        self, name: str, condition_type: str, status: str, reason: str, message: str
    ) -> None:
        self.conditions.append((name, condition_type, status, reason, message))


@dataclass
class World:
    sync: NodeHealthSync
    slurm: FakeSlurm
    kube: FakeKube
    cache: NodeCache
    clock: Clock
    log: list[tuple[Any, ...]]
    leading: list[bool] = field(default_factory=lambda: [True])
    told: int = 1
    """What announce() answers: how many jobs it told."""


def make_world(monkeypatch: pytest.MonkeyPatch, config_text: str = CONFIG) -> World:
    cfg: BridgeConfig = parse_config(config_text)
    clock = Clock()
    monkeypatch.setattr(nodesync, "time", clock)
    monkeypatch.setattr(nodesync, "ANNOUNCE_LEAD_S", 0.0)
    log: list[tuple[Any, ...]] = []
    slurm, kube = FakeSlurm(log), FakeKube()
    cache = NodeCache(p.node_label for p in cfg.partitions.values() if p.node_label)
    holder: dict[str, World] = {}

    def announce(node: str, text: str) -> int:
        log.append(("announce", node, text))
        return holder["world"].told

    sync = NodeHealthSync(
        cfg, slurm, kube, cache, Metrics(),  # type: ignore[arg-type]
        leading=lambda: holder["world"].leading[0], announce=announce,
    )
    world = World(sync, slurm, kube, cache, clock, log)
    holder["world"] = world
    return world


def kube_dict(
    name: str,
    *,
    ready: str = "True",
    unschedulable: bool = False,
    taints: list[dict[str, Any]] | None = None,
    slurm_name: str | None = None,
    condition: tuple[str, str, str] | None = None,
) -> dict[str, Any]:
    conditions: list[dict[str, Any]] = [
        {"type": "Ready", "status": ready, "lastHeartbeatTime": "2025-12-01T12:00:00Z",
         "reason": "KubeletReady" if ready == "True" else "NodeStatusUnknown"},
    ]
    if condition is not None:
        status, reason, message = condition
        conditions.append({"type": SLURM_CONDITION, "status": status, "reason": reason, "message": message})
    return {
        "metadata": {"name": name, "labels": {MAPPED_BY: slurm_name} if slurm_name else {}},
        "spec": {"unschedulable": unschedulable, "taints": taints or []},
        "status": {"conditions": conditions, "images": []},
    }


def slurm_node(name: str = "kube1", states: tuple[str, ...] = ("IDLE",), reason: str = "",
               partition: str = "k8s") -> SlurmNode:
    return SlurmNode(name, frozenset(states), reason, (partition,))


def see_kube(world: World, event: str, obj: dict[str, Any]) -> None:
    """A watch event as the ListWatcher delivers it: into the cache, then the callback."""
    for name in world.cache.apply(event, obj):
        world.sync.on_kube_node_changed(name)


def list_kube(world: World, *objs: dict[str, Any]) -> None:
    """A full list as the ListWatcher delivers it."""
    for name in sorted(world.cache.replace_all([world.cache.trim(obj) for obj in objs])):
        world.sync.on_kube_node_changed(name)


async def see_slurm(world: World, *nodes: SlurmNode) -> None:
    """slurmctld holds `nodes`, and the poll says so."""
    world.slurm.current.update({node.name: node for node in nodes})
    await poll_only(world, *nodes)


async def poll_only(world: World, *nodes: SlurmNode) -> None:
    """The poll answers `nodes`, whatever slurmctld holds now (a view that may be stale)."""
    world.slurm.nodes = list(nodes)
    await world.sync.poll_once()


def take_queued(queue: WorkQueue) -> set[Any]:
    """Empty the queue (no worker runs in these tests) and say what was in it."""
    keys: set[Any] = set()
    while not queue._queue.empty():
        key = queue._queue.get_nowait()
        queue._queued.discard(key)
        keys.add(key)
    return keys


def cancel_delayed(queue: WorkQueue) -> None:
    for timer in queue._delayed.values():
        timer.cancel()
    queue._delayed.clear()


# -- draining, and not twice ------------------------------------------------------------------


async def test_a_cordoned_twin_drains_its_slurm_node(monkeypatch: pytest.MonkeyPatch) -> None:
    world = make_world(monkeypatch)
    list_kube(world, kube_dict("kube1", unschedulable=True))
    await see_slurm(world, slurm_node("kube1"))

    await world.sync.sync("kube1")

    assert world.slurm.updates == [
        ("kube1", "DRAIN", f"{REASON_PREFIX} Kubernetes node kube1 is cordoned"),
    ]
    assert world.kube.conditions == []
    assert not any(entry[0] == "announce" for entry in world.log)


async def test_a_second_sync_of_a_drained_node_sends_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    world = make_world(monkeypatch)
    list_kube(world, kube_dict("kube1", unschedulable=True))
    await see_slurm(world, slurm_node("kube1"))
    await world.sync.sync("kube1")

    await world.sync.sync("kube1")
    tainted = kube_dict("kube1", unschedulable=True, taints=[{"key": "x", "effect": "NoSchedule"}])
    see_kube(world, "MODIFIED", tainted)
    await world.sync.sync("kube1")

    assert len(world.slurm.updates) == 1
    local = world.sync.slurm_node("kube1")
    assert local is not None
    assert (local.states, local.set_by_bridge) == (frozenset({"IDLE", "DRAIN"}), True)


async def test_once_slurm_confirms_the_drain_nothing_more_is_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    world = make_world(monkeypatch)
    list_kube(world, kube_dict("kube1", unschedulable=True))
    await see_slurm(world, slurm_node("kube1"))
    await world.sync.sync("kube1")
    take_queued(world.sync.queue)
    ((_, _, reason),) = world.slurm.updates

    await see_slurm(world, slurm_node("kube1", ("IDLE", "DRAIN"), reason))
    await world.sync.sync("kube1")

    assert len(world.slurm.updates) == 1


async def test_an_uncordoned_twin_resumes_the_node_the_bridge_drained(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = make_world(monkeypatch)
    list_kube(world, kube_dict("kube1", unschedulable=True))
    await see_slurm(world, slurm_node("kube1"))
    await world.sync.sync("kube1")
    take_queued(world.sync.queue)

    see_kube(world, "MODIFIED", kube_dict("kube1"))
    assert take_queued(world.sync.queue) == {"kube1"}
    await world.sync.sync("kube1")

    assert [state for _, state, _ in world.slurm.updates] == ["DRAIN", "RESUME"]
    assert world.slurm.updates[1] == ("kube1", "RESUME", "")


async def test_a_taint_the_partition_tolerates_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    world = make_world(monkeypatch)
    gpu = [{"key": "gpu", "value": "a100", "effect": "NoSchedule"}]
    list_kube(world, kube_dict("kube1", taints=gpu), kube_dict("kube2", taints=gpu, slurm_name="n2"))
    await see_slurm(world, slurm_node("kube1"), slurm_node("n2", partition="mapped"))

    await world.sync.sync("kube1")
    await world.sync.sync("n2")

    assert world.slurm.updates == [
        ("n2", "DRAIN", f"{REASON_PREFIX} Kubernetes node kube2 has taint gpu=a100:NoSchedule"),
    ]


# -- leading only -----------------------------------------------------------------------------


async def test_a_standby_writes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    world = make_world(monkeypatch)
    world.leading[0] = False
    list_kube(world, kube_dict("kube1", unschedulable=True), kube_dict("kube2"))
    await see_slurm(world, slurm_node("kube1"), slurm_node("kube2", ("IDLE", "DRAIN"), "maintenance"),
                    slurm_node("kube3"))

    for name in ("kube1", "kube2", "kube3"):
        await world.sync.sync(name)

    assert world.log == []
    assert world.kube.conditions == []


async def test_taking_the_lead_acts_on_every_node(monkeypatch: pytest.MonkeyPatch) -> None:
    world = make_world(monkeypatch)
    world.leading[0] = False
    list_kube(world, kube_dict("kube1", unschedulable=True))
    await see_slurm(world, slurm_node("kube1"), slurm_node("kube2"))
    for name in take_queued(world.sync.queue):
        await world.sync.sync(name)
    assert world.slurm.updates == []

    world.leading[0] = True
    world.sync.queue_all()
    try:
        for name in sorted(take_queued(world.sync.queue)):
            await world.sync.sync(name)
        assert [(name, state) for name, state, _ in world.slurm.updates] == [("kube1", "DRAIN")]

        world.clock.now += GRACE  # kube2 has no Kubernetes node: the grace starts with the lead
        await world.sync.sync("kube2")
    finally:
        cancel_delayed(world.sync.queue)

    assert [(name, state) for name, state, _ in world.slurm.updates] == [
        ("kube1", "DRAIN"), ("kube2", "DOWN"),
    ]


async def test_nothing_is_written_while_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    world = make_world(monkeypatch, CONFIG.replace("[nodes]", "[nodes]\nenabled = false"))
    list_kube(world, kube_dict("kube1", unschedulable=True))
    await see_slurm(world, slurm_node("kube1"), slurm_node("kube2"))

    await world.sync.sync("kube1")
    await world.sync.sync("kube2")

    assert world.log == []


async def test_nothing_is_written_before_both_views_are_synced(monkeypatch: pytest.MonkeyPatch) -> None:
    world = make_world(monkeypatch)
    await see_slurm(world, slurm_node("kube1"))
    assert not world.sync.synced

    await world.sync.sync("kube1")  # "no such Kubernetes node" only means "not listed yet"

    assert world.log == []
    list_kube(world)
    assert world.sync.synced


# -- NotReady: the grace, then DOWN -----------------------------------------------------------


async def test_a_not_ready_twin_inside_the_grace_waits_and_is_looked_at_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = make_world(monkeypatch)
    list_kube(world, kube_dict("kube1"))
    await see_slurm(world, slurm_node("kube1"))
    see_kube(world, "MODIFIED", kube_dict("kube1", ready="Unknown"))  # first seen NotReady now
    world.clock.now += 20
    take_queued(world.sync.queue)

    try:
        await world.sync.sync("kube1")

        assert world.log == []
        timer = world.sync.queue._delayed["kube1"]
        in_s = timer.when() - asyncio.get_running_loop().time()
        assert GRACE - 20 < in_s <= GRACE - 20 + 0.05 + 0.01
    finally:
        cancel_delayed(world.sync.queue)


async def test_a_not_ready_twin_past_the_grace_is_announced_then_downed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = make_world(monkeypatch)
    list_kube(world, kube_dict("kube1"))
    await see_slurm(world, slurm_node("kube1", ("ALLOCATED",)))
    see_kube(world, "MODIFIED", kube_dict("kube1", ready="Unknown"))
    try:
        await world.sync.sync("kube1")
    finally:
        cancel_delayed(world.sync.queue)
    assert world.log == []

    world.clock.now += GRACE + 1
    await world.sync.sync("kube1")

    why = "Kubernetes node kube1 is Unknown (NodeStatusUnknown) for 61s"
    assert world.log == [
        ("announce", "kube1", f"node kube1 is going down: {why}"),
        ("update", "kube1", "DOWN", f"{REASON_PREFIX} {why}"),
    ]
    assert world.sync.queue._delayed == {}

    await world.sync.sync("kube1")
    assert len(world.log) == 2


async def test_a_node_ready_again_within_the_grace_is_never_downed(monkeypatch: pytest.MonkeyPatch) -> None:
    world = make_world(monkeypatch)
    list_kube(world, kube_dict("kube1"))
    await see_slurm(world, slurm_node("kube1"))
    see_kube(world, "MODIFIED", kube_dict("kube1", ready="False"))
    world.clock.now += 30
    see_kube(world, "MODIFIED", kube_dict("kube1"))
    world.clock.now += 60
    see_kube(world, "MODIFIED", kube_dict("kube1", ready="False"))  # the grace starts over

    try:
        await world.sync.sync("kube1")
    finally:
        cancel_delayed(world.sync.queue)

    assert world.log == []


async def test_a_slurm_node_without_a_twin_waits_out_the_grace_then_is_announced_and_downed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = make_world(monkeypatch)
    world.told = 0  # no job runs there: nothing to wait for, still downed
    list_kube(world, kube_dict("kube1"))
    await see_slurm(world, slurm_node("kube9"))

    try:
        await world.sync.sync("kube9")  # first seen missing now
        assert world.log == []
        assert "kube9" in world.sync.queue._delayed  # looked at again once the grace is over
        world.clock.now += GRACE - 1
        await world.sync.sync("kube9")
        assert world.log == []
    finally:
        cancel_delayed(world.sync.queue)

    world.clock.now += 1
    await world.sync.sync("kube9")

    assert world.log == [
        ("announce", "kube9", "node kube9 is going down: no Kubernetes node kube9"),
        ("update", "kube9", "DOWN", f"{REASON_PREFIX} no Kubernetes node kube9"),
    ]


@pytest.mark.parametrize(("told", "lead_s"), [(1, 0.05), (0, 5.0)], ids=["jobs told", "nobody told"])
async def test_the_down_waits_for_the_announcement_only_when_jobs_were_told(
    monkeypatch: pytest.MonkeyPatch, told: int, lead_s: float
) -> None:
    world = make_world(monkeypatch)
    world.told = told
    monkeypatch.setattr(nodesync, "ANNOUNCE_LEAD_S", lead_s)
    list_kube(world)
    await see_slurm(world, slurm_node("kube9"))
    try:
        await world.sync.sync("kube9")
    finally:
        cancel_delayed(world.sync.queue)
    world.clock.now += GRACE
    loop = asyncio.get_running_loop()

    started = loop.time()
    await world.sync.sync("kube9")
    elapsed = loop.time() - started

    assert [entry[0] for entry in world.log] == ["announce", "update"]
    assert (elapsed >= lead_s) is bool(told)


# -- an admin's state, shown on the twin ------------------------------------------------------


async def test_an_admins_drain_shows_on_the_healthy_twin_and_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    world = make_world(monkeypatch)
    list_kube(world, kube_dict("kube1"))
    await see_slurm(world, slurm_node("kube1", ("IDLE", "DRAIN"), "maintenance"))

    await world.sync.sync("kube1")

    assert world.slurm.updates == []
    assert world.kube.conditions == [
        ("kube1", SLURM_CONDITION, "True", "SlurmNodeDrained", "Slurm node kube1 is DRAIN: maintenance"),
    ]


async def test_the_condition_is_set_once_and_cleared_when_the_admin_resumes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = make_world(monkeypatch)
    list_kube(world, kube_dict("kube1"))
    await see_slurm(world, slurm_node("kube1", ("IDLE", "DRAIN"), "maintenance"))
    await world.sync.sync("kube1")
    ((_, _, status, reason, message),) = world.kube.conditions
    see_kube(world, "MODIFIED", kube_dict("kube1", condition=(status, reason, message)))

    await world.sync.sync("kube1")
    assert len(world.kube.conditions) == 1

    await see_slurm(world, slurm_node("kube1"))
    await world.sync.sync("kube1")
    assert world.kube.conditions[1:] == [("kube1", SLURM_CONDITION, "False", "SlurmNodeAvailable", "")]
    assert world.slurm.updates == []


async def test_an_admins_down_is_not_resumed_even_when_the_twin_is_unhealthy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = make_world(monkeypatch)
    list_kube(world, kube_dict("kube1", unschedulable=True))
    await see_slurm(world, slurm_node("kube1", ("DOWN",), "bad dimm"))

    await world.sync.sync("kube1")

    assert world.slurm.updates == []
    assert [c[2:4] for c in world.kube.conditions] == [("True", "SlurmNodeDown")]


# -- mapping by label -------------------------------------------------------------------------


async def test_a_twin_found_by_label_queues_and_drains_its_slurm_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = make_world(monkeypatch)
    list_kube(world, kube_dict("worker-7", slurm_name="n1"))
    await see_slurm(world, slurm_node("n1", partition="mapped"))
    take_queued(world.sync.queue)

    see_kube(world, "MODIFIED", kube_dict("worker-7", slurm_name="n1", unschedulable=True))
    assert take_queued(world.sync.queue) == {"n1"}
    await world.sync.sync("n1")

    assert world.sync.twin_name(slurm_node("n1", partition="mapped")) == "worker-7"
    assert world.slurm.updates == [("n1", "DRAIN", f"{REASON_PREFIX} Kubernetes node worker-7 is cordoned")]


async def test_a_deleted_twin_found_by_label_queues_its_slurm_node(monkeypatch: pytest.MonkeyPatch) -> None:
    world = make_world(monkeypatch)
    list_kube(world, kube_dict("worker-7", slurm_name="n1"))
    await see_slurm(world, slurm_node("n1", partition="mapped"))
    await world.sync.sync("n1")
    take_queued(world.sync.queue)

    see_kube(world, "DELETED", kube_dict("worker-7", slurm_name="n1"))
    assert take_queued(world.sync.queue) == {"n1"}
    try:
        await world.sync.sync("n1")
    finally:
        cancel_delayed(world.sync.queue)

    assert world.slurm.updates == []  # gone for a moment only, maybe: the grace first


async def test_a_deleted_twin_found_by_label_downs_its_slurm_node_past_the_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = make_world(monkeypatch)
    list_kube(world, kube_dict("worker-7", slurm_name="n1"))
    await see_slurm(world, slurm_node("n1", partition="mapped"))
    see_kube(world, "DELETED", kube_dict("worker-7", slurm_name="n1"))
    try:
        await world.sync.sync("n1")
        world.clock.now += GRACE + 1
        await world.sync.sync("n1")
    finally:
        cancel_delayed(world.sync.queue)

    ((node, state, reason),) = world.slurm.updates
    assert (node, state) == ("n1", "DOWN")
    assert reason.startswith(REASON_PREFIX)


# -- the Slurm poll ---------------------------------------------------------------------------


async def test_the_poll_queues_only_nodes_whose_state_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    world = make_world(monkeypatch)
    await see_slurm(world, slurm_node("kube1"), slurm_node("kube2"))
    assert take_queued(world.sync.queue) == {"kube1", "kube2"}
    assert world.slurm.asked == [["k8s", "mapped"]]

    await see_slurm(world, slurm_node("kube1"), slurm_node("kube2", ("IDLE", "DRAIN"), "x"))
    assert take_queued(world.sync.queue) == {"kube2"}

    world.slurm.nodes = None  # slurmctld: nothing changed
    await world.sync.poll_once()
    assert take_queued(world.sync.queue) == set()
    assert [n.name for n in world.sync.slurm_nodes()] == ["kube1", "kube2"]


async def test_kube_changes_queue_only_bridged_slurm_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    world = make_world(monkeypatch)
    await see_slurm(world, slurm_node("kube1"))
    take_queued(world.sync.queue)

    list_kube(world, kube_dict("kube1"), kube_dict("control-plane"))

    assert take_queued(world.sync.queue) == {"kube1"}


# -- node_is_dead -----------------------------------------------------------------------------


async def test_no_node_is_dead_before_the_node_list_is_in(monkeypatch: pytest.MonkeyPatch) -> None:
    world = make_world(monkeypatch)
    world.sync.on_kube_node_changed("kube1")  # reported gone before the first full list
    world.clock.now += GRACE + 1
    assert world.sync.node_is_dead("kube1") is False
    list_kube(world, kube_dict("kube2"))
    assert world.sync.node_is_dead("kube1") is True


async def test_a_deleted_node_is_dead_only_past_the_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    world = make_world(monkeypatch)
    list_kube(world, kube_dict("kube1"), kube_dict("kube2"))
    world.clock.now += 500  # how long it existed does not count
    see_kube(world, "DELETED", kube_dict("kube1"))
    world.clock.now += GRACE - 1
    assert world.sync.node_is_dead("kube1") is False
    world.clock.now += 1
    assert world.sync.node_is_dead("kube1") is True
    see_kube(world, "ADDED", kube_dict("kube1"))  # re-registered
    assert world.sync.node_is_dead("kube1") is False
    assert world.sync.node_is_dead("kube2") is False


async def test_a_twin_never_seen_is_dead_once_a_sync_has_found_it_missing_for_the_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = make_world(monkeypatch)
    list_kube(world)
    await see_slurm(world, slurm_node("kube9"))
    try:
        await world.sync.sync("kube9")
    finally:
        cancel_delayed(world.sync.queue)
    assert world.sync.node_is_dead("kube9") is False
    world.clock.now += GRACE
    assert world.sync.node_is_dead("kube9") is True


async def test_a_ready_node_is_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    world = make_world(monkeypatch)
    list_kube(world, kube_dict("kube1"))
    assert world.sync.node_is_dead("kube1") is False


async def test_a_not_ready_node_is_never_dead_but_one_tainted_out_of_service_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A NotReady kubelet may still run the containers: only the operator's out-of-service taint
    (or the Node object's absence) says nothing runs there any more."""
    world = make_world(monkeypatch)
    list_kube(world, kube_dict("kube1", ready="False"))
    world.clock.now += GRACE * 10
    assert world.sync.node_is_dead("kube1") is False

    out_of_service = [{"key": OUT_OF_SERVICE_TAINT, "value": "nodeshutdown", "effect": "NoExecute"}]
    see_kube(world, "MODIFIED", kube_dict("kube1", ready="False", taints=out_of_service))
    assert world.sync.node_is_dead("kube1") is True  # at once: no grace for an operator's word
    see_kube(world, "MODIFIED", kube_dict("kube1", ready="False"))
    assert world.sync.node_is_dead("kube1") is False
    see_kube(world, "MODIFIED", kube_dict("kube1", taints=out_of_service))
    assert world.sync.node_is_dead("kube1") is True


async def test_a_ready_node_with_other_taints_is_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    world = make_world(monkeypatch)
    taints = [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
              {"key": "gpu", "effect": "NoSchedule"}]
    list_kube(world, kube_dict("kube1", taints=taints))
    assert world.sync.node_is_dead("kube1") is False


# -- regressions found in review ----------------------------------------------------------------


async def test_a_node_synced_before_the_node_list_is_looked_at_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Slurm node without any Kubernetes node is never queued by a node event: a sync that came
    too early must come back by itself, or the node would stay in service."""
    world = make_world(monkeypatch)
    await see_slurm(world, slurm_node("kube1"), slurm_node("kube9"))
    take_queued(world.sync.queue)
    await world.sync.sync("kube9")  # the node list is not in yet
    assert "kube9" in world.sync.queue._delayed
    cancel_delayed(world.sync.queue)

    list_kube(world, kube_dict("kube1"))
    assert "kube9" not in take_queued(world.sync.queue)
    try:
        await world.sync.sync("kube9")
        assert world.slurm.updates == []
        assert "kube9" in world.sync.queue._delayed  # and again once the grace is over
    finally:
        cancel_delayed(world.sync.queue)
    world.clock.now += GRACE
    await world.sync.sync("kube9")

    assert world.slurm.updates == [("kube9", "DOWN", f"{REASON_PREFIX} no Kubernetes node kube9")]


async def down_both_missing_nodes(world: World) -> None:
    """kube1 and kube2 have no Kubernetes node; the bridge sets kube1 DOWN past the grace."""
    list_kube(world)  # no Kubernetes node at all
    await see_slurm(world, slurm_node("kube1"), slurm_node("kube2"))
    try:
        await world.sync.sync("kube1")
        await world.sync.sync("kube2")
    finally:
        cancel_delayed(world.sync.queue)
    world.clock.now += GRACE
    await world.sync.sync("kube1")
    assert world.slurm.updates == [("kube1", "DOWN", f"{REASON_PREFIX} no Kubernetes node kube1")]


async def test_a_down_node_returned_to_service_by_slurm_is_drained_as_well(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ReturnToService=2 returns a DOWN node as soon as its slurmd answers (a bridged slurmd always
    does): once slurmctld itself shows that, DOWN goes with DRAIN (DRAIN first), which survives the
    registration."""
    world = make_world(monkeypatch)
    await down_both_missing_nodes(world)
    reason = f"{REASON_PREFIX} no Kubernetes node kube1"
    assert world.sync.drain_with_down is False

    await see_slurm(world, slurm_node("kube1"), slurm_node("kube2"))  # back, reason cleared
    await world.sync.sync("kube1")
    await world.sync.sync("kube2")

    assert world.sync.drain_with_down is True
    assert world.slurm.updates[1:] == [
        ("kube1", "DRAIN", reason), ("kube1", "DOWN", reason),
        ("kube2", "DRAIN", f"{REASON_PREFIX} no Kubernetes node kube2"),
        ("kube2", "DOWN", f"{REASON_PREFIX} no Kubernetes node kube2"),
    ]


async def test_a_stale_poll_alone_does_not_make_downs_drain_and_sends_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A poll read before the bridge's DOWN landed shows the node in service; slurmctld's answer
    of now still shows the bridge's DOWN: nothing came back, nothing is sent."""
    world = make_world(monkeypatch)
    await down_both_missing_nodes(world)
    assert world.slurm.current["kube1"].states == frozenset({"DOWN"})
    world.slurm.reads.clear()

    await poll_only(world, slurm_node("kube1"), slurm_node("kube2"))  # from before the DOWN
    await world.sync.sync("kube1")

    assert world.slurm.reads == ["kube1"]
    assert world.sync.drain_with_down is False
    assert len(world.slurm.updates) == 1
    local = world.sync.slurm_node("kube1")
    assert local is not None
    assert ("DOWN" in local.states, local.set_by_bridge) == (True, True)


async def test_after_drain_with_down_a_node_left_drained_by_the_bridge_is_not_downed_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each registration lifts DOWN and leaves the bridge's DRAIN: that is no reason for another
    DOWN (which would be lifted again, for ever)."""
    world = make_world(monkeypatch)
    await down_both_missing_nodes(world)
    await see_slurm(world, slurm_node("kube1"), slurm_node("kube2"))
    await world.sync.sync("kube1")
    assert world.sync.drain_with_down is True
    sent = len(world.slurm.updates)
    reason = f"{REASON_PREFIX} no Kubernetes node kube1"

    for _ in range(3):
        await see_slurm(world, slurm_node("kube1", ("IDLE", "DRAIN"), reason), slurm_node("kube2"))
        await world.sync.sync("kube1")

    assert len(world.slurm.updates) == sent


async def test_a_label_mapped_node_without_its_label_is_never_mapped_by_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = make_world(monkeypatch)
    # A Kubernetes node that happens to bear the Slurm node's name is not its twin.
    list_kube(world, kube_dict("n2", unschedulable=True))
    await see_slurm(world, slurm_node("n2", partition="mapped"))

    try:
        await world.sync.sync("n2")
    finally:
        cancel_delayed(world.sync.queue)

    assert world.sync.twin_name(slurm_node("n2", partition="mapped")) is None
    assert world.slurm.updates == []  # not drained for the cordon of a node that is not its twin
    assert world.kube.conditions == []


async def test_a_label_mapped_node_without_its_label_is_down_past_the_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = make_world(monkeypatch)
    list_kube(world, kube_dict("n2"))
    await see_slurm(world, slurm_node("n2", partition="mapped"))

    try:
        await world.sync.sync("n2")
        world.clock.now += GRACE + 1
        await world.sync.sync("n2")
    finally:
        cancel_delayed(world.sync.queue)

    reason = f"{REASON_PREFIX} no Kubernetes node labelled {MAPPED_BY}=n2"
    assert world.slurm.updates == [("n2", "DOWN", reason)]


# -- slurmctld's view of now ---------------------------------------------------------------------


async def test_an_admins_fresh_drain_wins_over_the_polled_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    world = make_world(monkeypatch)
    list_kube(world, kube_dict("kube1", unschedulable=True))
    await poll_only(world, slurm_node("kube1"))  # the poll: IDLE
    world.slurm.current["kube1"] = slurm_node("kube1", ("IDLE", "DRAIN"), "maintenance")  # the admin, since

    await world.sync.sync("kube1")

    assert world.slurm.reads == ["kube1"]
    assert world.slurm.updates == []
    # Planned on the fresh view: the twin shows the admin's drain.
    assert world.kube.conditions == [
        ("kube1", SLURM_CONDITION, "True", "SlurmNodeDrained", "Slurm node kube1 is DRAIN: maintenance"),
    ]
    local = world.sync.slurm_node("kube1")
    assert local is not None
    assert local.reason == "maintenance"


async def test_nothing_is_sent_for_a_node_slurmctld_no_longer_knows(monkeypatch: pytest.MonkeyPatch) -> None:
    world = make_world(monkeypatch)
    list_kube(world, kube_dict("kube1", unschedulable=True))
    await poll_only(world, slurm_node("kube1"))  # slurmctld: removed since

    await world.sync.sync("kube1")

    assert world.slurm.reads == ["kube1"]
    assert world.log == []
    assert world.kube.conditions == []


async def test_no_read_is_made_when_the_polled_view_needs_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    world = make_world(monkeypatch)
    list_kube(world, kube_dict("kube1"))
    await see_slurm(world, slurm_node("kube1"))

    await world.sync.sync("kube1")

    assert (world.slurm.reads, world.log) == ([], [])


async def test_a_fresh_view_without_partitions_keeps_the_polled_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    world = make_world(monkeypatch)
    list_kube(world, kube_dict("worker-7", slurm_name="n1", unschedulable=True), kube_dict("n1"))
    await poll_only(world, slurm_node("n1", partition="mapped"))
    world.slurm.current["n1"] = SlurmNode("n1", frozenset({"IDLE"}), "", ())

    await world.sync.sync("n1")

    assert world.slurm.updates == [("n1", "DRAIN", f"{REASON_PREFIX} Kubernetes node worker-7 is cordoned")]
    local = world.sync.slurm_node("n1")
    assert local is not None
    assert local.partitions == ("mapped",)
    assert world.sync.twin_name(local) == "worker-7"


async def test_a_fresh_view_with_partitions_is_taken_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    world = make_world(monkeypatch)
    list_kube(world, kube_dict("kube1", unschedulable=True))
    await poll_only(world, slurm_node("kube1"))
    world.slurm.current["kube1"] = SlurmNode("kube1", frozenset({"MIXED"}), "", ("k8s", "other"))

    await world.sync.sync("kube1")

    local = world.sync.slurm_node("kube1")
    assert local is not None
    assert (local.states, local.partitions) == (frozenset({"MIXED", "DRAIN"}), ("k8s", "other"))


# -- the mass-failure brake ----------------------------------------------------------------------


async def many_not_ready(
    monkeypatch: pytest.MonkeyPatch, nodes: int, not_ready: int
) -> World:
    """`nodes` bridged nodes kube1.., the first `not_ready` of them NotReady past the grace."""
    world = make_world(monkeypatch)
    names = [f"kube{i}" for i in range(1, nodes + 1)]
    list_kube(world, *(kube_dict(name) for name in names))
    await see_slurm(world, *(slurm_node(name) for name in names))
    for name in names[:not_ready]:
        see_kube(world, "MODIFIED", kube_dict(name, ready="Unknown"))
    world.clock.now += GRACE + 1
    return world


async def test_more_than_half_the_nodes_unhealthy_at_once_drains_instead_of_downing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = await many_not_ready(monkeypatch, nodes=6, not_ready=4)

    await world.sync.sync("kube1")

    ((node, state, reason),) = world.slurm.updates
    assert (node, state) == ("kube1", "DRAIN")
    assert reason.startswith(f"{REASON_PREFIX} Kubernetes node kube1 is Unknown")
    assert "not DOWN" in reason
    assert not any(entry[0] == "announce" for entry in world.log)  # nothing is killed: nothing to tell
    assert world.sync.metrics.value("node_mass_failure_brakes_total") == 1


@pytest.mark.parametrize(
    ("nodes", "not_ready"), [(6, 3), (3, 2)], ids=["exactly half", "fewer than 4 nodes"]
)
async def test_up_to_half_the_nodes_or_a_small_cluster_still_downs(
    monkeypatch: pytest.MonkeyPatch, nodes: int, not_ready: int
) -> None:
    world = await many_not_ready(monkeypatch, nodes=nodes, not_ready=not_ready)

    await world.sync.sync("kube1")

    assert [state for _, state, _ in world.slurm.updates] == ["DOWN"]
    assert world.sync.metrics.value("node_mass_failure_brakes_total") == 0


async def test_the_brake_leaves_cordons_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    world = await many_not_ready(monkeypatch, nodes=6, not_ready=4)
    see_kube(world, "MODIFIED", kube_dict("kube6", unschedulable=True))

    await world.sync.sync("kube6")

    assert world.slurm.updates == [("kube6", "DRAIN", f"{REASON_PREFIX} Kubernetes node kube6 is cordoned")]
    assert world.sync.metrics.value("node_mass_failure_brakes_total") == 0


# -- leadership lost halfway ---------------------------------------------------------------------


async def test_an_update_after_the_lead_is_lost_is_not_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    world = make_world(monkeypatch)
    list_kube(world, kube_dict("kube1", unschedulable=True))
    await see_slurm(world, slurm_node("kube1", ("DOWN",), f"{REASON_PREFIX} no Kubernetes node kube1"))

    def lose_the_lead() -> None:
        world.leading[0] = False

    world.slurm.after_update = lose_the_lead
    await world.sync.sync("kube1")  # plans RESUME, then DRAIN

    assert world.slurm.updates == [("kube1", "RESUME", "")]
    assert world.kube.conditions == []


async def test_the_condition_is_not_written_after_the_lead_is_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    world = make_world(monkeypatch)
    shown = ("True", "SlurmNodeDrained", "Slurm node kube1 is DRAIN: maintenance")
    list_kube(world, kube_dict("kube1", unschedulable=True, condition=shown))
    await see_slurm(world, slurm_node("kube1"))  # the admin resumed it; the twin still says drained

    def lose_the_lead() -> None:
        world.leading[0] = False

    world.slurm.after_update = lose_the_lead
    await world.sync.sync("kube1")

    assert [state for _, state, _ in world.slurm.updates] == ["DRAIN"]
    assert world.kube.conditions == []

    world.leading[0] = True  # the same, leading throughout: the stale condition is cleared
    world.slurm.after_update = None
    await see_slurm(world, slurm_node("kube1"))
    await world.sync.sync("kube1")
    assert world.kube.conditions == [("kube1", SLURM_CONDITION, "False", "SlurmNodeAvailable", "")]


async def test_with_the_lead_kept_both_updates_are_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    world = make_world(monkeypatch)
    list_kube(world, kube_dict("kube1", unschedulable=True))
    await see_slurm(world, slurm_node("kube1", ("DOWN",), f"{REASON_PREFIX} no Kubernetes node kube1"))

    await world.sync.sync("kube1")

    assert world.slurm.updates == [
        ("kube1", "RESUME", ""), ("kube1", "DRAIN", f"{REASON_PREFIX} Kubernetes node kube1 is cordoned"),
    ]


async def test_unhealthy_nodes_outside_the_bridge_do_not_pull_the_brake(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = await many_not_ready(monkeypatch, nodes=4, not_ready=1)
    see_kube(world, "ADDED", kube_dict("control-plane", ready="False"))  # no Slurm node stands for these
    see_kube(world, "ADDED", kube_dict("build-1", ready="Unknown"))
    see_kube(world, "ADDED", kube_dict("build-2"))
    see_kube(world, "DELETED", kube_dict("build-2"))

    await world.sync.sync("kube1")  # 1 of 4 bridged nodes unhealthy

    assert [state for _, state, _ in world.slurm.updates] == ["DOWN"]


async def test_a_node_still_showing_the_bridges_reason_is_downed_again_not_drained_for_good(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An answer without DOWN that still carries the bridge's reason is no return to service
    (slurmctld's clears the reason): the node is set DOWN again, and later downs stay plain DOWN
    (DOWN+DRAIN shows as "drained", for the daemon's life)."""
    world = make_world(monkeypatch)
    await down_both_missing_nodes(world)
    reason = f"{REASON_PREFIX} no Kubernetes node kube1"

    await see_slurm(world, slurm_node("kube1", ("IDLE",), reason), slurm_node("kube2"))
    await world.sync.sync("kube1")

    assert world.sync.drain_with_down is False
    assert world.slurm.updates[1:] == [("kube1", "DOWN", reason)]


async def missing_past_the_grace(world: World) -> None:
    """kube1 has no Kubernetes node; a first sync starts the grace, which then passes."""
    list_kube(world)
    await see_slurm(world, slurm_node("kube1"))
    try:
        await world.sync.sync("kube1")
    finally:
        cancel_delayed(world.sync.queue)
    world.clock.now += GRACE


class GarbledOnce(FakeSlurm):
    """slurmrestd garbles its first answer to node(): the REST client's MalformedAnswer."""

    garbled = False

    async def node(self, name: str) -> SlurmNode | None:
        if not self.garbled:
            self.garbled = True
            raise SlurmAuthError("slurmrestd sent a malformed answer to GET /node")
        return await super().node(name)


async def test_a_garbled_answer_leaves_the_node_queued_and_it_goes_down_on_the_retry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A "permanent" error to a job's reconcile, once dropped the node's key for good: a paused
    kubelet's node sent no further event, and it never went down."""
    world = make_world(monkeypatch)
    garbled = GarbledOnce(world.log)
    world.slurm = garbled
    world.sync.slurm = garbled
    await missing_past_the_grace(world)

    with pytest.raises(TemporaryError, match="malformed"):
        await world.sync.sync("kube1")  # the work queue backs off and comes back (not dropped)
    await world.sync.sync("kube1")

    assert world.slurm.updates == [("kube1", "DOWN", f"{REASON_PREFIX} no Kubernetes node kube1")]


async def test_a_node_slurmctld_did_not_know_for_a_moment_is_looked_at_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = make_world(monkeypatch)
    await missing_past_the_grace(world)
    del world.slurm.current["kube1"]  # node() answers None

    await world.sync.sync("kube1")

    assert "kube1" in world.sync.queue._delayed
    cancel_delayed(world.sync.queue)
    assert world.slurm.updates == []
