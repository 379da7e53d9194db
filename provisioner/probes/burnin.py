"""Burn-in from the controller: run roles/node_burnin/files/node_burnin.py on hosts (one SSH exec per host, the
program and its modules travel in the command as the health gate's do), read its JSON lines as data (typed and
bounded), judge every figure again against the catalog (provisioner.burnin), render.

    results = run_burnin(fleet, hosts, tier="quick")     # {host: HostBurnin}
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from provisioner import burnin
from provisioner.model import Fleet, Host
from provisioner.paths import ROLES, data_file
from provisioner.probes.burninjudge import METRICS
from provisioner.probes.health import STATUSES, json_lines, remote_command
from provisioner.probes.ssh import DEFAULT_FORKS, ExecResult, run_many, target_for
from provisioner.reports.untrusted import node_text

FILES = ROLES / "node_burnin" / "files"
#: What node_burnin.py needs side by side, the program last (nodeparse.py and burninjudge.py: symlinks into
#: provisioner/probes).
PROGRAM_FILES = tuple(FILES / n for n in ("nodeparse.py", "burninjudge.py", "burnin_torch.py", "node_burnin.py"))
MAX_OUTPUT = 4 * 1024 * 1024
MAX_RESULTS = 1024
MAX_MESSAGE = 500
_CHECK = re.compile(r"[a-z][a-z0-9_]{0,31}")
_CODE = re.compile(r"BRN\d{3}")
#: an HCA port (`mlx5_2:1`) or a pair of them across hosts (`node01/mlx5_2:1-node02/mlx5_2:1`)
_LINK = re.compile(r"[A-Za-z0-9_.:/-]{1,160}")


def program_files() -> dict[str, str]:
    return {p.name: data_file(p).read_text() for p in PROGRAM_FILES}


def host_thresholds(host: Host) -> dict[str, Any]:
    """The catalog's thresholds for `host`'s GPU model and count, the InfiniBand rate the inventory names
    (`ib_rate_gbps`) in place of the catalog's where set (a usage error when it is not a number)."""
    rate = host.vars.get("ib_rate_gbps", host.vars.get("ib_rate"))
    ib_rate = None if rate in (None, "") else float(burnin.number_var(host.name, host.vars, "ib_rate_gbps", rate,
                                                                      int, 1))
    return burnin.thresholds(host.gpu_model, host.gpu_count, ib_rate)


def burnin_argv(fleet: Fleet, host: Host, tier: str) -> list[str]:
    """node_burnin.py's arguments for `host`: the tier, the catalog's thresholds for its GPU model and count, the tier
    knobs (catalog defaults; `burnin_load_seconds`, `burnin_stress_seconds`, `burnin_soak_rounds` override), the
    kernel log and torch python the health gate uses, `burnin_measure_cmd` (the simulated rack's stand-in)."""
    v = host.vars
    knobs = burnin.tier_knobs(tier)

    def num(name: str, default: int, low: int = 1) -> str:
        return str(burnin.number_var(host.name, v, name, default, int, low))

    argv = ["--tier", tier, "--thresholds", json.dumps(host_thresholds(host), sort_keys=True, separators=(",", ":"))]
    argv += ["--load-seconds", num("burnin_load_seconds", knobs["load_seconds"])]
    if tier != "quick":
        argv += ["--stress-seconds", num("burnin_stress_seconds", knobs["stress_seconds"])]
    if tier == "soak":
        argv += ["--soak-rounds", num("burnin_soak_rounds", knobs["soak_rounds"])]
    if host.ib_hcas and host.fabric != "efa":
        argv += ["--ib-hca", ",".join(host.ib_hcas)]
    sysfs = v.get("node_health_sysfs_root")
    if sysfs not in (None, "", "/"):
        argv += ["--sysfs-root", str(sysfs)]
    if "burnin_gemm_n" in v:
        num("burnin_gemm_n", 8192, 256)
    for var, flag in (("node_health_kmsg", "--kmsg"), ("node_health_torch_python", "--torch-python"),
                      ("burnin_torch_python", "--torch-python"), ("burnin_measure_cmd", "--measure-cmd"),
                      ("burnin_gemm_n", "--gemm-n")):
        val = v.get(var)
        if val not in (None, ""):
            argv += [flag, str(val)]
    extra = v.get("burnin_extra_args", [])
    if isinstance(extra, list):
        argv += [str(x) for x in extra]
    return argv


