"""Onboarding's pure decisions (provisioner/day2/onboard.py): the burn-in tier per host, which firmware findings
wait for the run, the gates a host passed, a failed check's line, the outcome's report line, and the run and the
launch judged per host."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from inventory_factory import write_inventory

from provisioner.day2.onboard import (Outcome, before_the_run, burnin_tiers, check_line, judge_launch, judge_run,
                                      stages, unburnt)
from provisioner.inventory import load_fleet
from provisioner.results import HostResult, RunResult, TaskFailure


def test_burnin_tier_per_host(tmp_path: Path) -> None:
    inv = write_inventory(tmp_path, host_vars={"n1": {"burnin_onboard_tier": " Quick "},
                                               "n2": {"burnin_onboard_tier": "off"}})
    fleet = load_fleet(inv)
    assert burnin_tiers(fleet, ["n1", "n2"]) == {"quick": ["n1"]}
    assert burnin_tiers(fleet, ["n2"]) == {}
    inv2 = write_inventory(tmp_path / "b", host_vars={"n1": {"burnin_onboard_tier": "bogus"}})
    assert burnin_tiers(load_fleet(inv2), ["n1", "n2"]) == {"standard": ["n1", "n2"]}  # unknown and unset: standard


def test_with_the_burnin_gate_a_host_that_ran_no_tier_is_left_out(tmp_path: Path) -> None:
    inv = write_inventory(tmp_path, host_vars={"n1": {"burnin_onboard_tier": "off"},
                                               "n2": {"burnin_onboard_tier": "off", "burnin_gate": False}})
    fleet = load_fleet(inv)
    out = {"n1": Outcome("n1"), "n2": Outcome("n2"), "n3": Outcome("n3", burnin="quick")}
    out["n4"] = Outcome("n4", stage="health", problems=["ecc: x"])
    unburnt(fleet, out)
    assert (out["n1"].stage, out["n1"].problems) == ("burn-in", [
        "burnin_onboard_tier is off and burnin_gate is on: in-service needs a passed burn-in (set "
        "burnin_onboard_tier: quick, or burnin_gate: false to weaken acceptance)"])
    assert out["n2"].stage is None and out["n3"].stage is None  # the site turned the gate off / a tier passed
    assert out["n4"].stage == "health"  # left out already: its first reason stays


@dataclass
class _F:
    code: str
    component: str


def test_what_a_bare_node_cannot_report_waits_for_the_run() -> None:
    fs = [_F("FW011", "gpu"), _F("FW011", "bmc"), _F("FW010", "gpu"), _F("FW011", "hca")]
    assert before_the_run(fs, ("gpu", "hca")) == [_F("FW011", "bmc"), _F("FW010", "gpu")]


def test_stages_and_lines() -> None:
    assert stages(["power"], run=True, node_firmware=False, burn_in=True) == ["power", "preflight", "run", "health",
                                                                               "burn-in"]
    assert stages([], run=False, node_firmware=True, burn_in=False) == ["preflight", "node firmware", "health"]
    r = {"check": "dcgm_diag", "gpu": 0, "code": "BI003", "message": "row remap failed"}
    assert check_line(r) == "dcgm_diag gpu0 [BI003]: row remap failed"
    assert check_line({"check": "nccl"}, message=False) == "nccl"
    o = Outcome("n1", clusters=["c1"])
    o.fail("firmware", ["FW010 gpu: 96.00.1 not accepted"])
    assert o.line() == "n1: LEFT OUT at firmware: FW010 gpu: 96.00.1 not accepted; left out of the launch of c1"


def _result(**hosts: HostResult) -> RunResult:
    return RunResult(command="run", inventory="inv", playbook="site.yml", run_dir="/r", artifact_dir="/a",
                     started=0.0, hosts=dict(hosts))


def test_the_run_and_the_launch_judged_per_host(tmp_path: Path) -> None:
    out = {h: Outcome(h, clusters=["c1"]) for h in ("n1", "n2")}
    bad = HostResult("n2", seen=True, failed=1, failures=[TaskFailure("n2", "Install the driver", "dpkg error")])
    judge_run(out, ["n1", "n2"], _result(n1=HostResult("n1", seen=True, ok=3), n2=bad))
    assert out["n1"].stage is None
    assert (out["n2"].stage, out["n2"].problems) == ("run", ["Install the driver: dpkg error"])
    judge_run(out, ["n1"], _result())  # a host the run never reached
    assert (out["n1"].stage, out["n1"].problems) == ("run", ["host not_run in the provisioning run"])

    fleet = load_fleet(write_inventory(tmp_path))  # cluster c1: n1, n2
    out = {"n1": Outcome("n1", in_service=True, clusters=["c1"]), "n2": Outcome("n2", clusters=["c1"])}
    judge_launch(out, fleet, _result(n1=HostResult("n1", seen=True, ok=2), n2=HostResult("n2", seen=True, ok=2)))
    assert out["n1"].launch == "ok" and out["n2"].launch is None  # n2 is not in service: not judged
    failed = _result(n1=HostResult("n1", seen=True, ok=1), n2=HostResult("n2", seen=True, unreachable=1))
    out["n1"].launch = None
    judge_launch(out, fleet, failed)
    assert out["n1"].launch == "failed" and out["n1"].launch_problems == ["n2 not launched"]
