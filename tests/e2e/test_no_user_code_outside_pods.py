"""A user's code never runs on a bridged node's slurmd host: every way an ordinary user (alice) was
seen to get there is refused with a clear message, or ends up running in a pod.

Each probe prints ON_SLURMD_HOST when it sees the Slurm rootfs (/usr/sbin/slurmd exists there, in
no job image) and IN_POD otherwise; planted programs leave a file in the user's home when they run.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import struct
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.sandbox import Sandbox, job_pods, wait_until, write_script

PROBE = 'if [ -e /usr/sbin/slurmd ]; then echo ON_SLURMD_HOST; else echo IN_POD; fi\n'
MARKER = "#SLURM-K8S-BRIDGE ORIGINAL SCRIPT"
BUSYBOX = "#K8S image=sandbox.local/busybox:1\n"
API = "http://127.0.0.1:8470"


def _output(bridge: Sandbox, job_id: int) -> str:
    return (bridge.home("alice") / f"slurm-{job_id}.out").read_text()


def _running(bridge: Sandbox, job_id: int) -> None:
    def state() -> bool:
        out = bridge.slurm("squeue", "-h", "-j", str(job_id), "-o", "%T").stdout.strip()
        pods = job_pods(bridge, job_id)
        return out == "RUNNING" and any(p["status"].get("phase") == "Running" for p in pods)

    wait_until(f"job {job_id} running in a pod", state, timeout=60)


# -- job_submit.lua -------------------------------------------------------------------------------

@pytest.mark.shares_the_cluster
@pytest.mark.parametrize("planted", [
    f": '{MARKER}'\n",                   # the marker inside a command, as in the issue
    f"true\n{MARKER}\n",                 # the marker as a line of its own (sbatch refuses it in the header)
    f"echo '{MARKER}'\n{MARKER}\n",      # both
])
def test_a_marker_in_the_users_script_is_inert(bridge: Sandbox, planted: str) -> None:
    script = write_script(bridge, "alice", "marker.sh", "#!/bin/sh\n" + BUSYBOX + planted + PROBE)
    job_id = bridge.sbatch("-p", "k8s", str(script))
    row = bridge.wait_job_final(job_id)
    assert row["State"] == "COMPLETED", row
    assert _output(bridge, job_id).splitlines()[-1] == "IN_POD"


@pytest.mark.shares_the_cluster
def test_a_wrapped_command_with_the_marker_runs_in_a_pod(bridge: Sandbox) -> None:
    job_id = bridge.sbatch("-p", "k8s", "--wrap", f"{BUSYBOX.strip()}\n{MARKER}\n{PROBE}")
    assert bridge.wait_job_final(job_id)["State"] == "COMPLETED"
    assert _output(bridge, job_id).splitlines()[-1] == "IN_POD"


@pytest.mark.shares_the_cluster
def test_a_job_submitted_through_slurmrestd_runs_in_a_pod_too(bridge: Sandbox) -> None:
    body = {
        "script": "#!/bin/sh\n" + BUSYBOX + MARKER + "\n" + PROBE,
        "job": {"partition": "k8s", "current_working_directory": "/home/alice", "name": "via-rest",
                "environment": ["PATH=/usr/bin:/bin", "LD_PRELOAD=/nonexistent.so"]},
    }
    request = urllib.request.Request(
        f"{bridge.rest_url}/slurm/v0.0.44/job/submit", data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json", "X-SLURM-USER-NAME": "alice",
                 "X-SLURM-USER-TOKEN": bridge.token("alice", 300)},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        job_id = int(json.load(response)["job_id"])
    assert bridge.wait_job_final(job_id)["State"] == "COMPLETED"
    assert _output(bridge, job_id) == "IN_POD\n"


@pytest.mark.shares_the_cluster
@pytest.mark.parametrize(("first", "second"), [("native", "k8s"), ("k8s", "native")])
def test_moving_a_job_into_or_out_of_a_bridged_partition_is_refused(
    bridge: Sandbox, first: str, second: str
) -> None:
    script = write_script(bridge, "alice", "move.sh", "#!/bin/sh\n" + BUSYBOX + PROBE)
    job_id = bridge.sbatch("-p", first, "--hold", str(script))
    try:
        for user in ("alice", "root"):  # not even an administrator may: the script would run as is
            moved = bridge.slurm("scontrol", "update", f"jobid={job_id}", f"partition={second}",
                                 user=user, check=False)
            assert moved.returncode != 0
            assert "cannot move into or out of a partition that runs in Kubernetes" in moved.stderr
        shown = bridge.slurm("scontrol", "show", "job", str(job_id)).stdout
        assert f"Partition={first} " in shown
    finally:
        bridge.slurm("scancel", str(job_id), check=False)


@pytest.mark.shares_the_cluster
def test_moving_between_bridged_partitions_is_allowed(bridge: Sandbox) -> None:
    script = write_script(bridge, "alice", "move2.sh", "#!/bin/sh\n" + BUSYBOX + PROBE)
    job_id = bridge.sbatch("-p", "sim", "--hold", str(script))
    try:
        bridge.slurm("scontrol", "update", f"jobid={job_id}", "partition=k8s", user="alice")
        bridge.slurm("scontrol", "release", str(job_id), user="alice")
        assert bridge.wait_job_final(job_id)["State"] == "COMPLETED"
        assert _output(bridge, job_id) == "IN_POD\n"
    finally:
        bridge.slurm("scancel", str(job_id), check=False)


@pytest.mark.shares_the_cluster
@pytest.mark.parametrize("layout", [
    ["-p", "k8s", ":", "-p", "native"],
    ["-p", "native", ":", "-p", "k8s"],
    ["-p", "k8s", ":", "-p", "k8s"],
])
def test_heterogeneous_jobs_touching_a_bridged_partition_are_refused(
    bridge: Sandbox, layout: list[str]
) -> None:
    script = write_script(bridge, "alice", "het.sh", "#!/bin/sh\n" + BUSYBOX + PROBE)
    result = bridge.slurm("sbatch", *layout, str(script), user="alice", cwd="/home/alice", check=False)
    assert result.returncode != 0
    assert "heterogeneous jobs cannot run there" in result.stderr


@pytest.mark.shares_the_cluster
def test_scontrol_write_batch_script_shows_the_users_script_as_natively(bridge: Sandbox) -> None:
    """Slurm keeps the script as the user wrote it, in a bridged partition too (job_submit.lua
    rewrote it into the waiter's wrapper before): before the job runs, while it runs, and after
    a requeue. Two jobs in each partition at once."""
    body = "#!/bin/sh\n#SBATCH --comment=kept\n" + BUSYBOX + "echo $0 \"$@\"\nsleep 60\n"
    script = write_script(bridge, "alice", "shown.sh", body)
    jobs = {(partition, n): bridge.sbatch("-p", partition, str(script), "an arg")
            for partition in ("native", "k8s") for n in range(2)}
    try:
        def shown(job_id: int) -> str:
            return bridge.slurm("scontrol", "write", "batch_script", str(job_id), "-", user="alice").stdout

        for job_id in jobs.values():
            assert shown(job_id) == body
        for (partition, _), job_id in jobs.items():
            if partition == "k8s":
                _running(bridge, job_id)
            else:
                wait_until(f"job {job_id} running", lambda j=job_id: bridge.slurm(
                    "squeue", "-h", "-j", str(j), "-o", "%T").stdout.strip() == "RUNNING", timeout=60)
        for (partition, _), job_id in jobs.items():
            assert shown(job_id) == body, partition
        for job_id in (jobs["native", 0], jobs["k8s", 0]):
            bridge.slurm("scontrol", "requeuehold", str(job_id))
        for (partition, _), job_id in jobs.items():
            assert shown(job_id) == body, partition
    finally:
        for job_id in jobs.values():
            bridge.slurm("scancel", str(job_id), check=False)


@pytest.mark.shares_the_cluster
def test_the_script_slurmstepd_runs_holds_nothing_the_user_can_write(bridge: Sandbox) -> None:
    """On a bridged node, the file slurmstepd execs as the batch script is root's, not writable by
    the job's user (who could otherwise rewrite it, from a process on that host, between its
    making and its exec) and holds none of the user's bytes: only the call of the waiter, which
    reads the user's copy beside it. The copy goes with the job; two jobs at once."""
    body = "#!/bin/sh\n" + BUSYBOX + "echo user-bytes-here\nsleep 30\n"
    script = write_script(bridge, "alice", "spooled.sh", body)
    jobs = [bridge.sbatch("-p", "k8s", "-w", "kreal1", str(script)) for _ in range(2)]
    spool = Path(bridge.env["SLURM_CONF"]).parents[2] / "slurmd" / "kreal1"
    try:
        for job_id in jobs:
            _running(bridge, job_id)
            directory = spool / f"job{job_id:05d}"
            ran = directory / "slurm_script"
            info = ran.stat()
            assert (info.st_uid, info.st_gid, info.st_mode & 0o7777) == (0, 0, 0o755), oct(info.st_mode)
            assert b"user-bytes-here" not in ran.read_bytes()
            assert (directory / "slurm_script.user").read_text() == body
        for job_id in jobs:
            bridge.slurm("scancel", str(job_id))
        wait_until("the jobs' directories removed", lambda: not any(
            (spool / f"job{job_id:05d}").exists() for job_id in jobs) or None, timeout=60)
    finally:
        bridge.slurm("scancel", *map(str, jobs), check=False)


