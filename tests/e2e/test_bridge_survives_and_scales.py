"""Arrays keep Slurm's throttle, and a daemon killed with -9 loses nothing when it comes back."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

from tests.e2e.conftest import bridge_ready
from tests.e2e.sandbox import BRIDGE_UP, JOB_NAMESPACE, Sandbox, job_trail, wait_until, write_script

STATE = "/var/lib/slurm-k8s-sandbox"


def _sacct_rows(sandbox: Sandbox, job: str) -> dict[str, tuple[str, str]]:
    out = sandbox.slurm("sacct", "-X", "-n", "-P", "-j", job, "-o", "JobID,State,ExitCode").stdout
    rows = {}
    for line in out.splitlines():
        job_id, state, exit_code = line.split("|")
        rows[job_id] = (state, exit_code)
    return rows


def _all_final(sandbox: Sandbox, job: str, count: int) -> dict[str, tuple[str, str]] | None:
    rows = _sacct_rows(sandbox, job)
    finals = {k: v for k, v in rows.items() if v[0] not in ("PENDING", "RUNNING") and "[" not in k}
    return finals if len(finals) == count else None


class PodCounter:
    """Samples how many of the bridge's pods are active (their container not ended: holding
    resources) at once, in a thread, until stopped. Ended pods linger until Slurm reports the job
    over, and their phase turns terminal only once the kubelet has torn the sandbox down."""

    def __init__(self, sandbox: Sandbox, selector: str) -> None:
        self.sandbox, self.selector = sandbox, selector
        self.samples: list[int] = []
        self.uids: dict[str, set[str]] = {}
        """Pod name -> every uid seen under it (two uids = the pod was created twice)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            out = self.sandbox.kubectl(
                "get", "pods", "-n", JOB_NAMESPACE, "-l", self.selector, "--no-headers",
                "-o", "custom-columns=NAME:.metadata.name,UID:.metadata.uid,PHASE:.status.phase,"
                "EXIT:.status.containerStatuses[0].state.terminated.exitCode",
                check=False,
            ).stdout.splitlines()
            active = 0
            for line in out:
                name, uid, phase, exit_code = line.split()
                self.uids.setdefault(name, set()).add(uid)
                # The kubelet reports the container's end before it turns the phase terminal.
                active += phase in ("Pending", "Running") and exit_code == "<none>"
            self.samples.append(active)
            time.sleep(0.1)

    def __enter__(self) -> PodCounter:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()


def test_array_tasks_keep_the_throttle_and_each_exit_code(bridge: Sandbox) -> None:
    # Each task notes when its script starts and ends, by the host's uptime (the real kubelets
    # share this machine's clock, to the hundredth). The pods' own statuses cannot tell: the
    # kubelet reports a container's end up to a second late, and the bridge deletes a pod the
    # moment its job ends, often before then.
    script = write_script(bridge, "alice", "array.sh",
                          "#!/bin/sh\n#K8S image=sandbox.local/busybox:1\n"
                          "read up _ < /proc/uptime; echo start $up\nsleep 2\n"
                          "read up _ < /proc/uptime; echo end $up\n"
                          "exit $((SLURM_ARRAY_TASK_ID % 4))\n")
    array_id = bridge.sbatch("-p", "k8s", "--array=0-19%5", "-o", "throttle-%A_%a.out", str(script))

    with PodCounter(bridge, f"slurm-k8s-bridge/array-job-id={array_id}") as counter:
        rows = wait_until(f"the 20 tasks of array {array_id}",
                          lambda: _all_final(bridge, str(array_id), 20), timeout=240, interval=1)

    spans = {}
    for task in range(20):
        lines = (bridge.home("alice") / f"throttle-{array_id}_{task}.out").read_text().split()
        assert lines[0::2] == ["start", "end"], (task, lines)
        spans[task] = (float(lines[1]), float(lines[3]))
    most = max(sum(s <= start < e for s, e in spans.values()) for start, _ in spans.values())
    assert most <= 5, f"more than 5 scripts ran at once: {sorted(spans.values())}"
    assert most >= 3, "tasks did run side by side"
    assert len(counter.uids) == 20, "one pod per task"
    assert all(len(uids) == 1 for uids in counter.uids.values()), "no pod was created twice"
    for task in range(20):
        code = task % 4
        assert rows[f"{array_id}_{task}"] == ("COMPLETED" if code == 0 else "FAILED", f"{code}:0")


def _daemon_pid() -> int:
    return int(Path(f"{STATE}/run/bridge.pid").read_text())


