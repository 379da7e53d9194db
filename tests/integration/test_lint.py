"""`make lint` as a user types it: ansible-lint (production profile, --offline) and yamllint over playbooks/, roles/,
the collection's metadata and the inventories, with the project's .ansible-lint / .yamllint; any finding fails the
test with the tools' own report.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from provisioner import PROJECT_ROOT

BIN = Path(sys.executable).parent


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"  # ansible-lint calls ansible-playbook --syntax-check
    env["ANSIBLE_CONFIG"] = str(PROJECT_ROOT / "ansible.cfg")
    env["NO_COLOR"] = "1"
    return subprocess.run(cmd, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=900)


def test_make_lint_as_typed_from_a_clean_checkout() -> None:
    """`make lint` itself (the README's and CI's command): ansible-lint --offline + yamllint over LINT_TARGETS."""
    r = _run(["make", "-s", "lint", f"VENV={BIN.parent}"])
    assert r.returncode == 0, f"make lint found problems:\n{r.stdout}\n{r.stderr}"
