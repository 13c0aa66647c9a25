"""`--signal=B:USR1@50` and `scancel -s USR1 --batch` signal the batch script; natively it gets
the signal. A bridged script gets it through its waiter, the daemon and an exec of the pod's
agent, and each hop can fail for a moment under load: the waiter may not have attached yet, the
daemon may answer 503, the kubelet may refuse the exec into a container that just started (CI
saw a bridged `trap ... USR1` script run into its time limit, its USR1 lost). A signal is kept at
each hop until the next one has taken it, and taken once only."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sys
import threading
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from bridge.clients.kube.cache import PodCache
from bridge.clients.kube.errors import KubeNotFound
from bridge.controller.metrics import Metrics
from bridge.controller.reconcile import Reconciler
from bridge.controller.workqueue import Result
from bridge.core import wellknown
from bridge.core.agent_protocol import EXIT_FAILED, EXIT_NO_SUCH_PROCESS, EXIT_NOT_STARTED
from bridge.core.config import PartitionConfig
from bridge.core.errors import ExecCommandFailed, ExecOutcomeUnknown, KubeUnavailable
from bridge.core.waiter_protocol import FORWARDED, request_digest
from bridge.manager.api import Api

from .builders import SecretStore, allocation, config, payload
from .waiter_runs import (
    Exchange,
    FakeDaemon,
    batch_script,
    fakes,
    go_constants,
    go_test,
    go_waiter,
    namespaces_work,
    post_as_the_waiter,
    run_waiter,
)

USR1, USR2 = int(signal.SIGUSR1), int(signal.SIGUSR2)
UNMUNGE_OK = (
    "import sys\nsys.stdout.write('UID: alice (1000)\\nGID: users (100)\\n\\n' + sys.stdin.read())\n"
)


class Slurm:
    async def job(self, job_id: int) -> Any:
        return allocation(job_id=job_id)

    async def set_comment(self, job_id: int, comment: str) -> None:
        pass


class KubeWithAFlakyExec(SecretStore):
    """Pods go into the cache as running agent pods; the first `failures` execs fail as the
    kubelet's 500 did."""

    def __init__(self, cache: PodCache, failures: int, error: Exception | None = None) -> None:
        self.cache = cache
        self.failures = failures
        self.error = error
        self.signalled: list[tuple[str, int]] = []
        self.execs = 0

    async def create_pod(self, manifest: dict[str, Any]) -> bool:
        metadata = dict(manifest["metadata"])
        metadata["annotations"] = {**(metadata.get("annotations") or {}),
                                   wellknown.ANNOTATION_OUTPUT: wellknown.OUTPUT_FRAMED}
        started = (datetime.now(UTC) - timedelta(seconds=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.cache.apply("ADDED", {"metadata": metadata, "spec": manifest["spec"], "status": {
            "phase": "Running",
            "containerStatuses": [{"name": wellknown.CONTAINER_NAME,
                                   "state": {"running": {"startedAt": started}}}]}})
        return True

    async def exec_in_pod(self, pod: str, command: list[str]) -> str:
        self.execs += 1
        if self.failures:
            self.failures -= 1
            raise self.error or KubeUnavailable(
                f"cannot exec in pod {pod}: 500, message='Invalid response status'")
        self.signalled.append((pod, int(command[-1])))
        return ""

    async def stream_logs(self, pod_name: str, since_time: str | None = None) -> Any:
        await asyncio.sleep(3600)
        yield ("", "")  # pragma: no cover - never reached


def _world(
    failures: int, error: Exception | None = None
) -> tuple[Reconciler, KubeWithAFlakyExec, list[tuple[int, float]]]:
    cache = PodCache()
    kube = KubeWithAFlakyExec(cache, failures, error)
    later: list[tuple[int, float]] = []
    cfg = config(partitions={"k8s": PartitionConfig(default_image="img:1")})
    reconciler = Reconciler(cfg, Slurm(), kube, cache, Metrics(), lambda _job: None)  # type: ignore[arg-type]
    reconciler.jobs.record(replace(allocation(), read_at=time.monotonic()))
    reconcile = reconciler.reconcile

    async def reconcile_noting_requeues(job_id: int) -> Result:
        # The worker's part: a pass's requeue_after is when the job is looked at again.
        result = await reconcile(job_id)
        if result.requeue_after is not None:
            later.append((job_id, result.requeue_after))
        return result

    reconciler.reconcile = reconcile_noting_requeues  # type: ignore[method-assign]
    return reconciler, kube, later


def _attached(reconciler: Reconciler) -> Any:
    session = reconciler.attach_session(42, payload())
    session.payload = payload()
    session.attach({})
    return session


async def test_a_signal_whose_exec_failed_is_sent_again_and_reaches_the_script() -> None:
    reconciler, kube, later = _world(failures=2)
    session = _attached(reconciler)
    await reconciler.reconcile(42)  # creates the pods
    reconciler.take_batch_signal(session, USR1, seq=1)

    await reconciler.reconcile(42)
    await reconciler.reconcile(42)
    assert kube.signalled == []
    assert session.signals.pending == [USR1], "a failed exec must not drop the signal"
    assert later and later[-1][1] > 1.0, "the next try waits a little longer"

    await reconciler.reconcile(42)
    assert kube.signalled == [("slurm-42-0", USR1)]
    assert session.signals.pending == []
    await reconciler.reconcile(42)
    assert kube.signalled == [("slurm-42-0", USR1)], "delivered once"


def _agent_failed(output: str, code: int = EXIT_FAILED) -> ExecCommandFailed:
    return ExecCommandFailed(f"exited {code}: {output}", code, f"slurm-k8s-bridge-agent: {output}\n")


async def test_a_signal_the_agent_could_not_send_is_sent_again() -> None:
    """The agent ran and failed (a pid file read while it was written, a runtime that failed the
    exec): the script did not get the signal, so it is tried again, not taken for sent."""
    torn = _agent_failed("bad pid file /slurm-k8s-bridge-bin/script.pid")
    reconciler, kube, _ = _world(failures=1, error=torn)
    session = _attached(reconciler)
    await reconciler.reconcile(42)
    reconciler.take_batch_signal(session, USR1, seq=1)

    await reconciler.reconcile(42)
    assert session.signals.pending == [USR1]
    await reconciler.reconcile(42)
    assert kube.signalled == [("slurm-42-0", USR1)]
    assert session.signals.pending == []


@pytest.mark.parametrize(("output", "code", "kept"), [
    ("the script has not started: no such file", EXIT_NOT_STARTED, True),
    ("cannot signal 7: no such process", EXIT_NO_SUCH_PROCESS, False),
])
async def test_a_script_not_started_keeps_the_signal_and_one_that_ended_drops_it(
    output: str, code: int, kept: bool
) -> None:
    reconciler, kube, _ = _world(failures=1, error=_agent_failed(output, code))
    session = _attached(reconciler)
    await reconciler.reconcile(42)
    reconciler.take_batch_signal(session, USR1, seq=1)

    await reconciler.reconcile(42)

    assert kube.execs == 1
    assert session.signals.pending == ([USR1] if kept else [])
    assert session.signals.failures == 0, "neither is a failed exec to back off from"


GONE = KubeNotFound('pods "slurm-42-0" not found', status=404, reason="NotFound", what="exec")


@pytest.mark.parametrize("error", [ExecOutcomeUnknown("exec in pod slurm-42-0 did not answer within 30 s"),
                                   GONE])
async def test_a_signal_that_may_have_been_sent_or_never_can_be_is_not_tried_again(error: Exception) -> None:
    """A timed-out exec may have signalled the script already: a second USR1 could meet a script
    whose trap is gone and kill it. A pod that is gone will not come back."""
    reconciler, kube, _ = _world(failures=1, error=error)
    session = _attached(reconciler)
    await reconciler.reconcile(42)
    reconciler.take_batch_signal(session, USR1, seq=1)

    for _ in range(3):
        await reconciler.reconcile(42)

    assert kube.execs == 1
    assert session.signals.pending == []


async def test_after_a_requeue_the_signal_goes_to_the_new_run_not_the_old_runs_lingering_session(
    tmp_path: Path,
) -> None:
    reconciler, _kube, _ = _world(failures=0)
    old_run = reconciler.sessions.open(42, 0)  # its pods still going away
    old_run.signals.taken = 5
    reconciler.jobs.record(replace(allocation(), run=1, read_at=time.monotonic()))

    async with _api(tmp_path, reconciler) as client:
        before = await post_as_the_waiter(client, "/v1/jobs/42/signal", {"signal": USR1, "seq": 1})
        new_run = reconciler.sessions.open(42, 1)  # the new run's waiter attached
        after = await post_as_the_waiter(client, "/v1/jobs/42/signal", {"signal": USR1, "seq": 1})

    assert before[0] == 409, "kept by the waiter until its own run's session exists"
    assert after[0] == 200
    assert new_run.signals.pending == [USR1]
    assert old_run.signals.pending == []


async def test_signals_reach_the_script_in_the_order_slurm_sent_them() -> None:
    reconciler, kube, _ = _world(failures=1)
    session = _attached(reconciler)
    await reconciler.reconcile(42)
    reconciler.take_batch_signal(session, USR1, seq=1)
    reconciler.take_batch_signal(session, USR2, seq=2)

    for _ in range(3):
        await reconciler.reconcile(42)

    assert [signum for _, signum in kube.signalled] == [USR1, USR2]


async def test_a_signal_the_waiter_sends_again_is_taken_once() -> None:
    reconciler, _kube, _ = _world(failures=0)
    session = _attached(reconciler)

    reconciler.take_batch_signal(session, USR1, seq=1)
    reconciler.take_batch_signal(session, USR1, seq=1)  # its answer was lost: the waiter resends
    reconciler.take_batch_signal(session, USR2, seq=2)

    assert session.signals.pending == [USR1, USR2]


async def test_a_signal_sent_again_before_the_first_was_delivered_is_kept_once() -> None:
    """A blocked process has a standard signal pending once however often it comes; a user's
    flood of scancel -s USR1 --batch keeps one USR1, not thousands."""
    reconciler, kube, _ = _world(failures=0)
    session = _attached(reconciler)
    for seq in range(1, 1001):
        reconciler.take_batch_signal(session, USR1, seq=seq)

    assert session.signals.pending == [USR1]
    await reconciler.reconcile(42)
    await reconciler.reconcile(42)
    assert kube.signalled == [("slurm-42-0", USR1)]
    reconciler.take_batch_signal(session, USR1, seq=1001)  # once delivered, a new one is new
    await reconciler.reconcile(42)
    assert kube.signalled == [("slurm-42-0", USR1)] * 2


async def test_a_numbered_term_during_the_delivery_of_an_unnumbered_one_is_delivered_too() -> None:
    """A TERM kept without a number (an older waiter's, or a cancel an attach carried) is being
    sent when the waiter forwards a numbered one (`scancel -s TERM -b` again): that one is sent
    after, and reported delivered, not folded into the first (the waiter would keep it until its
    next attach)."""
    reconciler, kube, _ = _world(failures=0)
    session = _attached(reconciler)
    term = int(signal.SIGTERM)
    reconciler.take_batch_signal(session, term)
    exec_in_pod = kube.exec_in_pod

    async def exec_while_another_term_comes(pod: str, command: list[str]) -> str:
        if kube.execs == 0:
            reconciler.take_batch_signal(session, term, seq=3)
        return await exec_in_pod(pod, command)

    kube.exec_in_pod = exec_while_another_term_comes  # type: ignore[method-assign]
    await reconciler.reconcile(42)
    await reconciler.reconcile(42)

    assert kube.signalled == [("slurm-42-0", term)] * 2
    told = [session.listener.get_nowait() for _ in range(session.listener.qsize())]
    assert {"type": "signal-done", "signal": term, "seq": 3} in told


# -- the API: before the attach, and with it ---------------------------------------------------


def _api(tmp_path: Path, reconciler: Reconciler) -> TestClient:
    script = tmp_path / "unmunge.py"
    script.write_text(UNMUNGE_OK)
    api = Api(reconciler, Metrics(), lambda _: None, lambda: True, (sys.executable, str(script)))
    return TestClient(TestServer(api.app()))


async def test_a_signal_before_the_attach_is_refused_so_the_waiter_keeps_it(tmp_path: Path) -> None:
    reconciler, _kube, _ = _world(failures=0)
    async with _api(tmp_path, reconciler) as client:
        status, text = await post_as_the_waiter(client, "/v1/jobs/42/signal", {"signal": USR1, "seq": 1})

    assert status == 409, text
    assert "not attached" in text


async def test_the_attach_hands_over_the_signals_the_waiter_kept(tmp_path: Path) -> None:
    reconciler, _kube, _ = _world(failures=0)
    body = {"script": "#!/bin/sh\ntrue\n", "environment": {"SLURM_JOB_ID": "42"}, "work_dir": "/tmp",
            "uid": 1000, "gid": 100, "signals": [[1, USR1], [2, USR2]]}
    async with _api(tmp_path, reconciler) as client:
        raw = json.dumps(body).encode()
        credential = request_digest("POST", "/v1/jobs/42/attach", 42, raw)
        response = await client.post("/v1/jobs/42/attach", data=raw,
                                      headers={"X-Munge-Credential": credential})
        assert response.status == 200, await response.text()
        again = await post_as_the_waiter(client, "/v1/jobs/42/signal", {"signal": USR1, "seq": 2})
        response.close()

    assert again[0] == 200, again
    assert reconciler.sessions.of_job(42)[0].signals.pending == [USR1, USR2]


@pytest.mark.parametrize("signals", [[[0, USR1]], [[1, 9]], [[None, USR1]], "USR1", [[1, USR1]] * 65])
async def test_an_attach_with_crafted_signals_is_refused(tmp_path: Path, signals: Any) -> None:
    reconciler, _kube, _ = _world(failures=0)
    body = {"script": "#!/bin/sh\ntrue\n", "environment": {"SLURM_JOB_ID": "42"}, "work_dir": "/tmp",
            "uid": 1000, "gid": 100, "signals": signals}
    async with _api(tmp_path, reconciler) as client, asyncio.timeout(10):  # an accepted attach streams
        status, _text = await post_as_the_waiter(client, "/v1/jobs/42/attach", body)

    assert status == 400
    assert reconciler.sessions.of_job(42) == []


# -- the waiter (the compiled one: agent/internal/waiter/script_signals_test.go, and its binary) --


@pytest.mark.parametrize("refusal", [409, 503])
def test_a_signal_the_daemon_did_not_take_goes_with_the_next_attach(refusal: int) -> None:
    go_test("TestASignalTheDaemonDidNotTakeGoesWithTheNextAttach", {"TEST_REFUSAL": str(refusal)})


def test_a_signal_the_daemon_took_is_not_posted_again_and_the_attach_offers_it_until_delivered() -> None:
    go_test("TestASignalTheDaemonTookIsNotPostedAgainAndTheAttachOffersItUntilDelivered")


def test_a_signal_during_a_send_is_sent_after_it_in_order() -> None:
    go_test("TestASignalDuringASendIsSentAfterItInOrder")


# -- a signal while the waiter starts ------------------------------------------------------------

# As the step guard starts the waiter: the signals it holds blocked; Slurm's USR1 then comes at once
# and waits, pending, across the exec.
HOLD_USR1_THEN_EXEC = ("import os, signal, sys\n"
                       "signal.pthread_sigmask(signal.SIG_BLOCK, [int(s) for s in sys.argv[1].split(',')])\n"
                       "os.kill(os.getpid(), signal.SIGUSR1)\n"
                       "os.execv(sys.argv[2], sys.argv[2:])\n")
# Munge, as the waiter starts it, notes its blocked signals (the mask a child inherits).
MUNGE_NOTING_ITS_MASK = ("#!/bin/sh\ngrep '^SigBlk:' /proc/self/status >>/opt/masks\n"
                         "printf 'MUNGE:'\nexec cat\n")


def test_a_signal_that_comes_while_the_waiter_starts_is_passed_on_not_its_death(tmp_path: Path) -> None:
    if not namespaces_work():
        pytest.fail("needs mount namespaces (root) for the fake munge", pytrace=False)
    held = _signals_the_guard_holds()
    passed_on: list[tuple[int, int]] = []
    got_it = threading.Event()

    def signal_endpoint(exchange: Exchange) -> None:
        passed_on.append((exchange.json["seq"], exchange.json["signal"]))  # type: ignore[arg-type]
        got_it.set()
        exchange.answer(200, "{}")

    def attach(exchange: Exchange) -> None:
        offered = [tuple(pair) for pair in exchange.json["signals"]]  # type: ignore[attr-defined]
        passed_on.extend(offered)
        if not offered:
            assert got_it.wait(20), "the signal never reached the daemon"
        exchange.stream({"type": "signal-done", "signal": USR1, "seq": 1},
                        {"type": "exit", "code": 0, "signal": None})

    daemon = FakeDaemon([attach], {"signal": signal_endpoint})
    try:
        script = batch_script(tmp_path, b"echo hello\n")
        opt = fakes(tmp_path, munge=MUNGE_NOTING_ITS_MASK)
        run = run_waiter([sys.executable, "-c", HOLD_USR1_THEN_EXEC, ",".join(map(str, sorted(held))),
                          *go_waiter(tmp_path)], daemon, args=[str(script)], cwd=tmp_path, opt=opt,
                         env={"SLURM_JOB_ID": "42", "PATH": "/usr/bin:/bin"})
    finally:
        daemon.close()

    assert run.returncode == 0, (run.returncode, run.stderr)
    assert set(passed_on) == {(1, USR1)}, "passed on once (offered again until reported delivered)"
    masks = (opt / "masks").read_text().split("\n")[:-1]
    assert masks and set(masks) == {"SigBlk:\t0000000000000000"}, "nothing left blocked for what it starts"


def _signals_the_guard_holds() -> set[int]:
    guard = (Path(__file__).resolve().parents[2] / "deploy/slurm/spank/slurm_k8s_bridge_guard.c").read_text()
    listed = re.search(r"held_signals\[\] = \{([^}]*)\}", guard)
    assert listed is not None, "the guard lists the signals it holds"
    return {int(getattr(signal, name.strip())) for name in listed.group(1).split(",")}


def test_the_step_guard_blocks_exactly_the_signals_the_waiter_unblocks(tmp_path: Path) -> None:
    """The waiter forwards (and unblocks, by asking for them) the signals the guard holds, and INT,
    which the guard leaves alone for the site's TaskProlog as it does TERM; it takes those pending
    at its start, and TERM and INT, before the Go runtime acts on them."""
    constants = go_constants(tmp_path, "TestSignalConstantsDump", "WAITER_SIGNAL_CONSTANTS_OUT")
    held = _signals_the_guard_holds()
    forwarded = held | {signal.SIGINT}
    assert set(constants["forwarded"]) == forwarded == {int(s) for s in FORWARDED}  # type: ignore[call-overload]
    assert set(constants["early_kept"]) == held | {signal.SIGTERM, signal.SIGINT}  # type: ignore[call-overload]
    root = Path(__file__).resolve().parents[2]
    constructor = (root / "agent/internal/earlysignals/earlysignals.go").read_text()
    listed = re.search(r"early_kept\[\] = \{([^}]*)\}", constructor)
    assert listed is not None, "the C constructor lists the signals it takes"
    assert {int(getattr(signal, name.strip())) for name in listed.group(1).split(",")} == set(
        constants["early_kept"])  # type: ignore[call-overload]
