"""The srun option policy of a bridged step (bridge/core/srun_options.py, step_request.py): which
options Slurm's srun gets as given, which the bridge does itself, which are refused and why; the
per-step files as the slurmd host's paths; the task's environment under --export; and the table in
docs/srun-options.md, which must name every option the policy knows."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bridge.core import srun_options
from bridge.core.config_sections import VolumeConfig
from bridge.core.srun_options import host_io_options, parse_srun_args
from bridge.core.step_request import (
    TASK_EXACT_ENV,
    absolute,
    on_host,
    task_cwd,
    task_environment,
)
from bridge.core.step_request import host_io_options as daemon_io_options

from .test_srun_steps_cannot_put_user_code_on_the_slurmd_host import (
    AGENT,
    STEP_KEY,
    Log,
    _key_file,
    _reconciler,
    _step_event,
)

VOLUMES = [("/home", "/home"), ("/scratch", "/var/lib/sandbox/scratch")]
DOC = Path(__file__).resolve().parents[2] / "docs" / "srun-options.md"


@pytest.mark.parametrize(("argv", "io", "mode"), [
    (["--output=%x-%j-%t.out", "--error=%x-%j-%t.err", "-u", "x"],
     {"output": "%x-%j-%t.out", "error": "%x-%j-%t.err"}, ""),
    (["-o", "o", "-e", "e", "-i", "in.txt", "--open-mode=append", "x"],
     {"output": "o", "error": "e", "input": "in.txt"}, "append"),
    (["--open-mode", "t", "-ofile", "x"], {"output": "file"}, "truncate"),
])
def test_per_step_file_options_are_kept_for_the_bridge(
    argv: list[str], io: dict[str, str], mode: str,
) -> None:
    args = parse_srun_args(argv)
    assert args.io == io
    assert args.open_mode == mode
    assert not any(word.startswith(("--output", "--error", "--input", "--open-mode")) for word in args.passed)


def test_chdir_export_and_multi_prog_are_the_bridges() -> None:
    args = parse_srun_args(["-D", "sub", "--export=NONE", "--multi-prog", "-n", "4", "mp.conf"])
    assert (args.chdir, args.export, args.multi_prog, args.command) == ("sub", "NONE", True, ["mp.conf"])
    assert args.passed == ["--ntasks=4"]


@pytest.mark.parametrize("option", ["prolog", "epilog", "task-prolog", "task-epilog"])
def test_a_program_on_the_slurmd_host_is_refused_with_that_reason(option: str) -> None:
    for argv in ([f"--{option}=/home/alice/p.sh", "true"], [f"--{option}", "/home/alice/p.sh", "true"]):
        with pytest.raises(ValueError) as caught:
            parse_srun_args(argv)
        assert str(caught.value) == (
            f"srun: error: option --{option} is not available in a job that runs in Kubernetes: it "
            "would run a program on the slurmd host, outside the job's pods")


def test_every_refused_option_has_its_own_reason() -> None:
    for name, reason in srun_options.REFUSED.items():
        assert reason and not reason.endswith("."), name
        assert name not in srun_options.PASSED and name not in srun_options.HONOURED


def test_a_refused_option_cannot_hide_behind_an_abbreviation_or_a_cluster() -> None:
    with pytest.raises(ValueError, match="--task-prolog"):
        parse_srun_args(["--task-pr=/x", "true"])
    with pytest.raises(ValueError, match=r"-Z|--no-allocate"):
        parse_srun_args(["-lZ", "true"])


@pytest.mark.parametrize(("path", "cwd", "want"), [
    ("x-%j.out", "/home/alice/run", "/home/alice/run/x-%j.out"),
    ("../x", "/home/alice/run", "/home/alice/x"),
    ("/home/alice/../bob/x", "/", "/home/bob/x"),
    ("a/./b", "/home/alice", "/home/alice/a/b"),
])
def test_paths_are_absolute_as_srun_makes_them(path: str, cwd: str, want: str) -> None:
    assert absolute(path, cwd) == want


@pytest.mark.parametrize(("path", "want"), [
    ("/home/alice/x", "/home/alice/x"),
    ("/home", "/home"),
    ("/scratch/run/x", "/var/lib/sandbox/scratch/run/x"),
    ("/homeless/x", None),  # a prefix of a name is not the volume
    ("/tmp/x", None),
    ("/etc/passwd", None),
])
def test_a_pod_path_is_the_slurmd_hosts_through_its_volume(path: str, want: str | None) -> None:
    assert on_host(path, VOLUMES) == want


def test_the_step_files_reach_slurms_srun_as_the_hosts_absolute_paths() -> None:
    args = parse_srun_args(["-D", "sub", "-o", "%x-%j-%t.out", "-e", "/scratch/e-%t", "-i", "none",
                            "--open-mode=append", "x"])
    options = daemon_io_options(args, "/home/alice/run", VOLUMES, "job")
    assert options == ["--output=/home/alice/run/sub/job-%j-%t.out", "--error=/var/lib/sandbox/scratch/e-%t",
                       "--input=none", "--open-mode=append"]
    assert host_io_options(options) == options  # the waiter's check takes what the daemon makes


@pytest.mark.parametrize(("name", "want"), [
    ("a%tb", "--output=/home/alice/a%%tb-%j.out"),  # the name's % is no pattern of Slurm's
    ("r/x", "--output=/home/alice/r/x-%j.out"),
])
def test_the_jobs_name_is_in_the_path_the_daemon_checks(name: str, want: str) -> None:
    """%x is filled in by the daemon, as Slurm's srun would from SLURM_JOB_NAME: a name with a
    '/..' cannot take a step's file out of the volumes (sbatch -J '../../etc/x'), from the review."""
    args = parse_srun_args(["-o", "%x-%j.out", "y"])
    assert daemon_io_options(args, "/home/alice", VOLUMES, name) == [want]
    with pytest.raises(ValueError, match="is not on a volume"):
        daemon_io_options(args, "/home/alice", VOLUMES, "../../etc/x")
    with pytest.raises(ValueError, match="needs the job's name"):
        daemon_io_options(args, "/home/alice", VOLUMES, None)
    assert daemon_io_options(parse_srun_args(["-o", "%%x.out", "y"]), "/home/alice", VOLUMES, None) == [
        "--output=/home/alice/%%x.out"]


