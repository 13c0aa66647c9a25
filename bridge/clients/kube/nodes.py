"""In-memory copy of the cluster's nodes, trimmed to what the bridge reads (bridge.core.nodehealth.KubeNode):
name, the labels it maps Slurm nodes by, cordon, taints, the Ready condition and the bridge's own
condition. A full Node is 5-50 KB (images, addresses, capacity); a KubeNode is a few hundred bytes,
so a watch of every node of a large cluster stays small. Fed by one ListWatcher of /api/v1/nodes.

Pure: no I/O, no clock. The watcher trims each list page before it is kept.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from bridge.core.nodehealth import KubeNode, kube_node


class NodeCache:
    """Nodes by name, plus an index by the values of each label in `label_keys` (the partitions'
    `node_label`s), so mapping a Slurm node to its Kubernetes node never lists the cluster."""

    def __init__(self, label_keys: Iterable[str] = ()) -> None:
        self.label_keys = frozenset(label_keys)
        self._nodes: dict[str, KubeNode] = {}
        self._by_label: dict[str, _LabelIndex] = {key: _LabelIndex() for key in self.label_keys}
        self.synced = asyncio.Event()
        """Set once the first full list is in: before that, "no such node" means "not read yet"."""

    # -- reads --------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._nodes)

    def get(self, name: str) -> KubeNode | None:
        return self._nodes.get(name)

    def names(self) -> list[str]:
        return sorted(self._nodes)

    def by_label(self, key: str) -> Mapping[str, str]:
        """Label value -> node name for label `key` (one of `label_keys`); read-only. Where two
        nodes carry the same value (a mislabelling), the first by name is given."""
        return self._by_label.get(key) or _LabelIndex()

    # -- writes (the watcher) ----------------------------------------------------------------
    def trim(self, obj: dict[str, Any]) -> KubeNode:
        return kube_node(obj, self.label_keys)

    def apply(self, event_type: str, obj: dict[str, Any]) -> set[str]:
        """One watch event; returns the node names it changed."""
        name = (obj.get("metadata") or {}).get("name")
        if not name:
            return set()
        if event_type in ("ADDED", "MODIFIED"):
            return self._put(self.trim(obj))
        if event_type == "DELETED":
            return self._remove(name)
        return set()

    def replace_all(self, nodes: Iterable[KubeNode]) -> set[str]:
        """Make the cache exactly `nodes` (trimmed, from a full list); returns what changed."""
        fresh = {node.name: node for node in nodes if node.name}
        changed: set[str] = set()
        for name in [name for name in self._nodes if name not in fresh]:
            changed |= self._remove(name)
        for node in fresh.values():
            changed |= self._put(node)
        self.synced.set()
        return changed

    def _put(self, node: KubeNode) -> set[str]:
        old = self._nodes.get(node.name)
        if old == node:
            return set()  # a heartbeat or an image list change: nothing the bridge reads
        if old is not None:
            self._unindex(old)
        self._nodes[node.name] = node
        for key in self.label_keys:
            value = node.labels.get(key)
            if value is not None:
                self._by_label[key].add(value, node.name)
        return {node.name}

    def _remove(self, name: str) -> set[str]:
        old = self._nodes.pop(name, None)
        if old is None:
            return set()
        self._unindex(old)
        return {name}

    def _unindex(self, node: KubeNode) -> None:
        for key in self.label_keys:
            value = node.labels.get(key)
            if value is not None:
                self._by_label[key].discard(value, node.name)


class _LabelIndex(Mapping[str, str]):
    """Label value -> node name, remembering every node that carries a value, so that one of two
    nodes with the same value changing its label leaves the other one mapped."""

    def __init__(self) -> None:
        self._names: dict[str, set[str]] = {}

    def add(self, value: str, name: str) -> None:
        self._names.setdefault(value, set()).add(name)

    def discard(self, value: str, name: str) -> None:
        names = self._names.get(value)
        if names is not None:
            names.discard(name)
            if not names:
                del self._names[value]

    def __getitem__(self, value: str) -> str:
        return min(self._names[value])

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)
