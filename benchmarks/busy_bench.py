"""Busy is not stuck: load a vLLM head so that the balancer's generation check misses its bound, count what the
check decided, then wedge the head under the same load (issue 44 s. 1, the check on by default).

Steps: the balancer's run with a short probe bound (`-e serving_lb_active_health_timeout=BOUND`, 1 s: the argument
spec's type is int); THREADS clients posting long completions straight to the head (more than its max_num_seqs, so
the probe waits in vLLM's queue) for SECONDS; then SIGSTOP of the head's engine under that load until the check marks
it down, SIGCONT, until it is back; then the balancer's run with the defaults again. The check's verdicts come from
its journal on the balancer (one JSON line per run): per run the head is up, busy (slow, its token counters advancing:
kept) or down. Under load a head must never be down; wedged it must be down with its counters flat.
Needs root and a vLLM rack brought up as `make demo-vllm` does:
    flock /tmp/provisioner-rack.lock .venv/bin/python benchmarks/busy_bench.py --rack NAME --json busy.json --summary
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


def tally(vs: list[tuple[float, dict]], server: str, t0: float, t1: float) -> dict[str, int]:
    n = {"runs": 0, "up": 0, "busy": 0, "down": 0}
    for t, v in vs:
        if t0 <= t < t1:
            n["runs"] += 1
            n["down" if server in v.get("down", []) else "busy" if server in v.get("busy", []) else "up"] += 1
    return n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rack", required=True)
    ap.add_argument("--host", default="node03", help="the head to load and wedge (vllm_single's)")
    ap.add_argument("--lb", default="lb01")
    ap.add_argument("--bound", type=int, default=1, help="the probe's bound during the bench (s)")
    ap.add_argument("--threads", type=int, default=20, help="clients posting to the head (max_num_seqs is 16)")
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=60.0, help="length of the load phase")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--summary", action="store_true", help="write the record into benchmarks/summary.json")
    args = ap.parse_args()

    from provisioner_testbed import rack, vault, vllm_image, wedge

    vault.export_for_tests()
    h = rack.handle(rack.load(args.rack))
    inv = str(h.inventory)
    server = wedge.head_server(inv, args.host)
    loads = [float(Path("/proc/loadavg").read_text().split()[0])]
    result: dict = {"rack": args.rack, "host": args.host, "server": server, "bound_s": args.bound,
                    "threads": args.threads, "max_tokens": args.max_tokens}
    # the role's default interval (a testbed rack's inventory slows the check) and the bench's probe bound
    with wedge.balancer_vars(inv, args.lb, serving_lb_active_health_timeout=args.bound,
                             serving_lb_active_health_interval=wedge.role_default("serving_lb_active_health_interval")):
        try:
            body = {"model": "tiny-llama", "prompt": "The quick brown fox " * 20, "max_tokens": args.max_tokens,
                    "temperature": 0, "ignore_eos": True}
            with wedge.Client(f"http://{server}", vllm_image.TESTBED_API_KEY, body, threads=args.threads,
                              period=0.0, timeout=300) as client:
                t_load = time.time()
                time.sleep(args.seconds)
                loads.append(float(Path("/proc/loadavg").read_text().split()[0]))
                t_stop = time.time()
                w = wedge.wedge_cycle(h, args.host, args.lb, server, hold=3, health_url=f"http://{server}/health")
                t_end = time.time()
            loads.append(float(Path("/proc/loadavg").read_text().split()[0]))
            time.sleep(6)  # the journal has the last run
            vs = wedge.check_runs(h, args.lb, t_load - 1)
            wedged = [v for t, v in vs if t_stop <= t < t_end and server in v.get("down", [])]
            result.update({
                "load_phase": {**tally(vs, server, t_load, t_stop), "seconds": round(t_stop - t_load, 1),
                               "requests": len(client.done),
                               "failed": sum(r.code != 200 for r in client.done)},
                "busy_why": next((v["why"][server] for t, v in vs
                                  if t_load <= t < t_stop and server in v.get("busy", [])), None),
                "wedge": {"out_s": round(w.out_s, 1) if w.out_s is not None else None,
                          "back_s": round(w.back_s, 1) if w.back_s is not None else None,
                          "health_while_wedged": w.health_while_wedged,
                          "down_why": wedged[0]["why"].get(server) if wedged else None},
                "load": {"min": min(loads), "max": max(loads)},
            })
        finally:
            wedge.signal_engine(h, args.host, "CONT")
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    lp = result["load_phase"]
    met = (lp["down"] == 0 and lp["busy"] > 0 and result["wedge"]["out_s"] is not None
           and "flat" in (result["wedge"]["down_why"] or ""))
    if args.summary:
        from _summary import record

        record("busy_head_kept_stuck_head_out", anchor="issue 44: the balancer's generation check on by default must "
               "tell a busy head (slow under load, still generating) from a stuck one (SIGSTOPped engine)",
               ours={"load_runs": lp["runs"], "busy": lp["busy"], "down_under_load": lp["down"],
                     "wedged_out_s": result["wedge"]["out_s"]},
               ratio=None, met=met, load=result["load"], source=" ".join(["benchmarks/busy_bench.py", *sys.argv[1:]]),
               detail={k: result[k] for k in ("bound_s", "threads", "max_tokens", "busy_why", "wedge")})
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
