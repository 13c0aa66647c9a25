"""Node health sync: Kubernetes node health becomes Slurm node state, and an admin's Slurm state
becomes a condition on the Kubernetes node (rules in bridge.core.nodehealth).

Two sources, one queue of Slurm node names:
- the node watch (one ListWatcher of /api/v1/nodes into the NodeCache) queues the Slurm nodes of
  every Kubernetes node that changed in a way the bridge reads (heartbeats change nothing);
- a poll of slurmctld's nodes (`update_time`: cheap when nothing changed) queues every bridged
  Slurm node whose state or reason changed.

This module owns the Slurm node view and when each Kubernetes node was first seen not Ready; the
node cache is the watcher's. Only the leader writes to Slurm or Kubernetes; standbys keep their
views warm and poll Slurm more slowly.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Any

import structlog

from bridge.clients.kube.actions import KubeActions
from bridge.clients.kube.nodes import NodeCache
from bridge.clients.slurm import SlurmClient
from bridge.controller.metrics import Metrics
from bridge.controller.workqueue import WorkQueue
from bridge.core import nodehealth
from bridge.core.config import BridgeConfig
from bridge.core.errors import BridgeError, PermanentError, TemporaryError
from bridge.core.nodehealth import Health, KubeNode, SlurmNode

log = structlog.get_logger(__name__)

WORKERS = 4
MASS_FAILURE_FRACTION = 0.5
MASS_FAILURE_MIN_NODES = 4
STANDBY_POLL_FACTOR = 5
ANNOUNCE_LEAD_S = 0.3
"""Between telling the jobs of a node why it goes down and downing it: their waiters print the
reason before Slurm's kill reaches them."""
MISSING_NODE_RECHECK_S = 5.0


