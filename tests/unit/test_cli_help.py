"""Every command's --help: a one-line summary, a blank line, then paragraphs that the terminal wraps (no hard line
breaks inside them, list items on their own lines), and every choice option lists its choices."""

from __future__ import annotations

import re
import typing
from enum import Enum
from typing import Any

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from provisioner.cli import COMMANDS, build_app

ITEM = re.compile(r"^(?:[-*] |\d+\. )")


def commands() -> list[tuple[str, Any]]:
    """(path, click command) for the app, every command and every sub-command (testbed ...)."""
    root = get_command(build_app())
    out = [("", root)]

    def walk(prefix: str, group: Any) -> None:
        for name, cmd in group.commands.items():
            path = f"{prefix} {name}".strip()
            out.append((path, cmd))
            if hasattr(cmd, "commands"):
                walk(path, cmd)

    walk("", root)
    return out


def test_every_command_is_covered() -> None:
    paths = {p for p, _ in commands()}
    assert {c.replace("_", "-") for c in COMMANDS} <= paths and "testbed up" in paths  # burn_in: burn-in


@pytest.mark.parametrize(("path", "cmd"), commands(), ids=lambda x: x if isinstance(x, str) else "")
def test_help_is_a_summary_then_unwrapped_paragraphs(path: str, cmd: Any) -> None:
    text = cmd.help or ""
    summary, *rest = text.split("\n\n")
    assert "\n" not in summary and summary.endswith(".") and len(summary) <= 100, (path, summary)
    for para in rest:
        lines = para.split("\n")
        # one line per paragraph, or one line per list item
        assert len(lines) == 1 or all(ITEM.match(x) for x in lines[1:]), (path, para)

    result = CliRunner().invoke(build_app(), [*path.split(), "--help"], env={"COLUMNS": "1000", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    shown = [line.strip() for line in result.output.splitlines()]
    assert summary in shown, (path, result.output)  # the summary on its own line
    i = shown.index(summary)
    assert shown[i + 1] == "", (path, result.output)  # then a blank line
    for para in rest:
        for line in para.split("\n"):
            assert line.strip() in shown, (path, line)  # rendered whole: never broken at the source's line ends

    hints = typing.get_type_hints(cmd.callback) if cmd.callback else {}
    for name, kind in hints.items():
        if isinstance(kind, type) and issubclass(kind, Enum):
            listed = "|".join(str(c.value) for c in kind)
            assert f"<{listed}>" in result.output, (path, name, listed)


def test_choices_are_enums() -> None:
    """--format, --report, --vllm-parser are Enum choices (typer checks and lists them), not strings checked by hand."""
    by_path = dict(commands())
    found = {(p, n) for p, c in by_path.items() if c.callback
             for n, k in typing.get_type_hints(c.callback).items() if isinstance(k, type) and issubclass(k, Enum)}
    assert {("validate", "fmt"), ("validate", "vllm_parser"), ("preflight", "fmt"), ("health", "fmt"),
            ("onboard", "fmt"), ("drift", "report")} <= found
