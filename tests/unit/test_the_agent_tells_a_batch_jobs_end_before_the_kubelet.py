"""Issue 22: the agent's last log frame ("x": how the script ended) ends a batch job at once,
instead of a kubelet status cycle later (up to a second). Only plain exits are taken on its word;
until the kubelet has seen the pod stop, no pod of another job is placed on its node (the kubelet
still counts the old pod's requests there)."""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bridge.clients.kube.cache import PodCache
from bridge.controller import early_endings
from bridge.controller.early_endings import EarlyEndings
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
    ("exited 0 oom 0 stop 0", ScriptEnding(0, None, 0, False)),
    ("exited 3 oom - stop 0", ScriptEnding(3, None, None, False)),
    ("exited 255 oom 2 stop 1", ScriptEnding(255, None, 2, True)),
    ("signaled 9 oom 1 stop 0", ScriptEnding(None, 9, 1, False)),
])
def test_the_agents_ending_frame_is_read(text: str, ending: ScriptEnding) -> None:
    assert parse_ending(x_frame(text)[2:]) == ending


@pytest.mark.parametrize("text", [
    "exited -1 oom 0 stop 0", "exited 256 oom 0 stop 0", "signaled 0 oom 0 stop 0",
    "signaled 65 oom 0 stop 0", "exited 0", "exited 0 oom 0", "exited 0 oom 0 stop 0 extra",
    "exited 0 oom x stop 0", "died 0 oom 0 stop 0", "exited \uff13 oom 0 stop 0", "exited 0  oom 0 stop 0",
    "exited 0 oom 0 stop 2", "exited 0 oom 0 halt 0",
])
def test_anything_else_is_no_ending(text: str) -> None:
    assert parse_ending(base64.b64encode(text.encode()).decode()) is None


def test_an_ending_that_is_not_base64_is_no_ending() -> None:
    assert parse_ending("exited 0 oom 0") is None
    assert parse_ending("!!!!") is None


def test_only_the_first_pods_ending_frame_is_one() -> None:
    """The other pods hold their node; a line "x ..." from them is text, never an end."""
    assert output_event(0, "t", x_frame("exited 0 oom 0 stop 0"))["ending"] == ScriptEnding(0, None, 0, False)
    other = output_event(1, "t", x_frame("exited 0 oom 0 stop 0"))
    assert other["type"] == "out" and other["fd"] == 2


def test_an_ending_frame_this_daemon_cannot_read_is_neither_output_nor_an_end() -> None:
    """A newer agent's: dropped (not a line in the job's stderr)."""
    event = output_event(0, "t", x_frame("exited 0 oom 0 stop 0 newfield 1"))
    assert (event["type"], event["ending"]) == ("ending", None)


# -- what is taken on the agent's word ----------------------------------------------------------


def view(**metadata_or_status: Any) -> Any:
    status = metadata_or_status.pop("status", {"phase": "Running"})
    metadata = {"name": "slurm-42-0", "labels": {"slurm-k8s-bridge/job-id": "42"}, **metadata_or_status}
    return pod_view({"metadata": metadata, "spec": {"nodeName": "kube1"}, "status": status})


@pytest.mark.parametrize(("ending", "expected"), [
    (ScriptEnding(0, None, None, False), Finished(0)),
    (ScriptEnding(0, None, 3, True), Finished(0)),  # as the runtime's word: exit 0 is success even so
    (ScriptEnding(3, None, 0, False), Finished(3, None, "slurm-42-0: exited with code 3")),
    (ScriptEnding(3, None, None, False), None),  # an OOM kill cannot be ruled out: the runtime explains it
    (ScriptEnding(3, None, 1, False), None),
    (ScriptEnding(3, None, 0, True), None),  # told to stop: an eviction's reason may not be in yet
    (ScriptEnding(None, 9, 0, False), None),  # signals: the runtime's word (OOMKilled, evictions)
    (ScriptEnding(137, None, 0, False), None),  # 128+N reads as signal N from the runtime: kept so
    (ScriptEnding(128, None, 0, False), None),
])
def test_only_plain_exits_are_taken_on_the_agents_word(
        ending: ScriptEnding, expected: Finished | None) -> None:
    assert told_outcome(view(), ending) == expected


