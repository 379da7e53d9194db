"""`provision power` / `provision firmware` usage errors (in-process: each stops before any BMC is contacted).
Against a real Redfish service: tests/integration/test_bmc_emulator.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli_inproc import provision
from inventory_factory import write_inventory

BMC = {"bmc_address": "10.1.0.1", "bmc_username": "admin", "bmc_password_env": "BMC_PASSWORD"}


@pytest.mark.parametrize(("args", "needle"), [
    (["n1"], "expected HOST... on|off|cycle|status"),
    (["n1", "reboot"], "expected HOST... on|off|cycle|status"),
    (["n1", "off"], "add --yes"),
    (["n1", "cycle"], "add --yes"),
    (["n1", "status", "--boot", "pxe"], "--boot goes with on or cycle"),
    (["nosuchhost", "status"], "no hosts match nosuchhost"),
])
def test_power_usage_errors_are_one_line(tmp_path: Path, args: list[str], needle: str) -> None:
    inv = write_inventory(tmp_path, host_vars={"n1": BMC})
    p = provision("power", str(inv), *args)
    assert p.returncode == 2, p.stdout + p.stderr
    assert needle in p.stderr and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_firmware_without_bmc_hosts_is_a_usage_error(tmp_path: Path) -> None:
    p = provision("firmware", str(write_inventory(tmp_path)))
    assert p.returncode == 2 and "no hosts with bmc_address or firmware" in p.stderr


def test_host_without_credentials_fails_before_any_connection(tmp_path: Path) -> None:
    inv = write_inventory(tmp_path, host_vars={"n1": {**BMC, "bmc_password_env": "UNSET_BMC_PW_FOR_TEST"}})
    p = provision("power", str(inv), "n1", "status")
    assert p.returncode == 1
    assert "error: n1: bmc_password_env names UNSET_BMC_PW_FOR_TEST, which is not set" in p.stderr


SHA = "a" * 64


@pytest.mark.parametrize(("args", "needle"), [
    (["--apply", "bios"], "--apply needs --image-uri and --sha256"),
    (["--apply", "nvme", "--image-uri", "https://fw.example/x.bin", "--sha256", SHA, "--yes"],
     "--apply 'nvme': one of bios, bmc"),
    (["--apply", "bios", "--image-uri", "ftp://fw.example/x.bin", "--sha256", SHA, "--yes"], "an https:// URL"),
    (["--apply", "bios", "--image-uri", "https://fw.example/x.bin", "--sha256", "abc", "--yes"],
     "is not a sha256"),
    (["--apply", "bios", "--image-uri", "https://fw.example/x.bin", "--sha256", SHA], "add --yes"),
    (["--yes"], "go with --apply"),
])
def test_firmware_apply_usage_errors_touch_nothing(tmp_path: Path, args: list[str], needle: str) -> None:
    inv = write_inventory(tmp_path, host_vars={"n1": BMC})
    p = provision("firmware", str(inv), *args)
    assert p.returncode == 2, p.stdout + p.stderr
    assert needle in p.stderr and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_acs_bios_attributes_are_found_whatever_the_vendor_calls_them() -> None:
    from provisioner.bmc.firmware import acs_attributes, acs_hint, sha256_problem

    attrs = {"PcieAcsControl": "Enabled", "ACSEnable": "Disabled", "Pcie_ACS": "x", "AccessControlServices": "On",
             "Bacs": "no", "SriovGlobalEnable": "Enabled", "BootMode": "Uefi"}
    assert [n for n, _ in acs_attributes(attrs)] == ["PcieAcsControl", "ACSEnable", "Pcie_ACS",
                                                       "AccessControlServices"]
    hint = acs_hint(attrs)
    assert hint is not None and hint.startswith("BIOS attribute PcieAcsControl=Enabled, AccessControlServices=On at "
                                                "the BMC: set it Disabled")
    assert "another setting" in (acs_hint({"PcieAcsControl": "Disabled"}) or "")
    assert acs_hint({"BootMode": "Uefi"}) is None
    assert sha256_problem(SHA) is None and sha256_problem("A" * 64) is None and sha256_problem("g" * 64)
