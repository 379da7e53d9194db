"""The two-tier drift against the full (Ansible for every host) drift, on a converged, unchanged simulated rack.

    .venv/bin/python benchmarks/drift_tiers_bench.py --rack NAME [--reps 3] [--out FILE] [--summary]

The rack must exist (`provision testbed up --name NAME -N N`); the script converges it once with
`provision run --skip-tags vllm` (which records the hosts' states), then alternates `provision drift --skip-tags
vllm` (tier 1: every host clean by the probe) and `provision drift --skip-tags vllm --full`, `--reps` times each,
measuring wall and controller CPU (the command's whole process tree, SSH masters included: benchmarks/_measure.py).
With --summary it records `drift_tier1_controller_cpu_per_host` in summary.json, and with several saved files
(`--model FILE...`) it fits fixed + per-host cost and projects the 10,000-node nightly drift.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import run_measured  # noqa: E402
from _summary import ROOT, loadavg, record  # noqa: E402

PROVISION = [str(ROOT / ".venv" / "bin" / "provision")]


def bench(rack: str, reps: int, runs: Path) -> dict:
    inv = ROOT / "inventories" / f"testbed-{rack}" / "hosts.ini"
    env = dict(os.environ, PROVISION_RUNS_DIR=str(runs))
    hosts = 0
    conv = run_measured([*PROVISION, "run", str(inv), "--skip-tags", "vllm", "-q"], env=env, cwd=ROOT)
    assert conv["rc"] == 0, conv
    load = [loadavg()]
    sides: dict[str, list[dict]] = {"tiers": [], "full": []}
    for _ in range(reps):
        for side, extra in (("tiers", []), ("full", ["--full"])):
            m = run_measured([*PROVISION, "drift", str(inv), "--skip-tags", "vllm", "-q", "-r", "json",
                              "-o", str(runs / f"{side}.json"), *extra], env=env, cwd=ROOT)
            doc = json.loads((runs / f"{side}.json").read_text())
            assert m["rc"] == 0, (side, m)
            hosts = doc["summary"]["hosts"]
            if side == "tiers":
                assert doc["summary"]["tiers"]["tier1"] == hosts, doc["summary"]
            sides[side].append({"wall_s": round(m["wall_s"], 3), "controller_cpu_s": round(m["controller_cpu_s"], 3)})
    load.append(loadavg())

    def med(side: str, key: str) -> float:
        return statistics.median(r[key] for r in sides[side])

    return {"rack": rack, "hosts": hosts, "reps": reps, "load": {"start": load[0], "end": load[1]}, "runs": sides,
            "median": {s: {"wall_s": med(s, "wall_s"), "controller_cpu_s": med(s, "controller_cpu_s")}
                       for s in sides}}


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares fixed + per-host cost through (hosts, seconds) points."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else my / max(mx, 1)
    return max(0.0, my - slope * mx), max(slope, 0.0)


def _commit() -> str | None:
    import subprocess

    p = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True, cwd=ROOT)
    return p.stdout.strip() or None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rack")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--summary", action="store_true")
    ap.add_argument("--model", type=Path, nargs="*", help="saved runs to fit and record (no measuring)")
    a = ap.parse_args()
    if a.model:
        res = [json.loads(p.read_text()) for p in a.model]
    else:
        import tempfile

        res = [bench(a.rack, a.reps, Path(tempfile.mkdtemp(prefix="pv-tiers-")))]
        res[0]["commit"] = _commit()
        if a.out:
            a.out.write_text(json.dumps(res[0], indent=1) + "\n")
    for r in res:
        t, f = r["median"]["tiers"], r["median"]["full"]
        print(f"{r['hosts']} hosts: tiers {t['controller_cpu_s']:.2f}s CPU {t['wall_s']:.2f}s wall; "
              f"full {f['controller_cpu_s']:.2f}s CPU {f['wall_s']:.2f}s wall; "
              f"CPU ratio {f['controller_cpu_s'] / t['controller_cpu_s']:.1f}x, "
              f"wall ratio {f['wall_s'] / t['wall_s']:.1f}x (load {r['load']['start']:.1f}-{r['load']['end']:.1f})")
    if a.summary and (len(res) == 1 or len({r.get("commit") for r in res}) > 1):
        # one rack size, or saved runs of different code: no fit; each size's ratio is its own record
        for r in res:
            ratio = round(r["median"]["full"]["controller_cpu_s"] / r["median"]["tiers"]["controller_cpu_s"], 1)
            rec = record(
                f"drift_tier1_controller_cpu_ratio_{r['hosts']}_hosts",
                anchor=f"`provision drift --full` on the same {r['hosts']} converged hosts, alternating; ratio "
                       "full/tiers controller CPU (medians); goal >= 30x at 4 and at 16 hosts",
                ours={"tiers_cpu_s": r["median"]["tiers"]["controller_cpu_s"],
                      "full_cpu_s": r["median"]["full"]["controller_cpu_s"],
                      "tiers_wall_s": r["median"]["tiers"]["wall_s"]},
                ratio=ratio, met=ratio >= 30, load=r["load"], rev=r.get("commit"),
                source=f"benchmarks/drift_tiers_bench.py --model FILE ({r.get('commit')})", detail={"run": r})
            print(rec["goal"], "ratio", ratio, "met", rec["met"])
        return 0
    if a.summary:
        pts = [(r["hosts"], x["controller_cpu_s"]) for r in res for x in r["runs"]["tiers"]]
        fixed, per_host = fit(pts)
        full_pts = [(r["hosts"], x["controller_cpu_s"]) for r in res for x in r["runs"]["full"]]
        ffixed, fper = fit(full_pts)
        big = max(res, key=lambda r: r["hosts"])
        ratio = round(big["median"]["full"]["controller_cpu_s"] / big["median"]["tiers"]["controller_cpu_s"], 1)
        # the goal holds at every rack size measured (issue 27: 4 and 16 hosts), not at the largest alone
        by_hosts = {r["hosts"]: round(r["median"]["full"]["controller_cpu_s"]
                                      / r["median"]["tiers"]["controller_cpu_s"], 1) for r in res}
        # 10,000 nodes in 5 minutes: the probe's threads share one GIL, so the per-host CPU is on ONE core (the
        # other 15 of a 16-core controller are not needed); wall also bounded by the pool (64 hosts at a time)
        fleet = 10000
        projected = fixed + per_host * fleet
        rec = record(
            "drift_tier1_controller_cpu_per_host",
            anchor="`provision drift --full` (Ansible check+diff for every host, today's tuned drift) on the same "
                   "converged hosts, alternating; ratio full/tiers controller CPU of the largest rack; goal >= 30x, "
                   "and 10,000 nodes in <= 300 s from a 16-core controller",
            ours={"tiers_cpu_s_per_host": round(per_host, 4), "tiers_fixed_cpu_s": round(fixed, 3),
                  "full_cpu_s_per_host": round(fper, 4), "full_fixed_cpu_s": round(ffixed, 3),
                  "projected_10000_nodes_one_core_cpu_s": round(projected, 1),
                  "wall_s": {r["hosts"]: r["median"]["tiers"]["wall_s"] for r in res}, "ratio_by_hosts": by_hosts,
                  "commit_by_hosts": {r["hosts"]: r.get("commit") for r in res}},
            ratio=ratio, met=min(by_hosts.values()) >= 30 and projected <= 300,
            load={"min": min(r["load"]["start"] for r in res), "max": max(r["load"]["end"] for r in res)},
            source="benchmarks/drift_tiers_bench.py " + " ".join(str(p) for p in (a.model or [])),
            detail={"runs": res})
        print(json.dumps(rec["ours"]), "ratio", ratio, "met", rec["met"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
