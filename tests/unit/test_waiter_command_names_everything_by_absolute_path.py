"""waiter.attach_command runs as the job's user, in the user's environment and directory: the config
refuses any form whose program the user's PATH or cwd could pick, and any Python waiter (there is
none any more); doctor refuses a program that anyone but root may replace, or that is not static."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from bridge.core.attach_command import DEFAULT_ATTACH_COMMAND, attach_command_files
from bridge.core.config import ConfigError, parse_config
from bridge.manager import cli
from bridge.manager.doctor import CheckFailed, Doctor
from bridge.manager.doctor_waiter import ca_file_problems, waiter_install_problems

MINIMAL = 'cluster = "c1"\n[slurm]\nurl = "http://127.0.0.1:6820"\n[partitions.k8s]\n'


def _with_attach(command: str) -> str:
    return MINIMAL + f"[waiter]\nattach_command = '{command}'\n"


def test_the_default_starts_the_installed_compiled_waiter() -> None:
    assert DEFAULT_ATTACH_COMMAND == "/usr/libexec/slurm-k8s-bridge/waiter"
    assert parse_config(MINIMAL).waiter.attach_command == DEFAULT_ATTACH_COMMAND


def test_job_submit_conf_writes_the_default_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "bridge.toml"
    config.write_text(MINIMAL)

    assert cli.main(["job-submit-conf", "-c", str(config)]) == 0

    assert f"attach_command={DEFAULT_ATTACH_COMMAND} --api http://127.0.0.1:8470" in capsys.readouterr().out


PYTHON_GONE = "starts a Python waiter, which no longer exists: the waiter is the compiled "


@pytest.mark.parametrize(
    ("command", "message"),
    [
        ("slurm-k8s-bridge attach", "does not start with an absolute path"),
        ("waiter --api http://d:1", "does not start with an absolute path"),
        ("./waiter", "does not start with an absolute path"),
        ("/usr/bin/env waiter", "starts env, which runs another program"),
        ("/bin/env -i /usr/libexec/w", "starts env"),
        ("/bin/sh -c /usr/libexec/w", "starts sh"),
        ("/usr/bin/nice -n 5 waiter", "starts nice"),
        ("/usr/libexec/w $HOME", "holds '\\$', which the batch script's shell"),
        ("/usr/libexec/w; id", "holds ';'"),
        ("/usr/libexec/w*", r"holds '\*'"),
        ('/usr/libexec/w "--api', "not a valid command line"),
        # The Python waiter, however isolated, is gone: a clear word beats a job that fails at its start.
        ("/usr/bin/python3 -I -S /usr/libexec/slurm-k8s-bridge/waiter.py",
         PYTHON_GONE + r"/usr/libexec/slurm-k8s-bridge/waiter \(install it with "
         r"deploy/slurm/install-waiter\.sh /usr/libexec/slurm-k8s-bridge/waiter\)"),
        ("/usr/bin/python3.11 -I -m bridge.waiter.attach", PYTHON_GONE),
        ("/opt/venv/bin/pypy3 /w.py", PYTHON_GONE),
        ("/opt/slurm-k8s-bridge/bin/slurm-k8s-bridge attach", PYTHON_GONE),
        # The waiter would read a relative CA in the job's working directory: the user's own CA.
        ("/usr/libexec/w --ca ca.pem", "names its --ca file 'ca.pem' relatively"),
        ("/usr/libexec/w --api https://d:1 --ca ./certs/ca.pem", "names its --ca file './certs/ca.pem'"),
        ("/usr/libexec/w --ca /etc/ca.pem --ca ca.pem", "names its --ca file 'ca.pem' relatively"),
        # The waiter reads only `--api URL` and `--ca FILE` pairs: it would run anything else as the
        # batch script (read in the job's directory), and a dangling option takes job_submit's --api.
        ("/usr/libexec/w --ca=/etc/ca.pem", "gives the waiter '--ca=/etc/ca.pem': after the program, only"),
        ("/usr/libexec/w --ca", "gives the waiter '--ca': after the program, only"),
        ("/usr/libexec/w extra --ca rel.pem", "gives the waiter 'extra --ca rel.pem'"),
        ("/usr/libexec/w --verbose 1", "gives the waiter '--verbose 1'"),
    ],
)
def test_a_command_the_user_could_redirect_is_refused_naming_the_key(command: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        parse_config(_with_attach(command), source="bridge.toml")
    assert str(info.value).startswith("bridge.toml: waiter.attach_command: ")


@pytest.mark.parametrize(
    "command",
    [
        "/usr/libexec/slurm-k8s-bridge/waiter",
        "/opt/bridge/bin/waiter --ca /etc/bridge/ca.pem",
        "/opt/bridge/bin/waiter --api https://d:1 --ca /etc/bridge/ca.pem",
        "/usr/local/libexec/waiter-2",
    ],
)
def test_absolute_commands_are_accepted(command: str) -> None:
    assert parse_config(_with_attach(command)).waiter.attach_command == command


def test_the_file_a_command_runs_is_its_program() -> None:
    assert attach_command_files(DEFAULT_ATTACH_COMMAND) == ["/usr/libexec/slurm-k8s-bridge/waiter"]
    assert attach_command_files("/opt/b/waiter --ca /etc/ca.pem") == ["/opt/b/waiter"]


def _static_program(directory: Path) -> Path:
    """A static ELF program, as install-waiter.sh makes the waiter (gcc -static: faster than Go)."""
    assert shutil.which("gcc"), "gcc is needed to build a static program for this test"
    source = directory.parent / "main.c"
    source.write_text("int main(void) { return 0; }\n")
    program = directory / "waiter"
    built = subprocess.run(["gcc", "-static", "-o", str(program), str(source)],
                           capture_output=True, text=True)
    assert built.returncode == 0, f"gcc -static failed (is libc.a installed?): {built.stderr}"
    program.chmod(0o755)
    return program


@pytest.fixture
def installed(tmp_path: Path) -> tuple[str, Path]:
    libexec = tmp_path / "libexec"
    libexec.mkdir(mode=0o755)
    libexec.chmod(0o755)
    program = _static_program(libexec)
    return f"{program} --api http://d:1", program


def test_doctor_accepts_a_waiter_only_its_owner_can_write(installed: tuple[str, Path]) -> None:
    command, program = installed
    owner = program.stat().st_uid
    # Owned by root on a real install; here by whoever runs the tests (trusted for this check).
    assert waiter_install_problems(command, frozenset({0, owner})) == []


def test_doctor_refuses_a_waiter_others_may_replace(installed: tuple[str, Path]) -> None:
    command, program = installed
    owner = frozenset({0, program.stat().st_uid})
    program.chmod(0o664)
    assert waiter_install_problems(command, owner) == [f"{program} is writable by group or others (mode 664)"]
    program.chmod(0o644)
    program.parent.chmod(0o777)
    assert waiter_install_problems(command, owner) == [
        f"{program.parent} is writable by group or others (mode 777)"
    ]


def test_doctor_refuses_a_waiter_of_another_owner(installed: tuple[str, Path]) -> None:
    command, program = installed
    problems = waiter_install_problems(command, frozenset({987654}))
    assert f"{program} is owned by uid {program.stat().st_uid}, not root" in problems


async def test_doctor_names_a_waiter_missing_here_without_failing(
    installed: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # doctor also runs where no slurmd does (the daemon's image, another host): a note, no failure.
    command, program = installed
    program.unlink()
    monkeypatch.delenv("POD_NAME", raising=False)
    cfg = parse_config(_with_attach(command))

    assert waiter_install_problems(command) == []
    assert await Doctor(cfg, None).check_waiter() == (
        f"{program} not on this host: install it on every host of a bridged slurmd (as root, from the "
        f"bridge's source: deploy/slurm/install-waiter.sh {program}) and run doctor there"
    )


async def test_doctor_fails_the_waiter_check_for_a_replaceable_file(
    installed: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    command, program = installed
    program.chmod(0o666)
    monkeypatch.delenv("POD_NAME", raising=False)

    with pytest.raises(CheckFailed) as failed:
        await Doctor(parse_config(_with_attach(command)), None).check_waiter()
    assert f"{program} is writable by group or others (mode 666)" in str(failed.value)
    assert str(failed.value).endswith(
        f"Install it as root, from the bridge's source: deploy/slurm/install-waiter.sh {program}")


async def test_doctor_passes_a_static_root_owned_waiter(
    installed: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert os.geteuid() == 0, "this test needs root: doctor trusts only a root-owned waiter"
    command, _ = installed
    monkeypatch.delenv("POD_NAME", raising=False)

    assert await Doctor(parse_config(_with_attach(command)), None).check_waiter() == (
        f"{command} is in place: a static program, root-owned, writable by root only")


def test_doctor_refuses_a_dynamically_linked_waiter(installed: tuple[str, Path]) -> None:
    # /bin/true asks for ld.so, which would follow the job's LD_PRELOAD and LD_LIBRARY_PATH.
    command, program = installed
    shutil.copyfile("/bin/true", program)
    assert waiter_install_problems(command, frozenset({0, program.stat().st_uid})) == [
        f"{program} is dynamically linked: its program interpreter would follow the job's LD_PRELOAD "
        "and LD_LIBRARY_PATH"
    ]


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"#!/usr/bin/python3 -I\nimport bridge\n", "is not an ELF program: the waiter is the compiled one"),
        (b"", "is not an ELF program: the waiter is the compiled one"),
        ("truncated", "is a truncated or malformed ELF program"),
    ],
)
def test_doctor_refuses_a_waiter_that_is_no_whole_elf_program(
    installed: tuple[str, Path], content: bytes | str, problem: str
) -> None:
    command, program = installed
    # The static program's headers, its program header table cut off.
    program.write_bytes(program.read_bytes()[:80] if content == "truncated" else content)
    assert waiter_install_problems(command, frozenset({0, program.stat().st_uid})) == [f"{program} {problem}"]


def test_doctor_refuses_a_waiter_below_a_directory_others_may_write(installed: tuple[str, Path]) -> None:
    # Whoever may write the grandparent can rename libexec/ away and put their own in its place.
    command, program = installed
    owner = frozenset({0, program.stat().st_uid})
    grandparent = program.parent.parent
    grandparent.chmod(0o777)
    assert waiter_install_problems(command, owner) == [
        f"{grandparent} is writable by group or others (mode 777)"]
    grandparent.chmod(0o1777)  # sticky, as /tmp: others may rename only their own entries
    assert waiter_install_problems(command, owner) == []


def test_doctor_refuses_a_symlinked_or_set_id_waiter(installed: tuple[str, Path]) -> None:
    command, program = installed
    owner = frozenset({0, program.stat().st_uid})
    program.chmod(0o4755)
    assert waiter_install_problems(command, owner) == [
        f"{program} is set-user-ID or set-group-ID: it would run the job's environment with another's rights"]
    program.chmod(0o755)
    real = program.with_name("waiter-real")
    program.rename(real)
    program.symlink_to(real)
    assert waiter_install_problems(command, owner) == [
        f"{program} is a symbolic link: name the installed program itself"]


@pytest.fixture
def ca_file(tmp_path: Path) -> Path:
    etc = tmp_path / "etc"
    etc.mkdir()
    etc.chmod(0o755)
    tmp_path.chmod(0o755)
    ca = etc / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    ca.chmod(0o644)
    return ca


def _trusted(path: Path) -> frozenset[int]:
    # Owned by root on a real install; here by whoever runs the tests (trusted for this check).
    return frozenset({0, path.stat().st_uid})


def test_doctor_accepts_a_ca_file_only_its_owner_can_write(
    installed: tuple[str, Path], ca_file: Path
) -> None:
    command, program = installed
    assert waiter_install_problems(f"{command} --ca {ca_file}", _trusted(program)) == []


def test_doctor_refuses_a_ca_file_others_may_replace(installed: tuple[str, Path], ca_file: Path) -> None:
    # Whoever may write the CA may have every waiter trust a daemon of theirs.
    command, program = installed
    ca_file.chmod(0o666)
    assert waiter_install_problems(f"{command} --ca {ca_file}", _trusted(program)) == [
        f"the --ca file {ca_file} is writable by group or others (mode 666)"
    ]
    ca_file.chmod(0o644)
    ca_file.parent.chmod(0o777)
    assert waiter_install_problems(f"{command} --ca {ca_file}", _trusted(program)) == [
        f"the --ca file {ca_file.parent} is writable by group or others (mode 777)"
    ]


def test_doctor_follows_a_linked_ca_file_to_the_file_the_waiter_reads(ca_file: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o777)
    elsewhere.chmod(0o777)
    real = elsewhere / "real.pem"
    real.write_text("x")
    real.chmod(0o644)
    ca_file.unlink()
    ca_file.symlink_to(real)
    assert ca_file_problems(ca_file, _trusted(real)) == [
        f"the --ca file {elsewhere} is writable by group or others (mode 777)"
    ]
    assert ca_file_problems(ca_file, frozenset({987654}))[:1] == [
        f"the --ca file {real} is owned by uid {real.stat().st_uid}, not root"
    ]


def test_a_ca_file_missing_here_is_no_problem(tmp_path: Path) -> None:
    # doctor also runs where no slurmd does; the waiter would say so on the slurmd host.
    assert ca_file_problems(tmp_path / "absent.pem") == []


async def test_doctor_fails_the_waiter_check_for_a_replaceable_ca_file_of_the_config(
    installed: tuple[str, Path], ca_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `[waiter] ca_file` is what job-submit-conf passes to every waiter as --ca.
    command, _ = installed
    ca_file.chmod(0o646)
    monkeypatch.delenv("POD_NAME", raising=False)
    config = _with_attach(command).replace(
        "[waiter]\n", f"[waiter]\napi_url = 'https://bridge.example:8470'\nca_file = '{ca_file}'\n")

    with pytest.raises(CheckFailed) as failed:
        await Doctor(parse_config(config), None).check_waiter()
    assert f"the --ca file {ca_file} is writable by group or others (mode 646)" in str(failed.value)


def test_doctor_refuses_a_linked_ca_file_in_a_directory_others_may_write(
    ca_file: Path, tmp_path: Path
) -> None:
    # Whoever may write the link's own directory may point it at a CA of theirs.
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    link = open_dir / "ca.pem"
    link.symlink_to(ca_file)
    assert ca_file_problems(link, _trusted(ca_file)) == [
        f"the --ca file {open_dir} is writable by group or others (mode 777)"
    ]


def test_doctor_takes_a_linked_directory_on_the_way_by_its_target(ca_file: Path, tmp_path: Path) -> None:
    # /etc/pki/tls/certs -> ../../ssl/certs and the like: a link's own mode (777) means nothing.
    (tmp_path / "linked").symlink_to(ca_file.parent)
    assert ca_file_problems(tmp_path / "linked" / ca_file.name, _trusted(ca_file)) == []
