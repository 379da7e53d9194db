#!/usr/bin/env python3
"""Preflight probe vs Ansible fact gathering (`ansible all -m setup`) on the same hosts.

    .venv/bin/python benchmarks/preflight_bench.py INVENTORY [--repeats 5] [--limit gpu_nodes] [--base-limit node01]
                                                   [--rack NAME] [--json OUT]

Each repeat runs both, alternating which goes first, as the user would (a fresh process each: interpreter start and
inventory parse included):
  - `provision preflight INVENTORY --format json`  (paramiko, one SSH exec per host running a batched snippet)
  - `ansible gpu_nodes -i INVENTORY -m ansible.builtin.setup` with the project's ansible.cfg (forks 50, pipelining,
    ControlPersist: after the first repeat Ansible reuses warm SSH master connections; preflight never does)
and records three figures per run: wall seconds, controller CPU seconds (user+sys of the command's whole process
tree, from RUSAGE_CHILDREN), whole-machine CPU seconds (/proc/stat busy jiffies: the simulated hosts' sshd/python
work included; on a machine shared with other work this counts theirs too), plus what each does per host (SSH
execs / module runs), the 1-minute load average after each run, and with --rack NAME the rack's own CPU seconds
(every process inside the simulated hosts: sshd, shells, nvidia-smi / the setup module; benchmarks/_measure.py),
which other work on a shared machine does not pollute. Medians of the repeats and their ratios. With --base-limit (one host), the same runs on that
host alone give the fixed cost (interpreter, imports, inventory parse), and (N-host - 1-host) / (N - 1) the marginal
cost per host: the figure that carries to a large fleet.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _measure  # noqa: E402


def machine_busy_seconds() -> float:
    with open("/proc/stat") as f:
        cpu = f.readline().split()[1:]
    vals = [int(x) for x in cpu]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    return (sum(vals[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def measure(argv: list[str], env: dict[str, str], roots: list[tuple[int, int]]) -> dict[str, float | int | str]:
    h0 = _measure.tree_cpu_seconds(roots) if roots else 0.0
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    m0 = machine_busy_seconds()
    t0 = time.monotonic()
    p = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.monotonic() - t0
    m1 = machine_busy_seconds()
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    rack = _measure.settled_tree_cpu_seconds(roots, timeout=2.0) - h0 if roots else 0.0
    return {"wall_s": round(wall, 3), "controller_cpu_s": round(cpu, 3), "machine_cpu_s": round(m1 - m0, 3),
            "rack_cpu_s": round(rack, 3), "controller_plus_rack_cpu_s": round(cpu + rack, 3),
            "load1": round(os.getloadavg()[0], 2), "rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr[-2000:]}


def write_summary(doc: dict, source: str, date: str | None = None, from_file: Path | None = None) -> None:
    """The goal's record in benchmarks/summary.json (benchmarks/_summary.py): wall at N hosts, >= 5x."""
    import _summary
    s = doc["summary"]
    w, c = s["wall_s"], s["controller_cpu_s"]
    _summary.record(
        "preflight_wall_vs_ansible_setup", anchor=f"`ansible {s['limit']} -m ansible.builtin.setup`, {s['hosts']} hosts, "
        "wall; goal ansible/ours >= 5", ours=w["preflight"], ratio=w["ratio"], met=w["ratio"] >= 5,
        load={"load1_min_median_max": s.get("load1_min_median_max")}, source=source, date=date, from_file=from_file,
        detail={"controller_cpu_s": c, "controller_plus_rack_cpu_s": s.get("controller_plus_rack_cpu_s"),
                "marginal": doc.get("marginal")})


