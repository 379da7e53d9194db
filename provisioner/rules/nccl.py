"""NCCL tuning rules (NCCL0xx): values NCCL would reject or silently misread. Defaults: roles/nccl_tuning."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from provisioner.defaults import role_default
from provisioner.model import Fleet, Host
from provisioner.rules import Finding, Severity, rule
from provisioner.rules._util import is_int, quoted_hint, show, suggest, type_name
from provisioner.rules.context import RuleContext

ALGOS = ("ring", "tree", "collnetdirect", "collnetchain", "nvls", "nvlstree", "pat")
COLLECTIVES = ("allreduce", "broadcast", "reduce", "allgather", "reducescatter", "sendrecv", "alltoall")
NCCL_VAR_RE = re.compile(r"NCCL_[A-Z0-9_]+")

# Every key templates/nccl.conf.j2 writes from another variable -> the variable to set instead. nccl.conf holds one
# KEY=VALUE a line and NCCL reads the first line of a repeated key, so the same key in nccl_extra (rendered after
# these) would be silently ignored. tests/unit/test_knobs.py checks this table against the template's keys.
MANAGED_KEYS: dict[str, str] = {
    "NCCL_IB_DISABLE": "fabric (fabric: ethernet renders NCCL_IB_DISABLE=1)",
    "FI_PROVIDER": "fabric (fabric: efa renders FI_PROVIDER=efa)",
    "FI_EFA_FORK_SAFE": "fabric (fabric: efa renders FI_EFA_FORK_SAFE=1)",
    "NCCL_TUNER_PLUGIN": "efa_nccl_tuner and aws_ofi_nccl_dir",
    "NCCL_IB_HCA": "ib_hcas (or nccl_ib_hca)",
    "NCCL_SOCKET_IFNAME": "bootstrap_interface",
    "NCCL_ALGO": "nccl_algo",
    "NCCL_IB_TIMEOUT": "nccl_ib_timeout",
    "NCCL_IB_RETRY_CNT": "nccl_ib_retry_cnt",
    "NCCL_IB_GID_INDEX": "nccl_ib_gid_index",
    "NCCL_CROSS_NIC": "nccl_cross_nic",
}
# keys the template writes on some fabrics only; elsewhere nccl_extra may set them (the others: every fabric)
MANAGED_ON: dict[str, tuple[str, ...]] = {"NCCL_TUNER_PLUGIN": ("efa",)}
# what the aws-ofi-nccl plugin (installed on fabric efa only) is called in NCCL_NET / NCCL_NET_PLUGIN
OFI_RE = re.compile(r"ofi|libfabric", re.IGNORECASE)


def _get(h: Host, var: str) -> Any:
    return h.vars[var] if var in h.vars else role_default("nccl_tuning", var)


def _range(h: Host, code: str, var: str, lo: int, hi: int, why: str) -> Iterable[Finding]:
    v = _get(h, var)
    if not (is_int(v) and lo <= v <= hi):
        what = "out of range" if is_int(v) else f"a {type_name(v)}"
        yield Finding(code, "error", f"{var} = {show(v)} is {what}: expected an integer {lo}-{hi} ({why})"
                      f"{quoted_hint(v, 'int')}", host=h.name, var=var)


@rule("NCCL001", "nccl_ib_timeout outside 1-31")
def ib_timeout(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """NCCL_IB_TIMEOUT is 4.096 us x 2^n, valid 1-31 (0 or >= 32 means infinite); 22 = 17 s per try."""
    for h in fleet.gpu_nodes:
        yield from _range(h, "NCCL001", "nccl_ib_timeout", 1, 31, "4.096 us x 2^n; 22 waits 17 s per try")


@rule("NCCL002", "nccl_ib_retry_cnt outside 0-7")
def ib_retry_cnt(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """NCCL_IB_RETRY_CNT is a 3-bit InfiniBand field: 0-7."""
    for h in fleet.gpu_nodes:
        yield from _range(h, "NCCL002", "nccl_ib_retry_cnt", 0, 7, "a 3-bit InfiniBand field")


def algo_problems(value: Any) -> list[str]:
    """Problems in an NCCL_ALGO value: `Ring`, `Ring,Tree`, `^NVLS`, or per collective `allreduce:ring;broadcast:tree`
    (NCCL >= 2.24). Tokens are case-insensitive; an unknown token is a hard error in NCCL."""
    if not isinstance(value, str) or not value.strip():
        return [f"{show(value)} is a {type_name(value)}, expected a string such as Ring"]
    out: list[str] = []
    for part in value.split(";"):
        part = part.strip()
        if not part:
            continue
        if ":" in part:
            coll, _, algos = part.partition(":")
            if coll.strip().lower() not in COLLECTIVES:
                out.append(f"unknown collective {coll.strip()!r}{suggest(coll.strip().lower(), COLLECTIVES)}")
        else:
            algos = part
        algos = algos.strip().lstrip("^")
        for tok in algos.split(","):
            t = tok.strip()
            if t.lower() not in ALGOS:
                out.append(f"unknown algorithm {t!r}{suggest(t.lower(), ALGOS)}")
    return out


@rule("NCCL003", "unknown nccl_algo token")
def nccl_algo(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """Tokens: Ring, Tree, CollnetDirect, CollnetChain, NVLS, NVLSTree, PAT, optionally per collective."""
    for h in fleet.gpu_nodes:
        for p in algo_problems(_get(h, "nccl_algo")):
            yield Finding("NCCL003", "error", f"nccl_algo: {p}; valid: Ring, Tree, CollnetDirect, CollnetChain, "
                          "NVLS, NVLSTree, PAT (per collective: allreduce:ring;broadcast:tree)",
                          host=h.name, var="nccl_algo")


@rule("NCCL004", "ill-typed NCCL setting")
def nccl_types(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """nccl_ib_gid_index is null or an int >= -1, nccl_cross_nic null/0/1/2, nccl_extra a dict of NCCL_* -> scalar,
    nccl_ib_hca (when set by hand) a string."""
    for h in fleet.gpu_nodes:
        gid = _get(h, "nccl_ib_gid_index")
        if gid is not None and not (is_int(gid) and gid >= -1):
            yield Finding("NCCL004", "error", f"nccl_ib_gid_index = {show(gid)}: expected an integer >= -1 "
                          f"(-1 = auto) or null{quoted_hint(gid, 'int')}", host=h.name, var="nccl_ib_gid_index")
        cn = _get(h, "nccl_cross_nic")
        if cn is not None and not (is_int(cn) and cn in (0, 1, 2)):
            yield Finding("NCCL004", "error", f"nccl_cross_nic = {show(cn)}: expected 0 (rail-optimized), 1 (allow) "
                          f"or 2 (default){quoted_hint(cn, 'int')}", host=h.name, var="nccl_cross_nic")
        extra = _get(h, "nccl_extra")
        if extra is not None and not isinstance(extra, dict):
            yield Finding("NCCL004", "error", f"nccl_extra = {show(extra)} is a {type_name(extra)}: expected a dict "
                          "like {NCCL_DEBUG: WARN}", host=h.name, var="nccl_extra")
        elif isinstance(extra, dict):
            for k, v in extra.items():
                if not (isinstance(k, str) and NCCL_VAR_RE.fullmatch(k)):
                    yield Finding("NCCL004", "error", f"nccl_extra key {k!r} is not an NCCL variable name "
                                  "(NCCL_ and capitals)", host=h.name, var="nccl_extra")
                elif isinstance(v, (dict, list, tuple)) or v is None:
                    yield Finding("NCCL004", "error", f"nccl_extra.{k} = {show(v)}: expected a string or number",
                                  host=h.name, var="nccl_extra")
        hca = h.vars.get("nccl_ib_hca")
        if hca is not None and not isinstance(hca, str):
            yield Finding("NCCL004", "error", f"nccl_ib_hca = {show(hca)} is a {type_name(hca)}: leave it unset "
                          "(derived from ib_hcas) or give the NCCL string, e.g. '=mlx5_0:1,mlx5_1:1'",
                          host=h.name, var="nccl_ib_hca")


@rule("NCCL005", "NCCL setting NVIDIA advises against, or prefix-matched HCA list")
def nccl_advice(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """NCCL_PROTO forced in nccl_extra (can corrupt data with LL128); a hand-written nccl_ib_hca without the leading
    '=' matches by prefix (mlx5_1 also picks mlx5_10..mlx5_19)."""
    for h in fleet.gpu_nodes:
        extra = _get(h, "nccl_extra")
        if isinstance(extra, dict) and "NCCL_PROTO" in extra:
            yield Finding("NCCL005", "warning", "nccl_extra sets NCCL_PROTO: NVIDIA advises against forcing the "
                          "protocol in production (LL128 can corrupt data); remove it", host=h.name, var="nccl_extra")
        hca = h.vars.get("nccl_ib_hca")
        if isinstance(hca, str) and hca and not hca.startswith(("=", "^")):
            yield Finding("NCCL005", "warning", f"nccl_ib_hca = {hca!r} matches HCA names by prefix (mlx5_1 also "
                          f"selects mlx5_10..19): write '={hca}' or drop it and let ib_hcas derive it",
                          host=h.name, var="nccl_ib_hca")


def _extra(h: Host) -> dict[str, Any]:
    extra = _get(h, "nccl_extra")
    return {k: v for k, v in extra.items() if isinstance(k, str)} if isinstance(extra, dict) else {}


def _fabric(h: Host) -> Any:
    return _get(h, "fabric")


@rule("NCCL006", "nccl_extra sets a key the suite manages")
def extra_managed_key(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """nccl_extra is rendered after the lines nccl.conf.j2 writes from the nccl_* and hardware variables; NCCL reads
    the first line of a repeated key, so the same key in nccl_extra would be silently ignored (and its own variable
    is the one the other rules check). NCCL_IB_* on fabric efa: NCCL007."""
    for h in fleet.gpu_nodes:
        fabric = _fabric(h)
        for k in sorted(_extra(h)):
            if k not in MANAGED_KEYS or fabric not in MANAGED_ON.get(k, (fabric,)):
                continue
            if fabric == "efa" and k.startswith("NCCL_IB_"):
                continue  # NCCL007 says more
            instead = MANAGED_KEYS[k]
            if k == "NCCL_ALGO" and fabric == "efa":
                instead = ("efa_nccl_tuner: false and nccl_algo (on fabric efa the aws-ofi-nccl tuner picks the "
                           "algorithm)")
            yield Finding("NCCL006", "error", f"nccl_extra sets {k}, which nccl.conf.j2 writes from {instead}: "
                          f"nccl.conf holds one line per key and NCCL reads the first, so this value would be "
                          f"ignored; remove nccl_extra.{k} and set {instead.split(' (')[0]}", host=h.name,
                          var="nccl_extra")


@rule("NCCL007", "nccl_extra contradicts the host's fabric")
def extra_contradicts_fabric(fleet: Fleet, ctx: RuleContext) -> Iterable[Finding]:
    """fabric efa: no NCCL_IB_* key (NCCL's IB transport is not used: aws-ofi-nccl carries NCCL over libfabric) and
    NCCL_NET / NCCL_NET_PLUGIN only naming that plugin. Other fabrics: the aws-ofi-nccl plugin is not installed,
    NCCL_NET=Socket on infiniband/roce gives up RDMA, NCCL_NET=IB on ethernet contradicts NCCL_IB_DISABLE=1; NCCL_IB_*
    keys on ethernet are read by nobody (warning)."""
    for h in fleet.gpu_nodes:
        fabric = _fabric(h)
        extra = _extra(h)

        def bad(k: str, why: str, sev: Severity = "error", h: Host = h, extra: dict[str, Any] = extra) -> Finding:
            return Finding("NCCL007", sev, f"nccl_extra.{k} = {show(extra[k])} on fabric {_fabric(h)}: {why}",
                           host=h.name, var="nccl_extra")

        net = str(extra.get("NCCL_NET", "")).strip()
        plugin = str(extra.get("NCCL_NET_PLUGIN", "")).strip()
        if fabric == "efa":
            for k in sorted(x for x in extra if x.startswith("NCCL_IB_")):
                yield bad(k, "EFA nodes carry NCCL over libfabric with the aws-ofi-nccl plugin, NCCL's own IB "
                          "transport is not used; remove it (the EFA settings come from fabric: efa and "
                          "efa_device_count)")
            if net and not OFI_RE.search(net):
                yield bad("NCCL_NET", "the aws-ofi-nccl plugin ('Libfabric') is EFA's only network; remove "
                          "NCCL_NET (NCCL picks the plugin) or set fabric to what the node has")
            if plugin and not OFI_RE.search(plugin):
                yield bad("NCCL_NET_PLUGIN", "EFA nodes load the aws-ofi-nccl plugin (libnccl-net-ofi.so under "
                          "aws_ofi_nccl_dir); remove NCCL_NET_PLUGIN")
            continue
        if net and OFI_RE.search(net) or plugin and OFI_RE.search(plugin):
            k = "NCCL_NET" if net and OFI_RE.search(net) else "NCCL_NET_PLUGIN"
            yield bad(k, "the aws-ofi-nccl plugin is installed on fabric efa only; remove it or set fabric: efa")
        if fabric in ("infiniband", "roce") and net.lower() == "socket":
            yield bad("NCCL_NET", f"TCP sockets give up the {fabric} RDMA NICs; remove it (or set fabric: ethernet "
                      "if the node has no RDMA)")
        if fabric == "ethernet":
            if net.lower() == "ib":
                yield bad("NCCL_NET", "fabric ethernet renders NCCL_IB_DISABLE=1; remove NCCL_NET or set fabric: "
                          "roce/infiniband")
            for k in sorted(x for x in extra if x.startswith("NCCL_IB_") and x not in MANAGED_KEYS):
                yield bad(k, "fabric ethernet renders NCCL_IB_DISABLE=1, so no NCCL_IB_* key is read; remove it",
                          "warning")
