"""Which Kubernetes nodes enforce supplementalGroupsPolicy Strict, as each node reports it
(`status.features.supplementalGroupsPolicy`, set by kubelets whose runtime supports it).

A node's runtime changes rarely, so answers are kept for a while: one GET per node per TTL,
never a list of the whole cluster, and at most `max_nodes` entries."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import structlog

from bridge.core.errors import BridgeError

log = structlog.get_logger(__name__)

GetNode = Callable[[str], Awaitable[dict[str, Any]]]


class StrictGroupsNodes:
    def __init__(self, get_node: GetNode, ttl_s: float = 300.0, max_nodes: int = 20_000) -> None:
        self._get_node = get_node
        self._ttl_s = ttl_s
        self._max_nodes = max_nodes
        self._known: OrderedDict[str, tuple[float, bool]] = OrderedDict()

    async def among(self, names: Iterable[str]) -> set[str]:
        """The nodes of `names` that enforce Strict. A node that cannot be read counts as not
        enforcing it (the pod then gets no policy, as before; the kubelet would refuse Strict)."""
        return {name for name in dict.fromkeys(names) if await self._supports(name)}

    async def _supports(self, name: str) -> bool:
        now = time.monotonic()
        cached = self._known.get(name)
        if cached is not None and now - cached[0] < self._ttl_s:
            self._known.move_to_end(name)
            return cached[1]
        try:
            node = await self._get_node(name)
        except BridgeError as error:
            log.warning("node.features_unreadable", node=name, error=str(error))
            return False
        features = (node.get("status") or {}).get("features") or {}
        supported = features.get("supplementalGroupsPolicy") is True
        self._known[name] = (now, supported)
        self._known.move_to_end(name)
        while len(self._known) > self._max_nodes:
            self._known.popitem(last=False)
        return supported
