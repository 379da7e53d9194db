"""ruff and mypy on the product package (configuration: pyproject.toml). Both come with the `test` extra; a test is
skipped only where its tool is not installed."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    exe = shutil.which(name, path=str(BIN)) or shutil.which(name)
    if exe is None:
        pytest.skip(f"{name} is not installed (pip install -e '.[test]')")
    return exe


def test_ruff_is_clean() -> None:
    p = subprocess.run([tool("ruff"), "check", "--no-cache", "provisioner"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr


def test_mypy_is_clean(tmp_path: Path) -> None:
    p = subprocess.run([tool("mypy"), "--cache-dir", str(tmp_path / "cache")], cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "no issues found" in p.stdout
