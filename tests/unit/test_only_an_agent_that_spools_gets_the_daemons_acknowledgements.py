"""The daemon acknowledges on a task exec's stdin what it passed on ("a OUT ERR") only in a pod
whose agent spools step tasks' output (ANNOTATION_TASK_SPOOL, set on the pods this daemon makes).
An older agent, in a pod made before an upgrade, gives the exec's stdin to the task itself:
`srun cat` there read the daemon's lines and never saw its input end."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from bridge.controller.tasks import Tasks
from bridge.core import wellknown
from bridge.core.pod_view import pod_view


class RecordingKubelet:
    def __init__(self) -> None:
        self.feeds: list[object] = []

    async def exec_stream(
        self, pod: str, command: list[str], terminal: object = None, stdin: object = None,
        feed: object = None,
    ) -> AsyncIterator[tuple[int, bytes]]:
        self.feeds.append(feed)
        yield 1, b"out\n"
        yield 0, b"0"


class NoSteps:
    def step_of(self, job_id: int, key: str) -> dict[str, object] | None:
        return {"argv": ["true"]}


async def _run(spooled: bool) -> tuple[RecordingKubelet, list[tuple[int, bytes]]]:
    kubelet = RecordingKubelet()
    tasks = Tasks(kubelet, NoSteps())  # type: ignore[arg-type]
    written: list[tuple[int, bytes]] = []

    async def write(fd: int, data: bytes) -> None:
        written.append((fd, data))

    code = await tasks.run((42, "7", "0"), "slurm-42-0", ["agent", "task"], write, spooled=spooled)
    assert code == b"0"
    return kubelet, written


async def test_a_pod_whose_agent_spools_gets_them_first_of_all() -> None:
    kubelet, written = await _run(spooled=True)
    feed = kubelet.feeds[0]
    assert isinstance(feed, asyncio.Queue)
    assert written == [(1, b"out\n")]
    assert feed.get_nowait() == (0, b"a 4 0\n"), "the latest count replaced the first word"


async def test_an_older_agents_pod_gets_no_stdin_from_the_daemon() -> None:
    kubelet, written = await _run(spooled=False)
    assert kubelet.feeds == [None]
    assert written == [(1, b"out\n")]


def test_the_pods_this_daemon_makes_say_their_agent_spools() -> None:
    marked = {"metadata": {"name": "p", "annotations": {wellknown.ANNOTATION_TASK_SPOOL: "1"}}}
    older = {"metadata": {"name": "p", "annotations": {wellknown.ANNOTATION_OUTPUT: wellknown.OUTPUT_FRAMED}}}
    assert pod_view(marked).spools_tasks and not pod_view(older).spools_tasks
