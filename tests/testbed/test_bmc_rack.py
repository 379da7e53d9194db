"""The rack's BMCs (issue 26): every host of rack `bmc` (PROVISIONER_BMC_RACK, 2 hosts) gets a Redfish service
(`provision testbed bmc`: sushy-tools' emulator on 127.0.0.1, TLS from the rack's BMC CA, basic auth) whose power
actions stop and start that nspawn host.

1. `provision power ... cycle` really restarts the host: its boot id changes; off makes it unreachable, on brings it
   back with SSH answering.
2. Bad credentials and an unreachable BMC are one line each and exit 1, the other host still done.
3. `provision firmware`: a host whose BMC reports another BIOS is FW010 naming component and versions.
4. `provision onboard` of a powered-off host starts at its BMC (power on, SSH, firmware gate, run, health, mark); the
   host with the wrong BIOS is left out at the firmware gate, never provisioned.
The BMC password is in no output and in no file of the runs' directory (PROVISION_RUNS_DIR, the module's own).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from testbed_rigs import own_rack  # noqa: E402  (same directory)

pytestmark = pytest.mark.testbed

ROOT = Path(__file__).resolve().parents[2]
PROVISION = [str(Path(sys.executable).parent / "provision")]
BOOT_ID = "cat /proc/sys/kernel/random/boot_id"


class Rig:
    def __init__(self, h: Any, runs: Path) -> None:
        from provisioner_testbed import bmc

        self.h, self.runs = h, runs
        self.password = bmc.password_file(h.name).read_text().strip()
        self.outputs: list[str] = []

    def cli(self, *args: str, password: str | None = None, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PROVISIONER_TESTBED_BMC_PASSWORD": self.password if password is None else password,
               "PROVISION_RUNS_DIR": str(self.runs)}
        p = subprocess.run([*PROVISION, *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout)
        self.outputs.append(p.stdout + p.stderr)
        return p

    def ssh(self, host: str, cmd: str) -> subprocess.CompletedProcess[str]:
        return self.cli("testbed", "ssh", "--name", self.h.name, host, cmd, timeout=60)


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    from provisioner_testbed import rack

    with own_rack("PROVISIONER_BMC_RACK", "bmc", 2) as h:
        rack.bmcs(h.name)
        r = Rig(h, tmp_path_factory.mktemp("runs"))
        try:
            yield r
        finally:
            rack.bmcs(h.name, firmware={"bios": "2.19.1"})
            rack.bmcs(h.name)  # every BMC up again


def test_power_cycle_restarts_the_host_and_off_on_round_trips(rig: Rig) -> None:
    inv = str(rig.h.inventory)
    before = rig.ssh("node01", BOOT_ID)
    assert before.returncode == 0, before.stderr
    p = rig.cli("power", inv, "node01", "cycle", "--yes", "--timeout", "180", "--format", "json")
    assert p.returncode == 0, p.stdout + p.stderr
    row = json.loads(p.stdout)["hosts"][0]
    assert row["ok"] and row["after"] == "On" and row["boot_id_before"] == before.stdout.strip()
    after = rig.ssh("node01", BOOT_ID)
    assert after.returncode == 0 and after.stdout.strip() == row["boot_id"] != before.stdout.strip()

    p = rig.cli("power", inv, "node01", "off", "--yes", "--timeout", "120", "--format", "json")
    assert p.returncode == 0 and json.loads(p.stdout)["hosts"][0]["after"] == "Off", p.stderr
    assert rig.ssh("node01", "true").returncode != 0  # really off
    p = rig.cli("power", inv, "node01", "status", "--format", "json")
    assert json.loads(p.stdout)["hosts"][0]["before"] == "Off"
    p = rig.cli("power", inv, "node01", "on", "--timeout", "180", "--format", "json")
    assert p.returncode == 0, p.stderr
    assert rig.ssh("node01", BOOT_ID).stdout.strip() == json.loads(p.stdout)["hosts"][0]["boot_id"]


def test_bad_credentials_and_an_unreachable_bmc_fail_that_host_only(rig: Rig) -> None:
    from provisioner_testbed import rack

    inv = str(rig.h.inventory)
    p = rig.cli("power", inv, "node01", "node02", "status", password="not-the-password")
    assert p.returncode == 1
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 2 and all("refused the credentials" in ln for ln in lines), p.stderr
    rack.bmcs(rig.h.name, ["node02"], stop=True)
    try:
        p = rig.cli("power", inv, "node01", "node02", "status", "--format", "json")
        assert p.returncode == 1
        rows = {r["host"]: r for r in json.loads(p.stdout)["hosts"]}
        assert rows["node01"]["ok"] and rows["node01"]["before"] == "On"
        assert not rows["node02"]["ok"] and "unreachable" in rows["node02"]["error"]
        assert [ln for ln in p.stderr.splitlines() if ln.startswith("error:")] == [f"error: {rows['node02']['error']}"]
    finally:
        rack.bmcs(rig.h.name, ["node02"])


def _with_firmware_map(rig: Rig, tmp: Path) -> Path:
    """The rack's inventory with a `firmware` map (BIOS 2.19.1 accepted) for every GPU node."""
    inv = tmp / "inv"
    shutil.copytree(rig.h.inventory.parent, inv)
    with (inv / "group_vars" / "gpu_nodes.yml").open("a") as f:
        f.write('firmware:\n  bios: ["2.19.1"]\n')
    return inv / "hosts.ini"


