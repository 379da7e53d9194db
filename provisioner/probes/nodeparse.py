"""What GPU-node tools print, parsed: `nvidia-smi` (-q, --query-gpu CSV, topo -m, nvlink --status), InfiniBand
(ibstat, ibdev2netdev, sysfs), NCCL's list variables (NCCL_IB_HCA, NCCL_SOCKET_IFNAME) and nccl.conf, kernel-log XIDs.

The one copy of these parsers, used by both sides:
- the CLI (provisioner.probes.parsers re-exports them; preflight parses its probe output with them);
- roles/node_health/files/node_health.py, the health program that runs on the nodes: the node_health role installs
  this file next to it (roles/node_health/files/nodeparse.py is a symlink to this one) and `provision health` ships
  both in its one SSH exec, so node_health.py does `import nodeparse` from its own directory.

Hence the rules for this file: Python standard library only, no import from the rest of `provisioner`, syntax that
runs on the node's python3 (>= 3.9; Debian 12 has 3.11; annotations stay strings through `from __future__ import
annotations`), pure functions and dataclasses (no I/O: callers read files and run commands).

Tested on real captured outputs (tests/fixtures/real*/, from H200 machines; tests/fixtures/public/, the documented
public formats). Every parser accepts the text as the tool printed it (ANSI escapes included: `nvidia-smi topo -m`
underlines its header even when piped) and never raises on odd input: unknown lines are skipped, missing values
become None.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

#: XIDs that take a GPU out of service (the list public health suites gate on; ../shared/reference).
CRITICAL_XIDS = frozenset({48, 56, 57, 58, 62, 63, 64, 65, 68, 69, 73, 74, 79, 80, 81, 92, 119, 120})


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


# ------------------------------------------------------------------------------------------ nvidia-smi --query-gpu
QUERY_GPU_FIELDS = ("index", "name", "memory.total", "driver_version", "persistence_mode", "pci.bus_id")


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    memory_mib: int | None
    driver_version: str | None
    persistence_mode: str | None
    pci_bus_id: str | None = None


def parse_query_csv(text: str, fields: tuple[str, ...] | list[str]) -> list[dict[str, str]]:
    """`--query-gpu=F1,F2 --format=csv,noheader,nounits` -> one dict per line. A header line (`--format=csv`) is
    skipped; a product name containing ', ' is rejoined."""
    fields = list(fields)
    rows: list[dict[str, str]] = []
    for line in strip_ansi(text).splitlines():
        if not line.strip():
            continue
        vals = [v.strip() for v in line.split(",")]
        if vals and vals[0] == fields[0]:  # header
            continue
        if len(vals) > len(fields) and "name" in fields:
            i, extra = fields.index("name"), len(vals) - len(fields)
            vals = vals[:i] + [", ".join(vals[i : i + extra + 1])] + vals[i + extra + 1 :]
        if len(vals) != len(fields):
            continue
        rows.append(dict(zip(fields, vals)))
    return rows


def _int_or_none(v: str | None) -> int | None:
    if v is None:
        return None
    m = re.match(r"\s*(\d+)", v)
    return int(m.group(1)) if m else None


def parse_query_gpu(text: str, fields: tuple[str, ...] | list[str] = QUERY_GPU_FIELDS) -> list[GpuInfo]:
    """nvidia-smi --query-gpu=index,name,memory.total,driver_version,persistence_mode[,pci.bus_id] (csv,noheader,
    nounits) -> GpuInfo per GPU. Works with or without `nounits` (`143771 MiB`)."""
    out = []
    for r in parse_query_csv(text, fields):
        idx = _int_or_none(r.get("index"))
        if idx is None:
            continue
        out.append(GpuInfo(index=idx, name=r.get("name", ""), memory_mib=_int_or_none(r.get("memory.total")),
                           driver_version=r.get("driver_version"), persistence_mode=r.get("persistence_mode"),
                           pci_bus_id=r.get("pci.bus_id")))
    return out


# ------------------------------------------------------------------------------------------ nvidia-smi -q
def parse_smi_q(text: str) -> dict[str, Any]:
    """`nvidia-smi -q` -> {"header": {...}, "gpus": [nested dict per GPU, "_bus_id" set]} (nesting by indent)."""
    root: dict[str, Any] = {"header": {}, "gpus": []}
    cur_top: dict[str, Any] = root["header"]
    stack: list[tuple[int, dict[str, Any]]] = []
    for raw in strip_ansi(text).splitlines():
        if not raw.strip() or raw.strip().startswith("==="):
            continue
        m = re.match(r"^GPU ([0-9A-Fa-f]+:[0-9A-Fa-f:.]+)\s*$", raw)
        if m:
            cur_top = {"_bus_id": m.group(1)}
            root["gpus"].append(cur_top)
            stack = [(0, cur_top)]
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        line = raw.strip()
        k, sep, v = line.partition(":")
        k, v = k.strip(), v.strip() if sep else ""
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1] if stack else cur_top
        if v == "":
            child: dict[str, Any] = {}
            parent.setdefault(k, child)
            stack.append((indent, parent[k] if isinstance(parent[k], dict) else child))
        elif k not in parent:
            parent[k] = v
    return root


def dig(d: Any, *path: str) -> Any:
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return None
        d = d[p]
    return d


# ------------------------------------------------------------------------------------------ nvidia-smi topo -m
@dataclass(frozen=True)
class Topology:
    columns: tuple[str, ...]  # GPU0.. NIC0.. (matrix columns)
    matrix: dict[tuple[str, str], str]  # (row, column) -> X / NV18 / PIX / PXB / PHB / NODE / SYS
    cpu_affinity: dict[str, str]  # GPUn -> "0-55,112-167"
    numa_affinity: dict[str, int | None]  # GPUn -> NUMA node (None when N/A)
    nic_names: dict[str, str]  # NIC0 -> mlx5_0

    @property
    def gpus(self) -> list[str]:
        return [c for c in self.columns if c.startswith("GPU")]

    @property
    def nics(self) -> list[str]:
        return [c for c in self.columns if c.startswith("NIC")]

    def link(self, a: str, b: str) -> str | None:
        return self.matrix.get((a, b))

    def nearest_nic(self, gpu: str) -> tuple[str | None, str | None]:
        """(hca name, link) of the NIC with the closest connection to `gpu` (PIX < PXB < PHB < NODE < SYS)."""
        order = {"PIX": 0, "PXB": 1, "PHB": 2, "NODE": 3, "SYS": 4}
        best: tuple[int, str, str] | None = None
        for nic in self.nics:
            cell = self.matrix.get((gpu, nic))
            if cell is None or cell not in order:
                continue
            if best is None or order[cell] < best[0]:
                best = (order[cell], nic, cell)
        if best is None:
            return None, None
        return self.nic_names.get(best[1], best[1]), best[2]


_AFFINITY_HEADERS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")


def parse_topo_m(text: str) -> Topology:
    """`nvidia-smi topo -m`: tab-separated matrix, then a legend and `NIC Legend:` lines (`  NIC0: mlx5_0`).

    Rows of GPUs carry affinity cells after the matrix; the driver prints an empty cell between `NUMA Affinity` and
    `GPU NUMA ID` (seen on H200, driver 580), so affinity cells are taken in order with empty ones dropped."""
    lines = strip_ansi(text).splitlines()
    columns: list[str] = []
    extra_headers: list[str] = []
    matrix: dict[tuple[str, str], str] = {}
    cpu: dict[str, str] = {}
    numa: dict[str, int | None] = {}
    nic_names: dict[str, str] = {}
    in_matrix = False
    for line in lines:
        if not line.strip():
            in_matrix = False if columns else in_matrix
            continue
        m = re.match(r"^\s*(NIC\d+)\s*:\s*(\S+)", line)
        if m:
            nic_names[m.group(1)] = m.group(2)
            continue
        cells = line.split("\t")
        if not columns and line.startswith("\t") or (not columns and cells[0].strip() == "" and len(cells) > 1):
            hdr = [c.strip() for c in cells[1:] if c.strip()]
            columns = [c for c in hdr if re.match(r"^(GPU|NIC|mlx)\S*$", c) and c not in _AFFINITY_HEADERS]
            extra_headers = [c for c in hdr if c in _AFFINITY_HEADERS]
            in_matrix = True
            continue
        if in_matrix and columns:
            row = cells[0].strip()
            if not row:
                continue
            vals = [c.strip() for c in cells[1:]]
            for col, val in zip(columns, vals[: len(columns)]):
                matrix[(row, col)] = val
            rest = [v for v in vals[len(columns) :] if v]
            aff = dict(zip(extra_headers, rest))
            if "CPU Affinity" in aff:
                cpu[row] = aff["CPU Affinity"]
            if "NUMA Affinity" in aff:
                numa[row] = _int_or_none(aff["NUMA Affinity"]) if aff["NUMA Affinity"] != "N/A" else None
    return Topology(tuple(columns), matrix, cpu, numa, nic_names)


# ------------------------------------------------------------------------------------------ InfiniBand
@dataclass(frozen=True)
class IbPort:
    hca: str
    port: int
    state: str | None  # ACTIVE, DOWN, INIT, ARMED
    phys_state: str | None  # LinkUp, Disabled, Polling
    rate_gbps: float | None
    link_layer: str | None = None

    @property
    def active(self) -> bool:
        return (self.state or "").upper() == "ACTIVE"

    @property
    def link_up(self) -> bool:
        return (self.phys_state or "").replace(" ", "").lower() == "linkup"


def _state_word(v: str | None) -> str | None:
    """'4: ACTIVE' -> 'ACTIVE'; '5: LinkUp' -> 'LinkUp'; 'Active' -> 'ACTIVE' for port states."""
    if v is None:
        return None
    w = v.split(":", 1)[1].strip() if ":" in v else v.strip()
    return w or None


def parse_rate(v: str | None) -> float | None:
    """'400 Gb/sec (4X NDR)' or '400' -> 400.0"""
    m = re.match(r"\s*([0-9]+(?:\.[0-9]+)?)", v or "")
    return float(m.group(1)) if m else None


def parse_ibstat(text: str) -> dict[str, dict[int, IbPort]]:
    """`ibstat`: blocks `CA 'mlx5_0'` with indented `Port 1:` / `State:` / `Physical state:` / `Rate:`."""
    out: dict[str, dict[int, IbPort]] = {}
    ca: str | None = None
    port: int | None = None
    vals: dict[str, str] = {}

    def flush() -> None:
        if ca is not None and port is not None:
            out.setdefault(ca, {})[port] = IbPort(
                hca=ca, port=port, state=(vals.get("State") or "").upper() or None,
                phys_state=vals.get("Physical state"), rate_gbps=parse_rate(vals.get("Rate")),
                link_layer=vals.get("Link layer"))

    for line in strip_ansi(text).splitlines():
        m = re.match(r"^CA '([^']+)'", line)
        if m:
            flush()
            ca, port, vals = m.group(1), None, {}
            out.setdefault(ca, {})
            continue
        m = re.match(r"^\s+Port (\d+):\s*$", line)
        if m:
            flush()
            port, vals = int(m.group(1)), {}
            continue
        if port is not None and ":" in line:
            k, _, v = line.strip().partition(":")
            vals[k.strip()] = v.strip()
    flush()
    return out


def parse_ibdev2netdev(text: str) -> dict[str, dict[str, Any]]:
    """`mlx5_0 port 1 ==> ibp24s0 (Up)` -> {"mlx5_0": {"port": 1, "netdev": "ibp24s0", "up": True}}."""
    out: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        m = re.match(r"^\s*(\S+)\s+port\s+(\d+)\s+==>\s+(\S+)\s+\((\w+)\)", line)
        if m:
            out[m.group(1)] = {"port": int(m.group(2)), "netdev": m.group(3), "up": m.group(4).lower() == "up"}
    return out


def parse_ib_sysfs(files: dict[str, str]) -> dict[str, dict[int, IbPort]]:
    """sysfs files keyed by path (`.../infiniband/<hca>/ports/<p>/{state,phys_state,rate,link_layer}`) -> ports."""
    acc: dict[tuple[str, int], dict[str, str]] = {}
    for path, content in files.items():
        m = re.search(r"infiniband/([^/]+)/ports/(\d+)/(state|phys_state|rate|link_layer)$", path)
        if m:
            acc.setdefault((m.group(1), int(m.group(2))), {})[m.group(3)] = content.strip()
    out: dict[str, dict[int, IbPort]] = {}
    for (hca, port), v in sorted(acc.items()):
        out.setdefault(hca, {})[port] = IbPort(
            hca=hca, port=port, state=(_state_word(v.get("state")) or "").upper() or None,
            phys_state=_state_word(v.get("phys_state")), rate_gbps=parse_rate(v.get("rate")),
            link_layer=v.get("link_layer"))
    return out


# ------------------------------------------------------------------------------------------ NCCL settings
def parse_nccl_conf(text: str) -> dict[str, str]:
    """An nccl.conf (`KEY=VALUE` lines) -> {key: value}, as NCCL reads it: split at the first `=`, `#` lines are
    comments, and the FIRST line of a key wins (NCCL sets each with setenv(..., overwrite=0), so the environment
    also wins over the file). templates/nccl.conf.j2 can write a key twice (bootstrap_interface, then nccl_extra)."""
    vals: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        k, _, v = line.partition("=")
        vals.setdefault(k.strip(), v.strip())
    return vals


def _nccl_list_flags(value: str | None) -> tuple[bool, bool, str]:
    """An NCCL interface/HCA list's leading `^` (exclude) and `=` (exact match) -> (exact, exclude, the rest)."""
    v = (value or "").strip()
    exclude = exact = False
    if v.startswith("^"):
        exclude, v = True, v[1:]
    if v.startswith("="):
        exact, v = True, v[1:]
    return exact, exclude, v


