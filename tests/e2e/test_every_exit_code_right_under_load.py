"""Every exit code right under load (issue 8): arrays of dozens of tasks, several at once, in k8s
and sim, while the daemon, slurmrestd, munged and the API server are killed and restarted; a
requeued job runs again in fresh pods; sandbox-up on a running sandbox restarts nothing.

Wall times are printed (run with -s), never asserted: these machines are shared and noisy."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from tests.e2e.sandbox import BRIDGE_UP, REPO, Sandbox, job_pods, job_trail, wait_until, write_script
from tests.e2e.test_bridge_survives_and_scales import PodCounter

STATE = Path("/var/lib/slurm-k8s-sandbox")
TASKS = 64
BUSYBOX = "#K8S image=sandbox.local/busybox:1\n"
ARRAY_SCRIPT = "#!/bin/sh\n" + BUSYBOX + "echo task-$SLURM_ARRAY_TASK_ID\nexit $((SLURM_ARRAY_TASK_ID % 5))\n"


def _tasks(sandbox: Sandbox, array_id: int) -> dict[int, tuple[str, str]] | None:
    """None while sacct cannot answer (munged or slurmdbd restarting under a fault test)."""
    result = sandbox.slurm("sacct", "-X", "-n", "-P", "-j", str(array_id), "-o", "JobID,State,ExitCode",
                           check=False)
    if result.returncode != 0:
        return None
    out = result.stdout
    rows: dict[int, tuple[str, str]] = {}
    for line in out.splitlines():
        job, state, code = line.split("|")
        task = job.partition("_")[2]
        if task.isdigit():
            rows[int(task)] = (state, code)
    return rows


Rows = dict[int, dict[int, tuple[str, str]]]
"""Array id -> task -> (State, ExitCode)."""


def _all_final(sandbox: Sandbox, array_ids: list[int], count: int) -> Rows | None:
    """The arrays' rows once Slurm lists none of their tasks any more. sacct alone is not enough:
    a task whose launch Slurm could not send (munged down under the fault test) ends as NODE_FAIL
    and is requeued by Slurm itself, as natively; it runs again after its BeginTime."""
    # By array id over all jobs: `squeue -j` fails once slurmctld has forgotten a finished job.
    listed = sandbox.slurm("squeue", "-h", "-r", "-o", "%F", check=False)
    if listed.returncode != 0 or {str(i) for i in array_ids} & set(listed.stdout.split()):
        return None
    result: Rows = {}
    for array_id in array_ids:
        tasks = _tasks(sandbox, array_id)
        if tasks is None:
            return None
        result[array_id] = tasks
    for rows in result.values():
        final = [r for r in rows.values() if r[0] not in ("PENDING", "RUNNING", "REQUEUED")]
        if len(final) < count:
            return None
    return result


def _expected(code: int) -> tuple[str, str]:
    return ("COMPLETED" if code == 0 else "FAILED", f"{code}:0")


def _metric(name: str) -> float:
    with urllib.request.urlopen("http://127.0.0.1:8470/metrics", timeout=5) as response:
        text = response.read().decode()
    match = re.search(rf"^slurm_k8s_bridge_{name} ([0-9.e+]+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def _run_arrays(
    sandbox: Sandbox, partition: str, arrays: list[tuple[str, ...]], count: int,
    during: Callable[[], None] | None = None, output: str = "/dev/null",
) -> tuple[float, Rows, PodCounter | None]:
    script = write_script(sandbox, "alice", f"load-{partition}.sh", ARRAY_SCRIPT)
    started = time.monotonic()
    ids = [sandbox.sbatch("-p", partition, *args, "-o", output, str(script)) for args in arrays]
    counter = None
    if partition != "native":
        counter = PodCounter(sandbox, "app.kubernetes.io/managed-by=slurm-k8s-bridge")
        counter.__enter__()
    try:
        if during is not None:
            during()
        rows = wait_until(f"{len(ids)}x{count} tasks in {partition}", lambda: _all_final(sandbox, ids, count),
                          timeout=900, interval=1)
    finally:
        if counter is not None:
            counter.__exit__()
    return time.monotonic() - started, rows, counter


def _assert_pods_once(counter: PodCounter | None) -> None:
    """No pod name was seen with two uids (= created twice) while the sampler ran."""
    assert counter is not None and counter.samples, "the pod sampler ran"
    twice = {name: uids for name, uids in counter.uids.items() if len(uids) > 1}
    assert not twice, f"pods created more than once: {twice}"


def test_three_rounds_of_a_64_task_array_match_native(bridge: Sandbox) -> None:
    native_s, native_rows, _ = _run_arrays(bridge, "native", [("--array=0-63%8", "--mem=100M")], TASKS)
    for task, row in native_rows[next(iter(native_rows))].items():
        assert row == _expected(task % 5), ("native", task, row)
    created_before = _metric("pods_created_total")
    timings = []
    for round_no in range(3):
        seconds, rows, counter = _run_arrays(bridge, "k8s", [("--array=0-63%8", "--mem=100M")], TASKS)
        timings.append(seconds)
        (array_id,) = rows
        wrong = {t: r for t, r in rows[array_id].items() if r != _expected(t % 5)}
        assert not wrong, f"round {round_no}: wrong State/ExitCode {wrong}"
        assert len(rows[array_id]) == TASKS
        assert bridge.slurm("squeue", "-h", "-j", str(array_id)).stdout.strip() == "", "no task left running"
        _assert_pods_once(counter)
    created = _metric("pods_created_total") - created_before
    assert created == 3 * TASKS, f"{created} pods created for {3 * TASKS} tasks"
    rounds = ", ".join(f"{t:.1f}s" for t in timings)
    print(f"\n64-task array %8: native {native_s:.1f}s; bridged rounds {rounds} "
          f"(mean ratio {sum(timings) / 3 / native_s:.2f})")


def test_200_tasks_in_sim_complete_through_kwok_with_their_exit_codes(bridge: Sandbox) -> None:
    arrays = [("--array=0-39%16", f"--export=ALL,SIM_EXIT_CODE={code},SIM_RUN_TIME=2s") for code in range(5)]
    seconds, rows, counter = _run_arrays(bridge, "sim", arrays, 40)
    for code, array_id in enumerate(rows):
        states = set(rows[array_id].values())
        assert states == {_expected(code)}, (array_id, code, states)
        assert len(rows[array_id]) == 40
    _assert_pods_once(counter)
    print(f"\n200 sim tasks (5 arrays x 40, %16 each): {seconds:.1f}s")


# -- faults during a round --------------------------------------------------------------------------

def _pid(name: str) -> int:
    return int((STATE / "run" / f"{name}.pid").read_text())


def _kill_and_restart(name: str) -> None:
    """Kill one sandbox daemon and let an idempotent sandbox-up start just that one again. The
    bridge and the API server crash (SIGKILL: a graceful API server shutdown drains for a minute);
    slurmrestd and munged are stopped as a restart would."""
    os.kill(_pid(name), signal.SIGKILL if name in ("bridge", "kube-apiserver") else signal.SIGTERM)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(_pid(name), 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    if name == "bridge":
        subprocess.run([str(BRIDGE_UP)], check=True, capture_output=True)
    else:
        subprocess.run(["make", "-s", "-C", str(REPO), "sandbox-up"], check=True, capture_output=True)


def _what_happened(sandbox: Sandbox, array_id: int, tasks: list[int]) -> str:
    """Each failed task's -o file and what the logs say about its job: CI's machine is gone after."""
    raw = sandbox.slurm("sacct", "-X", "-n", "-P", "-j", str(array_id), "-o", "JobID,JobIDRaw",
                        check=False).stdout
    ids = dict(line.split("|") for line in raw.splitlines() if "|" in line)
    parts = []
    for task in tasks:
        out = sandbox.home("alice") / f"faults-{array_id}_{task}.out"
        text = out.read_text(errors="replace")[-2000:] if out.exists() else "(no -o file)"
        parts.append(f"=== task {task}: -o file\n{text}")
        job_id = ids.get(f"{array_id}_{task}", "")
        if job_id.isdigit():
            parts.append(job_trail(int(job_id)))
    return "\n".join(parts)


def test_faults_during_a_round_fail_no_task(bridge: Sandbox) -> None:
    faults_done: list[str] = []

    def faults() -> None:
        # Each fault while tasks start and end: the daemon (kill -9), slurmrestd, munged, the API server.
        for name in ("bridge", "slurmrestd", "munged", "kube-apiserver"):
            time.sleep(4)
            _kill_and_restart(name)
            faults_done.append(name)

    worker = threading.Thread(target=faults, daemon=True)
    # Each task's output kept: a failure below shows what the failed task's waiter said.
    output = str(bridge.home("alice") / "faults-%A_%a.out")
    seconds, rows, counter = _run_arrays(bridge, "k8s", [("--array=0-63%8", "--mem=100M")], TASKS,
                                         during=worker.start, output=output)
    worker.join(timeout=300)
    assert faults_done == ["bridge", "slurmrestd", "munged", "kube-apiserver"]
    (array_id,) = rows
    wrong = {t: r for t, r in rows[array_id].items() if r != _expected(t % 5)}
    assert not wrong, f"tasks failed by the faults: {wrong}\n" + _what_happened(bridge, array_id, list(wrong))
    _assert_pods_once(counter)
    print(f"\n64 tasks with 4 faults: {seconds:.1f}s")


# -- requeue ------------------------------------------------------------------------------------------

REQUEUE_SCRIPT = (
    'echo "run ${SLURM_RESTART_COUNT:-0}"\n'
    '[ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] || sleep 300\n'
    "exit 7\n"
)


def _requeue_once(bridge: Sandbox, partition: str) -> tuple[int, dict[str, str], str]:
    header = "#!/bin/sh\n" + (BUSYBOX if partition != "native" else "")
    script = write_script(bridge, "alice", f"requeue-{partition}.sh", header + REQUEUE_SCRIPT)
    job_id = bridge.sbatch("-p", partition, "--requeue", str(script))
    out = bridge.home("alice") / f"slurm-{job_id}.out"
    wait_until(f"first run of job {job_id} printed", lambda: out.exists() and out.read_text() == "run 0\n",
               timeout=60)
    bridge.slurm("scontrol", "requeue", str(job_id))
    # Slurm makes a requeued job eligible 2 minutes after its first run has ended (for a bridged
    # job: once its pods are gone); both partitions skip that wait alike, once it is pending again.
    def requeued() -> bool:
        shown = bridge.slurm("scontrol", "show", "job", str(job_id)).stdout
        return "Restarts=1" in shown and "JobState=PENDING" in shown

    wait_until(f"job {job_id} pending again after the requeue", requeued, timeout=60)
    bridge.slurm("scontrol", "update", f"jobid={job_id}", "starttime=now")
    row = bridge.wait_job_final(job_id, timeout=180)
    return job_id, row, out.read_text()


def test_a_requeued_job_runs_again_in_fresh_pods_like_native(bridge: Sandbox) -> None:
    _, native_row, native_out = _requeue_once(bridge, "native")
    seen: dict[str, set[str]] = {}
    job_id, row, out = _requeue_once(bridge, "k8s")
    assert (native_row["State"], native_row["ExitCode"]) == ("FAILED", "7:0")
    assert (row["State"], row["ExitCode"]) == ("FAILED", "7:0")
    assert out == native_out, "the output file ends as the same requeue leaves it natively"
    for pod in job_pods(bridge, job_id):
        seen.setdefault(pod["metadata"]["name"], set()).add(pod["metadata"]["uid"])
    assert all(name != f"slurm-{job_id}-0" for name in seen), "the second run did not adopt run 0's pod"


# -- the sandbox as users drive it -------------------------------------------------------------------

def _daemon_pids() -> dict[str, str]:
    return {path.stem: path.read_text().strip() for path in sorted((STATE / "run").glob("*.pid"))}


def test_sandbox_up_on_a_running_sandbox_restarts_nothing(sandbox: Sandbox) -> None:
    before = _daemon_pids()
    plain = {k: v for k, v in os.environ.items() if k not in ("SLURM_CONF", "KUBECONFIG")}
    for env in (plain, plain, plain, sandbox.environ()):  # the last as after eval "$(make -s sandbox-env)"
        started = time.monotonic()
        result = subprocess.run(["make", "-s", "-C", str(REPO), "sandbox-up"], env=env, capture_output=True,
                                text=True, timeout=120)
        assert result.returncode == 0, result.stderr[-2000:]
        print(f"\nsandbox-up on a running sandbox: {time.monotonic() - started:.1f}s")
    assert _daemon_pids() == before, "a daemon was restarted"