class NodeHealthSync:
    def __init__(
        self,
        cfg: BridgeConfig,
        slurm: SlurmClient,
        kube: KubeActions,
        nodes: NodeCache,
        metrics: Metrics,
        *,
        leading: Callable[[], bool],
        announce: Callable[[str, str], int],
    ) -> None:
        """`announce(slurm node, text)` tells the jobs running on that node why it goes down and
        returns how many it told."""
        self.cfg = cfg
        self.slurm = slurm
        self.kube = kube
        self.nodes = nodes
        self.metrics = metrics
        self._leading = leading
        self._announce = announce
        self._settings = cfg.nodes
        self._slurm_nodes: dict[str, SlurmNode] = {}
        self._not_ready_since: dict[str, float] = {}
        """Kubernetes node name -> when (monotonic) this daemon first saw it not Ready, or missing."""
        self._twin_of: dict[str, str] = {}
        """Slurm node name -> the Kubernetes node it was last mapped to."""
        self._downed: set[str] = set()
        """Slurm nodes this daemon set DOWN and has not seen healthy since."""
        self.drain_with_down = False
        """Set once a node the bridge set DOWN came back by itself (ReturnToService=2): from then
        on DOWN goes with DRAIN (nodehealth.plan_updates)."""
        self.queue: WorkQueue[str] = WorkQueue()
        self.slurm_synced = asyncio.Event()
        self._label_keys = {p.node_label for p in cfg.partitions.values() if p.node_label}

    # -- reads (reconcile and doctor use them) ---------------------------------------------------
    @property
    def synced(self) -> bool:
        return self.slurm_synced.is_set() and self.nodes.synced.is_set()

    def slurm_node(self, name: str) -> SlurmNode | None:
        return self._slurm_nodes.get(name)

    def slurm_nodes(self) -> list[SlurmNode]:
        return [self._slurm_nodes[name] for name in sorted(self._slurm_nodes)]

    def twin_name(self, slurm: SlurmNode) -> str | None:
        """The Kubernetes node standing for `slurm`: by the partition's node_label (None when no
        node carries it, as translate refuses such a job), else the node of the same name."""
        label = self._node_label(slurm)
        return self.nodes.by_label(label).get(slurm.name) if label else slurm.name

    def _node_label(self, slurm: SlurmNode) -> str | None:
        for part_name in slurm.partitions:
            part = self.cfg.partition(part_name)
            if part is not None and part.node_label:
                return part.node_label
        return None

    def health(self, slurm: SlurmNode, now: float | None = None) -> Health:
        name = self.twin_name(slurm)
        if name is None:
            # No node carries the label (any more): its absence is timed under a key of its own.
            label = f"labelled {self._node_label(slurm)}={slurm.name}"
            since = self._not_ready_since.setdefault(label, time.monotonic())
            waited = (now if now is not None else time.monotonic()) - since
            return nodehealth.assess(None, label, not_ready_for_s=waited,
                                     grace_s=self._settings.not_ready_grace_s)
        self._not_ready_since.pop(f"labelled {self._node_label(slurm)}={slurm.name}", None)
        twin = self.nodes.get(name)
        not_ready_since = self._not_ready_since.get(name)
        clock = now if now is not None else time.monotonic()
        not_ready_for = None if not_ready_since is None else clock - not_ready_since
        return nodehealth.assess(
            twin, name, not_ready_for_s=not_ready_for, grace_s=self._settings.not_ready_grace_s,
            tolerations=self._tolerations(slurm.partitions),
        )

    def node_is_dead(self, k8s_name: str) -> bool:
        """No kubelet will ever confirm anything there: the Node object is gone (past the grace),
        or an operator tainted it out-of-service. Pods there are removed without waiting for a
        confirmation that never comes. A node that is merely NotReady is not dead: its kubelet may
        still run the containers, and removing their pods would hide them from Kubernetes."""
        if not self.nodes.synced.is_set():
            return False
        twin = self.nodes.get(k8s_name)
        if twin is not None:
            return any(t.key == nodehealth.OUT_OF_SERVICE_TAINT for t in twin.taints)
        since = self._not_ready_since.get(k8s_name)
        return since is not None and time.monotonic() - since >= self._settings.not_ready_grace_s

    # -- sources ---------------------------------------------------------------------------------
    def on_kube_node_changed(self, k8s_name: str) -> None:
        """The watcher's callback: note readiness changes, queue the Slurm nodes concerned."""
        twin = self.nodes.get(k8s_name)
        if twin is None or twin.ready != "True":
            self._not_ready_since.setdefault(k8s_name, time.monotonic())
        else:
            self._not_ready_since.pop(k8s_name, None)
        for name in self._slurm_names_of(k8s_name, twin):
            self.queue.add(name)

    def _slurm_names_of(self, k8s_name: str, twin: KubeNode | None) -> set[str]:
        names = {k8s_name}
        if twin is not None:
            names |= {twin.labels[key] for key in self._label_keys if key in twin.labels}
        names |= {slurm for slurm, mapped in self._twin_of.items() if mapped == k8s_name}
        return {name for name in names if name in self._slurm_nodes}

    async def poll_once(self) -> None:
        listing = await self.slurm.changed_nodes(self.cfg.partitions.keys())
        self.metrics.inc("slurm_node_polls_total")
        if listing is not None:
            fresh = {node.name: node for node in listing}
            changed = {n for n in fresh if fresh[n] != self._slurm_nodes.get(n)}
            self._slurm_nodes = fresh
            for name in sorted(changed):
                self.queue.add(name)
        self.slurm_synced.set()

    async def poll(self) -> None:
        failures = 0
        while True:
            try:
                await self.poll_once()
                failures = 0
            except BridgeError as error:
                failures += 1
                log.warning("nodes.slurm_poll_failed", error=str(error), failures=failures)
            interval = self._settings.poll_interval_s
            await asyncio.sleep(interval if self._leading() else interval * STANDBY_POLL_FACTOR)

    def queue_all(self) -> None:
        """Look at every bridged node once (on taking the lead: level-triggered)."""
        for name in self._slurm_nodes:
            self.queue.add(name)

    async def run(self) -> None:
        """Poll Slurm and work the queue until cancelled."""
        tasks = [asyncio.create_task(self.poll(), name="slurm-node-poll")]
        tasks += [asyncio.create_task(self.queue.run_worker(self.sync), name=f"node-worker-{i}")
                  for i in range(WORKERS)]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- the loop body ---------------------------------------------------------------------------
    async def sync(self, name: str) -> None:
        """Make Slurm node `name` match its Kubernetes twin, and the twin show an admin's state.
        A node is never given up: an answer slurmrestd garbled under load (a "permanent" error to a
        job's reconcile) is tried again with the queue's back-off. Dropped, a paused kubelet's node
        sent no further event and stayed up for good."""
        try:
            await self._sync(name)
        except PermanentError as error:
            raise TemporaryError(f"node {name}: {error}") from error

    async def _sync(self, name: str) -> None:
        if not self._settings.enabled or not self._leading():
            return
        if not self.synced:
            # The node list or the first Slurm poll is not in yet: look again once it may be
            # (a Slurm node without a Kubernetes node is never queued by a node event).
            self.queue.add_after(name, 1.0)
            return
        slurm = self._slurm_nodes.get(name)
        if slurm is None:
            return
        bound = log.bind(node=name)
        twin_name = self.twin_name(slurm)
        if twin_name is not None:
            self._twin_of[name] = twin_name
            if self.nodes.get(twin_name) is None:
                self._not_ready_since.setdefault(twin_name, time.monotonic())
        health = self._braked(self.health(slurm))
        if health.verdict == "wait" and health.recheck_in_s is not None:
            self.queue.add_after(name, health.recheck_in_s + 0.05)
        updates = nodehealth.plan_updates(slurm, health, drain_with_down=self.drain_with_down,
                                          downed=name in self._downed)
        if updates:
            # The poll's view may be a second old (or older than our own last write): act on
            # slurmctld's answer of now, never override an admin's fresh decision.
            fresh = await self.slurm.node(name)
            if fresh is None:
                # Unknown to slurmctld just now: the poll drops a node that is gone for good.
                self.queue.add_after(name, MISSING_NODE_RECHECK_S)
                return
            slurm = fresh if fresh.partitions else nodehealth.SlurmNode(
                fresh.name, fresh.states, fresh.reason, slurm.partitions)
            self._slurm_nodes[name] = slurm
            # slurmctld's return to service clears the reason; a node still showing the bridge's is
            # not back (downed again below, not drained for the daemon's life).
            returned = "DOWN" not in slurm.states and not slurm.set_by_bridge
            if health.verdict == "down" and name in self._downed and returned:
                if not self.drain_with_down:
                    bound.warning("node.returned_to_service_while_down",
                                  hint="ReturnToService=2 undoes DOWN; the bridge now drains such nodes too")
                self.drain_with_down = True
            updates = nodehealth.plan_updates(slurm, health, drain_with_down=self.drain_with_down,
                                              downed=name in self._downed)
        if any(u.state == "DOWN" for u in updates) and self._leading() and self._announce(
                name, _announcement(name, health)):
            await asyncio.sleep(ANNOUNCE_LEAD_S)
        for update in updates:
            if not self._leading():
                return  # lost the Lease meanwhile: the new leader decides
            await self.slurm.update_node(update.node, update.state, update.reason)
            self.metrics.inc("slurm_node_updates_total")
            report = bound.info if update.state == "RESUME" else bound.warning
            report("node.slurm_updated", state=update.state, reason=update.reason, kube_node=twin_name)
        if any(u.state == "DOWN" for u in updates):
            self._downed.add(name)
        elif health.verdict != "down":
            self._downed.discard(name)
        if updates:
            # Until the next poll says otherwise: a second event must not send the same update.
            slurm = nodehealth.after(slurm, updates)
            self._slurm_nodes[name] = slurm
        twin = self.nodes.get(twin_name) if twin_name is not None else None
        if twin is not None and twin_name is not None:
            wanted = nodehealth.wanted_condition(slurm)
            if nodehealth.condition_needs_update(twin, wanted) and self._leading():
                await self.kube.set_node_condition(twin_name, nodehealth.SLURM_CONDITION, *wanted)
                bound.info("node.condition_set", kube_node=twin_name, status=wanted[0], reason=wanted[1])

    def _braked(self, health: Health) -> Health:
        """Past half the bridged nodes unhealthy at once, a control-plane outage (the API server,
        etcd, the network to the kubelets) is far likelier than that many dead nodes, and
        Kubernetes itself stops evicting then. DRAIN instead of DOWN: running jobs are left alone."""
        if health.verdict != "down":
            return health
        # Only the twins of bridged Slurm nodes count (not other nodes of the cluster).
        twins = {self.twin_name(node) or f"labelled {self._node_label(node)}={node.name}"
                 for node in self._slurm_nodes.values()}
        unhealthy, total = len(twins & self._not_ready_since.keys()), len(self._slurm_nodes)
        if total >= MASS_FAILURE_MIN_NODES and unhealthy > total * MASS_FAILURE_FRACTION:
            self.metrics.inc("node_mass_failure_brakes_total")
            log.warning("node.mass_failure_brake", unhealthy=unhealthy, nodes=total, why=health.why)
            return Health("drain", f"{health.why}; not DOWN: {unhealthy} of {total} nodes are unhealthy at "
                          "once, a Kubernetes control-plane problem is likelier")
        return health

    def _tolerations(self, partitions: Iterable[str]) -> list[Any]:
        found: list[Any] = []
        for part_name in partitions:
            part = self.cfg.partition(part_name)
            if part is not None:
                found.extend(part.tolerations)
        return found


def _announcement(node: str, health: Health) -> str:
    return f"node {node} is going down: {health.why}"
