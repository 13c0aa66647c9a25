"""The waiter's archive as it runs on a slurmd host: a waiter that starts while its archive is being
reinstalled starts again, once, from the new file, with the signals held for it still pending and
no trace of the restart in the job's environment; the task proxies of a step are started exactly
as the waiter was; a task proxy passes on the signals that came while it started; both leave the
submit directory; and a rebuild never shows a reader half a file."""

from __future__ import annotations

import binascii
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge.waiter import attach, build, steps
from bridge.waiter.attach import MARKER

JOB_EVENTS = ({"type": "log", "pod": 0, "ts": "t1", "line": "hello from the pod"},
              {"type": "exit", "code": 3, "signal": None})


@pytest.fixture(scope="module")
def waiter_pyz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build.build(tmp_path_factory.mktemp("libexec") / "waiter.pyz", sys.executable)


class FakeDaemon:
    """The daemon's API as the waiter sees it: records each request (path, body) and answers an
    attach with a log line and exit code 3, a task with exit code 0, a signal with 409 (not
    attached yet: the next attach carries it) and anything else with 200."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)  # a closed listener does not wake an accept() on Linux
        self.stopped = threading.Event()
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.requests: list[tuple[str, dict[str, object]]] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(10)
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                while len(body) < length:
                    body += conn.recv(65536)
                path = head.split()[1].decode()
                self.requests.append((path, json.loads(body)))
                if path.endswith("/attach"):
                    answer = b"HTTP/1.0 200 OK\r\n\r\n" + b"".join(json.dumps(e).encode() + b"\n"
                                                                   for e in JOB_EVENTS)
                elif path.endswith("/task"):
                    answer = b'HTTP/1.0 200 OK\r\n\r\n{"exit": 0}\n'
                elif path.endswith("/signal"):
                    answer = b"HTTP/1.0 409 Conflict\r\n\r\nnot attached yet"
                else:
                    answer = b"HTTP/1.0 200 OK\r\n\r\n"
                conn.sendall(answer)

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=10)
        self.listener.close()


@pytest.fixture
def daemon() -> Iterator[FakeDaemon]:
    fake = FakeDaemon()
    yield fake
    fake.close()


def _with_usr1_pending() -> None:
    """As the step guard starts the waiter: SIGUSR1 blocked, and here one already came."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    os.kill(os.getpid(), signal.SIGUSR1)


def _batch_script(tmp_path: Path) -> Path:
    script = tmp_path / "slurm_script"
    script.write_text(f"#!/bin/sh\nexec waiter \"$0\"\n{MARKER}\n#!/bin/sh\necho hi\n")
    return script


# The archive run as `python3 -I -S -c PROBE ...` with munge stood in for (none on this host); on
# its first start the probe lets zipimport read the installed archive, then installs a newer one.
PROBE = """
import os, runpy, sys
installed, newer, api, script = sys.argv[1:]
print("start", os.getpid(), file=sys.stderr, flush=True)
sys.path.insert(0, installed)
from bridge.waiter import munge
munge.munge_credential = lambda payload: payload
if "REINSTALLED" not in os.environ:
    os.environ["REINSTALLED"] = "1"
    os.replace(newer, installed)
sys.argv = [installed, "--api", api, script]
runpy.run_path(installed, run_name="__main__")
"""


def test_a_waiter_started_while_its_archive_is_replaced_starts_again_once(
    waiter_pyz: Path, tmp_path: Path, daemon: FakeDaemon
) -> None:
    installed, newer = tmp_path / "waiter.pyz", tmp_path / "newer.pyz"
    shutil.copyfile(waiter_pyz, installed)
    # The newer release has one more module: every entry after it moved in the file.
    with zipfile.ZipFile(waiter_pyz) as old, zipfile.ZipFile(newer, "w") as new:
        for info in old.infolist():
            new.writestr(info, old.read(info))
            if info.filename == "bridge/__init__.pyc":
                new.writestr("bridge/added.py", "# a module a newer waiter has\n" * 5)
    result = subprocess.run(
        [sys.executable, "-I", "-S", "-c", PROBE, str(installed), str(newer), daemon.url,
         str(_batch_script(tmp_path))],
        capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path,
        env={"SLURM_JOB_ID": "42", "PATH": "/usr/bin:/bin"}, preexec_fn=_with_usr1_pending,
    )

    assert (result.returncode, result.stdout) == (3, "hello from the pod\n"), result.stderr
    starts = [line for line in result.stderr.splitlines() if line.startswith("start ")]
    assert len(starts) == 2 and starts[0] == starts[1], "started again once, in the same process"
    (path, body), = [(p, b) for p, b in daemon.requests if p.endswith("/attach")]
    assert path == "/v1/jobs/42/attach"
    environment = body["environment"]
    assert isinstance(environment, dict) and environment.get("REINSTALLED") == "1"
    assert build.REEXEC not in environment, "the restart's marker never reaches the pods"
    assert body["signals"] == [[1, signal.SIGUSR1]], "the signal held for its start is the script's"


