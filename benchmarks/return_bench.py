"""The rack's out-of-service time per return (issue 44): `provision drain` then `provision return` of one vLLM
cluster, N times, and where each return's time goes.

Each cycle drains the cluster (out of the balancer, units stopped, maintenance), then times `provision return`
(health gate + burn-in return tier, in-service + mark, the launch playbook, the generation probe, back into the
balancer) from its start to its last line. The split comes from three clocks that are all this machine's (the rack's
hosts are containers on its kernel): the return's own lines (timestamped as they are printed), the launch playbook's
task events (ansible-runner's job_events: the time before `systemctl start`, the wait loops), and vLLM's log in the
head's journal (`journalctl -u vllm.service`): python/vLLM import, model config, engine core and worker processes,
model load, compile/warm-up, KV cache init, API ready, first generation. Needs root and a vLLM rack brought up and
onboarded as `make demo-vllm` does (tests/vllm/conftest.py), under the rack lock:
    flock /tmp/provisioner-rack.lock .venv/bin/python benchmarks/return_bench.py --rack NAME --cycles 3 \
        --json benchmarks/return_bench-after.json --summary
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

#: vLLM log milestones (journal, short-unix timestamps), first match after the unit's start.
MILESTONES = [
    ("unit_started", re.compile(r"systemd\[1\]: Started vllm\.service")),
    ("api_imported", re.compile(r"\(APIServer pid=\d+\) INFO .*api_utils\.py")),
    ("model_config", re.compile(r"Resolved architecture")),
    ("engine_core_up", re.compile(r"\(EngineCore pid=\d+\) INFO .*Initializing a V1 LLM engine")),
    ("worker_up", re.compile(r"parallel_state\.py.*distributed_init_method")),
    ("pp_joined", re.compile(r"rank \d+ in world size \d+ is assigned")),
    ("load_start", re.compile(r"Starting to load model")),
    ("weights_loaded", re.compile(r"Loading weights took")),
    ("warmup_start", re.compile(r"Warming up model for the compilation")),
    ("warmup_done", re.compile(r"Warming up done")),
    ("engine_ready", re.compile(r"init engine \(profile, create kv cache, warmup model\) took")),
    ("api_ready", re.compile(r"Application startup complete")),
    ("first_completion", re.compile(r'"POST /v1/completions HTTP/1\.1" 200')),
]
#: Phases between consecutive milestones (name, from, to).
PHASES = [
    ("python_vllm_import", "unit_started", "api_imported"),
    ("model_config_inspect", "api_imported", "model_config"),
    ("engine_core_process_import", "model_config", "engine_core_up"),
    ("worker_process_import", "engine_core_up", "worker_up"),
    ("pp_rendezvous", "worker_up", "pp_joined"),
    ("model_load", "load_start", "weights_loaded"),
    ("compile_warmup", "warmup_start", "warmup_done"),
    ("kv_cache_init", "warmup_done", "engine_ready"),
    ("api_server_ready", "engine_ready", "api_ready"),
    ("ready_to_first_generation", "api_ready", "first_completion"),
]
#: The return's own steps, by the first words of their lines.
STEP_LINES = [("gate", re.compile(r": health gate: ")), ("burnin", re.compile(r": burn-in")),
              ("mark", re.compile(r"in-service written")), ("launch", re.compile(r": vLLM launched on ")),
              ("healthy", re.compile(r": generates at ")), ("balancer", re.compile(r"back into the balancer")),
              ("returned", re.compile(r"^returned "))]


def pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, max(0, round(p / 100 * len(xs) + 0.5) - 1))], 1)


def timed_lines(cmd: list[str], env: dict[str, str]) -> tuple[int, list[tuple[float, str]]]:
    """Run cmd, each stdout line with the wall time it arrived."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env)
    out = []
    assert p.stdout is not None
    for ln in p.stdout:
        out.append((time.time(), ln.rstrip("\n")))
    return p.wait(), out