def test_without_its_settings_job_submit_refuses_every_job(bridge: Sandbox) -> None:
    settings = Path(bridge.env["SLURM_CONF"]).parents[1] / "job_submit_bridge.conf"
    saved = settings.read_bytes()
    settings.rename(settings.with_suffix(".away"))
    try:
        for partition in ("k8s", "native"):
            result = bridge.slurm("sbatch", "-p", partition, "--wrap", "true", user="alice",
                                  cwd="/home/alice", check=False)
            assert result.returncode != 0
            assert "cannot read the bridge's settings" in result.stderr
            assert str(settings) in result.stderr
    finally:
        settings.with_suffix(".away").rename(settings)
    assert settings.read_bytes() == saved


# -- steps: the SPANK guard -------------------------------------------------------------------------

def _raw_client(
    bridge: Sandbox, cmd: str, *args: str, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """A Slurm client run as alice with a slurm.conf of her own that loads no SPANK plugin: what a
    user who builds her own srun gets. Only slurmstepd's check stands in her way."""
    own = bridge.home("alice") / "own-slurm"
    own.mkdir(exist_ok=True)
    conf = own / "slurm.conf"
    plugstack = own / "plugstack.conf"
    plugstack.write_text("")
    conf.write_text(Path(bridge.env["SLURM_CONF"]).read_text() + f"\nPlugStackConfig={plugstack}\n")
    for path in (conf, plugstack):
        path.chmod(0o644)
    root = Path(bridge.env["SLURM_CONF"]).parents[3] / "rootfs"
    loader = root / "usr/lib64/ld-linux-x86-64.so.2"
    libs = f"{root}/usr/lib/x86_64-linux-gnu/slurm-wlm:{root}/usr/lib/x86_64-linux-gnu"
    extra = [f"{k}={v}" for k, v in (extra_env or {}).items()]
    argv = ["runuser", "-u", "alice", "--", "env", f"SLURM_CONF={conf}", *extra, str(loader),
            "--library-path", libs, "--argv0", cmd, str(root / "usr/bin" / cmd), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd="/home/alice")


@pytest.mark.shares_the_cluster
def test_srun_into_a_running_bridged_job_runs_in_its_pod_never_on_the_slurmd_host(bridge: Sandbox) -> None:
    """srun --jobid N --overlap: the guard turns the step's task into the bridge's proxy, so the
    command runs in the job's pod, by srun with its plugin and by one without (slurmstepd
    decides); sattach to the batch step (the waiter) gets nothing."""
    script = write_script(bridge, "alice", "long.sh", "#!/bin/sh\n" + BUSYBOX + "sleep 60\n")
    job_id = bridge.sbatch("-p", "k8s", str(script))
    try:
        _running(bridge, job_id)
        step = bridge.slurm("srun", f"--jobid={job_id}", "--overlap", "-N1", "sh", "-c", PROBE,
                            user="alice", cwd="/home/alice", check=False)
        assert (step.returncode, step.stdout) == (0, "IN_POD\n"), step.stderr
        raw = _raw_client(bridge, "srun", f"--jobid={job_id}", "--overlap", "-N1",
                          "sh", "-c", PROBE)
        assert (raw.returncode, raw.stdout) == (0, "IN_POD\n"), raw.stderr
        attached = bridge.slurm("sattach", f"{job_id}.batch", user="alice", check=False)
        assert attached.returncode != 0
        assert "ON_SLURMD_HOST" not in attached.stdout
    finally:
        bridge.slurm("scancel", str(job_id), check=False)


@pytest.mark.shares_the_cluster
def test_a_hand_made_task_proxy_step_never_runs_anything_on_the_slurmd_host(bridge: Sandbox) -> None:
    """The one other step the guard admits is the bridge's task proxy, and only with the token the
    daemon signed for that very step: the same command line, started by the user with a task
    prolog of their own (which slurmstepd would run on the slurmd host), is refused, with a
    forged token and without one, by srun with its plugin and by one without (such a step is
    then the user's own: its task becomes the user-step proxy before any prolog would run).
    The prolog sits where the bridged slurmds may execute (a user could not put it there: they
    see what users write noexec), so that only the guard stands in its way."""
    marker = bridge.home("alice") / "PROLOG_RAN_ON_THE_SLURMD_HOST"
    marker.unlink(missing_ok=True)
    prolog = Path("/var/lib/slurm-k8s-sandbox/run/test-task-prolog.sh")
    prolog.write_text(f"#!/bin/sh\ntouch {marker}\n")
    prolog.chmod(0o755)
    script = write_script(bridge, "alice", "long.sh", "#!/bin/sh\n" + BUSYBOX + "sleep 60\n")
    job_id = bridge.sbatch("-p", "k8s", str(script))
    settings = Path("/var/lib/slurm-k8s-sandbox/slurm/etc/job_submit_bridge.conf").read_text()
    waiter = next(line for line in settings.splitlines() if line.startswith("attach_command="))
    proxy = waiter.split("=", 1)[1].split()
    try:
        _running(bridge, job_id)
        forged = {"SLURM_K8S_BRIDGE_STEP_TOKEN": "0" * 64}
        for env in ({}, forged):
            args = [f"--jobid={job_id}", "--overlap", "-N1", f"--task-prolog={prolog}", *proxy, "task", "1"]
            with_plugin = subprocess.run(
                ["runuser", "-u", "alice", "--", "env", *(f"{k}={v}" for k, v in env.items()), "srun", *args],
                env=bridge.environ(), cwd="/home/alice", capture_output=True, text=True, timeout=60)
            without_plugin = _raw_client(bridge, "srun", *args, extra_env=env)
            assert with_plugin.returncode != 0, with_plugin
            assert without_plugin.returncode != 0, without_plugin
        time.sleep(1)
        assert not marker.exists(), "the user's task prolog ran on the slurmd host"
        # The control: with the token the daemon would sign for that step, the guard admits the
        # step (and slurmstepd runs its task prolog): the token is what stands in the way.
        key = Path("/var/lib/slurm-k8s-sandbox/slurm/etc/bridge-step.key").read_bytes().rstrip(b"\n")
        token = hmac.new(key, f"{job_id}:0:1".encode(), hashlib.sha256).hexdigest()  # run 0, step 1
        _raw_client(bridge, "srun", f"--jobid={job_id}", "--overlap", "-N1", f"--task-prolog={prolog}",
                    *proxy, "task", "1", extra_env={"SLURM_K8S_BRIDGE_STEP_TOKEN": token})
        assert wait_until("the control step's prolog", marker.exists, timeout=20)
        marker.unlink()
    finally:
        bridge.slurm("scancel", str(job_id), check=False)


@pytest.mark.shares_the_cluster
def test_srun_into_a_native_job_still_works_with_the_guard(bridge: Sandbox) -> None:
    job_id = bridge.sbatch("-p", "native", "--wrap", "sleep 30")
    try:
        wait_until("native job running", lambda: bridge.slurm(
            "squeue", "-h", "-j", str(job_id), "-o", "%T").stdout.strip() == "RUNNING")
        step = bridge.slurm("srun", f"--jobid={job_id}", "--overlap", "-N1", "echo", "step-ran",
                            user="alice", cwd="/home/alice")
        assert step.stdout == "step-ran\n"
        raw = _raw_client(bridge, "srun", f"--jobid={job_id}", "--overlap", "-N1",
                          "echo", "step-ran")
        assert raw.stdout == "step-ran\n", raw.stderr
    finally:
        bridge.slurm("scancel", str(job_id), check=False)


# -- the waiter on the slurmd host ----------------------------------------------------------------

EVIL_SO = r"""
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void planted(void) {
    char path[256];
    snprintf(path, sizeof path, "%s/pwned-ld-%d", PLANT_DIR, (int) getpid());
    close(open(path, O_CREAT | O_WRONLY, 0644));
}
"""


@pytest.mark.shares_the_cluster
def test_the_waiter_ignores_what_the_user_plants(bridge: Sandbox, tmp_path: Path) -> None:
    home = bridge.home("alice")
    plant = home / "plant"
    subprocess.run(["rm", "-rf", str(plant)], check=True)
    (plant / "bridge").mkdir(parents=True)
    (plant / "pylib").mkdir()
    (plant / "bin").mkdir()
    marker_code = f"import os\nopen(os.path.join({str(plant)!r}, 'pwned-py-' + str(os.getpid())), 'w')\n"
    (plant / "bridge" / "waiter").mkdir()
    for name in ("bridge/__init__.py", "bridge/waiter.py", "bridge/waiter/__init__.py",
                 "bridge/waiter/attach.py", "json.py", "hashlib.py",
                 "pylib/sitecustomize.py", "pylib/json.py", "pylib/socket.py"):
        (plant / name).write_text(marker_code)
    # Not `sh`: the pod's own shell may follow the job's PATH, and that is the pod's business.
    for name in ("munge", "unmunge", "python3", "env", "python3.13"):
        program = plant / "bin" / name
        program.write_text(f"#!/bin/sh\ntouch {plant}/pwned-path-{name}\n")
        program.chmod(0o755)
    source = tmp_path / "evil.c"
    source.write_text(EVIL_SO.replace("PLANT_DIR", json.dumps(str(plant))))
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(plant / "evil.so"), str(source)], check=True)
    subprocess.run(["chown", "-R", "alice:alice", str(plant)], check=True)
    script = write_script(bridge, "alice", "plant/job.sh", "#!/bin/sh\n" + BUSYBOX + PROBE + "exit 4\n")

    job_id = bridge.sbatch(
        "-p", "k8s", "-o", f"{home}/slurm-%j.out",
        f"--export=ALL,LD_PRELOAD={plant}/evil.so,LD_LIBRARY_PATH={plant},PYTHONPATH={plant}/pylib,"
        f"PYTHONHOME={plant},PYTHONSTARTUP={plant}/json.py,PATH={plant}/bin:/usr/bin:/bin",
        str(script), cwd=str(plant),
    )
    row = bridge.wait_job_final(job_id)

    assert (row["State"], row["ExitCode"]) == ("FAILED", "4:0"), "the job ran, in its pod"
    assert _output(bridge, job_id) == "IN_POD\n"
    assert sorted(p.name for p in plant.iterdir() if p.name.startswith("pwned")) == []