def test_a_waiter_that_cannot_import_after_starting_again_fails(tmp_path: Path) -> None:
    """Started again once only: an archive that cannot be imported does not loop."""
    broken = tmp_path / "broken.pyz"
    with zipfile.ZipFile(broken, "w") as archive:
        archive.writestr("__main__.py", build.MAIN)
        archive.writestr("bridge/__init__.py", "")
        archive.writestr("bridge/waiter/__init__.py", "")
        archive.writestr("bridge/waiter/main.py", "import os\nprint('imported', os.getpid(), flush=True)\n"
                                                  "raise ImportError('not this one')\n")
    result = subprocess.run([sys.executable, "-I", "-S", str(broken)], capture_output=True, text=True,
                            timeout=60, check=False, env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 1 and "ImportError: not this one" in result.stderr
    assert len(set(result.stdout.splitlines())) == 1 and len(result.stdout.splitlines()) == 2


def test_the_waiter_leaves_the_submit_directory(waiter_pyz: Path, tmp_path: Path, daemon: FakeDaemon) -> None:
    program = (f"import os, sys; sys.path.insert(0, {str(waiter_pyz)!r})\n"
               "from bridge.waiter import munge\n"
               "def munge_credential(payload):\n"
               "    print('cwd', os.getcwd(), file=sys.stderr)\n"
               "    return payload\n"
               "munge.munge_credential = munge_credential\n"
               "from bridge.waiter.main import main\n"
               "sys.exit(main(sys.argv[1:]))\n")
    for args, env in (([str(_batch_script(tmp_path))], {"SLURM_JOB_ID": "42"}),
                      (["task", "5"], {"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "n1"})):
        result = subprocess.run([sys.executable, "-I", "-S", "-c", program, "--api", daemon.url, *args],
                                capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path,
                                env=env)
        assert result.returncode in (0, 3), result.stderr
        cwds = {line for line in result.stderr.splitlines() if line.startswith("cwd ")}
        assert cwds == {"cwd /"}, (args, result.stderr)
    attached = [body for path, body in daemon.requests if path.endswith("/attach")]
    assert attached[0]["work_dir"] == str(tmp_path), "the job's pods start where it was submitted"


def test_a_task_proxy_passes_on_a_signal_that_came_while_it_started(
    waiter_pyz: Path, tmp_path: Path, daemon: FakeDaemon
) -> None:
    program = (f"import sys; sys.path.insert(0, {str(waiter_pyz)!r})\n"
               "from bridge.waiter import munge\n"
               "munge.munge_credential = lambda payload: payload\n"
               "from bridge.waiter.main import main\n"
               "sys.exit(main(sys.argv[1:]))\n")
    result = subprocess.run(
        [sys.executable, "-I", "-S", "-c", program, "--api", daemon.url, "task", "5"],
        capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path,
        env={"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "n1", "SLURM_PROCID": "2"},
        preexec_fn=_with_usr1_pending,
    )
    assert result.returncode == 0, result.stderr
    assert daemon.requests[0] == ("/v1/jobs/42/task-signal",
                                  {"key": "5", "procid": "2", "node": "n1", "signal": signal.SIGUSR1})
    assert daemon.requests[1][0] == "/v1/jobs/42/task"


def test_a_steps_task_proxies_are_started_as_the_waiter_was(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """-I -S, the archive, its options: the SPANK guard lets exactly the waiter's command through."""
    pyz = str(tmp_path / "waiter.pyz")
    monkeypatch.setattr(sys, "orig_argv", [sys.executable, "-I", "-S", pyz, "--api", "http://d:1", "job.sh"])
    monkeypatch.setattr(sys, "argv", [pyz, "--api", "http://d:1", "job.sh"])
    commands: list[list[str]] = []
    ran = threading.Event()

    def run_relayed(command: list[str], *_: object) -> int:
        commands.append(command)
        ran.set()
        return 0

    monkeypatch.setattr(steps, "srun_binary", lambda: "/usr/bin/srun")
    monkeypatch.setattr(steps, "run_relayed", run_relayed)
    monkeypatch.setattr(steps.ScriptSteps, "done", lambda self, key, code: None)
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    waiter = attach.Waiter("http://d:1", 42, "echo hi\n", {}, "/", None)
    request = json.dumps({"key": 7, "argv": ["-n", "2", "hostname"]}).encode()
    waiter._steps.start(binascii.b2a_base64(request).decode(), "token")
    assert ran.wait(10)
    tail = [sys.executable, "-I", "-S", pyz, "--api", "http://d:1", "task", "7"]
    assert commands[0][-len(tail):] == tail
    assert commands[0][:2] == ["/usr/bin/srun", "--jobid=42"]


def test_a_rebuild_never_shows_a_reader_half_a_file(
    monkeypatch: pytest.MonkeyPatch, waiter_pyz: Path, tmp_path: Path
) -> None:
    dest = tmp_path / "waiter.pyz"
    shutil.copyfile(waiter_pyz, dest)
    before = dest.read_bytes()
    replaced: list[tuple[Path, Path]] = []
    real_replace = os.replace

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        replaced.append((Path(src), Path(dst)))
        assert zipfile.is_zipfile(src), "moved into place once whole"
        real_replace(src, dst)

    monkeypatch.setattr(build.os, "replace", replace)
    with open(dest, "rb") as reader:  # a slurmd's python3, reading the installed waiter
        inode = os.fstat(reader.fileno()).st_ino
        build.build(dest)
        assert reader.read() == before, "what a reader opened stays whole"
    assert os.stat(dest).st_ino != inode
    (partial, target), = replaced
    assert target == dest and partial.parent == dest.parent and partial != dest, "renamed in place"
