"""controller-runtime's contract: a reconcile pass returns Result{RequeueAfter} and the worker, not
the reconciler, schedules the next look; a failed pass backs off as before; a pass that wants
nothing later is not looked at again unless an event comes."""

from __future__ import annotations

import asyncio

import pytest

from bridge.controller.workqueue import BACKOFF_S, DONE, Result, WorkQueue


def test_the_sooner_of_two_wishes_wins() -> None:
    assert DONE.requeue_after is None
    assert DONE.sooner(None) == DONE
    assert DONE.sooner(5.0) == Result(5.0)
    assert Result(5.0).sooner(1.0) == Result(1.0)
    assert Result(1.0).sooner(5.0) == Result(1.0)
    assert Result(1.0).sooner(None) == Result(1.0)


async def _passes(
    results: list[Result | Exception | None], run_for_s: float, asked: list[float] | None = None,
) -> list[float]:
    """Run one worker over key 7, whose passes answer `results` in turn; when each pass ran, and
    into `asked` the delays the worker asked the queue for (the pass's wish, or its backoff)."""
    queue: WorkQueue[int] = WorkQueue()
    loop = asyncio.get_running_loop()
    started = loop.time()
    ran: list[float] = []
    add_after = queue.add_after

    def add_after_noted(key: int, delay_s: float) -> None:
        if asked is not None:
            asked.append(delay_s)
        add_after(key, delay_s)

    queue.add_after = add_after_noted  # type: ignore[method-assign]

    async def reconcile(_key: int) -> Result | None:
        ran.append(loop.time() - started)
        answer = results[min(len(ran), len(results)) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer

    worker = asyncio.ensure_future(queue.run_worker(reconcile))
    queue.add(7)
    await asyncio.sleep(run_for_s)
    worker.cancel()
    with pytest.raises(asyncio.CancelledError):
        await worker
    return ran


async def test_a_pass_that_asks_is_run_again_after_its_delay() -> None:
    asked: list[float] = []
    ran = await _passes([Result(0.2), DONE], run_for_s=0.6, asked=asked)

    # The delay asked for, not the time it took: a loaded machine (CI) runs the pass late.
    assert asked == [0.2]
    assert len(ran) == 2, ran
    assert ran[1] - ran[0] >= 0.19


async def test_a_pass_that_asks_nothing_is_not_run_again() -> None:
    ran = await _passes([DONE], run_for_s=0.3)

    assert len(ran) == 1


async def test_a_failed_pass_backs_off_whatever_it_would_have_asked() -> None:
    asked: list[float] = []
    ran = await _passes([RuntimeError("the API server went away"), DONE], run_for_s=0.3, asked=asked)

    # CI, loaded: the second pass ran 0.18 s after the first, its backoff asked for 0.05 s.
    assert asked == [BACKOFF_S[0]]
    assert len(ran) == 2, ran
    assert ran[1] - ran[0] >= BACKOFF_S[0] - 0.01


# -- the daemon's one retry of its own: the leader's pod label ------------------------------------
async def test_marking_the_leaders_pod_is_tried_until_it_is_done(monkeypatch: pytest.MonkeyPatch) -> None:
    from bridge.core.errors import KubeUnavailable
    from bridge.manager import daemon

    slept: list[float] = []
    real_sleep = asyncio.sleep

    async def quick(delay: float) -> None:
        slept.append(delay)
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", quick)
    tries: list[int] = []

    async def mark() -> None:
        tries.append(1)
        if len(tries) < 3:
            raise KubeUnavailable("the API server went away")

    await daemon._until_done(mark, "leader_pod.mark", delay_s=1.5)

    assert len(tries) == 3
    assert slept == [1.5, 1.5]


async def test_marking_the_leaders_pod_stops_at_an_error_that_is_not_the_bridges() -> None:
    from bridge.manager import daemon

    async def broken() -> None:
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError):
        await daemon._until_done(broken, "leader_pod.mark")
