"""The srun option policy of a bridged step (bridge/core/srun_options.py, step_request.py): which
options Slurm's srun gets as given, which the bridge does itself, which are refused and why; the
per-step files as the slurmd host's paths; the task's environment under --export; and the table in
docs/srun-options.md, which must name every option the policy knows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bridge.core import srun_options
from bridge.core.srun_options import host_io_options, parse_srun_args
from bridge.core.step_request import (
    TASK_EXACT_ENV,
    absolute,
    on_host,
    task_cwd,
    task_environment,
)
from bridge.core.step_request import host_io_options as daemon_io_options

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
    options = daemon_io_options(args, "/home/alice/run", VOLUMES)
    assert options == ["--output=/home/alice/run/sub/%x-%j-%t.out", "--error=/var/lib/sandbox/scratch/e-%t",
                       "--input=none", "--open-mode=append"]
    assert host_io_options(options) == options  # the waiter's check takes what the daemon makes


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


def test_the_documented_table_names_every_option_the_policy_knows() -> None:
    text = DOC.read_text()
    rows = dict(re.findall(r"^\| `--([a-z0-9-]+)[^|]*\| (honoured|passed through|refused)", text, re.M))
    known = {**{n: "passed through" for n in srun_options.PASSED},
             **{n: "honoured" for n in srun_options.HONOURED},
             **{n: "refused" for n in srun_options.REFUSED}}
    assert rows == known
