"""Steps a user starts in a bridged partition (issue 18): a bare `srun`, `salloc ... srun`, and
`srun --jobid N --overlap` into a running batch job, side by side with `native`: same output, exit
codes and sacct steps (node names normalised), the user's command always in the job's pods.

Run with -s for the wall times (printed, never asserted)."""

from __future__ import annotations

import fcntl
import functools
import os
import re
import select
import signal
import struct
import subprocess
import termios
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.e2e.sandbox import BRIDGE_UP, REPO, Sandbox, at_once, job_pods, wait_until, write_script

STATE = Path("/var/lib/slurm-k8s-sandbox")

IMAGE = "sandbox.local/busybox:1"
PROBE = 'if [ -e /usr/sbin/slurmd ]; then echo ON_SLURMD_HOST; else echo IN_POD; fi'
PARTITIONS = ("native", "k8s")


def _client(bridge: Sandbox, cmd: str, *args: str, user: str = "alice",
            timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """A Slurm client as `user` from their home, with the image a bridged allocation takes (native
    ignores it)."""
    env = {**bridge.environ(), "SLURM_K8S_IMAGE": IMAGE}
    return subprocess.run(["runuser", "-u", user, "--", "env", f"SLURM_K8S_IMAGE={IMAGE}", cmd, *args],
                          env=env, cwd=str(bridge.home(user)), capture_output=True, text=True,
                          timeout=timeout)


def _normalised(text: str) -> str:
    return re.sub(r"\b(native|kreal)[0-9]\b", "NODE", text)


def _job_of(stderr: str) -> int | None:
    match = re.search(r"job(?: allocation)? (\d+)", stderr)
    return int(match.group(1)) if match else None


def _steps(bridge: Sandbox, job_id: int) -> list[tuple[str, str, str]]:
    """sacct's steps of a finished job: (step, state, exit code), the job id left out."""
    def rows() -> list[tuple[str, str, str]] | None:
        out = bridge.slurm("sacct", "-n", "-P", "-j", str(job_id), "-o", "JobID,State,ExitCode").stdout
        found = []
        for line in out.splitlines():
            step, state, code = line.split("|")
            if state in ("PENDING", "RUNNING"):
                return None
            found.append((re.sub(r"^\d+", "N", step), state.split()[0], code))
        return sorted(found) or None
    return wait_until(f"sacct rows of job {job_id}", rows, timeout=60)


def _wait_running(bridge: Sandbox, job_id: int, with_pod: bool) -> None:
    def running() -> bool:
        state = bridge.slurm("squeue", "-h", "-j", str(job_id), "-o", "%T").stdout.strip()
        return state == "RUNNING" and (not with_pod or any(
            p["status"].get("phase") == "Running" for p in job_pods(bridge, job_id)))
    wait_until(f"job {job_id} running", running, timeout=90)


def _gone(bridge: Sandbox, job_id: int) -> bool:
    return not job_pods(bridge, job_id)


@pytest.mark.shares_the_cluster
def test_a_bare_srun_runs_in_a_pod_like_native(bridge: Sandbox) -> None:
    results = {}
    for partition in PARTITIONS:
        started = time.monotonic()
        done = _client(bridge, "srun", "-p", partition, "-N1", "sh", "-c", f"echo hi; {PROBE}; exit 3")
        results[partition] = (done.returncode, _normalised(done.stdout), time.monotonic() - started)
    native, bridged = results["native"], results["k8s"]
    assert native[:2] == (3, "hi\nON_SLURMD_HOST\n"), native
    assert bridged[:2] == (3, "hi\nIN_POD\n"), bridged
    print(f"\nsrun -N1: native {native[2]:.1f}s, k8s {bridged[2]:.1f}s")


@pytest.mark.shares_the_cluster
def test_salloc_with_srun_label_across_two_nodes_matches_native(bridge: Sandbox) -> None:
    outputs = {}
    for partition in PARTITIONS:
        # The node's name as slurmstepd tells it (`hostname` is the host's own natively: every
        # native slurmd of the sandbox shares one machine).
        done = _client(bridge, "salloc", "-p", partition, "-N2", "srun", "-l", "sh", "-c",
                       'echo "$SLURMD_NODENAME"; id -u')
        assert done.returncode == 0, (partition, done.stderr)
        outputs[partition] = sorted(_normalised(done.stdout).splitlines())
        job_id = _job_of(done.stderr)
        assert job_id is not None, done.stderr
        if partition == "k8s":
            wait_until(f"job {job_id}'s pods gone after the allocation",
                       functools.partial(_gone, bridge, job_id), timeout=90)
        assert ("N.0", "COMPLETED", "0:0") in _steps(bridge, job_id), partition
    assert outputs["k8s"] == outputs["native"] == ["0: 2001", "0: NODE", "1: 2001", "1: NODE"]


@pytest.mark.shares_the_cluster
def test_srun_jobid_overlap_runs_in_the_jobs_pod_for_its_user_only(bridge: Sandbox) -> None:
    script = write_script(bridge, "alice", "hold.sh", f"#!/bin/sh\n#K8S image={IMAGE}\nsleep 120\n")
    attached = {}
    for partition in PARTITIONS:
        job_id = bridge.sbatch("-p", partition, "-o", "/dev/null", str(script))
        try:
            _wait_running(bridge, job_id, with_pod=partition == "k8s")
            mine = _client(bridge, "srun", f"--jobid={job_id}", "--overlap", "-n1", "sh", "-c",
                           f"echo attached; id -u; {PROBE}; exit 4")
            attached[partition] = (mine.returncode, _normalised(mine.stdout))
            theirs = _client(bridge, "srun", f"--jobid={job_id}", "--overlap", "-n1", "sh", "-c",
                             "echo BOB_RAN", user="bob")
            assert theirs.returncode != 0 and "BOB_RAN" not in theirs.stdout, (partition, theirs)
            assert "denied" in theirs.stderr.lower() or "invalid" in theirs.stderr.lower(), theirs.stderr
        finally:
            bridge.slurm("scancel", str(job_id), check=False)
    assert attached["native"] == (4, "attached\n2001\nON_SLURMD_HOST\n")
    assert attached["k8s"] == (4, "attached\n2001\nIN_POD\n")


@pytest.mark.shares_the_cluster
def test_concurrent_bare_sruns_each_get_their_own_pod_and_exit_code(bridge: Sandbox) -> None:
    count = 6
    started = time.monotonic()
    with ThreadPoolExecutor(count) as pool:
        done = list(pool.map(
            lambda n: _client(bridge, "srun", "-p", "k8s", "-N1", "--mem=100M", "sh", "-c",
                              f"echo rank-{n}; exit {n}"), range(count)))
    took = time.monotonic() - started
    for n, result in enumerate(done):
        assert (result.returncode, result.stdout) == (n, f"rank-{n}\n"), (n, result.stderr)
    print(f"\n{count} concurrent bridged srun allocations: {took:.1f}s")


def _in_slurm_ns(*argv: str) -> subprocess.CompletedProcess[str]:
    """Run `argv` where the slurmds' own view of the files is (their chroot and mounts)."""
    return subprocess.run([str(REPO / "containers/slurm/in-ns.sh"), *argv], capture_output=True,
                          text=True, timeout=60)


@pytest.mark.shares_the_cluster
def test_a_step_with_a_task_epilog_never_runs_it_on_the_slurmd_host(bridge: Sandbox) -> None:
    """slurmstepd runs --task-epilog as the user where the task ran, and SPANK cannot see it: the
    bridged slurmds see the places users write mounted noexec, so it cannot start there; the
    step itself still runs in the pod. The control: natively the same epilog runs."""
    stamp = int(time.time() * 1000)
    places = [str(bridge.home("alice")), "/tmp", "/var/tmp", "/dev/shm", str(STATE / "scratch")]
    for place in places:
        marker, epilog = f"{place}/epilog-ran-{stamp}", f"{place}/epilog-{stamp}.sh"
        made = _in_slurm_ns("runuser", "-u", "alice", "--", "sh", "-c",
                            f"printf '#!/bin/sh\\ntouch {marker}\\n' > {epilog} && chmod 755 {epilog}")
        assert made.returncode == 0, made.stderr
        done = _client(bridge, "srun", "-p", "k8s", "-N1", f"--task-epilog={epilog}", "sh", "-c", PROBE)
        assert done.stdout == "IN_POD\n", (place, done)
    time.sleep(2)
    ran = [p for p in places if _in_slurm_ns("test", "-e", f"{p}/epilog-ran-{stamp}").returncode == 0]
    assert not ran, f"a user's task epilog ran on a bridged slurmd's host, from: {ran}"
    home_epilog = f"{places[0]}/epilog-{stamp}.sh"
    native = _client(bridge, "srun", "-p", "native", "-N1", f"--task-epilog={home_epilog}", "true")
    assert native.returncode == 0, native.stderr
    assert wait_until("the native control's epilog", lambda: _in_slurm_ns(
        "test", "-e", f"{places[0]}/epilog-ran-{stamp}").returncode == 0, timeout=20)


def test_no_task_epilog_runs_even_where_the_slurmd_host_could_execute_it(bridge: Sandbox) -> None:
    """The guard's own barrier, without the sandbox's noexec mounts: a bridged slurmd started where
    the user's home and the sandbox's scratch are executable (as a native node's are) runs a
    user's step in the pod, and its --task-epilog nowhere (slurmstepd may exec nothing once the
    step's tasks are forked); the site's epilog would not run either."""
    script = write_script(bridge, "alice", "hold-exec.sh", f"#!/bin/sh\n#K8S image={IMAGE}\nsleep 60\n")
    job_id = bridge.sbatch("-p", "k8s", "-w", "kreal2", "-o", "/dev/null", str(script))
    pid_file = STATE / "run" / "slurmd-kreal2.pid"
    stamp = int(time.time() * 1000)
    places = [str(bridge.home("alice")), str(STATE / "scratch")]
    by_hand: subprocess.Popen[bytes] | None = None
    try:
        wait_until(f"job {job_id} running", lambda: bridge.slurm(
            "squeue", "-h", "-j", str(job_id), "-o", "%T").stdout.strip() == "RUNNING", timeout=60)
        os.kill(int(pid_file.read_text()), signal.SIGTERM)
        wait_until("kreal2's slurmd stopped", lambda: not _alive(int(pid_file.read_text())), timeout=30)
        # The same slurmd, in the sandbox's namespace where the home is executable (as a native
        # node's is); bridge-up starts it again the right way at the end.
        with (STATE / "log" / "slurmd-kreal2.log").open("ab") as log_file:
            by_hand = subprocess.Popen(
                [str(REPO / "containers/slurm/in-ns.sh"), "slurmd", "-D", "-N", "kreal2"],
                stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
        wait_until("kreal2 answering", lambda: bridge.slurm("sinfo", "-h", "-n", "kreal2", "-o", "%T")
                   .stdout.strip() in ("allocated", "mixed"), timeout=60)
        for place in places:
            epilog = f"{place}/epilog-{stamp}.sh"
            made = _in_slurm_ns("runuser", "-u", "alice", "--", "sh", "-c",
                                f"printf '#!/bin/sh\\ntouch {place}/epilog-ran-{stamp}\\n' > {epilog}"
                                f" && chmod 755 {epilog} && {epilog} && rm {place}/epilog-ran-{stamp}")
            assert made.returncode == 0, f"the control: {epilog} runs there ({made.stderr})"
            done = _client(bridge, "srun", f"--jobid={job_id}", "--overlap", "-n1", f"--task-epilog={epilog}",
                           "sh", "-c", PROBE)
            assert (done.returncode, done.stdout) == (0, "IN_POD\n"), (place, done)
        time.sleep(2)
        ran = [p for p in places if _in_slurm_ns("test", "-e", f"{p}/epilog-ran-{stamp}").returncode == 0]
        assert not ran, f"a user's task epilog ran on the slurmd host, from: {ran}"
    finally:
        bridge.slurm("scancel", str(job_id), check=False)
        subprocess.run(["pkill", "-f", "slurmd -D -N kreal2"], check=False)
        if by_hand is not None:
            by_hand.wait(timeout=30)
        subprocess.run([str(BRIDGE_UP.with_name("down.sh"))], check=True, capture_output=True)
        subprocess.run([str(BRIDGE_UP)], check=True, capture_output=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


QUEUE_LINE = re.compile(
    rb"srun: job \d+ (?:queued and waiting for resources|has been allocated resources)\r\n")


def without_queue_lines(output: bytes) -> bytes:
    """srun's own lines while its allocation waits: there only when the partition is busy, in
    either partition (other tests run beside these)."""
    return QUEUE_LINE.sub(b"", output)


def _drive_terminal(bridge: Sandbox, partition: str, typed: list[tuple[float, bytes]],
                    rows: int = 33, cols: int = 101, timeout: float = 120) -> tuple[int, bytes]:
    """`srun -p PARTITION --pty sh` as alice under a pseudo-terminal of the given size: types each
    (pause, bytes) once the shell has shown a prompt for it (a line typed ahead of a shell still
    starting would echo elsewhere), a control character after its pause alone; reads everything
    the terminal shows until srun ends; (exit code, output)."""
    import fcntl
    import pty
    import struct
    import termios

    env = {**bridge.environ(), "SLURM_K8S_IMAGE": IMAGE, "TERM": "dumb", "PS1": "$ "}
    argv = ["runuser", "-u", "alice", "--", "env", f"SLURM_K8S_IMAGE={IMAGE}", "TERM=dumb", "PS1=$ ",
            "srun", "-p", partition, "-N1", "--pty", "sh"]
    pid, master = pty.fork()
    if pid == 0:  # the child: its terminal is the pty's other end
        os.chdir(str(bridge.home("alice")))
        os.execvpe(argv[0], argv, env)
    fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    output = bytearray()
    deadline = time.monotonic() + timeout
    script = list(typed)
    next_at = time.monotonic() + (script[0][0] if script else 0)
    import select

    lines_sent = 0

    def prompts() -> int:
        return len(re.findall(rb"\$ (?!\()", bytes(output)))

    while time.monotonic() < deadline:
        if script and time.monotonic() >= next_at:
            text = script[0][1]
            is_line = text.endswith(b"\n")
            # A line waits for its prompt (one per line sent before, plus the first).
            if not is_line or prompts() > lines_sent:
                os.write(master, script.pop(0)[1])
                lines_sent += is_line
                next_at = time.monotonic() + (script[0][0] if script else 0)
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:
                break  # the child's side closed: srun ended
            if not data:
                break
            output += data
    else:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    os.close(master)
    return os.waitstatus_to_exitcode(status), without_queue_lines(bytes(output))


@pytest.mark.shares_the_cluster
def test_srun_pty_gives_a_real_terminal_in_the_pod_like_native(bridge: Sandbox) -> None:
    """tty, stty size, id -u, then exit 5: a pty device, the size the user's terminal has, the
    job's uid and rc 5; what the commands print reads the same in both partitions (pty numbers and
    node names normalised; prompts and the echo of typed lines are each shell's own)."""
    typed = [(0.5, b"tty; stty size; id -u\n"), (1.0, b"echo done-$((40+2))\n"), (1.0, b"exit 5\n")]
    sessions = {}
    for partition in PARTITIONS:
        started = time.monotonic()
        code, raw = _drive_terminal(bridge, partition, typed)
        text = raw.decode("utf-8", "replace").replace("\r\n", "\n")
        assert code == 5, f"{partition}: exit code {code}: {text!r}"
        assert re.search(r"^/dev/pts/\d+$", text, re.M), f"{partition}: {text!r}"
        assert "\n33 101\n" in text, f"{partition}: {text!r}"
        assert "\n2001\n" in text and "done-42" in text, f"{partition}: {text!r}"
        # From the first prompt on: an interactive busybox sh greets with a banner, dash does not;
        # busybox's line editing asks the terminal where its cursor is (ESC [6n), dash does not.
        # And busybox's prompt shows the directory (`/home/alice $ `) after the first one.
        # (its line editor also redraws a line from its start: a bare carriage return).
        text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text[text.index("$ "):]).replace("\r", "")
        text = re.sub(r"^(?:\S+ )?\$ ", "", text, flags=re.M)
        # What the commands printed, in order: the echo of typed lines is the line editor's
        # business (busybox redraws, dash does not).
        typed_lines = [line.decode().strip() for _, line in typed]
        printed = [line for line in text.splitlines()
                   if line.strip() and not any(typed_line in line for typed_line in typed_lines)]
        sessions[partition] = _normalised(re.sub(r"/dev/pts/\d+", "/dev/pts/N", "\n".join(printed)))
        print(f"\nsrun --pty sh in {partition}: {time.monotonic() - started:.1f}s")
    assert sessions["k8s"] == sessions["native"]


def _pty_size_at_start(bridge: Sandbox, partition: str) -> bytes:
    """What `srun --pty stty size` prints under a 33x101 terminal: the size as the task's very
    first instruction reads it."""
    master, slave = os.openpty()
    try:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 101, 0, 0))
        argv = ["runuser", "-u", "alice", "--", "env", f"SLURM_K8S_IMAGE={IMAGE}",
                "srun", "-p", partition, "-N1", "--pty", "stty", "size"]
        with subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=bridge.environ(),
                              cwd=str(bridge.home("alice")), start_new_session=True) as srun:
            os.close(slave)
            slave = -1
            output = bytearray()
            while True:
                ready, _, _ = select.select([master], [], [], 120)
                if not ready:
                    srun.kill()
                    break
                try:
                    data = os.read(master, 65536)
                except OSError:
                    break  # srun's side closed
                if not data:
                    break
                output += data
            srun.wait(timeout=60)
        return without_queue_lines(bytes(output))
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)


