"""A script's `srun` in a bridged pod becomes a real Slurm step on the slurmd host, whose tasks are
the bridge's task proxies. Nothing of the user may run there: the waiter takes only layout options
and layout variables for its srun, the daemon signs each step once (HMAC of job, run and step key,
which the SPANK guard recomputes in C), and only the first pod's agent may ask for a step."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import structlog

from bridge.clients.kube.cache import PodCache
from bridge.controller import log_relay
from bridge.controller import steps as controller_steps
from bridge.controller.log_relay import output_event as _output_event
from bridge.controller.metrics import Metrics
from bridge.controller.reconcile import Reconciler
from bridge.controller.sessions import JobSession
from bridge.controller.steps import (
    MAX_OPEN_STEPS,
    MAX_STEP_REQUEST_BYTES,
    MAX_STEP_STDIN_BYTES,
    read_step_key,
    step_token,
)
from bridge.core import wellknown
from bridge.core.config import ConfigError, PartitionConfig, WaiterConfig
from bridge.core.errors import ExecOutcomeUnknown, KubeUnavailable
from bridge.core.srun_options import split_srun_args

from .builders import allocation, config
from .waiter_runs import go_constants, go_test, shared_go_test_binary

ROOT = Path(__file__).resolve().parents[2]
GUARD_SOURCE = ROOT / "deploy/slurm/spank/slurm_k8s_bridge_guard.c"
STAMP = "2025-12-01T12:00:00.000000000Z"
AGENT = f"{wellknown.AGENT_DIR}/{wellknown.AGENT_BINARY}"
IS_ROOT = os.geteuid() == 0
NOBODY = 65534


# -- 1. split_srun_args: srun's own options, as srun reads them ------------------------------------
@pytest.mark.parametrize(
    ("argv", "options", "command"),
    [
        # Slurm's srun gets each option as one word, by its long name: never the user's spelling.
        (["-n", "4", "hostname"], ["--ntasks=4"], ["hostname"]),
        (["-n4", "hostname"], ["--ntasks=4"], ["hostname"]),
        (["--ntasks=4", "hostname"], ["--ntasks=4"], ["hostname"]),
        (["--ntasks", "4", "hostname"], ["--ntasks=4"], ["hostname"]),
        (["--nodel", "a", "hostname"], ["--nodelist=a"], ["hostname"]),  # getopt_long's abbreviations
        (["-l", "hostname"], ["--label"], ["hostname"]),
        (["--label", "hostname"], ["--label"], ["hostname"]),
        (["-K", "hostname"], ["--kill-on-bad-exit"], ["hostname"]),
        (["-K1", "hostname"], ["--kill-on-bad-exit=1"], ["hostname"]),  # an optional value, attached
        (["-lK", "hostname"], ["--label", "--kill-on-bad-exit"], ["hostname"]),  # flags in a cluster
        (["-ln2", "hostname"], ["--label", "--ntasks=2"], ["hostname"]),
        (["--overlap", "hostname"], ["--overlap"], ["hostname"]),
        (["-N2", "-w", "kreal1", "hostname"], ["--nodes=2", "--nodelist=kreal1"], ["hostname"]),
        (["-l", "-n", "2", "--overlap", "python3", "-c", "print(1)"],
         ["--label", "--ntasks=2", "--overlap"], ["python3", "-c", "print(1)"]),
        (["--cpu-bind=cores", "--gpu-bind=closest", "--ntasks-per-gpu=1", "-u", "x"],
         ["--cpu-bind=cores", "--gpu-bind=closest", "--ntasks-per-gpu=1", "--unbuffered"], ["x"]),
        # The command starts at the first non-option; what follows is the command's own.
        (["-n", "2", "env", "--prolog=x", "-o", "f"], ["--ntasks=2"], ["env", "--prolog=x", "-o", "f"]),
        (["hostname", "--bcast"], [], ["hostname", "--bcast"]),
        # `--` ends srun's options; `-` alone is a command word.
        (["-l", "--", "--prolog=x"], ["--label"], ["--prolog=x"]),
        (["--", "-n", "4"], [], ["-n", "4"]),
        (["-l", "-"], ["--label"], ["-"]),
        # What Open MPI's mpirun asks for to start its daemons.
        (["--ntasks-per-node=1", "--kill-on-bad-exit", "--mpi=none", "--external-launcher", "orted"],
         ["--ntasks-per-node=1", "--kill-on-bad-exit", "--mpi=none", "--external-launcher"], ["orted"]),
        # Honoured by the bridge itself: not among the options Slurm's srun gets as given.
        (["-o", "x-%j.out", "--error=e", "-i", "in", "--open-mode=a", "-D", "/d", "--export=NONE", "id"],
         [], ["id"]),
    ],
)
def test_allowed_options_are_split_from_the_command(
    argv: list[str], options: list[str], command: list[str]
) -> None:
    assert split_srun_args(argv) == (options, command)


@pytest.mark.parametrize(
    "refused",
    [
        ["--prolog=x"], ["--task-prolog=x"], ["--task-epilog=x"], ["--epilog=x"], ["--bcast"],
        ["--bcast=/tmp/x"], ["--container=x"], ["--container-id=x"], ["--pty"], ["--het-group=0"],
        ["--x11"], ["--cpu-freq=high"], ["--gpu-freq=high"], ["--send-libs"], ["--bbf=f"], ["--jobid=7"],
        ["--task-prolog", "/home/alice/x.sh"], ["--task-pro=/home/alice/x.sh"], ["--async"],
        ["-Z"], ["--nodefile=/home/alice/nodes"], ["-F", "nodes"], ["--pack-group=1"], ["--interactive"],
        # A node list with a / is a file Slurm's srun reads, on the slurmd host here.
        ["-w", "/etc/hosts"], ["--exclude=./nodes"], ["-x./n"],
    ],
)
def test_options_that_would_run_or_place_something_on_the_host_are_refused(refused: list[str]) -> None:
    for argv in ([*refused, "hostname"], ["-n", "2", *refused, "hostname"], ["-l", *refused, "hostname"]):
        with pytest.raises(ValueError) as caught:
            split_srun_args(argv)
        message = str(caught.value)
        assert message.startswith("srun: error: option -"), argv
        assert "is not available in a job that runs in Kubernetes: " in message
        assert message.split(": ")[-1].strip(), "each refusal says why"


@pytest.mark.parametrize(("argv", "why"), [
    (["--open-mode=sideways", "x"], "Invalid --open-mode"), (["--output=", "x"], "needs a file name"),
])
def test_malformed_options_are_srun_s_errors(argv: list[str], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        split_srun_args(argv)


TRY = '\nTry "srun --help" for more information'


@pytest.mark.parametrize(("argv", "native"), [
    # Each as native srun 26.05 printed it in a batch job of the sandbox's native partition.
    (["--xyz", "x"], "srun: unrecognized option '--xyz'"),
    (["--xyz=3", "x"], "srun: unrecognized option '--xyz=3'"),
    (["--uid=0", "x"], "srun: unrecognized option '--uid=0'"),
    (["-y", "x"], "srun: invalid option -- 'y'"),
    (["-N"], "srun: option requires an argument -- 'N'"),
    (["--nodes"], "srun: option '--nodes' requires an argument"),
    (["--ntasks-per-n"], "srun: option '--ntasks-per-node' requires an argument"),
    (["--label=x", "x"], "srun: option '--label' doesn't allow an argument"),
    (["--usage=3"], "srun: option '--usage' doesn't allow an argument"),
    (["--ex=1", "x"], "srun: option '--ex=1' is ambiguous; possibilities: '--exact' '--exclude' "
                      "'--exclusive' '--export' '--external-launcher' '--extra' '--extra-node-info'"),
    (["--cpu", "x"], "srun: option '--cpu' is ambiguous; possibilities: '--cpu-bind' '--cpu-freq' "
                     "'--cpus-per-gpu' '--cpus-per-task'"),
    # glibc leaves out only the first match's own aliases.
    (["--pa", "x"], "srun: option '--pa' is ambiguous; possibilities: '--pack-group' '--parsable' "
                    "'--partition'"),
    (["--tas", "x"], "srun: option '--tas' is ambiguous; possibilities: '--task-epilog' '--task-prolog' "
                     "'--tasks-per-node'"),
])
def test_a_command_line_srun_cannot_read_gets_getopts_words_as_natively(argv: list[str], native: str) -> None:
    with pytest.raises(ValueError) as caught:
        split_srun_args(argv)
    assert str(caught.value) == native + TRY


@pytest.mark.parametrize(("argv", "passed"), [
    # An exact name wins over the longer ones it begins (getopt_long): --extra is not --extra-node-info.
    (["--extra=a", "x"], ["--extra=a"]), (["--prefer=gpu", "x"], ["--prefer=gpu"]),
    (["--accel-bind=g", "x"], ["--accel-bind=g"]), (["--test-only", "x"], ["--test-only"]),
    # Two spellings of one option are no ambiguity.
    (["--cpu-b=none", "x"], ["--cpu-bind=none"]), (["--cpu_b=none", "x"], ["--cpu_bind=none"]),
    # Optional values, as srun 26.05 takes them (a port count for MPI).
    (["--resv-ports=2", "x"], ["--resv-ports=2"]), (["--overlap=force", "x"], ["--overlap=force"]),
    (["--external-launcher=x", "x"], ["--external-launcher=x"]),
    (["-w", "kreal[1-2]", "x"], ["--nodelist=kreal[1-2]"]),
])
def test_every_option_srun_knows_is_read_as_srun_reads_it(argv: list[str], passed: list[str]) -> None:
    assert split_srun_args(argv) == (passed, ["x"])


@pytest.mark.parametrize("argv", [["--mpi=pmix", "a"], ["--mpi", "pmi2", "a"], ["--mpi=pmix_v4", "b"]])
def test_a_pmi_of_slurmstepd_is_refused_with_the_way_that_works(argv: list[str]) -> None:
    """The PMI server slurmstepd would start is on the slurmd host, out of the pods' reach."""
    with pytest.raises(ValueError, match=r"^srun: error: --mpi=\S+ is not available .* mpirun"):
        split_srun_args(argv)