def test_kill_9_of_the_daemon_loses_no_exit_code_and_duplicates_no_pod(bridge: Sandbox) -> None:
    short = write_script(bridge, "bob", "short.sh",
                         "#!/bin/sh\n#K8S image=sandbox.local/busybox:1\n"
                         "echo short-$SLURM_JOB_ID\nsleep 4\nexit $((SLURM_JOB_ID % 7 + 1))\n")
    long = write_script(bridge, "bob", "long.sh",
                        "#!/bin/sh\n#K8S image=sandbox.local/busybox:1\n"
                        "echo long-$SLURM_JOB_ID\nsleep 16\nexit $((SLURM_JOB_ID % 5))\n")
    jobs = [bridge.sbatch("-p", "k8s", str(short if i % 2 else long), user="bob") for i in range(10)]

    def running_pods() -> int | None:
        pods = bridge.kubectl_json("get", "pods", "-n", JOB_NAMESPACE)["items"]
        mine = [p for p in pods if int(p["metadata"]["labels"]["slurm-k8s-bridge/job-id"]) in jobs
                and p["status"].get("phase") == "Running"]
        return len(mine) if len(mine) == 10 else None

    with PodCounter(bridge, "app.kubernetes.io/managed-by=slurm-k8s-bridge") as counter:
        wait_until("10 running pods", running_pods, timeout=60)
        os.kill(_daemon_pid(), signal.SIGKILL)
        time.sleep(8)  # the short jobs end while nobody watches
        assert not bridge_ready()
        subprocess.run([str(BRIDGE_UP)], check=True, capture_output=True)
        finals = wait_until("all 10 jobs in sacct",
                            lambda: all(bridge.sacct_line(j) for j in jobs) and
                            {j: bridge.sacct_line(j) for j in jobs}, timeout=120, interval=0.5)

    for i, job in enumerate(jobs):
        code = (job % 7 + 1) if i % 2 else (job % 5)
        row = finals[job]
        assert (row["State"], row["ExitCode"]) == ("COMPLETED" if code == 0 else "FAILED", f"{code}:0"), job
        out = (bridge.home("bob") / f"slurm-{job}.out").read_text().splitlines()
        assert out == [f"{'short' if i % 2 else 'long'}-{job}"], "every line once, none lost"
    seen = {name: uids for name, uids in counter.uids.items() if any(name == f"slurm-{j}-0" for j in jobs)}
    assert sorted(seen) == sorted(f"slurm-{j}-0" for j in jobs)
    assert all(len(uids) == 1 for uids in seen.values()), "no pod was created twice"


def test_metrics_are_served_in_prometheus_text(bridge: Sandbox) -> None:
    with urllib.request.urlopen("http://127.0.0.1:8470/metrics", timeout=5) as response:
        text = response.read().decode()

    assert "# TYPE slurm_k8s_bridge_pods_created_total counter" in text
    created = next(
        line for line in text.splitlines() if line.startswith("slurm_k8s_bridge_pods_created_total ")
    )
    assert float(created.split()[1]) >= 0
    assert "slurm_k8s_bridge_ready 1" in text


STDIN_SCRIPT = """#!/bin/sh
#SBATCH -N1 -n2
#K8S image=sandbox.local/busybox:1
read first
echo "the script read: $first"
printf 'in flight\\n' | srun -n1 sh -c 'sleep 8; cat'
printf 'a\\nb\\n' | srun -n2 cat | sort
srun -n1 sh -c 'while read line; do echo "the step read: $line"; done'
echo "the end $?"
"""


