"""A node that needs a reboot (issue 28, item 3): the run summary says so per host (events -> RunResult -> text, JSON,
drift JSON/JUnit/Prometheus), and the health program's pure decision (nodeparse: loaded module vs installed driver,
the /run/reboot-required mark). In-process; the program itself runs in tests/integration/test_node_health.py."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from provisioner.probes import nodeparse as n
from provisioner.reports import drift_json, drift_junit, drift_prometheus, drift_text, run_json, run_text
from provisioner.results import RunResult
from provisioner.runner import EventFolder, NullProgress
from provisioner.runner.events import reboot_request

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real"
REASON = ("the NVIDIA kernel module changed to 580.95.05-1 and provision_allow_reboot is false "
          "(/run/reboot-required written)")


def _ok(host: str, task: str, res: dict[str, Any], role: str = "nvidia_driver") -> dict[str, Any]:
    return {"event": "runner_on_ok", "event_data": {"host": host, "task": task, "role": role, "res": res,
                                                    "task_uuid": task}}


def folded(check: bool = False) -> RunResult:
    """node01 installs the kernel module (the handler sets the facts), node02 is already right."""
    r = RunResult(command="drift" if check else "run", inventory="hosts.ini", playbook="site.yml", run_dir="/r",
                  artifact_dir="/r/a", started=0.0, duration=3.0, check=check, status="successful", rc=0,
                  targeted=["node01", "node02"])
    folder = EventFolder(r, NullProgress())
    events = [
        {"event": "playbook_on_play_start", "event_data": {"name": "GPU stack", "play_uuid": "p1"}},
        _ok("node01", "Pin, install and hold the driver at 580.95.05-1", {"changed": True, "installed": ["k"]}),
        _ok("node02", "Pin, install and hold the driver at 580.95.05-1", {"changed": False}),
        _ok("node01", "Record that a reboot is required",
            {"changed": False, "ansible_facts": {"nvidia_driver_reboot_required": True,
                                                 "nvidia_driver_reboot_reason": REASON}}),
        _ok("node02", "Some other fact", {"changed": False, "ansible_facts": {"nvidia_driver_reboot_required": False}}),
        {"event": "playbook_on_stats", "event_data": {"ok": {"node01": 2, "node02": 2}, "changed": {"node01": 1},
                                                      "processed": {"node01": 1, "node02": 1}}},
    ]
    for ev in events:
        folder(ev)
    folder.finish(r.targeted)
    return r


def test_reboot_request_reads_any_reboot_required_fact() -> None:
    assert reboot_request({"nvidia_driver_reboot_required": True, "nvidia_driver_reboot_reason": " why "}) == "why"
    assert reboot_request({"x_reboot_required": "true"}, "x") == "x_reboot_required set by role x"
    assert reboot_request({"nvidia_driver_reboot_required": False}) is None
    assert reboot_request({"reboot": True}) is None and reboot_request(None) is None
    assert reboot_request("not a dict") is None


def test_run_folds_the_handler_fact_per_host_and_keeps_the_exit_status() -> None:
    r = folded()
    assert r.reboot_hosts == ["node01"]
    assert (r.hosts["node01"].reboot_required, r.hosts["node01"].reboot_reason) == (True, REASON)
    assert not r.hosts["node02"].reboot_required
    # a host that needs a reboot is still a successful host: `provision run` exits 0 (documented in running.md)
    assert r.hosts["node01"].state == "changed" and r.succeeded


def test_run_text_says_reboot_required_on_the_hosts_line() -> None:
    text = run_text.render(folded())
    lines = text.splitlines()
    assert lines[0].split()[-2:] == ["REBOOT", "BATCH"]
    row = next(ln for ln in lines if ln.startswith("node01 "))
    assert row.split()[1] == "changed" and row.split()[-2:] == ["required", "1"]
    assert next(ln for ln in lines if ln.startswith("node02 ")).split()[-2:] == ["-", "1"]
    assert (f"REBOOT REQUIRED node01: {REASON}; reboot it before it serves (`provision health` fails it until then), "
            "or run again with -e provision_allow_reboot=true") in lines
    assert "REBOOT REQUIRED node02" not in text
    assert ", 1 change, 1 needing a reboot" in text
    # no host needs one: the table is as before (no REBOOT column)
    r = folded()
    r.hosts["node01"].reboot_required = False
    plain = run_text.render(r)
    assert "REBOOT" not in plain and "reboot" not in plain


def test_run_json_lists_the_hosts_that_need_a_reboot() -> None:
    d = json.loads(run_json.render(folded()))
    assert d["reboot_required_hosts"] == ["node01"] and d["succeeded"] is True
    assert d["hosts"]["node01"]["reboot_required"] is True and d["hosts"]["node01"]["reboot_reason"] == REASON
    assert d["hosts"]["node02"]["reboot_required"] is False and d["hosts"]["node02"]["reboot_reason"] is None


def test_check_mode_says_what_applying_would_leave() -> None:
    r = folded(check=True)
    text = run_text.render(r)
    assert f"WOULD REQUIRE A REBOOT node01: {REASON}" in text and ", 1 that would need a reboot" in text
    assert "applying would require a reboot: " + REASON in drift_text.render(r)
    d = json.loads(drift_json.render(r))
    assert d["summary"]["reboot_required_hosts"] == ["node01"] and d["hosts"]["node01"]["reboot_required"] is True
    assert d["hosts"]["node02"]["reboot_required"] is False
    suites = ET.fromstring(drift_junit.render(r))
    cases = {(s.get("name"), c.get("name")): c for s in suites for c in s.iter("testcase")}
    fail = cases[("node01", "reboot")].find("failure")
    assert fail is not None and fail.get("type") == "reboot_required" and fail.text == REASON
    assert ("node02", "reboot") not in cases
    prom = drift_prometheus.render(r, now=1.0)
    assert 'provisioner_drift_reboot_required{host="node01"} 1' in prom
    assert 'provisioner_drift_reboot_required{host="node02"} 0' in prom


# -- the health program's decision (nodeparse, shared with node_health.py) ------------------------------------------
def test_parse_nvrm_version_real_open_proprietary_sysfs() -> None:
    assert n.parse_nvrm_version((REAL / "proc-driver-version.txt").read_text()) == "580.159.04"
    prop = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n"
    assert n.parse_nvrm_version(prop) == "535.104.05"
    arm = "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.95.05  Release Build  (dvs-builder@x)\n"
    assert n.parse_nvrm_version(arm) == "580.95.05"
    assert n.parse_nvrm_version("580.95.05\n") == "580.95.05"  # /sys/module/nvidia/version
    assert n.parse_nvrm_version("") is None and n.parse_nvrm_version(None) is None
    assert n.parse_nvrm_version("modinfo: ERROR: Module nvidia not found.") is None


def test_parse_dpkg_installed_held_or_not() -> None:
    out = ("nvidia-kernel-open-580 hi  580.95.05-1\nnvidia-dkms-580 un  <none>\n"
           "nvidia-kernel-open-570 rc  570.1-1\nnvidia-kernel-open-575 ii  575.2-1\n")
    assert n.parse_dpkg_installed(out) == {"nvidia-kernel-open-580": "580.95.05-1", "nvidia-kernel-open-575": "575.2-1"}
    assert n.parse_dpkg_installed("dpkg-query: no packages found matching nvidia-dkms-*\n") == {}
    assert n.upstream_version("1:580.95.05-1") == "580.95.05" and n.upstream_version(None) == ""


def test_reboot_verdict() -> None:
    sysfs = ("580.95.05", "/sys/module/nvidia/version")
    pkg = ("580.95.05-1", "nvidia-kernel-open-580 580.95.05-1")
    ok = n.reboot_verdict(None, loaded=sysfs, installed=pkg)
    assert ok == n.RebootVerdict((), True)
    stale = n.reboot_verdict(None, loaded=("580.82.07", "/sys/module/nvidia/version"), installed=pkg)
    assert stale.reasons == ("loaded NVIDIA kernel module 580.82.07 (/sys/module/nvidia/version) is not the installed "
                             "driver 580.95.05 (nvidia-kernel-open-580 580.95.05-1): reboot the node to load it",)
    mark = "*** System restart required: NVIDIA kernel module 580.95.05-1 installed (provisioner) ***\n"
    ours = n.reboot_verdict(mark, loaded=sysfs, installed=pkg)
    assert ours.reasons == ('/run/reboot-required exists (written by provisioner\'s nvidia_driver role: "*** System '
                            'restart required: NVIDIA kernel module 580.95.05-1 installed (provisioner) ***"): reboot '
                            'the node',)
    apt = n.reboot_verdict("*** System restart required ***", "/run/reboot-required", "linux-image-6.1.0-30-amd64\n")
    assert apt.reasons == ('/run/reboot-required exists (written by a package install (linux-image-6.1.0-30-amd64): '
                           '"*** System restart required ***"): reboot the node',)
    assert not apt.compared
    empty = n.reboot_verdict("", "/tmp/mark")
    assert empty.reasons == ("/tmp/mark exists (written by an unknown writer): reboot the node",)
    # nothing to compare (no driver yet, or the module is not loaded): no reason from the versions
    assert n.reboot_verdict(None, loaded=None, installed=pkg) == n.RebootVerdict((), False)
    assert n.reboot_verdict(None, loaded=sysfs, installed=None) == n.RebootVerdict((), False)
    both = n.reboot_verdict(mark, loaded=("580.82.07", "x"), installed=pkg)
    assert len(both.reasons) == 2


def test_a_reboot_the_handler_made_is_folded_per_host_not_in_check_mode() -> None:
    """provision_allow_reboot=true: the driver role's handler (ansible.builtin.reboot) rebooted node01 only; the
    upgrade's output names it. The reboot module's answer in check mode does not count."""
    for check in (False, True):
        r = RunResult(command="drift" if check else "upgrade", inventory="hosts.ini", playbook="site.yml",
                      run_dir="/r", artifact_dir="/r/a", started=0.0, duration=3.0, check=check,
                      status="successful", rc=0, targeted=["node01", "node02"])
        folder = EventFolder(r, NullProgress())
        reboot = _ok("node01", "Reboot to load the new NVIDIA kernel module", {"changed": True, "rebooted": True,
                                                                              "elapsed": 21})
        reboot["event_data"]["resolved_action"] = "ansible.builtin.reboot"
        other = _ok("node02", "A module that says rebooted", {"changed": True, "rebooted": True})
        other["event_data"]["resolved_action"] = "ansible.builtin.command"
        for ev in (reboot, other):
            folder(ev)
        folder.finish(r.targeted)
        assert (r.hosts["node01"].rebooted, r.hosts["node02"].rebooted) == (not check, False)
