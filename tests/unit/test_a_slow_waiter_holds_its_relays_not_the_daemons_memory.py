"""Issue 11, item 4: a waiter's queue of output is bounded. A waiter that reads slowly makes its
log relays wait (their lines wait in the node's container log), while the daemon's memory stays
flat; the exit and other control events always get in."""

from __future__ import annotations

import asyncio

from bridge.controller.sessions import EventQueue, JobSession


async def test_output_waits_for_room_and_goes_on_once_the_waiter_reads() -> None:
    session = JobSession(42)
    queue = session.attach({})
    assert isinstance(queue, EventQueue)
    small = EventQueue(output_limit=3)
    session.listener = small

    async def relay() -> None:
        for i in range(10):
            await session.publish_output({"type": "out", "n": i})

    task = asyncio.ensure_future(relay())
    await asyncio.sleep(0.05)
    assert small.qsize() == 3 and not task.done(), "the relay waits once the waiter is 3 behind"
    session.publish({"type": "message", "text": "always in"})
    assert small.qsize() == 4

    got = []
    while len(got) < 11:
        got.append(await asyncio.wait_for(small.get(), 1))
    await asyncio.wait_for(task, 1)

    assert [e["n"] for e in got if e["type"] == "out"] == list(range(10)), "nothing lost, in order"
    assert {"type": "message", "text": "always in"} in got


async def test_a_detached_session_takes_no_output() -> None:
    session = JobSession(42)
    await asyncio.wait_for(session.publish_output({"type": "out"}), 1)
    assert session.listener is None