@pytest.mark.shares_the_cluster
def test_a_pty_tasks_first_look_at_its_size_sees_the_users_terminal_as_natively(bridge: Sandbox) -> None:
    """slurmstepd sizes the pty before the task starts; the exec's resize message could reach the
    runtime after the task read its size (seen: busybox's `stty size` failed, 1 of 3). Four at
    once in each partition."""
    runs = {f"{partition}-{n}": functools.partial(_pty_size_at_start, bridge, partition)
            for partition in PARTITIONS for n in range(4)}
    printed = at_once(runs)
    # What the task printed before srun made the user's terminal raw went through that terminal's
    # own ONLCR too: "\r\r\n" (native srun did so once under load). The size is the point.
    wrong = {run: text for run, text in printed.items() if text.replace(b"\r\r\n", b"\r\n") != b"33 101\r\n"}
    assert not wrong, f"{wrong!r}"


@pytest.mark.shares_the_cluster
def test_ctrl_c_at_a_bridged_srun_pty_interrupts_a_sleep_and_keeps_the_shell(bridge: Sandbox) -> None:
    """The ^C byte reaches the pod's terminal, whose line discipline interrupts the foreground
    sleep; the shell goes on. (Native srun --pty on this sandbox does not interrupt it: the sleep
    runs to its end there; the issue asks for the interrupt, as a terminal user expects.)"""
    typed = [(0.5, b"sleep 20 && echo sleep-$((1+1))-finished\n"), (2.0, b"\x03"),
             (1.0, b"echo after-interrupt-$((40+2))\n"), (1.0, b"exit 5\n")]
    code, raw = _drive_terminal(bridge, "k8s", typed)
    text = raw.decode("utf-8", "replace")
    assert code == 5, text
    assert "after-interrupt-42" in text and "sleep-2-finished" not in text, text


