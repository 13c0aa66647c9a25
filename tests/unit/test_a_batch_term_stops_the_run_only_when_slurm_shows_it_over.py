"""slurmstepd sends the batch step SIGTERM when the run ends (scancel, the time limit, a requeue)
and for a mere signal (`scancel -b -s TERM`, `--signal=B:TERM@T`). Natively a script that traps
TERM goes on after the signal, and only the end kills it. The waiter cannot tell the two apart;
the daemon took every TERM for a cancel and deleted the run's pods. Now it stops the run only when
Slurm's view shows it over (slurmctld changes the job's state before it has it signalled, and the
waiter's request has just read the job), and otherwise delivers the TERM to the script as it does
any other batch signal."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from bridge.clients.kube.cache import PodCache
from bridge.controller.metrics import Metrics
from bridge.controller.reconcile import Reconciler
from bridge.core import agent_protocol, wellknown
from bridge.core.pod_identity import pod_name
from bridge.core.waiter_protocol import request_digest
from bridge.manager.api import Api

from .builders import NoSlurmJobs, RecordedExecs, RecordingKube, allocation, config, payload

STOP = agent_protocol.signal_command(wellknown.AGENT_RUN_PIDFILE, 15)


def _pod(run: int = 0) -> dict[str, Any]:
    return {
        "metadata": {
            "name": pod_name(42, 0, run), "namespace": "slurm-jobs", "uid": f"u{run}",
            "labels": {wellknown.LABEL_JOB_ID: "42", wellknown.LABEL_RUN: str(run)},
            "annotations": {wellknown.ANNOTATION_NODE_INDEX: "0",
                            wellknown.ANNOTATION_OUTPUT: wellknown.OUTPUT_FRAMED},
        },
        "spec": {"nodeName": "kube1"},
        "status": {"phase": "Running", "containerStatuses": [
            {"name": "job", "state": {"running": {"startedAt": "2026-12-06T10:00:00Z"}}}]},
    }


def _reconciler(state: str, run: int = 0) -> tuple[Reconciler, RecordedExecs]:
    """The store shows the job `state` in run `run`, as the request's identify just read it."""
    kube, cache = RecordedExecs(), PodCache()
    for pod_run in range(run + 1):
        cache.apply("ADDED", _pod(pod_run))
    reconciler = Reconciler(config(), NoSlurmJobs(), kube, cache, Metrics(), lambda _: None)  # type: ignore[arg-type]
    reconciler.jobs.record(allocation(state=state, run=run))
    return reconciler, kube


async def _terms(reconciler: Reconciler, times: int = 1, run: int | None = 0) -> list[str | None]:
    decisions = [reconciler.term_from_slurm(42, run) for _ in range(times)]
    await asyncio.sleep(0.05)  # the stop's exec, spawned
    return decisions


def test_a_term_for_a_job_slurm_shows_cancelled_stops_the_run() -> None:
    reconciler, kube = _reconciler("CANCELLED")
    reconciler.sessions.open(42, 0)
    assert asyncio.run(_terms(reconciler)) == ["stop"]
    session = reconciler.sessions.get(42, 0)
    assert session is not None and session.cancel_requested and not session.signals.pending
    assert kube.execs == [("slurm-42-0", STOP)]


def test_a_term_for_a_job_still_running_is_the_scripts_signal() -> None:
    # `scancel -s TERM -b`: the job goes on in Slurm; the script gets its TERM and may trap it.
    reconciler, kube = _reconciler("RUNNING")
    reconciler.sessions.open(42, 0)
    assert asyncio.run(_terms(reconciler)) == ["signal"]
    session = reconciler.sessions.get(42, 0)
    assert session is not None and not session.cancel_requested
    assert session.signals.pending == [15]
    assert kube.execs == []  # no stop of the agent: delivered to the script by the next reconcile


def test_a_timed_out_or_requeued_run_is_stopped() -> None:
    for state, run in (("TIMEOUT", 0), ("PENDING", 1)):
        reconciler, kube = _reconciler(state, run)
        reconciler.sessions.open(42, 0)
        assert asyncio.run(_terms(reconciler, run=0)) == ["stop"], state
        assert kube.execs == [("slurm-42-0", STOP)], state


def test_a_late_term_of_a_requeued_run_never_reaches_the_next_one() -> None:
    # Run 1's waiter attached already; run 0's waiter tells of the requeue's TERM late.
    reconciler, kube = _reconciler("RUNNING", run=1)
    reconciler.sessions.open(42, 0)
    running = reconciler.sessions.open(42, 1)
    assert asyncio.run(_terms(reconciler, run=0)) == ["stop"]
    assert not running.cancel_requested and not running.signals.pending
    assert kube.execs == [("slurm-42-0", STOP)]