@pytest.mark.parametrize("argv", [[], ["-n", "4"], ["-l", "--"], ["-N2", "-w", "kreal1", "--"]])
def test_no_command_is_srun_s_fatal_error(argv: list[str]) -> None:
    with pytest.raises(ValueError, match=r"^srun: fatal: No command given"):
        split_srun_args(argv)


# -- 2. srun_environment: the job's layout, nothing that steers srun or the loader -----------------
# The compiled waiter's (agent/internal/waiter/steps.go), run by its test program (steps_test.go).
# What the Python waiter gave srun of the batch environment, which the Go one must give too, and the
# run's SLURM_RESTART_COUNT (a requeued job's tasks see it, as natively).
SRUN_LAYOUT_VARIABLES = frozenset({
    "SLURM_JOB_ID", "SLURM_JOBID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NNODES", "SLURM_JOB_NUM_NODES",
    "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_NTASKS_PER_CORE", "SLURM_NTASKS_PER_SOCKET",
    "SLURM_CPUS_PER_TASK", "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_JOB_CPUS_PER_NODE",
    "SLURM_CPUS_ON_NODE", "SLURM_MEM_PER_CPU", "SLURM_MEM_PER_NODE", "SLURM_MEM_PER_GPU", "SLURM_GPUS",
    "SLURM_GPUS_PER_NODE", "SLURM_GPUS_PER_TASK", "SLURM_CLUSTER_NAME", "SLURM_JOB_PARTITION",
    "SLURM_JOB_NAME", "SLURM_DISTRIBUTION", "SLURM_OVERCOMMIT", "SLURM_THREADS_PER_CORE",
    "SLURM_TRES_PER_TASK", "SLURM_TRES_BIND", "SLURM_GPU_BIND", "SLURM_GPUS_PER_SOCKET",
    "SLURM_CPUS_PER_GPU", "SLURM_RESTART_COUNT",
})
SAFE_ENVIRONMENT = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}


