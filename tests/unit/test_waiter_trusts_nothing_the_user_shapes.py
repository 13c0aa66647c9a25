"""The waiter runs on the slurmd host as the user: it binds its credential to the request, runs
nothing from the user's PATH or cwd, loads nothing the user's environment names (it is one static
program), and gives the pods back the variables the SPANK guard held out of its way. Checked of the
compiled waiter (agent/cmd/waiter), run as a slurmd starts it (waiter_runs.py)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bridge.core.waiter_protocol import request_digest

from .waiter_runs import (
    MARKER,
    ROOT,
    FakeDaemon,
    Run,
    environ_order,
    fakes,
    go_test,
    go_waiter,
    require_namespaces,
    run_waiter,
    start_limits,
    streaming,
)

require_namespaces()

SAFE_ENVIRONMENT = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}
"""What the waiter's own helpers (munge, Slurm's binaries) run with: nothing of the user's."""


@pytest.fixture(scope="module")
def waiter(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return go_waiter(tmp_path_factory.mktemp("waiter"))

# Said at once (the host's fault, not the daemon's), then again when the job is cancelled.
MUNGE_UNUSABLE = (b"slurm-k8s-bridge: cannot make a munge credential on this host, waiting for it to be "
                  b"fixed: %s\nslurm-k8s-bridge: could not reach the bridge to cancel: %s\n")


def attached(waiter: list[str], tmp_path: Path, env: dict[str, str], script: str = "#!/bin/sh\necho hi\n",
             opt: Path | None = None) -> Run:
    """The job (batch script `script`) run to its end (exit 0) against a fake daemon."""
    daemon = FakeDaemon([streaming({"type": "exit", "code": 0, "signal": None})])
    path = tmp_path / "slurm_script"
    path.write_text(f"{script}")
    try:
        return run_waiter(waiter, daemon, args=[str(path)], env=env, cwd=tmp_path,
                          opt=fakes(tmp_path) if opt is None else opt)
    finally:
        daemon.close()


def sent(run: Run) -> dict[str, object]:
    (path, body), = run.requests
    assert path == "/v1/jobs/42/attach"
    decoded = json.loads(body)
    assert isinstance(decoded, dict)
    return decoded


def test_the_digest_binds_method_path_job_and_body() -> None:
    base = request_digest("POST", "/v1/jobs/7/cancel", 7, b"{}")
    assert base.startswith("slurm-k8s-bridge-v1:")
    others = {
        request_digest("GET", "/v1/jobs/7/cancel", 7, b"{}"),
        request_digest("POST", "/v1/jobs/7/attach", 7, b"{}"),
        request_digest("POST", "/v1/jobs/7/cancel", 8, b"{}"),
        request_digest("POST", "/v1/jobs/7/cancel", 7, b"{ }"),
    }
    assert base not in others and len(others) == 4
    go_test("TestRequestDigestIsPythons")  # the waiter's digest is the daemon's, byte for byte


def test_held_variables_get_their_names_back_for_the_pods(waiter: list[str], tmp_path: Path) -> None:
    env = {"SLURM_JOB_ID": "42", "SLURM_K8S_BRIDGE_HELD_LD_PRELOAD": "/x.so",
           "SLURM_K8S_BRIDGE_HELD_PYTHONPATH": "/p", "HOME": "/home/alice",
           "SLURM_K8S_BRIDGE_HELD_": "nameless"}
    ran = attached(waiter, tmp_path, env)
    assert ran.returncode == 0, ran.stderr
    assert sent(ran)["environment"] == {"SLURM_JOB_ID": "42", "LD_PRELOAD": "/x.so", "PYTHONPATH": "/p",
                                        "HOME": "/home/alice", "PWD": str(tmp_path), **start_limits()}
    go_test("TestHeldVariablesGetTheirNamesBack")


def test_where_the_guard_held_the_environment_only_held_and_slurm_variables_count(
    waiter: list[str], tmp_path: Path,
) -> None:
    env = {"SLURM_K8S_BRIDGE_ENV_HELD": "1", "LC_CTYPE": "C.UTF-8", "SLURM_JOB_ID": "42",
           "SLURM_K8S_BRIDGE_HELD_HOME": "/home/alice", "SLURM_K8S_BRIDGE_HELD_OPENSSL_CONF": "/x"}
    ran = attached(waiter, tmp_path, env)
    assert ran.returncode == 0, ran.stderr
    assert sent(ran)["environment"] == {"SLURM_JOB_ID": "42", "HOME": "/home/alice", "OPENSSL_CONF": "/x",
                                        **start_limits()}


def planted_executables(directory: Path, log: Path) -> None:
    """munge, srun, sh, cat... in `directory`, each noting in `log` that it ran."""
    for name in ("munge", "srun", "sh", "cat", "env", "unmunge"):
        path = directory / name
        path.write_text(f"#!/bin/sh\necho {name} >> {log}\nexit 0\n")
        path.chmod(0o755)


def _cancel_later(proc: subprocess.Popen[bytes]) -> None:
    """scancel as slurmstepd does it: TERM, then KILL once KillWait is over (3 s here)."""
    time.sleep(2)
    proc.send_signal(signal.SIGTERM)
    time.sleep(3)
    proc.kill()


def test_munge_is_never_looked_up_on_the_path_or_in_the_cwd(waiter: list[str], tmp_path: Path) -> None:
    """No munge where the waiter looks (/usr/bin, /usr/local/bin, /opt/munge/bin): it waits as in
    an outage; a cancel cannot be sent either and it says why. The PATH's and the cwd's never run."""
    planted, log = tmp_path / "bin", tmp_path / "ran"
    planted.mkdir()
    planted_executables(planted, log)
    planted_executables(tmp_path, log)
    empty_opt = tmp_path / "opt"
    empty_opt.mkdir()
    daemon = FakeDaemon([streaming({"type": "exit", "code": 0, "signal": None})])
    path = tmp_path / "slurm_script"
    path.write_text("echo hi\n")

    try:
        ran = run_waiter(waiter, daemon, args=[str(path)], cwd=tmp_path, opt=empty_opt, during=_cancel_later,
                         env={"SLURM_JOB_ID": "42", "PATH": f"{planted}:.", "HOME": str(tmp_path)})
    finally:
        daemon.close()
    assert ran.returncode == -signal.SIGKILL and ran.requests == []
    why = (b"munge is not installed on this host (looked for /usr/bin/munge, /usr/local/bin/munge, "
           b"/opt/munge/bin/munge)")
    assert ran.stderr == MUNGE_UNUSABLE % (why, why)
    assert not log.exists(), log.read_text()


def test_a_munge_others_could_have_put_there_never_runs(waiter: list[str], tmp_path: Path) -> None:
    """A munge in a directory others may write (here /opt/munge/bin, mode 777) could be anyone's
    program, run as the job's user: the waiter waits as in an outage rather than run it, and the
    job's error file says which it found and why it passed it over, for the admin to act on."""
    log = tmp_path / "ran"
    opt = fakes(tmp_path, munge=f"#!/bin/sh\necho munge >> {log}\nprintf 'MUNGE:'\nexec cat\n")
    (opt / "munge/bin").chmod(0o777)
    path = tmp_path / "slurm_script"
    path.write_text("echo hi\n")
    daemon = FakeDaemon([streaming({"type": "exit", "code": 0, "signal": None})])

    try:
        ran = run_waiter(waiter, daemon, args=[str(path)], cwd=tmp_path, opt=opt, during=_cancel_later,
                         env={"SLURM_JOB_ID": "42", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    finally:
        daemon.close()
    assert ran.returncode == -signal.SIGKILL and ran.requests == []
    why = (b"found /opt/munge/bin/munge but it is not root-controlled: /opt/munge/bin is writable by others "
           b"than root (mode 0777)")
    assert ran.stderr == MUNGE_UNUSABLE % (why, why)
    assert not log.exists(), log.read_text()
    go_test("TestProgramsOthersCouldReplaceAreNotRun")


RECORDING_MUNGE = """#!/bin/sh
# Notes what it was given: its environment, its cwd, its arguments, its input; then answers.
tr '\\000' '\\n' < /proc/$$/environ > {record}.env
readlink /proc/$$/cwd > {record}.cwd
echo "$#" > {record}.argc
payload=$(cat)
printf '%s' "$payload" > {record}.stdin
printf 'MUNGE:%s' "$payload"
"""


def test_munge_runs_with_a_fixed_environment_in_the_root_directory(waiter: list[str], tmp_path: Path) -> None:
    opt, record = fakes(tmp_path), tmp_path / "munge"
    (opt / "munge/bin/munge").write_text(RECORDING_MUNGE.format(record=record))
    env = {"SLURM_JOB_ID": "42", "LD_PRELOAD": "/home/alice/evil.so", "PATH": f"{tmp_path}:/usr/bin:/bin",
           "LD_LIBRARY_PATH": str(tmp_path), "HOME": "/home/alice"}
    ran = attached(waiter, tmp_path, env, opt=opt)
    assert ran.returncode == 0, ran.stderr
    given = dict(line.split("=", 1) for line in Path(f"{record}.env").read_text().splitlines())
    assert given == SAFE_ENVIRONMENT
    assert Path(f"{record}.cwd").read_text() == "/\n" and Path(f"{record}.argc").read_text() == "0\n"
    (_, body), = ran.requests
    assert Path(f"{record}.stdin").read_text() == request_digest("POST", "/v1/jobs/42/attach", 42, body)


PLANTED_LIBRARY = r"""
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void planted(void) {
    char exe[4096];
    ssize_t length = readlink("/proc/self/exe", exe, sizeof exe - 1);
    FILE *log = fopen(LOG, "a");
    if (length > 0 && log != NULL) {
        exe[length] = 0;
        fprintf(log, "%s\n", exe);
    }
    if (log != NULL) fclose(log);
}
"""


def test_nothing_the_environment_names_is_loaded(waiter: list[str], tmp_path: Path) -> None:
    """LD_PRELOAD, LD_LIBRARY_PATH, PYTHON*, GCONV_PATH...: the waiter is one static program
    and loads none of it (the programs that start it here, unshare and sh, do: the plant works)."""
    gcc = shutil.which("gcc")
    assert gcc is not None, "gcc is not installed: the planted library cannot be built"
    log = tmp_path / "loaded"
    library = tmp_path / "libplanted.so"
    subprocess.run([gcc, "-shared", "-fPIC", f'-DLOG="{log}"', "-o", str(library), "-x", "c", "-"],
                   input=PLANTED_LIBRARY.encode(), check=True, timeout=60)
    # What `python3 -I -S` kept the Python waiter from importing: the cwd's and PYTHONPATH's.
    for name in ("sitecustomize.py", "json.py", "bridge/__init__.py", "bridge/waiter/main.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("raise SystemExit('planted module imported')\n")
    env = {"SLURM_JOB_ID": "42", "LD_PRELOAD": str(library), "LD_LIBRARY_PATH": str(tmp_path),
           "PYTHONPATH": str(tmp_path), "PYTHONSTARTUP": str(tmp_path / "sitecustomize.py"),
           "PYTHONHOME": str(tmp_path), "GCONV_PATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    ran = attached(waiter, tmp_path, env)
    assert (ran.returncode, ran.stdout, ran.stderr) == (0, b"", b"")
    loaded = log.read_text().splitlines()
    assert loaded, "the planted library was never loaded by anything: this test checks nothing"
    assert waiter[0] not in loaded
    # No dynamic loader, no dynamic section: nothing to preload into, no library to look up.
    program_headers = subprocess.run(["readelf", "-lW", waiter[0]], capture_output=True, check=True).stdout
    assert b"INTERP" not in program_headers and b"DYNAMIC" not in program_headers


GO_SETTINGS = {"GODEBUG": "inittrace=1", "GOTRACEBACK": "crash", "GOMAXPROCS": "1", "GOPATH": "/x",
               "SSL_CERT_FILE": "/home/alice/ca.pem", "SSL_CERT_DIR": "/home/alice/certs"}


def test_the_jobs_go_settings_steer_not_the_waiter_yet_reach_the_pods(
    waiter: list[str], tmp_path: Path,
) -> None:
    """Where no SPANK guard held them, the Go runtime of the waiter reads none of the job's GO*
    variables (GODEBUG=inittrace=1 would write a line per package to the job's stderr; GOTRACEBACK
    would put tracebacks there), nor its TLS the SSL_CERT_* ones; the pods get them all, in their
    order, as a native job keeps its GOPATH (agent/internal/earlysignals)."""
    env = {"SLURM_JOB_ID": "42", **GO_SETTINGS, "HOME": "/home/alice"}
    ran = attached(waiter, tmp_path, env)
    assert (ran.returncode, ran.stdout, ran.stderr) == (0, b"", b"")
    environment = sent(ran)["environment"]
    assert environment == {**env, "PWD": str(tmp_path), **start_limits()}
    assert isinstance(environment, dict)
    assert list(environment) == [*environ_order(fakes(tmp_path), env, tmp_path), *start_limits()]
    go_test("TestTheRuntimeReadsNoGoSettingsAndEnvironKeepsThem", package="./internal/earlysignals/")


def test_the_digest_loads_no_openssl_where_pythons_own_sha256_is_named_sha2() -> None:
    """Python 3.12 renamed `_sha256` to `_sha2`: the digest every request carries must still come
    from Python's own module, not hashlib (OpenSSL, its start-up cost, and OPENSSL_* steering)."""
    program = (
        "import sys, types\n"
        "from _sha256 import sha256\n"  # this Python's own, offered under 3.12's name only
        "sys.modules['_sha2'] = types.SimpleNamespace(sha256=sha256)\n"
        "sys.modules['_sha256'] = sys.modules['hashlib'] = sys.modules['_hashlib'] = None\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from bridge.core.waiter_protocol import request_digest\n"
        "print(request_digest('POST', '/v1/jobs/7/cancel', 7, b'{}'))\n"
    )
    result = subprocess.run([sys.executable, "-I", "-S", "-c", program], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == request_digest("POST", "/v1/jobs/7/cancel", 7, b"{}")


def test_the_digest_loads_no_openssl_on_this_python() -> None:
    program = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
               "from bridge.core.waiter_protocol import request_digest\n"
               "request_digest('POST', '/v1/jobs/7/cancel', 7, b'{}')\n"
               "print(sorted({'hashlib', '_hashlib'} & set(sys.modules)))\n")
    result = subprocess.run([sys.executable, "-I", "-S", "-c", program], capture_output=True, text=True,
                            timeout=60, check=True)
    assert result.stdout.strip() == "[]"


def test_the_script_is_sent_as_the_user_wrote_it_and_a_marker_in_it_is_inert(
    waiter: list[str], tmp_path: Path
) -> None:
    """job_submit.lua leaves the script as it is (Slurm shows it as the user wrote it): the whole
    file is the pod's script, and the line an older job_submit.lua embedded it after means nothing
    in it."""
    assert "job_desc.script = " not in (ROOT / "deploy" / "slurm" / "job_submit.lua").read_text()
    planted = f"#!/bin/sh\necho user\n{MARKER}\necho planted\n"
    ran = attached(waiter, tmp_path, {"SLURM_JOB_ID": "42"}, script=planted)
    assert ran.returncode == 0, ran.stderr
    assert sent(ran)["script"] == planted


def test_a_script_an_older_job_submit_rewrote_is_unwrapped(waiter: list[str], tmp_path: Path) -> None:
    """A job queued before the upgrade still holds the old wrapper: its user's script is what follows
    the first marker."""
    planted = f"#!/bin/sh\necho user\n{MARKER}\necho planted\n"
    old_wrapper = ("#!/bin/sh\n# slurm-k8s-bridge: rewritten batch script: this job runs in Kubernetes pods. "
                   "The waiter\n# streams their output here and exits with their exit code.\n"
                   f"exec /usr/libexec/waiter \"$0\" \"$@\"\n{MARKER}\n")
    ran = attached(waiter, tmp_path, {"SLURM_JOB_ID": "42"}, script=old_wrapper + planted)
    assert ran.returncode == 0, ran.stderr
    assert sent(ran)["script"] == planted

