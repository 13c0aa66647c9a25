"""What a bridged job's processes use reaches Slurm's accounting as a native job's does (issue 21):
jobacct_gather/linux_k8s_bridge (deploy/slurm/jobacct) puts the figures the in-pod agent measured in place
of the waiter's. The same script runs in `native` (the oracle) and in `k8s`: TotalCPU and MaxRSS
agree within 20 %, `sstat` shows the use while it runs, and a seff-like client (reportseff, which
reads sacct as seff does) reports a true CPU efficiency. Several jobs at once each get their own
figures, a daemon restart loses none, and a user can neither forge their own nor touch another's."""

from __future__ import annotations

import base64
import concurrent.futures
import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.sandbox import BRIDGE_UP, REPO, Sandbox, job_trail, wait_until, write_script

IN_SLURM_ROOTFS = REPO / "containers" / "slurm" / "in-ns.sh"
USAGE_DIR = "/run/slurm-k8s-bridge/usage"
SANDBOX_STATE = Path("/var/lib/slurm-k8s-sandbox")


def burn_script(cpu_s: float, hold_mb: int, sleep_s: float = 3.0) -> str:
    """Uses `cpu_s` of CPU (whatever the machine's load) while it holds `hold_mb` MB it has written."""
    return (
        "#!/bin/bash\n#K8S image=sandbox.local/debian-python:12\n"
        "python3 - <<'PY'\n"
        "import time\n"
        f"held = b'x' * ({hold_mb} << 20)\n"
        "start = time.process_time()\n"
        f"while time.process_time() - start < {cpu_s}:\n"
        "    pass\n"
        f"time.sleep({sleep_s})\n"
        "PY\n"
    )


def seconds(text: str) -> float:
    """sacct's [DD-][HH:]MM:SS[.mmm] as seconds."""
    days, _, clock = text.rpartition("-")
    parts = [float(part) for part in clock.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0.0)
    return (int(days) if days else 0) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]


def kilobytes(text: str) -> float:
    """sacct's MaxRSS (1234K, 12.5M, 1.2G) in KiB; 0 when empty."""
    match = re.fullmatch(r"([\d.]+)([KMGT]?)", text.strip())
    if not match:
        return 0.0
    return float(match[1]) * {"": 1 / 1024, "K": 1, "M": 1024, "G": 1024**2, "T": 1024**3}[match[2]]


def batch_usage(sandbox: Sandbox, job_id: int) -> dict[str, str]:
    fields = ("JobID", "State", "TotalCPU", "UserCPU", "SystemCPU", "MaxRSS", "AveCPUFreq")
    out = sandbox.slurm("sacct", "-n", "-P", "-j", f"{job_id}.batch", "-o", ",".join(fields)).stdout
    for line in out.splitlines():
        row = dict(zip(fields, line.split("|"), strict=True))
        if row["JobID"] == f"{job_id}.batch":
            return row
    raise AssertionError(f"no batch step of {job_id} in sacct: {out!r}\n{job_trail(job_id)}")


def assert_as_native(usage: dict[str, dict[str, str]], cpu_s: float, rss_mb: int) -> None:
    """TotalCPU and MaxRSS of the `k8s` row within 20 % of the `native` one's, which must have
    measured at least `cpu_s` and `rss_mb` (the oracle saw the work)."""
    native_cpu, bridged_cpu = (seconds(usage[p]["TotalCPU"]) for p in ("native", "k8s"))
    native_rss, bridged_rss = (kilobytes(usage[p]["MaxRSS"]) for p in ("native", "k8s"))
    assert native_cpu >= cpu_s and native_rss >= rss_mb * 1024, f"the oracle measured the work: {usage}"
    assert 0.8 <= bridged_cpu / native_cpu <= 1.2, usage
    assert 0.8 <= bridged_rss / native_rss <= 1.2, usage


def submit(sandbox: Sandbox, partition: str, name: str, body: str, user: str = "alice") -> int:
    script = write_script(sandbox, user, f"{name}.sh", body)
    out = str(sandbox.home(user) / f"{name}.out")
    return sandbox.sbatch("-p", partition, "-o", out, str(script), user=user)


def live_usage(sandbox: Sandbox, job_id: int) -> tuple[float, float] | None:
    """(AveCPU s, MaxRSS KiB) of the running batch step, as sstat gives them."""
    out = sandbox.slurm("sstat", "-n", "-P", "-j", f"{job_id}.batch", "-o", "AveCPU,MaxRSS",
                        check=False).stdout
    line = out.strip().splitlines()[-1] if out.strip() else ""
    if "|" not in line:
        return None
    cpu, rss = line.split("|")[:2]
    return seconds(cpu), kilobytes(rss)


