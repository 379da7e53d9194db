"""The real console script, as a shell runs it: exit status, one stderr line, never a traceback. The behaviour behind
it (every rule, every usage error of every command) is tested in-process in tests/unit (tests/support/cli_inproc.py
calls the same `provisioner.cli.main`); these cases keep the process boundary itself honest."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from inventory_factory import gpu_nodes, write_inventory

from provisioner import PROJECT_ROOT

PROVISION = str(Path(sys.executable).with_name("provision"))


def run(*args: str, cwd: Path = PROJECT_ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROVISION, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_valid_inventory_exits_0_with_the_sizing_json() -> None:
    p = run("validate", "inventories/rack-a.ini", "--format", "json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["ok"] is True and p.stderr == ""


def test_invalid_inventory_exits_1_and_names_the_rule(tmp_path: Path) -> None:
    p = run("validate", str(write_inventory(tmp_path, group_vars=gpu_nodes(gpu_model="H100"))))
    assert p.returncode == 1 and "HW003" in p.stdout and "Traceback" not in p.stderr


@pytest.mark.parametrize("args", [["validate", "/nonexistent/hosts.ini"], ["validate", "x", "--format", "xml"],
                                  ["no-such-command"], ["run", "inventories/rack-a.ini", "--no-such-option"]])
def test_usage_errors_exit_2_with_one_stderr_line(args: list[str]) -> None:
    p = run(*args)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr + p.stdout
    assert len([ln for ln in p.stderr.splitlines() if ln.strip()]) == 1, p.stderr


def test_help_and_version_exit_0() -> None:
    assert run("--help").returncode == 0
    v = run("--version")
    assert v.returncode == 0 and v.stdout.startswith("provision "), v.stdout
