"""Issue 8, cause 6: a leader whose renewal hangs (a GET or PUT can take 30 s) must stop acting
when its renew deadline is over, not when the request finally returns; and the elector talks to
the API server through a client of its own."""

from __future__ import annotations

import asyncio
import copy
import time
from typing import Any

import pytest

from bridge.clients.kube.errors import KubeNotFound
from bridge.manager import daemon, leader
from bridge.manager.leader import LeaderElector, LeaseSettings

from .builders import config

SETTINGS = LeaseSettings(
    namespace="ns", name="lease", identity="me",
    lease_duration_s=1.5, renew_deadline_s=0.5, retry_period_s=0.05,
)


class LeaseApi:
    """request_json for one Lease; `hang` makes every request after the first few never answer."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.hang = asyncio.Event()
        self.requests = 0

    async def __call__(self, _api: Any, method: str, path: str, what: str, *, body: Any = None,
                       **_: Any) -> dict[str, Any]:
        self.requests += 1
        if self.hang.is_set():
            await asyncio.sleep(30)  # the request timeout of the shared client
        if method == "GET":
            if self.lease is None:
                raise KubeNotFound("no lease", status=404, reason="NotFound", what=what)
            return copy.deepcopy(self.lease)
        self.lease = copy.deepcopy(body)
        return copy.deepcopy(body)


async def test_a_renewal_that_hangs_loses_leadership_at_the_renew_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api = LeaseApi()
    monkeypatch.setattr(leader, "request_json", api)
    elector = LeaderElector(object(), SETTINGS)  # type: ignore[arg-type]
    task = asyncio.create_task(elector.run())
    async with asyncio.timeout(2):
        await elector.is_leader.wait()
    await asyncio.sleep(0.2)  # a few renewals

    api.hang.set()
    hung_at = time.monotonic()
    async with asyncio.timeout(5):
        await elector.lost.wait()
    stopped_after = time.monotonic() - hung_at

    assert not elector.is_leader.is_set()
    assert stopped_after <= SETTINGS.renew_deadline_s + 0.2, (
        f"acted {stopped_after:.2f}s after its renewals hung; the deadline is {SETTINGS.renew_deadline_s}s"
    )
    assert stopped_after < SETTINGS.lease_duration_s, "a standby may have taken over meanwhile"
    await asyncio.wait_for(task, 1)


async def test_the_elector_gets_an_api_client_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[dict[str, Any]] = []

    class Client:
        closed = False

        async def close(self) -> None:
            self.closed = True

    async def make_api_client(kubeconfig: str | None, **kwargs: Any) -> Client:
        made.append(kwargs)
        return Client()

    monkeypatch.setattr(daemon, "make_api_client", make_api_client)

    elector = await daemon.make_elector(config())
    await elector.close()

    assert len(made) == 1 and made[0]["max_connections"] == daemon.LEADER_CONNECTIONS
    assert elector._api.closed  # type: ignore[attr-defined]