def _nccl_hit(name: str, listed: str, exact: bool) -> bool:
    """Does the node's interface/HCA `name` match the list entry `listed`? (exact with `=`, else a prefix)"""
    return name == listed if exact else name.startswith(listed)


def parse_nccl_ib_hca(value: str) -> tuple[bool, bool, list[tuple[str, int | None]]]:
    """NCCL_IB_HCA -> (exact, exclude, [(name, port)]). Names are prefixes unless the list starts with '='."""
    exact, exclude, v = _nccl_list_flags(value)
    items: list[tuple[str, int | None]] = []
    for tok in v.split(","):
        tok = tok.strip()
        if tok:
            name, _, port = tok.partition(":")
            items.append((name, int(port) if port.isdigit() else None))
    return exact, exclude, items


def parse_socket_ifname(value: str | None) -> tuple[bool, bool, list[str]]:
    """NCCL_SOCKET_IFNAME -> (exact, exclude, [names]). NCCL's rules: names are prefixes (`eth` matches eth0, eth1)
    unless the list starts with `=` (exact); a leading `^` excludes; both combine as `^=docker0`."""
    exact, exclude, v = _nccl_list_flags(value)
    return exact, exclude, [t.strip() for t in v.split(",") if t.strip()]


def select_interfaces(value: str, present: list[str] | tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(interfaces of `present` that NCCL_SOCKET_IFNAME=`value` lets NCCL use, in `present`'s order; the listed
    names that match no interface: include lists only). No chosen interface = NCCL bootstrap fails ("Bootstrap :
    no socket interface found"): NCCL does not fall back to another interface."""
    exact, exclude, names = parse_socket_ifname(value)

    def hit(iface: str, name: str) -> bool:
        return _nccl_hit(iface, name, exact)

    if exclude:
        return [i for i in present if not any(hit(i, n) for n in names)], []
    chosen = [i for i in present if any(hit(i, n) for n in names)]
    return chosen, [n for n in names if not any(hit(i, n) for i in present)]


def select_ib_hcas(value: str,
                   present: list[str] | tuple[str, ...]) -> tuple[list[tuple[str, int | None]], list[str]]:
    """([(hca, port, None: every port)] of `present` that NCCL_IB_HCA=`value` selects, in the list's order; the
    listed names that match no HCA: include lists only). The rules of NCCL_SOCKET_IFNAME: prefixes (`mlx5_1` also
    matches mlx5_10..) unless the list starts with `=`; `^` excludes whole HCAs (listed ports are not looked at)."""
    exact, exclude, items = parse_nccl_ib_hca(value)

    def hit(hca: str, name: str) -> bool:
        return _nccl_hit(hca, name, exact)

    if exclude:
        return [(h, None) for h in present if not any(hit(h, n) for n, _ in items)], []
    chosen: list[tuple[str, int | None]] = []
    unmatched: list[str] = []
    for name, port in items:
        match = [h for h in present if hit(h, name)]
        if not match:
            unmatched.append(name)
        chosen.extend((h, port) for h in match)
    return chosen, unmatched


# ------------------------------------------------------------------------------------------ NVLink, kernel log
def parse_nvlink_status(text: str) -> dict[int, dict[int, str]]:
    """`nvidia-smi nvlink --status` -> {gpu: {link: '26.562 GB/s' | 'inactive'}}. Empty on a single PCIe/VM GPU."""
    gpus: dict[int, dict[int, str]] = {}
    cur: int | None = None
    for line in strip_ansi(text).splitlines():
        m = re.match(r"^GPU (\d+):", line)
        if m:
            cur = int(m.group(1))
            gpus[cur] = {}
            continue
        m = re.match(r"^\s+Link (\d+):\s*(.*)$", line)
        if m and cur is not None:
            val = m.group(2).strip()
            gpus[cur][int(m.group(1))] = "inactive" if "inactive" in val.lower() else val
    return gpus


_XID = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f:.]+)\): (\d+)(?:, (.*))?")


