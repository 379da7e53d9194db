"""Every command answers a usage error with exit 2 and one message, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli_inproc import Result, provision
from provisioner.cli import COMMANDS


def _run(*args: str) -> Result:
    return provision(*args)


@pytest.mark.parametrize("command", COMMANDS)
def test_unknown_option_is_a_usage_error(command: str) -> None:
    r = _run(command.replace("_", "-"), "--no-such-option")  # module burn_in: command burn-in
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert "--no-such-option" in r.stderr


def test_unknown_command_is_a_usage_error() -> None:
    r = _run("no-such-command")
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert "no-such-command" in r.stderr


@pytest.mark.parametrize("command", ["validate", "render", "run", "drift", "preflight", "health", "monitoring"])
def test_missing_inventory_file_is_a_usage_error(command: str, tmp_path: Path) -> None:
    extra = {"render": ["--host", "node01"], "monitoring": ["--out", str(tmp_path / "o")]}.get(command, [])
    r = _run(command, str(tmp_path / "missing.ini"), *extra)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr + r.stdout
    assert "missing.ini" in r.stderr


def test_help_lists_every_command() -> None:
    r = _run("--help")
    assert r.returncode == 0
    for command in COMMANDS:
        assert command.replace("_", "-") in r.stdout
