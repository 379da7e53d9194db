#!/usr/bin/env python3
"""provisioner (tuned ansible.cfg, `provision run|drift`) vs stock Ansible on the simulated rack (issue 10, items 1-2).

    sudo .venv/bin/python benchmarks/ansible_bench.py fleet --sizes 4,8,16 [--name bench] [--json OUT]
    sudo .venv/bin/python benchmarks/ansible_bench.py noop  --nodes 8 --repeats 3 [--mode drift|run] [--json OUT]

fleet: for each size and each side (order alternates per size), a FRESH rack (`provision testbed down/up --name NAME
--nodes N`, empty private fact cache) and one full `playbooks/site.yml`:
  tuned: `provision run INVENTORY --quiet`          (repo ansible.cfg: forks = hosts, pipelining, ControlPersist 600 s,
                                                     gathering smart + jsonfile fact cache; validate + preflight first)
  stock: `ansible-playbook -i INVENTORY playbooks/site.yml` with ANSIBLE_CONFIG=benchmarks/stock-ansible.cfg
                                                    (forks 5, no pipelining, implicit gathering, no fact cache)
noop: on one converged rack (brought up and converged with `provision run` when needed), alternating sides, REPEATS
times each: the full drift check (`--mode drift`, default): `provision drift INVENTORY --full` vs
`ansible-playbook ... site.yml --check --diff`; or a plain rerun (`--mode run`). The tuned side keeps its fact cache
between runs (as the nightly timer does within the cache's 24 h); stock has none.

Per run: wall s, controller CPU s (process tree + the ssh ControlPersist masters, see _measure.py), rack CPU s (the
simulated hosts' processes + the rack's proxy/repo server), attributed machine CPU = controller + rack, /proc/stat
machine CPU (includes other users of this shared machine), module executions per host (callback), per-task profile.
Prints one JSON object (also written to --json). Racks are only ever the one named --name (default `bench`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _measure as M  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
STOCK_CFG = ROOT / "benchmarks" / "stock-ansible.cfg"
SITE = ROOT / "playbooks" / "site.yml"
SIDES = ("tuned", "stock", "mitogen")  # mitogen = tuned + `--accelerate mitogen` (provisioner/accelerate.py)
TUNED = ("tuned", "mitogen")


def log(msg: str) -> None:
    print(f"[{dt.datetime.now(dt.UTC):%H:%M:%S}] {msg}", file=sys.stderr, flush=True)


def machine() -> dict:
    mem_kb = int(next(l for l in open("/proc/meminfo") if l.startswith("MemTotal")).split()[1])
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    return {"nproc": os.cpu_count(), "mem_gib": round(mem_kb / 2**20, 1), "kernel": platform.release(),
            "python": platform.python_version(), "loadavg_at_start": load,
            "date_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "git": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                  text=True).stdout.strip()}


def testbed(*args: str) -> None:
    subprocess.run([str(BIN / "provision"), "testbed", *args], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def inventory(name: str) -> Path:
    return ROOT / "inventories" / ("testbed" if name == "rack" else f"testbed-{name}") / "hosts.ini"


def fresh_rack(name: str, nodes: int) -> None:
    log(f"rack {name}: down + up --nodes {nodes}")
    subprocess.run([str(BIN / "provision"), "testbed", "down", "--name", name], cwd=ROOT,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    testbed("up", "--name", name, "--nodes", str(nodes))
    if not inventory(name).is_file():  # seen once: gone right after up; a second up rewrites it
        log(f"inventory {inventory(name)} missing after up: up again")
        testbed("up", "--name", name, "--nodes", str(nodes))


def bench_inventory(name: str, dest: Path) -> Path:
    """A copy of the rack's inventory that passes validation: plain racks (no --with-vllm) get cluster group_vars
    without model_arch/model_config, which CL001 now refuses (`provision run` refuses the whole run, site.yml's
    validate play fails the cluster members). Both sides use this same copy; only `model_arch` is added (Llama-2-7B: TP 8 divides its heads, and its weights fit the hosts' disk, which preflight checks)."""
    src = inventory(name).parent
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest)
    for p in (dest / "group_vars").glob("*.yml"):
        text = p.read_text()
        if "vllm_cluster:" in text and "model_arch:" not in text and "model_config:" not in text:
            p.write_text(text.rstrip("\n") + "\n  model_arch: Llama-2-7B  # added by benchmarks/ansible_bench.py\n")
    return dest / "hosts.ini"