def _steps_program() -> Path:
    """The waiter package's test program, built once for the session."""
    return shared_go_test_binary()


def srun_environment(environ: dict[str, str]) -> dict[str, str]:
    """The environment the Go waiter gives its srun, given the batch environment `environ`, in
    this process's working directory (where a relative SLURM_CONF would be read)."""
    with tempfile.TemporaryDirectory() as directory:
        out = Path(directory) / "env.json"
        subprocess.run([str(_steps_program()), "-test.run", "^TestSrunEnvironmentOf$"],
                       env={**os.environ, "WAITER_SRUN_ENVIRON": json.dumps(environ),
                            "WAITER_SRUN_ENV_OUT": str(out)},
                       check=True, capture_output=True, timeout=60)
        env = json.loads(out.read_text())
    assert isinstance(env, dict)
    return env


def test_the_go_waiter_gives_srun_the_layout_the_python_waiter_gave_and_runs_nothing_else(
    tmp_path: Path,
) -> None:
    constants = go_constants(tmp_path, "TestStepConstantsDump", "WAITER_STEP_CONSTANTS_OUT")
    assert set(constants["layout"]) == SRUN_LAYOUT_VARIABLES  # type: ignore[arg-type]
    assert constants["safe_environment"] == SAFE_ENVIRONMENT
    assert constants["srun_paths"] == ["/usr/bin/srun", "/usr/local/bin/srun", "/opt/slurm/bin/srun"]


LAYOUT = {name: f"value-of-{name}" for name in sorted(SRUN_LAYOUT_VARIABLES)}
STEERING = {
    "SLURM_PROLOG": "/home/alice/p.sh", "SLURM_TASK_PROLOG": "/home/alice/tp.sh",
    "SLURM_TASK_EPILOG": "/home/alice/te.sh", "SLURM_EPILOG": "/home/alice/e.sh",
    "SLURM_CONTAINER": "/home/alice/bundle", "SLURM_BCAST": "/tmp/x", "SLURM_MPI_TYPE": "pmix",
    "SLURM_EXPORT_ENV": "ALL", "SLURM_SPANK_x": "1", "LD_PRELOAD": "/home/alice/evil.so",
    "PYTHONPATH": "/home/alice", "SLURM_K8S_BRIDGE_HELD_X": "1", "SLURM_K8S_BRIDGE_HELD_LD_PRELOAD": "/e.so",
    "PATH": "/home/alice/bin:/usr/bin", "LC_ALL": "xx_XX", "HOME": "/home/alice", "SLURM_CONF": "",
}


def test_only_layout_variables_and_a_fixed_path_and_locale_reach_srun() -> None:
    env = srun_environment({**LAYOUT, **STEERING})

    assert env == {**LAYOUT, **SAFE_ENVIRONMENT}
    assert env["PATH"] == "/usr/sbin:/usr/bin:/sbin:/bin"
    assert env["LC_ALL"] == "C"


def test_the_jobs_gpus_per_task_reach_the_steps_srun() -> None:
    # sbatch --gpus-per-task=1 -n 2, as slurmd gives the batch step in Slurm 26.05: without these
    # the script's srun gave every task both GPUs (issue 21).
    batch = {"SLURM_JOB_ID": "42", "SLURM_TRES_PER_TASK": "gres/gpu=1",
             "SLURM_TRES_BIND": "gres/gpu:per_task:1", "SLURM_GPU_BIND": "closest"}
    env = srun_environment(batch)
    assert {k: env.get(k) for k in batch} == batch


@pytest.mark.parametrize("name", sorted(STEERING))
def test_each_steering_variable_is_dropped(name: str) -> None:
    env = srun_environment({"SLURM_JOB_ID": "42", name: STEERING[name] or "x"})

    assert env.get(name) == SAFE_ENVIRONMENT.get(name)
    assert env["SLURM_JOB_ID"] == "42"


def _root_owned_conf(tmp_path: Path, mode: int) -> Path:
    """A root-owned slurm.conf in a directory whose every parent is root's and not writable by
    others (srun_environment checks the whole path: /tmp, where tmp_path lives, is 1777)."""
    if not IS_ROOT:
        pytest.fail("a root-owned file can only be made by root: run the unit tests as root, as CI does")
    safe = Path(tempfile.mkdtemp(dir="/run"))
    safe.chmod(0o755)
    _ROOT_DIRS.append(safe)
    conf = safe / "slurm.conf"
    conf.write_text("ClusterName=sandbox\n")
    os.chown(conf, 0, 0)
    conf.chmod(mode)
    return conf


