"""Host-level hardware rules (HW0xx): every host in `gpu_nodes` describes its GPUs, fabric and HCAs."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable

from provisioner import catalog
from provisioner.defaults import role_default
from provisioner.inventory import membership_origin
from provisioner.model import Fleet, Host
from provisioner.rules import Finding, rule
from provisioner.rules._util import is_int, quoted_hint, show, suggest, type_name
from provisioner.rules.context import RuleContext

HARDWARE_VARS = ("gpu_model", "gpu_count", "fabric", "bootstrap_interface")
FABRICS = ("infiniband", "roce", "ethernet", "efa")
HCA_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]*[0-9](:[1-9][0-9]?)?")  # mlx5_0, mlx5_0:1, mlx5_bond_0
IFNAME_RE = re.compile(r"[A-Za-z0-9_.:@-]{1,15}")  # Linux IFNAMSIZ - 1
MAX_HCAS = 32  # NCCL_IB_HCA takes at most 32 devices
EFA_DEVICE_RE = re.compile(r"rdmap[0-9]+s[0-9]+(f[0-9]+)?")  # rdmap79s0 (PCI bus/slot naming of EFA devices)
MAX_EFA = 32  # p5/p5e: 32 EFA devices, the most of any instance type
SHA256_RE = re.compile(r"[0-9a-fA-F]{64}")
ARCH_ALIASES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}


def _err(code: str, h: Host, var: str, msg: str) -> Finding:
    return Finding(code, "error", msg, host=h.name, var=var)


@rule("HW001", "hardware variable missing on a GPU node")
def missing_hardware_var(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """Every gpu_nodes host needs gpu_model, gpu_count, fabric and bootstrap_interface (usually group vars); on fabric
    efa bootstrap_interface is optional (NCCL_SOCKET_IFNAME then excludes docker, lo and veth)."""
    for h in fleet.gpu_nodes:
        for var in HARDWARE_VARS:
            if var == "bootstrap_interface" and h.vars.get("fabric") == "efa":
                continue
            if h.vars.get(var) is None:
                yield _err("HW001", h, var, f"{var} is not set: set it in group_vars/gpu_nodes.yml or for the host")


@rule("HW002", "hardware variable has the wrong type or range")
def ill_typed_hardware_var(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """gpu_model/fabric/bootstrap_interface are strings, gpu_count an int 1-16, ib_hcas a list of strings."""
    for h in fleet.gpu_nodes:
        v = h.vars
        for var in ("gpu_model", "fabric", "bootstrap_interface"):
            x = v.get(var)
            if x is not None and not isinstance(x, str):
                yield _err("HW002", h, var, f"{var} = {show(x)} is a {type_name(x)}, expected a string")
        n = v.get("gpu_count")
        if n is not None and not (is_int(n) and 1 <= n <= 16):
            what = "out of range" if is_int(n) else f"a {type_name(n)}"
            yield _err("HW002", h, "gpu_count",
                       f"gpu_count = {show(n)} is {what}, expected an integer 1-16{quoted_hint(n, 'int')}")
        hcas = v.get("ib_hcas")
        if hcas is not None and not (isinstance(hcas, (list, tuple)) and all(isinstance(x, str) for x in hcas)):
            hint = ""
            if isinstance(hcas, str):
                items = [x.strip() for x in re.split(r"[,\s]+", hcas.lstrip("=^")) if x.strip()]
                hint = f"; write it as a YAML list: [{', '.join(items)}]"
            yield _err("HW002", h, "ib_hcas", f"ib_hcas = {show(hcas)} is a {type_name(hcas)}, "
                       f"expected a list of HCA names{hint}")
        iface = v.get("bootstrap_interface")
        if isinstance(iface, str) and not IFNAME_RE.fullmatch(iface):
            yield _err("HW002", h, "bootstrap_interface",
                       f"bootstrap_interface = {iface!r} is not a network interface name (1-15 characters, "
                       "no spaces or '/'); use the interface name as `ip link` shows it, e.g. ens1f0")


@rule("HW003", "unknown gpu_model")
def unknown_gpu_model(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """gpu_model must be a key of the GPU catalog (provisioner/catalog/gpus.yaml)."""
    known = list(catalog.gpus())
    for h in fleet.gpu_nodes:
        m = h.vars.get("gpu_model")
        if isinstance(m, str) and m not in known:
            yield _err("HW003", h, "gpu_model", f"gpu_model = {m!r} is not in the GPU catalog{suggest(m, known)}; "
                       f"known: {', '.join(known)}")


@rule("HW004", "unknown fabric")
def unknown_fabric(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """fabric is one of infiniband, roce, ethernet, efa."""
    for h in fleet.gpu_nodes:
        f = h.vars.get("fabric")
        if isinstance(f, str) and f not in FABRICS:
            yield _err("HW004", h, "fabric", f"fabric = {f!r} is not one of {', '.join(FABRICS)}{suggest(f, FABRICS)}")


@rule("HW005", "fabric infiniband without HCAs")
def infiniband_without_hcas(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """An InfiniBand node must list its HCAs (ib_hcas) so NCCL_IB_HCA can pin them."""
    for h in fleet.gpu_nodes:
        if h.vars.get("fabric") == "infiniband" and not h.vars.get("ib_hcas"):
            yield _err("HW005", h, "ib_hcas", "fabric is infiniband but ib_hcas is empty or missing: list the HCAs "
                       "NCCL may use, e.g. ib_hcas: [mlx5_0, mlx5_1, ...]")


@rule("HW006", "malformed HCA name")
def malformed_hca(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """Each ib_hcas entry is `name` or `name:port` (mlx5_0, mlx5_0:1), no duplicates, at most 32."""
    for h in fleet.gpu_nodes:
        hcas = h.ib_hcas
        for x in hcas:
            if not HCA_RE.fullmatch(x):
                hint = ""
                if x[:1] in "=^":
                    hint = " (leave out '=' / '^': nccl_ib_hca is rendered in the exact-match '=' form)"
                elif "," in x:
                    hint = " (one HCA per list item)"
                yield _err("HW006", h, "ib_hcas", f"ib_hcas entry {x!r} is not an HCA name like mlx5_0 or "
                           f"mlx5_0:1{hint}")
        if len(set(hcas)) != len(hcas):
            dups = sorted({x for x in hcas if hcas.count(x) > 1})
            yield _err("HW006", h, "ib_hcas", f"ib_hcas lists an HCA twice ({', '.join(dups)}): list each once")
        if len(hcas) > MAX_HCAS:
            yield _err("HW006", h, "ib_hcas", f"ib_hcas has {len(hcas)} entries; NCCL_IB_HCA takes at most {MAX_HCAS}")


@rule("HW007", "duplicate ansible_host")
def duplicate_address(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """Two inventory hosts with the same ansible_host (and SSH port) are one machine configured twice."""
    by_addr: dict[tuple[str, int], list[str]] = defaultdict(list)
    for h in fleet.hosts.values():
        by_addr[(h.address, h.ssh_port)].append(h.name)
    for (addr, _port), names in by_addr.items():
        if len(names) > 1:
            for n in names[1:]:
                yield Finding("HW007", "error", f"ansible_host {addr} is also used by {names[0]}: give each host "
                              "its own address", host=n, var="ansible_host")


@rule("HW008", "host in two clusters")
def host_in_two_clusters(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """A GPU node serves one vLLM cluster: its GPUs cannot be shared."""
    for h in fleet.hosts.values():
        cs = fleet.cluster_of(h.name)
        if len(cs) > 1:
            # where each membership is set (the inventory's [group] lines), not where the clusters are configured
            where = [w for w in (membership_origin(fleet.source, c, h.name) for c in cs) if w]
            set_in = f" (set in {', '.join(where)})" if where else ""
            yield Finding("HW008", "error", f"host is a member of clusters {', '.join(cs)}: keep it in one{set_in}",
                          host=h.name, group=cs[1])


@rule("HW009", "RoCE node without HCAs")
def roce_without_hcas(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """fabric roce without ib_hcas: NCCL cannot be pinned to the RDMA NICs and may fall back to sockets."""
    for h in fleet.gpu_nodes:
        if h.vars.get("fabric") == "roce" and not h.vars.get("ib_hcas"):
            yield Finding("HW009", "warning", "fabric is roce but ib_hcas is empty: list the RoCE devices "
                          "(e.g. [mlx5_0, mlx5_1]) so NCCL uses RDMA", host=h.name, var="ib_hcas")


def _efa_nodes(fleet: Fleet) -> list[Host]:
    return [h for h in fleet.gpu_nodes if h.vars.get("fabric") == "efa"]


@rule("HW010", "fabric efa without a valid efa_device_count")
def efa_device_count(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """An EFA node states how many EFA devices it has (p5/p5e 32, p5en 16, p4d 4): health counts them."""
    for h in _efa_nodes(fleet):
        n = h.vars.get("efa_device_count")
        if n is None:
            yield _err("HW010", h, "efa_device_count", "fabric is efa but efa_device_count is not set: set the EFA "
                       "devices per node (p5/p5e 32, p5en 16, p4d 4)")
        elif not (is_int(n) and 1 <= n <= MAX_EFA):
            what = "out of range" if is_int(n) else f"a {type_name(n)}"
            yield _err("HW010", h, "efa_device_count", f"efa_device_count = {show(n)} is {what}, expected an "
                       f"integer 1-{MAX_EFA} (p5/p5e 32, p5en 16, p4d 4){quoted_hint(n, 'int')}")


@rule("HW011", "malformed efa_devices")
def efa_device_names(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """efa_devices (optional) lists rdmap* names as /sys/class/infiniband shows them, each once, efa_device_count
    of them."""
    for h in fleet.gpu_nodes:
        devs = h.vars.get("efa_devices")
        if devs is None or devs == []:
            continue
        if h.vars.get("fabric") != "efa":
            yield Finding("HW011", "warning", f"efa_devices is set but fabric is {h.vars.get('fabric')!r}: it is "
                          "read only on fabric efa; remove it or set fabric: efa", host=h.name, var="efa_devices")
            continue
        if not (isinstance(devs, (list, tuple)) and all(isinstance(x, str) for x in devs)):
            yield _err("HW011", h, "efa_devices", f"efa_devices = {show(devs)} is a {type_name(devs)}, expected a "
                       "list of EFA device names like [rdmap79s0, rdmap80s0]")
            continue
        bad = [x for x in devs if not EFA_DEVICE_RE.fullmatch(x)]
        if bad:
            yield _err("HW011", h, "efa_devices", f"efa_devices entry {bad[0]!r} is not an EFA device name like "
                       "rdmap79s0 (ls /sys/class/infiniband on the node)")
        dups = sorted({x for x in devs if list(devs).count(x) > 1})
        if dups:
            yield _err("HW011", h, "efa_devices", f"efa_devices lists {', '.join(dups)} twice: list each once")
        n = h.efa_device_count
        if n is not None and len(set(devs)) != n:
            yield _err("HW011", h, "efa_devices", f"efa_devices names {len(set(devs))} devices but efa_device_count "
                       f"is {n}: make them agree")


@rule("HW012", "ib_hcas on an EFA node")
def ib_hcas_on_efa(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """EFA nodes reach the network through libfabric and aws-ofi-nccl: NCCL_IB_HCA would pin NCCL's own IB transport,
    which EFA does not use."""
    for h in _efa_nodes(fleet):
        for var in ("ib_hcas", "nccl_ib_hca"):
            if h.vars.get(var):
                yield _err("HW012", h, var, f"remove {var}: EFA nodes use the aws-ofi-nccl plugin; set "
                           "efa_device_count")


@rule("HW013", "EFA installer source missing or malformed")
def efa_installer(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """No node assumes internet access: the EFA installer comes from the site's mirror (efa_installer_url, http or
    https) and is checked against efa_installer_sha256 (64 hex digits) before it runs."""
    for h in _efa_nodes(fleet):
        url = h.vars.get("efa_installer_url")
        if not url:
            yield _err("HW013", h, "efa_installer_url", "fabric is efa but efa_installer_url is not set: point it at "
                       "aws-efa-installer-<version>.tar.gz on the site's mirror")
        elif not (isinstance(url, str) and re.fullmatch(r"https?://[^\s/]+/\S+", url)):
            yield _err("HW013", h, "efa_installer_url", f"efa_installer_url = {show(url)} is not an http(s) URL of "
                       "the installer tarball, e.g. https://mirror.example/efa/aws-efa-installer-1.43.2.tar.gz")
        sha = h.vars.get("efa_installer_sha256")
        if not sha:
            yield _err("HW013", h, "efa_installer_sha256", "fabric is efa but efa_installer_sha256 is not set: give "
                       "the tarball's SHA-256 (sha256sum aws-efa-installer-*.tar.gz)")
        elif not (isinstance(sha, str) and SHA256_RE.fullmatch(sha)):
            yield _err("HW013", h, "efa_installer_sha256", f"efa_installer_sha256 = {show(sha)} is not 64 hex "
                       "digits (sha256sum output, without the file name)")


def _version_tuple(v: str) -> tuple[int, ...] | None:
    """580.95.05-1 -> (580, 95, 5); None when it does not start with dotted numbers."""
    m = re.match(r"^(?:[0-9]+:)?([0-9]+(?:\.[0-9]+)*)", v.strip())
    return tuple(int(x) for x in m.group(1).split(".")) if m else None


def driver_version(h: Host) -> str | None:
    """The driver version the host gets: nvidia_driver_version (inventory, else the nvidia_driver role default)."""
    v = h.vars.get("nvidia_driver_version", role_default("nvidia_driver", "nvidia_driver_version"))
    return v if isinstance(v, str) else None


@rule("HW014", "driver older than the GPU needs")
def driver_too_old(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """Each GPU model has a first supporting driver (catalog min_driver: HGX B200 570.133.20, GB200 570.124.06)."""
    for h in fleet.gpu_nodes:
        spec = catalog.gpu(h.gpu_model)
        want = spec.min_driver if spec else None
        have = driver_version(h)
        if not (want and have):
            continue
        hv, wv = _version_tuple(have), _version_tuple(want)
        if hv is not None and wv is not None and hv < wv:
            yield _err("HW014", h, "nvidia_driver_version", f"nvidia_driver_version = {have!r} is older than "
                       f"{want}, the first driver that supports {h.gpu_model}: pin {want} or newer (with "
                       "nvidia_driver_branch to match)")


@rule("HW015", "CPU architecture differs from the GPU model's")
def cpu_arch_mismatch(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """GB200/GB300 trays are Grace (aarch64), HGX boards x86_64: a host whose `ansible_architecture` (an inventory
    hint, or the fact cache) says otherwise gets packages of the wrong architecture."""
    for h in fleet.gpu_nodes:
        spec = catalog.gpu(h.gpu_model)
        arch = h.vars.get("ansible_architecture")
        if spec is None or arch is None:
            continue
        got = ARCH_ALIASES.get(str(arch).lower())
        if got != spec.cpu_arch:
            yield _err("HW015", h, "ansible_architecture", f"ansible_architecture = {show(arch)} but "
                       f"{h.gpu_model} nodes are {spec.cpu_arch}: fix gpu_model or the architecture hint (the "
                       f"roles install {spec.cpu_arch} packages for this model)")


# inventory switches whose default the roles derive from the GPU catalog: variable -> (catalog field, what it runs)
CATALOG_SWITCHES = (
    ("gpu_needs_fabric_manager", "fabric_manager", "Fabric Manager (NVSwitch)"),
    ("gpu_needs_nvlsm", "nvlsm", "NVLSM"),
    ("gpu_needs_imex", "imex", "IMEX (multi-node NVLink)"),
)
_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


def _as_bool(v: object) -> bool | None:
    """Ansible's `| bool` of an inventory value; None when it is not a boolean (or a Jinja expression)."""
    if isinstance(v, bool):
        return v
    if is_int(v) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.strip().lower() in _TRUE + _FALSE:
        return v.strip().lower() in _TRUE
    return None