def _elf_program_types(program: bytes) -> list[int]:
    """The p_type of every program header of a 64-bit little-endian ELF file."""
    assert program[:6] == b"\x7fELF\x02\x01", "not a 64-bit little-endian ELF file"
    (table,) = struct.unpack_from("<Q", program, 0x20)
    entry_size, count = struct.unpack_from("<HH", program, 0x36)
    return [struct.unpack_from("<I", program, table + i * entry_size)[0] for i in range(count)]


PT_INTERP = 3  # names the dynamic loader: a program with it loads libraries a user's environment can steer


@pytest.mark.shares_the_cluster
def test_the_waiter_is_one_static_program_started_by_absolute_path(bridge: Sandbox) -> None:
    settings = (Path(bridge.env["SLURM_CONF"]).parents[1] / "job_submit_bridge.conf").read_text()
    command = next(line for line in settings.splitlines() if line.startswith("attach_command="))
    words = command.removeprefix("attach_command=").split()
    # The compiled waiter: the program itself, then only its options; a static program (no
    # loader, so no LD_PRELOAD or LD_LIBRARY_PATH of the user's decides what it runs).
    assert words[0].startswith("/") and words[1:2] == ["--api"] and len(words) == 3, words
    waiter = Path(words[0])
    assert PT_INTERP not in _elf_program_types(waiter.read_bytes()), f"{waiter} is dynamically linked"
    for path in (waiter, waiter.parent):
        assert path.stat().st_uid == 0 and not path.stat().st_mode & 0o022, f"{path} writable by others"


