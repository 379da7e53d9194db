"""Onboarding's pure decisions (provisioner/day2/onboard.py): the burn-in tier per host, which firmware findings
wait for the run, the gates a host passed, a failed check's line and the outcome's report line."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from inventory_factory import write_inventory

from provisioner.day2.onboard import Outcome, before_the_run, burnin_tiers, check_line, stages
from provisioner.inventory import load_fleet


def test_burnin_tier_per_host(tmp_path: Path) -> None:
    inv = write_inventory(tmp_path, host_vars={"n1": {"burnin_onboard_tier": " Quick "},
                                               "n2": {"burnin_onboard_tier": "off"}})
    fleet = load_fleet(inv)
    assert burnin_tiers(fleet, ["n1", "n2"]) == {"quick": ["n1"]}
    assert burnin_tiers(fleet, ["n2"]) == {}
    inv2 = write_inventory(tmp_path / "b", host_vars={"n1": {"burnin_onboard_tier": "bogus"}})
    assert burnin_tiers(load_fleet(inv2), ["n1", "n2"]) == {"standard": ["n1", "n2"]}  # unknown and unset: standard


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
