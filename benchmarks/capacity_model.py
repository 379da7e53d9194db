#!/usr/bin/env python3
"""Capacity model: how many hosts one controller drifts nightly and provisions (issue 17 item 3).

    .venv/bin/python benchmarks/capacity_model.py benchmarks/ansible_bench-r4-*.json \
        --json benchmarks/capacity_model.json
    # round 3 (busy machine, rescaled by round 2's quiet runs):
    .venv/bin/python benchmarks/capacity_model.py benchmarks/ansible_bench-r3-*.json \
        --quiet benchmarks/ansible_bench-fleet-4-8-16.json benchmarks/ansible_bench-noop-16.json

Inputs: ansible_bench.py result files (fleet = full provisioning run on fresh hosts, noop = drift on converged hosts;
a `noop --fresh` file's converging `provision run` counts as a provisioning run), measured on the simulated rack.
Per run it uses the CONTROLLER side only: `controller_cpu_s` (user+sys of the
`provision` process tree, ansible-playbook and its forked workers, plus ssh/Mitogen processes that outlive it; the
hosts' processes are not in that tree: they run under each host's systemd-nspawn and are counted as `rack_cpu_s`),
`playbook_main_cpu_s` (the ansible-playbook main process alone: the strategy loop, one thread, the serial part) and
`controller_peak_pss_mib` (peak PSS of that tree, forked workers' shared pages counted once), and the hosts' side
`rack_cpu_s` (what each host does, for the per-host latency bound).

Fit (ordinary least squares, per kind and side): y = fixed + per_host * hosts for controller CPU, main-process CPU,
rack CPU, wall; peak PSS = fixed + per_fork * forks (provision runs forks = hosts up to 50; stock 5).

Prediction for a controller of C cores / M GiB and a time budget T (30 min drift, 2 h provisioning): the largest N
meeting every bound:
1. CPU:     fixed + per_host * N <= U * C * T            (U = 0.7: headroom, the machine's other work)
2. serial:  main_fixed + main_per_host * N <= T            (ansible-playbook's strategy loop is one core)
3. forks:   memory sets F = (M * U - fixed_pss) / pss_per_fork (capped at 500); with F hosts in flight and each host
            needing `host_s` of its own time (rack CPU per host, i.e. a host with one core, plus the controller's
            per-host CPU as latency), N <= F * T / host_s
The hosts' own CPU is measured on simulated hosts sharing this machine's cores; real nodes have their own CPUs, so
bound 3 is conservative for CPU but ignores real package download/install times (see benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def ols(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line; slope only through the origin when one distinct x."""
    if len(set(xs)) < 2:
        slope = sum(y for y in ys) / sum(xs)
        return 0.0, slope
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - slope * mx, slope


def points(files: list[Path]) -> dict[tuple[str, str], list[dict]]:
    out: dict[tuple[str, str], list[dict]] = {}
    for f in files:
        d = json.loads(f.read_text())
        # `noop --fresh` converges a fresh rack (empty fact cache) with `provision run` first: a provisioning run
        fresh_noop = d["bench"] == "noop" and "--fresh" in d.get("argv", []) and "--limit" not in d.get("argv", [])
        for r in d["runs"] + ([d["converge"]] if fresh_noop and d.get("converge") else []):
            if r.get("rc") not in (0, 3):
                continue
            kind = "provision" if r["what"] == "run" and (d["bench"] == "fleet" or fresh_noop) else \
                ("drift" if r["what"] == "drift" else None)
            if kind is None:
                continue
            load = d["machine"].get("loadavg_at_start")
            out.setdefault((kind, r["side"]), []).append({**r, "file": f.name, "load": load})
    return out


def fit(runs: list[dict]) -> dict:
    cap = 5 if runs and runs[0]["side"] == "stock" else 50  # stock-ansible.cfg: forks 5; provision: hosts, max 50
    m = {}
    for key in ("controller_cpu_s", "playbook_main_cpu_s", "rack_cpu_s", "wall_s", "controller_peak_pss_mib"):
        have = [r for r in runs if r.get(key) is not None]  # round 2 files lack the sampled figures
        if not have:
            m[key] = None
            continue
        # memory follows the forks in flight (provision runs forks = hosts, capped at 50), the rest the hosts
        xs = [float(min(r["hosts"], cap)) if key == "controller_peak_pss_mib" else float(r["hosts"]) for r in have]
        a, b = ols(xs, [float(r[key]) for r in have])
        m[key] = {"fixed": round(a, 3), "per_unit": round(b, 4), "n": len(have),
                  "hosts": sorted({r["hosts"] for r in have})}
    m["points"] = [{k: r.get(k) for k in ("hosts", "wall_s", "controller_cpu_s", "playbook_main_cpu_s",
                                          "controller_peak_pss_mib", "rack_cpu_s", "file", "load")} for r in runs]
    return m


