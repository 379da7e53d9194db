"""Materialize a simulated node's hardware into the directory bind-mounted at `/var/lib/hwsim` on the host.

`materialize(spec, dest)` resolves the spec (`provisioner_testbed.hwspec.resolve`) and writes, each file replaced
atomically in place (so a live read-only bind mount sees the change at once, never a half-written file):

- `spec.json`: the resolved spec the stand-in tools read (written last);
- `sys/class/infiniband/<hca>/...`: sysfs-shaped HCA files (`ports/1/state` = `4: ACTIVE`, `rate` =
  `400 Gb/sec (4X NDR)`, `node_guid`, ...), and the EFA devices `sys/class/infiniband/rdmap*/...` (link layer
  `Unspecified`);
- `sys/module/nvidia/version`, `proc/driver/nvidia/version`: what the loaded kernel module reports;
- `kmsg` (records as `/dev/kmsg` yields them) and `dmesg` (as `dmesg` prints them): driver load lines, NVRM Xid
  lines, failed-GPU init lines;
- `lspci` (what `lspci -D -vvv` prints as root: the PCIe bridges above the GPUs and HCAs with their `ACSCtl:` bits),
  `proc/cmdline` and `sys/kernel/iommu_groups/<n>/type` (the IOMMU mode).

See README.md next to this file for the spec and every fault.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from provisioner_testbed import hwspec

_BUILD = "(dvs-builder@U22-I3-AE18-23-3)  Wed Sep 24 09:24:00 UTC 2025"
_DERIVED_TREES = ("sys", "proc")


def _write(path: Path, text: str, written: set[Path]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    written.add(path)
    try:
        if path.read_text() == text:
            return
    except OSError:
        pass
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _short_pci(bus_id: str) -> str:
    """`00000000:9D:00.0` -> `0000:9d:00` (the form NVRM prints in Xid lines)."""
    domain, bus, devfn = bus_id.lower().split(":")
    return f"{domain[-4:]}:{bus}:{devfn.split('.')[0]}"


def _full_pci(bus_id: str) -> str:
    """`00000000:9D:00.0` -> `0000:9d:00.0`."""
    domain, bus, devfn = bus_id.lower().split(":")
    return f"{domain[-4:]}:{bus}:{devfn}"


def kernel_log(spec: Mapping[str, Any]) -> list[tuple[int, str]]:
    """(log level, message) lines the simulated kernel logged since boot, in order."""
    module = spec["driver"]["kernel_module_version"]
    lines: list[tuple[int, str]] = [
        (6, "nvidia-nvlink: Nvlink Core is being initialized, major device number 508"),
        (5, f"NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  {module}  Release Build  {_BUILD}"),
    ]
    for gpu in spec["gpus"]:
        lines.append((6, f"NVRM: GPU at PCI:{_short_pci(gpu['pci_bus_id'])}: {gpu['uuid']}"))
    for bus in spec.get("gpus_missing", []):
        lines.append((3, f"NVRM: GPU {_full_pci(bus)}: RmInitAdapter failed! (0x62:0x55:2477)"))
        lines.append((3, f"NVRM: GPU {_full_pci(bus)}: rm_init_adapter failed, device minor number "
                         f"{len(spec['gpus'])}"))
    for hca in spec["hcas"]:
        for port in hca["ports"]:
            if port["state"] != "ACTIVE":
                lines.append((6, f"mlx5_core {hca['pci']} {hca['netdev']}: Link down"))
    for xid in spec["xids"]:
        text = xid["text"]
        if not text.startswith("pid="):
            text = f"pid='<unknown>', name=<unknown>, {text}"
        lines.append((4, f"NVRM: Xid (PCI:{_short_pci(xid['pci_bus_id'])}): {xid['code']}, {text}"))
        if xid["code"] == 79:
            lines.append((4, f"NVRM: GPU {_full_pci(xid['pci_bus_id'])}: GPU has fallen off the bus."))
    return lines


def _kmsg_and_dmesg(spec: Mapping[str, Any]) -> tuple[str, str]:
    kmsg, dmesg = [], []
    usec = 4_210_337
    for seq, (level, msg) in enumerate(kernel_log(spec), start=1201):
        kmsg.append(f"{level},{seq},{usec},-;{msg}\n")
        dmesg.append(f"[{usec // 1_000_000:5d}.{usec % 1_000_000:06d}] {msg}\n")
        usec += 1_873_112
    return "".join(kmsg), "".join(dmesg)


def _ib_files(spec: Mapping[str, Any]) -> dict[str, str]:
    node = spec["node"]
    files: dict[str, str] = {}
    for hca in spec["hcas"]:
        base = f"sys/class/infiniband/{hca['name']}"
        files.update({
            f"{base}/node_guid": hca["node_guid"] + "\n",
            f"{base}/sys_image_guid": hca["sys_image_guid"] + "\n",
            f"{base}/fw_ver": hca["fw_ver"] + "\n",
            f"{base}/hca_type": hca["hca_type"] + "\n",
            f"{base}/board_id": hca["board_id"] + "\n",
            f"{base}/node_type": "1: CA\n",
            f"{base}/node_desc": f"{node} {hca['name']}\n",
            f"{base}/device/numa_node": f"{hca['numa_node']}\n",
            f"{base}/device/local_cpulist": hca["cpu_affinity"] + "\n",
            f"{base}/device/uevent": f"DRIVER=mlx5_core\nPCI_SLOT_NAME={hca['pci']}\n",
        })
        any_up = any(p["state"] == "ACTIVE" for p in hca["ports"])
        netdev = f"{base}/device/net/{hca['netdev']}"
        files[f"{netdev}/operstate"] = ("up" if any_up else "down") + "\n"
        files[f"{netdev}/dev_port"] = "0\n"
        for port in hca["ports"]:
            p = f"{base}/ports/{port['port']}"
            files.update({
                f"{p}/state": f"{hspec_state(port['state'])}\n",
                f"{p}/phys_state": f"{hwspec.PHYS_STATES[port['phys_state']]}: {port['phys_state']}\n",
                f"{p}/rate": f"{port['rate']} Gb/sec ({hwspec.IB_RATES[port['rate']]})\n",
                f"{p}/link_layer": port["link_layer"] + "\n",
                f"{p}/lid": f"0x{port['lid']:x}\n",
                f"{p}/sm_lid": f"0x{port['sm_lid']:x}\n",
                f"{p}/lid_mask_count": "0\n",
                f"{p}/sm_sl": "0\n",
                f"{p}/cap_mask": "0xa751e848\n",
            })
    return files


def _efa_files(spec: Mapping[str, Any]) -> dict[str, str]:
    """EFA devices as the efa kernel module shows them: `rdmap*` under /sys/class/infiniband, link layer
    `Unspecified` (not InfiniBand, not Ethernet), one port each."""
    files: dict[str, str] = {}
    for dev in spec.get("efa", []):
        base = f"sys/class/infiniband/{dev['name']}"
        files.update({
            f"{base}/node_guid": dev["node_guid"] + "\n",
            f"{base}/fw_ver": dev["fw_ver"] + "\n",
            f"{base}/node_type": "1: CA\n",
            f"{base}/node_desc": f"{spec['node']} {dev['name']}\n",
            f"{base}/device/numa_node": f"{dev['numa_node']}\n",
            f"{base}/device/uevent": f"DRIVER=efa\nPCI_SLOT_NAME={dev['pci']}\n",
            f"{base}/ports/1/state": f"{hspec_state(dev['state'])}\n",
            f"{base}/ports/1/phys_state": f"{hwspec.PHYS_STATES[dev['phys_state']]}: {dev['phys_state']}\n",
            f"{base}/ports/1/rate": f"{dev['rate']} Gb/sec ({hwspec.IB_RATES[dev['rate']]})\n",
            f"{base}/ports/1/link_layer": "Unspecified\n",
        })
    return files


def hspec_state(state: str) -> str:
    return f"{hwspec.PORT_STATES[state]}: {state}"


def _driver_files(spec: Mapping[str, Any]) -> dict[str, str]:
    module = spec["driver"]["kernel_module_version"]
    return {
        "sys/module/nvidia/version": module + "\n",
        "proc/driver/nvidia/version": (
            f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {module}  Release Build  {_BUILD}\n"
            "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1) \n"),
    }


def _modules(spec: Mapping[str, Any]) -> str:
    """`/proc/modules` of the simulated kernel: the NVIDIA modules, the mlx5/IB stack where the node has HCAs (with
    ib_umad, which NVLSM needs), `efa` where it has EFA devices."""
    mods = ["nvidia_uvm", "nvidia_modeset", "nvidia"]
    if spec["hcas"]:
        mods += ["mlx5_ib", "ib_umad", "ib_uverbs", "ib_core", "mlx5_core"]
    if spec.get("efa"):
        mods += ["efa", "ib_uverbs", "ib_core"] if not spec["hcas"] else ["efa"]
    return "".join(f"{m} 1 0 - Live 0x0000000000000000\n" for m in dict.fromkeys(mods))


#: lspci's names for the simulated GPUs (pci.ids); an id it does not know prints as `Device <id>`, as lspci does.
_LSPCI_GPU = {"0x233010DE": "GH100 [H100 SXM5 80GB]", "0x233510DE": "GH100 [H200 SXM 141GB]",
              "0x290110DE": "GB100 [B200]"}
_ACS_CAP = "SrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl+ DirectTrans+"
_ACS_OFF = "SrcValid- TransBlk- ReqRedir- CmpltRedir- UpstreamFwd- EgressCtrl- DirectTrans-"
#: what Linux (and a BIOS with ACS enabled) sets on a downstream port: peer requests and completions go upstream
_ACS_ON = "SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-"


def _pci_key(address: str) -> tuple[int, int, int, int]:
    dom, bus, devfn = address.split(":")
    dev, fn = devfn.split(".")
    return int(dom, 16), int(bus, 16), int(dev, 16), int(fn, 16)


def lspci(spec: Mapping[str, Any]) -> str:
    """What `lspci -D -vvv` prints as root for the simulated PCIe tree (abridged to the lines tools read: the class and
    name, `Bus:` of bridges, the Express and ACS capabilities, NUMA node, the driver in use), in PCI order."""
    blocks: list[tuple[str, str]] = []
    for b in spec.get("pcie", []):
        addr = b["address"]
        if b["role"] == "root_port":
            head, express = "Intel Corporation Device 352a (rev 04)", "Root Port (Slot+)"
        else:
            head = "Broadcom / LSI PEX890xx PCIe Gen 5 Switch (rev b0)"
            express = "Upstream Port" if b["role"] == "upstream" else "Downstream Port (Slot+)"
        lines = [f"{addr} PCI bridge: {head} (prog-if 00 [Normal decode])",
                 "\tControl: I/O+ Mem+ BusMaster+ SpecCycle- MemWINV- VGASnoop- ParErr- Stepping- SERR+ FastB2B- "
                 "DisINTx+",
                 f"\tBus: primary={_pci_key(addr)[1]:02x}, secondary={b['secondary']:02x}, "
                 f"subordinate={b['subordinate']:02x}, sec-latency=0",
                 f"\tCapabilities: [40] Express (v2) {express}, MSI 00"]
        if b["acs"]:
            lines += ["\tCapabilities: [220 v1] Access Control Services",
                      f"\t\tACSCap:\t{_ACS_CAP}",
                      f"\t\tACSCtl:\t{_ACS_ON if b['acs_redirect'] else _ACS_OFF}"]
        lines.append("\tKernel driver in use: pcieport")
        blocks.append((addr, "\n".join(lines)))
    for g in spec.get("pci_gpus", []):
        addr = _full_pci(g["pci_bus_id"])
        dev_id = g["device_id"][2:6].lower()
        name = _LSPCI_GPU.get(g["device_id"], f"Device {dev_id}")
        blocks.append((addr, "\n".join([
            f"{addr} 3D controller: NVIDIA Corporation {name} (rev a1)",
            "\tSubsystem: NVIDIA Corporation Device 16c1",
            f"\tNUMA node: {g['numa_node']}",
            "\tCapabilities: [60] Express (v2) Endpoint, MSI 00",
            "\tKernel driver in use: nvidia"])))
    for h in spec["hcas"]:
        blocks.append((h["pci"], "\n".join([
            f"{h['pci']} Infiniband controller: Mellanox Technologies MT2910 Family [ConnectX-7]",
            "\tSubsystem: Mellanox Technologies Device 0051",
            f"\tNUMA node: {h['numa_node']}",
            "\tCapabilities: [60] Express (v2) Endpoint, MSI 00",
            "\tKernel driver in use: mlx5_core"])))
    return "".join(text + "\n\n" for _, text in sorted(blocks, key=lambda b: _pci_key(b[0])))


_CMDLINE = "BOOT_IMAGE=/boot/vmlinuz-6.1.0-40-amd64 root=UUID=3f1c2a9e-51c4-4f0e-9b7a-2d8e6c0a1b55 ro quiet"


def _iommu_files(spec: Mapping[str, Any]) -> dict[str, str]:
    """`proc/cmdline` (always: the host's own /proc/cmdline is the machine's) and, with an IOMMU on, one
    `sys/kernel/iommu_groups/<n>/type` per PCI function (`identity` = passthrough, `DMA-FQ` = translated)."""
    mode = spec.get("iommu", "off")
    args = {"off": "", "passthrough": " intel_iommu=on iommu=pt", "translated": " intel_iommu=on"}[mode]
    files = {"proc/cmdline": _CMDLINE + args + "\n"}
    if mode != "off":
        n = len(spec.get("pcie", [])) + len(spec.get("pci_gpus", [])) + len(spec["hcas"])
        kind = "identity" if mode == "passthrough" else "DMA-FQ"
        files.update({f"sys/kernel/iommu_groups/{i}/type": kind + "\n" for i in range(n)})
    return files


def _prune(dest: Path, written: set[Path]) -> None:
    """Remove derived files a previous spec wrote that this one does not (an HCA that is gone)."""
    for tree in _DERIVED_TREES:
        root = dest / tree
        if not root.exists():
            continue
        for p in sorted(root.rglob("*"), key=lambda x: len(x.parts), reverse=True):
            if p.is_file() and p not in written:
                p.unlink()
            elif p.is_dir() and not any(p.iterdir()):
                p.rmdir()


def materialize(spec: Mapping[str, Any] | None, dest: Path) -> None:
    """Resolve `spec` and (re)write its files under `dest`; idempotent, atomic per file, in place.

    Raises `hwspec.HwSpecError` (a UsageError) on an invalid spec, before touching `dest`.
    """
    resolved = hwspec.resolve(spec)
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    dest.chmod(0o755)
    written: set[Path] = set()
    files = {**_ib_files(resolved), **_efa_files(resolved), **_driver_files(resolved),
             **_iommu_files(resolved),
             "proc/modules": _modules(resolved),
             # the CPU the simulated node has (GB200 trays: aarch64, though the host running it is x86-64)
             "proc/sys/kernel/arch": resolved["cpu_arch"] + "\n"}
    kmsg, dmesg = _kmsg_and_dmesg(resolved)
    files["kmsg"] = kmsg
    files["dmesg"] = dmesg
    files["lspci"] = lspci(resolved)
    for rel, text in files.items():
        _write(dest / rel, text, written)
    _prune(dest, written)
    for p in dest.rglob("*"):
        if p.is_dir():
            p.chmod(0o755)
    _write(dest / "spec.json", json.dumps(resolved, indent=2, sort_keys=True) + "\n", written)
