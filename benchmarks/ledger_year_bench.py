"""The ledger after a simulated year of nightly runs over a generated 10,000-host inventory (issue 47).

    .venv/bin/python benchmarks/ledger_year_bench.py [--hosts 10000] [--days 365] [--keep-days 90] [--work DIR]
        [--out FILE] [--summary] [--status-only]

Rows go in through the ledger's own API, in bulk, one night at a time (Ledger.run_started / run_finished, the
calls `provision drift` and `provision health` make): a drift run (every host an outcome, 1% of hosts drifted with
2 items each) and a health pass (every host, CHECKS results each, 0.5% of hosts failing one check), plus a few
lifecycle transitions a night. Then, each a fresh process, measured (wall, CPU, peak RSS): `provision status INV
--format json`, `provision history HOST`, `provision validate`, `provision plan`, on the full year; then `provision
ledger compact --keep-days N` and status/history again; the file size before and after (and after VACUUM).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _summary import ROOT, commit, loadavg, record  # noqa: E402
from validate_bench import generate  # noqa: E402

BIN = ROOT / ".venv" / "bin"
CHECKS = ("driver", "gpus", "ecc", "nvlink", "pcie", "ib", "nccl_conf", "reboot")
DAY = 86400.0


def fill(inv: Path, ledger_path: Path, hosts: list[str], days: int, now: float) -> dict:
    from provisioner.inventory import load_fleet
    from provisioner.ledger import Ledger
    from provisioner.ledger.site import site_of

    site = site_of(load_fleet(inv))
    rnd = random.Random(47)
    t0 = time.monotonic()
    first = (int(now // DAY) - days) * DAY
    with Ledger.open(ledger_path, site=site) as lg:
        # a month of nights per transaction, with a page cache that holds the per-host indexes: one transaction per
        # night dirties a page per host per index (~80 MB of WAL a night at 10,000 hosts: 30 GB for the year)
        lg._db.execute("PRAGMA cache_size = -1048576")
        batch = None
        for d in range(days):
            if d % 30 == 0:
                if batch is not None:
                    batch.__exit__(None, None, None)
                batch = lg.atomic()
                batch.__enter__()
            night = first + d * DAY + 2.5 * 3600
            drifted = set(rnd.sample(hosts, max(1, len(hosts) // 100)))
            run = lg.run_started("drift", str(inv), started=night)
            lg.run_finished(run, "drift", hosts=[{"host": h, "status": "drift" if h in drifted else "ok"}
                                                 for h in hosts],
                            drift=[(h, f"file:/etc/nccl.conf#{i}") for h in drifted for i in range(2)],
                            ended=night + 60)
            sick = set(rnd.sample(hosts, max(1, len(hosts) // 200)))
            run = lg.run_started("health", str(inv), started=night + 3600)
            lg.run_finished(run, "failed", hosts=[{"host": h, "status": "failed" if h in sick else "ok",
                                                   "failed": int(h in sick)} for h in hosts],
                            health=[(h, c, "fail" if h in sick and c == "ecc" else "pass",
                                     "driver 570.86.15" if c == "driver" else None) for h in hosts for c in CHECKS],
                            ended=night + 3700)
            for h in rnd.sample(hosts, 3):
                lg.record_transition(h, lg.state(h)[0], "provisioning" if lg.state(h)[0] == "new" else "new",
                                     reason=f"night {d}", actor="bench")
            if d % 30 == 0:
                print(f"  night {d}/{days}: {time.monotonic() - t0:.0f} s", flush=True)
        if batch is not None:
            batch.__exit__(None, None, None)
    return {"site": site, "fill_s": round(time.monotonic() - t0, 1)}


def counts(ledger_path: Path) -> dict:
    import sqlite3

    db = sqlite3.connect(ledger_path)
    out = {t: db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]  # noqa: S608
           for t in ("runs", "host_outcomes", "health_results", "drift_items", "transitions", "check_days")}
    db.close()
    out["bytes"] = sum(p.stat().st_size for p in ledger_path.parent.glob(ledger_path.name + "*"))
    return out


def measure(argv: list[str], env: dict[str, str]) -> dict:
    load0 = loadavg()
    t0 = time.monotonic()
    p = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    err = p.stderr.read().decode(errors="replace")[-500:] if p.stderr else ""
    if p.stderr:
        p.stderr.close()
    return {"rc": os.waitstatus_to_exitcode(status), "wall_s": round(time.monotonic() - t0, 2),
            "cpu_s": round(ru.ru_utime + ru.ru_stime, 2), "peak_rss_mib": round(ru.ru_maxrss / 1024, 1),
            "load": [load0, loadavg()], "err": err}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=10000)
    ap.add_argument("--days", type=int, default=365)
    ap.add_argument("--keep-days", type=int, default=90)
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/pv-ledger-year"))
    ap.add_argument("--out", type=Path)
    ap.add_argument("--summary", action="store_true")
    ap.add_argument("--status-only", action="store_true",
                    help="after the fill: `status` x3 and `history` x2 only (no validate/plan, no compaction)")
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    inv = generate(a.hosts, a.work / "inv")
    ledger_path = a.work / "ledger.sqlite3"
    for p in a.work.glob("ledger.sqlite3*"):
        p.unlink()
    env = dict(os.environ, PROVISION_LEDGER=str(ledger_path), PROVISION_STATE_DIR=str(a.work / "state"),
               PROVISION_RUNS_DIR=str(a.work / "runs"))
    os.environ.update(env)
    hosts = [f"node{i:05d}" for i in range(a.hosts)]
    out: dict = {"hosts": a.hosts, "days": a.days, "keep_days": a.keep_days, "commit": commit(),
                 "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "load_start": loadavg()}
    out.update(fill(inv, ledger_path, hosts, a.days, time.time()))
    out["year"] = counts(ledger_path)
    print("year:", out["year"], flush=True)
    cmds = {"status": [str(BIN / "provision"), "status", str(inv), "--format", "json"],
            "history": [str(BIN / "provision"), "history", hosts[a.hosts // 2], "--inventory", str(inv)],
            "validate": [str(BIN / "provision"), "validate", str(inv), "--format", "json"],
            "plan": [str(BIN / "provision"), "plan", str(inv)]}
    if a.status_only:  # as installed: bytecode written once; the first status fills the inventory cache
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        measure(cmds["status"], env)
        out["status"] = [measure(cmds["status"], env) for _ in range(3)]
        out["history"] = [measure(cmds["history"], env) for _ in range(2)]
        out["load_end"] = loadavg()
        print({k: [(m["rc"], m["wall_s"], m["cpu_s"]) for m in out[k]] for k in ("status", "history")})
        if a.out:
            a.out.write_text(json.dumps(out, indent=1) + "\n")
        return 0
    out["before"] = {k: measure(v, env) for k, v in cmds.items()}
    print("before:", {k: (v["rc"], v["wall_s"], v["cpu_s"]) for k, v in out["before"].items()}, flush=True)
    out["compact"] = measure([str(BIN / "provision"), "ledger", "compact", str(inv), "--keep-days",
                              str(a.keep_days)], env)
    out["compacted"] = counts(ledger_path)
    out["after"] = {k: measure(cmds[k], env) for k in ("status", "history")}
    out["compact_again"] = measure([str(BIN / "provision"), "ledger", "compact", str(inv), "--keep-days",
                                    str(a.keep_days)], env)
    import sqlite3

    db = sqlite3.connect(ledger_path)
    db.execute("VACUUM")
    db.close()
    out["vacuumed"] = counts(ledger_path)
    out["after_vacuum"] = {"status": measure(cmds["status"], env)}
    out["load_end"] = loadavg()
    print(json.dumps({k: v for k, v in out.items() if k not in ("before", "after")}, indent=1))
    print("after:", {k: (v["rc"], v["wall_s"], v["cpu_s"]) for k, v in out["after"].items()})
    if a.out:
        a.out.write_text(json.dumps(out, indent=1) + "\n")
    if a.summary:
        st = out["after_vacuum"]["status"]
        rec = record(
            "ledger_year_status_10000_hosts",
            anchor="issue 47 goal: `provision status` over a 10,000-host inventory after a simulated year of nightly "
                   "drift + health in <= 2 s, the ledger bounded by retention",
            ours={"status_wall_s_full_year": out["before"]["status"]["wall_s"],
                  "status_wall_s_after_compact": st["wall_s"], "bytes_full_year": out["year"]["bytes"],
                  "bytes_after_compact_vacuum": out["vacuumed"]["bytes"],
                  "compact_wall_s": out["compact"]["wall_s"]},
            ratio=round(2.0 / st["wall_s"], 2), met=st["wall_s"] <= 2.0,
            load={"start": out["load_start"], "end": out["load_end"]}, rev=out["commit"],
            source="benchmarks/ledger_year_bench.py " + " ".join(sys.argv[1:]), detail=out)
        print("recorded", rec["goal"], "met", rec["met"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