def settle_load(limit: float, timeout_s: float = 240.0) -> float:
    """Wait (up to timeout_s) until the 1-minute load average is at most `limit`; the load when the wait ended."""
    deadline = time.monotonic() + timeout_s
    while True:
        load = float(Path("/proc/loadavg").read_text().split()[0])
        if load <= limit or time.monotonic() >= deadline:
            return load
        time.sleep(5)


class Bench:
    def __init__(self, name: str, skip_tags: str = "", limit: str = "", settle: float = 0.0):
        self.name = name
        self.settle = settle
        self.skip_tags = skip_tags
        self.limit = limit
        self.work = M.scratch(f"ansible-bench-{name}")
        self.facts = self.work / "facts"
        self.n = 0

    def env(self, side: str, count_file: Path) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
        env["PATH"] = f"{BIN}:{env.get('PATH', '')}"
        env.update(M.callback_env(self.work, count_file))
        # SSH masters of this bench only (both sides): each run opens its own connections and run_measured ends them
        # and counts their CPU; a master left by an earlier `provision` run (ControlPersist 600 s) is never reused
        env["ANSIBLE_SSH_CONTROL_PATH_DIR"] = str(self.work / f"cp-{side}")
        if side in TUNED:
            env["ANSIBLE_CACHE_PLUGIN_CONNECTION"] = str(self.facts)  # private: hosts are named node01.. in every rack
            env["PROVISION_RUNS_DIR"] = str(self.work / "runs")       # never prune other people's .runs
        else:
            env["ANSIBLE_CONFIG"] = str(STOCK_CFG)
        return env

    def argv(self, side: str, what: str) -> list[str]:
        inv = str(bench_inventory(self.name, self.work / "inventory"))
        skip = ["--skip-tags", self.skip_tags] if self.skip_tags else []
        skip += ["--limit", self.limit] if self.limit else []
        if side in TUNED:
            accel = ["--accelerate", "mitogen"] if side == "mitogen" else ["--accelerate", "none"]
            if what == "drift":
                # --full: Ansible check+diff for every host (tier 2), the same work as stock's --check --diff; the
                # two-tier drift has its own benchmark (drift_tiers_bench.py)
                return [str(BIN / "provision"), "drift", inv, "--quiet", "--full", *skip, *accel]
            return [str(BIN / "provision"), "run", inv, "--quiet", *skip, *accel]
        argv = [str(BIN / "ansible-playbook"), "-i", inv, str(SITE), *skip]
        return argv + (["--check", "--diff"] if what == "drift" else [])

    def run(self, side: str, what: str, nodes: int) -> dict:
        self.n += 1
        tag = f"{self.n:02d}-{what}-{side}-{nodes}"
        count_file = self.work / f"{tag}.counts.json"
        count_file.unlink(missing_ok=True)
        argv = self.argv(side, what)
        log(f"{tag}: {' '.join(argv)}")
        state = tree_state()
        if self.settle:
            log(f"{tag}: load1 {settle_load(self.settle)} (waited for <= {self.settle}, at most 240 s)")
        load0 = open("/proc/loadavg").read().split()[0]
        r = M.run_measured(argv, env=self.env(side, count_file), cwd=ROOT, rack=self.name,
                           stdout_path=self.work / f"{tag}.log")
        counts = M.read_counts(count_file)
        tasks = counts.pop("tasks", [])
        r.update(counts)
        r.update({"side": side, "what": what, "hosts": nodes, "tree": state, "load1_at_start": float(load0), "log": str(self.work / f"{tag}.log"),
                  "command": " ".join(argv)})
        for k in ("controller_cpu_s", "rack_cpu_s", "attributed_machine_cpu_s", "machine_cpu_s"):
            r[k.replace("_s", "_per_host_s")] = round(r[k] / nodes, 2)
        top = sorted(tasks, key=lambda t: t.get("wall_s", 0), reverse=True)[:12]
        r["top_tasks_by_wall"] = [{k: t.get(k) for k in ("role", "task", "action", "module_runs", "wall_s", "cpu_s")}
                                  for t in top]
        (self.work / f"{tag}.result.json").write_text(json.dumps({**r, "tasks": tasks}, indent=1))
        log(f"{tag}: rc {r['rc']} wall {r['wall_s']} ctl {r['controller_cpu_s']} rack {r['rack_cpu_s']} "
            f"machine {r['machine_cpu_s']} modules/host {r.get('module_runs_per_host')}")
        return r


def tree_state() -> str:
    """HEAD plus a hash of the playbooks/roles/templates as they are on disk (others may be editing them)."""
    import hashlib
    h = hashlib.sha256()
    for sub in ("playbooks", "roles", "templates"):
        for f in sorted((ROOT / sub).rglob("*")):
            if f.is_file():
                h.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes())
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    return f"{head.strip()}+{h.hexdigest()[:10]}"


