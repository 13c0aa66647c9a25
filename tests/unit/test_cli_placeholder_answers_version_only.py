"""Until the daemon exists, the CLI answers `version` and refuses the other commands with exit 2."""

from __future__ import annotations

import pytest

from bridge import __version__
from bridge.cli import main


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["version"]) == 0
    assert capsys.readouterr().out.strip() == __version__


@pytest.mark.parametrize("command", ["run", "attach", "doctor"])
def test_pending_commands_exit_2(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([command]) == 2
    assert "not implemented yet" in capsys.readouterr().err


def test_missing_command_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2