@dataclass
class HostBurnin:
    host: str
    reachable: bool
    tier: str = "quick"
    rc: int | None = None
    error: str | None = None
    results: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [r for r in self.results if r.get("status") == "fail"]

    @property
    def ok(self) -> bool:
        return self.reachable and self.error is None and bool(self.summary) and not self.failed

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "ok": self.ok, "tier": self.tier, "reachable": self.reachable, "rc": self.rc,
                "error": self.error, "seconds": self.seconds, "results": self.results,
                "node_seconds": self.summary.get("seconds")}


def result_record(obj: Any) -> tuple[dict[str, Any] | None, str | None]:
    """One JSON line from the node -> (a typed, bounded result, None) or (None, why refused). Pure."""
    if not isinstance(obj, dict):
        return None, "a result line is not an object"
    name, status = obj.get("check"), obj.get("status")
    if not (isinstance(name, str) and _CHECK.fullmatch(name)):
        return None, f"a check name {node_text(name, 40)!r} is not a word of [a-z0-9_]"
    if name == "summary":
        if status not in ("pass", "fail"):
            return None, "the summary's status is not pass/fail"
        secs = obj.get("seconds")
        return {"check": "summary", "status": status,
                "seconds": float(secs) if isinstance(secs, (int, float)) and not isinstance(secs, bool) else None,
                "info": node_text(json.dumps(obj.get("info"))[:400], 400)}, None
    if status not in STATUSES:
        return None, f"check {name}: status {node_text(status, 40)!r} is not pass/fail/warn/skip"
    gpu = obj.get("gpu")
    if gpu is not None and not (isinstance(gpu, int) and not isinstance(gpu, bool) and 0 <= gpu < 64):
        return None, f"check {name}: gpu {node_text(gpu, 20)!r} is not an index"
    rec: dict[str, Any] = {"check": name, "gpu": gpu, "status": status,
                           "message": node_text(obj.get("message", ""), MAX_MESSAGE)}
    link = obj.get("link")
    if isinstance(link, str) and _LINK.fullmatch(link):
        rec["link"] = link
    peer = obj.get("peer")
    if isinstance(peer, int) and not isinstance(peer, bool) and 0 <= peer < 64:
        rec["peer"] = peer
    code = obj.get("code")
    if code is not None:
        if not (isinstance(code, str) and _CODE.fullmatch(code)):
            return None, f"check {name}: code {node_text(code, 20)!r} is not BRNnnn"
        rec["code"] = code
    metric = obj.get("metric")
    if metric is not None:
        if metric not in METRICS and not (isinstance(metric, str) and _CHECK.fullmatch(metric)):
            return None, f"check {name}: metric {node_text(metric, 40)!r} is not a word"
        rec["metric"] = metric
        value = obj.get("value")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            rec["value"] = float(value)
        elif value is not None:
            rec["value"] = node_text(value, 20)  # kept as text: rejudge fails it (BRN014)
        unit = obj.get("unit")
        rec["unit"] = node_text(unit, 12) if unit else None
    return rec, None