def ratio(a: float, b: float) -> float | None:
    return round(a / b, 2) if b else None


def fleet(args: argparse.Namespace) -> dict:
    b = Bench(args.name, args.skip_tags, settle=args.settle)
    runs = []
    for i, n in enumerate(int(s) for s in args.sizes.split(",")):
        sides = [x for x in SIDES if x in args.sides.split(",")]
        order = sides[i % len(sides):] + sides[:i % len(sides)]
        if args.first != "alternate":
            order = sorted(order, key=lambda x: x != args.first)
        for side in order:
            fresh_rack(args.name, n)
            if b.facts.exists():
                shutil.rmtree(b.facts)
            runs.append(b.run(side, "run", n))
    summary = []
    for n in sorted({r["hosts"] for r in runs}):
        by = {side: next((r for r in runs if r["hosts"] == n and r["side"] == side), None) for side in SIDES}
        row: dict = {"hosts": n}
        for side, r in by.items():
            if r is not None:
                row[f"{side}_controller_cpu_per_host_s"] = r["controller_cpu_per_host_s"]
        for a, b_ in (("stock", "tuned"), ("stock", "mitogen"), ("tuned", "mitogen")):
            if by[a] is not None and by[b_] is not None:
                row[f"{a}_over_{b_}_controller_cpu"] = ratio(by[a]["controller_cpu_s"], by[b_]["controller_cpu_s"])
                row[f"{a}_over_{b_}_attributed_cpu"] = ratio(by[a]["attributed_machine_cpu_s"],
                                                            by[b_]["attributed_machine_cpu_s"])
                row[f"{a}_over_{b_}_wall"] = ratio(by[a]["wall_s"], by[b_]["wall_s"])
        summary.append(row)
    return {"bench": "fleet", "runs": runs, "summary": summary}


def noop(args: argparse.Namespace) -> dict:
    b = Bench(args.name, args.skip_tags, args.limit, args.settle)
    n = args.nodes
    if not inventory(args.name).is_file() or args.fresh:
        fresh_rack(args.name, n)
        if b.facts.exists():
            shutil.rmtree(b.facts)
    else:
        testbed("up", "--name", args.name, "--nodes", str(n))  # no-op on a running rack of that size
    conv = None
    if not args.no_converge:
        log("converging once with provision run (warms the tuned side's fact cache)")
        conv = b.run("tuned", "run", n)
        if conv["rc"] != 0:
            log(f"converge failed, see {conv['log']}")
    runs = []
    sides = [x for x in SIDES if x in args.sides.split(",")]
    n = len(args.limit.split(",")) if args.limit else n  # --limit: a sub-fleet of the converged rack
    for rep in range(args.repeats):
        for side in sides[rep % len(sides):] + sides[:rep % len(sides)]:  # rotate the order per repeat
            runs.append(b.run(side, args.mode, n))
    med = {}
    for side in sides:
        rs = [r for r in runs if r["side"] == side]
        med[side] = {k: round(statistics.median(r[k] for r in rs), 2)
                     for k in ("wall_s", "controller_cpu_s", "rack_cpu_s", "attributed_machine_cpu_s",
                               "machine_cpu_s", "controller_cpu_per_host_s", "rack_cpu_per_host_s",
                               "attributed_machine_cpu_per_host_s", "machine_cpu_per_host_s",
                               "module_runs_per_host", "controller_peak_pss_mib", "playbook_main_cpu_s")
                     if all(k in r for r in rs)}
        med[side]["rcs"] = [r["rc"] for r in rs]
    keys = ("wall_s", "controller_cpu_s", "rack_cpu_s", "attributed_machine_cpu_s", "machine_cpu_s",
            "module_runs_per_host")
    summary = {"hosts": n, "mode": args.mode, "repeats": args.repeats, "median": med}
    for a, b_ in (("stock", "tuned"), ("stock", "mitogen"), ("tuned", "mitogen")):
        if a in med and b_ in med:
            summary[f"{a}_over_{b_}"] = {k: ratio(med[a].get(k, 0), med[b_].get(k, 0)) for k in keys}
    # the converging run (after --fresh: a fresh rack, empty fact cache) is a provisioning run: capacity_model.py
    return {"bench": "noop", "runs": runs, "converge": conv, "summary": summary}