@rule("HW016", "inventory override disagrees with the GPU catalog")
def catalog_override(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """Values the roles derive from gpu_model's catalog entry, set by hand: gpu_needs_fabric_manager / _nvlsm / _imex
    (turning one on for a model without that hardware is an error: the daemon cannot start; turning it off a
    warning: the node loses it; not for Fabric Manager/NVLSM on fewer GPUs than a full baseboard, which has no
    NVSwitch), node_health_gpu_names without the catalog's nvidia-smi name (warning: the health
    gate would fail every GPU), gpu_count above the catalog's max_per_node (error on NVSwitch/NVL72 boards, whose
    GPU count is fixed; warning elsewhere)."""
    for h in fleet.gpu_nodes:
        spec = catalog.gpu(h.gpu_model)
        if spec is None:
            continue
        m = spec.name
        for var, fact, what in CATALOG_SWITCHES:
            if var not in h.vars:
                continue
            raw = h.vars[var]
            if isinstance(raw, str) and "{{" in raw:
                continue  # a Jinja expression: decided in the play
            want = bool(getattr(spec, fact))
            got = _as_bool(raw)
            if got is None:
                yield _err("HW016", h, var, f"{var} = {show(raw)} is a {type_name(raw)}: expected true or false "
                           f"(catalog says {fact}: {str(want).lower()} for {m}; leave it unset to follow the catalog)")
            elif got and not want:
                yield _err("HW016", h, var, f"{var} = true but the catalog says {fact}: false for {m}: {what} "
                           "cannot run on this hardware; remove it (or fix gpu_model)")
            elif want and not got and not (fact != "imex" and is_int(n := h.vars.get("gpu_count"))
                                           and n < spec.max_per_node):
                # (fewer GPUs than a full NVSwitch baseboard, e.g. a 4-GPU HGX or the simulated 1-GPU node: no
                # NVSwitch, so no Fabric Manager/NVLSM; not reported)
                yield Finding("HW016", "warning", f"{var} = false but the catalog says {fact}: true for {m}: the "
                              f"node runs without {what}; remove it unless the board really lacks it",
                              host=h.name, var=var)
        names = h.vars.get("node_health_gpu_names")
        if isinstance(names, (list, tuple)) and names and spec.smi_name not in names:
            yield Finding("HW016", "warning", f"node_health_gpu_names = {show(names)} leaves out "
                          f"{spec.smi_name!r}, the nvidia-smi name the catalog says for {m}: the health gate would "
                          "fail every GPU of this model; add it, or fix gpu_model", host=h.name,
                          var="node_health_gpu_names")
        n = h.vars.get("gpu_count")
        if is_int(n) and n > spec.max_per_node:
            fixed = spec.nvswitch or spec.imex
            yield Finding("HW016", "error" if fixed else "warning", f"gpu_count = {n} but the catalog says at most "
                          f"{spec.max_per_node} GPUs per node for {m}"
                          f"{' (a fixed baseboard/tray)' if fixed else ''}: fix gpu_count or gpu_model",
                          host=h.name, var="gpu_count")


def _shapes_text(shapes: list[catalog.InstanceSpec]) -> str:
    """'a p5.48xlarge (32 EFA devices)' / 'a p5e.48xlarge (32 EFA devices) or a p5en.48xlarge (16 ...)'."""
    return " or ".join(f"a {s.name} ({s.efa_devices} EFA devices)" for s in shapes)


@rule("HW017", "EFA device count disagrees with the instance shape")
def efa_shape(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """An EFA node is an AWS instance of a known shape (provisioner/catalog/instances.yaml): `aws_instance_type`
    when set, else the shapes with the host's gpu_model x gpu_count (8x H100 is a p5.48xlarge: 32 EFA devices;
    8x H200 a p5e (32) or p5en (16)). efa_device_count must be that shape's count; an unknown aws_instance_type or
    one of other GPUs is an error, a GPU/count no EFA shape has is a warning."""
    shapes = catalog.instances()
    for h in _efa_nodes(fleet):
        n, model, count = h.efa_device_count, h.gpu_model, h.gpu_count
        itype = h.vars.get("aws_instance_type")
        if itype is not None:
            spec = shapes.get(itype) if isinstance(itype, str) else None
            if spec is None:
                yield _err("HW017", h, "aws_instance_type", f"aws_instance_type = {show(itype)} is not an EFA "
                           f"instance type of the catalog{suggest(itype, shapes) if isinstance(itype, str) else ''}; "
                           f"known: {', '.join(shapes)}")
                continue
            if (model, count) != (spec.gpu_model, spec.gpu_count):
                yield _err("HW017", h, "aws_instance_type", f"aws_instance_type {spec.name} has {spec.gpu_count} x "
                           f"{spec.gpu_model or 'a GPU outside the catalog'}, but the host says {count} x {model}: "
                           "fix gpu_model/gpu_count or aws_instance_type")
            elif n is not None and n != spec.efa_devices:
                yield _err("HW017", h, "efa_device_count", f"efa_device_count = {n} but a {spec.name} has "
                           f"{spec.efa_devices} EFA devices: set efa_device_count: {spec.efa_devices}")
            continue
        if model is None or count is None or n is None:
            continue  # HW001/HW002/HW010 report those
        match = [s for s in shapes.values() if (s.gpu_model, s.gpu_count) == (model, count)]
        if not match:
            yield Finding("HW017", "warning", f"no EFA instance type in the catalog carries {count} x {model}: "
                          f"efa_device_count = {n} cannot be checked; set aws_instance_type (or add the shape to "
                          "provisioner/catalog/instances.yaml)", host=h.name, var="efa_device_count")
        elif n not in {s.efa_devices for s in match}:
            one = len(match) == 1
            fix = (f"set efa_device_count: {match[0].efa_devices}" if one else
                   "set aws_instance_type and its count")
            yield _err("HW017", h, "efa_device_count", f"efa_device_count = {n} but {count} x {model} on EFA is "
                       f"{_shapes_text(match)}: {fix}")
