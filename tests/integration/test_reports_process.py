"""The parts of tests/unit/test_reports.py that need a real process (moved from the unit lane, which runs in-process)."""
from __future__ import annotations
import math
import re
import shutil
import subprocess
import pytest
from provisioner.reports import drift_prometheus
from provisioner.results import DriftItem, RunResult, TaskFailure
NCCL_DIFF = "--- before: /etc/nccl.conf\n+++ after: /etc/nccl.conf\n@@ -1 +1 @@\n-NCCL_IB_HCA=mlx5_9\n+NCCL_IB_HCA=mlx5_0\n"
def drift_result() -> RunResult:
    r = RunResult(command="drift", inventory="inventories/rack.ini", playbook="playbooks/site.yml",
                  run_dir="/tmp/.runs/x-drift", artifact_dir="/tmp/.runs/x-drift/artifacts/ansible",
                  started=1_790_000_000.0, duration=12.5, check=True, status="successful", rc=0,
                  targeted=["node01", "node02", "node03", 'odd"name\\x'])
    n1 = r.host("node01")
    n1.seen, n1.ok, n1.changed, n1.roles = True, 20, 4, ["nccl_tuning", "nvidia_persistenced", "nvidia_driver"]
    n1.drift = [
        DriftItem("node01", "Render /etc/nccl.conf", "file", "/etc/nccl.conf", role="nccl_tuning",
                  action="template", diff=NCCL_DIFF),
        DriftItem("node01", "Start nvidia-persistenced", "service", "nvidia-persistenced",
                  role="nvidia_persistenced", action="systemd_service"),
        DriftItem("node01", "Install the pinned driver", "package", "nvidia-fabricmanager-580",
                  role="nvidia_driver", action="apt"),
        DriftItem("node01", "Persistenced unit", "file", "/etc/systemd/system/nvidia-persistenced.service",
                  role="nvidia_persistenced", action="template", diff="--- a\n+++ b\n@@ -1 +1 @@\n-x\n+y\n"),
    ]
    n2 = r.host("node02")
    n2.seen, n2.ok, n2.roles = True, 20, ["nccl_tuning", "nvidia_driver"]
    n3 = r.host("node03")
    n3.seen, n3.unreachable = True, 1
    n3.unreachable_message = "Failed to connect to the host via ssh: Connection refused"
    odd = r.host('odd"name\\x')
    odd.seen, odd.ok, odd.failed, odd.roles = True, 2, 1, [""]
    odd.failures = [TaskFailure('odd"name\\x', "Read driver version", "rc 127: nvidia-smi: not found",
                                role=None)]
    return r
_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\\\|\\"|\\n)*"'
_SAMPLE = re.compile(rf"^({_NAME})(\{{(?:{_LABEL})(?:,{_LABEL})*\}})? (\S+)( -?\d+)?$")
def parse_exposition(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """A strict parser for the Prometheus text format (0.0.4) as node_exporter's textfile collector reads it."""
    assert text.endswith("\n")
    types: dict[str, str] = {}
    helps: set[str] = set()
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    seen_series: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name = line.split()[2]
            assert re.fullmatch(_NAME, name) and name not in helps
            helps.add(name)
        elif line.startswith("# TYPE "):
            _, _, name, typ = line.split()
            assert typ in ("gauge", "counter", "untyped", "summary", "histogram")
            assert name not in types and name not in samples, f"TYPE after samples for {name}"
            types[name] = typ
        elif line.startswith("#") or not line:
            raise AssertionError(f"unexpected line {line!r}")
        else:
            m = _SAMPLE.match(line)
            assert m, f"bad sample line {line!r}"
            name, labels, value = m.group(1), m.group(2) or "", m.group(3)
            assert name in types, f"sample before TYPE: {name}"
            assert line not in seen_series
            series = name + labels
            assert series not in seen_series, f"duplicate series {series}"
            seen_series.add(series)
            v = float(value)
            assert not math.isnan(v)
            lab = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', labels))
            samples.setdefault(name, []).append((lab, v))
    # all samples of a family are contiguous
    order = [ln.split("{")[0].split()[0] for ln in text.splitlines() if not ln.startswith("#")]
    families = [n for i, n in enumerate(order) if i == 0 or order[i - 1] != n]
    assert len(families) == len(set(families)), "a metric family is split"
    return samples
def run_result() -> RunResult:
    r = RunResult(command="run", inventory="inventories/rack.ini", playbook="playbooks/site.yml",
                  run_dir="/tmp/.runs/20261130T000000Z-run", artifact_dir="/tmp/.runs/20261130T000000Z-run/artifacts/ansible",
                  started=1_790_000_000.0, duration=42.0, serial="1", max_fail_percent=0, status="failed", rc=2,
                  targeted=["node01", "node02", "node03"], aborted=True,
                  retry_file="/tmp/.runs/20261130T000000Z-run/retry")
    a = r.host("node01")
    a.seen, a.ok, a.changed, a.failed, a.batch = True, 5, 2, 1, 1
    a.failures = [TaskFailure("node01", "Install the pinned driver", "No package matching 'nvidia-open-580'",
                              role="nvidia_driver", play="GPU stack", action="apt")]
    r.host("node02")
    r.host("node03")
    r.batches = [{"play": "GPU stack", "batch": 1, "hosts": ["node01"]}]
    return r


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_drift_prometheus_promtool(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = subprocess.run(["promtool", "check", "metrics"], input=drift_prometheus.render(drift_result()),
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
