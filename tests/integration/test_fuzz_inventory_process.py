"""The process cases of tests/unit/test_fuzz_inventory.py (the unit lane runs in-process);
their data and helpers are tests/support/fuzz_inventory_shared.py."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from fuzz_inventory_shared import _write, inventories
from hypothesis import HealthCheck, given, settings


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(files=inventories())
def test_random_inventories_console_script(files: dict[str, str]) -> None:
    exe = Path(sys.executable).parent / "provision"
    with tempfile.TemporaryDirectory() as d:
        inv = _write(Path(d), files)
        p = subprocess.run([str(exe), "validate", str(inv), "--format", "json"], capture_output=True, text=True,
                           timeout=120)
    assert p.returncode in (0, 1, 2) and "Traceback" not in p.stderr, p.stderr