def test_a_stale_restart_count_is_taken_for_the_current_run() -> None:
    reconciler, _ = _reconciler("RUNNING")
    session = reconciler.sessions.open(42, 0)
    assert asyncio.run(_terms(reconciler, run=7)) == ["signal"]
    assert session.signals.pending == [15]


def test_an_inherited_restart_count_of_a_requeued_first_run_is_that_run() -> None:
    # Run 0 inherited SLURM_RESTART_COUNT=5 from where sbatch ran; the job was requeued (run 1).
    reconciler, kube = _reconciler("PENDING", run=1)
    first = reconciler.sessions.open(42, 0)
    assert asyncio.run(_terms(reconciler, run=5)) == ["stop"]
    assert first.cancel_requested and kube.execs == [("slurm-42-0", STOP)]


def test_a_term_with_no_run_of_the_job_to_act_on_is_none() -> None:
    reconciler, _ = _reconciler("CANCELLED")
    assert asyncio.run(_terms(reconciler)) == [None]


def test_each_term_of_a_running_job_is_the_scripts_pending_once() -> None:
    # Natively each `scancel -s TERM -b` reaches the script; TERMs not delivered yet are one, as a
    # pending signal is in the kernel.
    reconciler, kube = _reconciler("RUNNING")
    session = reconciler.sessions.open(42, 0)
    assert asyncio.run(_terms(reconciler, times=3)) == ["signal"] * 3
    assert session.signals.pending == [15] and not session.cancel_requested and kube.execs == []


def test_a_stop_told_again_stops_once() -> None:
    reconciler, kube = _reconciler("CANCELLED")
    reconciler.sessions.open(42, 0)
    assert asyncio.run(_terms(reconciler, times=3)) == ["stop"] * 3
    assert kube.execs == [("slurm-42-0", STOP)]


def test_a_waiter_that_attaches_with_an_unanswered_term_gets_the_same_decision() -> None:
    async def scenario(state: str) -> tuple[list[int], bool]:
        reconciler, _ = _reconciler(state)
        attached = reconciler.attach_waiter(42, payload(), last_log={}, cancel=True, signals=[])
        assert attached is not None
        await asyncio.sleep(0.05)
        session = attached[0]
        return session.signals.pending, session.cancel_requested

    assert asyncio.run(scenario("RUNNING")) == ([15], False)
    assert asyncio.run(scenario("CANCELLED")) == ([], True)


def _drained(queue: asyncio.Queue[dict[str, Any]]) -> list[dict[str, Any]]:
    events = []
    while not queue.empty():
        events.append(queue.get_nowait())
    return events


def test_a_term_that_stops_tells_the_waiter_the_run_stops_before_the_stop_acts() -> None:
    # The stop's TERM reaches the pod's srun, which passes it back: the waiter must know it for
    # the stop's echo, or Slurm's srun, which slurmstepd TERMs too, gets a second one.
    reconciler, kube = _reconciler("CANCELLED")
    session = reconciler.sessions.open(42, 0)
    listener = session.attach({})

    async def stopped() -> list[dict[str, Any]]:
        reconciler.term_from_slurm(42, 0)
        told_before_the_stop = _drained(listener)
        assert kube.execs == [], "the stop acted before the waiter was told"
        reconciler.term_from_slurm(42, 0)
        await asyncio.sleep(0.05)
        return told_before_the_stop + _drained(listener)

    assert asyncio.run(stopped()) == [{"type": "stopping"}], "told once, before the stop"
    assert kube.execs == [("slurm-42-0", STOP)]
    assert _drained(session.attach({})) == [{"type": "stopping"}], "told again at the next attach"


def test_a_term_that_only_signals_tells_the_waiter_nothing_of_a_stop() -> None:
    reconciler, _ = _reconciler("RUNNING")
    session = reconciler.sessions.open(42, 0)
    listener = session.attach({})
    assert asyncio.run(_terms(reconciler)) == ["signal"]
    assert {"type": "stopping"} not in _drained(listener)