def test_an_allocation_whose_image_cannot_start_says_why_on_sruns_stderr_and_leaves_nothing(
        bridge: Sandbox) -> None:
    bad_name = subprocess.run(
        ["runuser", "-u", "alice", "--", "env", "SLURM_K8S_IMAGE=not an image", "srun", "-p", "k8s", "-N1",
         "true"], env=bridge.environ(), cwd=str(bridge.home("alice")), capture_output=True, text=True,
        timeout=120)
    assert bad_name.returncode != 0
    assert "SLURM_K8S_IMAGE='not an image' is not an image name" in bad_name.stderr, bad_name.stderr
    missing = subprocess.run(
        ["runuser", "-u", "alice", "--", "env", "SLURM_K8S_IMAGE=sandbox.local/no-such-image:1", "srun", "-p",
         "k8s", "-N1", "true"], env=bridge.environ(), cwd=str(bridge.home("alice")), capture_output=True,
        text=True, timeout=300)
    assert missing.returncode != 0
    assert "cannot run steps" in missing.stderr and "no-such-image" in missing.stderr, missing.stderr
    latest = bridge.slurm("sacct", "-u", "alice", "-X", "-nP", "-o", "JobID", "-S", "now-9minutes").stdout
    job_id = int(latest.split()[-1])
    wait_until(f"job {job_id}'s pods gone", functools.partial(_gone, bridge, job_id), timeout=90)