# -- the attach credential ---------------------------------------------------------------------------

def _credential(bridge: Sandbox, user: str, payload: str) -> str:
    return subprocess.run(["runuser", "-u", user, "--", "munge"], input=payload, capture_output=True,
                          text=True, check=True, env=bridge.environ()).stdout.strip()


def _digest(method: str, path: str, job_id: int, body: bytes) -> str:
    digest = hashlib.sha256(f"{method}\n{path}\n{job_id}\n".encode())
    digest.update(body)
    return "slurm-k8s-bridge-v1:" + digest.hexdigest()


def _post(path: str, body: bytes, credential: str) -> tuple[int, str]:
    headers = {"Content-Type": "application/json", "X-Munge-Credential": credential}
    request = urllib.request.Request(f"{API}{path}", data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read(200).decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@pytest.mark.shares_the_cluster
def test_a_captured_attach_credential_is_refused_for_any_other_request(bridge: Sandbox) -> None:
    script = write_script(bridge, "alice", "cred.sh", "#!/bin/sh\n" + BUSYBOX + "sleep 60\n")
    first, second = (bridge.sbatch("-p", "k8s", str(script)) for _ in range(2))
    try:
        _running(bridge, first)
        _running(bridge, second)
        cancel = f"/v1/jobs/{first}/cancel"
        body = b"{}"

        def captured() -> str:
            """A credential the waiter made for `POST cancel {}` of the first job, caught in flight."""
            return _credential(bridge, "alice", _digest("POST", cancel, first, body))

        for path, other_body in ((cancel, b'{"other": 1}'),             # another body
                                 (f"/v1/jobs/{second}/cancel", body),   # another job
                                 (f"/v1/jobs/{first}/attach", body)):   # another path
            status, text = _post(path, other_body, captured())
            assert (status, "not made for this request" in text) == (403, True), (path, other_body, text)
        # A credential without any request digest (as waiters sent before binding) is refused too.
        status, text = _post(cancel, body, _credential(bridge, "alice", ""))
        assert (status, "not made for this request" in text) == (403, True), text
        # Nothing above touched the jobs: both still run.
        time.sleep(1)
        for job_id in (first, second):
            assert bridge.slurm("squeue", "-h", "-j", str(job_id), "-o", "%T").stdout.strip() == "RUNNING"
        # The credential for its own request works once; replayed, munged refuses it.
        credential = captured()
        assert _post(cancel, body, credential)[0] == 200
        status, text = _post(cancel, body, credential)
        assert (status, "replayed" in text) == (403, True), text
        wait_until(f"job {first} stopped by its own cancel request", lambda: bridge.slurm(
            "squeue", "-h", "-j", str(first), "-o", "%T").stdout.strip() in ("", "COMPLETING"), timeout=60)
        assert bridge.slurm("squeue", "-h", "-j", str(second), "-o", "%T").stdout.strip() == "RUNNING"
    finally:
        bridge.slurm("scancel", str(first), str(second), check=False)


# -- identity in the pod ----------------------------------------------------------------------------

@pytest.mark.shares_the_cluster
def test_the_pod_has_the_job_users_groups_as_a_native_job_does(bridge: Sandbox) -> None:
    body = "id -G\n"
    native = bridge.sbatch("-p", "native", "--wrap", body)
    bridged = bridge.sbatch("-p", "k8s", "--wrap", BUSYBOX.strip() + "\n" + body)
    for job_id in (native, bridged):
        assert bridge.wait_job_final(job_id)["State"] == "COMPLETED"
    expected = _output(bridge, native)
    assert expected.split() == ["2001", "3000"], "the sandbox puts alice in sbxproj (3000)"
    assert _output(bridge, bridged) == expected


# -- found by the adversarial review ----------------------------------------------------------------

@pytest.mark.parametrize("how", [["--get-user-env"], ["--export=NONE"], ["--export=ALL,FOO=bar"]])
def test_no_login_scripts_run_on_the_slurmd_for_a_bridged_job(bridge: Sandbox, how: list[str]) -> None:
    """slurmd builds the environment of these jobs with `su - alice` on its own host: her profile."""
    home = bridge.home("alice")
    profile = home / ".bash_profile"
    saved = profile.read_bytes() if profile.exists() else None
    marker = home / "pwned-profile"
    marker.unlink(missing_ok=True)
    profile.write_text(f"touch {marker}\n")
    subprocess.run(["chown", "alice:alice", str(profile)], check=True)
    try:
        result = bridge.slurm("sbatch", "--parsable", "-p", "k8s", *how, "--wrap",
                              BUSYBOX.strip() + "\n" + PROBE, user="alice", cwd=str(home))
        assert "the login environment is not built for it" in result.stderr
        job_id = int(result.stdout.strip())
        assert bridge.wait_job_final(job_id)["State"] == "COMPLETED"
        assert _output(bridge, job_id) == "IN_POD\n"
        assert not marker.exists(), "alice's .bash_profile ran outside a pod"
    finally:
        if saved is None:
            profile.unlink()
        else:
            profile.write_bytes(saved)


EVIL_PROVIDER = r"""
#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void planted(void) { close(open(MARKER, O_CREAT | O_WRONLY, 0644)); }
int OSSL_provider_init(void) { return 0; }
"""


@pytest.mark.shares_the_cluster
def test_an_openssl_config_of_the_user_is_never_loaded_by_the_waiter(bridge: Sandbox, tmp_path: Path) -> None:
    home = bridge.home("alice")
    marker = home / "pwned-openssl"
    marker.unlink(missing_ok=True)
    source = tmp_path / "provider.c"
    source.write_text(EVIL_PROVIDER.replace("MARKER", json.dumps(str(marker))))
    module = home / "provider.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(module), str(source)], check=True)
    conf = home / "openssl.cnf"
    conf.write_text(f"openssl_conf = init\n[init]\nproviders = p\n[p]\nx = s\n[s]\nmodule = {module}\n"
                    "activate = 1\n")
    subprocess.run(["chown", "alice:alice", str(module), str(conf)], check=True)
    job_id = bridge.sbatch("-p", "k8s", f"--export=ALL,OPENSSL_CONF={conf},OPENSSL_MODULES={home}",
                           "--wrap", BUSYBOX.strip() + "\n" + PROBE)
    assert bridge.wait_job_final(job_id)["State"] == "COMPLETED"
    assert _output(bridge, job_id) == "IN_POD\n"
    assert not marker.exists(), "libcrypto loaded the user's module on the slurmd host"


def test_a_reservation_in_a_bridged_partition_gets_the_job_wrapped(bridge: Sandbox) -> None:
    """A job that reaches a bridged partition only through its reservation is wrapped as any: it
    runs in a pod (k8s: the partition's default image), or is refused with the reason where
    the partition has no image for it (dra)."""
    for partition, node in (("k8s", "kreal2"), ("dra", "kreal1")):
        bridge.slurm("scontrol", "create", "reservation", f"reservationname=bridged-{partition}",
                     "users=alice", f"partitionname={partition}", f"nodes={node}", "starttime=now",
                     "duration=10", "flags=ignore_jobs")
    try:
        plain = write_script(bridge, "alice", "resv-plain.sh", "#!/bin/sh\n" + PROBE)
        refused = bridge.slurm("sbatch", "--reservation=bridged-dra", str(plain), user="alice",
                               cwd="/home/alice", check=False)
        assert refused.returncode != 0 and "partition dra runs jobs in Kubernetes" in refused.stderr
        script = write_script(bridge, "alice", "resv.sh", "#!/bin/sh\n" + BUSYBOX + PROBE)
        jobs = {("k8s", "plain"): bridge.sbatch("--reservation=bridged-k8s", str(plain)),
                ("dra", "image"): bridge.sbatch("--reservation=bridged-dra", str(script))}
        for (partition, _), job_id in jobs.items():
            row = bridge.wait_job_final(job_id)
            assert (row["Partition"], row["State"]) == (partition, "COMPLETED")
            assert _output(bridge, job_id) == "IN_POD\n"
    finally:
        # Slurm keeps a reservation that a job still uses: left, it would hold kreal2 from every
        # later test for its whole duration.
        for partition in ("k8s", "dra"):
            bridge.slurm("scancel", f"--reservation=bridged-{partition}", check=False)
            wait_until(f"reservation bridged-{partition} deleted", lambda p=partition: bridge.slurm(
                "scontrol", "delete", f"reservationname=bridged-{p}", check=False).returncode == 0 or None,
                timeout=60, interval=1)


def _restore(path: Path, content: bytes) -> None:
    """Put a file slurmctld caches back: it reloads job_submit.lua only when the file's mtime is
    later than its last load, which a rewrite within the same second is not."""
    path.write_bytes(content)
    later = time.time() + 2
    os.utime(path, (later, later))


def test_a_script_that_reaches_a_bridged_node_without_job_submit_runs_in_its_pod(bridge: Sandbox) -> None:
    """Defence in depth: with job_submit.lua bypassed (here: replaced by one that lets everything
    through, as a misconfigured controller would), slurmstepd's guard still starts the waiter in
    the script's place: the script runs in a pod (the partition's default image), never on the
    slurmd host, and the node stays in service."""
    lua = Path(bridge.env["SLURM_CONF"]).parents[1] / "job_submit.lua"
    saved = lua.read_bytes()
    lua.write_text("function slurm_job_submit(d, p, u) return slurm.SUCCESS end\n"
                   "function slurm_job_modify(d, r, p, u) return slurm.SUCCESS end\nreturn slurm.SUCCESS\n")
    try:
        script = write_script(bridge, "alice", "unchecked.sh", "#!/bin/sh\n" + PROBE)
        job_id = bridge.sbatch("-p", "k8s", "-w", "kreal2", "--no-requeue", str(script))
    finally:
        _restore(lua, saved)
    try:
        row = bridge.wait_job_final(job_id)
        assert row["State"] == "COMPLETED", row
        assert _output(bridge, job_id) == "IN_POD\n"
        state = bridge.slurm("sinfo", "-h", "-n", "kreal2", "-o", "%T").stdout.strip()
        assert not state.startswith("drain"), state
    finally:
        bridge.slurm("scancel", str(job_id), check=False)


@pytest.mark.shares_the_cluster
def test_an_oci_container_is_refused_in_a_bridged_partition(bridge: Sandbox) -> None:
    result = bridge.slurm("sbatch", "-p", "k8s", "--container=/home/alice", "--wrap",
                          BUSYBOX.strip() + "\n" + PROBE, user="alice", cwd="/home/alice", check=False)
    assert result.returncode != 0 and "--container cannot be used there" in result.stderr


@pytest.mark.shares_the_cluster
def test_a_job_exported_with_none_still_has_home_and_user_like_native(bridge: Sandbox) -> None:
    body = 'echo "$HOME $USER $LOGNAME"\n'
    native = bridge.sbatch("-p", "native", "--export=NONE", "--wrap", body)
    bridged = bridge.sbatch("-p", "k8s", "--export=NONE", "--wrap", BUSYBOX.strip() + "\n" + body)
    for job_id in (native, bridged):
        assert bridge.wait_job_final(job_id)["State"] == "COMPLETED"
    assert _output(bridge, native) == "/home/alice alice alice\n"
    assert _output(bridge, bridged) == _output(bridge, native)