def test_kill_9_during_steps_fed_from_stdin_hangs_no_script_and_loses_no_later_input(bridge: Sandbox) -> None:
    """Scripts started with `sbatch --input` pipe into srun; the daemon is killed with -9 while each
    one's first step runs, and their next steps start once it is back. A step's tasks stream through
    the daemon, so the one in flight ends with the reason, as an interactive step does (it may have
    ended before the kill; what it wrote then may be lost with the daemon, but Slurm shows it
    failed). The end the waiter then told went nowhere (the new daemon knew no step
    of that key): every bridged script hung in that srun until its time limit. Now each goes on,
    and the later steps read every byte of their input, as in the three native jobs beside."""
    directory = bridge.home("alice") / f"stdin-kill9-{int(time.time())}"
    bridge.slurm("mkdir", "-p", str(directory), user="alice")
    bridge.slurm("sh", "-c", f"printf 'one\\ntwo\\nthree\\n' > {directory}/data.txt", user="alice")
    script = write_script(bridge, "alice", f"{directory.name}/pipe.sh", STDIN_SCRIPT)
    jobs = {(partition, copy): bridge.sbatch("-p", partition, "--time=5", f"--input={directory}/data.txt",
                                             "-o", f"{directory}/{partition}-%j.out", str(script))
            for partition, copies in (("native", 3), ("k8s", 6)) for copy in range(copies)}
    bridged = [job for (partition, _), job in jobs.items() if partition == "k8s"]

    def first_steps_running() -> bool:
        steps = set(bridge.slurm("squeue", "-h", "-s", "-t", "RUNNING", "-o", "%i").stdout.split())
        return all(f"{job}.0" in steps for job in bridged)

    wait_until("every bridged job's first step running", first_steps_running, timeout=120, interval=0.3)
    os.kill(_daemon_pid(), signal.SIGKILL)
    time.sleep(3)
    assert not bridge_ready()
    subprocess.run([str(BRIDGE_UP)], check=True, capture_output=True)
    head, in_flight = "the script read: one\n", "in flight\n"
    tail = "a\na\nb\nb\nthe step read: two\nthe step read: three\nthe end 0\n"
    for (partition, _), job in jobs.items():
        row = bridge.wait_job_final(job, timeout=120)
        text = (directory / f"{partition}-{job}.out").read_text(errors="replace")
        trail = f"{partition} job {job}: {row}\n{text!r}\n{job_trail(job)}"
        assert (row["State"], row["ExitCode"]) == ("COMPLETED", "0:0"), trail
        assert text.startswith(head) and text.endswith(tail), trail
        middle = text[len(head):-len(tail)]
        if partition == "native" or middle == in_flight:
            assert middle == in_flight, trail
        else:
            # Its output (the proxy's reason, srun's error) may have gone with the killed daemon;
            # its failure never: Slurm's accounting shows the step failed.
            step = bridge.slurm("sacct", "-n", "-P", "-j", f"{job}.0", "-o", "State,ExitCode").stdout.split()
            assert step == ["FAILED|1:0"], f"step {job}.0: {step}\n{trail}"
            assert in_flight not in middle, trail


RUNNING_STEP_SCRIPT = """#!/bin/sh
#SBATCH -N2 -n2 --time=5
srun -n2 sh -c 'i=1; while [ $i -le 24 ]; do echo "task $SLURM_PROCID line $i"; i=$((i+1)); sleep 1; done
exit 3'
echo "srun said $?"
"""


def test_kill_9_of_the_daemon_leaves_running_steps_to_end_as_natively(bridge: Sandbox) -> None:
    """The daemon is killed with -9 while steps run on two nodes in several jobs (beside native
    ones). A step's task runs on in its pod, its output spooled there, and its proxy asks the
    next daemon for the rest: each step ends with its own code, as natively, and what the tasks
    wrote after the restart is all there. Before, every bridged step failed 1:0 ('lost the bridge
    while the task ran'), its tasks' later lines missing, and srun's own output, which reaches the
    script's srun through the daemon too, went to the job's files from the kill on (some of it
    lost, it said). That stream now goes on with the next daemon from the frames the script's srun
    wrote: every line once, where the script's srun writes."""
    directory = bridge.home("alice") / f"step-kill9-{int(time.time())}"
    bridge.slurm("mkdir", "-p", str(directory), user="alice")
    script = write_script(bridge, "alice", f"{directory.name}/steps.sh", RUNNING_STEP_SCRIPT)
    jobs = {(partition, copy): bridge.sbatch("-p", partition, "-o", f"{directory}/{partition}-%j.out",
                                             str(script))
            for partition, copies in (("native", 2), ("k8s", 4)) for copy in range(copies)}
    bridged = [job for (partition, _), job in jobs.items() if partition == "k8s"]

    def every_step_wrote() -> bool:
        return all("line 3\n" in _text(directory / f"k8s-{job}.out") for job in bridged)

    wait_until("every bridged step writing", every_step_wrote, timeout=120, interval=0.3)
    os.kill(_daemon_pid(), signal.SIGKILL)
    time.sleep(2)
    assert not bridge_ready()
    subprocess.run([str(BRIDGE_UP)], check=True, capture_output=True)
    for (partition, _), job in jobs.items():
        bridge.wait_job_final(job, timeout=180)
        step = bridge.slurm("sacct", "-n", "-P", "-j", f"{job}.0", "-o", "State,ExitCode").stdout.split()
        text = _text(directory / f"{partition}-{job}.out")
        trail = f"{partition} job {job}: step {step}\n{text}\n{job_trail(job)}"
        assert step == ["FAILED|3:0"], trail
        assert text.endswith("srun said 3\n"), trail
        for task in (0, 1):
            lines = [line for line in text.splitlines() if line.startswith(f"task {task} line ")]
            assert lines == [f"task {task} line {number}" for number in range(1, 25)], trail
        assert "slurm-k8s-bridge" not in text, trail


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
