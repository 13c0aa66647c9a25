"""A task's signal goes to its pod by an exec of the agent. An exec that could not start (the
kubelet's 500 under load, the runtime failing to start it) ran nothing and is tried again; one
whose agent ran and said why (the task has ended), one that may have run (it timed out) and one
refused for good are not: the signal would reach the task twice, or a retry cannot help."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from bridge.clients.kube.errors import KubeNotFound
from bridge.controller import tasks as tasks_module
from bridge.controller.tasks import Tasks
from bridge.core.agent_protocol import EXIT_NOT_STARTED
from bridge.core.errors import BridgeError, ExecCommandFailed, ExecNotStarted, ExecOutcomeUnknown

USR1 = int(signal.SIGUSR1)
PIDFILE = "/run/task.pid"


class FailingAgent:
    """Every exec in the pod fails with `failure`; counts them."""

    def __init__(self, failure: BridgeError) -> None:
        self.failure = failure
        self.execs = 0

    async def exec_in_pod(self, pod: str, command: list[str]) -> str:
        self.execs += 1
        raise self.failure


class NoSteps:
    def step_of(self, job_id: int, key: str) -> dict[str, Any] | None:
        return None


@pytest.fixture(autouse=True)
def _no_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    async def no_wait(_seconds: float) -> None:
        pass

    monkeypatch.setattr(tasks_module, "_sleep", no_wait)


async def test_a_signal_whose_agent_ran_and_said_why_is_not_sent_again() -> None:
    output = "slurm-k8s-bridge-agent: no such process\n"
    agent = FailingAgent(ExecCommandFailed(f"exited {EXIT_NOT_STARTED}: {output}", EXIT_NOT_STARTED, output))

    await Tasks(agent, NoSteps()).signal("slurm-42-0", PIDFILE, USR1)  # type: ignore[arg-type]

    assert agent.execs == 1


@pytest.mark.parametrize("failure", [
    ExecOutcomeUnknown("exec in pod slurm-42-0 did not answer"),
    KubeNotFound("pods slurm-42-0 not found", status=404, reason="NotFound", what="exec"),
], ids=["may-have-run", "refused-for-good"])
async def test_a_signal_that_may_have_been_sent_or_never_can_be_is_not_sent_again(
    failure: BridgeError,
) -> None:
    agent = FailingAgent(failure)

    with pytest.raises(type(failure)):
        await Tasks(agent, NoSteps()).signal("slurm-42-0", PIDFILE, USR1)  # type: ignore[arg-type]

    assert agent.execs == 1


@pytest.mark.parametrize("failure", [
    ExecNotStarted("cannot exec in pod slurm-42-0: 500, message='Invalid response status'"),
    ExecCommandFailed("exited 1: OCI runtime exec failed", 1, "", ran=False),
], ids=["kubelet-refused", "runtime-failed"])
async def test_a_signal_whose_exec_never_ran_is_tried_the_allowed_times(failure: BridgeError) -> None:
    agent = FailingAgent(failure)

    with pytest.raises(type(failure)):
        await Tasks(agent, NoSteps()).signal("slurm-42-0", PIDFILE, USR1)  # type: ignore[arg-type]

    assert agent.execs == tasks_module.TASK_SIGNAL_TRIES
