"""Parsers for what the preflight probe prints (provisioner.probes.preflight.PROBE_SCRIPT): its sections, sysfs file
dumps, os-release, df, PCI ids, all folded into NodeFacts. Pure functions over text, tested on real captured outputs
(tests/fixtures/real*/, from H200 machines).

The parsers of the GPU tools' own outputs (nvidia-smi, ibstat, NCCL list variables, kernel-log XIDs) live in
provisioner.probes.nodeparse, the one copy that also ships to the nodes with node_health.py; they are re-exported
here, so `parsers.parse_query_gpu` and the like keep working.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from provisioner.probes.nodeparse import (  # noqa: F401  (re-exported: one copy, in nodeparse)
    CRITICAL_XIDS,
    QUERY_GPU_FIELDS,
    FiDomain,
    GpuInfo,
    IbPort,
    ImexDomain,
    ImexNode,
    PciFunction,
    Topology,
    Xid,
    acs_message,
    acs_redirects,
    acs_unreadable,
    dig,
    efa_devices,
    iommu_mode,
    parse_fi_info,
    parse_ib_sysfs,
    parse_ibdev2netdev,
    parse_ibstat,
    parse_imex_ctl,
    parse_lspci,
    parse_nccl_conf,
    parse_nccl_ib_hca,
    parse_nvlink_status,
    parse_query_csv,
    parse_query_gpu,
    parse_rate,
    parse_smi_q,
    parse_socket_ifname,
    parse_topo_m,
    parse_xids,
    select_ib_hcas,
    select_interfaces,
    strip_ansi,
)
from provisioner.reports.untrusted import node_text


def parse_file_dump(text: str) -> dict[str, str]:
    """`PATH<TAB>CONTENT` lines (one-line sysfs files, as the probe prints them) -> {path: content}.
    A tab, not ':', separates them: PCI paths (`0000:18:00.0`) and sysfs values (`4: ACTIVE`) hold colons."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        path, sep, content = line.partition("\t")
        if sep and path.startswith("/"):
            out[path] = content
    return out


def parse_net_ifaces(text: str) -> list[str]:
    """The probe's `net` section (one /sys/class/net entry a line) -> sorted interface names."""
    return sorted({line.strip() for line in text.splitlines() if line.strip() and "/" not in line})


