"""Signals for the batch script under load: `--signal=B:USR1@T` and `scancel -s USR1 --batch` on
arrays of dozens of tasks at once. Every script traps USR1, writes a line and ends 0; one lost
signal shows as a TIMEOUT or a task that ran into its time limit (CI once lost one: the exec into
a container that had just started failed, and the signal went with it).

Wall times are printed (run with -s), never asserted."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.e2e.sandbox import Sandbox, wait_until, write_script
from tests.e2e.test_every_exit_code_right_under_load import BUSYBOX, _all_final

TASKS = 24
TRAPPING_SCRIPT = (
    "#!/bin/sh\n" + BUSYBOX + "trap 'echo checkpoint; exit 0' USR1\necho started\n"
    "i=0; while [ $i -lt 200 ]; do sleep 1; i=$((i+1)); done\necho never\n"
)


SLURMSTEPD_LINE = re.compile(rb"^\[\d{4}-\d\d-\d\dT[\d:.]+\] error: .*\n", re.MULTILINE)
"""A line slurmstepd writes into the job's file itself. Native Slurm wrote one under load as a task
ended (`_handle_signal_container: failed signal 18 pid ... No such process`): not the script's."""


def _script_output(raw: bytes) -> bytes:
    """What the script wrote: the file without slurmstepd's own lines."""
    return SLURMSTEPD_LINE.sub(b"", raw)


def _outputs(directory: Path, array_id: int) -> dict[int, bytes]:
    return {int(path.stem.rpartition("_")[2]): _script_output(path.read_bytes())
            for path in directory.glob(f"sig-{array_id}_*.out")}


def _workdir(sandbox: Sandbox, name: str) -> Path:
    directory = sandbox.home("alice") / f"{name}-{int(time.time())}"
    sandbox.slurm("mkdir", str(directory), user="alice")
    return directory


def _assert_every_task_trapped(
    rows: dict[int, tuple[str, str]], outputs: dict[int, bytes], what: str
) -> None:
    wrong = {task: row for task, row in rows.items() if row != ("COMPLETED", "0:0")}
    assert not wrong, f"{what}: tasks whose USR1 did not reach the script: {wrong}"
    assert len(rows) == TASKS
    odd = {task: out for task, out in outputs.items() if out != b"started\ncheckpoint\n"}
    assert not odd, f"{what}: output files {odd}"
    assert len(outputs) == TASKS


def test_signal_before_the_time_limit_reaches_every_task_of_an_array_like_native(bridge: Sandbox) -> None:
    directory = _workdir(bridge, "batch-signal")
    script = write_script(bridge, "alice", "trap-usr1.sh", TRAPPING_SCRIPT)
    timings = {}
    started = time.monotonic()
    # Both arrays at once (their nodes are apart): the same load for each, half the wall time.
    array_ids = {}
    for partition in ("native", "k8s"):
        # @60 of 2 minutes comes 30 to 60 s in (slurmctld checks every 30 s, within @T+30 s of the
        # end): after a native script set its trap (@50 of 1 minute came at once, and natively
        # beat the batch step's start or its trap: TIMEOUT and 0:10 under CI load), and before
        # the limit with a minute to spare for a bridged pod.
        array_ids[partition] = bridge.sbatch(
            "-p", partition, f"--array=0-{TASKS - 1}", "--mem=100M", "--time=2", "--signal=B:USR1@60",
            "-o", f"{directory}/sig-%A_%a.out", str(script))
    for partition, array_id in array_ids.items():
        rows = wait_until(f"{TASKS} tasks in {partition}", lambda a=array_id: _all_final(bridge, [a], TASKS),
                          timeout=600, interval=1)[array_id]
        timings[partition] = time.monotonic() - started
        _assert_every_task_trapped(rows, _outputs(directory, array_id), partition)
    print(f"\n{TASKS}-task --signal=B:USR1@60 array: native {timings['native']:.1f}s, "
          f"k8s {timings['k8s']:.1f}s")


