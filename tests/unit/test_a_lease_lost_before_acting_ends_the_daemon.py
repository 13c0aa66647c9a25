"""Measured on the sandbox under a 300-task array: the daemon won the Lease, lost it while its
caches were still syncing, and then neither acted nor exited (it waited for "synced and leading"
for ever), so its supervisor never restarted it. Whatever ends a daemon that acts must end one
that has not started acting yet too."""

from __future__ import annotations

import asyncio

from bridge.manager.daemon import act_until_an_end


async def test_a_lease_lost_while_syncing_ends_the_wait_without_acting() -> None:
    synced_and_leading = asyncio.ensure_future(asyncio.Event().wait())  # the caches never sync
    lost = asyncio.Event()
    lease_lost = asyncio.ensure_future(lost.wait())
    acted: list[bool] = []

    asyncio.get_running_loop().call_later(0.05, lost.set)
    done = await asyncio.wait_for(
        act_until_an_end(synced_and_leading, {lease_lost}, lambda: acted.append(True)), timeout=10)
    synced_and_leading.cancel()

    assert done == {lease_lost}
    assert acted == []


async def test_once_it_may_act_it_acts_until_an_end_comes() -> None:
    ready = asyncio.Event()
    can_act = asyncio.ensure_future(ready.wait())
    stop = asyncio.Event()
    stopped = asyncio.ensure_future(stop.wait())
    acted: list[bool] = []

    def start_acting() -> None:
        acted.append(True)
        asyncio.get_running_loop().call_later(0.05, stop.set)

    ready.set()
    done = await asyncio.wait_for(act_until_an_end(can_act, {stopped}, start_acting), timeout=10)

    assert acted == [True]
    assert done == {stopped}
