"""Leader election on a coordination.k8s.io Lease, so that of several replicas only one acts.

The algorithm is client-go's: a candidate takes the Lease when it is free or when its record
has not changed for `lease_duration_s` as seen on the candidate's own clock (so clock skew
between replicas does not matter); the holder renews every `retry_period_s`; a holder that
could not renew for `renew_deadline_s` (< lease_duration_s) stops acting before anybody else
may take over. The Lease's resourceVersion makes every write a compare-and-swap.

Every attempt (its GET and its PUT together) is bounded by the renew deadline that is left, so a
slow API server cannot keep an old leader acting after a standby may have taken over: the
attempt is abandoned and leadership given up at the deadline. A renewal counts from when its
attempt began (the Lease may have been written any time after that). The elector has an API
client of its own (bridge.manager.daemon.make_elector), so its requests never queue behind the pod
watch and the log streams.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog
from kubernetes_asyncio.client import ApiClient

from bridge.clients.kube.client import request_json
from bridge.clients.kube.errors import KubeConflict, KubeNotFound
from bridge.core.errors import BridgeError

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class LeaseSettings:
    namespace: str
    name: str
    identity: str
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0


def _now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(self, api: ApiClient, settings: LeaseSettings, *, owns_client: bool = False) -> None:
        self._api = api
        self._owns_client = owns_client
        self.settings = settings
        self._path = f"/apis/coordination.k8s.io/v1/namespaces/{settings.namespace}/leases"
        self._observed: tuple[str | None, str | None] = (None, None)  # (holder, renewTime)
        self._observed_at = 0.0
        self._last_renew = 0.0
        self.is_leader = asyncio.Event()
        self.lost = asyncio.Event()
        self.transitions = 0

    # -- one attempt ------------------------------------------------------------
    async def try_acquire_or_renew(self) -> bool:
        """One compare-and-swap round; True when we hold the Lease afterwards."""
        s = self.settings
        what = f"take the Lease {s.namespace}/{s.name}"
        try:
            lease = await request_json(self._api, "GET", f"{self._path}/{s.name}", what)
        except KubeNotFound:
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": s.name, "namespace": s.namespace}, "spec": self._spec(0)}
            try:
                await request_json(self._api, "POST", self._path, what, body=body)
            except KubeConflict:
                return False  # somebody else created it first
            return True
        spec = lease.get("spec") or {}
        holder, renewed = spec.get("holderIdentity"), spec.get("renewTime")
        now = time.monotonic()
        if (holder, renewed) != self._observed:
            self._observed, self._observed_at = (holder, renewed), now
        mine = holder == s.identity
        expired = now - self._observed_at >= float(spec.get("leaseDurationSeconds") or s.lease_duration_s)
        if holder and not mine and not expired:
            return False
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if mine else 1)
        lease["spec"] = self._spec(transitions, keep_acquire=spec.get("acquireTime") if mine else None)
        try:
            await request_json(self._api, "PUT", f"{self._path}/{s.name}", what, body=lease)
        except KubeConflict:
            return False  # changed under us: someone else renewed or took it
        return True

    def _spec(self, transitions: int, keep_acquire: str | None = None) -> dict[str, Any]:
        now = _now_micro()
        return {
            "holderIdentity": self.settings.identity,
            "leaseDurationSeconds": int(self.settings.lease_duration_s),
            "acquireTime": keep_acquire or now,
            "renewTime": now,
            "leaseTransitions": transitions,
        }

    # -- the loop ---------------------------------------------------------------
    async def run(self) -> None:
        """Campaign until leader, then renew; set `lost` (and return) when leadership is lost."""
        s = self.settings
        bound = log.bind(lease=f"{s.namespace}/{s.name}", identity=s.identity)
        while True:
            started = time.monotonic()
            # A leader may spend only what is left of its renew deadline; a candidate the deadline.
            budget = s.renew_deadline_s
            if self.is_leader.is_set():
                budget -= started - self._last_renew
            try:
                async with asyncio.timeout(max(budget, 0.0)):
                    held = await self.try_acquire_or_renew()
            except TimeoutError:
                held = False
                bound.warning("leader.attempt_timed_out", budget_s=round(budget, 2))
            except BridgeError as error:
                held = False
                bound.warning("leader.renew_failed", error=str(error))
            now = time.monotonic()
            if held:
                self._last_renew = started
                if not self.is_leader.is_set():
                    self.transitions += 1
                    bound.info("leader.acquired")
                    self.is_leader.set()
            elif self.is_leader.is_set():
                taken = self._observed[0] not in (None, s.identity)
                if taken or now - self._last_renew >= s.renew_deadline_s:
                    # Stop acting before anyone else may start (renew_deadline < lease duration).
                    bound.error("leader.lost", taken_by=self._observed[0] if taken else None,
                                since_last_renew_s=round(now - self._last_renew, 1))
                    self.is_leader.clear()
                    self.lost.set()
                    return
            await asyncio.sleep(s.retry_period_s)

    async def close(self) -> None:
        """Close the API client, if it is the elector's own."""
        if self._owns_client:
            await self._api.close()

    async def release(self) -> None:
        """On clean shutdown, hand the Lease back so a standby takes over at once."""
        if not self.is_leader.is_set():
            return
        s = self.settings
        what = f"release the Lease {s.namespace}/{s.name}"
        try:
            lease = await request_json(self._api, "GET", f"{self._path}/{s.name}", what)
            if (lease.get("spec") or {}).get("holderIdentity") != s.identity:
                return
            lease["spec"]["holderIdentity"] = None
            lease["spec"]["leaseDurationSeconds"] = 1
            await request_json(self._api, "PUT", f"{self._path}/{s.name}", what, body=lease)
        except BridgeError as error:
            log.warning("leader.release_failed", error=str(error))
        self.is_leader.clear()