def predict(m: dict, cores: int, mem_gib: float, budget_s: float, util: float = 0.7) -> dict:
    c, mn, pss, rack = (m[k] for k in ("controller_cpu_s", "playbook_main_cpu_s", "controller_peak_pss_mib",
                                       "rack_cpu_s"))
    bounds: dict[str, int] = {}
    bounds["cpu"] = int((util * cores * budget_s - max(c["fixed"], 0)) / max(c["per_unit"], 1e-9))
    if mn is not None:
        bounds["serial_main_process"] = int((budget_s - max(mn["fixed"], 0)) / max(mn["per_unit"], 1e-9))
    forks = None
    if pss is not None:
        forks = int(min(500, (mem_gib * 1024 * util - max(pss["fixed"], 0)) / max(pss["per_unit"], 1e-3)))
        host_s = rack["per_unit"] + c["per_unit"]
        bounds["forks_x_host_time"] = int(forks * budget_s / max(host_s, 1e-9))
    return {"cores": cores, "mem_gib": mem_gib, "budget_s": budget_s, "util": util, "forks": forks,
            "bounds": bounds, "hosts": min(bounds.values()), "limited_by": min(bounds, key=bounds.get)}


def calibrated(loaded: dict, quiet: dict | None) -> dict | None:
    """The loaded-machine model rescaled to the quiet machine's controller CPU: CPU seconds inflate under contention
    (tuned drift 8.45 s/host at load ~40 vs 2.95 quiet), so the per-host controller CPU is taken from the quiet
    runs and the main process's and memory figures keep their measured proportions."""
    if quiet is None or loaded["playbook_main_cpu_s"] is None:
        return None
    q, lc = quiet["controller_cpu_s"], loaded["controller_cpu_s"]
    share = loaded["playbook_main_cpu_s"]["per_unit"] / lc["per_unit"]
    scale = q["per_unit"] / lc["per_unit"]
    m = {k: (dict(v) if isinstance(v, dict) else v) for k, v in loaded.items() if k != "points"}
    m["controller_cpu_s"] = dict(q)
    m["playbook_main_cpu_s"] = {"fixed": 0.0, "per_unit": round(share * q["per_unit"], 4),
                                "from": f"main share {share:.2f} of controller CPU (loaded runs) x quiet per-host CPU"}
    m["rack_cpu_s"] = {"fixed": 0.0, "per_unit": round(loaded["rack_cpu_s"]["per_unit"] * scale, 4),
                       "from": "loaded rack CPU x the same quiet/loaded scale"}
    m["scale_quiet_over_loaded"] = round(scale, 3)
    return m


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", type=Path, nargs="+")
    ap.add_argument("--quiet", type=Path, nargs="*", default=[],
                    help="result files measured on a quiet machine (round 2): their controller CPU per host "
                         "calibrates the loaded runs' model (same kind and side)")
    ap.add_argument("--cores", type=int, default=16)
    ap.add_argument("--mem-gib", type=float, default=64)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    budgets = {"drift": 30 * 60, "provision": 2 * 3600}
    out: dict = {"controller": {"cores": args.cores, "mem_gib": args.mem_gib}, "budgets_s": budgets,
                 "inputs": [str(f) for f in args.files], "quiet_inputs": [str(f) for f in args.quiet], "models": {}}
    quiet = {k: fit(v) for k, v in points(args.quiet).items()} if args.quiet else {}
    for (kind, side), runs in sorted(points(args.files).items()):
        m = fit(runs)
        m["prediction"] = predict(m, args.cores, args.mem_gib, budgets[kind])
        out["models"][f"{kind}/{side} (as measured)"] = m
        # Mitogen has no quiet run: it takes tuned's quiet/loaded scale (same playbook, same controller code path)
        q = quiet.get((kind, side)) or quiet.get((kind, "tuned") if side == "mitogen" else (kind, side))
        if q is not None and side == "mitogen":
            t = next((fit(r) for (k, s_), r in points(args.files).items() if k == kind and s_ == "tuned"), None)
            if t is not None:
                scale = q["controller_cpu_s"]["per_unit"] / t["controller_cpu_s"]["per_unit"]
                q = {"controller_cpu_s": {"fixed": 0.0,
                                          "per_unit": round(m["controller_cpu_s"]["per_unit"] * scale, 4)}}
        c = calibrated(m, q)
        if c is not None:
            c["prediction"] = predict(c, args.cores, args.mem_gib, budgets[kind])
            out["models"][f"{kind}/{side} (quiet-calibrated)"] = c
    text = json.dumps(out, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    f = lambda v, unit: "n/a" if v is None else f"{v['fixed']:.1f} + {v['per_unit']:.3f} {unit}"  # noqa: E731
    for name, m in out["models"].items():
        p = m["prediction"]
        print(f"{name:36} ctl CPU {f(m['controller_cpu_s'], 's/host')} | main {f(m['playbook_main_cpu_s'], 's/host')}"
              f" | PSS {f(m['controller_peak_pss_mib'], 'MiB/fork')} | wall {f(m.get('wall_s'), 's/host')}"
              f" | -> {p['hosts']} hosts ({p['limited_by']}; {p['bounds']})", file=sys.stderr)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