@pytest.mark.parametrize("argv", [
    ["-o", "/tmp/x", "y"], ["-e", "../../etc/x", "y"], ["-i", "/root/secret", "y"],
])
def test_a_file_outside_the_shared_volumes_is_refused_with_the_reason(argv: list[str]) -> None:
    with pytest.raises(ValueError, match=r"is not on a volume the pods share with the slurmd host \(shared: "
                                         r"/home, /scratch\)"):
        daemon_io_options(parse_srun_args(argv), "/home/alice", VOLUMES)


@pytest.mark.parametrize("words", [
    ["--output=relative"], ["--output=/home/../etc/x"], ["--task-prolog=/x"], ["--open-mode=sideways"],
    ["--chdir=/"], "--output=/x",
])
def test_the_waiter_takes_only_absolute_file_options_from_the_daemon(words: object) -> None:
    with pytest.raises(ValueError, match=r"^srun: error: the bridge sent"):
        host_io_options(words)


def test_chdir_is_relative_to_the_scripts_directory() -> None:
    assert task_cwd(parse_srun_args(["-D", "sub", "x"]), "/home/alice") == "/home/alice/sub"
    assert task_cwd(parse_srun_args(["-D", "/data", "x"]), "/home/alice") == "/data"
    assert task_cwd(parse_srun_args(["x"]), "/home/alice") == "/home/alice"


STEP_ENV = {"PATH": "/bin", "FOO": "foo", "HOME": "/home/alice", "SLURM_JOB_ID": "7", "SLURM_PROCID": "9"}
TASK_ENV = {"SLURM_PROCID": "1", "SLURM_STEP_ID": "0"}


