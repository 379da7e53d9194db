"""The fleet's firmware as its BMCs report it, against the inventory's `firmware` map (pure).

`compare(report, wanted)` gives FW010 (a version not accepted), FW011 (a wanted component the BMC does not report);
FW012 (the BMC could not be read, or the host has none) comes from the command. These are findings of a check that
talks to hardware, not inventory rules: `provision validate` never reports them.
"""

from __future__ import annotations

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
    source: str = "FirmwareInventory"  # or Manager.FirmwareVersion / ComputerSystem.BiosVersion


@dataclass(frozen=True)
class HostFirmware:
    host: str
    items: tuple[Item, ...] = ()
    error: str | None = None  # one line: why the BMC could not be read (never a credential)

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
        return [FirmwareFinding("FW012", report.host, report.error)]
    by: dict[str, dict[str, list[str]]] = {}
    for it in report.items:
        if it.component:
            by.setdefault(it.component, {}).setdefault(it.version, []).append(it.id)
    for comp, accepted in wanted.items():
        found = by.get(comp)
        if not found:
            out.append(FirmwareFinding(
                "FW011", report.host, f"the BMC reports no {comp} firmware (wanted {' or '.join(accepted)}): "
                "check the BMC exposes it, or drop it from this host's firmware map", comp, (), accepted))
            continue
        for version, ids in found.items():
            if version in accepted:
                continue
            on = f" on {len(ids)} item(s): {', '.join(ids[:4])}{'...' if len(ids) > 4 else ''}"
            out.append(FirmwareFinding(
                "FW010", report.host, f"found {version}, wanted {' or '.join(accepted)}{on}: update the firmware "
                f"or add {version!r} to firmware.{comp}", comp, (version,), accepted, tuple(ids)))
    return out
