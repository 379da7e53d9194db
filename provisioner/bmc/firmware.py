"""The fleet's firmware as its BMCs report it, against the inventory's `firmware` map (pure).

`compare(report, wanted)` gives FW010 (a version not accepted), FW011 (a wanted component nobody reports), FW012
(the BMC could not be read). What the node itself reports (`nvidia-smi` VBIOS, the HCAs' fw_ver: `items_from_node`)
joins the BMC's items. These are findings of a check that talks to hardware, not inventory rules: `provision
validate` never reports them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from provisioner.bmc.components import COMPONENTS, classify, version_problem


@dataclass(frozen=True)
class Item:
    """One firmware inventory entry: which component, the BMC's Id/Name for it, and its version."""

    component: str | None
    id: str
    name: str
    version: str
    source: str = "FirmwareInventory"  # or Manager / ComputerSystem (the fallbacks), node (items_from_node)


@dataclass(frozen=True)
class HostFirmware:
    host: str
    items: tuple[Item, ...] = ()
    error: str | None = None  # one line: why the BMC could not be read (never a credential)
    node_error: str | None = None  # one line: why the node's own report could not be read (when it was asked)

    def versions(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for it in self.items:
            if it.component:
                out.setdefault(it.component, [])
                if it.version not in out[it.component]:
                    out[it.component].append(it.version)
        return out


@dataclass(frozen=True)
class FirmwareFinding:
    code: str  # FW010 / FW011 / FW012
    host: str
    message: str
    component: str | None = None
    found: tuple[str, ...] = ()
    wanted: tuple[str, ...] = ()
    ids: tuple[str, ...] = field(default=())

    def line(self) -> str:
        return f"{self.code} {self.host}{f' ({self.component})' if self.component else ''}: {self.message}"

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["found"], d["wanted"], d["ids"] = list(self.found), list(self.wanted), list(self.ids)
        return d


def items_from_inventory(members: Iterable[Mapping[str, Any]]) -> list[Item]:
    """FirmwareInventory members (their JSON: Id, Name, Version) as Items; members without a Version are left out."""
    out = []
    for m in members:
        version = m.get("Version")
        if not isinstance(version, str) or not version:
            continue
        mid = str(m.get("Id") or "")
        name = str(m.get("Name") or "")
        out.append(Item(classify(mid, name), mid, name, version))
    return out


#: components the node reports itself (the rest only the BMC knows)
NODE_COMPONENTS: tuple[str, ...] = ("gpu", "hca")
#: one exec on the node: `gpu INDEX VBIOS` per GPU, `hca NAME FW_VER` per InfiniBand device (needs no root)
NODE_COMMAND = (
    "nvidia-smi --query-gpu=index,vbios_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu /; s/, / /'; "
    "for f in /sys/class/infiniband/*/fw_ver; do [ -r \"$f\" ] || continue; d=${f%/fw_ver}; "
    "echo \"hca ${d##*/} $(cat \"$f\")\"; done; true")


def node_part(wanted: Mapping[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """The entries of a usable firmware map (`wanted_map`) that the node reports itself (gpu, hca)."""
    return {c: v for c, v in wanted.items() if c in NODE_COMPONENTS}


def items_from_node(stdout: str) -> list[Item]:
    """The NODE_COMMAND's output as Items (component gpu / hca, source node); lines it does not know are skipped.
    EFA devices (fw_ver 0.0.0.0, no firmware to judge) are left out."""
    out = []
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) != 3 or parts[0] not in NODE_COMPONENTS or version_problem(parts[2]) \
                or not _NODE_ID.fullmatch(parts[1]):
            continue  # what a node sends is data: an unknown or odd line is skipped
        kind, ident, version = parts
        if kind == "hca" and (ident.startswith(("efa", "rdmap")) or version == "0.0.0.0"):
            continue
        name = "nvidia-smi vbios_version" if kind == "gpu" else "/sys/class/infiniband fw_ver"
        out.append(Item(kind, f"GPU{ident}" if kind == "gpu" else ident, name, version, "node"))
    return out


def with_fallbacks(items: list[Item], bios_version: str | None, bmc_version: str | None) -> list[Item]:
    """Add ComputerSystem.BiosVersion / Manager.FirmwareVersion when no FirmwareInventory member is bios / bmc
    (BMCs without an UpdateService, and sushy-tools' emulator, report only these)."""
    have = {it.component for it in items}
    out = list(items)
    if bios_version and "bios" not in have:
        out.append(Item("bios", "BiosVersion", "ComputerSystem.BiosVersion", bios_version, "ComputerSystem"))
    if bmc_version and "bmc" not in have:
        out.append(Item("bmc", "FirmwareVersion", "Manager.FirmwareVersion", bmc_version, "Manager"))
    return out


def wanted_map(value: Any) -> dict[str, tuple[str, ...]]:
    """The usable part of a host's `firmware` variable (what the FW00x rules accept; the rest is theirs to report)."""
    if not isinstance(value, Mapping):
        return {}
    out: dict[str, tuple[str, ...]] = {}
    for comp, versions in value.items():
        if comp in COMPONENTS and isinstance(versions, (list, tuple)):
            ok = tuple(v for v in versions if version_problem(v) is None)
            if ok:
                out[str(comp)] = ok
    return out


def compare(report: HostFirmware, wanted: Mapping[str, tuple[str, ...]]) -> list[FirmwareFinding]:
    """FW010 for each version of a wanted component that is not accepted (with the members that report it), FW011
    for a wanted component the BMC does not report. A component not in `wanted` is shown, never judged."""
    out: list[FirmwareFinding] = []
    if report.error is not None:
        out.append(FirmwareFinding("FW012", report.host, report.error))
        if not report.items:
            return out
    by: dict[str, dict[str, list[str]]] = {}
    for it in report.items:
        if it.component:
            by.setdefault(it.component, {}).setdefault(it.version, []).append(it.id)
    for comp, accepted in wanted.items():
        found = by.get(comp)
        if not found:
            if report.error is not None and comp not in NODE_COMPONENTS:
                continue  # the BMC could not be read: FW012 says so
            who = "neither the BMC nor the node reports" if comp in NODE_COMPONENTS else "the BMC reports no"
            node = f" (node: {report.node_error})" if comp in NODE_COMPONENTS and report.node_error else ""
            out.append(FirmwareFinding(
                "FW011", report.host, f"{who} {comp} firmware{node} (wanted {' or '.join(accepted)}): "
                "check it is exposed, or drop it from this host's firmware map", comp, (), accepted))
            continue
        for version, ids in found.items():
            if version in accepted:
                continue
            on = f" on {len(ids)} item(s): {', '.join(ids[:4])}{'...' if len(ids) > 4 else ''}"
            out.append(FirmwareFinding(
                "FW010", report.host, f"found {version}, wanted {' or '.join(accepted)}{on}: update the firmware "
                f"or add {version!r} to firmware.{comp}", comp, (version,), accepted, tuple(ids)))
    return out


def merged(report: HostFirmware, node_items: list[Item], node_error: str | None) -> HostFirmware:
    """`report` (the BMC's) with what the node reported added."""
    return HostFirmware(report.host, (*report.items, *node_items), report.error, node_error)


#: components `provision firmware --apply` can update (Redfish SimpleUpdate targets: the system, its manager)
APPLY_COMPONENTS: tuple[str, ...] = ("bios", "bmc")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_NODE_ID = re.compile(r"[A-Za-z0-9_.:-]{1,64}")  # a GPU index or an HCA name, as the node prints it
_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")


def sha256_problem(value: str) -> str | None:
    """Why `value` is not a sha256 hex digest (None when it is one)."""
    return None if _SHA256.fullmatch(value.strip().lower()) else f"{value[:20]!r}... is not a sha256 (64 hex digits)"


def acs_attributes(attrs: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The BIOS attributes about PCIe ACS (names vary per vendor: an `ACS` word, or Access Control Services)."""
    out = []
    for name, value in attrs.items():
        words = [w.lower() for w in _WORDS.findall(str(name))]
        if "acs" in words or "accesscontrolservices" in "".join(words):
            out.append((str(name), str(value)))
    return out


def acs_hint(attrs: Mapping[str, Any]) -> str | None:
    """What to add to an ACS finding from the BMC's BIOS attributes: the attribute and its value, or None when the
    BMC exposes none."""
    found = acs_attributes(attrs)
    if not found:
        return None
    on = [(n, v) for n, v in found if v.lower() in ("enabled", "enable", "on", "true", "1", "auto")]
    if on:
        return ("BIOS attribute " + ", ".join(f"{n}={v}" for n, v in on) +
                " at the BMC: set it Disabled (the BIOS sets ACS at boot), then power cycle")
    return ("BIOS attribute " + ", ".join(f"{n}={v}" for n, v in found) +
            " at the BMC: ACS is set on by the OS or another setting (an IOMMU, setpci)")