def journal(h, host: str, since: float) -> list[tuple[float, str]]:
    stamp = dt.datetime.fromtimestamp(since - 1, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    r = h.ssh(host, f"journalctl -u vllm.service -o short-unix --no-pager --since '{stamp}'")
    out = []
    for ln in r.stdout.splitlines():
        head, _, rest = ln.partition(" ")
        try:
            out.append((float(head), rest))
        except ValueError:
            continue
    return out


def milestones(lines: list[tuple[float, str]]) -> dict[str, float]:
    """The first occurrence of each milestone after the last unit start."""
    starts = [i for i, (_, ln) in enumerate(lines) if MILESTONES[0][1].search(ln)]
    lines = lines[starts[-1]:] if starts else lines
    found: dict[str, float] = {}
    for t, ln in lines:
        for name, rx in MILESTONES:
            if name not in found and rx.search(ln):
                found[name] = t
    return found


def launch_tasks(since: float) -> dict[str, float]:
    """From the newest return-launch run dir: the playbook's start, when the start task began, when the /health
    wait and the generation probe tasks ended (ansible-runner's job_events)."""
    runs = sorted((ROOT / ".runs").glob("*-return-launch"))
    if not runs:
        return {}
    events = []
    for f in runs[-1].glob("artifacts/*/job_events/*.json"):
        e = json.loads(f.read_text())
        d = e.get("event_data", {})
        events.append((e.get("event"), d.get("task", ""), d.get("start"), d.get("end"), e.get("created")))

    def ts(s: str | None) -> float | None:
        return dt.datetime.fromisoformat(s).timestamp() if s else None

    created = [ts(c) for *_, c in events if c]
    out: dict[str, float] = {}
    if created:
        out["playbook_start"] = min(x for x in created if x)
        out["playbook_end"] = max(x for x in created if x)
    for ev, task, start, end, _ in events:
        if ev in ("runner_on_ok", "runner_on_failed", "runner_item_on_ok") and start:
            if task.startswith("Start clusters that are not serving"):
                out["start_task"] = min(out.get("start_task", 1e20), ts(start) or 1e20)
            if task.startswith("Wait for those clusters to answer /health"):
                out["health_wait_end"] = max(out.get("health_wait_end", 0), ts(end) or 0)
            if task.startswith("Generation probe on each head"):
                out["probe_end"] = max(out.get("probe_end", 0), ts(end) or 0)
    return out


def cycle(h, inv: str, clusters: list[str], heads: list[str], env: dict[str, str]) -> dict:
    prov = str(ROOT / ".venv" / "bin" / "provision")
    force = ["--force"] if len(clusters) > 1 else []  # both clusters of the model: the last one needs --force
    rc, dout = timed_lines([prov, "drain", inv, *clusters, "--reason", "return bench", *force], env)
    if rc != 0:
        raise SystemExit(f"drain failed: {dout[-20:]}")
    time.sleep(2)
    t0 = time.time()
    rc, rout = timed_lines([prov, "return", inv, *clusters, "--reason", "return bench"], env)
    t_end = time.time()
    if rc != 0:
        raise SystemExit("return failed:\n" + "\n".join(x for _, x in rout[-30:]))
    steps: dict[str, float] = {}
    for t, ln in rout:
        for name, rx in STEP_LINES:
            if name not in steps and rx.search(ln):
                steps[name] = round(t - t0, 1)
    per_head = {x: milestones(journal(h, x, t0)) for x in heads}
    ms = per_head[heads[0]]
    lt = launch_tasks(t0)
    start = ms.get("unit_started")
    rel = {k: round(v - start, 1) for k, v in ms.items()} if start else {}
    phases = {n: round(ms[b] - ms[a], 1) for n, a, b in PHASES if a in ms and b in ms}
    rec = {
        "return_s": round(t_end - t0, 1),
        "steps_at_s": steps,
        "vllm_from_unit_start_s": rel,
        "vllm_phases_s": phases,
        "launch_playbook_s": {
            "before_systemctl_start": round(start - lt["playbook_start"], 1) if start and "playbook_start" in lt
            else None,
            "unit_start_to_health_wait_end": round(lt["health_wait_end"] - start, 1)
            if start and "health_wait_end" in lt else None,
            "health_wait_end_to_probe_end": round(lt["probe_end"] - lt["health_wait_end"], 1)
            if {"probe_end", "health_wait_end"} <= lt.keys() else None,
            "after_probe_to_playbook_end": round(lt["playbook_end"] - lt["probe_end"], 1)
            if {"probe_end", "playbook_end"} <= lt.keys() else None,
            "total": round(lt["playbook_end"] - lt["playbook_start"], 1) if "playbook_end" in lt else None,
        },
        "polling_lag_s": {  # API ready (vLLM's log) to the wait loop seeing it, and to the return's next step
            "api_ready_to_health_wait_end": round(lt["health_wait_end"] - ms["api_ready"], 1)
            if "api_ready" in ms and "health_wait_end" in lt else None,
        },
        "heads_api_ready_after_return_start_s": {x: round(m["api_ready"] - t0, 1) for x, m in per_head.items()
                                                  if "api_ready" in m},
        "return_lines": [f"+{t - t0:6.1f}s {x}" for t, x in rout],
    }
    return rec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rack", required=True)
    ap.add_argument("--cluster", default="vllm_single", help="one cluster, or several (comma) returned together")
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--label", default="", help="what this run measures (before/after), kept in the JSON")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--summary", action="store_true", help="write the record into benchmarks/summary.json")
    ap.add_argument("--before", type=Path, help="an earlier run's JSON: the summary compares with its p50")
    args = ap.parse_args()

    from provisioner.inventory import load_fleet
    from provisioner_testbed import rack, vault

    vault.export_for_tests()
    env = dict(os.environ)
    env.setdefault("PROVISION_LEDGER", str(ROOT / ".runs" / "ledger-vllm-lane.sqlite3"))  # the vLLM lane's
    h = rack.handle(rack.load(args.rack))
    inv = str(h.inventory)
    fleet = load_fleet(Path(inv))
    clusters = args.cluster.split(",")
    heads = [fleet.clusters[c].head for c in clusters]
    loads = [float(Path("/proc/loadavg").read_text().split()[0])]
    cycles = []
    for i in range(args.cycles):
        rec = cycle(h, inv, clusters, heads, env)
        rec["cycle"] = i + 1
        cycles.append(rec)
        print(json.dumps({k: v for k, v in rec.items() if k != "return_lines"}), flush=True)
        loads.append(float(Path("/proc/loadavg").read_text().split()[0]))
    rs = [c["return_s"] for c in cycles]

    def med(get) -> float | None:
        xs = [x for x in (get(c) for c in cycles) if x is not None]
        return round(statistics.median(xs), 1) if xs else None

    breakdown = {f"vllm.{n}": med(lambda c, n=n: c["vllm_phases_s"].get(n)) for n, _, _ in PHASES}
    breakdown.update({f"launch.{k}": med(lambda c, k=k: c["launch_playbook_s"].get(k))
                      for k in cycles[0]["launch_playbook_s"]})
    breakdown["unit_start_to_api_ready"] = med(lambda c: c["vllm_from_unit_start_s"].get("api_ready"))
    breakdown["unit_start_to_first_generation"] = med(lambda c: c["vllm_from_unit_start_s"].get("first_completion"))
    breakdown["api_ready_to_health_wait_end"] = med(lambda c: c["polling_lag_s"]["api_ready_to_health_wait_end"])
    for name, _ in STEP_LINES:
        breakdown[f"return_step_at.{name}"] = med(lambda c, name=name: c["steps_at_s"].get(name))
    result = {"rack": args.rack, "cluster": args.cluster, "label": args.label, "cycles": cycles,
              "return_s": {"p50": pct(rs, 50), "max": max(rs), "min": min(rs), "n": len(rs)},
              "median_breakdown_s": breakdown, "load": {"min": min(loads), "max": max(loads)}}
    print(json.dumps({k: v for k, v in result.items() if k != "cycles"}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    if args.summary:
        from _summary import record

        before = json.loads(args.before.read_text()) if args.before else None
        b50 = before["return_s"]["p50"] if before else None
        record("return_out_of_service_s", anchor="issue 44: the rack's out-of-service time per return (`provision "
               "return` of a drained vLLM cluster, CPU rack, tiny model), measured and cut; ratio = before p50 / after "
               "p50", ours={"p50": result["return_s"]["p50"], "max": result["return_s"]["max"], "before_p50": b50},
               ratio=round(b50 / result["return_s"]["p50"], 2) if b50 else None,
               met=bool(b50 and result["return_s"]["p50"] < b50), load=result["load"],
               source=" ".join(["benchmarks/return_bench.py", *sys.argv[1:]]),
               detail={"median_breakdown_s": breakdown, "before_breakdown_s":
                       before["median_breakdown_s"] if before else None, "cycles": len(cycles)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
