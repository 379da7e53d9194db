"""Burn-in's cross-node checks (standard and soak), run from the controller: per vLLM cluster, every pair of its members
in this run, one serving and the other connecting over the rack/site network (ports in the cluster firewall's
member-only range): pairwise InfiniBand bandwidth rail by rail (perftest `ib_write_bw`) and a two-node NCCL
all-reduce. Each pair's figures are judged here against the catalog and recorded on both members, the pair and rail
named; where a cluster has 3+ members, a member whose other pairs pass on that rail gets a warning, not a failure.

    add_cross_results(fleet, results, tier="standard", timeout=600)   # results: {host: HostBurnin}, updated in place
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from provisioner import burnin
from provisioner.model import Fleet, Host
from provisioner.paths import data_file
from provisioner.probes.health import json_lines, remote_command
from provisioner.probes.ssh import run_many, target_for
from provisioner.reports.untrusted import node_text

#: ib_write_bw's TCP port for rail i is IB_PORT + i; the all-reduce's master port: both inside cluster_firewall's
#: member-only ephemeral range (32768-60999), so members reach them and nobody else does.
IB_PORT = 38515
NCCL_PORT = 38600
CROSS_CHECKS = ("ib_pair", "nccl_cluster")


@dataclass(frozen=True)
class Pair:
    cluster: str
    server: str
    client: str


def plan_pairs(fleet: Fleet, names: list[str]) -> tuple[list[list[Pair]], dict[str, str]]:
    """Rounds of pairs (no host in two pairs of one round: a round runs at once), every pair of the members of each
    vLLM cluster that are in `names`, and for every host without a pair, why. Pure."""
    rounds: list[list[Pair]] = []
    why: dict[str, str] = {}
    wanted = set(names)
    done: set[str] = set()
    for n in names:
        clusters = fleet.cluster_of(n)
        if not clusters:
            why[n] = "not a member of a vLLM cluster: no other node to measure against"
    for cname in sorted({c for n in names for c in fleet.cluster_of(n)}):
        members = [m for m in fleet.clusters[cname].members if m in wanted and m not in done]
        if len(members) < 2:
            for m in members:
                why.setdefault(m, f"the only member of cluster {cname} in this run: no pair to measure")
            continue
        done |= set(members)
        ring = members + ([""] if len(members) % 2 else [])  # the circle method: n-1 rounds of n/2 pairs
        k = len(ring)
        for r in range(k - 1):
            pairs = [Pair(cname, ring[i], ring[k - 1 - i]) for i in range(k // 2) if ring[i] and ring[k - 1 - i]]
            if r >= len(rounds):
                rounds.append([])
            rounds[r] += pairs
            ring = [ring[0], ring[-1], *ring[1:-1]]
    return rounds, why


def attribute(found: Mapping[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """{host: its pair results} -> the same with a failed pair downgraded to `warn` on a host whose pairs of the same
    check and rail with other peers passed (the other end is the one at fault). Pure."""
    def rail(r: dict[str, Any]) -> str:
        link = str(r.get("link", ""))
        return r["check"] + ("/" + link.split("/", 1)[1].split("-", 1)[0] if "/" in link else "")

    out: dict[str, list[dict[str, Any]]] = {}
    for host, rs in found.items():
        passed = {rail(r) for r in rs if r["status"] == "pass"}
        out[host] = [dict(r, status="warn", message=r["message"] + " (this node's other pairs pass: the peer is at "
                          "fault)") if r["status"] == "fail" and r.get("code") != "BRN014" and rail(r) in passed
                     else r for r in rs]
    return out


def _argv(kind: str, side: str, me: Host, peer: Host, server: Host, cmd: str, seconds: int,
          timeout: float) -> list[str]:
    argv = [kind, side, "--name", me.name, "--peer-name", peer.name, "--cmd", cmd, "--timeout", f"{timeout:g}"]
    if kind == "ib":
        argv += ["--hcas", ",".join(me.ib_hcas), "--port", str(IB_PORT), "--seconds", str(seconds)]
        if side == "connect":
            argv += ["--peer", server.address]
    else:
        argv += ["--port", str(NCCL_PORT), "--peer", server.address]
    return argv


def _phase(fleet: Fleet, kind: str, pairs: list[Pair], timeout: float, docs: Mapping[str, dict[str, Any]],
           forks: int) -> dict[str, list[dict[str, Any]]]:
    from provisioner.probes.burnin import result_record

    if not pairs:
        return {}
    files = {"burnin_pair.py": data_file(burnin_pair_path()).read_text()}
    cmds: dict[str, str] = {}
    client_of: dict[str, Pair] = {}
    for p in pairs:
        s, c = fleet.hosts[p.server], fleet.hosts[p.client]
        for me, other, side in ((s, c, "serve"), (c, s, "connect")):
            v = me.vars
            cmd = str(v.get("burnin_perftest_cmd") or "ib_write_bw") if kind == "ib" else str(v["burnin_nccl_cmd"])
            secs = burnin.number_var(me.name, v, "burnin_ib_seconds", 5, int, 1)
            user = target_for(me).user or "root"
            cmds[me.name] = remote_command(_argv(kind, side, me, other, s, cmd, secs, timeout * 0.8),
                                           sudo=user != "root", files=files)
        client_of[p.client] = p
    targets = [target_for(fleet.hosts[n]) for n in cmds]
    res = run_many(targets, lambda t: cmds[t.name], timeout=timeout, forks=max(forks, 2))
    out: dict[str, list[dict[str, Any]]] = {}
    for p in pairs:
        r = res[p.client]
        link = f"{p.client}-{p.server}"
        got: list[dict[str, Any]] = []
        for obj in json_lines(r.stdout if r.ok else ""):
            rec, _ = result_record(obj)
            if rec is not None and rec["check"] in CROSS_CHECKS:
                got.append(burnin.rejudge(rec, docs[p.client]))
        if not got:
            why = r.error if not r.ok else (r.stderr.strip().splitlines() or ["no result"])[-1]
            got = [{"check": "ib_pair" if kind == "ib" else "nccl_cluster", "gpu": None, "status": "fail",
                    "code": "BRN014", "link": link, "message": node_text(f"{link}: {why}", 400)}]
        for h in (p.client, p.server):
            out.setdefault(h, []).extend(dict(x) for x in got)
    return out


def burnin_pair_path() -> Any:
    from provisioner.probes.burnin import FILES

    return FILES / "burnin_pair.py"


def add_cross_results(fleet: Fleet, results: Mapping[str, Any], *, tier: str, timeout: float,
                      forks: int = 64) -> None:
    """Run the cross-node checks for `tier` among the reachable hosts of `results` (HostBurnin by name) and put their
    results in place of node_burnin.py's placeholders (a skip saying why where a host has no pair)."""
    if tier not in ("standard", "soak"):
        return
    names = [n for n, h in results.items() if h.reachable and h.error is None]
    rounds, why = plan_pairs(fleet, names)
    docs = {n: _docs(fleet.hosts[n]) for n in names}
    found: dict[str, list[dict[str, Any]]] = {}
    for pairs in rounds:
        ib = [p for p in pairs if fleet.hosts[p.server].ib_hcas and fleet.hosts[p.client].ib_hcas
              and "efa" not in (fleet.hosts[p.server].fabric, fleet.hosts[p.client].fabric)]
        for h, rs in _phase(fleet, "ib", ib, timeout, docs, forks).items():
            found.setdefault(h, []).extend(rs)
        nccl = [p for p in pairs if fleet.hosts[p.server].get("burnin_nccl_cmd")
                and fleet.hosts[p.client].get("burnin_nccl_cmd")]
        for h, rs in _phase(fleet, "nccl", nccl, timeout, docs, forks).items():
            found.setdefault(h, []).extend(rs)
    found = attribute(found)
    for n in names:
        h = results[n]
        mine = found.get(n, [])
        keep = [r for r in h.results if r["check"] not in CROSS_CHECKS]
        for check in CROSS_CHECKS:
            if not any(r["check"] == check for r in mine):
                reason = why.get(n) or (
                    "no InfiniBand HCAs (ib_hcas) on both members: perftest not run" if check == "ib_pair" else
                    "burnin_nccl_cmd not set (docs/burn-in.md: nccl-tests all_reduce_perf under mpirun/torchrun)")
                keep.append({"check": check, "gpu": None, "status": "skip", "message": reason})
        h.results = keep + mine


def _docs(host: Host) -> dict[str, Any]:
    from provisioner.probes.burnin import host_thresholds

    return host_thresholds(host)