@pytest.mark.parametrize(("export", "want"), [
    ("", {**STEP_ENV, **TASK_ENV}),
    ("ALL", {**STEP_ENV, **TASK_ENV}),
    ("ALL,BAR=bar", {**STEP_ENV, "BAR": "bar", **TASK_ENV}),
    ("NONE", {"SLURM_JOB_ID": "7", **TASK_ENV, TASK_EXACT_ENV: "1"}),
    ("FOO,BAR=x=y", {"SLURM_JOB_ID": "7", "FOO": "foo", "BAR": "x=y", **TASK_ENV, TASK_EXACT_ENV: "1"}),
    ("MISSING", {"SLURM_JOB_ID": "7", **TASK_ENV, TASK_EXACT_ENV: "1"}),
])
def test_the_tasks_environment_follows_export(export: str, want: dict[str, str]) -> None:
    argv = [f"--export={export}", "x"] if export else ["x"]
    assert task_environment(parse_srun_args(argv), STEP_ENV, TASK_ENV) == want


@pytest.mark.parametrize(("argv", "export", "want"), [
    (["x"], "", "job.sh"), (["--export=NONE", "x"], "", "job.sh"), (["-J", "mine", "x"], "", "mine"),
])
def test_the_tasks_see_the_scripts_job_name_unless_the_step_is_named(
    argv: list[str], export: str, want: str,
) -> None:
    """The waiter names each step after its command for Slurm's srun (sacct shows `python`, as
    natively), so slurmstepd gives the task proxies that name; natively the tasks see the script's
    SLURM_JOB_NAME, or the -J the user gave."""
    slurmstepd = {**TASK_ENV, "SLURM_JOB_NAME": "mine" if "-J" in argv else "x"}
    env = task_environment(parse_srun_args(argv), {**STEP_ENV, "SLURM_JOB_NAME": "job.sh"}, slurmstepd)
    assert env["SLURM_JOB_NAME"] == want


def test_the_tables_hold_every_option_sruns_getopt_knows_each_once() -> None:
    kinds = [srun_options.PASSED, srun_options.HONOURED, srun_options.INFO, srun_options.REFUSED]
    assert sum(len(kind) for kind in kinds) == len(srun_options.GETOPT_ORDER)
    assert set().union(*kinds) == set(srun_options.GETOPT_ORDER)


def test_the_documented_table_names_every_option_the_policy_knows() -> None:
    text = DOC.read_text()
    kinds = "honoured|passed through|refused|answered"
    rows = dict(re.findall(rf"^\| `--([a-z0-9_-]+)[^|]*\| ({kinds})", text, re.M))
    known = {**{n: "passed through" for n in srun_options.PASSED},
             **{n: "answered" for n in srun_options.INFO},
             **{n: "honoured" for n in srun_options.HONOURED},
             **{n: "refused" for n in srun_options.REFUSED}}
    assert rows == known


# -- the daemon: a refused option is said by the script's srun, and no step is signed -------------
async def test_a_refused_option_is_told_to_the_scripts_srun_on_its_stderr_with_255(tmp_path: Path) -> None:
    reconciler, kube, session = _signing_reconciler(tmp_path)
    fed: list[tuple[str, list[str], bytes]] = []

    async def exec_with_input(pod: str, command: list[str], data: bytes) -> int:
        fed.append((pod, list(command), data))
        return 0

    kube.exec_with_input = exec_with_input  # type: ignore[attr-defined]
    event = _step_event(5, argv=["--task-prolog=/home/alice/p.sh", "hostname"])
    reconciler.steps.register(session, event, Log())
    await _background_done(reconciler)

    assert event == {"type": "heartbeat"}  # no token, nothing for the waiter to run
    assert "5" not in session.steps
    reason = (b"srun: error: option --task-prolog is not available in a job that runs in Kubernetes: "
              b"it would run a program on the slurmd host, outside the job's pods\n")
    assert fed == [("slurm-42-0", [AGENT, "step-output", "5"],
                    b"\x02" + len(reason).to_bytes(4, "big") + reason + b"\x00\x00\x00\x00\x03255")]
    assert kube.execs == []  # told by the relay: no step-done as well


