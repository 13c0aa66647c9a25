"""The leader's sweep loops (payload Secrets, GPU claims): the first pass comes soon after acting
starts (a daemon restarted more often than the interval still sweeps), and no error ends it (what
they remove would pile up in etcd)."""

from __future__ import annotations

import asyncio

import pytest

from bridge.core.errors import KubeUnavailable
from bridge.manager import daemon


class Reconciler:
    def __init__(self) -> None:
        self.calls = 0

    async def sweep_payload_secrets(self, selector: str) -> int:
        self.calls += 1
        if self.calls == 1:
            raise KubeUnavailable("the API server is away")
        if self.calls == 2:
            raise RuntimeError("a bug")
        return 1


async def test_the_sweep_goes_on_after_any_error(monkeypatch: pytest.MonkeyPatch) -> None:
    reconciler = Reconciler()
    monkeypatch.setattr(daemon, "SECRET_SWEEP_FIRST_S", 0.01)
    sweep = daemon.sweep_now_and_then(
        lambda: reconciler.sweep_payload_secrets("sel"), "secret", interval_s=0.01)
    task = asyncio.create_task(sweep)
    async with asyncio.timeout(5):
        while reconciler.calls < 4:
            await asyncio.sleep(0.01)
    assert not task.done(), "the sweep loop ended"
    task.cancel()
