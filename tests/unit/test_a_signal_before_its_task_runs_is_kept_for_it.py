"""Slurm signals a step's tasks as soon as the step exists (--signal=SIG@TIME is sent up to
PeriodicTimeout early, scancel -s SIG). A bridged task's proxy exists before its run in the pod
begins (munge, the pod's exec): a signal that reaches the proxy in that gap is kept by the daemon
and delivered once the task runs, not lost with a 503 from an agent that has no pid file yet."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from bridge.controller import tasks as tasks_module
from bridge.controller.metrics import Metrics
from bridge.controller.step_streams import StepStreams
from bridge.controller.tasks import Tasks
from bridge.core.agent_protocol import EXIT_NOT_STARTED, task_pidfile
from bridge.core.errors import ExecCommandFailed, KubeUnavailable
from bridge.core.model import JobAllocation
from bridge.core.waiter_protocol import request_digest
from bridge.manager.api import Api

from .builders import allocation, config
from .waiter_runs import go_constants

UNMUNGE_OK = (
    "import sys\nsys.stdout.write('UID: alice (1000)\\nGID: users (100)\\n\\n' + sys.stdin.read())\n"
)
STEP = {"argv": ["--", "sh", "-c", "sleep 100"], "env": {}, "cwd": "/home/alice"}
USR1 = int(signal.SIGUSR1)


class AgentInPod:
    """The pod's agent as the daemon sees it through exec: `signal` fails for a task whose pid
    file does not exist yet (the real agent's answer), and a task runs until it is signalled."""

    def __init__(self, failing_execs: int = 0, failure: Exception | None = None) -> None:
        self.running: set[str] = set()
        self.signalled: list[tuple[str, int]] = []
        self.signalled_in: list[str] = []
        self.got_signal = asyncio.Event()
        self.failing_execs = failing_execs
        self.failure = failure

    async def exec_in_pod(self, pod: str, command: list[str]) -> str:
        pidfile, signum = command[2], int(command[3])
        if self.failing_execs:
            self.failing_execs -= 1  # the kubelet (or the runtime) under load, before the command ran
            raise self.failure or KubeUnavailable(
                f"cannot exec in pod {pod}: 500, message='Invalid response status'")
        if pidfile not in self.running:
            output = f"slurm-k8s-bridge-agent: the script has not started: {pidfile}\n"
            raise ExecCommandFailed(f"exited {EXIT_NOT_STARTED}: {output}", EXIT_NOT_STARTED, output)
        self.signalled.append((pidfile, signum))
        self.signalled_in.append(pod)
        self.got_signal.set()
        return ""

    async def exec_stream(
        self, pod: str, command: list[str], terminal: object = None, stdin: object = None,
        feed: object = None,
    ) -> AsyncIterator[tuple[int, bytes]]:
        self.running.add(command[2])
        await asyncio.wait_for(self.got_signal.wait(), timeout=10)
        yield 1, b"task got usr1\n"
        yield 0, b"0"


class Reconciler:
    """The controller as the API sees it (controller.facade), with the real task subsystems."""

    def __init__(self, kube: AgentInPod) -> None:
        self.cfg = config()
        self.tasks = Tasks(kube, self)  # type: ignore[arg-type]
        self.step_streams = StepStreams(kube, self)  # type: ignore[arg-type]
        self.current_pod: str | None = "slurm-42-0"
        """The current run's pod on kube1: a requeue moves Slurm's record on to the next run."""

    async def read_job(self, job_id: int) -> JobAllocation:
        return allocation(job_id=job_id)

    def record_job(self, _alloc: JobAllocation) -> None:
        pass

    def is_bridged(self, _alloc: JobAllocation) -> bool:
        return True

    def step_of(self, _job_id: int, key: str) -> dict[str, Any] | None:
        return STEP if key == "7" else None

    def task_pod(self, job_id: int, node: str) -> str | None:
        return self.current_pod if node == "kube1" else None

    def spools_tasks(self, _job_id: int, _pod: str) -> bool:
        return False  # the stream of an agent that spools is not what these tests look at

    def node_gpus(self, _job_id: int, _node: str) -> tuple[int, ...] | None:
        return ()

    async def commands_answered(self, _job_id: int, _key: str) -> None:
        """No Slurm command of the run awaits its answer here."""


async def _post(client: TestClient, path: str, body: dict[str, Any]) -> tuple[int, str]:
    raw = json.dumps(body).encode()
    credential = request_digest("POST", path, int(path.split("/")[3]), raw)
    response = await client.post(path, data=raw, headers={"X-Munge-Credential": credential})
    return response.status, await response.text()


async def _served(tmp_path: Path, kube: AgentInPod, reconciler: Reconciler | None = None) -> TestClient:
    script = tmp_path / "unmunge.py"
    script.write_text(UNMUNGE_OK)
    api = Api(reconciler or Reconciler(kube), Metrics(), lambda _: None, lambda: True,  # type: ignore[arg-type]
              (sys.executable, str(script)))
    return TestClient(TestServer(api.app()))


async def test_a_signal_that_reaches_the_proxy_first_is_delivered_when_the_task_runs(tmp_path: Path) -> None:
    kube = AgentInPod()
    async with await _served(tmp_path, kube) as client:
        kept = await _post(client, "/v1/jobs/42/task-signal",
                           {"key": "7", "procid": "0", "node": "kube1", "signal": USR1})
        status, text = await _post(client, "/v1/jobs/42/task",
                                   {"key": "7", "node": "kube1", "env": {"SLURM_PROCID": "0"}})

    assert kept[0] == 202, kept
    assert status == 200, text
    assert kube.signalled == [(task_pidfile("7", "0"), USR1)]
    lines = [json.loads(line) for line in text.splitlines()]
    assert lines[-1] == {"exit": 0}


async def test_a_signal_to_a_running_task_goes_straight_to_it(tmp_path: Path) -> None:
    kube = AgentInPod()
    async with await _served(tmp_path, kube) as client:
        run = asyncio.ensure_future(_post(client, "/v1/jobs/42/task",
                                          {"key": "7", "node": "kube1", "env": {"SLURM_PROCID": "0"}}))
        while task_pidfile("7", "0") not in kube.running:
            await asyncio.sleep(0.01)
        sent = await _post(client, "/v1/jobs/42/task-signal",
                           {"key": "7", "procid": "0", "node": "kube1", "signal": USR1})
        status, _ = await run

    assert sent[0] == 200, sent
    assert status == 200
    assert kube.signalled == [(task_pidfile("7", "0"), USR1)]


@pytest.mark.parametrize("next_pod", [None, "slurm-42-r1-0"], ids=["no-pod-yet", "next-runs-pod"])
async def test_a_task_whose_run_a_requeue_ended_gets_its_signal_in_its_own_pod(
    tmp_path: Path, next_pod: str | None
) -> None:
    # `scontrol requeue` from a task: Slurm's record moves on to run 1 at once, then slurmstepd
    # sends run 0's tasks their TERM. Natively the task's trap runs; the bridge once looked for
    # the task's pod in the current run, refused the signal ("no pod on node"), and the task was
    # killed when its pod's grace ended (0:9 in sacct, where native shows the trap's exit).
    kube = AgentInPod()
    reconciler = Reconciler(kube)
    async with await _served(tmp_path, kube, reconciler) as client:
        run = asyncio.ensure_future(_post(client, "/v1/jobs/42/task",
                                          {"key": "7", "node": "kube1", "env": {"SLURM_PROCID": "0"}}))
        while task_pidfile("7", "0") not in kube.running:
            await asyncio.sleep(0.01)
        reconciler.current_pod = next_pod
        sent = await _post(client, "/v1/jobs/42/task-signal",
                           {"key": "7", "procid": "0", "node": "kube1", "signal": int(signal.SIGTERM)})
        status, _ = await run

    assert sent[0] == 200, sent
    assert status == 200
    assert kube.signalled_in == ["slurm-42-0"]


RUNTIME_FAILED = ExecCommandFailed("exited 1: OCI runtime exec failed", 1, "", ran=False)


@pytest.mark.parametrize("failure", [None, RUNTIME_FAILED], ids=["kubelet-500", "runtime-failed"])
@pytest.mark.parametrize("early", [True, False])
async def test_a_task_signal_whose_exec_failed_before_it_ran_is_tried_again(
    tmp_path: Path, monkeypatch: Any, early: bool, failure: Exception | None
) -> None:
    monkeypatch.setattr(tasks_module, "TASK_SIGNAL_RETRY_S", 0.01)
    kube = AgentInPod(failing_execs=2, failure=failure)
    async with await _served(tmp_path, kube) as client:
        if early:
            await _post(client, "/v1/jobs/42/task-signal",
                        {"key": "7", "procid": "0", "node": "kube1", "signal": USR1})
        run = asyncio.ensure_future(_post(client, "/v1/jobs/42/task",
                                          {"key": "7", "node": "kube1", "env": {"SLURM_PROCID": "0"}}))
        while task_pidfile("7", "0") not in kube.running:
            await asyncio.sleep(0.01)
        sent = (None,) if early else await _post(
            client, "/v1/jobs/42/task-signal", {"key": "7", "procid": "0", "node": "kube1", "signal": USR1})
        status, _ = await run

    assert status == 200
    assert early or sent[0] == 200, sent
    assert kube.signalled == [(task_pidfile("7", "0"), USR1)]


async def test_signals_kept_for_tasks_that_never_run_are_bounded(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(tasks_module, "MAX_TASKS_WITH_EARLY_SIGNALS", 3)
    kube = AgentInPod()
    async with await _served(tmp_path, kube) as client:
        answers = [await _post(client, "/v1/jobs/42/task-signal",
                               {"key": "7", "procid": str(procid), "node": "kube1", "signal": USR1})
                   for procid in range(4)]

    assert [status for status, _ in answers] == [202, 202, 202, 503]
    assert "too many signals" in answers[-1][1]


async def test_one_jobs_flood_of_kept_signals_does_not_take_another_jobs_place(
    tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setattr(tasks_module, "EARLY_SIGNAL_TASKS_PER_JOB", 2)
    kube = AgentInPod()
    async with await _served(tmp_path, kube) as client:
        flood = [await _post(client, "/v1/jobs/42/task-signal",
                             {"key": "7", "procid": str(procid), "node": "kube1", "signal": USR1})
                 for procid in range(3)]
        other = await _post(client, "/v1/jobs/43/task-signal",
                            {"key": "7", "procid": "0", "node": "kube1", "signal": USR1})
        too_long = await _post(client, "/v1/jobs/43/task-signal",
                               {"key": "7", "procid": "1" * 12, "node": "kube1", "signal": USR1})

    assert [status for status, _ in flood] == [202, 202, 503]
    assert other[0] == 202
    assert too_long[0] == 400


def test_a_proxy_waits_longer_for_its_answer_than_the_daemon_may_take_to_give_it(tmp_path: Path) -> None:
    """A proxy that gave up first would ask again while the first delivery still runs, and the
    task could get the signal twice. The proxy is the compiled waiter's (agent/internal/waiter/task.go)."""
    from bridge.clients.kube.pod_exec import EXEC_TIMEOUT_S

    constants = go_constants(tmp_path, "TestSignalConstantsDump", "WAITER_SIGNAL_CONSTANTS_OUT")
    proxy_timeout_s = constants["task_signal_timeout_s"]
    assert isinstance(proxy_timeout_s, int | float)

    pauses = sum(tasks_module.TASK_SIGNAL_RETRY_S * 2 ** attempt
                 for attempt in range(tasks_module.TASK_SIGNAL_TRIES - 1))
    assert tasks_module.TASK_SIGNAL_TRIES * EXEC_TIMEOUT_S + pauses < proxy_timeout_s


def test_one_users_kept_signals_are_bounded_across_their_jobs(monkeypatch: Any) -> None:
    """A user with many jobs, each under the per-job quota, still may not take everybody's place."""
    monkeypatch.setattr(tasks_module, "EARLY_SIGNAL_TASKS_PER_USER", 3)
    tasks = Tasks(AgentInPod(), Reconciler(AgentInPod()))  # type: ignore[arg-type]
    alice, bob = 1000, 1001

    alices = [tasks.keep_early_signal((job_id, "7", "0"), USR1, alice) for job_id in (42, 43, 44, 45)]
    bobs = tasks.keep_early_signal((46, "7", "0"), USR1, bob)
    again = tasks.keep_early_signal((42, "7", "0"), USR1, alice)  # a task already kept for: room for it

    assert alices == [True, True, True, False]
    assert bobs and again


class _QuickTask:
    """A task that ends at once; the signals sent into the pod are recorded."""

    def __init__(self) -> None:
        self.signalled: list[list[str]] = []

    async def exec_in_pod(self, pod: str, command: list[str]) -> str:
        self.signalled.append(command)
        return ""

    async def exec_stream(
        self, pod: str, command: list[str], terminal: object = None, stdin: object = None,
        feed: object = None,
    ) -> AsyncIterator[tuple[int, bytes]]:
        yield 0, b"0"


async def test_a_signal_kept_for_a_requeued_runs_task_does_not_reach_the_next_runs() -> None:
    # Step keys start again at 1 in each run: a TERM kept for run 0's task 1.0 (its proxy got it
    # before its run in the pod began, then the requeue ended that run) must not be delivered to
    # run 1's task 1.0 when it starts.
    kube = _QuickTask()
    tasks = Tasks(kube, Reconciler(kube))  # type: ignore[arg-type]
    assert tasks.keep_early_signal((42, "1", "0"), int(signal.SIGTERM), 1000)
    tasks.forget_job(42)  # run 0's session ended
    code = await tasks.run((42, "1", "0"), "slurm-42-r1-0", ["agent", "task"],
                           lambda _fd, _data: asyncio.sleep(0))
    await tasks.finish_background(5)
    assert code == b"0"
    assert kube.signalled == []
