"""What the balancer's generation check costs the heads: the CPU of an idle vLLM rack at each check interval.

Each probe is a real generation, after which vLLM 0.32's engine processes busy-wait a second on their shared-memory
queue (docs/serving.md, "What the check costs a head"). For the timer stopped and for each INTERVAL: the balancer
provisioned at that interval (`provisioner_testbed.wedge.balancer_vars`, the inventory's own restored after), a
settle, then the CPU seconds of every process of the rack's hosts (each host's container, read from the
controller's /proc) over SECONDS, no client; the vLLM processes (command line or title with `vllm`) apart.
Needs root and a vLLM rack as `make demo-vllm` makes it:
    flock /tmp/provisioner-rack.lock .venv/bin/python benchmarks/check_cost_bench.py --rack NAME --summary
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: list[int]) -> tuple[float, float]:
    """(all, vLLM) CPU seconds so far of these processes (utime + stime; gone ones count 0)."""
    total = vllm = 0.0
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().lower()
        except (OSError, IndexError):
            continue
        s = (int(stat[11]) + int(stat[12])) / TICK
        total += s
        vllm += s if b"vllm" in cmd else 0.0
    return total, vllm


def measure(st, seconds: float) -> dict[str, float]:  # noqa: ANN001 - a rack state
    from _summary import loadavg

    from provisioner_testbed import rack

    # the same processes before and after: new ones (a relaunch) would be a different experiment
    pids = [p for h in st.hosts if h.proc is not None and h.proc.alive() for p in rack.descendants(h.proc.pid)]
    a = cpu_seconds(pids)
    load0 = loadavg()
    t0 = time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - t0
    b = cpu_seconds(pids)
    return {"rack_cores": round((b[0] - a[0]) / wall, 3), "vllm_cores": round((b[1] - a[1]) / wall, 3),
            "seconds": round(wall, 1), "load": [load0, loadavg()]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rack", required=True)
    ap.add_argument("--lb", default="lb01")
    ap.add_argument("--intervals", default="5s,30s", help="comma-separated check intervals to measure")
    ap.add_argument("--seconds", type=float, default=120.0, help="measurement window per setting")
    ap.add_argument("--settle", type=float, default=15.0, help="seconds after each change before measuring")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--summary", action="store_true", help="write the record into benchmarks/summary.json")
    args = ap.parse_args()

    from provisioner_testbed import rack, vault, wedge

    vault.export_for_tests()
    st = rack.load(args.rack)
    h = rack.handle(st)
    inv = str(h.inventory)
    result: dict = {"rack": args.rack, "settings": {}}
    r = h.ssh(args.lb, "systemctl stop vllm-lb-healthcheck.timer", timeout=60)
    if r.returncode != 0:
        print(r.stderr, file=sys.stderr)
        return 1
    try:
        time.sleep(args.settle)
        result["settings"]["stopped"] = measure(st, args.seconds)
    finally:
        h.ssh(args.lb, "systemctl start vllm-lb-healthcheck.timer", timeout=60)
    print(json.dumps({"stopped": result["settings"]["stopped"]}), flush=True)
    for interval in [i.strip() for i in args.intervals.split(",") if i.strip()]:
        with wedge.balancer_vars(inv, args.lb, serving_lb_active_health_interval=interval):
            time.sleep(args.settle)
            result["settings"][interval] = measure(st, args.seconds)
        print(json.dumps({interval: result["settings"][interval]}), flush=True)
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    if args.summary:
        from _summary import record

        s = result["settings"]
        default = str(wedge.role_default("serving_lb_active_health_interval"))
        loads = [x for v in s.values() for x in v["load"]]
        record("balancer_check_cpu_cost_cores", anchor="issue 44: the generation check on by default; what it costs "
               "an idle CPU vLLM rack (vLLM processes' cores) per check interval, timer stopped as the floor",
               ours={k: v["vllm_cores"] for k, v in s.items()}, ratio=None, met=None,
               load={"min": min(loads), "max": max(loads)},
               source=" ".join(["benchmarks/check_cost_bench.py", *sys.argv[1:]]),
               detail={"role_default_interval": default, "settings": s})
    return 0


if __name__ == "__main__":
    sys.exit(main())