def test_scancel_batch_signal_the_moment_a_task_runs_is_not_lost(bridge: Sandbox) -> None:
    """The signal comes while the waiter is starting, has not attached yet, or its pod is not
    running: in each case the script gets it once it runs. (Natively a signal this early may beat
    the script's own trap, so there is no native side to compare.)"""
    directory = _workdir(bridge, "scancel-signal")
    script = write_script(bridge, "alice", "trap-usr1-scancel.sh", TRAPPING_SCRIPT)
    array_id = bridge.sbatch("-p", "k8s", f"--array=0-{TASKS - 1}", "--mem=100M", "--time=5",
                             "-o", f"{directory}/sig-%A_%a.out", str(script))
    tried: set[str] = set()
    taken: set[str] = set()
    refusals: list[str] = []
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        running = set(bridge.slurm("squeue", "-h", "-r", "-t", "RUNNING", "-j", str(array_id), "-o", "%i",
                                   check=False).stdout.split())
        if len(tried) == TASKS and not running - taken:
            break
        for task in sorted(running - taken):
            tried.add(task)
            # A scancel Slurm refused is sent again while the task runs: a signal Slurm never
            # sent must not pass for one the bridge lost.
            answer = bridge.slurm("scancel", "-s", "USR1", "--batch", task, user="alice", check=False)
            if answer.returncode == 0:
                taken.add(task)
            else:
                refusals.append(f"{task}: {answer.stderr.strip()}")
        time.sleep(0.2)
    assert len(tried) == TASKS, f"only {len(tried)} tasks were seen running"
    if refusals:
        print(f"\nscancel refused {len(refusals)} times: {refusals[:5]}")
    rows = wait_until(f"{TASKS} signalled tasks", lambda: _all_final(bridge, [array_id], TASKS),
                      timeout=600, interval=1)[array_id]
    _assert_every_task_trapped(rows, _outputs(directory, array_id), "k8s, scancel --batch")


TERM_JOBS = 6
TERM_TRAPPING_SCRIPT = (
    "#!/bin/sh\n" + BUSYBOX + "trap 'echo got-term' TERM\necho started\n"
    "i=0; while [ $i -lt 30 ]; do sleep 1; i=$((i+1)); done\necho still-here\nexit 4\n"
)


@pytest.mark.shares_the_cluster
def test_a_term_that_only_signals_and_a_cancel_at_once_each_do_as_natively(bridge: Sandbox) -> None:
    """Both TERMs of the batch step at once, on jobs in both partitions: `scancel -s TERM -b` of
    half of them is a signal (the trap runs, the script goes on and exits 4), `scancel` of the
    others ends them. The bridge took every TERM for a cancel; it now asks Slurm's view, and a
    wave of both must not mix them up. Jobs, not an array: natively `scancel --batch` of an array
    task is refused at times, or retried by scancel for seconds."""
    directory = _workdir(bridge, "term-signal")
    script = write_script(bridge, "alice", "trap-term.sh", TERM_TRAPPING_SCRIPT)
    jobs = {(partition, index): bridge.sbatch("-p", partition, "--mem=100M", "--time=5",
                                              "-o", f"{directory}/term-%j.out", str(script))
            for partition in ("native", "k8s") for index in range(TERM_JOBS)}

    def started(job: int) -> bool:
        out = directory / f"term-{job}.out"
        return out.exists() and b"started" in out.read_bytes()

    # Each job once its trap has been set for a second.
    seen_started: dict[int, float] = {}
    acted: set[int] = set()
    deadline = time.monotonic() + 300
    while len(acted) < len(jobs) and time.monotonic() < deadline:
        for (_, index), job in jobs.items():
            if job in acted or not started(job):
                continue
            now = time.monotonic()
            if now - seen_started.setdefault(job, now) < 1.0:
                continue
            signal_only = ("-s", "TERM", "--batch") if index % 2 == 0 else ()
            bridge.slurm("scancel", *signal_only, str(job), user="alice")
            acted.add(job)
        time.sleep(0.2)
    assert len(acted) == len(jobs), f"only {len(acted)} jobs were seen running within 300 s"
    wait_until("every job final", lambda: all(_final(bridge, job) for job in jobs.values()), timeout=300)
    for (partition, index), job in jobs.items():
        state = _final(bridge, job)
        output = _script_output((directory / f"term-{job}.out").read_bytes())
        if index % 2 == 0:
            assert (state, output) == (("FAILED", "4:0"), b"started\ngot-term\nstill-here\n"), \
                f"{partition} job {job}: a TERM that only signals ended it otherwise"
        else:
            assert state is not None and state[0] == "CANCELLED", f"{partition} job {job}: {state}"
            assert b"still-here" not in output, f"{partition} job {job}: its script went on: {output!r}"