async def test_a_refusal_the_relay_cannot_tell_still_ends_the_scripts_srun(tmp_path: Path) -> None:
    reconciler, kube, session = _signing_reconciler(tmp_path)

    async def srun_gone(pod: str, command: list[str], data: bytes) -> int:
        return 3  # agent_protocol.EXIT_SRUN_GONE

    kube.exec_with_input = srun_gone  # type: ignore[attr-defined]
    reconciler.steps.register(session, _step_event(6, argv=["--output=/etc/x", "true"]), Log())
    await _background_done(reconciler)

    assert kube.execs == [("slurm-42-0", [AGENT, "step-done", "6", "255"])]


async def test_an_allowed_step_carries_its_files_as_the_hosts_paths(tmp_path: Path) -> None:
    reconciler, _kube, session = _signing_reconciler(tmp_path)
    event = _step_event(7, argv=["-o", "%x-%t.out", "-e", "/scratch/e", "--open-mode=append", "true"],
                        cwd="/home/alice/run", env={"SLURM_JOB_NAME": "train.sh"})
    reconciler.steps.register(session, event, Log())

    assert event["token"]
    assert event["io"] == ["--output=/home/alice/run/train.sh-%t.out", "--error=/var/lib/sandbox/scratch/e",
                           "--open-mode=append"]


def _signing_reconciler(tmp_path: Path) -> tuple[Any, Any, Any]:
    """The unit suite's reconciler of job 42 (partition k8s), whose partition mounts /home and
    /scratch (from /var/lib/sandbox/scratch)."""
    reconciler, kube = _reconciler(_key_file(tmp_path, STEP_KEY))
    volumes = (VolumeConfig(name="home", host_path="/home", mount_path="/home"),
               VolumeConfig(name="scratch", host_path="/var/lib/sandbox/scratch", mount_path="/scratch"))
    partition = replace(reconciler.cfg.partitions["k8s"], volumes=volumes)
    reconciler.cfg = replace(reconciler.cfg, partitions={"k8s": partition})
    return reconciler, kube, reconciler.sessions.open(42, 0)


async def _background_done(reconciler: Any) -> None:
    for task in list(reconciler._background):
        await task


def _go_table(source: str, name: str) -> dict[str, str]:
    body = re.search(rf"var {name} = map\[string\](?:int|string)\{{(.*?)\n?\}}\n", source, re.S)
    assert body is not None, name
    return dict(re.findall(r'"([a-z0-9_-]+)":\s*("(?:[^"\\]|\\.)*"|\w+)', body.group(1)))


def test_the_waiters_table_is_the_daemons() -> None:
    """The waiter (Go) checks a step's options again before it runs Slurm's srun: the same names, in
    the same kind, taking as many values (an option one side passes and the other refuses would
    fail the step late, or let through what the daemon refused)."""
    source = (Path(__file__).resolve().parents[2] / "agent/internal/srunargs/srunargs.go").read_text()
    assert {k: int(v) for k, v in _go_table(source, "srunPassed").items()} == srun_options.PASSED
    assert {k: int(v) for k, v in _go_table(source, "srunHonoured").items()} == srun_options.HONOURED
    assert set(_go_table(source, "srunRefused")) == set(srun_options.REFUSED)
    assert {k: int(v) for k, v in _go_table(source, "srunInfo").items()} == srun_options.INFO
    refused_takes = {k: int(v) for k, v in _go_table(source, "srunRefusedTakes").items()}
    assert refused_takes == srun_options._REFUSED_TAKES
    assert {k: v.strip('"') for k, v in _go_table(source, "sameOption").items()} == srun_options.SAME_OPTION
    short = re.search(r"var srunShort = map\[byte\]string\{(.*?)\n\}", source, re.S)
    assert short is not None
    assert dict(re.findall(r"'(.)': \"([a-z-]+)\"", short.group(1))) == srun_options.SHORT
    order = re.search(r"var getoptOrder = \[\]string\{(.*?)\n\}", source, re.S)
    assert order is not None
    assert re.findall(r'"([a-z0-9_-]+)"', order.group(1)) == list(srun_options.GETOPT_ORDER)