def report(files: list[Path]) -> str:
    """Markdown table of every run in the given result files (fleet and noop), medians for repeated noop runs."""
    rows = []
    groups: dict[tuple, list[dict]] = {}  # runs of the same kind from several files are pooled
    for f in files:
        d = json.loads(f.read_text())
        for r in d["runs"]:
            groups.setdefault((d["bench"], r["what"], r["hosts"], r["side"]), []).append(r)
        if d.get("converge"):  # noop's converging `provision run`
            r = d["converge"]
            groups.setdefault(("noop", "converge", r["hosts"], r["side"]), []).append(r)
    for (bench, what, n, side), rs in groups.items():
        ok = [r for r in rs if r["rc"] in (0, 3)] or rs
        med = {k: statistics.median(r.get(k, 0) or 0 for r in ok)
               for k in ("wall_s", "controller_cpu_s", "rack_cpu_s", "attributed_machine_cpu_s", "machine_cpu_s",
                         "module_runs_per_host")}
        rows.append((bench, what, n, side, len(ok), [r["rc"] for r in rs], med))
    out = ["| bench | hosts | side | runs (rc) | wall s | controller CPU s (/host) | rack CPU s (/host) | "
           "controller+rack CPU s (/host) | /proc/stat machine CPU s (/host) | module runs /host |",
           "|---|---:|---|---|---:|---:|---:|---:|---:|---:|"]
    for bench, what, n, side, k, rcs, m in sorted(rows, key=lambda x: (x[0], x[1], x[2], SIDES.index(x[3]))):
        per = lambda v: f"{v:.1f} ({v / n:.2f})"  # noqa: E731
        out.append(f"| {bench} {what} | {n} | {side} | {k} ({','.join(map(str, rcs))}) | {m['wall_s']:.0f} | "
                   f"{per(m['controller_cpu_s'])} | {per(m['rack_cpu_s'])} | {per(m['attributed_machine_cpu_s'])} | "
                   f"{per(m['machine_cpu_s'])} | {m['module_runs_per_host']:.1f} |")
    return "\n".join(out)


def write_summary(result: dict, argv: list[str]) -> None:
    """benchmarks/summary.json records of the goals this run measured (benchmarks/_summary.py)."""
    import _summary
    load = {"at_start": result["machine"]["loadavg_at_start"], "at_end": result["machine"]["loadavg_at_end"],
            "runs": [r.get("load1_at_start") for r in result["runs"]]}
    src = " ".join(["benchmarks/ansible_bench.py", *argv[1:]])
    # when and with which code the runs were measured (HEAD + a hash of playbooks/roles/templates: tree_state)
    when = {"date": result["machine"].get("date_utc"), "rev": ",".join(sorted({r["tree"] for r in result["runs"]}))}
    if result["bench"] == "fleet":
        rows = result["summary"]
        for side in ("tuned", "mitogen"):
            rs = [r for r in rows if f"stock_over_{side}_controller_cpu" in r]
            if not rs:
                continue
            worst = min(rs, key=lambda r: r[f"stock_over_{side}_controller_cpu"])
            _summary.record(
                f"fleet_controller_cpu_per_host_vs_stock/{side}", anchor="stock ansible-playbook, same playbook; goal "
                "ratio stock/ours >= 3 at every size",
                ours={r["hosts"]: r[f"{side}_controller_cpu_per_host_s"] for r in rs},
                ratio=worst[f"stock_over_{side}_controller_cpu"], met=worst[f"stock_over_{side}_controller_cpu"] >= 3,
                load=load, source=src, detail={"per_size": rs}, **when)
            if side == "tuned":  # issue 27: provisioning run, controller CPU per host >= 2x less than stock
                _summary.record(
                    "run_controller_cpu_vs_stock_2x/tuned", anchor="stock ansible-playbook site.yml on a fresh rack, "
                    "same playbook; goal (issue 27) stock/ours >= 2 at 4 and 16 hosts",
                    ours={r["hosts"]: r["tuned_controller_cpu_per_host_s"] for r in rs},
                    ratio=worst["stock_over_tuned_controller_cpu"],
                    met=worst["stock_over_tuned_controller_cpu"] >= 2 and {4, 16} <= {r["hosts"] for r in rs},
                    load=load, source=src, detail={"per_size": {r["hosts"]: r["stock_over_tuned_controller_cpu"]
                                                                for r in rs}}, **when)
            per = sorted((r["hosts"], r[f"{side}_controller_cpu_per_host_s"]) for r in rs)
            if len(per) > 1:
                growth = round(per[-1][1] / per[0][1], 2)
                _summary.record(
                    f"fleet_controller_cpu_per_host_flat/{side}", anchor=f"controller CPU per host at {per[0][0]} "
                    f"hosts; goal: at {per[-1][0]} hosts no more than 1.15x", ours=per[-1][1], ratio=growth,
                    met=growth <= 1.15, load=load, source=src, detail={"per_size": per}, **when)
    else:
        med, n = result["summary"]["median"], result["summary"]["hosts"]
        for side in ("tuned", "mitogen"):
            key = f"stock_over_{side}"
            if key not in result["summary"]:
                continue
            rt = result["summary"][key]
            _summary.record(
                f"noop_drift_controller_cpu_vs_stock/{side}", anchor=f"stock ansible-playbook --check --diff, {n} "
                "hosts, same playbook; goal stock/ours >= 3", ours=med[side]["controller_cpu_per_host_s"],
                ratio=rt["controller_cpu_s"], met=(rt["controller_cpu_s"] or 0) >= 3, load=load, source=src,
                detail={"median": med}, **when)
            if side == "tuned" and args_mode(result) == "drift":  # issue 27: full drift >= 2x less than stock
                _summary.record(
                    f"full_drift_controller_cpu_vs_stock_2x/tuned/{n}", anchor=f"stock ansible-playbook --check --diff "
                    f"vs provision drift --full, {n} converged hosts; goal (issue 27) stock/ours >= 2",
                    ours=med[side]["controller_cpu_per_host_s"], ratio=rt["controller_cpu_s"],
                    met=(rt["controller_cpu_s"] or 0) >= 2, load=load, source=src, detail={"median": med}, **when)
            _summary.record(
                f"noop_drift_machine_cpu_vs_stock/{side}", anchor=f"stock, controller + rack (hosts) CPU, {n} hosts; "
                "goal stock/ours >= 2", ours=med[side]["attributed_machine_cpu_per_host_s"],
                ratio=rt["attributed_machine_cpu_s"], met=(rt["attributed_machine_cpu_s"] or 0) >= 2, load=load,
                source=src, detail={"median": med}, **when)