def _final(sandbox: Sandbox, job: int) -> tuple[str, str] | None:
    """(State, ExitCode) of the job once sacct shows it ended."""
    out = sandbox.slurm("sacct", "-X", "-n", "-P", "-j", str(job), "-o", "State,ExitCode", check=False).stdout
    if not out.strip():
        return None
    state, code = out.strip().splitlines()[0].split("|")
    if state in ("PENDING", "RUNNING", "REQUEUED", "SUSPENDED"):
        return None
    return state.split()[0], code


EARLY_JOBS = 6
SRUN_FIRST = "#!/bin/bash\necho started\nsrun sleep 300\necho after\n"


@pytest.mark.shares_the_cluster
def test_a_job_cancelled_while_its_first_srun_starts_ends_without_the_kill(bridge: Sandbox) -> None:
    """scancel in a job's first second, while its script's srun asks for a step: Slurm makes no
    step in an ending job and native srun ends on its TERM, so the batch step ends with the job.
    The bridged srun waited for a step that never came, and the batch step ended only at the
    pod's KILL (KillWait, 9 s here), its node held COMPLETING meanwhile (found by a Parsl probe:
    a block scaled in just after it started). Six jobs, cancelled 0.2 to 1.2 s after they run (the
    pod made, its container starting, the script's srun asking)."""
    directory = bridge.home("alice") / "early-cancel"
    directory.mkdir(exist_ok=True)
    directory.chmod(0o777)
    script = write_script(bridge, "alice", "srun-first.sh", SRUN_FIRST)
    jobs = [bridge.sbatch("-p", "k8s", "-c", "1", "-o", f"{directory}/%j.out", str(script))
            for _ in range(EARLY_JOBS)]
    try:
        delays = {job_id: 0.2 * (index + 1) for index, job_id in enumerate(jobs)}
        started: dict[int, float] = {}
        deadline = time.monotonic() + 120
        while len(started) < len(jobs) and time.monotonic() < deadline:
            running = bridge.slurm("squeue", "-h", "-t", "RUNNING", "-o", "%i", "-j",
                                   ",".join(map(str, jobs)), check=False).stdout.split()
            for job_id in jobs:
                if str(job_id) in running:
                    started.setdefault(job_id, time.monotonic())
            for job_id, since in list(started.items()):
                if job_id in delays and time.monotonic() - since >= delays[job_id]:
                    bridge.slurm("scancel", str(job_id))
                    del delays[job_id]
            time.sleep(0.05)
        while delays:
            job_id = next(iter(delays))
            time.sleep(max(0.0, started[job_id] + delays.pop(job_id) - time.monotonic()))
            bridge.slurm("scancel", str(job_id))
        assert len(started) == len(jobs), f"jobs {sorted(set(jobs) - set(started))} never ran"
        # Until slurmctld lets go of them (COMPLETING ends with the batch step): sacct shows a
        # step still running with its job's end time.
        wait_until("the cancelled jobs completed", lambda: not bridge.slurm(
            "squeue", "-h", "-t", "RUNNING,COMPLETING", "-o", "%i", "-j", ",".join(map(str, jobs)),
            check=False).stdout.split() or None, timeout=120, interval=0.5)
        time.sleep(2)  # slurmdbd records the steps' ends
    finally:
        bridge.slurm("scancel", *map(str, jobs), check=False)
    late = {}
    for job_id in jobs:
        out = bridge.slurm("sacct", "-n", "-P", "-j", str(job_id), "-o", "JobID,State,End").stdout
        rows = {line.split("|")[0]: line.split("|") for line in out.splitlines()}
        job_end, batch_end = (rows[name][2] for name in (str(job_id), f"{job_id}.batch"))
        assert rows[str(job_id)][1].startswith("CANCELLED"), rows
        gap = (time.mktime(time.strptime(batch_end, "%Y-%m-%dT%H:%M:%S"))
               - time.mktime(time.strptime(job_end, "%Y-%m-%dT%H:%M:%S")))
        if gap >= 7:  # the pod's grace (9 s) ran out: its KILL ended it; a TERM takes 1 to 4 s
            late[job_id] = gap
    assert not late, f"batch steps that ended only by the KILL, seconds after their job: {late}"
