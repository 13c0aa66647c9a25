"""The CLI prints job_submit_bridge.conf from the same config the daemon reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.core import wellknown
from bridge.core.directives import KEYS
from bridge.manager import cli

REPO = Path(__file__).resolve().parents[2]


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["version"]) == 0
    assert capsys.readouterr().out.strip() == __import__("bridge").__version__


@pytest.mark.parametrize("command", ["attach", "waiter-build"])
def test_the_cli_runs_and_builds_no_python_waiter(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    # The waiter is the compiled agent/cmd/waiter, which deploy/slurm/install-waiter.sh installs.
    with pytest.raises(SystemExit) as exit_info:
        cli.main([command, "/usr/libexec/slurm-k8s-bridge/waiter"])
    assert exit_info.value.code == 2
    assert f"invalid choice: '{command}'" in capsys.readouterr().err


def test_job_submit_conf_lists_partitions_keys_and_the_attach_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "bridge.toml"
    config.write_text(
        'cluster = "c1"\n[slurm]\nurl = "http://127.0.0.1:6820"\n'
        '[waiter]\nattach_command = "/opt/b/waiter"\napi_url = "http://10.0.0.5:8470"\n'
        '[partitions.gpu]\ndefault_image = "img:1"\n[partitions.cpu]\n'
    )

    assert cli.main(["job-submit-conf", "-c", str(config)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("#")]

    assert lines == [
        "attach_command=/opt/b/waiter --api http://10.0.0.5:8470",
        f"directive_keys={','.join(KEYS)}",
        "partition=cpu",
        "partition=gpu default_image=img:1",
    ]


def test_a_bad_config_exits_2_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "bridge.toml"
    config.write_text('cluster = "c1"\n[slurm]\nurl = "http://127.0.0.1:6820"\n')

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["job-submit-conf", "-c", str(config)])

    assert exit_info.value.code == 2
    assert "partition" in capsys.readouterr().err


def test_doctor_recognises_the_bridges_job_submit_lua() -> None:
    lua = (REPO / "deploy" / "slurm" / "job_submit.lua").read_text()
    assert wellknown.JOB_SUBMIT_LUA_SIGNATURE in lua
