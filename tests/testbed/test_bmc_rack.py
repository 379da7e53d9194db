"""The rack's BMCs (issue 26): every host of rack `bmc` (PROVISIONER_BMC_RACK, 2 hosts) gets a Redfish service
(`provision testbed bmc`: sushy-tools' emulator on 127.0.0.1, TLS from the rack's BMC CA, basic auth) whose power
actions stop and start that nspawn host.

1. `provision power ... cycle` really restarts the host: its boot id changes; off makes it unreachable, on brings it
   back with SSH answering.
2. Bad credentials and an unreachable BMC are one line each and exit 1, the other host still done.
3. `provision firmware`: a host whose BMC reports another BIOS is FW010 naming component and versions.
4. `provision onboard` of a powered-off host starts at its BMC (power on, SSH, firmware gate, run, health, mark); the
   host with the wrong BIOS is left out at the firmware gate, never provisioned.
5. The node's own firmware (nvidia-smi's VBIOS, the HCAs' fw_ver) joins the BMC's: a GPU with another VBIOS is
   FW010 naming the GPU, and onboarding leaves that host out at the firmware gate before any run.
6. ACS turned on is named by preflight with the BIOS attribute behind it, read from the BMC (Bios.Attributes).
7. `provision firmware --apply bios`: a checksum that does not match the image applies nothing; the right one updates
   the hosts one after the other (Redfish SimpleUpdate), each waited for until its new version shows.
8. `provision remediate` with `remediation: [reboot, power_cycle]`: a node with a fatal XID is quarantined,
   rebooted over SSH, then power cycled through its BMC (a new boot id each time, the gate after each), stays
   quarantined while the fault stays, and is returned once it passes.
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

    def cli(self, *args: str, timeout: float = 900, vault: bool = True) -> subprocess.CompletedProcess[str]:
        # the inventory's bmc_password is vaulted (the rack's default): the vault password file comes from
        # ANSIBLE_VAULT_PASSWORD_FILE (the lane's conftest); vault=False runs without it
        env = {**os.environ, "PROVISION_RUNS_DIR": str(self.runs)}
        if not vault:
            env = {k: v for k, v in env.items() if not k.startswith("ANSIBLE_VAULT")}
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


def test_bad_credentials_and_an_unreachable_bmc_fail_that_host_only(rig: Rig, tmp_path: Path) -> None:
    from provisioner_testbed import rack

    inv = str(rig.h.inventory)
    assert "bmc_password: !vault |" in (rig.h.inventory.parent / "group_vars" / "all.yml").read_text()
    p = rig.cli("power", _with_bmc_password(rig, tmp_path, "not-the-password"), "node01", "node02", "status")
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


def _with_bmc_password(rig: Rig, tmp: Path, password: str) -> str:
    """The rack's inventory with another bmc_password, vaulted like the rack's own."""
    from provisioner_testbed import inventory_writer as invw
    from provisioner_testbed import vault

    inv = tmp / "inv-pw"
    shutil.copytree(rig.h.inventory.parent, inv)
    cipher = invw.vault_encrypter(vault.password_file())("bmc_password", password)
    with (inv / "group_vars" / "gpu_nodes.yml").open("a") as f:  # group_vars/<group> beats group_vars/all
        f.write("bmc_password: !vault |\n" + "".join(f"  {ln}\n" for ln in cipher.splitlines()))
    return str(inv / "hosts.ini")


def test_without_the_vault_password_a_bmc_command_says_so_and_validate_works(rig: Rig) -> None:
    inv = str(rig.h.inventory)
    p = rig.cli("power", inv, "node01", "status", vault=False)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr
    assert "bmc_password on host node01 is vaulted and no vault password given: provision power" in p.stderr
    p = rig.cli("validate", inv, vault=False)
    assert p.returncode == 0, p.stdout + p.stderr


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
    # the BMC's own firmware (Manager.FirmwareVersion)
    with (inv.parent / "group_vars" / "gpu_nodes.yml").open("a") as f:
        f.write('  bmc: ["1.00"]\n')
    rack.bmcs(rig.h.name, ["node01"], firmware={"bmc": "0.99"})
    try:
        p = rig.cli("firmware", str(inv), "--format", "json")
        assert p.returncode == 1
        assert [(f["code"], f["host"], f["component"], f["found"]) for f in json.loads(p.stdout)["findings"]] == [
            ("FW010", "node01", "bmc", ["0.99"])]
    finally:
        rack.bmcs(rig.h.name, ["node01"], firmware={"bmc": "1.00"})
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
    assert n1["passed"] == ["power", "firmware", "preflight", "run", "health", "burn-in"], n1
    assert rig.ssh("node01", "cat /etc/provisioner/in-service && test -s /etc/nccl.conf").returncode == 0
    # never provisioned: the run was limited to node01
    assert rig.ssh("node02", "test -e /etc/nccl.conf").returncode != 0


def test_node_reported_vbios_and_hca_firmware_are_gated(rig: Rig, tmp_path: Path) -> None:
    from provisioner_testbed import rack

    rack.bmcs(rig.h.name, ["node02"], firmware={"bios": "2.19.1"})  # the BIOS as wanted: only the node's report differs
    vbios = rig.ssh("node01", "nvidia-smi -i 3 --query-gpu=vbios_version --format=csv,noheader").stdout.strip()
    hca = rig.ssh("node01", "cat /sys/class/infiniband/mlx5_0/fw_ver").stdout.strip()
    assert vbios and hca
    inv = _with_firmware_map(rig, tmp_path)
    with (inv.parent / "group_vars" / "gpu_nodes.yml").open("a") as f:
        f.write(f'  gpu: ["{vbios}"]\n  hca: ["{hca}"]\n')
    report = tmp_path / "onboard.json"

    def findings() -> list[tuple[str, str, str | None, list[str], list[str]]]:
        p = rig.cli("firmware", str(inv), "--format", "json")
        doc = json.loads(p.stdout)
        assert p.returncode == (1 if doc["findings"] else 0), p.stdout + p.stderr
        return [(f["code"], f["host"], f["component"], f["found"], f["ids"]) for f in doc["findings"]]

    def onboard_node02() -> dict[str, Any]:
        p = rig.cli("onboard", str(inv), "node02", "--skip-launch", "--report", str(report), timeout=1500)
        assert p.returncode == 1, p.stdout + p.stderr
        n2: dict[str, Any] = json.loads(report.read_text())["hosts"]["node02"]
        assert n2["stage"] == "firmware" and not n2["in_service"], n2
        return n2

    # node02 is bare (no driver, so no nvidia-smi): its HCAs' fw_ver is readable, its VBIOS is not yet
    rack.fault(rig.h.name, "node02", ["hca_fw=mlx5_1:28.39.1002"])
    try:
        assert findings() == [("FW011", "node02", "gpu", [], []), ("FW010", "node02", "hca", ["28.39.1002"],
                                                                       ["mlx5_1"])]
        n2 = onboard_node02()  # left out before the run
        assert any("FW010 node02 (hca): found 28.39.1002" in x for x in n2["problems"]), n2
        assert rig.ssh("node02", "test -e /etc/nccl.conf").returncode != 0
    finally:
        rack.clear(rig.h.name, "node02")
    # another VBIOS on GPU 3: the gate after the run (the driver installed) leaves it out
    rack.fault(rig.h.name, "node02", ["vbios=3:96.00.11.00.01"])
    try:
        n2 = onboard_node02()
        assert any("FW010 node02 (gpu): found 96.00.11.00.01" in x and "GPU3" in x for x in n2["problems"]), n2
        assert rig.ssh("node02", "test -s /etc/nccl.conf && test ! -e /etc/provisioner/in-service").returncode == 0
        assert findings() == [("FW010", "node02", "gpu", ["96.00.11.00.01"], ["GPU3"])]
        p = rig.cli("preflight", str(inv), "--limit", "node02")  # preflight's own firmware check says the same
        assert p.returncode == 1 and f"firmware: expected gpu {vbios} (firmware map), found 96.00.11.00.01 on GPU3" \
            in p.stdout + p.stderr, p.stdout + p.stderr
    finally:
        rack.clear(rig.h.name, "node02")
    assert findings() == []


def test_acs_on_is_named_with_the_bios_attribute_the_bmc_reports(rig: Rig) -> None:
    from provisioner_testbed import rack

    rack.fault(rig.h.name, "node01", ["acs_on=0"])
    try:
        p = rig.cli("preflight", str(rig.h.inventory), "--limit", "node01")
        assert p.returncode == 1, p.stdout + p.stderr
        line = next(ln for ln in (p.stdout + p.stderr).splitlines() if "ACS redirect on at bridge" in ln)
        assert "BIOS attribute PcieAcsControl=Enabled at the BMC: set it Disabled" in line, line
    finally:
        rack.clear(rig.h.name, "node01")


class _ImageServer:
    """The site's firmware server: HTTPS on 127.0.0.1 with the rack's BMC CA's certificate."""

    def __init__(self, root: Path, tls_dir: Path) -> None:
        import functools
        import http.server
        import ssl
        import threading

        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(tls_dir / "server.pem", tls_dir / "server.key")
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_firmware_apply_checks_the_image_then_updates_one_host_at_a_time(rig: Rig, tmp_path: Path) -> None:
    import hashlib

    from provisioner_testbed import bmc, rack

    rack.bmcs(rig.h.name, firmware={"bios": "2.19.1"})
    (tmp_path / "img").mkdir()
    image = tmp_path / "img" / "bios-2.20.1.bin"
    image.write_bytes(os.urandom(256 * 1024))
    digest = hashlib.sha256(image.read_bytes()).hexdigest()
    ca = bmc.bmc_dir(rig.h.name) / "ca.pem"
    srv = _ImageServer(image.parent, bmc.bmc_dir(rig.h.name))
    inv = str(rig.h.inventory)
    base = ["firmware", inv, "--apply", "bios", "--image-uri", f"{srv.url}/{image.name}", "--image-ca", str(ca),
            "--yes", "--timeout", "120"]
    try:
        p = rig.cli(*base, "--sha256", "0" * 64)
        assert p.returncode == 1 and f"sha256 {digest}, expected {'0' * 64}: nothing applied" in p.stderr, p.stderr
        assert "APPLYING" not in p.stderr
        p = rig.cli("firmware", inv, "--format", "json")
        assert {i["version"] for h in json.loads(p.stdout)["hosts"].values() for i in h["items"]
                if i["component"] == "bios"} == {"2.19.1"}  # untouched
        p = rig.cli(*base, "--sha256", digest, "--format", "json")
        assert p.returncode == 0, p.stdout + p.stderr
        rows = json.loads(p.stdout)["hosts"]
        assert [(r["host"], r["before"], r["after"], r["status"]) for r in rows] == [
            ("node01", "2.19.1", "2.20.1", "updated"), ("node02", "2.19.1", "2.20.1", "updated")]
        p = rig.cli("firmware", inv, "--format", "json")
        assert {i["version"] for h in json.loads(p.stdout)["hosts"].values() for i in h["items"]
                if i["component"] == "bios"} == {"2.20.1"}
    finally:
        srv.close()
        rack.bmcs(rig.h.name, firmware={"bios": "2.19.1"})