def parse_output(host: str, tier: str, r: ExecResult, doc: dict[str, Any]) -> HostBurnin:
    if not r.ok:
        return HostBurnin(host, reachable=False, tier=tier, error=node_text(r.error, MAX_MESSAGE), seconds=r.seconds)
    h = HostBurnin(host, reachable=True, tier=tier, rc=r.rc, seconds=r.seconds)
    problems: list[str] = []
    out = r.stdout
    if len(out) > MAX_OUTPUT:
        problems.append(f"over {MAX_OUTPUT} bytes of output")
        out = out[:MAX_OUTPUT]
    for obj in json_lines(out):
        rec, why = result_record(obj)
        if rec is None:
            problems.append(str(why))
        elif rec["check"] == "summary":
            h.summary = rec
        elif len(h.results) >= MAX_RESULTS:
            problems.append(f"more than {MAX_RESULTS} results")
            break
        else:
            h.results.append(burnin.rejudge(rec, doc))
    if problems:
        h.error = node_text(f"node_burnin.py sent a malformed result: {problems[0]}", MAX_MESSAGE)
    elif not h.summary:
        tail = (r.stderr.strip().splitlines() or r.stdout.strip().splitlines() or ["no output"])[-1]
        h.error = node_text(f"node_burnin.py gave no result (rc {r.rc}): {node_text(tail, 300)}", MAX_MESSAGE)
    return h


def run_burnin(fleet: Fleet, hosts: Iterable[str], *, tier: str, timeout: float, forks: int = DEFAULT_FORKS,
               on_result: Callable[[ExecResult], None] | None = None) -> dict[str, HostBurnin]:
    names = list(hosts)
    files = program_files()
    cmds, docs, targets = {}, {}, []
    for n in names:
        host = fleet.hosts[n]
        t = target_for(host)
        targets.append(t)
        docs[n] = host_thresholds(host)
        cmds[n] = remote_command(burnin_argv(fleet, host, tier), sudo=(t.user or "root") != "root", files=files)
    res = run_many(targets, lambda t: cmds[t.name], timeout=timeout, forks=forks, on_result=on_result)
    out = {n: parse_output(n, tier, res[n], docs[n]) for n in names}
    from provisioner.probes.burnin_cross import add_cross_results

    add_cross_results(fleet, out, tier=tier, timeout=timeout, forks=forks)
    return out


# ------------------------------------------------------------------------------------------ reports
def render_text(results: dict[str, HostBurnin], seconds: float | None = None) -> str:
    lines = []
    for name, h in results.items():
        if not h.reachable or h.error:
            lines.append(f"{name}: {'UNREACHABLE' if not h.reachable else 'ERROR'}: {h.error}")
            continue
        n = {s: sum(1 for r in h.results if r["status"] == s) for s in ("pass", "fail", "warn", "skip")}
        lines.append(f"{name}: {'PASS' if h.ok else 'FAIL'} {h.tier} ({n['pass']} pass, {n['fail']} fail, "
                     f"{n['warn']} warn, {n['skip']} skip; {h.summary.get('seconds')}s on the node)")
        for r in h.results:
            if r["status"] in ("fail", "warn"):
                where = (" " + r["link"] if r.get("link") else
                         "" if r.get("gpu") is None else " gpu" + str(r["gpu"]))
                lines.append(f"  {r['status'].upper()} {r['check']}{where}"
                             f"{' [' + r['code'] + ']' if r.get('code') else ''}: {r['message']}")
        for r in h.results:
            if r["status"] == "skip":
                lines.append(f"  skip {r['check']}: {r['message']}")
    ok = sum(1 for h in results.values() if h.ok)
    tail = f"burn-in: {len(results)} hosts, {ok} pass, {len(results) - ok} fail"
    if seconds is not None:
        tail += f" ({seconds:.1f}s)"
    return "\n".join(lines + [tail]) + "\n"


def render_json(results: dict[str, HostBurnin], seconds: float | None = None) -> str:
    doc = {"ok": all(h.ok for h in results.values()), "seconds": None if seconds is None else round(seconds, 3),
           "hosts": {n: h.to_dict() for n, h in results.items()}}
    return json.dumps(doc, indent=2) + "\n"
