"""Early endings: batch pods whose agent told the script's end ("x" frame) before their kubelet
noticed it, and the nodes those pods still hold in the kubelet's eyes.

Ending a job on the agent's word saves the kubelet's status cycle (it notices an exited container
when it next relists its runtime: up to a second). But until it notices, that kubelet still counts
the pod's requests against its node: a pod of the next job placed there at once could be refused
(OutOfcpu, OutOfmemory). So a pod is created on such a node only once the old pod has stopped, or
is gone, in the pod watch's cache: what native Slurm's node does in COMPLETING.

Owns the early-ended pods by node; written by the reconciler when it ends a job early, read (and
pruned) when it creates pods. Bounded by the pods that ended within the last kubelet cycle.
"""

from __future__ import annotations

from collections.abc import Iterable

from bridge.clients.kube.cache import PodCache
from bridge.core.pod_view import PodView, pod_view

HELD_NODE_RETRY_S = 0.1
"""A job whose node is still held by an early-ended pod looks again this much later (the cache
only: no API request)."""


class EarlyEndings:
    def __init__(self, cache: PodCache) -> None:
        self._cache = cache
        self._by_node: dict[str, set[str]] = {}

    def record(self, pod: PodView) -> None:
        """`pod`'s script ended on its agent's word; its kubelet may not know it yet."""
        if pod.node_name and not pod.stopped:
            self._by_node.setdefault(pod.node_name, set()).add(pod.name)

    def holding(self, nodes: Iterable[str]) -> list[str]:
        """The early-ended pods on `nodes` that their kubelet still counts as running."""
        held: list[str] = []
        for node in nodes:
            names = self._by_node.get(node)
            if not names:
                continue
            for name in list(names):
                raw = self._cache.get(name)
                if raw is None or pod_view(raw).stopped:
                    names.discard(name)
                else:
                    held.append(name)
            if not names:
                del self._by_node[node]
        return held

    def __len__(self) -> int:
        return sum(len(names) for names in self._by_node.values())