_ROOT_DIRS: list[Path] = []


@pytest.fixture(autouse=True)
def _remove_root_dirs() -> Iterator[None]:
    yield
    while _ROOT_DIRS:
        shutil.rmtree(_ROOT_DIRS.pop(), ignore_errors=True)


def test_slurm_conf_owned_by_root_and_writable_by_root_only_is_kept(tmp_path: Path) -> None:
    conf = _root_owned_conf(tmp_path, 0o644)

    assert srun_environment({"SLURM_CONF": str(conf)})["SLURM_CONF"] == str(conf)


@pytest.mark.parametrize("mode", [0o666, 0o664, 0o646, 0o660, 0o602])
def test_slurm_conf_writable_by_group_or_others_is_dropped(tmp_path: Path, mode: int) -> None:
    conf = _root_owned_conf(tmp_path, mode)

    assert "SLURM_CONF" not in srun_environment({"SLURM_CONF": str(conf)})


def test_slurm_conf_not_owned_by_root_is_dropped(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=mine\n")
    conf.chmod(0o644)
    if IS_ROOT:
        os.chown(conf, NOBODY, NOBODY)
    assert os.stat(conf).st_uid != 0

    assert "SLURM_CONF" not in srun_environment({"SLURM_CONF": str(conf)})


@pytest.mark.parametrize("value", ["/nonexistent/slurm.conf", "relative/slurm.conf", "etc/passwd", ""])
def test_a_relative_or_missing_slurm_conf_is_dropped(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir("/")  # etc/passwd names a root-owned file from here: still relative

    assert "SLURM_CONF" not in srun_environment({"SLURM_CONF": value})


def test_a_relative_slurm_conf_is_dropped_even_where_it_names_a_good_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = _root_owned_conf(tmp_path, 0o644)
    monkeypatch.chdir(tmp_path)
    assert srun_environment({"SLURM_CONF": str(conf)})["SLURM_CONF"] == str(conf)

    for value in ("slurm.conf", "./slurm.conf"):
        assert "SLURM_CONF" not in srun_environment({"SLURM_CONF": value}), value


def test_slurm_conf_reached_through_a_users_directory_is_not_kept(tmp_path: Path) -> None:
    real = _root_owned_conf(tmp_path, 0o644)
    home = tmp_path / "home"
    home.mkdir()
    link = home / "slurm.conf"
    link.symlink_to(real)
    os.lchown(link, NOBODY, NOBODY)
    os.chown(home, NOBODY, NOBODY)  # the user may swap the link, or put plugstack.conf beside it

    kept = srun_environment({"SLURM_CONF": str(link)}).get("SLURM_CONF")

    assert kept is None or os.stat(Path(kept).parent).st_uid == 0


# -- 3. step_token, and the guard's HMAC-SHA256 in C -----------------------------------------------
def test_step_token_is_the_hmac_of_job_run_and_step_key() -> None:
    key = b"0123456789abcdef-secret"

    token = step_token(key, 42, 3, "7")

    assert token == hmac.new(key, b"42:3:7", hashlib.sha256).hexdigest()
    assert re.fullmatch(r"[0-9a-f]{64}", token)
    others = {step_token(key, 42, 4, "7"), step_token(key, 42, 3, "8"), step_token(key, 43, 3, "7"),
              step_token(key + b"x", 42, 3, "7"), step_token(key, 4, 23, "7"), step_token(key, 42, 37, "")}
    assert token not in others
    assert len(others) == 6


HARNESS_MAIN = r"""
int main(int argc, char **argv)
{
	uint8_t key[1024];
	size_t key_len = 0;
	char hex[65];
	unsigned int byte;

	if (argc != 3 || strlen(argv[1]) % 2 || strlen(argv[1]) / 2 > sizeof(key))
		return 2;
	for (const char *c = argv[1]; *c; c += 2) {
		if (sscanf(c, "%2x", &byte) != 1)
			return 2;
		key[key_len++] = (uint8_t) byte;
	}
	hmac_sha256_hex(key, key_len, argv[2], hex);
	printf("%s\n", hex);
	return 0;
}
"""


def _guard_hmac_source() -> str:
    text = GUARD_SOURCE.read_text()
    start = text.index("/* --- HMAC-SHA256")
    end = text.index("/* The step token the daemon gave", start)
    return ("#include <stddef.h>\n#include <stdint.h>\n#include <stdio.h>\n#include <string.h>\n\n"
            + text[start:end] + HARNESS_MAIN)


@pytest.fixture(scope="module")
def guard_hmac(tmp_path_factory: pytest.TempPathFactory) -> Any:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.fail("gcc is not installed: the step guard's HMAC cannot be built")
    work = tmp_path_factory.mktemp("guard-hmac")
    (work / "hmac.c").write_text(_guard_hmac_source())
    built = subprocess.run([gcc, "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-o", str(work / "hmac"),
                            str(work / "hmac.c")], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr

    def run(key: bytes, message: str) -> str:
        done = subprocess.run([str(work / "hmac"), key.hex(), message], capture_output=True, text=True,
                              check=True)
        return done.stdout.strip()

    return run


KEYS = [bytes(range(16)), b"k" * 63, bytes(range(64)), bytes(range(65)),
        bytes((7 * i + 3) % 256 for i in range(200)), bytes(255 - i for i in range(256))]
MESSAGES = ["42:0:1", "4294967295:4294967295:9223372036854775807", "", "a" * 55, "b" * 56, "c" * 63,
            "d" * 64, "e" * 119, "f" * 120, "1:2:" + "3" * 200]


@pytest.mark.parametrize("key", KEYS, ids=lambda key: f"{len(key)}-byte-key")
def test_the_guards_hmac_equals_pythons(guard_hmac: Any, key: bytes) -> None:
    for message in MESSAGES:
        want = hmac.new(key, message.encode(), hashlib.sha256).hexdigest()
        assert guard_hmac(key, message) == want, message


@pytest.mark.parametrize("key", KEYS, ids=lambda key: f"{len(key)}-byte-key")
def test_the_guard_accepts_the_token_the_daemon_gives(guard_hmac: Any, key: bytes) -> None:
    for job_id, run, step in ((42, 0, "1"), (7, 3, "12"), (4294967295, 12, "1234567890123456789")):
        message = f"{job_id}:{run}:{step}"  # step_token_is_valid's "%u:%u:%s"
        assert guard_hmac(key, message) == step_token(key, job_id, run, step)


def test_the_harness_is_the_guards_code_and_can_tell_keys_apart(guard_hmac: Any) -> None:
    assert "static void hmac_sha256_hex(" in _guard_hmac_source()
    assert guard_hmac(KEYS[0], "42:0:1") != guard_hmac(KEYS[1], "42:0:1")
    assert guard_hmac(KEYS[0], "42:0:1") != guard_hmac(KEYS[0], "42:0:2")
    # RFC 4231 test case 2
    assert guard_hmac(b"Jefe", "what do ya want for nothing?") == (
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")


def test_every_key_the_daemon_takes_signs_tokens_the_guard_accepts(guard_hmac: Any, tmp_path: Path) -> None:
    buffer = int(re.search(r"uint8_t key\[(\d+)\];", GUARD_SOURCE.read_text()).group(1))  # type: ignore[union-attr]
    path = tmp_path / "step.key"
    path.write_bytes(bytes((5 * i + 1) % 200 + 32 for i in range(buffer + 44)) + b"\n")
    path.chmod(0o600)
    try:
        key = read_step_key(path)
    except ConfigError:
        return  # refusing a key the guard cannot read whole is right too
    assert key is not None
    guard_key = path.read_bytes()[:buffer].rstrip(b"\r\n")  # what step_token_is_valid hashes

    assert guard_hmac(guard_key, "42:0:1") == step_token(key, 42, 0, "1")


# -- 4. read_step_key ---------------------------------------------------------------------------
def _key_file(tmp_path: Path, data: bytes, mode: int = 0o600) -> Path:
    path = tmp_path / "step.key"
    path.write_bytes(data)
    path.chmod(mode)
    return path


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o606, 0o700 | 0o004])
def test_a_step_key_others_may_read_or_write_is_refused(tmp_path: Path, mode: int) -> None:
    path = _key_file(tmp_path, b"s" * 32 + b"\n", mode)

    with pytest.raises(ConfigError, match=f"chmod 600 {re.escape(str(path))}"):
        read_step_key(path)


@pytest.mark.parametrize("data", [b"", b"\n", b"s" * 15, b"s" * 15 + b"\n", b"s" * 14 + b"\r\n\r\n"])
def test_a_step_key_shorter_than_16_bytes_is_refused(tmp_path: Path, data: bytes) -> None:
    with pytest.raises(ConfigError, match="must hold 16 to 256 bytes"):
        read_step_key(_key_file(tmp_path, data))


def test_a_missing_step_key_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        read_step_key(tmp_path / "absent.key")


@pytest.mark.parametrize(
    ("data", "key"),
    [(b"s" * 32 + b"\n", b"s" * 32), (b"s" * 16, b"s" * 16), (b"0123456789abcdef\r\n", b"0123456789abcdef"),
     (b"a\nb" + b"c" * 20 + b"\n\n", b"a\nb" + b"c" * 20)],
)
def test_a_private_step_key_is_read_without_its_newline(tmp_path: Path, data: bytes, key: bytes) -> None:
    assert read_step_key(_key_file(tmp_path, data)) == key


def test_no_step_key_file_means_no_key() -> None:
    assert read_step_key(None) is None


# -- 5. controller.steps: Steps.register --------------------------------------------------------
class FakeKube:
    def __init__(self) -> None:
        self.execs: list[tuple[str, list[str]]] = []

    async def exec_in_pod(self, pod: str, command: list[str]) -> int:
        self.execs.append((pod, list(command)))
        return 0

    async def get_node(self, name: str) -> None:
        return None


class FakeSlurm:
    async def job(self, job_id: int) -> None:
        return None


class Log:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict[str, Any]]] = []

    def info(self, event: str, **fields: Any) -> None:
        self.events.append(("info", event, fields))

    def warning(self, event: str, **fields: Any) -> None:
        self.events.append(("warning", event, fields))