def reportseff(sandbox: Sandbox, *job_ids: int) -> dict[int, tuple[float, float]]:
    """CPU and memory efficiency (%) of each job, as reportseff (seff's figures, from sacct) has them."""
    tool = shutil.which("reportseff", path=str(Path(sys.executable).parent))
    assert tool, "reportseff is a test dependency (pyproject's test extra)"
    out = subprocess.run([tool, "--no-color", "--format", "JobID,CPUEff,MemEff", *map(str, job_ids)],
                         env=sandbox.environ(), capture_output=True, text=True, check=True,
                         timeout=120).stdout
    result = {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[0].isdigit():
            result[int(fields[0])] = (float(fields[1].rstrip("%")), float(fields[2].rstrip("%")))
    return result


def test_a_bridged_jobs_cpu_and_memory_are_accounted_as_a_native_ones(bridge: Sandbox) -> None:
    body = burn_script(cpu_s=20, hold_mb=300)
    jobs = {partition: submit(bridge, partition, f"usage-{partition}", body)
            for partition in ("native", "k8s")}

    # While it runs, sstat shows what the pod's processes use, not the waiter's few MB.
    cpu, rss = wait_until(
        "sstat to show the bridged job's use",
        lambda: (u if (u := live_usage(bridge, jobs["k8s"])) and u[0] >= 3 and u[1] >= 250 * 1024 else None),
        timeout=120, interval=1.0)
    print(f"\nsstat while running: AveCPU {cpu:.0f} s, MaxRSS {rss / 1024:.0f} MB")

    for job_id in jobs.values():
        row = bridge.wait_job_final(job_id, timeout=300)
        assert row["State"] == "COMPLETED", job_trail(job_id)
    usage = {partition: batch_usage(bridge, job_id) for partition, job_id in jobs.items()}
    print(f"usage: {usage}")
    assert_as_native(usage, cpu_s=20, rss_mb=300)

    efficiency = reportseff(bridge, *jobs.values())
    print(f"reportseff (CPUEff %, MemEff %): {efficiency}")
    native_eff, bridged_eff = efficiency[jobs["native"]], efficiency[jobs["k8s"]]
    # Elapsed differs by the pod's start, so CPUEff a little; before the plugin it was ~0 %.
    assert bridged_eff[0] >= 0.6 * native_eff[0], efficiency
    assert abs(bridged_eff[1] - native_eff[1]) <= 0.2 * native_eff[1], efficiency


SHORT_STEPS = """#!/bin/bash
python3 -c 'import time; b = bytearray(100 << 20); time.sleep(3)'
srun python3 -c 'import time; b = bytearray(50 << 20); time.sleep(3)'
"""


def hertz(text: str) -> float:
    """sacct's AveCPUFreq (kHz, with Slurm's K/M/G suffixes) in Hz; 0 when empty."""
    match = re.fullmatch(r"([\d.]+)([KMGT]?)", text.strip())
    if not match:
        return 0.0
    return float(match[1]) * 1000 * {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}[match[2]]


@pytest.mark.shares_the_cluster
def test_no_step_reports_a_cpu_frequency_no_cpu_has(bridge: Sandbox) -> None:
    """AveCPUFreq of a bridged step is weighted by the CPU time of the process slurmstepd measures,
    as for any task. It read 429.49G on 2 of 3 such batch steps (the sweep's probe): the plugin's
    pod CPU figure, left from the last poll, was taken from the waiter's own, and the negative
    difference weighed the frequency as a uint32. Six jobs at once, and a native one beside."""
    jobs = {f"{partition}-{n}": submit(bridge, partition, f"cpufreq-{partition}-{n}", SHORT_STEPS)
            for partition, count in (("k8s", 6), ("native", 1)) for n in range(count)}
    rows: dict[str, float] = {}
    for name, job_id in jobs.items():
        assert bridge.wait_job_final(job_id, timeout=300)["State"] == "COMPLETED", job_trail(job_id)
        out = bridge.slurm("sacct", "-n", "-P", "-j", str(job_id), "-o", "JobID,AveCPUFreq").stdout
        rows |= {f"{name} {step}": hertz(freq) for step, freq in (line.split("|") for line in out.split())}
    print(f"AveCPUFreq: {rows}")
    assert any(hz > 0 for hz in rows.values()), rows  # the figure is there at all
    assert all(hz < 20e9 for hz in rows.values()), rows


@pytest.mark.shares_the_cluster
def test_a_script_waiting_on_its_srun_is_charged_next_to_nothing(bridge: Sandbox) -> None:
    """The script's srun in the pod waits for its step as native srun does, asleep: it looked for
    the step's result file every 20 ms, which charged the batch step ~1 % of a core (1.06 s of CPU
    for a script that only waited 90 s, against native's 0.004 s: the sweep's probe)."""
    body = "#!/bin/bash\nsrun -n 1 sleep 30\n"
    jobs = {partition: submit(bridge, partition, f"srunwait-{partition}", body)
            for partition in ("native", "k8s")}
    for job_id in jobs.values():
        assert bridge.wait_job_final(job_id, timeout=300)["State"] == "COMPLETED", job_trail(job_id)
    usage = {partition: batch_usage(bridge, job_id) for partition, job_id in jobs.items()}
    print(f"usage: {usage}")
    assert seconds(usage["k8s"]["TotalCPU"]) <= seconds(usage["native"]["TotalCPU"]) + 0.1, usage


@pytest.mark.shares_the_cluster
def test_jobs_at_once_each_get_their_own_figures(bridge: Sandbox) -> None:
    sizes = {n: (2 + 2 * n, 64 * (n + 1)) for n in range(4)}  # (CPU s, MB held)
    with concurrent.futures.ThreadPoolExecutor(len(sizes)) as pool:
        jobs = dict(zip(sizes, pool.map(
            lambda n: submit(bridge, "k8s", f"usage-many-{n}", burn_script(*sizes[n], sleep_s=2)), sizes),
            strict=True))
    for job_id in jobs.values():
        assert bridge.wait_job_final(job_id, timeout=300)["State"] == "COMPLETED", job_trail(job_id)
    for n, job_id in jobs.items():
        cpu_s, hold_mb = sizes[n]
        row = batch_usage(bridge, job_id)
        assert cpu_s * 0.9 <= seconds(row["TotalCPU"]) <= cpu_s + 3, (n, row)
        assert hold_mb * 1024 <= kilobytes(row["MaxRSS"]) <= (hold_mb + 60) * 1024, (n, row)


@pytest.mark.parametrize("stop", ["restart", "kill -9"])
def test_a_daemon_restart_loses_no_usage(bridge: Sandbox, stop: str) -> None:
    jobs = [submit(bridge, "k8s", f"usage-restart-{n}", burn_script(cpu_s=8, hold_mb=128)) for n in range(2)]
    for job_id in jobs:
        wait_until(f"job {job_id} running", functools.partial(live_usage, bridge, job_id), timeout=120,
                   interval=1.0)
    if stop == "kill -9":
        os.kill(int((SANDBOX_STATE / "run" / "bridge.pid").read_text()), signal.SIGKILL)
    else:
        subprocess.run([str(BRIDGE_UP.with_name("down.sh"))], check=True, capture_output=True)
    time.sleep(2)
    subprocess.run([str(BRIDGE_UP)], check=True, capture_output=True)
    for job_id in jobs:
        assert bridge.wait_job_final(job_id, timeout=300)["State"] == "COMPLETED", job_trail(job_id)
        row = batch_usage(bridge, job_id)
        assert seconds(row["TotalCPU"]) >= 8 * 0.9, (job_id, row)
        assert kilobytes(row["MaxRSS"]) >= 128 * 1024, (job_id, row)


@pytest.mark.shares_the_cluster
def test_a_script_cannot_forge_its_own_figures(bridge: Sandbox) -> None:
    # The frame the agent would send, as the script's own output: it is output, framed as such.
    forged = "u " + base64.b64encode(b"999000000 0 1 99999999999 1 1 0 0 0").decode()
    job_id = submit(bridge, "k8s", "usage-forged", f"#!/bin/sh\n#K8S image=sandbox.local/busybox:1\n"
                    f"echo '{forged}'\nsleep 3\n")
    assert bridge.wait_job_final(job_id, timeout=120)["State"] == "COMPLETED", job_trail(job_id)

    row = batch_usage(bridge, job_id)
    assert seconds(row["TotalCPU"]) < 5 and kilobytes(row["MaxRSS"]) < 100 * 1024, row
    assert (bridge.home("alice") / "usage-forged.out").read_text() == forged + "\n"


def test_one_user_cannot_make_or_change_anothers_usage_file(bridge: Sandbox) -> None:
    job_id = submit(bridge, "k8s", "usage-victim", burn_script(cpu_s=10, hold_mb=64), user="bob")
    wait_until(f"job {job_id} running", functools.partial(live_usage, bridge, job_id), timeout=120,
               interval=1.0)

    def in_rootfs(user: str, command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(IN_SLURM_ROOTFS), "runuser", "-u", user, "--", "sh", "-c", command],
                              capture_output=True, text=True, timeout=60, check=False)

    listing = subprocess.run(
        [str(IN_SLURM_ROOTFS), "sh", "-c", f"find {USAGE_DIR} -exec stat -c '%U %a %F %n' {{}} +"],
        capture_output=True, text=True, timeout=60, check=True).stdout.splitlines()
    dirs = [line.split() for line in listing if " directory " in line]
    assert dirs and all(d[0] == "root" and d[1] == "755" for d in dirs), listing
    bobs = [line.split()[-1] for line in listing if line.startswith("bob 600 regular")]
    assert bobs, f"the guard made a usage file for bob's waiter, in its slurmstepd's directory: {listing}"
    step_dir = bobs[0].rsplit("/", 1)[0]

    attempts = {
        "plant in the usage directory": in_rootfs("alice", f"echo k8s-bridge-usage-v1 > {USAGE_DIR}/1"),
        "plant beside bob's": in_rootfs("alice", f"echo k8s-bridge-usage-v1 > {step_dir}/1"),
        "write bob's": in_rootfs("alice", f"echo k8s-bridge-usage-v1 > {bobs[0]}"),
        "remove bob's": in_rootfs("alice", f"rm -f {bobs[0]}"),
    }
    for what, attempt in attempts.items():
        assert attempt.returncode != 0 and "Permission denied" in attempt.stderr, (what, attempt)

    assert bridge.wait_job_final(job_id, timeout=300)["State"] == "COMPLETED", job_trail(job_id)
    assert seconds(batch_usage(bridge, job_id)["TotalCPU"]) >= 9, "bob's figures are his pod's"