def test_a_pod_being_deleted_or_evicted_waits_for_the_runtime() -> None:
    deleting = view(deletionTimestamp="2026-12-05T00:00:00Z")
    assert told_outcome(deleting, ScriptEnding(0, None, 0, False)) is None
    evicted = view(status={"phase": "Running", "reason": "Evicted", "message": "memory"})
    assert told_outcome(evicted, ScriptEnding(0, None, 0, False)) is None


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

async def running_job_42(world: Any, *frames: str) -> tuple[asyncio.Queue[dict[str, Any]], dict[str, Any]]:
    """Job 42's one pod on kube1, running, its log these frames: (the waiter's queue, the pod)."""
    reconciler, kube, cache = world
    queue = start(reconciler, 42)
    await reconciler.reconcile(42)
    (manifest,) = kube.created
    cache.apply("MODIFIED", _pod(manifest, **RUNNING))
    kube.log_lines = {"slurm-42-0": [(f"2026-12-05T10:00:01.{i + 1}Z", f) for i, f in enumerate(frames)]}
    return queue, manifest



async def test_the_ending_frame_ends_the_job_before_the_kubelet_reports_it(world: Any) -> None:
    reconciler, _kube, _cache = world
    queue, _manifest = await running_job_42(world, o_frame(b"out\n"), x_frame("exited 3 oom 0 stop 0"))

    await settle(reconciler, 42)

    events = [queue.get_nowait() for _ in range(queue.qsize())]
    assert [e["type"] for e in events] == ["out", "exit"], events
    assert base64.b64decode(events[0]["data"]) == b"out\n"
    assert events[-1] == {"type": "exit", "code": 3, "signal": None, "reason": ""}


async def test_without_the_frame_the_job_waits_for_the_kubelet(world: Any) -> None:
    reconciler, kube, cache = world
    queue, manifest = await running_job_42(world, o_frame(b"out\n"))

    await settle(reconciler, 42)
    # (The stand-in's stream ends at once and yields its lines again: only "out" events, no end.)
    assert {e["type"] for e in (queue.get_nowait() for _ in range(queue.qsize()))} == {"out"}

    kube.log_lines = {}
    cache.apply("MODIFIED", _pod(manifest, **_terminated(3)))
    await settle(reconciler, 42)
    events = [queue.get_nowait() for _ in range(queue.qsize())]
    assert events[-1] == {"type": "exit", "code": 3, "signal": None, "reason": ""}


async def test_a_signal_in_the_frame_waits_for_the_runtimes_word(world: Any) -> None:
    reconciler, _kube, _cache = world
    queue, _manifest = await running_job_42(world, x_frame("signaled 9 oom 1 stop 0"))

    await settle(reconciler, 42)

    assert queue.empty(), "an OOM kill must be explained from the runtime's OOMKilled"


async def test_the_next_jobs_pod_waits_until_the_kubelet_saw_the_early_ended_one_stop(world: Any) -> None:
    reconciler, kube, cache = world
    _, first = await running_job_42(world, x_frame("exited 0 oom 0 stop 0"))
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
    reconciler, kube, _cache = world
    _, _first = await running_job_42(world, x_frame("exited 0 oom 0 stop 0"))
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
    forged = x_frame("exited 0 oom 0 stop 0")
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