def main() -> int:
    if sys.argv[1:2] == ["summary-from"]:  # summary-from FILE DATE: record a saved run (its date as measured)
        write_summary(json.loads(Path(sys.argv[2]).read_text()), f"benchmarks/preflight_bench.py ({sys.argv[2]})",
                      date=sys.argv[3] if len(sys.argv) > 3 else None, from_file=Path(sys.argv[2]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("inventory")
    ap.add_argument("--summary", action="store_true", help="write the goal's record to benchmarks/summary.json")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--limit", default="gpu_nodes")
    ap.add_argument("--base-limit", help="a single host: also measure it alone (fixed vs per-host cost)")
    ap.add_argument("--rack", help="the testbed rack behind INVENTORY: also measure the hosts' own CPU")
    ap.add_argument("--json", help="write the raw figures here")
    a = ap.parse_args()
    roots = _measure.rack_roots(a.rack) if a.rack else []
    out = bench(a.inventory, a.limit, a.repeats, roots)
    if out is None:
        return 1
    doc = {"summary": out[0], "runs": out[1]}
    if a.base_limit:
        base = bench(a.inventory, a.base_limit, a.repeats, roots)
        if base is None:
            return 1
        n = out[0]["hosts"]
        marg = {}
        for tool in ("preflight", "ansible_setup"):
            for key in ("wall_s", "controller_cpu_s", "rack_cpu_s", "controller_plus_rack_cpu_s"):
                marg[f"{tool}_{key}_fixed"] = base[0][key][tool]
                marg[f"{tool}_{key}_per_extra_host"] = round((out[0][key][tool] - base[0][key][tool]) / max(n - 1, 1), 3)
        for key in ("wall_s", "controller_cpu_s", "rack_cpu_s", "controller_plus_rack_cpu_s"):
            p_, s_ = marg[f"preflight_{key}_per_extra_host"], marg[f"ansible_setup_{key}_per_extra_host"]
            marg[f"{key}_per_extra_host_ratio"] = round(s_ / p_, 2) if p_ > 0 else None
        doc["base"] = base[0]
        doc["marginal"] = marg
        print(json.dumps({"marginal": marg}, indent=2))
    if a.json:
        Path(a.json).write_text(json.dumps(doc, indent=2) + "\n")
    if a.summary:
        write_summary(doc, " ".join(["benchmarks/preflight_bench.py", *sys.argv[1:]]))
    return 0


def bench(inventory: str, limit: str, repeats: int, roots: list[tuple[int, int]]) -> tuple[dict, dict] | None:
    class A:
        pass

    a = A()
    a.inventory, a.limit, a.repeats = inventory, limit, repeats
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_HOST_KEY_CHECKING="True")
    pre = [str(VENV_BIN / "provision"), "preflight", a.inventory, "--format", "json", "--limit", a.limit]
    ans = [str(VENV_BIN / "ansible"), a.limit, "-i", a.inventory, "-m", "ansible.builtin.setup", "-o"]
    rows: dict[str, list[dict]] = {"preflight": [], "ansible_setup": []}
    hosts = None
    for i in range(a.repeats):
        order = [("preflight", pre), ("ansible_setup", ans)]
        if i % 2:
            order.reverse()
        for name, argv in order:
            r = measure(argv, env, roots)
            if name == "preflight":
                try:
                    doc = json.loads(r["stdout"])
                    hosts = len(doc["hosts"])
                    unreachable = doc["summary"]["unreachable"]
                except (ValueError, KeyError):
                    print(f"preflight failed: {r['stderr']}", file=sys.stderr)
                    return None
                r["hosts"], r["unreachable"] = hosts, unreachable
            else:
                ok = sum(1 for line in r["stdout"].splitlines() if "| SUCCESS" in line)
                r["hosts_ok"] = ok
                if ok == 0:
                    print(f"ansible setup failed: {r['stdout'][-800:]}{r['stderr']}", file=sys.stderr)
                    return None
            r.pop("stdout")
            rows[name].append(r)
            print(f"{a.limit}: repeat {i + 1}/{a.repeats} {name:14s} wall {r['wall_s']:7.2f}s  controller CPU "
                  f"{r['controller_cpu_s']:6.2f}s  rack CPU {r['rack_cpu_s']:6.2f}s  machine CPU {r['machine_cpu_s']:6.2f}s  "
                  f"load {r['load1']:5.2f}", file=sys.stderr)

    def med(name: str, key: str) -> float:
        return statistics.median(float(r[key]) for r in rows[name])

    loads = [float(r["load1"]) for name in rows for r in rows[name]]
    summary = {"hosts": hosts, "repeats": a.repeats, "cpus": os.cpu_count(),
               "load1_min_median_max": [min(loads), statistics.median(loads), max(loads)]}
    for key in ("wall_s", "controller_cpu_s", "rack_cpu_s", "controller_plus_rack_cpu_s", "machine_cpu_s"):
        p, s = med("preflight", key), med("ansible_setup", key)
        summary[key] = {"preflight": p, "ansible_setup": s, "ratio": round(s / p, 2) if p else None}
    summary["per_host"] = {"preflight_ssh_execs": 1, "ansible_setup_module_runs": 1,
                           "preflight_controller_cpu_ms_per_host":
                               round(1000 * summary["controller_cpu_s"]["preflight"] / hosts, 1),
                           "ansible_controller_cpu_ms_per_host":
                               round(1000 * summary["controller_cpu_s"]["ansible_setup"] / hosts, 1)}
    summary["limit"] = a.limit
    print(json.dumps(summary, indent=2))
    return summary, rows


if __name__ == "__main__":
    sys.exit(main())