def test_firmware_mismatch_names_component_and_versions(rig: Rig, tmp_path: Path) -> None:
    from provisioner_testbed import rack

    inv = _with_firmware_map(rig, tmp_path)
    rack.bmcs(rig.h.name, ["node02"], firmware={"bios": "2.18.0"})
    try:
        p = rig.cli("firmware", str(inv), "--format", "json")
        assert p.returncode == 1, p.stdout + p.stderr
        doc = json.loads(p.stdout)
        assert [(f["code"], f["host"], f["component"], f["found"], f["wanted"]) for f in doc["findings"]] == [
            ("FW010", "node02", "bios", ["2.18.0"], ["2.19.1"])]
    finally:
        rack.bmcs(rig.h.name, ["node02"], firmware={"bios": "2.19.1"})
    assert rig.cli("firmware", str(inv)).returncode == 0


def test_onboard_starts_a_powered_off_host_at_its_bmc_and_gates_firmware(rig: Rig, tmp_path: Path) -> None:
    from provisioner_testbed import rack

    inv = _with_firmware_map(rig, tmp_path)
    p = rig.cli("power", str(inv), "node01", "off", "--yes", "--timeout", "120")
    assert p.returncode == 0, p.stderr
    rack.bmcs(rig.h.name, ["node02"], firmware={"bios": "2.18.0"})
    report = tmp_path / "onboard.json"
    p = rig.cli("onboard", str(inv), "node01", "node02", "--skip-launch", "--report", str(report), timeout=1500)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "node01 is Off at its BMC: powering on" in p.stderr
    doc = json.loads(report.read_text())
    hosts = {h["host"]: h for h in doc["hosts"]} if isinstance(doc["hosts"], list) else doc["hosts"]
    n1, n2 = hosts["node01"], hosts["node02"]
    assert n1["in_service"] and n1["powered_on"] and n1["passed"][:3] == ["power", "firmware", "preflight"], n1
    assert not n2["in_service"] and n2["stage"] == "firmware", n2
    assert "FW010 node02 (bios): found 2.18.0, wanted 2.19.1" in n2["problems"][0]
    assert "node02: LEFT OUT at firmware: FW010" in p.stdout + p.stderr
    assert n1["passed"] == ["power", "firmware", "preflight", "run", "health"], n1
    assert rig.ssh("node01", "cat /etc/provisioner/in-service && test -s /etc/nccl.conf").returncode == 0
    # never provisioned: the run was limited to node01
    assert rig.ssh("node02", "test -e /etc/nccl.conf").returncode != 0


def test_the_bmc_password_is_in_no_output_and_no_run_artifact(rig: Rig) -> None:
    assert rig.outputs and all(rig.password not in o for o in rig.outputs)
    hits = []
    assert any(rig.runs.rglob("*.json")), "the onboarding run left no artifacts to check"
    for f in rig.runs.rglob("*"):
        if f.is_file() and f.stat().st_size < 50_000_000:
            try:
                if rig.password.encode() in f.read_bytes():
                    hits.append(str(f))
            except OSError:
                continue
    assert hits == []
