"""What the rails and incidents cost the remediation loop (issue 44), on a real SQLite ledger: the reads the rails make
before each take-out (recent automated actions, the breaker, the node's health streak) with a year's worth of
history, the pure decision, and `provision incidents` over many incidents. The alert receiver calls the loop once per
alert (`--limit NODE`), so the figure that matters is the added time per call.

    .venv/bin/python benchmarks/day2_rails_bench.py [--actions 20000] [--incidents 5000] [--summary]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _summary import loadavg, record  # noqa: E402

from provisioner.day2.rails import Rails, Recent, judge  # noqa: E402
from provisioner.ledger import Ledger  # noqa: E402

INI = "[gpu_nodes]\n" + "".join(f"n{i} ansible_host=127.0.0.1 ansible_port=1\n" for i in range(64))


def build(tmp: Path, actions: int, incidents: int) -> tuple[Path, Path, str]:
    inv = tmp / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.ini").write_text(INI)
    (inv / "group_vars" / "gpu_nodes.yml").write_text(
        "gpu_model: H100-SXM5-80GB\ngpu_count: 8\nfabric: ethernet\nbootstrap_interface: eth0\n"
        "lifecycle_policy: {quarantine_on: [xid], remediation: [gpu_reset]}\n")
    (inv / "group_vars" / "all.yml").write_text("provision_site: bench\nremediation_rails: {mode: recommend}\n")
    db = tmp / "ledger.sqlite3"
    now = time.time()
    with Ledger.open(db, site="bench") as lg, lg.atomic():
        for i in range(actions):  # spread over a year, oldest first
            at = now - 365 * 86400 * (1 - i / actions)
            lg.record_action(f"n{i % 64}", "quarantine", reason="xid: XID 79", source="alert", mode="act",
                             status="done", check="xid", at=at)
        for i in range(incidents):
            t = now - 365 * 86400 * (1 - i / incidents)
            n = lg.incident_opened(f"n{i % 64}", cluster=None, source="alert", cause="xid", signal=t, detected=t + 5)
            lg.incident_mark(n, "drained", at=t + 40)
            lg.incident_mark(n, "returned", at=t + 400)
        for h in range(3):  # n0's last three health passes: xid failing
            run = lg.run_started("health", "inv")
            lg.run_finished(run, "failed", hosts=[{"host": "n0", "status": "failed", "failed": 1}],
                            health=[("n0", "xid", "fail", "critical XID 79")])
    return inv / "hosts.ini", db, "bench"


def timed(fn, reps: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    xs = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        xs.append(time.perf_counter() - t0)
    return {"median_ms": round(statistics.median(xs) * 1000, 3), "max_ms": round(max(xs) * 1000, 3)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--actions", type=int, default=20000)
    ap.add_argument("--incidents", type=int, default=5000)
    ap.add_argument("--summary", action="store_true")
    a = ap.parse_args()
    load0 = loadavg()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        inv, db, site = build(tmp, a.actions, a.incidents)
        from provisioner.day2.service import _recent, fleet_rails
        from provisioner.inventory import load_fleet

        fleet = load_fleet(inv)
        rails = fleet_rails(fleet)
        with Ledger.open(db, site=site) as lg:
            reads = timed(lambda: _recent(fleet, lg, "n0", "xid", rails, time.time(), 64), 20)
            rec = _recent(fleet, lg, "n0", "xid", rails, time.time(), 64)
        pure = timed(lambda: [judge("quarantine", "n0", check="xid", cluster=None, rails=Rails(), recent=Recent(
            now=time.time(), nodes=64, done=rec.done, streak=3)) for _ in range(1000)], 5)
        env = dict(os.environ, PROVISION_LEDGER=str(db), PROVISION_RUNS_DIR=str(tmp / "runs"))

        def cli(*args: str) -> float:
            t0 = time.perf_counter()
            p = subprocess.run([sys.executable, "-m", "provisioner.cli", *args], capture_output=True, text=True,
                               env=env)
            assert p.returncode == 0, p.stdout + p.stderr
            return time.perf_counter() - t0

        rem = [cli("remediate", str(inv), "--limit", "n0", "--source", "alert") for _ in range(3)]
        dry = [cli("remediate", str(inv), "--limit", "n0", "--dry-run") for _ in range(3)]  # no rails on dry runs
        inc = [cli("incidents", str(inv), "--format", "json", "--prometheus", str(tmp / "i.prom")) for _ in range(3)]
    out = {"actions_in_ledger": a.actions, "incidents_in_ledger": a.incidents,
           "rails_ledger_reads_per_decision": reads, "judge_per_1000_calls": pure,
           "remediate_cli_wall_s_median": round(statistics.median(rem), 3),
           "remediate_dry_run_cli_wall_s_median": round(statistics.median(dry), 3),
           "incidents_cli_wall_s_median": round(statistics.median(inc), 3),
           "load": {"start": load0, "end": loadavg()}}
    print(json.dumps(out, indent=1))
    if a.summary:
        record("day2_rails_cost_per_decision",
               anchor="the rails' ledger reads before one take-out with a year of history (20,000 automated actions, "
                      "5,000 incidents, 64 nodes): goal < 50 ms per decision, well inside the 60 s detect-to-drain "
                      "budget of issue 44; ratio = goal / ours",
               ours=out, ratio=round(50 / max(reads["median_ms"], 0.001), 1), met=reads["median_ms"] < 50,
               load=out["load"], source="benchmarks/day2_rails_bench.py --summary")


if __name__ == "__main__":
    main()