STEP_KEY = b"the-step-key-of-this-cluster\n"


def _reconciler(key_file: Path | None) -> tuple[Reconciler, FakeKube]:
    cfg = replace(config(partitions={"k8s": PartitionConfig(default_image="img:1")}),
                  waiter=WaiterConfig(step_key_file=key_file))
    cache = PodCache()
    kube = FakeKube()
    reconciler = Reconciler(cfg, FakeSlurm(), kube, cache, Metrics(), lambda _job: None)  # type: ignore[arg-type]
    reconciler.jobs.record(replace(allocation(), read_at=time.monotonic()))
    for index in (0, 1):
        cache.apply("ADDED", {
            "metadata": {"name": f"slurm-42-{index}", "labels": {wellknown.LABEL_JOB_ID: "42"},
                         "annotations": {wellknown.ANNOTATION_NODE_INDEX: str(index)}},
            "spec": {}, "status": {"phase": "Running"},
        })
    return reconciler, kube


@pytest.fixture
def signing(tmp_path: Path) -> tuple[Reconciler, FakeKube, JobSession]:
    reconciler, kube = _reconciler(_key_file(tmp_path, STEP_KEY))
    return reconciler, kube, reconciler.sessions.open(42, 0)


def _data(request: Any) -> str:
    return base64.b64encode(json.dumps(request).encode()).decode()


