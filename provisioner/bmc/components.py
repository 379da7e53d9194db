"""Firmware component names of the `firmware` inventory map, and which Redfish FirmwareInventory member is which.

Pure and stdlib-only: the rules (provisioner/rules/firmware.py) check the map's keys against COMPONENTS, and
`classify` sorts what a BMC reports (`UpdateService/FirmwareInventory` members: Id and Name differ per vendor) into
the same names. Data, first match wins: the HGX baseboard's own items (`HGX_FW_GPU_SXM_1`, `HGX_FW_BMC_0`...) before
the host's generic ones.
"""

from __future__ import annotations

import re

#: component -> what it is (docs/bmc.md lists the same table)
COMPONENTS: dict[str, str] = {
    "bmc": "the host's BMC firmware (Manager.FirmwareVersion when no FirmwareInventory member matches)",
    "bios": "system BIOS/UEFI (ComputerSystem.BiosVersion when no FirmwareInventory member matches)",
    "cpld": "board CPLD(s)",
    "gpu": "GPU firmware / VBIOS (HGX_FW_GPU_*; also what nvidia-smi -q reports as VBIOS Version)",
    "nvswitch": "NVSwitch firmware (HGX_FW_NVSwitch_*)",
    "pcie_retimer": "PCIe retimers (HGX_FW_PCIeRetimer_*)",
    "pcie_switch": "PCIe switches (HGX_FW_PCIeSwitch_*)",
    "erot": "external roots of trust (HGX_FW_ERoT_*)",
    "hgx_bmc": "the HGX baseboard's own BMC (HGX_FW_BMC_*)",
    "fpga": "baseboard FPGA (HGX_FW_FPGA_*)",
    "nic": "network adapters (ConnectX, BlueField, Ethernet)",
    "hca": "InfiniBand HCAs (what ibv_devinfo reports as fw_ver)",
    "psu": "power supplies",
    "nvme": "NVMe drives",
}

_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple((c, re.compile(p, re.IGNORECASE)) for c, p in (
    ("gpu", r"hgx_fw_gpu|\bgpu"),
    ("nvswitch", r"nvswitch"),
    ("pcie_retimer", r"retimer"),
    ("pcie_switch", r"pcie_?switch|pcieswitch"),
    ("erot", r"erot"),
    ("hgx_bmc", r"hgx_fw_bmc"),
    ("fpga", r"fpga"),
    ("cpld", r"cpld"),
    ("bios", r"bios|uefi|system rom"),
    ("bmc", r"bmc|idrac|remote access controller|\bilo\b|\bxcc\b"),
    ("hca", r"infiniband|\bhca\b"),
    ("nic", r"\bnic\b|ethernet|network|connectx|bluefield"),
    ("psu", r"\bpsu|power supply"),
    ("nvme", r"nvme|\bssd\b|\bdisk\b|\bdrive\b"),
))

# a version as firmware reports it: 7.00.00.00, 2.13.1-rc2, 96.00.89.00.01, 1.0(3), U46_v2.10, 28.39.1002
_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+:~()/-]*")
VERSION_MAX = 64


def classify(member_id: str, name: str = "") -> str | None:
    """The component a FirmwareInventory member (its Id and Name) is, or None when no pattern knows it."""
    text = f"{member_id} {name}"
    for component, pattern in _PATTERNS:
        if pattern.search(text):
            return component
    return None


def version_problem(v: object) -> str | None:
    """Why `v` is not an accepted-version string (None when it is one)."""
    if isinstance(v, bool) or not isinstance(v, str):
        kind = "a number" if isinstance(v, (int, float)) and not isinstance(v, bool) else type(v).__name__
        hint = f"; quote it: '{v}'" if kind == "a number" else ""
        return f"{v!r} is {kind}, not a version string (YAML reads 1.10 as 1.1){hint}"
    if not v.strip():
        return "an empty version string"
    if len(v) > VERSION_MAX:
        return f"{v[:20]!r}... is longer than {VERSION_MAX} characters"
    if not _VERSION.fullmatch(v):
        return f"{v!r} is not a version (letters, digits and . _ + : ~ ( ) / - only, no spaces)"
    return None