@dataclass(frozen=True)
class Xid:
    pci: str
    code: int
    detail: str

    @property
    def critical(self) -> bool:
        return self.code in CRITICAL_XIDS


def parse_xids(text: str) -> list[Xid]:
    """XIDs in kernel log text: /dev/kmsg records (`6,123,456,-;NVRM: Xid ...`), dmesg or journalctl -k lines."""
    return [Xid(m.group(1), int(m.group(2)), (m.group(3) or "").strip()) for m in map(_XID.search, text.splitlines())
            if m]



# ------------------------------------------------------------------------------------------ EFA: fi_info
@dataclass(frozen=True)
class FiDomain:
    provider: str
    fabric: str | None
    domain: str
    ep_type: str | None  # FI_EP_RDM | FI_EP_DGRAM

    @property
    def device(self) -> str:
        """The EFA device (rdmap79s0) behind a libfabric domain (rdmap79s0-rdm, rdmap79s0-dgrm)."""
        return re.sub(r"-(rdm|dgrm)$", "", self.domain)


def parse_fi_info(text: str) -> list[FiDomain]:
    """`fi_info [-p efa] [-t FI_EP_RDM]` -> one FiDomain per `provider:` block (indented `fabric:`, `domain:`,
    `type:` lines). `fi_getinfo: -61 (No data available)` (no device) and other lines give []."""
    out: list[FiDomain] = []
    cur: dict[str, str] | None = None

    def flush() -> None:
        if cur and cur.get("provider") and cur.get("domain"):
            out.append(FiDomain(cur["provider"], cur.get("fabric"), cur["domain"], cur.get("type")))

    for line in strip_ansi(text).splitlines():
        m = re.match(r"^\s*(provider|fabric|domain|version|type|protocol):\s*(\S.*?)\s*$", line)
        if not m:
            continue
        key, val = m.group(1), m.group(2)
        if key == "provider" and not line[:1].isspace():
            flush()
            cur = {}
        if cur is not None:
            cur[key] = val
    flush()
    return out