def test_a_users_umask_does_not_shut_the_others_out(bridge: Sandbox) -> None:
    # The first bridged batch step on a host makes the directories, under the umask its user gave
    # slurmstepd (SLURM_UMASK): 077 would leave them 700, and nobody else's waiter could write.
    subprocess.run([str(IN_SLURM_ROOTFS), "rm", "-rf", "/run/slurm-k8s-bridge"], check=True, timeout=60)
    script = write_script(bridge, "alice", "usage-umask.sh", burn_script(cpu_s=1, hold_mb=16, sleep_s=1))
    first = int(subprocess.run(
        ["runuser", "-u", "alice", "--", "sh", "-c",
         f"umask 077; sbatch --parsable -p k8s -o /dev/null {script}"],
        env=bridge.environ(), cwd=str(bridge.home("alice")), capture_output=True, text=True, check=True,
        timeout=60).stdout.strip())
    second = submit(bridge, "k8s", "usage-after-umask", burn_script(cpu_s=6, hold_mb=96), user="bob")

    for job_id in (first, second):
        assert bridge.wait_job_final(job_id, timeout=300)["State"] == "COMPLETED", job_trail(job_id)
    row = batch_usage(bridge, second)
    assert seconds(row["TotalCPU"]) >= 5.4 and kilobytes(row["MaxRSS"]) >= 96 * 1024, row


