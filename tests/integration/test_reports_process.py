"""The process cases of tests/unit/test_reports.py (the unit lane runs in-process);
their data and helpers are tests/support/reports_shared.py."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from reports_shared import drift_result

from provisioner.reports import drift_prometheus


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_drift_prometheus_promtool(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = subprocess.run(["promtool", "check", "metrics"], input=drift_prometheus.render(drift_result()),
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