async def test_a_multi_node_jobs_other_pods_hold_their_nodes_until_they_stop(world: Any) -> None:
    """The status path too: pod 0 ended, the other node's `agent wait` pod runs until it is deleted;
    the next job on that node waits for it to stop, as a native node stays COMPLETING."""
    reconciler, kube, cache = world
    reconciler.jobs.record(replace(allocation(), read_at=time.monotonic()))  # kube1 and kube2
    session = reconciler.attach_session(42, payload())
    session.payload = payload()
    session.attach({})
    await reconciler.reconcile(42)
    first, second = kube.created
    cache.apply("MODIFIED", _pod(first, **_terminated(0)))
    cache.apply("MODIFIED", _pod(second, **RUNNING))
    await settle(reconciler, 42)
    assert session.final is not None
    assert reconciler.early_endings.holding(["kube1", "kube2"]) == ["slurm-42-1"]

    reconciler.jobs.record(replace(one_node(43), nodes=(NodeAllocation("kube2", cpus=1, memory_mb=64,
                                                                       gpu_indices=()),)))
    nxt = reconciler.attach_session(43, payload())
    nxt.payload = payload()
    nxt.attach({})
    await reconciler.reconcile(43)
    assert "slurm-43-0" not in [m["metadata"]["name"] for m in kube.created]
    cache.apply("DELETED", _pod(second))
    await reconciler.reconcile(43)
    assert "slurm-43-0" in [m["metadata"]["name"] for m in kube.created]


async def test_a_kubelet_that_never_reports_the_stop_holds_its_node_only_so_long(
        world: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    reconciler, kube, _cache = world
    _, _first = await running_job_42(world, x_frame("exited 0 oom 0 stop 0"))
    await settle(reconciler, 42)
    start(reconciler, 43)
    await reconciler.reconcile(43)
    assert len(kube.created) == 1

    monkeypatch.setattr(early_endings, "HOLD_LIMIT_S", 0.0)
    await reconciler.reconcile(43)
    assert [m["metadata"]["name"] for m in kube.created] == ["slurm-42-0", "slurm-43-0"]


def test_a_gang_pod_is_not_bound_where_an_ended_run_still_holds_the_node(tmp_path: Path) -> None:
    """The Kubernetes-submitted path places its pods by binding: it waits for the node too."""
    from .builders import workloads_config
    from .test_kube_workloads_bind_only_their_own_jobs_pods import KEY, World, pod

    cfg = workloads_config(tmp_path, KEY, '[partitions.k8s]\n[workloads.namespaces.team-alice]\n'
                                          'user = "alice"\naccount = "lab_alice"\npartition = "k8s"\n')
    world = World(cfg, pod("a", job=800, gang="g"), pod("b", job=800, gang="g"))
    cache = PodCache()
    ended = EarlyEndings(cache)
    world.workloads.ended_runs = ended
    old = {"metadata": {"name": "slurm-41-0", "labels": {"slurm-k8s-bridge/job-id": "41"}},
           "spec": {"nodeName": "kreal1"}, "status": RUNNING}
    cache.apply("ADDED", old)
    ended.record([pod_view(old)])
    alloc = world.running(800, "alice", 2001, world.signed("a", "team-alice", "alice", gang="g"), tasks=2)

    result = asyncio.run(world.workloads.reconcile_job(800, alloc))
    assert not [e for e in world.verbs.log if e[0] == "bind"]
    assert result.requeue_after is not None and result.requeue_after <= 0.5

    cache.apply("MODIFIED", {**old, "status": _terminated(0)})
    asyncio.run(world.workloads.reconcile_job(800, alloc))
    assert {e[1] for e in world.verbs.log if e[0] == "bind"} == {"a", "b"}


def test_a_script_that_traps_the_kubelets_term_says_it_was_stopped(agent: Path, tmp_path: Path) -> None:  # noqa: F811
    """An eviction's SIGTERM: the script traps it and exits 3; the ending says stop 1, so the daemon
    waits for the pod's status and its reason (Evicted, ...)."""
    pidfile = tmp_path / "script.pid"
    proc = subprocess.Popen([str(agent), "run", str(pidfile), "merged", "--", "/bin/sh", "-c",
                             "trap 'exit 3' TERM; echo ready; while :; do sleep 0.05; done"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 10
    while not pidfile.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    stdout, _ = proc.communicate(timeout=30)

    ending = parse_ending(frame_lines(stdout)[-1][2:].decode())
    assert ending == ScriptEnding(3, None, ending.oom_kills if ending else None, True), stdout[-200:]
    assert proc.returncode == 3
