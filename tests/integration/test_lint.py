"""ansible-lint (production profile) and yamllint over playbooks/, roles/ and the collection's metadata (galaxy.yml,
meta/, the execution environment definition), as CI runs them (`make lint`).

Both run as subprocesses with the project's .ansible-lint / .yamllint; any finding fails the test with the
tool's own report.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from provisioner import PROJECT_ROOT

BIN = Path(sys.executable).parent
TARGETS = ["playbooks", "roles", "galaxy.yml", "meta", "execution-environment.yml", "requirements.yml"]


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"  # ansible-lint calls ansible-playbook --syntax-check
    env["ANSIBLE_CONFIG"] = str(PROJECT_ROOT / "ansible.cfg")
    env["NO_COLOR"] = "1"
    return subprocess.run(cmd, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=900)


def _tool(name: str) -> str:
    path = BIN / name
    if not path.exists():
        pytest.fail(f"{name} is not installed in {BIN}: run `make venv` (the test extra installs it)")
    return str(path)


def test_ansible_lint_production_profile() -> None:
    r = _run([_tool("ansible-lint"), "--profile", "production", "--offline", "--nocolor", *TARGETS])
    assert r.returncode == 0, f"ansible-lint found problems:\n{r.stdout}\n{r.stderr}"


def test_yamllint() -> None:
    r = _run([_tool("yamllint"), "--strict", "--format", "parsable", *TARGETS])
    assert r.returncode == 0, f"yamllint found problems:\n{r.stdout}\n{r.stderr}"
