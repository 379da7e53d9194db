"""The simulated node's hardware spec: defaults, validation and fault shortcuts.

A spec is what an operator writes (YAML/JSON) to describe one simulated GPU node. `resolve(spec)` checks it and turns
it into the fully explicit form the simulators read from `/var/lib/hwsim/spec.json` (every GPU, every HCA port, every
XID written out). Defaults: an 8x H100-SXM5-80GB HGX node with 8 NDR HCAs `mlx5_0..7` (port 1 Active at 400 Gb/s)
and driver 580.95.05. Faults are shortcuts over that resolved form; see `provisioner_testbed/hwsim/README.md`.

Only JSON types in and out, so the resolved spec is exactly what lands on disk.
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provisioner.errors import UsageError

SCHEMA = "hwsim/1"
DEFAULT_DRIVER = "580.95.05"
#: The driver version the loaded kernel module reports under `fm_mismatch: true` (the previous 580 release, also
#: the older Fabric Manager the stand-in repo carries).
MISMATCH_DRIVER = "580.82.07"
DEFAULT_CUDA = "13.0"  # CUDA version the R580 driver reports
DEFAULT_MODEL = "H100-SXM5-80GB"
DEFAULT_GPU_COUNT = 8
DEFAULT_HCA_COUNT = 8
NVLINK_LINKS = 18
NVLINK_GBPS = "26.562"  # per-link speed `nvidia-smi nvlink --status` prints on Hopper


@dataclass(frozen=True)
class GpuModel:
    """What the driver reports for one GPU model (the inventory's `gpu_model` names it)."""

    name: str  # `nvidia-smi --query-gpu=name`
    memory_mib: int  # memory.total
    reserved_mib: int
    power_limit_w: int
    device_id: str  # PCI device id as `-q` prints it
    vbios: str
    board_part: str
    max_sm_mhz: int
    max_mem_mhz: int
    nvlsm: bool = False  # NVSwitches behind the IB stack: fabric "In Progress" until NVLSM runs (HGX B200)
    imex: bool = False  # NVL72 compute tray: no NVSwitch on the tray, IMEX daemon instead of Fabric Manager
    cpu_arch: str = "x86_64"  # what the real node is (the simulated host is always x86-64)


GPU_MODELS: Mapping[str, GpuModel] = {
    "H100-SXM5-80GB": GpuModel("NVIDIA H100 80GB HBM3", 81559, 551, 700, "0x233010DE", "96.00.99.00.01",
                               "692-2G520-0200-000", 1980, 2619),
    "H200-SXM-141GB": GpuModel("NVIDIA H200", 143771, 630, 700, "0x233510DE", "96.00.A5.00.01",
                                "692-2G520-0280-000", 1980, 3201),
    # Blackwell: names/memory as nvidia-smi prints them (the catalog's smi_name/memory_bytes).
    "B200-SXM-180GB": GpuModel("NVIDIA B200", 183359, 1024, 1000, "0x290110DE", "97.00.6C.00.01",
                               "692-2G525-0220-000", 1965, 3996, nvlsm=True),
    # GB200 compute tray (Grace, aarch64): the rack simulates it on an x86-64 host (a stand-in: say so).
    "GB200-186GB": GpuModel("NVIDIA GB200", 189471, 1024, 1200, "0x294110DE", "97.00.82.00.02",
                            "699-2G548-1200-000", 2062, 3996, imex=True, cpu_arch="aarch64"),
}
#: GPUs per GB200 compute tray (2 Grace + 4 Blackwell); NVLink goes to the rack's switch trays.
NVL72_TRAY_GPUS = 4
EFA_RATE = 100  # Gb/s per EFA device as sysfs shows it on p5 (32 x 100 = 3,200 Gb/s)
#: PCI buses of a p5.48xlarge's 32 EFA devices (rdmap<bus>s0), four per GPU.
_EFA_BUSES = [79, 80, 81, 82, 96, 97, 98, 99, 113, 114, 115, 116, 130, 131, 132, 133,
              147, 148, 149, 150, 164, 165, 166, 167, 181, 182, 183, 184, 198, 199, 200, 201]

# DGX/HGX H100 PCI layout: GPUs and their PIX-attached compute NICs, socket 0 first.
_GPU_BUSES = ["1B", "43", "52", "61", "9D", "C3", "D1", "DF"]
_NIC_BUSES = ["18", "40", "4F", "5E", "9A", "C0", "CE", "DC"]
_NUMA_CPUS = ["0-55,112-167", "56-111,168-223"]

#: rate (Gb/s) -> the text after the number in sysfs `rate` ("400 Gb/sec (4X NDR)").
IB_RATES: Mapping[int, str] = {
    10: "4X SDR", 20: "4X DDR", 40: "4X QDR", 56: "4X FDR", 100: "4X EDR", 200: "4X HDR", 400: "4X NDR",
    800: "4X XDR",
}
PORT_STATES = {"DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4, "ACTIVE_DEFER": 5}
PHYS_STATES = {"Sleep": 1, "Polling": 2, "Disabled": 3, "PortConfigurationTraining": 4, "LinkUp": 5,
               "LinkErrorRecovery": 6, "Phy Test": 7}

#: Xid code -> the text the driver prints after the code (NVIDIA's XID catalog, abridged).
XID_TEXT: Mapping[int, str] = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address",
    31: "ch 00000008, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x0_00000000. "
        "Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    43: "Ch 00000010",
    45: "Ch 00000010",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 0, "
        "subpartition 0.",
    63: "Row Remapper: New row marked for remapping, reset gpu to activate.",
    64: "Row Remapper: Failed to remap a row.",
    74: "NVLink: fatal error detected on link 3(0x10000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    92: "High single-bit ECC error rate",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    95: "Uncontained: LTC TAG (0x2,0x0). RST: Yes, D-RST: No",
    119: "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL).",
    120: "GSP task timeout @ pc:0x0, task: 1",
}

FAULTS = ("missing_gpu", "hca_down", "hca_rate", "xid", "ecc_uncorrectable", "row_remap_pending", "nvlink_down",
          "fm_mismatch", "persistence_off", "efa_missing", "nvlsm_fail", "imex_degraded", "acs_on", "vbios", "hca_fw",
          "gemm_slow", "hbm_low", "pcie_downtrained", "thermal_slowdown", "sdc_mismatch", "nccl_low")
#: Burn-in degraded modes (issue 45): what the GPU's measurements (hwsim-burnin, the stand-in for the torch worker)
#: and nvidia-smi under load show. Figures are the burn-in catalog's nominal ones times these fractions.
BURNIN_FAULTS = ("gemm_slow", "hbm_low", "pcie_downtrained", "thermal_slowdown", "sdc_mismatch", "nccl_low")
_FW = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

_TOP_KEYS = {"node", "gpu_model", "gpu_count", "driver_version", "kernel_module_version", "cuda_version", "hcas",
             "hca_rate", "faults", "gpus", "efa", "iommu"}
#: `iommu:` values: what /proc/cmdline and /sys/kernel/iommu_groups/*/type show (off: no groups).
IOMMU_MODES = ("off", "passthrough", "translated")
_VERSION = re.compile(r"^\d+\.\d+(\.\d+)?$")


class HwSpecError(UsageError):
    """An invalid hardware spec; the message names the key, the value found and what is allowed."""


def _err(where: str, message: str) -> HwSpecError:
    return HwSpecError(f"hardware spec: {where}: {message}")


def _int(where: str, value: Any, *, minimum: int = 0, maximum: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _err(where, f"expected an integer, got {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        hi = "" if maximum is None else f"..{maximum}"
        raise _err(where, f"{value} is out of range (allowed {minimum}{hi})")
    return value


def _stable_hex(seed: str, n: int) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()[:n]


def _uuid(seed: str) -> str:
    h = _stable_hex(seed, 32)
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _guid(seed: str) -> str:
    h = "946dae0300" + _stable_hex(seed, 6)  # Mellanox OUI-shaped
    return ":".join(h[i:i + 4] for i in range(0, 16, 4))


def _default_gpus(model: GpuModel, count: int, node: str) -> list[dict[str, Any]]:
    gpus = []
    for i in range(count):
        bus = _GPU_BUSES[i] if i < len(_GPU_BUSES) else f"{0xE0 + i:02X}"
        numa = 0 if i < max(count // 2, 1) else 1
        gpus.append({
            "index": i,
            "minor": i,
            "name": model.name,
            "uuid": _uuid(f"{node}/gpu/{i}"),
            "serial": str(1650923000000 + int(_stable_hex(f"{node}/sn/{i}", 6), 16) % 1000000),
            "pci_bus_id": f"00000000:{bus}:00.0",
            "numa_node": numa,
            "cpu_affinity": _NUMA_CPUS[numa],
            "pcie_switch": i,  # GPU i shares a PCIe switch with HCA i (PIX in topo -m)
            "memory_total_mib": model.memory_mib,
            "memory_reserved_mib": model.reserved_mib,
            "memory_used_mib": 0,
            "power_limit_w": model.power_limit_w,
            "power_draw_w": round(68.0 + (i * 3.17) % 9, 2),
            "temperature_c": 31 + (i * 3) % 7,
            "memory_temperature_c": 36 + (i * 5) % 6,
            "clocks_sm_mhz": 345,
            "clocks_mem_mhz": model.max_mem_mhz,
            "max_clocks_sm_mhz": model.max_sm_mhz,
            "pstate": "P0",
            "ecc": {"volatile_corrected": 0, "volatile_uncorrected": 0, "aggregate_corrected": 0,
                    "aggregate_uncorrected": 0},
            "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False},
            "nvlinks": [{"link": n, "active": True, "gbps": NVLINK_GBPS} for n in range(NVLINK_LINKS)],
            "device_id": model.device_id,
            "vbios": model.vbios,
            "board_part": model.board_part,
        })
    return gpus


def _default_hcas(names: list[str], rate: int, node: str) -> list[dict[str, Any]]:
    hcas = []
    for i, name in enumerate(names):
        bus = _NIC_BUSES[i] if i < len(_NIC_BUSES) else f"{0xE8 + i:02X}"
        numa = 0 if i < max(len(names) // 2, 1) else 1
        guid = _guid(f"{node}/hca/{name}")
        hcas.append({
            "name": name,
            "pci": f"0000:{bus.lower()}:00.0",
            "netdev": f"ibp{int(bus, 16)}s0",
            "numa_node": numa,
            "cpu_affinity": _NUMA_CPUS[numa],
            "pcie_switch": i,
            "node_guid": guid,
            "sys_image_guid": guid,
            "fw_ver": "28.43.1014",
            "hca_type": "MT4129",
            "board_id": "MT_0000000838",
            "ports": [{"port": 1, "state": "ACTIVE", "phys_state": "LinkUp", "rate": rate,
                       "link_layer": "InfiniBand", "lid": 0x10 + i, "sm_lid": 1}],
        })
    return hcas


def _pcie_bridges(gpus: list[dict[str, Any]], hcas: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The PCIe bridges above the GPUs and HCAs, as on an HGX H100 board: per GPU/HCA pair i (the `pcie_switch`
    index) a CPU root port `RR:01.0` -> a PCIe switch upstream port `(RR+1):00.0` -> one downstream port per device
    `(RR+2):0d.0` whose secondary bus is the device's (RR = the pair's lowest bus - 3). A device off the standard
    layout (GPU/HCA 8 and up) hangs from its own root port on bus 00. Root ports and downstream ports have the ACS
    capability (redirect off: `acs_on` turns it on); upstream ports have none."""
    def bus_of(pci: str) -> int:
        return int(pci.split(":")[-2], 16)

    pairs: dict[int, list[tuple[str, int, int]]] = {}
    for g in gpus:
        pairs.setdefault(g["pcie_switch"], []).append(("gpu", g["index"], bus_of(g["pci_bus_id"])))
    for h in hcas:
        pairs.setdefault(h["pcie_switch"], []).append(("hca", h["pcie_switch"], bus_of(h["pci"])))
    out: list[dict[str, Any]] = []
    loose: list[tuple[str, int, int]] = []
    for i, members in sorted(pairs.items()):
        std = {int(b, 16) for b in (_GPU_BUSES[i:i + 1] + _NIC_BUSES[i:i + 1])} if i < len(_GPU_BUSES) else set()
        if not std or any(b not in std for _, _, b in members):
            loose.extend(members)
            continue
        lo, hi = min(std) - 3, max(std)
        out.append({"address": f"0000:{lo:02x}:01.0", "role": "root_port", "secondary": lo + 1, "subordinate": hi,
                    "acs": True, "acs_redirect": False, "gpu": None, "switch": i})
        out.append({"address": f"0000:{lo + 1:02x}:00.0", "role": "upstream", "secondary": lo + 2,
                    "subordinate": hi, "acs": False, "acs_redirect": False, "gpu": None, "switch": i})
        for kind, index, bus in sorted(members, key=lambda m: m[2]):
            out.append({"address": f"0000:{lo + 2:02x}:{bus - lo - 3:02x}.0", "role": "downstream",
                        "secondary": bus, "subordinate": bus, "acs": True, "acs_redirect": False,
                        "gpu": index if kind == "gpu" else None, "switch": i})
    for k, (kind, index, bus) in enumerate(m for m in loose if m[2] <= 0xFF):
        out.append({"address": f"0000:00:{1 + k // 8:02x}.{k % 8}", "role": "root_port", "secondary": bus,
                    "subordinate": bus, "acs": True, "acs_redirect": False,
                    "gpu": index if kind == "gpu" else None, "switch": None})
    return out


def _acs_on(spec: dict[str, Any], value: Any, gpu_count: int) -> None:
    """`acs_on`: true (every bridge with ACS: root ports and switch downstream ports), GPU indexes (the switch
    downstream port above each), or bridge addresses (`0000:17:03.0`); mixed in one list is fine."""
    where = "faults.acs_on"
    bridges = [b for b in spec["pcie"] if b["acs"]]
    if value is True:
        chosen = bridges
    else:
        if isinstance(value, Mapping):
            value = _gpu_list(where, value, gpu_count)
        items = value if isinstance(value, list) else [value]
        if not items:
            raise _err(where, "expected true, a GPU index, a bridge address or a list of them, got []")
        chosen = []
        for item in items:
            if isinstance(item, str):
                hit = [b for b in bridges if b["address"] == item.lower() or b["address"] == "0000:" + item.lower()]
                if not hit:
                    have = ", ".join(b["address"] for b in bridges[:6]) + (", ..." if len(bridges) > 6 else "")
                    raise _err(where, f"no PCIe bridge with ACS at {item!r} (this node has {have or 'none'})")
                chosen.extend(hit)
            elif isinstance(item, int) and not isinstance(item, bool):
                i = _int(where, item, maximum=gpu_count - 1) if gpu_count else _int(where, item, maximum=-1)
                chosen.extend(b for b in bridges if b["gpu"] == i)
            else:
                raise _err(where, f"expected true, a GPU index, a bridge address or a list of them, got {item!r}")
    for b in chosen:
        b["acs_redirect"] = True


def _efa_devices(where: str, value: Any, node: str) -> list[dict[str, Any]]:
    """EFA devices (AWS p4d/p5): a count (`rdmap79s0`.. as on a p5.48xlarge) or a list of names."""
    if isinstance(value, int) and not isinstance(value, bool):
        names = [f"rdmap{_EFA_BUSES[i] if i < len(_EFA_BUSES) else 210 + i}s0"
                 for i in range(_int(where, value, maximum=64))]
    elif isinstance(value, list) and all(isinstance(x, str) and x.startswith("rdmap") for x in value):
        if len(set(value)) != len(value):
            raise _err(where, f"duplicate EFA device names in {value!r}")
        names = list(value)
    else:
        raise _err(where, f"expected a count or a list of EFA device names such as ['rdmap79s0'], got {value!r}")
    out = []
    for i, name in enumerate(names):
        m = re.match(r"^rdmap(\d+)s(\d+)$", name)
        bus = int(m.group(1)) if m else 0xF0 + i
        out.append({"name": name, "pci": f"0000:{bus:02x}:00.0", "numa_node": 0 if i < max(len(names) // 2, 1) else 1,
                    "node_guid": _guid(f"{node}/efa/{name}"), "fw_ver": "0.0.0.0", "state": "ACTIVE",
                    "phys_state": "LinkUp", "rate": EFA_RATE})
    return out


def _hca_names(where: str, value: Any) -> list[str]:
    if isinstance(value, int) and not isinstance(value, bool):
        return [f"mlx5_{i}" for i in range(_int(where, value, maximum=32))]
    if isinstance(value, list) and all(isinstance(x, str) and x for x in value):
        if len(set(value)) != len(value):
            raise _err(where, f"duplicate HCA names in {value!r}")
        return list(value)
    raise _err(where, f"expected a count or a list of HCA names such as ['mlx5_0', 'mlx5_1'], got {value!r}")


def _gpu_list(where: str, value: Any, count: int) -> list[int]:
    """A fault's GPU selector: `true` (all), an index, a list of indexes, or `{gpu: N}`."""
    if value is True:
        return list(range(count))
    if isinstance(value, Mapping):
        if set(value) - {"gpu"} or "gpu" not in value:
            raise _err(where, f"expected {{gpu: N}}, got {dict(value)!r}")
        value = value["gpu"]
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        out.append(_int(where, item, maximum=count - 1) if count else _int(where, item, maximum=-1))
    return out


def _find_hca(where: str, hcas: list[dict[str, Any]], name: Any) -> dict[str, Any]:
    for hca in hcas:
        if hca["name"] == name:
            return hca
    have = ", ".join(h["name"] for h in hcas) or "none"
    raise _err(where, f"unknown HCA {name!r} (this node has {have})")


def _find_gpu(where: str, gpus: list[dict[str, Any]], index: int) -> dict[str, Any]:
    for gpu in gpus:
        if gpu["index"] == index:
            return gpu
    raise _err(where, f"no GPU {index} (this node has {len(gpus)} GPUs: 0..{len(gpus) - 1})")


def _apply_faults(spec: dict[str, Any], faults: Mapping[str, Any]) -> None:
    gpus: list[dict[str, Any]] = spec["gpus"]
    hcas: list[dict[str, Any]] = spec["hcas"]
    unknown = sorted(set(faults) - set(FAULTS))
    if unknown:
        raise _err("faults", f"unknown fault {unknown[0]!r} (known: {', '.join(FAULTS)})")

    # Per-GPU faults address GPUs by their index BEFORE missing_gpu takes any away.
    if "ecc_uncorrectable" in faults:
        items = faults["ecc_uncorrectable"]
        for n, item in enumerate(items if isinstance(items, list) else [items]):
            where = f"faults.ecc_uncorrectable[{n}]"
            if not isinstance(item, Mapping) or set(item) - {"gpu", "count"} or "gpu" not in item:
                raise _err(where, f"expected {{gpu: N, count: M}}, got {item!r}")
            gpu = _find_gpu(where, gpus, _int(where + ".gpu", item["gpu"]))
            count = _int(where + ".count", item.get("count", 1), minimum=1)
            gpu["ecc"]["volatile_uncorrected"] += count
            gpu["ecc"]["aggregate_uncorrected"] += count
    if faults.get("row_remap_pending"):
        for i in _gpu_list("faults.row_remap_pending", _first_if_true(faults["row_remap_pending"]), len(gpus)):
            gpu = _find_gpu("faults.row_remap_pending", gpus, i)
            gpu["remapped_rows"]["pending"] = True
            gpu["remapped_rows"]["uncorrectable"] = max(1, gpu["remapped_rows"]["uncorrectable"])
    if faults.get("nvlink_down"):
        for i in _gpu_list("faults.nvlink_down", faults["nvlink_down"], len(gpus)):
            for link in _find_gpu("faults.nvlink_down", gpus, i)["nvlinks"]:
                link["active"] = False
    if "xid" in faults:
        items = faults["xid"]
        for n, item in enumerate(items if isinstance(items, list) else [items]):
            where = f"faults.xid[{n}]"
            if not isinstance(item, Mapping) or set(item) - {"gpu", "code", "text"} or not {"gpu", "code"} <= set(item):
                raise _err(where, f"expected {{gpu: N, code: XID}}, got {item!r}")
            gpu = _find_gpu(where, gpus, _int(where + ".gpu", item["gpu"]))
            code = _int(where + ".code", item["code"], minimum=1, maximum=999)
            text = item.get("text", XID_TEXT.get(code, "pid='<unknown>', name=<unknown>, Ch 00000010"))
            if not isinstance(text, str):
                raise _err(where + ".text", f"expected a string, got {text!r}")
            spec["xids"].append({"pci_bus_id": gpu["pci_bus_id"], "gpu": gpu["index"], "code": code, "text": text})

    _firmware_faults(faults, gpus, hcas)
    for name in _as_list(faults.get("hca_down")):
        for port in _find_hca("faults.hca_down", hcas, name)["ports"]:
            port.update(state="DOWN", phys_state="Polling", rate=10)
    rates = faults.get("hca_rate") or {}
    if not isinstance(rates, Mapping):
        raise _err("faults.hca_rate", f"expected {{HCA: RATE}} such as {{mlx5_2: 200}}, got {rates!r}")
    for name, rate in rates.items():
        hca = _find_hca("faults.hca_rate", hcas, name)
        if rate not in IB_RATES:
            raise _err(f"faults.hca_rate.{name}", f"{rate!r} is not an InfiniBand rate ({sorted(IB_RATES)})")
        for port in hca["ports"]:
            port["rate"] = rate

    fm = faults.get("fm_mismatch")
    if fm:
        version = MISMATCH_DRIVER if fm is True else fm
        if not isinstance(version, str) or not _VERSION.match(version):
            raise _err("faults.fm_mismatch", f"expected true or a driver version such as '580.82.07', got {fm!r}")
        if version == spec["driver"]["version"]:
            raise _err("faults.fm_mismatch", f"{version} is the installed driver's own version: no mismatch")
        spec["driver"]["kernel_module_version"] = version
    if faults.get("persistence_off"):
        spec["persistence"]["forced_off"] = True

    if faults.get("efa_missing"):
        value = faults["efa_missing"]
        efa = spec["efa"]
        if value is True or (isinstance(value, int) and not isinstance(value, bool)):
            n = _int("faults.efa_missing", 1 if value is True else value, minimum=1, maximum=max(len(efa), 1))
            if not efa:
                raise _err("faults.efa_missing", "this node has no EFA devices (set `efa:`)")
            gone = {d["name"] for d in efa[len(efa) - n:]}
        else:
            gone = set(_as_list(value))
            for name in gone:
                if name not in {d["name"] for d in efa}:
                    have = ", ".join(d["name"] for d in efa) or "none"
                    raise _err("faults.efa_missing", f"unknown EFA device {name!r} (this node has {have})")
        spec["efa"] = [d for d in efa if d["name"] not in gone]
    if faults.get("nvlsm_fail"):
        if not spec["nvlsm"]:
            raise _err("faults.nvlsm_fail", f"{spec['gpu_model']} has no NVLSM (an HGX B200 fault)")
        spec["nvlsm_fail"] = True
    if faults.get("imex_degraded"):
        if not spec["imex"]:
            raise _err("faults.imex_degraded", f"{spec['gpu_model']} runs no IMEX (a GB200 tray fault)")
        # the tray lost its NVLinks to the switch trays: its GPUs leave the fabric, its IMEX daemon cannot join the
        # domain, and every other tray of the domain sees it as not connected (domain DEGRADED)
        spec["imex_fail"] = True
        for gpu in gpus:
            for link in gpu["nvlinks"]:
                link["active"] = False

    if faults.get("acs_on") not in (None, False):
        _acs_on(spec, faults["acs_on"], len(gpus))

    _burnin_faults(spec, faults)
    if faults.get("missing_gpu"):
        value = faults["missing_gpu"]
        if value is True or (isinstance(value, int) and not isinstance(value, bool)):
            n = _int("faults.missing_gpu", 1 if value is True else value, minimum=1, maximum=len(gpus))
            gone = [g["index"] for g in gpus[len(gpus) - n:]]
        else:
            gone = _gpu_list("faults.missing_gpu", value if isinstance(value, (list, Mapping)) else [value], len(gpus))
        spec["gpus_missing"] = [g["pci_bus_id"] for g in gpus if g["index"] in gone]
        kept = [g for g in gpus if g["index"] not in gone]
        for i, gpu in enumerate(kept):  # the driver enumerates what is left contiguously, in PCI order
            gpu["index"] = i
            gpu["minor"] = i
        spec["gpus"] = kept


def _first_if_true(value: Any) -> Any:
    return 0 if value is True else value


def _fw_version(where: str, v: Any) -> str:
    if not isinstance(v, str) or not _FW.match(v):
        raise _err(where, f"expected a firmware version such as '96.00.61.00.01', got {v!r}")
    return v


def _firmware_faults(faults: Mapping[str, Any], gpus: list[dict[str, Any]], hcas: list[dict[str, Any]]) -> None:
    """vbios / hca_fw: other firmware than the model's (a version for every GPU / HCA, or {GPU index | HCA name:
    version}); nvidia-smi's VBIOS Version and the HCAs' fw_ver report it."""
    v = faults.get("vbios")
    if v is not None:
        if isinstance(v, Mapping):
            for k, ver in v.items():
                i = int(k) if isinstance(k, str) and k.isdigit() else k
                gpu = _find_gpu("faults.vbios", gpus, _int("faults.vbios", i))
                gpu["vbios"] = _fw_version(f"faults.vbios.{k}", ver)
        else:
            for gpu in gpus:
                gpu["vbios"] = _fw_version("faults.vbios", v)
    v = faults.get("hca_fw")
    if v is not None:
        if isinstance(v, Mapping):
            for name, ver in v.items():
                _find_hca("faults.hca_fw", hcas, name)["fw_ver"] = _fw_version(f"faults.hca_fw.{name}", ver)
        else:
            for hca in hcas:
                hca["fw_ver"] = _fw_version("faults.hca_fw", v)


def _as_list(value: Any) -> list[Any]:
    if value is None or value is False:
        return []
    return value if isinstance(value, list) else [value]


def resolve(spec: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Validate an operator's spec and return the explicit form the simulators read (raises HwSpecError).

    Keys (all optional): `node` (seed for UUIDs, GUIDs, serials), `gpu_model` (one of GPU_MODELS), `gpu_count`,
    `driver_version` (the installed driver), `kernel_module_version` (the loaded module, default `driver_version`:
    another version is a node that installed a driver and has not rebooted), `cuda_version`, `hcas` (count or list
    of names), `hca_rate` (Gb/s), `efa` (EFA devices: count or list of rdmap* names), `iommu` (IOMMU_MODES),
    `faults` (see FAULTS).
    """
    src = dict(spec or {})
    if src.get("schema") == SCHEMA and "input" in src:  # an already resolved spec: resolve its input again
        src = dict(src["input"])
    unknown = sorted(set(src) - _TOP_KEYS)
    if unknown:
        raise _err(unknown[0], f"unknown key (known: {', '.join(sorted(_TOP_KEYS - {'gpus'}))})")
    if "gpus" in src:
        raise _err("gpus", "per-GPU lists are derived; set gpu_model/gpu_count and use faults")
    node = src.get("node", "hwsim")
    if not isinstance(node, str) or not node:
        raise _err("node", f"expected a host name, got {node!r}")
    model_key = src.get("gpu_model", DEFAULT_MODEL)
    if model_key not in GPU_MODELS:
        raise _err("gpu_model", f"unknown model {model_key!r} (known: {', '.join(GPU_MODELS)})")
    default_count = NVL72_TRAY_GPUS if GPU_MODELS[model_key].imex else DEFAULT_GPU_COUNT
    count = _int("gpu_count", src.get("gpu_count", default_count), minimum=1, maximum=16)
    driver = src.get("driver_version", DEFAULT_DRIVER)
    if not isinstance(driver, str) or not _VERSION.match(driver):
        raise _err("driver_version", f"expected a version such as '580.95.05', got {driver!r}")
    module = src.get("kernel_module_version", driver)
    if not isinstance(module, str) or not _VERSION.match(module):
        raise _err("kernel_module_version", f"expected a version such as '580.82.07', got {module!r}")
    cuda = src.get("cuda_version", DEFAULT_CUDA)
    if not isinstance(cuda, str) or not _VERSION.match(cuda):
        raise _err("cuda_version", f"expected a version such as '13.0' (quote it in YAML), got {cuda!r}")
    rate = src.get("hca_rate", 400)
    if rate not in IB_RATES:
        raise _err("hca_rate", f"{rate!r} is not an InfiniBand rate ({sorted(IB_RATES)})")
    names = _hca_names("hcas", src.get("hcas", DEFAULT_HCA_COUNT))
    efa = _efa_devices("efa", src.get("efa", 0), node)
    faults = src.get("faults") or {}
    if not isinstance(faults, Mapping):
        raise _err("faults", f"expected a mapping of fault name to value, got {faults!r}")
    iommu = src.get("iommu", "off")
    if iommu not in IOMMU_MODES:
        raise _err("iommu", f"unknown mode {iommu!r} (known: {', '.join(IOMMU_MODES)})")
    if "kernel_module_version" in src and faults.get("fm_mismatch"):
        raise _err("kernel_module_version", "set it or the fault fm_mismatch, not both (both set the loaded module)")

    model = GPU_MODELS[model_key]
    out: dict[str, Any] = {
        "schema": SCHEMA,
        "node": node,
        "gpu_model": model_key,
        "driver": {"version": driver, "kernel_module_version": module, "cuda_version": cuda},
        "persistence": {"forced_off": False},
        "gpus": _default_gpus(model, count, node),
        "gpus_missing": [],
        "hcas": _default_hcas(names, rate, node),
        "iommu": iommu,
        "efa": efa,
        "nvlsm": model.nvlsm,
        "nvlsm_fail": False,
        "imex": model.imex,
        "imex_fail": False,
        "cpu_arch": model.cpu_arch,
        "xids": [],
        "faults": copy.deepcopy(dict(faults)),
        "input": copy.deepcopy(src),
    }
    out["pcie"] = _pcie_bridges(out["gpus"], out["hcas"])
    # GPUs (PCI device id, lspci name) kept for lspci: a GPU the driver failed (missing_gpu) is still on the bus
    out["pci_gpus"] = [{"pci_bus_id": g["pci_bus_id"], "device_id": g["device_id"], "numa_node": g["numa_node"]}
                       for g in out["gpus"]]
    out["burnin"] = _burnin_figures(model_key)
    _apply_faults(out, faults)
    return out


def _burnin_figures(model_key: str) -> dict[str, Any]:
    """The healthy node's burn-in figures: the catalog's nominal ones for the model (provisioner/catalog/burnin.yaml),
    an H100's for a model the catalog does not carry; a healthy node's NCCL figure = nominal x 1."""
    from provisioner.burnin import catalog

    models = catalog()["models"]
    m = models.get(model_key) or models[DEFAULT_MODEL]
    figs = {k: float(v["nominal"]) for k, v in (m.get("metrics") or {}).items()}
    figs.setdefault("nccl_allreduce_busbw_gbps", 460.0)
    pcie = m.get("pcie") or {"gen": 5, "width": 16}
    return {"nominal": figs, "pcie": {"gen": int(pcie["gen"]), "width": int(pcie["width"])}, "nccl_fraction": 1.0}


def _fraction(where: str, v: Any, default: float) -> float:
    f = default if v is None else v
    if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < float(f) <= 1:
        raise _err(where, f"expected a fraction in (0, 1] such as 0.9, got {v!r}")
    return float(f)


def _burnin_targets(where: str, value: Any, gpus: list[dict[str, Any]], default: float) -> list[tuple[int, Any]]:
    """`true` (every GPU) / i / [i, ...] / {gpu: i | [..] | all, fraction: f, ...} -> [(gpu index, the item)]."""
    items = value if isinstance(value, list) and value and isinstance(value[0], Mapping) else [value]
    out = []
    for n, item in enumerate(items):
        w = f"{where}[{n}]" if len(items) > 1 else where
        if isinstance(item, Mapping):
            sel = item.get("gpu", "all")
            idx = [g["index"] for g in gpus] if sel in ("all", None) else _gpu_list(w + ".gpu", sel, len(gpus))
        elif item is True:
            idx, item = [g["index"] for g in gpus], {}
        else:
            idx, item = _gpu_list(w, item, len(gpus)), {}
        for i in idx:
            _find_gpu(w, gpus, i)
            out.append((i, item))
    return out


def _burnin_faults(spec: dict[str, Any], faults: Mapping[str, Any]) -> None:
    """gemm_slow / hbm_low ({gpu: i|all, fraction: f}), pcie_downtrained ({gpu: i, width: 8} or {gpu: i, gen: 4}),
    thermal_slowdown (GPU i), sdc_mismatch (GPU i), nccl_low (a fraction of the node's NCCL figure)."""
    gpus = spec["gpus"]
    for g in gpus:
        g["burnin"] = {"gemm": 1.0, "hbm": 1.0, "pcie_gen": spec["burnin"]["pcie"]["gen"],
                       "pcie_width": spec["burnin"]["pcie"]["width"], "thermal": False, "sdc": False}
    for key, field_, default in (("gemm_slow", "gemm", 0.9), ("hbm_low", "hbm", 0.8)):
        if faults.get(key) not in (None, False):
            for i, item in _burnin_targets(f"faults.{key}", faults[key], gpus, default):
                _find_gpu(f"faults.{key}", gpus, i)["burnin"][field_] = _fraction(
                    f"faults.{key}.fraction", item.get("fraction"), default)
    if faults.get("pcie_downtrained") not in (None, False):
        for i, item in _burnin_targets("faults.pcie_downtrained", faults["pcie_downtrained"], gpus, 1.0):
            b = _find_gpu("faults.pcie_downtrained", gpus, i)["burnin"]
            if not item:
                item = {"width": 8}
            if "width" in item:
                b["pcie_width"] = _int("faults.pcie_downtrained.width", item["width"], minimum=1, maximum=16)
            if "gen" in item:
                b["pcie_gen"] = _int("faults.pcie_downtrained.gen", item["gen"], minimum=1, maximum=6)
    for key, field_ in (("thermal_slowdown", "thermal"), ("sdc_mismatch", "sdc")):
        if faults.get(key) not in (None, False):
            for i, _ in _burnin_targets(f"faults.{key}", _first_if_true(faults[key]), gpus, 1.0):
                _find_gpu(f"faults.{key}", gpus, i)["burnin"][field_] = True
    if faults.get("nccl_low") not in (None, False):
        spec["burnin"]["nccl_fraction"] = _fraction("faults.nccl_low", 0.8 if faults["nccl_low"] is True
                                                    else faults["nccl_low"], 0.8)


def load(path: Path) -> dict[str, Any]:
    """Read a spec file (YAML or JSON); a rack file (`defaults:` + `hosts:`) is returned as is."""
    import yaml  # the controller has PyYAML; the simulators never import this module

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise HwSpecError(f"cannot read hardware spec: {exc}", path=str(path)) from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise HwSpecError("a hardware spec must be a mapping", path=str(path))
    return data


def for_host(doc: Mapping[str, Any], host: str) -> dict[str, Any]:
    """The spec of one host from a rack file: `defaults` merged with `hosts[host]` (faults merged key by key).

    A plain spec (no `defaults`/`hosts` keys) applies to every host. `node` defaults to the host name.
    """
    if not ({"defaults", "hosts"} & set(doc)):
        base: dict[str, Any] = copy.deepcopy(dict(doc))
        base.setdefault("node", host)
        return base
    extra = set(doc) - {"defaults", "hosts"}
    if extra:
        raise _err(sorted(extra)[0], "a rack spec has only `defaults:` and `hosts:`")
    defaults = doc.get("defaults") or {}
    hosts = doc.get("hosts") or {}
    if not isinstance(defaults, Mapping) or not isinstance(hosts, Mapping):
        raise _err("hosts", "`defaults:` and `hosts:` must be mappings")
    own = hosts.get(host) or {}
    if not isinstance(own, Mapping):
        raise _err(f"hosts.{host}", f"expected a mapping, got {own!r}")
    merged: dict[str, Any] = {**copy.deepcopy(dict(defaults)), **copy.deepcopy(dict(own))}
    faults = {**dict(defaults.get("faults") or {}), **dict(own.get("faults") or {})}
    if faults:
        merged["faults"] = faults
    merged.setdefault("node", host)
    return merged
