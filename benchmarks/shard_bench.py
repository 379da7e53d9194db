#!/usr/bin/env python3
"""What sharding moves off the controller (issue 17 item 4): the same drift check on the same hosts, single-controller
vs sharded across execution nodes (`--exec-node`), alternating, on a rack set up as tests/testbed/test_shards.py does.

    sudo .venv/bin/python benchmarks/shard_bench.py --rack shards --inventory INV --nodes node05,node06 \\
        --targets node01,node02,node03,node04 --repeats 3 --json benchmarks/shard_bench.json

Per run: wall, controller CPU (the `provision` process tree + its ssh processes, benchmarks/_measure.py), the execution
nodes' CPU and the targets' CPU (each host's own process tree, /proc), machine load. Medians per side.

    .venv/bin/python benchmarks/shard_bench.py model benchmarks/shard_bench-1.json benchmarks/shard_bench-4.json \
        --capacity benchmarks/capacity_model.json --model "drift/tuned (as measured)" \
        --json benchmarks/shard_capacity.json --summary

model: the sharded controller's fixed + per-host CPU (least squares over the files), its serial bound (the whole
`provision` process counted as one core: conservative), and the execution nodes a fleet needs when each node runs one
ansible-playbook per shard (its hosts per 30-minute drift from capacity_model.json, the same model as one controller).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _measure as M  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def measure(argv: list[str], rack: str, nodes: list[str], targets: list[str]) -> dict:
    nroots, troots = M.rack_roots(rack, nodes), M.rack_roots(rack, targets)
    n0, t0 = M.tree_cpu_seconds(nroots), M.tree_cpu_seconds(troots)
    load = Path("/proc/loadavg").read_text().split()[0]
    out = M.run_measured(argv, env=dict(os.environ), cwd=ROOT)
    out["exec_nodes_cpu_s"] = round(M.settled_tree_cpu_seconds(nroots) - n0, 2)
    out["targets_cpu_s"] = round(M.settled_tree_cpu_seconds(troots) - t0, 2)
    out["load_at_start"] = load
    return out


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares y = fixed + per_host * x."""
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    per = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
    return my - per * mx, per


def model(files: list[Path], capacity: Path | None, which: str, budget: float, fleet: int) -> dict:
    data = [json.loads(f.read_text()) for f in files]
    out: dict = {"inputs": [str(f) for f in files], "budget_s": budget, "fleet": fleet}
    for side in ("sharded", "single"):
        pts = [(d["hosts"], r["controller_cpu_s"]) for d in data for r in d["runs"][side]]
        fixed, per = fit(pts)
        out[f"{side}_controller_cpu_s"] = {"fixed": round(fixed, 3), "per_host": round(per, 4), "points": pts}
    ex = [(d["hosts"], r["exec_nodes_cpu_s"]) for d in data for r in d["runs"]["sharded"]]
    fixed, per = fit(ex)
    out["exec_nodes_cpu_s"] = {"fixed": round(fixed, 3), "per_host": round(per, 4), "points": ex}
    sc = out["sharded_controller_cpu_s"]
    out["controller_serial_bound_hosts"] = int((budget - sc["fixed"]) / sc["per_host"])
    out["controller_cpu_less_per_host"] = round(out["single_controller_cpu_s"]["per_host"] / sc["per_host"], 1)
    if capacity is not None:
        cap = json.loads(capacity.read_text())["models"]
        m = cap[which]["prediction"]
        out["per_exec_node"] = {"model": which, "hosts": m["hosts"], "limited_by": m.get("limited_by")}
        out["shards_for_fleet"] = -(-fleet // int(m["hosts"]))
    return out


def summarize(res: dict, files: list[Path]) -> None:
    """The sharding record of summary.json: controller CPU per host sharded vs single-controller, same run."""
    from _summary import record

    data = [json.loads(f.read_text()) for f in files]
    loads = sorted(float(r["load_at_start"]) for d in data for rs in d["runs"].values() for r in rs)
    per = res["sharded_controller_cpu_s"]["per_host"]
    record("sharded_drift_controller_cpu_per_host",
           anchor="single-controller `provision drift` on the same hosts, same run (alternating); ratio single/sharded "
                  "per-host controller CPU; goal: ONE sharding controller process drives 10,000 nodes' nightly "
                  "drift in 30 min (its serial bound)",
           ours={"sharded_s_per_host": per, "single_s_per_host": res["single_controller_cpu_s"]["per_host"],
                 "controller_serial_bound_hosts": res["controller_serial_bound_hosts"],
                 "shards_for_fleet": res.get("shards_for_fleet")},
           ratio=res["controller_cpu_less_per_host"], met=res["controller_serial_bound_hosts"] >= res["fleet"],
           load={"min": loads[0], "max": loads[-1]}, date=max(d["date_utc"] for d in data),
           rev=",".join(sorted({d["git"] for d in data})),
           source="benchmarks/shard_bench.py model " + " ".join(str(f) for f in files), detail=res)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "model":
        mp = argparse.ArgumentParser(prog="shard_bench.py model")
        mp.add_argument("files", type=Path, nargs="+")
        mp.add_argument("--capacity", type=Path)
        mp.add_argument("--model", default="drift/tuned (quiet-calibrated)")
        mp.add_argument("--budget", type=float, default=1800.0)
        mp.add_argument("--fleet", type=int, default=10000)
        mp.add_argument("--json", type=Path)
        mp.add_argument("--summary", action="store_true", help="write the sharding record to benchmarks/summary.json")
        m = mp.parse_args(sys.argv[2:])
        res = model(m.files, m.capacity, m.model, m.budget, m.fleet)
        if m.summary:
            summarize(res, m.files)
        M.emit(res, m.json)
        return 0
    ap = argparse.ArgumentParser()
    ap.add_argument("--rack", required=True)
    ap.add_argument("--inventory", required=True, type=Path)
    ap.add_argument("--nodes", required=True)
    ap.add_argument("--targets", required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    nodes, targets = a.nodes.split(","), a.targets.split(",")
    base = [str(BIN / "provision"), "drift", str(a.inventory), "--skip-tags", "vllm", "--quiet", "--report", "json",
            "--limit", ",".join(targets)]
    sides = {"single": base, "sharded": [*base, "--exec-node", ",".join(nodes)]}
    runs: dict[str, list[dict]] = {k: [] for k in sides}
    for i in range(a.repeats):
        for side in (sides if i % 2 == 0 else dict(reversed(list(sides.items())))):
            r = measure(sides[side], a.rack, nodes, targets)
            print(f"[{dt.datetime.now(dt.UTC):%H:%M:%S}] {side}: {r}", file=sys.stderr, flush=True)
            runs[side].append(r)
    n = len(targets)
    summary = {}
    for side, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in
               ("wall_s", "controller_cpu_s", "exec_nodes_cpu_s", "targets_cpu_s", "machine_cpu_s")}
        summary[side] = {**med, "controller_cpu_per_host_s": round(med["controller_cpu_s"] / n, 3),
                         "exec_nodes_cpu_per_host_s": round(med["exec_nodes_cpu_s"] / n, 3),
                         "rcs": [r["rc"] for r in rs]}
    result = {
        "date_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "git": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True).stdout.strip(),
        "nproc": os.cpu_count(), "hosts": n, "exec_nodes": nodes, "repeats": a.repeats,
        "summary": summary,
        "controller_cpu_single_over_sharded": round(summary["single"]["controller_cpu_s"]
                                                    / max(summary["sharded"]["controller_cpu_s"], 0.01), 2),
        "runs": runs,
    }
    M.emit(result, a.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