# ------------------------------------------------------------------------------------------ OS, disk
def parse_os_release(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        k, sep, v = line.strip().partition("=")
        if sep and k and not k.startswith("#"):
            v = v.strip()
            if len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'":
                v = v[1:-1]
            out[k] = v
    return out


@dataclass(frozen=True)
class DfEntry:
    filesystem: str
    size: int
    used: int
    avail: int
    mount: str
    fstype: str | None = None


def parse_df(text: str) -> list[DfEntry]:
    """`df -P -B1 [PATH]` (or `df -PT -B1`): POSIX format, byte blocks. With -T a Type column follows Filesystem."""
    out: list[DfEntry] = []
    lines = text.splitlines()
    has_type = bool(lines) and " Type " in lines[0]
    for line in lines[1:]:
        f = line.split()
        need = 7 if has_type else 6
        if len(f) < need:
            continue
        try:
            if has_type:
                out.append(DfEntry(f[0], int(f[2]), int(f[3]), int(f[4]), " ".join(f[6:]), f[1]))
            else:
                out.append(DfEntry(f[0], int(f[1]), int(f[2]), int(f[3]), " ".join(f[5:])))
        except ValueError:
            continue
    return out


# ------------------------------------------------------------------------------------------ the batched probe
SECTION = "@@pv@@"


@dataclass
class Section:
    name: str
    rc: int | None
    text: str


def parse_sections(text: str) -> dict[str, Section]:
    """The output of the batched probe snippet: `@@pv@@ begin NAME` ... `@@pv@@ end NAME RC` blocks."""
    out: dict[str, Section] = {}
    cur: str | None = None
    buf: list[str] = []
    for line in text.splitlines():
        if line.startswith(SECTION + " begin "):
            cur, buf = line.split(" ", 2)[2].strip(), []
            continue
        if line.startswith(SECTION + " end ") and cur is not None:
            parts = line.split()
            rc = int(parts[-1]) if parts[-1].lstrip("-").isdigit() else None
            out[cur] = Section(cur, rc, "\n".join(buf) + ("\n" if buf else ""))
            cur = None
            continue
        if cur is not None:
            buf.append(line)
    return out


#: PCI device ids of NVIDIA GPUs -> the name nvidia-smi prints (used before a driver is installed).
PCI_GPU_NAMES = {
    "0x2330": "NVIDIA H100 80GB HBM3",
    "0x2335": "NVIDIA H200",
    "0x2331": "NVIDIA H100 PCIe",
    "0x2321": "NVIDIA H100 NVL",
    "0x20b2": "NVIDIA A100-SXM4-80GB",
    "0x2237": "NVIDIA A10G",
    "0x26b9": "NVIDIA L40S",
    "0x2901": "NVIDIA B200",  # NVIDIA mig-parted/gpu-operator B200 profiles (device 0x2901)
}


def parse_pci_gpus(text: str) -> list[tuple[str, str]]:
    """`/sys/bus/pci/devices/<bus><TAB><device id> <class>` lines (NVIDIA display/3D controllers) -> [(bus, id)]."""
    out = []
    for path, content in parse_file_dump(text).items():
        f = content.split()
        if f:
            out.append((path.rstrip("/").rsplit("/", 1)[-1], f[0].lower()))
    return sorted(out)


@dataclass
class NodeFacts:
    """Everything one preflight probe learned about a host (None / empty where the node could not tell)."""

    gpus: list[GpuInfo] = field(default_factory=list)
    gpu_error: str | None = None
    smi_missing: bool = False  # nvidia-smi not installed (no driver yet): GPUs come from PCI
    pci_gpus: list[tuple[str, str]] = field(default_factory=list)  # (bus id, PCI device id)
    topology: Topology | None = None
    ib_ports: dict[str, dict[int, IbPort]] = field(default_factory=dict)
    hca_numa: dict[str, int | None] = field(default_factory=dict)
    gpu_numa: dict[str, int | None] = field(default_factory=dict)  # pci bus id (lower case) -> NUMA node
    os_release: dict[str, str] = field(default_factory=dict)
    kernel: str | None = None
    arch: str | None = None  # uname -m (x86_64, aarch64)
    disk: DfEntry | None = None
    disk_path: str | None = None
    net_ifaces: list[str] | None = None  # /sys/class/net entries; None when the probe did not list them
    pci: list[PciFunction] | None = None  # `lspci -D -vvv`; None when it did not run
    pci_error: str | None = None  # why not (lspci not installed)
    iommu: tuple[str, str] | None = None  # (off|passthrough|translated, what said so)
    firmware: str | None = None  # the node's firmware report (bmc/firmware.py NODE_COMMAND), when it was asked


#: The most probe output parse_probe reads (lspci -vvv of a large node is a few MB).
MAX_PROBE = 32 * 1024 * 1024


def _numa_dump(text: str, pattern: str) -> dict[str, int | None]:
    out: dict[str, int | None] = {}
    for path, content in parse_file_dump(text).items():
        m = re.search(pattern, path)
        if m:
            n = content.strip()
            out[m.group(1).lower()] = int(n) if n.lstrip("-").isdigit() and int(n) >= 0 else None
    return out


def parse_probe(text: str, disk_path: str | None = None) -> NodeFacts:
    """The whole batched probe output -> NodeFacts (see provisioner.probes.preflight.PROBE_SCRIPT). The node's
    output is data: read up to MAX_PROBE characters; its free-text lines are kept as one bounded line."""
    s = parse_sections(text[:MAX_PROBE])
    f = NodeFacts(disk_path=disk_path)
    q = s.get("query-gpu")
    if q is None:
        f.gpu_error = "no nvidia-smi output"
    elif q.rc != 0:
        f.gpu_error = node_text((q.text.strip().splitlines() or ["nvidia-smi failed"])[-1], 200) + f" (rc {q.rc})"
        f.smi_missing = q.rc == 127
    else:
        f.gpus = parse_query_gpu(q.text)
    if "pci-gpus" in s:
        f.pci_gpus = parse_pci_gpus(s["pci-gpus"].text)
    t = s.get("topo")
    if t is not None and t.rc == 0 and t.text.strip():
        f.topology = parse_topo_m(t.text)
    ib = s.get("ib-sysfs")
    if ib is not None:
        f.ib_ports = parse_ib_sysfs(parse_file_dump(ib.text))
    if "hca-numa" in s:
        f.hca_numa = _numa_dump(s["hca-numa"].text, r"infiniband/([^/]+)/device/numa_node$")
    if "gpu-numa" in s:
        f.gpu_numa = _numa_dump(s["gpu-numa"].text, r"/([0-9a-fA-F]{4}:[0-9a-fA-F:.]+)/numa_node$")
    if "os-release" in s:
        f.os_release = parse_os_release(s["os-release"].text)
    if "kernel" in s and s["kernel"].text.strip():
        f.kernel = node_text(s["kernel"].text.strip().splitlines()[0], 200)
    if "arch" in s and s["arch"].rc == 0 and s["arch"].text.strip():
        f.arch = node_text(s["arch"].text.strip().splitlines()[0], 64)
    if "df" in s:
        entries = parse_df(s["df"].text)
        f.disk = entries[0] if entries else None
    if "net" in s:
        f.net_ifaces = parse_net_ifaces(s["net"].text)
    if "fw" in s:
        f.firmware = s["fw"].text
    pci = s.get("lspci")
    if pci is not None:
        if pci.rc == 0:
            f.pci = parse_lspci(pci.text)
        else:
            why = "lspci not installed (pciutils)" if pci.rc == 127 else f"lspci failed (rc {pci.rc})"
            f.pci_error = why + (f": {pci.text.strip().splitlines()[-1][:200]}" if pci.text.strip() else "")
    iommu = s.get("iommu")
    if iommu is not None:
        cmdline = None
        for line in iommu.text.splitlines():
            if line.startswith("cmdline\t"):
                cmdline = line.partition("\t")[2]
        types = [v for path, v in parse_file_dump(iommu.text).items() if path.endswith("/type")]
        f.iommu = iommu_mode(cmdline, types)
    return f