def _step_event(key: int = 1, **request: Any) -> dict[str, Any]:
    body = {"key": key, "argv": ["-n", "2", "hostname"], "cwd": "/x", "env": {"A": "1"}, **request}
    return {"type": "step", "pod": 0, "ts": STAMP, "data": _data(body)}


async def _settle(reconciler: Reconciler) -> None:
    for _ in range(5):
        await asyncio.sleep(0)
    assert not reconciler._background


async def test_a_valid_step_is_signed_and_kept(signing: Any) -> None:
    reconciler, kube, session = signing
    event = _step_event(5, argv=["-l", "python3", "train.py"], env={"OMP_NUM_THREADS": "4", "N": 3})

    reconciler.steps.register(session, event, Log())

    assert event["type"] == "step"
    assert event["token"] == step_token(STEP_KEY.rstrip(b"\n"), 42, 0, "5")
    assert event["token"] == hmac.new(STEP_KEY.rstrip(b"\n"), b"42:0:5", hashlib.sha256).hexdigest()
    assert session.steps.open_requests() == {"5": {"argv": ["-l", "python3", "train.py"], "cwd": "/x",
                                   "env": {"OMP_NUM_THREADS": "4", "N": "3"}}}
    assert session.steps.answered() == {"5"}
    await _settle(reconciler)
    assert kube.execs == []


async def test_the_token_is_for_the_sessions_run(tmp_path: Path) -> None:
    reconciler, _kube = _reconciler(_key_file(tmp_path, STEP_KEY))
    session = reconciler.sessions.open(42, 2)
    event = _step_event(1)

    reconciler.steps.register(session, event, Log())

    assert event["token"] == step_token(STEP_KEY.rstrip(b"\n"), 42, 2, "1")
    assert event["token"] != step_token(STEP_KEY.rstrip(b"\n"), 42, 0, "1")


async def test_a_step_key_is_never_signed_twice(signing: Any) -> None:
    reconciler, _kube, session = signing
    first = _step_event(1)
    reconciler.steps.register(session, first, Log())
    assert "token" in first

    for again in (_step_event(1), _step_event(1, argv=["--overlap", "sh"]), _step_event("1")):
        reconciler.steps.register(session, again, Log())
        assert again["type"] == "heartbeat"
        assert "token" not in again
    assert session.steps.open_requests()["1"]["argv"] == ["-n", "2", "hostname"]

    await reconciler.finish_step(42, "1", 0)  # once it is done, its key is still spent
    replay = _step_event(1)
    reconciler.steps.register(session, replay, Log())
    assert replay["type"] == "heartbeat"
    assert "token" not in replay
    assert "1" not in session.steps


async def test_without_a_step_key_every_step_is_refused_and_ended(tmp_path: Path) -> None:
    reconciler, kube = _reconciler(None)
    session = reconciler.sessions.open(42, 0)
    event = _step_event(3)

    reconciler.steps.register(session, event, Log())

    assert event["type"] == "message"
    assert event["text"].startswith("srun: error:")
    assert "step_key_file" in event["text"]
    assert "token" not in event
    assert session.steps.open_requests() == {}
    assert session.steps.answered() == {"3"}  # answered once: a replay is not answered again
    await _settle(reconciler)
    assert kube.execs == [("slurm-42-0", [AGENT, "step-done", "3", "1"])]


@pytest.mark.parametrize("failure", [KubeUnavailable("cannot exec in pod slurm-42-0: 500"),
                                     ExecOutcomeUnknown("exec in pod slurm-42-0 did not answer")])
async def test_a_refused_step_whose_end_could_not_be_told_at_first_is_told_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: Exception
) -> None:
    """Else the script's srun waits for ever for a step that never ran (the agent's step-done
    renames a file into place: telling it twice is harmless)."""
    monkeypatch.setattr(asyncio, "sleep", _no_wait)
    reconciler, kube = _reconciler(None)
    told = kube.exec_in_pod
    failures = [failure]

    async def flaky(pod: str, command: list[str]) -> int:
        if failures:
            raise failures.pop()
        return await told(pod, command)

    kube.exec_in_pod = flaky  # type: ignore[method-assign]
    reconciler.steps.register(reconciler.sessions.open(42, 0), _step_event(3), Log())
    for task in list(reconciler._background):
        await task

    assert kube.execs == [("slurm-42-0", [AGENT, "step-done", "3", "1"])]


_real_sleep = asyncio.sleep


async def _no_wait(_delay: float) -> None:
    await _real_sleep(0)


async def test_more_than_the_open_steps_allowed_are_refused(signing: Any) -> None:
    reconciler, kube, session = signing
    for key in range(MAX_OPEN_STEPS):
        event = _step_event(key)
        reconciler.steps.register(session, event, Log())
        assert "token" in event, key
    assert len(session.steps) == MAX_OPEN_STEPS

    extra = _step_event(MAX_OPEN_STEPS)
    reconciler.steps.register(session, extra, Log())

    assert extra["type"] == "message"
    assert extra["text"].startswith("srun: error:")
    assert str(MAX_OPEN_STEPS) in extra["text"]
    assert "token" not in extra
    assert str(MAX_OPEN_STEPS) not in session.steps
    await _settle(reconciler)
    assert kube.execs == [("slurm-42-0", [AGENT, "step-done", str(MAX_OPEN_STEPS), "1"])]

    await reconciler.finish_step(42, "0", 0)  # one ends: there is room again
    room = _step_event(MAX_OPEN_STEPS + 1)
    reconciler.steps.register(session, room, Log())
    assert "token" in room


