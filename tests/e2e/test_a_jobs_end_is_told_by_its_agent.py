"""Issue 22: a bridged batch job ends on its agent's last log frame ("x"), not a kubelet status
cycle later; with the same exit codes, output and states as native Slurm, jobs at once; the job's
own processes cannot write that frame; and a pod of the next job on the same node is placed only
once the kubelet has seen the early-ended one stop.

Times are printed (run with -s), never asserted."""

from __future__ import annotations

import base64
import re
import statistics
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.e2e.sandbox import SANDBOX_LOGS, Sandbox, job_trail, wait_until, write_script

BUSYBOX = "#K8S image=sandbox.local/busybox:1\n"
CODES = (0, 1, 3, 0, 42, 0)


def metric(name: str) -> float:
    with urllib.request.urlopen("http://127.0.0.1:8470/metrics", timeout=5) as response:
        text = response.read().decode()
    line = next((line for line in text.splitlines() if line.startswith(f"slurm_k8s_bridge_{name} ")), None)
    return float(line.split()[1]) if line else 0.0


def outputs(sandbox: Sandbox, partition: str, tag: str, code: int, index: int) -> tuple[int, Path, Path]:
    script = write_script(sandbox, "alice", f"{tag}-{partition}-{index}.sh",
                          f"#!/bin/sh\n{BUSYBOX}echo out-{index}\necho err-{index} >&2\nsleep 2\n"
                          f"printf 'last without newline'\nexit {code}\n")
    out, err = (sandbox.home("alice") / f"{tag}-{partition}-{index}.{kind}" for kind in ("out", "err"))
    job = sandbox.sbatch("-p", partition, "-o", str(out), "-e", str(err), str(script))
    return job, out, err


def test_jobs_at_once_end_with_natives_states_codes_and_bytes(bridge: Sandbox) -> None:
    told_before = metric("batch_ends_told_by_agent_total")
    submitted = {part: [outputs(bridge, part, "told", code, i) for i, code in enumerate(CODES)]
                 for part in ("native", "k8s")}
    with ThreadPoolExecutor(len(CODES) * 2) as pool:
        finals = {part: list(pool.map(lambda j: bridge.wait_job_final(j[0], timeout=180), jobs))
                  for part, jobs in submitted.items()}
    for i, code in enumerate(CODES):
        native, bridged = finals["native"][i], finals["k8s"][i]
        job, out, err = submitted["k8s"][i]
        assert (bridged["State"], bridged["ExitCode"]) == (native["State"], native["ExitCode"]), \
            f"{bridged} vs {native}\n{job_trail(job)}"
        assert bridged["ExitCode"] == f"{code}:0"
        _, native_out, native_err = submitted["native"][i]
        assert out.read_bytes() == native_out.read_bytes() == f"out-{i}\nlast without newline".encode()
        assert err.read_bytes() == native_err.read_bytes() == f"err-{i}\n".encode()
    # A 2 s script's end reaches the daemon on its log stream before the kubelet relists (each
    # second): at least one of the six plain ends (exit 0 needs no OOM count) is taken from it.
    assert metric("batch_ends_told_by_agent_total") > told_before


@pytest.mark.shares_the_cluster
def test_the_script_cannot_forge_its_agents_ending(bridge: Sandbox) -> None:
    """The job's processes are its user's, without capabilities: the agent's stdout (the log the
    daemon reads) is closed to them, so an "exited 0" written there is refused, and the job ends
    as its script does, after its last line."""
    forged = "x " + base64.b64encode(b"exited 0 oom 0").decode()
    body = (f"#!/bin/sh\n{BUSYBOX}"
            f"if echo '{forged}' 2>/dev/null > /proc/$PPID/fd/1; then echo forged; else echo refused; fi\n"
            "for fd in /proc/[0-9]*/fd/1; do\n"
            f"  [ \"$fd\" = /proc/$$/fd/1 ] || {{ echo '{forged}' > \"$fd\"; }} 2>/dev/null &&\n"
            "  echo \"wrote $fd\"\n"
            "done\n"
            "sleep 3\necho after\nexit 7\n")
    script = write_script(bridge, "alice", "forge-ending.sh", body)
    out = bridge.home("alice") / "forge-ending.out"
    job = bridge.sbatch("-p", "k8s", "-o", str(out), str(script))
    row = bridge.wait_job_final(job, timeout=120)

    assert (row["State"], row["ExitCode"]) == ("FAILED", "7:0"), f"{row}\n{job_trail(job)}"
    lines = out.read_text().splitlines()
    assert lines[0] == "refused", lines
    assert lines[-1] == "after", lines
    # Only its own processes' fds (itself, its children) may have been written: framed output.
    assert all(line in ("refused", "after") or line.startswith("wrote ") or line.startswith("x ")
               for line in lines), lines


def test_back_to_back_jobs_on_one_node_wait_for_the_kubelet_to_see_the_last_stop(bridge: Sandbox) -> None:
    """Exclusive tasks on kreal1, one after the other: each next pod is created only once the
    kubelet saw the previous one stop (it counts its requests until then); all complete."""
    script = write_script(bridge, "alice", "back-to-back.sh",
                          f"#!/bin/sh\n{BUSYBOX}sleep 2\necho task-$SLURM_ARRAY_TASK_ID\n")
    held_before = metric("pod_creations_held_total")
    array = bridge.sbatch("-p", "k8s", "-w", "kreal1", "--exclusive", "--array=0-5%1",
                          "-o", str(bridge.home("alice") / "back-to-back-%a.out"), str(script))

    def all_final() -> list[str] | None:
        out = bridge.slurm("sacct", "-X", "-n", "-P", "-j", str(array), "-o", "JobID,State,ExitCode").stdout
        rows = [line for line in out.splitlines() if re.match(rf"{array}_\d+\|", line)]
        done = [r for r in rows if r.split("|")[1] not in ("PENDING", "RUNNING", "REQUEUED")]
        return rows if len(done) == 6 else None

    rows = wait_until("the six tasks to end", all_final, timeout=240)
    assert all(row.split("|")[1:] == ["COMPLETED", "0:0"] for row in rows), f"{rows}\n{job_trail(array)}"
    for task in range(6):
        assert (bridge.home("alice") / f"back-to-back-{task}.out").read_text() == f"task-{task}\n"
    refused = [line for line in (SANDBOX_LOGS / "bridge.log").read_text().splitlines()
               if "Kubernetes refused the pod" in line and f'"job_id": {array}' in line]
    assert not refused, refused
    held = metric("pod_creations_held_total") - held_before
    print(f"\npod creations held for an early-ended pod: {held:g}")


def test_pod_end_to_job_end_is_printed(bridge: Sandbox) -> None:
    """The daemon's pod_end_to_job_end_s of a few 2 s jobs on the real kubelets (printed)."""
    script = write_script(bridge, "alice", "end-latency.sh", f"#!/bin/sh\n{BUSYBOX}sleep 2\n")
    jobs = [bridge.sbatch("-p", "k8s", "-o", "/dev/null", str(script)) for _ in range(4)]
    for job in jobs:
        assert bridge.wait_job_final(job, timeout=120)["State"] == "COMPLETED", job_trail(job)
    log = (SANDBOX_LOGS / "bridge.log").read_text().splitlines()
    took = [float(m.group(1)) for line in log for job in jobs
            if f'"job_id": {job},' in line and (m := re.search(r'"pod_end_to_job_end_s": ([0-9.]+)', line))]
    assert took, "the daemon logs how long each end took"
    print(f"\npod end -> job end: median {statistics.median(took):.3f} s, max {max(took):.3f} s "
          f"({len(took)} jobs)")
