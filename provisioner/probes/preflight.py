"""Preflight: read what each GPU node really has (one SSH exec per host) and compare it with the fleet model.

    facts = probe(fleet, hosts)             # {host: ExecResult + NodeFacts}
    reports = compare(fleet, host, facts)   # pure: expected vs found, per check

Checks (stable names, used in reports and tests): `unreachable`, `gpu_count`, `gpu_model`, `ib_hca` (every HCA of
`ib_hcas` present), `ib_state` (port ACTIVE and LinkUp), `ib_rate` (rate == expected), `numa_affinity` (every GPU has
an expected HCA on its NUMA node; with a topology matrix, the nearest NIC of each GPU is one of `ib_hcas`),
`socket_ifname` (the interface(s) NCCL_SOCKET_IFNAME in the host's rendered /etc/nccl.conf selects exist: NCCL does not
fall back, its bootstrap dies with "no socket interface found"), `acs` (no ACS redirect on a PCIe bridge above a GPU
or HCA, from `lspci -D -vvv`), `iommu` (a warning when the IOMMU translates), `os`, `kernel`, `disk`.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from provisioner.model import Fleet, Host
from provisioner.probes import parsers
from provisioner.probes.parsers import NodeFacts
from provisioner.probes.ssh import DEFAULT_FORKS, DEFAULT_TIMEOUT, ExecResult, run_many, target_for

#: Distributions the roles support (vars/<os>.yml); anything else is a mismatch unless `preflight_os` says otherwise.
SUPPORTED_OS = {("debian", "12"), ("ubuntu", "22.04"), ("ubuntu", "24.04")}
DEFAULT_IB_RATE = 400
DEFAULT_MIN_FREE_GB = 20  # an unknown model: room for a small one; known models: 1.2x their bf16 weights
DEFAULT_MODEL_DIR = "/opt/models"

# Where the probe looks for IB sysfs: the simulated rack's hardware boundary when it exists (the read-only bind of the
# hardware spec, always current; it is also overlaid on /sys/class), else the real /sys/class/infiniband.
HWSIM_DIR = "/var/lib/hwsim"
IB_SYSFS_DIRS = (f"{HWSIM_DIR}/sys/class/infiniband", "/sys/class/infiniband")

# ONE shell snippet per host (POSIX sh). Each part is framed by `@@pv@@ begin NAME` / `@@pv@@ end NAME RC` so a
# failing tool never hides the others; files are printed as PATH<TAB>FIRST LINE. The two nvidia-smi calls run side by
# side (each costs the driver a GPU walk; together they are most of the probe's time on the node). Everything else
# uses shell builtins (`read`, `printf`, globs, parameter expansion): no process per file, so the snippet costs the
# node a handful of forks (mktemp, 2x nvidia-smi, df, cat, rm) whatever the number of HCAs, PCI devices or NICs.
PROBE_SCRIPT = r"""
export LC_ALL=C PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin:/usr/local/nvidia/bin"
b() { echo "@@pv@@ begin $1"; }
e() { echo "@@pv@@ end $1 $2"; }
dump() { for f in "$@"; do [ -r "$f" ] || continue; l=; { read -r l <"$f"; } 2>/dev/null; printf '%s\t%s\n' "$f" "$l"; done; return 0; }
T=$(mktemp -d 2>/dev/null) || { T=/tmp/pv-probe.$$; mkdir -p "$T"; }
(nvidia-smi topo -m >"$T/topo" 2>&1; echo $? >"$T/rc") &
b query-gpu; nvidia-smi --query-gpu=index,name,memory.total,driver_version,persistence_mode,pci.bus_id --format=csv,noheader,nounits 2>&1; e query-gpu $?
b pci-gpus; for d in /sys/bus/pci/devices/*; do v=; { read -r v <"$d/vendor"; } 2>/dev/null; [ "$v" = 0x10de ] || continue; c=; dv=; { read -r c <"$d/class"; read -r dv <"$d/device"; } 2>/dev/null; case $c in 0x0302*|0x0300*) printf '%s\t%s %s\n' "$d" "$dv" "$c";; esac; done; e pci-gpus 0
IB=; for d in __IB_DIRS__; do set -- "$d"/*; if [ -e "$1" ]; then IB=$d; break; fi; done
b ib-sysfs; if [ -n "$IB" ]; then dump "$IB"/*/ports/*/state "$IB"/*/ports/*/phys_state "$IB"/*/ports/*/rate "$IB"/*/ports/*/link_layer; fi; e ib-sysfs $?
b hca-numa; if [ -n "$IB" ]; then dump "$IB"/*/device/numa_node; fi; e hca-numa $?
b gpu-numa; dump /sys/bus/pci/drivers/nvidia/*/numa_node; e gpu-numa $?
b net; for i in /sys/class/net/*; do [ -e "$i" ] && echo "${i##*/}"; done; e net 0
b os-release; if [ -r /etc/os-release ]; then while IFS= read -r l || [ -n "$l" ]; do printf '%s\n' "$l"; done </etc/os-release; else echo "/etc/os-release: not readable"; false; fi; e os-release $?
b kernel; k=; { read -r k </proc/sys/kernel/osrelease; } 2>/dev/null; if [ -n "$k" ]; then echo "$k"; else uname -r; fi; e kernel $?
b lspci; if [ -r __HWSIM__/lspci ]; then while IFS= read -r l || [ -n "$l" ]; do printf '%s\n' "$l"; done <__HWSIM__/lspci; else o=$(lspci -D -vvv 2>&1); rc=$?; case $o in *"<access denied>"*) o2=$(sudo -n lspci -D -vvv 2>/dev/null) && o=$o2;; esac; printf '%s\n' "$o"; (exit $rc); fi; e lspci $?
b iommu; R=; [ -r __HWSIM__/proc/cmdline ] && R=__HWSIM__; c=; { read -r c <"$R/proc/cmdline"; } 2>/dev/null; printf 'cmdline\t%s\n' "$c"; dump "$R"/sys/kernel/iommu_groups/*/type; e iommu 0
b arch; a=; for f in /var/lib/hwsim/proc/sys/kernel/arch /proc/sys/kernel/arch; do [ -z "$a" ] && { read -r a <"$f"; } 2>/dev/null; done; if [ -n "$a" ]; then echo "$a"; else uname -m; fi; e arch $?
D=__DISK__; while [ ! -e "$D" ] && [ "$D" != / ]; do case $D in */*) D=${D%/*}; D=${D:-/};; *) D=.;; esac; done
b df; df -P -B1 "$D" 2>&1; e df $?
wait; b topo; cat "$T/topo"; rc=1; { read -r rc <"$T/rc"; } 2>/dev/null; e topo "$rc"; rm -rf "$T"
"""


def probe_script(disk_path: str = DEFAULT_MODEL_DIR, hwsim_dir: str = HWSIM_DIR, firmware: bool = False) -> str:
    """The probe for one host; `hwsim_dir` (tests) moves the simulated hardware boundary the PCI/IB/IOMMU parts read
    first; `firmware` adds the node's own firmware report (VBIOS, HCA fw_ver: the host's map names gpu or hca)."""
    from provisioner.bmc.firmware import NODE_COMMAND

    ib_dirs = [d.replace(HWSIM_DIR, hwsim_dir, 1) for d in IB_SYSFS_DIRS]
    script = (PROBE_SCRIPT.replace("__IB_DIRS__", " ".join(shlex.quote(d) for d in ib_dirs))
              .replace("__HWSIM__", shlex.quote(hwsim_dir)).replace("__DISK__", shlex.quote(disk_path)))
    return script + (f"b fw; {NODE_COMMAND}; e fw 0\n" if firmware else "")


def _wanted_node_firmware(host: Host) -> dict[str, tuple[str, ...]]:
    from provisioner.bmc.firmware import node_part, wanted_map

    return node_part(wanted_map(host.vars.get("firmware")))


# ------------------------------------------------------------------------------------------ result model
@dataclass
class Mismatch:
    check: str
    expected: str
    found: str
    severity: str = "error"  # error | warning

    def line(self) -> str:
        return f"{self.check}: expected {self.expected}, found {self.found}"


@dataclass
class HostReport:
    host: str
    reachable: bool
    seconds: float = 0.0
    error: str | None = None
    mismatches: list[Mismatch] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)  # a summary of what was found (JSON-able)

    @property
    def ok(self) -> bool:
        return self.reachable and not any(m.severity == "error" for m in self.mismatches)

    @property
    def message(self) -> str:
        """One line: why the host is not ok (empty when it is)."""
        if not self.reachable:
            return f"unreachable: {self.error}"
        return "; ".join(m.line() for m in self.mismatches if m.severity == "error")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        return d


# ------------------------------------------------------------------------------------------ expectations
def _smi_names(gpu_model: str | None) -> tuple[str, ...]:
    """nvidia-smi product names that count as `gpu_model` (the GPU catalog's smi_name / smi_names)."""
    if not gpu_model:
        return ()
    try:
        from provisioner import catalog

        spec = catalog.gpu(gpu_model)
    except Exception:  # catalog missing or unreadable: fall back to the names we know
        spec = None
    names: list[str] = []
    if spec is not None:
        names.append(spec.smi_name)
        names.extend(getattr(spec, "smi_names", None) or ())
    return tuple(dict.fromkeys(names + list(_FALLBACK_SMI.get(gpu_model, ()))))


_FALLBACK_SMI = {
    "H100-SXM5-80GB": ("NVIDIA H100 80GB HBM3",),
    "H200-SXM-141GB": ("NVIDIA H200",),
    "H100-PCIe-80GB": ("NVIDIA H100 PCIe",),
    "H100-NVL-94GB": ("NVIDIA H100 NVL",),
}


def expected_ib_rate(host: Host) -> float:
    v = host.get("ib_rate_gbps", host.get("ib_rate", DEFAULT_IB_RATE))
    try:
        return float(v)
    except (TypeError, ValueError):
        return float(DEFAULT_IB_RATE)


def model_dir(host: Host) -> str:
    v = host.get("vllm_model_dir") or host.get("model_dir") or DEFAULT_MODEL_DIR
    return str(v)


def min_free_bytes(fleet: Fleet, host: Host) -> int:
    """`preflight_min_free_gb` when set; else the larger of 20 GB and 1.2x the bf16 weights of its clusters' model
    (`model_arch`, else `model`, looked up in the model catalog)."""
    v = host.get("preflight_min_free_gb")
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return int(v * 1e9)
    need = DEFAULT_MIN_FREE_GB * 1e9
    try:
        from provisioner import catalog

        for cname in fleet.cluster_of(host.name):
            c = fleet.clusters[cname]
            m = catalog.model(c.get("model_arch")) or catalog.model(c.get("model"))
            if m is not None:
                need = max(need, m.params * 2 * 1.2)
    except Exception:
        pass
    return int(need)


def nccl_socket_ifname(host: Host) -> tuple[str, str] | None:
    """(value, inventory variable) of NCCL_SOCKET_IFNAME in the /etc/nccl.conf templates/nccl.conf.j2 renders for
    `host`; None when the file sets none. The template writes `bootstrap_interface` as an exact match (`=host0`)
    unless it starts with `=` or `^`; `nccl_extra` lines follow, and NCCL keeps the first occurrence of a key, so an
    NCCL_SOCKET_IFNAME in `nccl_extra` counts only without `bootstrap_interface`."""
    raw = host.get("bootstrap_interface")
    ifname = str(raw) if raw else ""  # the template's `default('', true) | string`
    if ifname:
        return (ifname if ifname[0] in "=^" else "=" + ifname), "bootstrap_interface"
    extra = host.get("nccl_extra")
    if isinstance(extra, Mapping) and extra.get("NCCL_SOCKET_IFNAME") not in (None, ""):
        return str(extra["NCCL_SOCKET_IFNAME"]), "nccl_extra.NCCL_SOCKET_IFNAME"
    return None


def _socket_ifname(host: Host, facts: NodeFacts) -> list[Mismatch]:
    """The interfaces NCCL_SOCKET_IFNAME selects exist on the node (/sys/class/net)."""
    want = nccl_socket_ifname(host)
    if want is None or facts.net_ifaces is None:
        return []
    setting, var = want
    present = facts.net_ifaces
    chosen, unmatched = parsers.select_interfaces(setting, present)
    has = f"interfaces: {', '.join(present) or 'none'}"
    expected = f"NCCL_SOCKET_IFNAME={setting} ({var}) to match an interface"
    if not chosen:
        return [Mismatch("socket_ifname", expected, f"no such interface ({has})")]
    if unmatched:
        return [Mismatch("socket_ifname", f"every interface NCCL_SOCKET_IFNAME={setting} ({var}) names",
                         f"no {', '.join(unmatched)} (NCCL uses {', '.join(chosen)}; {has})", "warning")]
    return []


def _os_ok(os_release: dict[str, str], host: Host) -> tuple[bool, str]:
    want = host.get("preflight_os")
    found = f"{os_release.get('ID', '?')} {os_release.get('VERSION_ID', '?')}"
    if want:
        allowed = [str(w).lower() for w in (want if isinstance(want, list) else [want])]
        return found.lower() in allowed, " or ".join(allowed)
    return (os_release.get("ID"), os_release.get("VERSION_ID")) in SUPPORTED_OS, \
        "one of " + ", ".join(f"{a} {b}" for a, b in sorted(SUPPORTED_OS))


# ------------------------------------------------------------------------------------------ compare (pure)
def _firmware(host: Host, facts: NodeFacts) -> list[Mismatch]:
    """`firmware`: the node's own VBIOS / HCA fw_ver against the gpu / hca entries of the host's firmware map."""
    from provisioner.bmc.firmware import HostFirmware, items_from_node
    from provisioner.bmc.firmware import compare as fw_compare

    wanted = _wanted_node_firmware(host)
    if not wanted or facts.firmware is None:
        return []
    out = []
    for f in fw_compare(HostFirmware(host.name, tuple(items_from_node(facts.firmware))), wanted):
        expected = f"{f.component} {' or '.join(f.wanted)} (firmware map)"
        if f.code == "FW011" and f.component == "gpu" and facts.smi_missing:
            out.append(Mismatch("firmware", expected, "VBIOS not readable before the driver is installed (onboarding "
                                "checks it after the run)", "warning"))
        elif f.code == "FW011":
            out.append(Mismatch("firmware", expected, f"the node reports no {f.component} firmware"))
        else:
            out.append(Mismatch("firmware", expected, f"{', '.join(f.found)} on {', '.join(f.ids)}"))
    return out


def compare(fleet: Fleet, host: Host, facts: NodeFacts) -> list[Mismatch]:
    """Expected (inventory) vs found (the node), one Mismatch per difference. Pure."""
    out: list[Mismatch] = []
    # GPUs
    if facts.gpu_error and facts.smi_missing and facts.pci_gpus:
        # no driver yet: count and identify the GPUs on the PCI bus
        if host.gpu_count is not None and len(facts.pci_gpus) != host.gpu_count:
            out.append(Mismatch("gpu_count", str(host.gpu_count), f"{len(facts.pci_gpus)} on the PCI bus (no driver)"))
        names = _smi_names(host.gpu_model)
        bad = sorted({dev for _, dev in facts.pci_gpus if parsers.PCI_GPU_NAMES.get(dev) not in names})
        if names and bad:
            out.append(Mismatch("gpu_model", f"{host.gpu_model} ({' or '.join(repr(n) for n in names)})",
                                ", ".join(f"PCI device {d} ({parsers.PCI_GPU_NAMES.get(d, 'unknown')})" for d in bad)))
    elif facts.gpu_error and facts.smi_missing and host.get("testbed_rack") is not None:
        # the simulated rack simulates GPUs only through nvidia-smi (no PCI devices): nothing to read before install
        out.append(Mismatch("gpu_count", str(host.gpu_count), "not verifiable before the driver is installed "
                            "(simulated rack: no nvidia-smi yet, no PCI devices)", "warning"))
    elif facts.gpu_error:
        out.append(Mismatch("gpu_count", str(host.gpu_count), f"no GPU readable: {facts.gpu_error}"))
    else:
        if host.gpu_count is not None and len(facts.gpus) != host.gpu_count:
            out.append(Mismatch("gpu_count", str(host.gpu_count), str(len(facts.gpus))))
        names = _smi_names(host.gpu_model)
        if names:
            wrong = [g for g in facts.gpus if g.name not in names]
            if wrong:
                found = ", ".join(sorted({f"{g.name!r}" for g in wrong}))
                out.append(Mismatch("gpu_model", f"{host.gpu_model} ({' or '.join(repr(n) for n in names)})",
                                    f"{found} on GPU {','.join(str(g.index) for g in wrong)}"))
    # InfiniBand
    rate = expected_ib_rate(host)
    for hca in host.ib_hcas:
        name, _, port_s = hca.partition(":")
        ports = facts.ib_ports.get(name)
        if not ports:
            out.append(Mismatch("ib_hca", f"{name} present", "absent"
                                + (f" (found {', '.join(sorted(facts.ib_ports)) or 'no HCA'})")))
            continue
        want_ports = [int(port_s)] if port_s.isdigit() else sorted(ports)
        for p in want_ports:
            port = ports.get(p)
            key = f"{name}:{p}"
            if port is None:
                out.append(Mismatch("ib_hca", f"{key} present", "no such port"))
                continue
            if not port.active or not port.link_up:
                out.append(Mismatch("ib_state", f"{key} ACTIVE/LinkUp", f"{port.state}/{port.phys_state}"))
                continue  # a port that is down reports a meaningless rate (SDR): the state says it all
            if port.rate_gbps is not None and port.rate_gbps != rate:
                sev = "error" if port.rate_gbps < rate else "warning"
                out.append(Mismatch("ib_rate", f"{key} {rate:g} Gb/s", f"{port.rate_gbps:g} Gb/s", sev))
    out.extend(_shape(host, facts))
    # NUMA affinity, NCCL bootstrap interface
    out.extend(_numa(host, facts))
    out.extend(_socket_ifname(host, facts))
    out.extend(_pcie(facts))
    # OS / kernel / disk
    if facts.os_release:
        ok, want = _os_ok(facts.os_release, host)
        if not ok:
            out.append(Mismatch("os", want, facts.os_release.get("PRETTY_NAME", "unknown")))
    want_kernel = host.get("preflight_kernel")
    if want_kernel and facts.kernel and not str(facts.kernel).startswith(str(want_kernel)):
        out.append(Mismatch("kernel", str(want_kernel), facts.kernel))
    need = min_free_bytes(fleet, host)
    if facts.disk is None:
        out.append(Mismatch("disk", f">= {need / 1e9:.0f} GB free for models", "df gave nothing", "warning"))
    elif facts.disk.avail < need:
        # simulated hosts share the controller's disk and serve the golden layer's tiny model: a warning there
        sev = "warning" if host.get("testbed_rack") is not None else "error"
        out.append(Mismatch("disk", f">= {need / 1e9:.0f} GB free under {facts.disk_path}",
                            f"{facts.disk.avail / 1e9:.0f} GB free on {facts.disk.mount}", sev))
    out.extend(_firmware(host, facts))
    return out


def _shape(host: Host, facts: NodeFacts) -> list[Mismatch]:
    """What the node shape needs before anything is installed: the CPU architecture of the GPU model (GB200/GB300
    trays are aarch64) and, on fabric efa, the EFA devices (rdmap* in sysfs: the kernel's efa driver shows them before
    the EFA installer runs)."""
    from provisioner import catalog

    out: list[Mismatch] = []
    spec = catalog.gpu(host.gpu_model)
    if spec is not None and facts.arch:
        arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(facts.arch, facts.arch)
        if arch != spec.cpu_arch:
            out.append(Mismatch("cpu_arch", f"{spec.cpu_arch} ({host.gpu_model})", facts.arch))
    want = host.efa_device_count if host.fabric == "efa" else None
    if want:
        efa = {n: ports.get(1) for n, ports in facts.ib_ports.items() if n.startswith("rdmap")}
        up = sorted(n for n, p in efa.items() if p is not None and p.active)
        if len(up) < want:
            down = sorted(set(efa) - set(up))
            out.append(Mismatch("efa_devices", f"{want} EFA devices ACTIVE", f"{len(up)} ACTIVE"
                                + (f" ({', '.join(down)} not ACTIVE)" if down else "")))
        missing = [n for n in host.efa_devices if n not in up]
        if missing:
            out.append(Mismatch("efa_devices", ", ".join(host.efa_devices), f"missing or down: {', '.join(missing)}"))
    return out


ACS_EXPECTED = "ACS redirect off on the PCIe bridges above GPUs and HCAs (GPUDirect P2P/RDMA)"


def _pcie(facts: NodeFacts) -> list[Mismatch]:
    """`acs`: no bridge above a GPU or HCA has ACS request/completion redirect on (NCCL's troubleshooting guide:
    ACS must be off for GPUDirect P2P/RDMA), naming each bridge and what is below it. `iommu`: a translating IOMMU
    is a warning (GPUDirect RDMA wants it off or in passthrough)."""
    out: list[Mismatch] = []
    if facts.pci is not None:
        redirects = parsers.acs_redirects(facts.pci)
        if redirects:
            out.append(Mismatch("acs", ACS_EXPECTED, parsers.acs_message(redirects)))
        elif parsers.acs_unreadable(facts.pci) and not any(f.acs is not None for f in facts.pci):
            out.append(Mismatch("acs", ACS_EXPECTED, "not readable: lspci shows no capabilities without root "
                                "(run preflight as root or allow `sudo -n lspci`)", "warning"))
    elif facts.pci_error:
        out.append(Mismatch("acs", ACS_EXPECTED, f"not checked: {facts.pci_error}", "warning"))
    if facts.iommu and facts.iommu[0] == "translated":
        out.append(Mismatch("iommu", "IOMMU off or passthrough (iommu=pt) for GPUDirect RDMA",
                            f"translated ({facts.iommu[1]})", "warning"))
    return out


def _numa(host: Host, facts: NodeFacts) -> list[Mismatch]:
    hcas = [h.partition(":")[0] for h in host.ib_hcas]
    if not hcas or not facts.gpus:
        return []
    out: list[Mismatch] = []
    topo = facts.topology
    # GPU NUMA node: topo -m's NUMA Affinity, else the PCI device's numa_node
    gpu_numa: dict[int, int | None] = {}
    for g in facts.gpus:
        n = topo.numa_affinity.get(f"GPU{g.index}") if topo else None
        if n is None and g.pci_bus_id:
            bus = g.pci_bus_id.lower()
            bus = bus[4:] if len(bus) == 16 else bus  # 00000000:18:00.0 -> 0000:18:00.0
            n = facts.gpu_numa.get(bus)
        gpu_numa[g.index] = n
    hca_numa = {h: facts.hca_numa.get(h) for h in hcas if h in facts.ib_ports}
    known = {n for n in hca_numa.values() if n is not None}
    if known:
        lonely = sorted(i for i, n in gpu_numa.items() if n is not None and n not in known)
        if lonely:
            out.append(Mismatch("numa_affinity", "an ib_hcas HCA on every GPU's NUMA node",
                                "GPU " + ",".join(map(str, lonely)) + " on NUMA "
                                + ",".join(sorted({str(gpu_numa[i]) for i in lonely}))
                                + f" (HCAs on NUMA {','.join(map(str, sorted(known)))})"))
    if topo and topo.nics:
        far = []
        for g in facts.gpus:
            nic, link = topo.nearest_nic(f"GPU{g.index}")
            if nic is None:
                continue
            if link in ("NODE", "SYS") or nic not in hcas:
                far.append(f"GPU{g.index}->{nic} ({link})")
        if far:
            out.append(Mismatch("numa_affinity", "each GPU's nearest NIC (PIX/PXB/PHB) one of ib_hcas",
                                "; ".join(far), "warning"))
    return out


def summarize(facts: NodeFacts) -> dict[str, Any]:
    return {
        "gpus": [{"index": g.index, "name": g.name, "memory_mib": g.memory_mib, "driver": g.driver_version,
                  "persistence": g.persistence_mode} for g in facts.gpus],
        "gpu_error": facts.gpu_error,
        "ib": {f"{h}:{p.port}": {"state": p.state, "phys_state": p.phys_state, "rate_gbps": p.rate_gbps,
                                 "numa": facts.hca_numa.get(h)} for h, ports in facts.ib_ports.items()
               for p in ports.values()},
        "os": facts.os_release.get("PRETTY_NAME"),
        "kernel": facts.kernel,
        "disk_free_bytes": facts.disk.avail if facts.disk else None,
        "disk_mount": facts.disk.mount if facts.disk else None,
        "net_ifaces": facts.net_ifaces,
        "acs_redirect": None if facts.pci is None else [r.bridge for r in parsers.acs_redirects(facts.pci)],
        "iommu": facts.iommu[0] if facts.iommu else None,
    }


# ------------------------------------------------------------------------------------------ probe (I/O)
def probe(fleet: Fleet, hosts: Iterable[str], *, timeout: float = DEFAULT_TIMEOUT, forks: int = DEFAULT_FORKS,
          on_result: Callable[[ExecResult], None] | None = None) -> dict[str, HostReport]:
    """Probe `hosts` in parallel and compare each with the fleet; one HostReport per host, in the given order."""
    names = list(hosts)
    targets = [target_for(fleet.hosts[n]) for n in names]
    scripts = {n: probe_script(model_dir(fleet.hosts[n]), firmware=bool(_wanted_node_firmware(fleet.hosts[n])))
               for n in names}
    results = run_many(targets, lambda t: scripts[t.name], timeout=timeout, forks=forks, on_result=on_result)
    reports = {n: report_from(fleet, fleet.hosts[n], results[n]) for n in names}
    bios_acs_hints(fleet, reports)
    return reports


def bios_acs_hints(fleet: Fleet, reports: dict[str, HostReport]) -> None:
    """For hosts failing `acs` that have a BMC: name the BIOS attribute behind it (Bios.Attributes over Redfish),
    added to the finding; a BMC that cannot be read says so in the finding and changes nothing else."""
    hosts = [n for n, r in reports.items() if fleet.hosts[n].vars.get("bmc_address")
             and any(m.check == "acs" and m.severity == "error" for m in r.mismatches)]
    if not hosts:
        return
    from provisioner.bmc.config import BmcConfigError
    from provisioner.bmc.firmware import acs_hint
    from provisioner.bmc.redfish import Bmc, BmcError
    from provisioner.bmc.session import bmc_target, each, setup_vault
    from provisioner.errors import UsageError

    try:
        setup_vault(fleet, hosts, None)  # once per process, before the threads
    except UsageError as exc:
        vault_error: str | None = f"the BIOS attributes were not read: {exc}"
    else:
        vault_error = None

    def one(host: str) -> str:
        if vault_error is not None:
            return vault_error
        try:
            hint = acs_hint(Bmc(bmc_target(fleet, host), timeout=10.0).bios_attributes())
        except (BmcConfigError, BmcError) as exc:
            return f"the BIOS attributes were not read: {exc}"
        return hint or "the BMC exposes no ACS BIOS attribute"

    for host, hint in each(hosts, one, 16).items():
        text = hint if isinstance(hint, str) else f"the BIOS attributes were not read: {type(hint).__name__}"
        for m in reports[host].mismatches:
            if m.check == "acs" and m.severity == "error":
                m.found = f"{m.found}; {text}"


def report_from(fleet: Fleet, host: Host, r: ExecResult) -> HostReport:
    if not r.ok:
        return HostReport(host.name, reachable=False, seconds=r.seconds, error=r.error,
                          mismatches=[Mismatch("unreachable", "SSH reachable", r.error or "unreachable")])
    facts = parsers.parse_probe(r.stdout, disk_path=model_dir(host))
    return HostReport(host.name, reachable=True, seconds=r.seconds, mismatches=compare(fleet, host, facts),
                      facts=summarize(facts))


def select_hosts(fleet: Fleet, limit: str | None) -> list[str]:
    """GPU nodes (or hosts declaring gpu_count) matching an Ansible-style --limit: comma/colon separated names,
    groups or globs; `!x` excludes, `&x` intersects."""
    import fnmatch

    cand = [h.name for h in fleet.hosts.values() if h.is_gpu_node or h.gpu_count is not None]
    if not limit:
        return cand

    def match(pat: str) -> set[str]:
        return {n for n in cand if fnmatch.fnmatch(n, pat) or any(fnmatch.fnmatch(g, pat)
                                                                   for g in fleet.hosts[n].groups)}

    sel: set[str] | None = None
    inter: list[set[str]] = []
    excl: set[str] = set()
    for tok in [t.strip() for t in limit.replace(":", ",").split(",") if t.strip()]:
        if tok.startswith("!"):
            excl |= match(tok[1:])
        elif tok.startswith("&"):
            inter.append(match(tok[1:]))
        else:
            sel = (sel or set()) | match(tok)
    chosen = set(cand) if sel is None else sel
    for s in inter:
        chosen &= s
    chosen -= excl
    return [n for n in cand if n in chosen]


def run_preflight(fleet: Fleet, hosts: Iterable[str] | None = None, **kw: Any) -> dict[str, HostReport]:
    """Entry point for `provision run` / `onboard`: probe `hosts` (default: every GPU node)."""
    return probe(fleet, select_hosts(fleet, None) if hosts is None else
                 [h for h in hosts if h in fleet.hosts and (fleet.hosts[h].is_gpu_node
                                                            or fleet.hosts[h].gpu_count is not None)], **kw)


def timed_probe(fleet: Fleet, hosts: list[str], **kw: Any) -> tuple[dict[str, HostReport], float]:
    t0 = time.monotonic()
    r = probe(fleet, hosts, **kw)
    return r, time.monotonic() - t0