def _event_of_size(size: int, key: int = 1) -> dict[str, Any]:
    """A step event whose data is exactly `size` base64 characters (size a multiple of 4)."""
    raw_size = size // 4 * 3
    body = {"key": key, "argv": ["hostname"], "cwd": "/x", "env": {"FILL": ""}}
    body["env"]["FILL"] = "x" * (raw_size - len(json.dumps(body)))
    event = {"type": "step", "pod": 0, "ts": STAMP, "data": _data(body)}
    assert len(event["data"]) == size
    return event


async def test_a_step_request_larger_than_allowed_is_refused(signing: Any) -> None:
    reconciler, kube, session = signing
    fits = _event_of_size(MAX_STEP_REQUEST_BYTES, key=1)
    reconciler.steps.register(session, fits, Log())
    assert "token" in fits

    too_big = _event_of_size(MAX_STEP_REQUEST_BYTES + 4, key=2)
    reconciler.steps.register(session, too_big, Log())

    assert too_big["type"] == "message"
    assert too_big["text"].startswith("srun: error:")
    assert "KiB" in too_big["text"]
    assert "token" not in too_big
    assert set(session.steps.open_requests()) == {"1"}
    await _settle(reconciler)
    assert kube.execs == [("slurm-42-0", [AGENT, "step-done", "2", "1"])]


def _step_with_stdin(key: int, stdin: bytes, env_fill: int = 0) -> dict[str, Any]:
    body = {"key": key, "argv": ["cat"], "cwd": "/x", "env": {"FILL": "x" * env_fill},
            "stdin": base64.b64encode(stdin).decode()}
    return {"type": "step", "pod": 0, "ts": STAMP, "data": _data(body)}


