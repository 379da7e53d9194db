"""Host-level hardware rules (HW0xx): every host in `gpu_nodes` describes its GPUs, fabric and HCAs."""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Iterable

from provisioner import catalog
from provisioner.model import Fleet, Host
from provisioner.rules import Finding, rule
from provisioner.rules._util import is_int, quoted_hint, show, suggest, type_name
from provisioner.rules.context import RuleContext

HARDWARE_VARS = ("gpu_model", "gpu_count", "fabric", "bootstrap_interface")
FABRICS = ("infiniband", "roce", "ethernet")
HCA_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*[0-9](:[1-9][0-9]?)?$")  # mlx5_0, mlx5_0:1, mlx5_bond_0
IFNAME_RE = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")  # Linux IFNAMSIZ - 1
MAX_HCAS = 32  # NCCL_IB_HCA takes at most 32 devices


def _err(code: str, h: Host, var: str, msg: str) -> Finding:
    return Finding(code, "error", msg, host=h.name, var=var)


@rule("HW001", "hardware variable missing on a GPU node")
def missing_hardware_var(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """Every gpu_nodes host needs gpu_model, gpu_count, fabric and bootstrap_interface (usually group vars)."""
    for h in fleet.gpu_nodes:
        for var in HARDWARE_VARS:
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
        if isinstance(iface, str) and not IFNAME_RE.match(iface):
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
    """fabric is one of infiniband, roce, ethernet."""
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
            if not HCA_RE.match(x):
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
            yield Finding("HW008", "error", f"host is a member of clusters {', '.join(cs)}: keep it in one",
                          host=h.name, group=cs[1], var="vllm_cluster")


@rule("HW009", "RoCE node without HCAs")
def roce_without_hcas(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """fabric roce without ib_hcas: NCCL cannot be pinned to the RDMA NICs and may fall back to sockets."""
    for h in fleet.gpu_nodes:
        if h.vars.get("fabric") == "roce" and not h.vars.get("ib_hcas"):
            yield Finding("HW009", "warning", "fabric is roce but ib_hcas is empty: list the RoCE devices "
                          "(e.g. [mlx5_0, mlx5_1]) so NCCL uses RDMA", host=h.name, var="ib_hcas")
