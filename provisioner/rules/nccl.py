"""NCCL tuning rules (NCCL0xx): values NCCL would reject or silently misread. Defaults: roles/nccl_tuning."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from provisioner.defaults import role_default
from provisioner.model import Fleet, Host
from provisioner.rules import Finding, rule
from provisioner.rules._util import is_int, quoted_hint, show, suggest, type_name
from provisioner.rules.context import RuleContext

ALGOS = ("ring", "tree", "collnetdirect", "collnetchain", "nvls", "nvlstree", "pat")
COLLECTIVES = ("allreduce", "broadcast", "reduce", "allgather", "reducescatter", "sendrecv", "alltoall")
NCCL_VAR_RE = re.compile(r"^NCCL_[A-Z0-9_]+$")


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
                if not (isinstance(k, str) and NCCL_VAR_RE.match(k)):
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
