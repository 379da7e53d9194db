"""A value is text on the terminal, never rich markup nor a terminal control (issue 43, class 5): a path or value
holding `[/x]` (rich: a closing tag with nothing open, MarkupError) or `[bold]` (rich: a style, the text mangled)
prints as written, and `history`/`status` show a reason's ESC sequence as `\\x1b[...`, never send it."""

from __future__ import annotations

import json
from pathlib import Path

from cli_inproc import provision
from inventory_factory import write_inventory
from provisioner.ledger import Ledger
from provisioner.ledger.site import path_site

EVIL = "[/x][bold]boom[/bold]"


def test_a_usage_error_naming_a_path_with_markup_prints_it_whole(tmp_path: Path) -> None:
    missing = tmp_path / f"inv{EVIL}" / "hosts.ini"
    r = provision("validate", str(missing))
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and f"inv{EVIL}" in r.stderr


def test_run_refusal_lines_print_a_value_with_markup_whole(tmp_path: Path) -> None:
    inv = write_inventory(tmp_path / "inv", group_vars={"gpu_nodes": {"gpu_model": f"H100{EVIL}"}})
    r = provision("run", str(inv), "--skip-preflight")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and f"H100{EVIL}" in r.stderr and "refusing to run" in r.stderr


def test_render_refusal_prints_a_value_with_markup_whole(tmp_path: Path) -> None:
    inv = write_inventory(tmp_path / "inv", group_vars={"gpu_nodes": {"gpu_model": f"H100{EVIL}"}})
    r = provision("render", str(inv), "--host", "n1")
    assert r.returncode == 1 and f"H100{EVIL}" in r.stderr and "Traceback" not in r.stderr


def _ledger_with_evil_reason(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    inv = write_inventory(tmp_path / "inv")
    db = tmp_path / "ledger.sqlite3"
    with Ledger.open(db, site=path_site(inv)) as lg:
        lg.record_transition("n1", "new", "provisioning", reason="\x1b[2J\x1b[31mwiped\x1b[0m\nforged line " + EVIL,
                             actor="user:\x07t", at=100.0)
        lg.run_started(f"run{EVIL}", str(inv), hosts=["n1"])
    return inv, {"PROVISION_LEDGER": str(db)}


def test_history_shows_control_characters_of_a_reason_as_text(tmp_path: Path) -> None:
    _, env = _ledger_with_evil_reason(tmp_path)
    r = provision("history", "n1", env=env)
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout and "\x07" not in r.stdout
    assert "\\x1b[2J\\x1b[31mwiped\\x1b[0m\\nforged line " + EVIL in r.stdout and "user:\\x07t" in r.stdout
    assert not any(line.startswith("forged line") for line in r.stdout.splitlines())
    h = json.loads(provision("history", "n1", "-f", "json", env=env).stdout)  # JSON keeps the value exact
    assert h["transitions"][0]["reason"].startswith("\x1b[2J")


def test_status_table_prints_values_with_markup_whole(tmp_path: Path) -> None:
    inv, env = _ledger_with_evil_reason(tmp_path)
    r = provision("status", str(inv), env=env, columns=250)
    assert r.returncode == 0, r.stderr
    assert f"run{EVIL}" in r.stdout and "Traceback" not in r.stderr


def test_printable() -> None:
    from provisioner.commands.common import printable

    assert printable("plain [/x] text") == "plain [/x] text"
    assert printable("a\x1b[31mb\tc\nd\x7f\u202ee") == "a\\x1b[31mb\\tc\\nd\\x7f\\u202ee"
