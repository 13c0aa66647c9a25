"""Ended runs' pods that their kubelet still counts, and the nodes they hold (Slurm's COMPLETING,
done by the bridge).

A run ends for Slurm when its outcome is decided: on the agent's last log frame ("x", agent/
ending.go), which comes before the kubelet has noticed the container's end (it relists its runtime
each second), and, for a multi-node job, while the other nodes' pods still hold their node until
they are deleted. Until a kubelet has seen such a pod stop it counts the pod's requests against its
node, and a pod of the next job placed there at once could be refused (OutOfcpu, OutOfmemory). So
neither a batch pod (pod_creation) nor a gang pod (kube_workloads' bind) is placed on such a node
until the old pod has stopped, or is gone, in the pod watch's cache; for at most HOLD_LIMIT_S, after
which it is placed anyway (a kubelet whose status never comes must not wedge the node's queue).

Owns those pods by node, and the jobs held now. Written by the reconciler when a run ends; read,
and pruned, before pods are placed. Bounded by the pods of runs ended within the last kubelet
cycles. In memory: a daemon that restarts forgets them (at most a kubelet cycle's worth).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import structlog

from bridge.clients.kube.cache import PodCache
from bridge.core.pod_view import PodView, pod_view

log = structlog.get_logger(__name__)

HELD_NODE_RETRY_S = 0.1
"""A job whose node is still held looks again this much later (the cache only: no API request)."""
HOLD_LIMIT_S = 30.0
"""The longest a pod of an ended run holds its node; then the next job's pod is placed anyway."""


class EarlyEndings:
    def __init__(self, cache: PodCache) -> None:
        self._cache = cache
        self._by_node: dict[str, dict[str, float]] = {}
        """Node -> pod name -> when its run ended (monotonic)."""
        self._held_jobs: dict[int, float] = {}
        """Job -> when its pods were first put off (for one log line and one count per job)."""

    def record(self, pods: Iterable[PodView]) -> None:
        """The run of `pods` ended: those their kubelet has not seen stop still hold their node."""
        now = time.monotonic()
        for pod in pods:
            if pod.node_name and not pod.stopped:
                self._by_node.setdefault(pod.node_name, {}).setdefault(pod.name, now)

    def holding(self, nodes: Iterable[str]) -> list[str]:
        """The pods of ended runs on `nodes` that their kubelet still counts as running."""
        if not self._by_node:
            return []
        now = time.monotonic()
        held: list[str] = []
        for node in nodes:
            pods = self._by_node.get(node)
            if not pods:
                continue
            for name, ended in list(pods.items()):
                raw = self._cache.get(name)
                if raw is None or pod_view(raw).stopped:
                    del pods[name]
                elif now - ended > HOLD_LIMIT_S:
                    log.warning("node.hold_expired", node=node, pod=name, held_s=round(now - ended, 1),
                                note="its kubelet never reported the pod stopped: the next pod goes there")
                    del pods[name]
                else:
                    held.append(name)
            if not pods:
                del self._by_node[node]
        return held

    def hold(self, job_id: int, nodes: Iterable[str]) -> tuple[list[str], bool]:
        """(The pods holding `job_id`'s nodes, empty when its pods may be placed now; whether this
        is the job's first hold: only that one is worth a log line and a count.)"""
        held = self.holding(nodes)
        if not held:
            self._held_jobs.pop(job_id, None)
            return held, False
        now = time.monotonic()
        for stale in [job for job, since in self._held_jobs.items() if now - since > 2 * HOLD_LIMIT_S]:
            del self._held_jobs[stale]  # cancelled while held: never asked again
        first = job_id not in self._held_jobs
        self._held_jobs.setdefault(job_id, now)
        return held, first

    def __len__(self) -> int:
        return sum(len(pods) for pods in self._by_node.values())