def efa_devices(domains: list[FiDomain]) -> list[str]:
    """Sorted EFA devices with a reliable-datagram endpoint (what aws-ofi-nccl uses), each once (newer libfabric
    lists a device under both fabrics `efa` and `efa-direct`)."""
    return sorted({d.device for d in domains if d.provider == "efa" and d.ep_type in (None, "FI_EP_RDM")})


# ------------------------------------------------------------------------------------------ IMEX: nvidia-imex-ctl -N
@dataclass(frozen=True)
class ImexNode:
    index: int
    address: str
    status: str  # READY, UNAVAILABLE, ...
    version: str | None


@dataclass(frozen=True)
class ImexDomain:
    state: str | None  # UP | DEGRADED | DOWN (None: no "Domain State:" line)
    nodes: tuple[ImexNode, ...]
    links: dict[int, dict[int, str]]  # from -> to -> C (connected), N, I, R, D, A, !V!, !M!

    def unconnected(self) -> list[tuple[int, int, str]]:
        """(from, to, code) of every matrix cell that is not C."""
        return [(a, b, c) for a, row in sorted(self.links.items()) for b, c in sorted(row.items()) if c != "C"]


def parse_imex_ctl(text: str) -> ImexDomain:
    """`nvidia-imex-ctl -N` (NVIDIA IMEX guide, "The nvidia-imex-ctl Tool"): the legend, a timestamp, `Nodes:` with
    `Node #0   - 10.1.2.3   - READY   - Version: 580.95.05`, the `Nodes From\\To` connectivity matrix, then
    `Domain State: UP`. Lines it does not know are skipped."""
    nodes: list[ImexNode] = []
    links: dict[int, dict[int, str]] = {}
    state: str | None = None
    cols: list[int] | None = None
    for line in strip_ansi(text).splitlines():
        m = re.match(r"^\s*Node\s*#\s*(\d+)\s*-\s*(\S+)\s*-\s*([A-Za-z_]+)(?:\s*-\s*Version:\s*(\S+))?", line)
        if m:
            nodes.append(ImexNode(int(m.group(1)), m.group(2), m.group(3).upper(), m.group(4)))
            continue
        m = re.match(r"^\s*Nodes From\\To\s+(.*)$", line)
        if m:
            cols = [int(x) for x in m.group(1).split() if x.isdigit()]
            continue
        m = re.match(r"^\s*Domain State:\s*(\S+)", line)
        if m:
            state = m.group(1).upper()
            cols = None
            continue
        if cols is not None:
            parts = line.split()
            if parts and parts[0].isdigit() and len(parts) - 1 == len(cols):
                links[int(parts[0])] = dict(zip(cols, parts[1:]))
            elif line.strip():
                cols = None
    return ImexDomain(state, tuple(nodes), links)