def args_mode(result: dict) -> str:
    return str(result["summary"].get("mode", "drift"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fleet")
    f.add_argument("--sizes", default="4,8,16")
    f.add_argument("--sides", default="tuned,stock,mitogen", help="which sides to run (default all three)")
    f.add_argument("--first", choices=["alternate", *SIDES], default="alternate",
                   help="which side runs first at each size (default: alternate per size); `stock` leaves the rack "
                        "converged by the tuned side with a warm fact cache, ready for `noop --no-converge`")
    sp = sub.add_parser("summary", help="write summary.json records from saved result JSON files")
    sp.add_argument("files", type=Path, nargs="+")
    rp = sub.add_parser("report", help="Markdown table from result JSON files")
    rp.add_argument("files", type=Path, nargs="+")
    n = sub.add_parser("noop")
    n.add_argument("--nodes", type=int, default=8)
    n.add_argument("--repeats", type=int, default=3)
    n.add_argument("--mode", choices=["drift", "run"], default="drift")
    n.add_argument("--fresh", action="store_true", help="tear the rack down and bring it up first")
    n.add_argument("--no-converge", action="store_true", help="the rack is already converged")
    n.add_argument("--sides", default="tuned,stock,mitogen", help="which sides to run (default all three)")
    n.add_argument("--limit", default="", help="comma list of hosts: check only these (both sides), for the "
                                               "capacity model's smaller sizes on one converged rack")
    for p in (f, n):  # noqa: B007
        p.add_argument("--settle", type=float, default=0.0, metavar="LOAD",
                       help="before each measured run wait (at most 240 s) for the 1-minute load to fall to LOAD")
        p.add_argument("--name", default="bench", help="rack name (only this rack is created/removed)")
        p.add_argument("--json", type=Path)
        p.add_argument("--down", action="store_true", help="remove the rack at the end")
        p.add_argument("--summary", action="store_true", help="write the goals' records to benchmarks/summary.json")
        p.add_argument("--skip-tags", default="vllm",
                       help="passed to both sides (default vllm: site.yml's vLLM play pip-installs vLLM, which a plain "
                            "rack without --with-vllm cannot reach; '' runs everything)")
    args = ap.parse_args()
    if args.cmd == "report":
        print(report(args.files))
        return 0
    if args.cmd == "summary":
        for f in args.files:
            d = json.loads(f.read_text())
            write_summary(d, d["argv"])
        return 0
    out = {"machine": machine(), "argv": sys.argv}
    out.update(fleet(args) if args.cmd == "fleet" else noop(args))
    out["machine"]["loadavg_at_end"] = open("/proc/loadavg").read().split()[:3]
    if args.down:
        subprocess.run([str(BIN / "provision"), "testbed", "down", "--name", args.name], cwd=ROOT)
    if args.summary:
        write_summary(out, sys.argv)
    M.emit(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