def test_a_run_slurm_requeued_tells_its_waiter_the_run_stops_before_its_pods_are_deleted() -> None:
    # The daemon may see the requeue before slurmstepd's TERM reaches the batch step: the pods'
    # TERM, and the pod's srun's echo of it, come first.
    cache = PodCache()
    cache.apply("ADDED", _pod(0))
    kube = RecordingKube(cache)
    reconciler = Reconciler(config(), NoSlurmJobs(), kube, cache, Metrics(), lambda _: None)  # type: ignore[arg-type]
    reconciler.jobs.record(allocation(state="PENDING", run=1))
    listener = reconciler.sessions.open(42, 0).attach({})
    told_at_deletion: list[list[dict[str, Any]]] = []
    delete = kube.delete_pod

    async def delete_seeing_the_waiters_events(name: str, grace_seconds: int | None = None) -> bool:
        told_at_deletion.append(_drained(listener))
        return await delete(name, grace_seconds)

    kube.delete_pod = delete_seeing_the_waiters_events  # type: ignore[method-assign]
    asyncio.run(reconciler.reconcile(42))
    assert kube.deleted == ["slurm-42-0"]
    assert told_at_deletion == [[{"type": "stopping"}]]


def test_a_waiter_that_forwards_its_term_is_asked_to_and_the_daemon_keeps_none(tmp_path: Path) -> None:
    """The compiled waiter says it `forwards` a TERM that is only a signal: the daemon keeps none
    (the waiter sends it numbered through /signal, which takes TERM); an older waiter's is kept."""
    unmunge = tmp_path / "unmunge.py"
    unmunge.write_text(UNMUNGE_AS_ALICE)

    class RunningJob:
        async def job(self, job_id: int) -> Any:
            return allocation(job_id=job_id)

    async def cancels() -> list[tuple[Any, list[int]]]:
        seen = []
        for body in (b'{"run": 0, "forwards": true}', b'{"run": 0}'):
            reconciler = Reconciler(config(), RunningJob(), None, PodCache(), Metrics(), lambda _: None)  # type: ignore[arg-type]
            api = Api(reconciler, Metrics(), lambda _: None, lambda: True, (sys.executable, str(unmunge)))
            async with TestClient(TestServer(api.app())) as client:
                answer = await _signed_post(client, "/v1/jobs/42/cancel", body)
                session = reconciler.sessions.get(42, 0)
                assert session is not None
                seen.append((await answer.json(), list(session.signals.pending)))
                term = await _signed_post(client, "/v1/jobs/42/signal", b'{"signal": 15, "seq": 1}')
                assert term.status != 400, await term.text()
                other = await _signed_post(client, "/v1/jobs/42/signal", b'{"signal": 9, "seq": 2}')
                assert other.status == 400, "only the batch signals"
        return seen

    assert asyncio.run(cancels()) == [
        ({"cancelling": 42, "stops": False, "forward": True}, []),
        ({"cancelling": 42, "stops": False, "forward": False}, [15]),
    ]


UNMUNGE_AS_ALICE = ("import sys\n"
                    "sys.stdout.write('UID: alice (1000)\\nGID: users (100)\\n\\n' + sys.stdin.read())\n")
"""An unmunge stand-in: the credential is its own payload, decoded as alice's."""


async def _signed_post(client: TestClient[Any, Any], path: str, body: bytes) -> Any:
    credential = request_digest("POST", path, 42, body)
    return await client.post(path, data=body, headers={"X-Munge-Credential": credential})


def test_another_user_cannot_term_a_jobs_script_through_the_new_door(tmp_path: Path) -> None:
    """/signal takes TERM now: bob's credential, however well made for the request, reaches none
    of alice's job (403, nothing kept), as `scancel -s TERM -b` of her job is refused him."""
    unmunge = tmp_path / "unmunge.py"
    unmunge.write_text(UNMUNGE_AS_ALICE.replace("alice (1000)", "bob (1001)"))

    class RunningJob:
        async def job(self, job_id: int) -> Any:
            return allocation(job_id=job_id)

    async def as_bob() -> tuple[int, int, list[int]]:
        reconciler = Reconciler(config(), RunningJob(), None, PodCache(), Metrics(), lambda _: None)  # type: ignore[arg-type]
        reconciler.sessions.open(42, 0).attach({})
        api = Api(reconciler, Metrics(), lambda _: None, lambda: True, (sys.executable, str(unmunge)))
        async with TestClient(TestServer(api.app())) as client:
            term = await _signed_post(client, "/v1/jobs/42/signal", b'{"signal": 15, "seq": 1}')
            cancel = await _signed_post(client, "/v1/jobs/42/cancel", b'{"run": 0, "forwards": true}')
            session = reconciler.sessions.get(42, 0)
            assert session is not None
            return term.status, cancel.status, list(session.signals.pending)

    assert asyncio.run(as_bob()) == (403, 403, [])
