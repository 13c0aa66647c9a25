"""waiter.attach_command runs as the job's user, in the user's environment and directory: the config
refuses any form whose program or script the user's PATH, cwd or PYTHON* variables could pick, and
doctor refuses files that anyone but root may replace."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.core.attach_command import DEFAULT_ATTACH_COMMAND, attach_command_files
from bridge.core.config import ConfigError, parse_config
from bridge.manager import cli
from bridge.manager.doctor import CheckFailed, Doctor, waiter_install_problems

MINIMAL = 'cluster = "c1"\n[slurm]\nurl = "http://127.0.0.1:6820"\n[partitions.k8s]\n'


def _with_attach(command: str) -> str:
    return MINIMAL + f"[waiter]\nattach_command = '{command}'\n"


def test_the_default_starts_the_installed_waiter_file_in_isolated_mode() -> None:
    assert DEFAULT_ATTACH_COMMAND == "/usr/bin/python3 -I -S /usr/libexec/slurm-k8s-bridge/waiter.py"
    assert parse_config(MINIMAL).waiter.attach_command == DEFAULT_ATTACH_COMMAND


def test_job_submit_conf_writes_the_default_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "bridge.toml"
    config.write_text(MINIMAL)

    assert cli.main(["job-submit-conf", "-c", str(config)]) == 0

    assert f"attach_command={DEFAULT_ATTACH_COMMAND} --api http://127.0.0.1:8470" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("command", "message"),
    [
        ("slurm-k8s-bridge attach", "does not start with an absolute path"),
        ("python3 -I -S /usr/libexec/w.py", "does not start with an absolute path"),
        ("./waiter.py", "does not start with an absolute path"),
        ("/usr/bin/env python3 -I -S /usr/libexec/w.py", "starts env, which runs another program"),
        ("/bin/env -i /usr/bin/python3 -I /w.py", "starts env"),
        ("/bin/sh -c /usr/libexec/w.py", "starts sh"),
        ("/usr/bin/nice -n 5 python3 -I /w.py", "starts nice"),
        ("/usr/bin/python3 -S /usr/libexec/w.py", "runs Python without -I"),
        ("/usr/bin/python3 /usr/libexec/w.py -I", "runs Python without -I"),  # a script argument
        ("/usr/bin/python3.11 -E -s /usr/libexec/w.py", "runs Python without -I"),
        ("/opt/venv/bin/python -X importtime /w.py", "runs Python without -I"),
        ("/usr/bin/python3 -I -S waiter.py", "the script 'waiter.py' is not an absolute path"),
        ("/usr/bin/python3 -I -S $HOME/waiter.py", "holds '\\$', which the batch script's shell"),
        ("/usr/bin/python3 -I -S /w.py; id", "holds ';'"),
        ("/usr/libexec/w*.py", r"holds '\*'"),
        ('/usr/bin/python3 -I "/w.py', "not a valid command line"),
    ],
)
def test_a_command_the_user_could_redirect_is_refused_naming_the_key(command: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        parse_config(_with_attach(command), source="bridge.toml")
    assert str(info.value).startswith("bridge.toml: waiter.attach_command: ")


@pytest.mark.parametrize(
    "command",
    [
        "/usr/bin/python3 -I -S /usr/libexec/slurm-k8s-bridge/waiter.py",
        "/usr/bin/python3 -IS /usr/libexec/slurm-k8s-bridge/waiter.py",
        "/usr/bin/python3.11 -X importtime -I /usr/libexec/w.py",
        "/usr/bin/python3 -W ignore -I -S /usr/libexec/w.py",
        "/usr/bin/python3 -I -m bridge.waiter.attach",  # -I: the module is not looked up in the cwd
        "/opt/slurm-k8s-bridge/bin/slurm-k8s-bridge attach",
    ],
)
def test_absolute_isolated_commands_are_accepted(command: str) -> None:
    assert parse_config(_with_attach(command)).waiter.attach_command == command


def test_the_files_a_command_runs_are_its_program_and_its_python_script() -> None:
    assert attach_command_files(DEFAULT_ATTACH_COMMAND) == [
        "/usr/bin/python3", "/usr/libexec/slurm-k8s-bridge/waiter.py"
    ]
    assert attach_command_files("/usr/bin/python3 -X dev -I /w.py --api x") == ["/usr/bin/python3", "/w.py"]
    assert attach_command_files("/opt/b/bin/slurm-k8s-bridge attach") == ["/opt/b/bin/slurm-k8s-bridge"]


@pytest.fixture
def installed(tmp_path: Path) -> tuple[str, Path]:
    libexec = tmp_path / "libexec"
    libexec.mkdir(mode=0o755)
    libexec.chmod(0o755)
    script = libexec / "waiter.py"
    script.write_text("# the waiter\n")
    script.chmod(0o644)
    python = Path("/usr/bin/python3").resolve()
    return f"{python} -I -S {script}", script


def test_doctor_accepts_a_waiter_only_its_owner_can_write(installed: tuple[str, Path]) -> None:
    command, script = installed
    owner = script.stat().st_uid
    # Owned by root on a real install; here by whoever runs the tests (trusted for this check).
    assert waiter_install_problems(command, frozenset({0, owner})) == []


def test_doctor_refuses_a_waiter_others_may_replace(installed: tuple[str, Path]) -> None:
    command, script = installed
    owner = frozenset({0, script.stat().st_uid})
    script.chmod(0o664)
    assert waiter_install_problems(command, owner) == [f"{script} is writable by group or others (mode 664)"]
    script.chmod(0o644)
    script.parent.chmod(0o777)
    assert waiter_install_problems(command, owner) == [
        f"{script.parent} is writable by group or others (mode 777)"
    ]


def test_doctor_refuses_a_waiter_of_another_owner(installed: tuple[str, Path]) -> None:
    command, script = installed
    problems = waiter_install_problems(command, frozenset({987654}))
    assert f"{script} is owned by uid {script.stat().st_uid}, not root" in problems


async def test_doctor_names_a_waiter_missing_here_without_failing(
    installed: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # doctor also runs where no slurmd does (the daemon's image, another host): a note, no failure.
    command, script = installed
    script.unlink()
    monkeypatch.delenv("POD_NAME", raising=False)
    cfg = parse_config(_with_attach(command))

    assert waiter_install_problems(command) == []
    assert await Doctor(cfg, None).check_waiter() == (
        f"{script} not on this host: install it on every host of a bridged slurmd (root-owned, "
        "mode 644) and run doctor there"
    )


async def test_doctor_fails_the_waiter_check_for_a_replaceable_file(
    installed: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    command, script = installed
    script.chmod(0o666)
    monkeypatch.delenv("POD_NAME", raising=False)

    with pytest.raises(CheckFailed, match="is writable by group or others"):
        await Doctor(parse_config(_with_attach(command)), None).check_waiter()
