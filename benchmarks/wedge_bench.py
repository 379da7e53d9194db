"""Wedge a vLLM cluster's engine behind the balancer N times and time the balancer's generation check (issue 44 s. 1).

Each cycle: SIGSTOP of the engine processes of one cluster head (`VLLM::EngineCore`, `VLLM::Worker*`; the API
server keeps answering `GET /health` 200), then the time until the balancer's active check has marked that head
`down` in its live nginx file (out), a few seconds wedged, SIGCONT, the time until the mark is gone (back). A paced
client loop sends completions through the balancer throughout: counted per cycle are the requests in flight at the
wedge moment and how many of them failed, and the requests that started after the head was out (+1 s for nginx's
reload) and failed or took longer than the probe's bound (they would have reached the wedged head): the goal is 0.
Needs root and a vLLM rack brought up and onboarded as `make demo-vllm` does (the balancer's active check is on by
default; the bench runs it at the role's default interval, which the testbed's inventory slows, and restores the
inventory's after), the balancer's run repeated once the clusters serve so that it reads their launch answers:
    flock /tmp/provisioner-rack.lock .venv/bin/provision run inventories/testbed-NAME/hosts.ini --limit lb
    flock /tmp/provisioner-rack.lock .venv/bin/python benchmarks/wedge_bench.py --rack NAME --cycles 10 \
        --json benchmarks/wedge_bench.json --summary
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

GOAL_S = 30.0


def pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, max(0, round(p / 100 * len(xs) + 0.5) - 1))], 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rack", required=True)
    ap.add_argument("--host", default="node03", help="the head to wedge (vllm_single's)")
    ap.add_argument("--lb", default="lb01")
    ap.add_argument("--cycles", type=int, default=10)
    ap.add_argument("--hold", type=float, default=3.0, help="seconds wedged after it is out")
    ap.add_argument("--settle", type=float, default=8.0, help="seconds between cycles")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--summary", action="store_true", help="write the record into benchmarks/summary.json")
    args = ap.parse_args()

    from provisioner.inventory import load_fleet
    from provisioner_testbed import rack, vault, vllm_image, wedge

    vault.export_for_tests()
    h = rack.handle(rack.load(args.rack))
    server = wedge.head_server(str(h.inventory), args.host)
    lb_url = f"http://{load_fleet(Path(h.inventory)).hosts[args.lb].address}:8000"
    body = {"model": "tiny-llama", "prompt": "The quick brown fox", "max_tokens": 4, "temperature": 0}
    bound = 10.0  # the probe's latency bound (vllm_probe_timeout): a request slower than this after out is suspect
    loads = [float(Path("/proc/loadavg").read_text().split()[0])]
    cycles = []
    # the role's default check interval: a testbed rack's inventory slows the check (provisioner_testbed/vllm_image.py)
    interval = wedge.role_default("serving_lb_active_health_interval")
    with (wedge.balancer_vars(str(h.inventory), args.lb, serving_lb_active_health_interval=interval),
          wedge.Client(lb_url, vllm_image.TESTBED_API_KEY, body, threads=2, period=2.0, timeout=120) as client):
        time.sleep(4)
        for i in range(args.cycles):
            w = wedge.wedge_cycle(h, args.host, args.lb, server, hold=args.hold,
                                  health_url=f"http://{server}/health")
            time.sleep(args.settle)
            out_at = w.stopped_at + (w.out_s or 0)
            flight = client.in_flight(w.stopped_at) + [r for r in client.between(w.stopped_at, w.stopped_at + 0.01)]
            after = client.between(out_at + 1.0, w.resumed_at or out_at)
            rec = {"cycle": i + 1, "out_s": round(w.out_s, 1) if w.out_s is not None else None,
                   "back_s": round(w.back_s, 1) if w.back_s is not None else None,
                   "health_while_wedged": w.health_while_wedged, "engine_pids": w.pids,
                   "in_flight_at_wedge": len(flight), "in_flight_failed": sum(r.code != 200 for r in flight),
                   "started_after_out": len(after),
                   "after_out_failed_or_slow": sum(r.code != 200 or r.end - r.start > bound for r in after)}
            cycles.append(rec)
            print(json.dumps(rec), flush=True)
            loads.append(float(Path("/proc/loadavg").read_text().split()[0]))
    reqs = client.done
    outs = [c["out_s"] for c in cycles if c["out_s"] is not None]
    backs = [c["back_s"] for c in cycles if c["back_s"] is not None]
    result = {
        "rack": args.rack, "host": args.host, "server": server, "cycles": cycles,
        "out_s": {"p50": pct(outs, 50), "p99": pct(outs, 99), "max": max(outs) if outs else None, "n": len(outs)},
        "back_s": {"p50": pct(backs, 50), "p99": pct(backs, 99), "max": max(backs) if backs else None,
                   "n": len(backs)},
        "requests": {"sent": len(reqs), "failed": sum(r.code != 200 for r in reqs),
                     "in_flight_at_wedges": sum(c["in_flight_at_wedge"] for c in cycles),
                     "after_out_failed_or_slow": sum(c["after_out_failed_or_slow"] for c in cycles)},
        "load": {"min": min(loads), "max": max(loads)},
    }
    print(json.dumps({k: v for k, v in result.items() if k != "cycles"}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    if args.summary:
        from _summary import record

        met = (len(outs) == len(backs) == len(cycles) and max(outs + backs) <= GOAL_S
               and result["requests"]["after_out_failed_or_slow"] == 0)
        record("wedged_engine_out_of_balancer_s", anchor="issue 44: a wedged engine (SIGSTOP, /health still 200) "
               "out of the balancer within 30 s and back within 30 s of SIGCONT; requests started after it is out "
               "never reach it", ours={"out_p50": result["out_s"]["p50"], "out_p99": result["out_s"]["p99"],
                                      "back_p50": result["back_s"]["p50"], "back_p99": result["back_s"]["p99"]},
               ratio=round(GOAL_S / max(outs + backs), 2) if outs and backs else None, met=met, load=result["load"],
               source=" ".join(["benchmarks/wedge_bench.py", *sys.argv[1:]]),
               detail={"requests": result["requests"], "cycles": len(cycles)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