def test_the_daemon_killed_during_a_step_leaves_it_to_end_as_natively(bridge: Sandbox) -> None:
    """A bare srun's task runs on in its pod while the daemon is killed and restarted (its output
    spooled there); its proxy asks the next daemon for the rest, and srun ends as the task did.
    Before, the step ended at once with 'lost the bridge while the task ran'."""
    env = {**bridge.environ(), "SLURM_K8S_IMAGE": IMAGE}
    step = subprocess.Popen(
        ["runuser", "-u", "alice", "--", "env", f"SLURM_K8S_IMAGE={IMAGE}", "srun", "-p", "k8s", "-N1",
         "sh", "-c", "echo started; sleep 15; echo reached; exit 4"],
        env=env, cwd=str(bridge.home("alice")), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert step.stdout is not None
        assert step.stdout.readline() == "started\n"
        os.kill(int((STATE / "run" / "bridge.pid").read_text()), signal.SIGKILL)
        subprocess.run([str(BRIDGE_UP)], check=True, capture_output=True)
        out, err = step.communicate(timeout=120)
    finally:
        step.kill()
    assert (step.returncode, out) == (4, "reached\n"), err
    assert "lost the bridge" not in err and "stopped streaming" not in err, err
    latest = bridge.slurm("sacct", "-u", "alice", "-X", "-nP", "-o", "JobID", "-S", "now-9minutes").stdout
    job_id = int(latest.split()[-1])
    wait_until(f"job {job_id}'s pods gone", functools.partial(_gone, bridge, job_id), timeout=120)
