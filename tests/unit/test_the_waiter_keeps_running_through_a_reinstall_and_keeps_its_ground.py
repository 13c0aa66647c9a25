"""The compiled waiter as it runs on a slurmd host: a waiter running while its file is reinstalled
(a new file renamed over it) runs on to its job's end, with the signals held for its start still
acted on and nothing of the reinstall in the job's environment, and the next start runs the new
file; the task proxies of a step are started exactly as the waiter was; a task proxy passes on
the signals that came while it started; both leave the submit directory."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import sys
import threading
from pathlib import Path

import pytest

from .waiter_runs import (
    Exchange,
    FakeDaemon,
    answering,
    fakes,
    go_waiter,
    require_namespaces,
    run_waiter,
    start_limits,
    streaming,
)

require_namespaces()

# LC_ALL set: Python, which holds a signal pending for the waiter here, would coerce LC_CTYPE.
ENV = {"SLURM_JOB_ID": "42", "PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"}
JOB_EVENTS = ({"type": "log", "pod": 0, "ts": "t1", "line": "hello from the pod"},
              {"type": "exit", "code": 3, "signal": None})
# Notes its cwd in `cwds` beside /opt's stand-ins, then answers as the usual stand-in.
CWD_MUNGE = "#!/bin/sh\nreadlink /proc/$$/cwd >> {cwds}\nprintf 'MUNGE:'\nexec cat\n"


@pytest.fixture
def waiter(tmp_path: Path) -> list[str]:
    """The waiter installed in a directory of its own (a test replaces it)."""
    libexec = tmp_path / "libexec"
    libexec.mkdir()
    return go_waiter(libexec)


def with_usr1_pending(command: list[str]) -> list[str]:
    """`command` started as the step guard starts the waiter: SIGUSR1 blocked, and one already
    came (pending across the exec)."""
    hold = ("import os, signal, sys\n"
            "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})\n"
            "os.kill(os.getpid(), signal.SIGUSR1)\n"
            "os.execv(sys.argv[1], sys.argv[1:])\n")
    return [sys.executable, "-I", "-c", hold, *command]


def _batch_script(tmp_path: Path) -> Path:
    script = tmp_path / "slurm_script"
    script.write_text("#!/bin/sh\necho hi\n")
    return script


def test_a_waiter_running_while_its_file_is_replaced_runs_on(waiter: list[str], tmp_path: Path) -> None:
    installed = Path(waiter[0])
    inode = installed.stat().st_ino
    reinstalled = threading.Event()

    def attach(exchange: Exchange) -> None:
        # The reinstall, while the waiter runs: a new file renamed over the installed one.
        newer = installed.with_name("waiter.new")
        shutil.copy2(installed, newer)
        with open(newer, "ab") as grown:  # a newer release: another file, of another size
            grown.write(b"\0" * 4096)
        os.replace(newer, installed)
        reinstalled.set()
        streaming(*JOB_EVENTS)(exchange)

    daemon = FakeDaemon([attach], {"signal": answering(409, "not attached yet")})
    try:
        ran = run_waiter(with_usr1_pending(waiter), daemon, args=[str(_batch_script(tmp_path))], cwd=tmp_path,
                         opt=fakes(tmp_path), env=ENV)
    finally:
        daemon.close()
    assert reinstalled.is_set() and installed.stat().st_ino != inode
    assert (ran.returncode, ran.stdout, ran.stderr) == (3, b"hello from the pod\n", b"")
    assert [path for path, _ in ran.requests] == ["/v1/jobs/42/signal", "/v1/jobs/42/attach"]
    body = json.loads(ran.requests[-1][1])
    assert body["signals"] == [[1, signal.SIGUSR1]], "the signal held for its start is the script's"
    expected = {**ENV, "PWD": str(tmp_path), **start_limits()}
    assert body["environment"] == expected, "nothing of the reinstall in it"

    again = FakeDaemon([streaming(*JOB_EVENTS)])
    try:
        ran = run_waiter(waiter, again, args=[str(_batch_script(tmp_path))], cwd=tmp_path,
                         opt=fakes(tmp_path), env={"SLURM_JOB_ID": "42"})
    finally:
        again.close()
    assert (ran.returncode, ran.stdout) == (3, b"hello from the pod\n"), "the next start runs the new file"


def test_the_waiter_leaves_the_submit_directory(waiter: list[str], tmp_path: Path) -> None:
    """What it runs (munge here) runs in /; the job's pods still start where it was submitted."""
    cwds = tmp_path / "cwds"
    opt = fakes(tmp_path)
    (opt / "munge/bin/munge").write_text(CWD_MUNGE.format(cwds=cwds))
    daemon = FakeDaemon([streaming(*JOB_EVENTS)], {"task": streaming({"exit": 0})})
    try:
        batch = run_waiter(waiter, daemon, args=[str(_batch_script(tmp_path))], cwd=tmp_path, opt=opt,
                           env={"SLURM_JOB_ID": "42"})
        task = run_waiter(waiter, daemon, args=["task", "5"], cwd=tmp_path, opt=opt,
                          env={"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "n1"})
    finally:
        daemon.close()
    assert (batch.returncode, task.returncode) == (3, 0), (batch.stderr, task.stderr)
    assert cwds.read_text() == "/\n/\n"
    attached = [json.loads(body) for path, body in task.requests if path.endswith("/attach")]
    assert attached[0]["work_dir"] == str(tmp_path), "the job's pods start where it was submitted"


def test_a_task_proxy_passes_on_a_signal_that_came_while_it_started(
    waiter: list[str], tmp_path: Path,
) -> None:
    daemon = FakeDaemon([], {"task": streaming({"exit": 0}), "task-signal": answering(200, "{}")})
    try:
        ran = run_waiter(with_usr1_pending(waiter), daemon, args=["task", "5"], cwd=tmp_path,
                         opt=fakes(tmp_path), env={"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "n1",
                                                   "SLURM_PROCID": "2", "LC_ALL": "C.UTF-8"})
    finally:
        daemon.close()
    assert ran.returncode == 0, ran.stderr
    assert ran.requests[0] == ("/v1/jobs/42/task-signal",
                               b'{"key": "5", "procid": "2", "node": "n1", "signal": 10}')
    assert [path for path, _ in ran.requests[1:]] == ["/v1/jobs/42/task"]


# Prints each of its arguments on a line (to the job's output: the daemon takes none), then ends.
ARGV_SRUN = "#!/bin/sh\nprintf 'srun %s\\n' \"$0\"\nfor word in \"$@\"; do printf '%s\\n' \"$word\"; done\n"


def test_a_steps_task_proxies_are_started_as_the_waiter_was(waiter: list[str], tmp_path: Path) -> None:
    """The waiter's own path and options, then `task KEY`: the SPANK guard lets exactly the
    waiter's command through."""
    daemon: FakeDaemon
    request = base64.b64encode(json.dumps({"key": 7, "argv": ["-n", "2", "hostname"]}).encode()).decode()

    def attach(exchange: Exchange) -> None:
        exchange.stream()
        exchange.send({"type": "step", "pod": 0, "ts": "t1", "data": request, "token": "signed", "io": []})
        assert daemon.event("step-done").wait(20)
        exchange.send({"type": "exit", "code": 0, "signal": None})

    daemon = FakeDaemon([attach], {"step-output": answering(404, "no open step 7")})
    try:
        ran = run_waiter(waiter, daemon, args=[str(_batch_script(tmp_path))], cwd=tmp_path,
                         opt=fakes(tmp_path, ARGV_SRUN), env={"SLURM_JOB_ID": "42", "SLURM_NNODES": "1"})
    finally:
        daemon.close()
    assert ran.returncode == 0, ran.stderr
    words = ran.stdout.decode().splitlines()
    assert words[:2] == ["srun /opt/slurm/bin/srun", "--jobid=42"]
    assert words[-5:] == [waiter[0], "--api", f"http://127.0.0.1:{daemon.port}", "task", "7"]
