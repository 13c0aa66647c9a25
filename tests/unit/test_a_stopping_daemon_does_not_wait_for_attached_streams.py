"""A daemon that lost its Lease stops, and its supervisor starts a fresh one. Measured on the
sandbox: with waiters attached, aiohttp's default shutdown (60 s for the handlers to end, then
60 s more once cancelled) kept the old daemon for 122 s. The API runner cancels open streams
after API_SHUTDOWN_S instead."""

from __future__ import annotations

import asyncio

from aiohttp import ClientSession, web

from bridge.manager import daemon


async def test_cleanup_cancels_a_stream_that_would_never_end() -> None:
    handler_cancelled = asyncio.Event()
    streaming = asyncio.Event()

    async def attach(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(b"attached\n")
        streaming.set()
        try:
            await asyncio.Event().wait()  # an attached waiter's stream: ends only with its job
        except asyncio.CancelledError:
            handler_cancelled.set()
            raise
        return response

    app = web.Application()
    app.router.add_get("/attach", attach)
    runner = daemon.api_runner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    async with ClientSession() as client:
        response = await client.get(f"http://127.0.0.1:{port}/attach")
        await streaming.wait()
        # The bound only catches a hang; the default shutdown takes 120 s here.
        await asyncio.wait_for(runner.cleanup(), timeout=30)
        response.close()

    assert handler_cancelled.is_set()


async def test_work_handed_off_by_cancelled_handlers_finishes_before_the_clients_close() -> None:
    """A task's handler cancelled by the shutdown hands the kill of its task (an exec in the pod)
    to the background; the daemon waits for it (bounded) before it closes its Kubernetes clients,
    else the task runs on in its pod (found by a review)."""
    from bridge.controller.tasks import Tasks
    from bridge.manager.api import Api

    api = Api.__new__(Api)
    api.tasks = Tasks(None, None)  # type: ignore[arg-type]
    killed: list[str] = []

    async def kill_task() -> None:
        await asyncio.sleep(0.05)
        killed.append("slurm-42-1")

    api.tasks._in_background(kill_task())
    api.tasks._in_background(asyncio.Event().wait())  # one that never ends

    left = await asyncio.wait_for(api.finish_background(0.5), timeout=10)

    assert killed == ["slurm-42-1"]
    assert left == 1