async def test_what_the_scripts_srun_read_of_its_stdin_counts_apart_and_up_to_its_own_limit(
        signing: Any) -> None:
    """`echo x | srun cat`: srun's stdin goes to the waiter, for Slurm's srun, which forwards it to
    the tasks as natively; it is bounded on its own, not with the environment the pod's exec takes."""
    reconciler, kube, session = signing
    fits = _step_with_stdin(1, b"\xff" * MAX_STEP_STDIN_BYTES, env_fill=MAX_STEP_REQUEST_BYTES // 2)
    reconciler.steps.register(session, fits, Log())
    assert "token" in fits
    assert "stdin" not in session.steps.open_requests()["1"]  # never in a task's exec

    too_big = _step_with_stdin(2, b"x" * (MAX_STEP_STDIN_BYTES + 1))
    reconciler.steps.register(session, too_big, Log())
    assert too_big["type"] == "message"
    assert too_big["text"] == f"srun: error: the step's stdin exceeds {MAX_STEP_STDIN_BYTES // 1024} KiB"
    assert "token" not in too_big
    await _settle(reconciler)
    assert kube.execs == [("slurm-42-0", [AGENT, "step-done", "2", "1"])]


@pytest.mark.parametrize(
    "data",
    [
        "not base64 json",
        "%%%%",
        base64.b64encode(b"not json").decode(),
        base64.b64encode(b"\xff\xfe").decode(),
        _data([1, 2]),
        _data("step"),
        _data(7),
        _data({"argv": ["hostname"]}),
        _data({"key": 1}),
        _data({"key": "one", "argv": ["hostname"]}),
        _data({"key": None, "argv": ["hostname"]}),
        _data({"key": 1, "argv": 5}),
        _data({"key": 1, "argv": ["cat"], "stdin": ["x" * 1000]}),  # only base64 text is counted right
    ],
)
async def test_a_malformed_step_request_becomes_a_heartbeat(signing: Any, data: str) -> None:
    reconciler, kube, session = signing
    event = {"type": "step", "pod": 0, "ts": STAMP, "data": data}

    reconciler.steps.register(session, event, Log())

    assert event == {"type": "heartbeat"}
    assert session.steps.open_requests() == {}
    assert session.steps.answered() == set()
    await _settle(reconciler)
    assert kube.execs == []


@pytest.mark.parametrize("env", [["A=1"], "A=1", 5])
async def test_a_step_request_whose_env_is_not_a_mapping_becomes_a_heartbeat(signing: Any, env: Any) -> None:
    reconciler, _kube, session = signing
    event = _step_event(1, env=env)

    reconciler.steps.register(session, event, Log())

    assert event == {"type": "heartbeat"}
    assert session.steps.open_requests() == {}


# -- 6. _output_event: only the first pod's agent asks for steps ----------------------------------
def test_a_step_line_of_the_first_pod_is_a_step_request() -> None:
    data = _data({"key": 1, "argv": ["hostname"]})

    assert _output_event(0, STAMP, f"s {data}") == {"type": "step", "pod": 0, "ts": STAMP, "data": data}


@pytest.mark.parametrize("index", [1, 2, 7])
def test_a_step_line_of_another_pod_is_only_stderr_output(index: int) -> None:
    line = f"s {_data({'key': 1, 'argv': ['hostname']})}"

    event = _output_event(index, STAMP, line)

    assert event["type"] == "out"
    assert event["fd"] == 2
    assert event["pod"] == index
    assert base64.b64decode(event["data"]) == (line + "\n").encode()


def test_a_bare_s_is_not_a_step_request() -> None:
    event = _output_event(0, STAMP, "s")

    assert event["type"] == "out"
    assert event["fd"] == 2


# -- the waiter's srun for a step (without running Slurm) ----------------------------------------
# The compiled waiter's scriptSteps (agent/internal/waiter/steps_test.go): a fake Slurm srun notes
# how it was started; no daemon takes its output; each end told by step-done is noted.


def test_the_waiters_srun_runs_the_task_proxy_with_the_layout_only() -> None:
    go_test("TestTheWaitersSrunRunsTheTaskProxyWithTheLayoutOnly")


@pytest.mark.parametrize(("argv", "code"), [
    (["--task-prolog=/home/alice/x", "id"], 255), (["--container=x", "id"], 255), ([], 1),
])
def test_the_waiter_runs_no_srun_for_a_refused_step(argv: list[str], code: int) -> None:
    go_test("TestTheWaiterRunsNoSrunForARefusedStep",
            {"WAITER_STEP_ARGV": json.dumps(argv), "WAITER_STEP_CODE": str(code)})


def test_the_waiter_runs_no_srun_for_an_unsigned_step() -> None:
    go_test("TestTheWaiterRunsNoSrunForAnUnsignedStep")


def test_a_step_whose_srun_cannot_start_still_ends() -> None:
    go_test("TestAStepWhoseSrunCannotStartStillEnds")


# -- signals to the script's srun -----------------------------------------------------------------
def _signal_event(key: str, signum: int) -> dict[str, Any]:
    data = base64.b64encode(json.dumps({"key": key, "signal": signum}).encode()).decode()
    return log_relay.output_event(0, "2026-12-01T00:00:00Z", f"k {data}")


def test_a_signal_of_the_scripts_srun_reaches_the_waiter_for_an_open_step_only() -> None:
    session = JobSession(42)
    session.steps.answer("3", {"argv": ["sleep", "9"], "env": {}, "cwd": "/"})
    bound = structlog.get_logger().bind(job_id=42)
    good, unknown_step, not_for_srun = _signal_event("3", 15), _signal_event("4", 15), _signal_event("3", 9)
    for event in (good, unknown_step, not_for_srun):
        assert event["type"] == "step-signal"
        controller_steps.check_step_signal(session, event, bound)

    assert (good["type"], good["key"], good["signal"]) == ("step-signal", "3", 15)
    assert unknown_step["type"] == not_for_srun["type"] == "heartbeat"


def test_only_the_first_pod_asks_for_step_signals() -> None:
    data = base64.b64encode(b'{"key": "3", "signal": 15}').decode()
    assert log_relay.output_event(1, "2026-12-01T00:00:00Z", f"k {data}")["type"] == "out"


def test_the_daemon_and_the_waiter_agree_on_the_signals_for_srun(tmp_path: Path) -> None:
    constants = go_constants(tmp_path, "TestStepConstantsDump", "WAITER_STEP_CONSTANTS_OUT")
    assert set(constants["step_signals"]) == controller_steps.SIGNALS_FOR_SRUN  # type: ignore[arg-type]


def test_the_waiter_passes_a_step_signal_to_its_srun_and_nothing_else() -> None:
    go_test("TestTheWaiterPassesAStepSignalToItsSrunAndNothingElse")


# -- a task proxy ends as its task did ---------------------------------------------------------------
@pytest.mark.parametrize(("code", "returncode"),
                         [(0, 0), (3, 3), (143, -15), (137, -9), (138, -10), (255, 255), (147, 147)])
def test_a_task_proxy_ends_by_the_signal_that_ended_its_task(code: int, returncode: int) -> None:
    """--kill-on-bad-exit, scancel of a step: natively the other tasks die by a signal, and the
    step's exit code comes from the tasks that exited; the proxy must die the same way."""
    proc = subprocess.run([str(_steps_program()), "-test.run", "^TestEndAsTheTask$"],
                          env={**os.environ, "WAITER_TASK_CODE": str(code)}, timeout=30, check=False)
    assert proc.returncode == returncode


def test_a_task_that_claims_a_segfault_leaves_no_core_on_the_slurmd_host(tmp_path: Path) -> None:
    """The exit code is the user's to pick: 139 ends the proxy by SIGSEGV, without a core."""
    env = {**os.environ, "WAITER_TASK_CODE": "139", "WAITER_CORE_UNLIMITED": "1"}
    proc = subprocess.run([str(_steps_program()), "-test.run", "^TestEndAsTheTask$"], cwd=tmp_path, env=env,
                          timeout=30, check=False)
    assert proc.returncode == -11
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("core")]


@pytest.mark.parametrize(("waiter_run", "told"), [
    (0, [("slurm-42-0", [AGENT, "step-done", "4", "1"])]),
    # A first run's waiter inherits SLURM_RESTART_COUNT from where sbatch ran: one beyond the
    # job's run is that, and the step is the first run's.
    (3, [("slurm-42-0", [AGENT, "step-done", "4", "1"])]),
    (-1, []),
    (None, []),
])
async def test_a_step_this_daemon_never_saw_ends_in_the_run_its_waiter_names(
        tmp_path: Path, waiter_run: int | None, told: list[tuple[str, list[str]]]) -> None:
    """The daemon was started again while the step ran: no run here answered key 4."""
    reconciler, kube = _reconciler(_key_file(tmp_path, STEP_KEY))
    await reconciler.finish_step(42, "4", 1, waiter_run)
    assert kube.execs == told
