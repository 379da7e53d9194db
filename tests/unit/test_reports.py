"""The drift reports (text, JSON, JUnit, Prometheus) and the run JSON, from real RunResult objects."""

from __future__ import annotations

import json
import math
import re
import xml.etree.ElementTree as ET

from reports_shared import NCCL_DIFF, drift_result

from provisioner.reports import drift_json, drift_junit, drift_prometheus, drift_text, run_json, run_text
from provisioner.results import RunResult, TaskFailure


# -- text ----------------------------------------------------------------------------------------------------------
def test_drift_text_lists_each_resource_diff_and_unreachable() -> None:
    text = drift_text.render(drift_result())
    assert "node01: 4 resources drifted" in text
    for res in ("/etc/nccl.conf", "nvidia-persistenced", "nvidia-fabricmanager-580",
                "/etc/systemd/system/nvidia-persistenced.service"):
        assert res in text
    assert "-NCCL_IB_HCA=mlx5_9" in text
    assert "node02: no drift" in text
    assert "node03: UNREACHABLE (not checked): Failed to connect" in text
    assert "CHECK FAILED" in text
    assert "drift: 4 resources on 1 host of 4 checked" in text


# -- JSON ----------------------------------------------------------------------------------------------------------
def test_drift_json_structure() -> None:
    d = json.loads(drift_json.render(drift_result()))
    assert d["schema"] == "provision.drift/v1" and d["drift_found"] is True and d["complete"] is False
    assert d["summary"] == {"hosts": 4, "drifted_hosts": ["node01"], "drifted_resources": 4,
                            "unreachable_hosts": ["node03"], "check_failed_hosts": ['odd"name\\x'],
                            "reboot_required_hosts": [], "tiers": {}}
    assert [(i["kind"], i["resource"]) for i in d["hosts"]["node01"]["drift"]] == [
        ("file", "/etc/nccl.conf"), ("service", "nvidia-persistenced"), ("package", "nvidia-fabricmanager-580"),
        ("file", "/etc/systemd/system/nvidia-persistenced.service")]
    assert d["hosts"]["node01"]["drift"][0]["diff"] == NCCL_DIFF
    assert d["hosts"]["node01"]["drift"][0]["role"] == "nccl_tuning"
    assert {n: h["state"] for n, h in d["hosts"].items()} == {
        "node01": "drifted", "node02": "clean", "node03": "unreachable", 'odd"name\\x': "check_failed"}


def test_drift_json_clean() -> None:
    r = drift_result()
    r.hosts["node01"].drift = []
    del r.hosts["node03"], r.hosts['odd"name\\x']
    r.targeted = ["node01", "node02"]
    d = json.loads(drift_json.render(r))
    assert d["drift_found"] is False and d["complete"] is True
    assert all(h["drift"] == [] for h in d["hosts"].values())


# -- JUnit ---------------------------------------------------------------------------------------------------------
def test_drift_junit_one_testcase_per_host_and_resource() -> None:
    root = ET.fromstring(drift_junit.render(drift_result()))
    assert root.tag == "testsuites"
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("7", "4", "2")
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert set(suites) == {"node01", "node02", "node03", 'odd"name\\x'}
    cases = suites["node01"].findall("testcase")
    assert [c.get("name") for c in cases] == [
        "file:/etc/nccl.conf", "service:nvidia-persistenced", "package:nvidia-fabricmanager-580",
        "file:/etc/systemd/system/nvidia-persistenced.service"]
    assert all(c.find("failure") is not None for c in cases)
    assert cases[0].get("classname") == "node01.nccl_tuning"
    assert "+NCCL_IB_HCA=mlx5_0" in cases[0].find("failure").text
    [clean] = suites["node02"].findall("testcase")
    assert clean.get("name") == "no drift" and len(list(clean)) == 0
    [unreach] = suites["node03"].findall("testcase")
    assert unreach.find("error").get("type") == "unreachable"
    for s in suites.values():
        assert int(s.get("tests")) == len(s.findall("testcase"))


# -- Prometheus ----------------------------------------------------------------------------------------------------
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


def test_drift_prometheus_textfile() -> None:
    r = drift_result()
    text = drift_prometheus.render(r)
    s = parse_exposition(text)
    res = {(lab["host"], lab["role"]): v for lab, v in s["provisioner_drift_resources"]}
    assert res[("node01", "nccl_tuning")] == 1
    assert res[("node01", "nvidia_persistenced")] == 2
    assert res[("node01", "nvidia_driver")] == 1
    assert res[("node02", "nccl_tuning")] == 0 and res[("node02", "nvidia_driver")] == 0
    assert not any(h == "node03" for h, _ in res)  # unreachable: not checked, no drift figure
    unreach = {lab["host"]: v for lab, v in s["provisioner_host_unreachable"]}
    assert unreach == {"node01": 0, "node02": 0, "node03": 1, 'odd\\"name\\\\x': 0}
    assert s["provisioner_drift_last_run_timestamp_seconds"] == [({}, r.started + r.duration)]
    failed = {lab["host"]: v for lab, v in s["provisioner_drift_check_failed"]}
    assert failed['odd\\"name\\\\x'] == 1


# -- run reports ---------------------------------------------------------------------------------------------------
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


def test_run_json() -> None:
    d = json.loads(run_json.render(run_result()))
    assert d["schema"] == "provision.run/v1"
    assert d["succeeded"] is False and d["aborted"] is True
    assert d["failed_hosts"] == ["node01"] and d["not_run_hosts"] == ["node02", "node03"]
    n1 = d["hosts"]["node01"]
    assert (n1["ok"], n1["changed"], n1["failed"], n1["batch"], n1["state"]) == (5, 2, 1, 1, "failed")
    assert d["hosts"]["node02"]["state"] == "not_run"
    assert d["failures"] == [{"host": "node01", "task": "Install the pinned driver", "role": "nvidia_driver",
                              "play": "GPU stack", "action": "apt",
                              "message": "No package matching 'nvidia-open-580'"}]
    assert d["duration"] == 42.0 and d["artifact_dir"].endswith("artifacts/ansible")
    assert d["totals"]["failed"] == 1
    assert d["batches"] == [{"play": "GPU stack", "batch": 1, "hosts": ["node01"]}]


def test_run_text() -> None:
    r = run_result()
    text = run_text.render(r)
    assert "FAILED node01: TASK [nvidia_driver : Install the pinned driver]" in text
    assert "NOT RUN (the rollout stopped before reaching them): node02, node03" in text
    assert f"--limit @{r.retry_file}" in text
    assert r.retry_hosts == ["node01", "node02", "node03"]
    # a host no play targeted (not aborted) is not a retry candidate
    r.aborted = False
    assert r.retry_hosts == ["node01"]


def test_run_text_check_mode_lists_what_would_change() -> None:
    r = drift_result()
    r.command = "run"
    text = run_text.render(r)
    assert "WOULD CHANGE node01: file /etc/nccl.conf (TASK [nccl_tuning : Render /etc/nccl.conf])" in text
    assert "+NCCL_IB_HCA=mlx5_0" in text
