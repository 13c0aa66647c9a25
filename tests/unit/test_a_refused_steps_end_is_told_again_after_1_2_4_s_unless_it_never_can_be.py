"""A step the daemon refuses still has to end for the script's srun (else it waits for ever): the
daemon tells it (`agent step-done`) and, when that fails, tells it again after 1, 2 and 4 s, four
tries in all. A failure that can never pass (the pod is gone) stops the tries at once."""

from __future__ import annotations

import pytest

from bridge.clients.kube.errors import KubeNotFound
from bridge.controller import steps as controller_steps
from bridge.controller.reconcile import Reconciler
from bridge.core.errors import BridgeError, KubeUnavailable

from .test_srun_steps_cannot_put_user_code_on_the_slurmd_host import AGENT, Log, _reconciler, _step_event


class Waits:
    """Stands in for the steps module's sleep: records each wait, waits for none."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.seconds.append(seconds)


def _refuse_a_step_whose_end_fails(
    monkeypatch: pytest.MonkeyPatch, failure: BridgeError,
) -> tuple[Reconciler, list[list[str]], Waits, Log]:
    waits = Waits()
    monkeypatch.setattr(controller_steps, "_sleep", waits)
    reconciler, kube = _reconciler(None)  # no step key: every step is refused
    tries: list[list[str]] = []

    async def failing(pod: str, command: list[str]) -> int:
        tries.append(list(command))
        raise failure

    kube.exec_in_pod = failing  # type: ignore[method-assign]
    log = Log()
    reconciler.steps.register(reconciler.sessions.open(42, 0), _step_event(3), log)
    return reconciler, tries, waits, log


async def _background_done(reconciler: Reconciler) -> None:
    for task in list(reconciler._background):
        await task


async def test_a_refused_steps_end_is_told_four_times_after_1_2_and_4_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reconciler, tries, waits, log = _refuse_a_step_whose_end_fails(
        monkeypatch, KubeUnavailable("cannot exec in pod slurm-42-0: 500"))
    await _background_done(reconciler)

    assert len(tries) == 4
    assert tries == [[AGENT, "step-done", "3", "1"]] * 4
    assert waits.seconds == [1, 2, 4]
    assert [event for level, event, _ in log.events if level == "warning"][-1] == "step.done_not_told"


async def test_a_refused_steps_end_that_can_never_be_told_is_tried_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reconciler, tries, waits, log = _refuse_a_step_whose_end_fails(
        monkeypatch, KubeNotFound("pods slurm-42-0 not found", status=404, reason="NotFound", what="exec"))
    await _background_done(reconciler)

    assert len(tries) == 1
    assert tries == [[AGENT, "step-done", "3", "1"]]
    assert waits.seconds == []
    assert [event for level, event, _ in log.events if level == "warning"][-1] == "step.done_not_told"