def _state(rig: Rig, inv: Path, host: str) -> str:
    p = rig.cli("status", str(inv), "--format", "json")
    assert p.returncode == 0, p.stderr
    return next(h["state"] for h in json.loads(p.stdout)["hosts"] if h["host"] == host)


def test_remediation_reboots_then_power_cycles_through_the_bmc_and_returns_the_node(rig: Rig, tmp_path: Path) -> None:
    from provisioner_testbed import rack

    inv = _with_firmware_map(rig, tmp_path)
    with (inv.parent / "group_vars" / "gpu_nodes.yml").open("a") as f:
        f.write("lifecycle_policy:\n  quarantine_on: [xid]\n  remediation: [reboot, power_cycle]\n"
                "  replace_after: {quarantines: 9, window_days: 30}\n")
    if _state(rig, inv, "node01") != "in-service":  # run alone: bring node01 in first
        p = rig.cli("onboard", str(inv), "node01", "--skip-launch", timeout=1500)
        assert p.returncode == 0, p.stdout + p.stderr
    before = rig.ssh("node01", BOOT_ID).stdout.strip()
    rack.fault(rig.h.name, "node01", ["xid=79"])
    try:
        p = rig.cli("health", str(inv), "--limit", "node01")
        assert p.returncode == 1 and "xid" in p.stdout, p.stdout + p.stderr
        p = rig.cli("remediate", str(inv), "--limit", "node01", "--format", "json", timeout=1200)
        assert p.returncode == 0, p.stdout + p.stderr
        lines = [a["line"] for a in json.loads(p.stdout)["actions"]]
        text = "\n".join(lines)
        assert "node01: in-service -> draining" in text and "-> quarantined (xid" in text, text
        # the reboot over SSH first, its gate failing (the XID stays until the rack clears it), then the BMC
        assert "node01: reboot: done (back after a reboot)" in text, text
        assert "node01: power_cycle: done (back after a reboot)" in text, text
        assert text.index("node01: reboot: done") < text.index("node01: power_cycle: done"), text
        assert text.count("node01: health gate: fail") == 2, text
        assert "remediation exhausted (reboot, power_cycle)" in text, text
        after = rig.ssh("node01", BOOT_ID).stdout.strip()
        assert after and after != before  # the BMC really restarted it
        assert _state(rig, inv, "node01") == "quarantined"
        assert rig.ssh("node01", "test -e /etc/provisioner/in-service").returncode != 0  # the mark is gone
    finally:
        rack.clear(rig.h.name, "node01")
    assert rig.cli("health", str(inv), "--limit", "node01").returncode == 0
    p = rig.cli("remediate", str(inv), "--limit", "node01")
    assert p.returncode == 0 and "node01: return to service" in p.stdout, p.stdout + p.stderr
    assert _state(rig, inv, "node01") == "in-service"
    assert rig.ssh("node01", "test -e /etc/provisioner/in-service").returncode == 0


def test_the_bmc_password_is_in_no_output_and_no_run_artifact(rig: Rig) -> None:
    from provisioner_testbed import vault

    vault_pw = vault.password_file().read_text().strip()
    assert rig.outputs and all(rig.password not in o and vault_pw not in o for o in rig.outputs)
    hits = []
    assert any(rig.runs.rglob("*.json")), "the onboarding run left no artifacts to check"
    for f in rig.runs.rglob("*"):
        if f.is_file() and f.stat().st_size < 50_000_000:
            try:
                if rig.password.encode() in (data := f.read_bytes()) or vault_pw.encode() in data:
                    hits.append(str(f))
            except OSError:
                continue
    assert hits == []
