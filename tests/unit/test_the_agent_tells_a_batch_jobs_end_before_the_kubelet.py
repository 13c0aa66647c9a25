"""Issue 22: the agent's last log frame ("x": how the script ended) ends a batch job at once,
instead of a kubelet status cycle later (up to a second). Only plain exits are taken on its word;
until the kubelet has seen the pod stop, no pod of another job is placed on its node (the kubelet
still counts the old pod's requests there)."""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bridge.clients.kube.cache import PodCache
from bridge.controller.log_relay import output_event
from bridge.controller.metrics import Metrics
from bridge.controller.reconcile import Reconciler
from bridge.core.agent_protocol import ScriptEnding, parse_ending
from bridge.core.config import PartitionConfig, PodsConfig
from bridge.core.model import JobAllocation, NodeAllocation
from bridge.core.outcome import Finished, told_outcome
from bridge.core.pod_view import pod_view

from .builders import allocation, config, payload
from .test_agent_keeps_output_byte_exact_and_passes_signals_on import agent, frame_lines, run, stream  # noqa: F401
from .test_reconcile_acts_on_both_views import FakeKube, FakeSlurm, _pod, _terminated


def x_frame(text: str) -> str:
    return "x " + base64.b64encode(text.encode()).decode()


def o_frame(data: bytes) -> str:
    return "o " + base64.b64encode(data).decode()


# -- the frame ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "ending"), [
    ("exited 0 oom 0", ScriptEnding(0, None, 0)),
    ("exited 3 oom -", ScriptEnding(3, None, None)),
    ("exited 255 oom 2", ScriptEnding(255, None, 2)),
    ("signaled 9 oom 1", ScriptEnding(None, 9, 1)),
])
def test_the_agents_ending_frame_is_read(text: str, ending: ScriptEnding) -> None:
    assert parse_ending(x_frame(text)[2:]) == ending


@pytest.mark.parametrize("text", [
    "exited -1 oom 0", "exited 256 oom 0", "signaled 0 oom 0", "signaled 65 oom 0", "exited 0",
    "exited 0 oom 0 extra", "exited 0 oom x", "died 0 oom 0", "exited \uff13 oom 0", "exited 0  oom 0",
])
def test_anything_else_is_no_ending(text: str) -> None:
    assert parse_ending(base64.b64encode(text.encode()).decode()) is None


def test_an_ending_that_is_not_base64_is_no_ending() -> None:
    assert parse_ending("exited 0 oom 0") is None
    assert parse_ending("!!!!") is None


def test_only_the_first_pods_ending_frame_is_one() -> None:
    """The other pods hold their node; a line "x ..." from them is text, never an end."""
    assert output_event(0, "t", x_frame("exited 0 oom 0"))["type"] == "ending"
    other = output_event(1, "t", x_frame("exited 0 oom 0"))
    assert other["type"] == "out" and other["fd"] == 2


# -- what is taken on the agent's word ----------------------------------------------------------


def view(**metadata_or_status: Any) -> Any:
    status = metadata_or_status.pop("status", {"phase": "Running"})
    metadata = {"name": "slurm-42-0", "labels": {"slurm-k8s-bridge/job-id": "42"}, **metadata_or_status}
    return pod_view({"metadata": metadata, "spec": {"nodeName": "kube1"}, "status": status})


@pytest.mark.parametrize(("ending", "expected"), [
    (ScriptEnding(0, None, None), Finished(0)),
    (ScriptEnding(0, None, 3), Finished(0)),  # as the runtime's word: exit 0 is success even so
    (ScriptEnding(3, None, 0), Finished(3, None, "slurm-42-0: exited with code 3")),
    (ScriptEnding(3, None, None), None),  # an OOM kill cannot be ruled out: the runtime explains it
    (ScriptEnding(3, None, 1), None),
    (ScriptEnding(None, 9, 0), None),  # signals: the runtime's word (OOMKilled, evictions)
    (ScriptEnding(137, None, 0), None),  # 128+N reads as signal N from the runtime: kept so
    (ScriptEnding(128, None, 0), None),
])
def test_only_plain_exits_are_taken_on_the_agents_word(
        ending: ScriptEnding, expected: Finished | None) -> None:
    assert told_outcome(view(), ending) == expected