STEP_SCRIPT = (
    "#!/bin/bash\n#K8S image=sandbox.local/debian-python:12\n"
    "srun -n 2 python3 -c \"import time\n"
    "held = b'x' * (128 << 20)\n"
    "start = time.process_time()\n"
    "while time.process_time() - start < 6:\n"
    "    pass\n"
    "time.sleep(2)\"\n"
)


def step_usage(sandbox: Sandbox, job_id: int) -> dict[str, str]:
    out = sandbox.slurm("sacct", "-n", "-P", "-j", f"{job_id}.0", "-o", "JobID,NTasks,TotalCPU,MaxRSS").stdout
    for line in out.splitlines():
        row = dict(zip(("JobID", "NTasks", "TotalCPU", "MaxRSS"), line.split("|"), strict=True))
        if row["JobID"] == f"{job_id}.0":
            return row
    raise AssertionError(f"no step 0 of {job_id} in sacct: {out!r}\n{job_trail(job_id)}")


def test_a_steps_tasks_are_accounted_as_natively(bridge: Sandbox) -> None:
    jobs = {}
    for partition in ("native", "k8s"):
        script = write_script(bridge, "alice", f"usage-step-{partition}.sh", STEP_SCRIPT)
        out = str(bridge.home("alice") / f"usage-step-{partition}.out")
        jobs[partition] = bridge.sbatch("-p", partition, "-n", "2", "-o", out, str(script))
    for job_id in jobs.values():
        assert bridge.wait_job_final(job_id, timeout=300)["State"] == "COMPLETED", job_trail(job_id)

    usage = {partition: step_usage(bridge, job_id) for partition, job_id in jobs.items()}
    print(f"\nstep usage: {usage}")
    assert_as_native(usage, cpu_s=12, rss_mb=128)  # both tasks' CPU; a task's memory
    # The job's total (what seff reads) holds its steps' use, as natively.
    efficiency = reportseff(bridge, *jobs.values())
    print(f"reportseff (CPUEff %, MemEff %): {efficiency}")
    assert efficiency[jobs["k8s"]][0] >= 0.6 * efficiency[jobs["native"]][0], efficiency