# ------------------------------------------------------------------------------------------ reboot pending
#: Where Debian/Ubuntu (update-notifier, unattended-upgrades) and the nvidia_driver role say a reboot is due.
REBOOT_REQUIRED_FILE = "/run/reboot-required"
_NVRM = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+\.\d+(?:\.\d+)?)")


def parse_nvrm_version(text: str | None) -> str | None:
    """The loaded module's version from `/proc/driver/nvidia/version` (`NVRM version: NVIDIA UNIX Open Kernel Module
    for x86_64  580.95.05  Release Build ...`, or the proprietary `NVIDIA UNIX x86_64 Kernel Module  535.104.05 ...`)
    or from `/sys/module/nvidia/version` (the bare version); None when neither form is there."""
    text = (text or "").strip()
    m = _NVRM.search(text)
    if m:
        return m.group(1)
    first = text.splitlines()[0].strip() if text else ""
    return first if re.fullmatch(r"\d+\.\d+(?:\.\d+)?", first) else None


def upstream_version(version: str | None) -> str:
    """'1:580.95.05-1' -> '580.95.05': the driver version a Debian package version stands for."""
    v = (version or "").strip()
    if ":" in v:
        v = v.split(":", 1)[1]
    return v.split("-", 1)[0]


def parse_dpkg_installed(text: str) -> dict[str, str]:
    """`dpkg-query -W -f '${Package} ${db:Status-Abbrev} ${Version}\\n' PATTERN...` -> {package: version} of the
    packages installed (status letter `i`, held or not: `ii `, `hi `); other lines are skipped."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3 and len(parts[1]) >= 2 and parts[1][1] == "i":
            out[parts[0]] = parts[2]
    return out


def reboot_mark_writer(content: str, packages: str | None = None) -> str:
    """Who wrote a reboot-required mark, from its content (the nvidia_driver role says `(provisioner)`) and the
    `.pkgs` file beside it (the Debian/Ubuntu package hooks list the packages that asked for it)."""
    if "(provisioner)" in content:
        return "provisioner's nvidia_driver role"
    pkgs = [p for p in (packages or "").split() if p]
    if pkgs:
        return "a package install (%s)" % ", ".join(pkgs[:6]) + (", ..." if len(pkgs) > 6 else "")
    return "an unknown writer"


@dataclass(frozen=True)
class RebootVerdict:
    """Why a node needs a reboot before it serves (`reasons`, empty: none) and what was compared."""

    reasons: tuple[str, ...]
    compared: bool  # the loaded module and the installed driver were both known


def reboot_verdict(mark: str | None, mark_path: str = REBOOT_REQUIRED_FILE, mark_packages: str | None = None,
                   loaded: tuple[str, str] | None = None,
                   installed: tuple[str, str] | None = None) -> RebootVerdict:
    """A node that must reboot before it serves: the reboot-required mark exists (`mark`: its content, None when
    absent), or the loaded NVIDIA kernel module (`loaded`: (version, where read)) is not the installed driver
    (`installed`: (version, what says so)); package versions compare by their upstream part."""
    reasons: list[str] = []
    if mark is not None:
        first = next((ln.strip() for ln in mark.splitlines() if ln.strip()), "")
        quoted = ': "%s"' % first[:200] if first else ""
        reasons.append("%s exists (written by %s%s): reboot the node"
                       % (mark_path, reboot_mark_writer(mark, mark_packages), quoted))
    compared = bool(loaded and installed and loaded[0] and installed[0])
    if loaded and installed and compared and upstream_version(loaded[0]) != upstream_version(installed[0]):
        reasons.append("loaded NVIDIA kernel module %s (%s) is not the installed driver %s (%s): reboot the node to "
                       "load it" % (loaded[0], loaded[1], upstream_version(installed[0]), installed[1]))
    return RebootVerdict(tuple(reasons), compared)


# --- PCIe Access Control Services (`lspci -vvv`) ------------------------------------------------------------------
# NCCL's troubleshooting guide: ACS redirect on the PCIe bridges between GPUs and NICs sends peer-to-peer traffic up
# to the root complex, which breaks or slows GPUDirect P2P/RDMA; `lspci -vvv` prints `ACSCtl:` per bridge that has
# the capability (root permission needed to see the capabilities at all).

_PCI_HEAD = re.compile(r"^((?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s+([^:]+):\s*(.*)$")
_ACS_FLAG = re.compile(r"(\w+)([+-])")


@dataclass(frozen=True)
class PciAcs:
    """One PCI function with an ACS capability: its address, class and name, and the ACSCtl bits (True = set)."""

    address: str
    device_class: str
    name: str
    ctl: dict  # flag -> bool: SrcValid, TransBlk, ReqRedir, CmpltRedir, UpstreamFwd, EgressCtrl, DirectTrans

    @property
    def is_bridge(self) -> bool:
        return "bridge" in self.device_class.lower()

    @property
    def enabled(self) -> bool:
        """Any ACS control bit set (NCCL's check: `ACSCtl: SrcValid+` means ACS is on)."""
        return any(self.ctl.values())

    @property
    def redirect(self) -> bool:
        """Request or completion redirect on: P2P between devices below this bridge goes through the root complex."""
        return bool(self.ctl.get("ReqRedir") or self.ctl.get("CmpltRedir"))


def parse_lspci_acs(text: str) -> list:
    """Every function of `lspci -vvv` (or `-D -vvv`) output that prints an `ACSCtl:` line, in output order.
    Functions without the capability are left out; an ACSCtl line without a device header is skipped."""
    out = []
    head = None
    for raw in strip_ansi(text).splitlines():
        if raw and not raw[0].isspace():
            m = _PCI_HEAD.match(raw.strip())
            head = m.groups() if m else None
            continue
        line = raw.strip()
        if head is not None and line.startswith("ACSCtl:"):
            flags = {k: v == "+" for k, v in _ACS_FLAG.findall(line[len("ACSCtl:"):])}
            out.append(PciAcs(address=head[0], device_class=head[1].strip(), name=head[2].strip(), ctl=flags))
    return out


# The PCI tree from the same `lspci -D -vvv` text: every bridge prints `Bus: primary=PP, secondary=SS,
# subordinate=UU`, so a function at bus B (same domain) is below a bridge when SS <= B <= UU. GPUs are NVIDIA display
# / 3D controllers; HCAs are Mellanox/NVIDIA InfiniBand or Ethernet controllers (ConnectX in either link layer) and
# AWS EFA devices.
_PCI_BUS_LINE = re.compile(r"^Bus:\s*primary=([0-9a-fA-F]+),\s*secondary=([0-9a-fA-F]+),\s*subordinate=([0-9a-fA-F]+)")
_HCA_CLASSES = ("infiniband controller", "ethernet controller")
_HCA_VENDORS = ("mellanox", "nvidia", "elastic fabric adapter")

#: The fix a failing ACS check names: the BIOS setting (names vary by vendor) or, until the next boot, setpci as in
#: NCCL's troubleshooting guide.
ACS_FIX = ("fix: disable PCIe ACS in the BIOS, on most boards an 'ACS Control' / 'PCIe ACS' setting; until the next "
           "reboot: setpci -s BRIDGE ECAP_ACS+0x6.w=0000")


@dataclass(frozen=True)
class PciFunction:
    """One function of `lspci -vvv`: address as printed, class, name, the bus range below it (bridges), the ACSCtl
    bits (None: no ACS capability shown), and whether lspci could not read its capabilities (not root)."""

    address: str
    device_class: str
    name: str
    secondary: "int | None" = None
    subordinate: "int | None" = None
    acs: "dict | None" = None
    access_denied: bool = False

    @property
    def domain_bus(self) -> tuple:
        """(domain, bus) as integers; a domain-less address (`lspci` without -D) is domain 0."""
        parts = self.address.split(":")
        dom = int(parts[0], 16) if len(parts) == 3 else 0
        return dom, int(parts[-2], 16)

    @property
    def full_address(self) -> str:
        return self.address.lower() if self.address.count(":") == 2 else "0000:" + self.address.lower()

    @property
    def is_bridge(self) -> bool:
        return self.secondary is not None or "bridge" in self.device_class.lower()

    @property
    def redirect(self) -> bool:
        return bool(self.acs and (self.acs.get("ReqRedir") or self.acs.get("CmpltRedir")))

    @property
    def kind(self) -> "str | None":
        """`GPU`, `HCA`, or None for anything else."""
        cls, name = self.device_class.lower(), self.name.lower()
        if ("3d controller" in cls or "vga compatible" in cls) and "nvidia" in name:
            return "GPU"
        if any(c in cls for c in _HCA_CLASSES) and any(v in name for v in _HCA_VENDORS):
            return "HCA"
        return None

    def covers(self, other: "PciFunction") -> bool:
        """`other` sits below this bridge (its bus is in this bridge's secondary..subordinate range)."""
        if self.secondary is None or self.subordinate is None:
            return False
        dom, bus = self.domain_bus
        odom, obus = other.domain_bus
        return dom == odom and self.secondary <= obus <= self.subordinate


def parse_lspci(text: str) -> list:
    """Every function of `lspci [-D] -vvv` output, in output order, with its bridge bus range and ACSCtl bits.
    Never raises: lines that are not understood are skipped."""
    out: list[PciFunction] = []
    cur: dict[str, Any] | None = None
    for raw in strip_ansi(text).splitlines():
        if raw and not raw[0].isspace():
            if cur is not None:
                out.append(PciFunction(**cur))
            m = _PCI_HEAD.match(raw.strip())
            cur = {"address": m.group(1), "device_class": m.group(2).strip(), "name": m.group(3).strip()} if m else None
            continue
        if cur is None:
            continue
        line = raw.strip()
        m = _PCI_BUS_LINE.match(line)
        if m:
            cur["secondary"], cur["subordinate"] = int(m.group(2), 16), int(m.group(3), 16)
        elif line.startswith("ACSCtl:") and "acs" not in cur:
            cur["acs"] = {k: v == "+" for k, v in _ACS_FLAG.findall(line[len("ACSCtl:"):])}
        elif line.startswith("Capabilities:") and "<access denied>" in line:
            cur["access_denied"] = True
    if cur is not None:
        out.append(PciFunction(**cur))
    return out


@dataclass(frozen=True)
class AcsRedirect:
    """A bridge with ACS request/completion redirect on, and the GPUs/HCAs below it: [(kind, address, name)]."""

    bridge: str
    bridge_name: str
    devices: tuple

    def line(self) -> str:
        below = ", ".join("%s %s" % (kind, addr) for kind, addr, _ in self.devices)
        return "ACS redirect on at bridge %s above %s" % (self.bridge, below)


def acs_redirects(functions: list) -> list:
    """Bridges with ACS redirect on above a GPU or an HCA, in lspci order (NCCL's troubleshooting guide: ACS must be
    off on the path for GPUDirect P2P/RDMA; with redirect on, peer traffic detours through the root complex)."""
    targets = [f for f in functions if f.kind]
    out = []
    for br in functions:
        if not br.redirect:
            continue
        below = tuple((t.kind, t.full_address, t.name) for t in targets if br.covers(t))
        if below:
            out.append(AcsRedirect(br.full_address, br.name, below))
    return out


def acs_unreadable(functions: list) -> bool:
    """lspci ran without root: capabilities `<access denied>`, so no ACSCtl line could be read."""
    return any(f.access_denied for f in functions if f.is_bridge)


def acs_message(found: list, limit: int = 4) -> str:
    """One line for a failing check: the first `limit` bridges (with what is below them), the count of the rest, the
    fix."""
    parts = [r.line() for r in found[:limit]]
    if len(found) > limit:
        parts.append("and %d more bridge(s)" % (len(found) - limit))
    return "; ".join(parts) + " (%s)" % ACS_FIX


# --- IOMMU mode (`/proc/cmdline`, `/sys/kernel/iommu_groups/*/type`) -----------------------------------------------
# Kernel >= 5.11 writes each IOMMU group's default domain type: `identity` (passthrough: devices DMA to physical
# addresses, what GPUDirect RDMA wants), `DMA` / `DMA-FQ` (translated). No groups at all: no IOMMU in use.

def iommu_mode(cmdline: "str | None", group_types: list) -> tuple:
    """(mode, why): mode `off`, `passthrough` or `translated`; `why` names what decided it."""
    args = {}
    for tok in (cmdline or "").split():
        k, _, v = tok.partition("=")
        args[k] = v
    types = sorted({t.strip() for t in group_types if t and t.strip()})
    if types:
        if all(t == "identity" for t in types):
            return "passthrough", "iommu_groups type identity"
        return "translated", "iommu_groups type %s" % ",".join(t for t in types if t != "identity")
    for key in ("intel_iommu", "amd_iommu"):
        if args.get(key) == "off":
            return "off", "%s=off" % key
    if args.get("iommu") == "pt" or args.get("iommu.passthrough") == "1":
        return "passthrough", "iommu=pt" if args.get("iommu") == "pt" else "iommu.passthrough=1"
    for key in ("intel_iommu", "amd_iommu"):
        if args.get(key, "").startswith("on"):
            return "translated", "%s=%s" % (key, args[key])
    return "off", "no IOMMU groups"