def test_a_pod_being_deleted_or_evicted_waits_for_the_runtime() -> None:
    assert told_outcome(view(deletionTimestamp="2026-12-05T00:00:00Z"), ScriptEnding(0, None, 0)) is None
    evicted = view(status={"phase": "Running", "reason": "Evicted", "message": "memory"})
    assert told_outcome(evicted, ScriptEnding(0, None, 0)) is None


# -- the reconciler -----------------------------------------------------------------------------

AGENT_IMAGE = "reg.example/slurm-k8s-bridge-agent:1"
RUNNING = {"phase": "Running", "containerStatuses": [
    {"name": "job", "state": {"running": {"startedAt": "2026-12-05T10:00:00Z"}}}]}


@pytest.fixture
def world() -> tuple[Reconciler, FakeKube, PodCache]:
    cache = PodCache()
    kube, slurm = FakeKube(cache), FakeSlurm()
    cfg = config(pods=PodsConfig(supplemental_groups_policy="", agent_image=AGENT_IMAGE),
                 partitions={"k8s": PartitionConfig(default_image="img:1", resolve_first_node=False)})
    reconciler = Reconciler(cfg, slurm, kube, cache, Metrics(), lambda _job: None)  # type: ignore[arg-type]
    return reconciler, kube, cache


def one_node(job_id: int) -> JobAllocation:
    node = NodeAllocation("kube1", cpus=1, memory_mb=64, gpu_indices=())
    return replace(allocation(job_id=job_id, nodes=(node,)), read_at=time.monotonic())


def start(reconciler: Reconciler, job_id: int) -> asyncio.Queue[dict[str, Any]]:
    reconciler.jobs.record(one_node(job_id))
    session = reconciler.attach_session(job_id, payload())
    session.payload = payload()
    return session.attach({})


async def settle(reconciler: Reconciler, job_id: int) -> None:
    await reconciler.reconcile(job_id)  # starts the relay
    await asyncio.sleep(0.05)
    await reconciler.reconcile(job_id)  # decides


async def test_the_ending_frame_ends_the_job_before_the_kubelet_reports_it(world: Any) -> None:
    reconciler, kube, cache = world
    queue = start(reconciler, 42)
    await reconciler.reconcile(42)
    (manifest,) = kube.created
    cache.apply("MODIFIED", _pod(manifest, **RUNNING))
    kube.log_lines = {"slurm-42-0": [("2026-12-05T10:00:01.100000000Z", o_frame(b"out\n")),
                                     ("2026-12-05T10:00:01.200000000Z", x_frame("exited 3 oom 0"))]}

    await settle(reconciler, 42)

    events = [queue.get_nowait() for _ in range(queue.qsize())]
    assert [e["type"] for e in events] == ["out", "exit"], events
    assert base64.b64decode(events[0]["data"]) == b"out\n"
    assert events[-1] == {"type": "exit", "code": 3, "signal": None, "reason": ""}


async def test_without_the_frame_the_job_waits_for_the_kubelet(world: Any) -> None:
    reconciler, kube, cache = world
    queue = start(reconciler, 42)
    await reconciler.reconcile(42)
    (manifest,) = kube.created
    cache.apply("MODIFIED", _pod(manifest, **RUNNING))
    kube.log_lines = {"slurm-42-0": [("2026-12-05T10:00:01.1Z", o_frame(b"out\n"))]}

    await settle(reconciler, 42)
    # (The stand-in's stream ends at once and yields its lines again: only "out" events, no end.)
    assert {e["type"] for e in (queue.get_nowait() for _ in range(queue.qsize()))} == {"out"}

    kube.log_lines = {}
    cache.apply("MODIFIED", _pod(manifest, **_terminated(3)))
    await settle(reconciler, 42)
    events = [queue.get_nowait() for _ in range(queue.qsize())]
    assert events[-1] == {"type": "exit", "code": 3, "signal": None, "reason": ""}


async def test_a_signal_in_the_frame_waits_for_the_runtimes_word(world: Any) -> None:
    reconciler, kube, cache = world
    queue = start(reconciler, 42)
    await reconciler.reconcile(42)
    (manifest,) = kube.created
    cache.apply("MODIFIED", _pod(manifest, **RUNNING))
    kube.log_lines = {"slurm-42-0": [("2026-12-05T10:00:01.1Z", x_frame("signaled 9 oom 1"))]}

    await settle(reconciler, 42)

    assert queue.empty(), "an OOM kill must be explained from the runtime's OOMKilled"


async def test_the_next_jobs_pod_waits_until_the_kubelet_saw_the_early_ended_one_stop(world: Any) -> None:
    reconciler, kube, cache = world
    start(reconciler, 42)
    await reconciler.reconcile(42)
    (first,) = kube.created
    cache.apply("MODIFIED", _pod(first, **RUNNING))
    kube.log_lines = {"slurm-42-0": [("2026-12-05T10:00:01.1Z", x_frame("exited 0 oom 0"))]}
    await settle(reconciler, 42)
    assert reconciler.early_endings.holding(["kube1"]) == ["slurm-42-0"]

    start(reconciler, 43)  # Slurm gave kube1 to the next job at once
    result = await reconciler.reconcile(43)
    assert [m["metadata"]["name"] for m in kube.created] == ["slurm-42-0"], "beside a pod still counted"
    assert result.requeue_after is not None and result.requeue_after <= 0.5, "it must look again by itself"

    cache.apply("MODIFIED", _pod(first, **_terminated(0)))  # the kubelet's status cycle
    await reconciler.reconcile(43)
    assert [m["metadata"]["name"] for m in kube.created] == ["slurm-42-0", "slurm-43-0"]
    assert len(reconciler.early_endings) == 0


async def test_a_job_on_another_node_is_not_held(world: Any) -> None:
    reconciler, kube, cache = world
    start(reconciler, 42)
    await reconciler.reconcile(42)
    (first,) = kube.created
    cache.apply("MODIFIED", _pod(first, **RUNNING))
    kube.log_lines = {"slurm-42-0": [("2026-12-05T10:00:01.1Z", x_frame("exited 0 oom 0"))]}
    await settle(reconciler, 42)

    reconciler.jobs.record(replace(one_node(44), nodes=(NodeAllocation("kube2", cpus=1, memory_mb=64,
                                                                       gpu_indices=()),)))
    session = reconciler.attach_session(44, payload())
    session.payload = payload()
    session.attach({})
    await reconciler.reconcile(44)

    assert [m["spec"]["nodeName"] for m in kube.created] == ["kube1", "kube2"]


# -- the agent (built) --------------------------------------------------------------------------


@pytest.mark.parametrize(("script", "told"), [("exit 3", "exited 3"), ("exit 0", "exited 0"),
                                              ("kill -9 $$", "signaled 9")])
def test_the_agents_last_frame_tells_how_the_script_ended(
        agent: Path, tmp_path: Path, script: str, told: str) -> None:  # noqa: F811
    result = run(agent, tmp_path, f"echo hi; {script}")

    last = frame_lines(result.stdout)[-1]
    assert last.startswith(b"x "), last
    text = base64.b64decode(last[2:], validate=True).decode()
    assert text.startswith(f"{told} oom "), text
    assert parse_ending(last[2:].decode()) is not None


def test_the_script_cannot_write_frames_on_the_agents_stdout(agent: Path) -> None:  # noqa: F811
    """Same user, no capabilities, and a stdout pipe of that user's (as runc hands the container's
    stdio to its user): /proc/AGENT/fd/1 stays closed to the script, so no forged ending (nor
    usage) reaches the log. Without the agent's PR_SET_DUMPABLE 0 it opens."""
    forged = x_frame("exited 0 oom 0")
    probe = (f"if echo '{forged}' 2>/dev/null > /proc/$PPID/fd/1; then echo forged; else echo refused; fi; "
             "sleep 0.2; exit 7")
    with tempfile.TemporaryDirectory() as place:
        os.chmod(place, 0o777)  # the unprivileged agent's pid file and copy live here
        copy = Path(place) / "agent"
        shutil.copy(agent, copy)
        # The pipe the agent writes to is made by the job's user (the shell), as in the pod.
        argv = ["/bin/sh", "-c", '"$0" run "$1/script.pid" merged -- /bin/sh -c "$2" | cat',
                str(copy), place, probe]
        if os.geteuid() == 0:  # root could open it anyway (CAP_SYS_PTRACE): be nobody, as a job is
            argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
                    "--bounding-set=-all", *argv]
        result = subprocess.run(argv, capture_output=True, timeout=60, check=False)

    assert stream(result.stdout, "o") == b"refused\n", result.stderr
    lines = frame_lines(result.stdout)
    assert [line for line in lines if line.startswith(b"x ")] == [lines[-1]]
    assert base64.b64decode(lines[-1][2:]).startswith(b"exited 7 ")
