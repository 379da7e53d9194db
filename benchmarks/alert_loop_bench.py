"""Time from a fatal XID on a GPU node to the alert receiver acting on it (issue 44 section 2: <= 60 s p99), over N
injected faults on a running vLLM rack, detection only (no drain: the inventory copy has no lifecycle_policy, so
the receiver's `provision remediate` decides nothing and every node keeps serving between rounds).

Setup (idempotent): a copy of the rack's inventory with lb01 in group `monitoring`, `provision run -t
monitoring,alerting` (Prometheus + Alertmanager on lb01, the fault watch + node_exporter on the nodes), then
`provision receiver serve` on the controller. Each round: `xid=79` injected on the next node (testbed fault), then
polled every 0.25 s: Prometheus' ALERTS{alertname="ProvisionNodeXidFatal", alertstate="firing"} for the host
(`firing_s`), the receiver's "queued" line (`received_s`: Alertmanager delivered it) and its "action ... done" line
(`acted_s`: `provision health --limit NODE` + `provision remediate --limit NODE` finished); then the fault is cleared
and the resolve awaited. The full drain of one fault is tests/vllm/test_vllm_alert_loop.py's figure
(.runs/alert-loop-figures.json). Needs root and a vLLM rack; run it under the rack lock:
`flock /tmp/provisioner-rack.lock .venv/bin/python benchmarks/alert_loop_bench.py --rack NAME --faults 10`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
PROVISION = str(Path(sys.executable).with_name("provision"))
RX_PORT = 9096


def pct(xs: list[float], p: float) -> float | None:
    """Nearest-rank percentile."""
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(round(p / 100 * len(s) + 0.5)) - 1))]


def prom_firing(lb: str, host: str) -> bool:
    q = f'ALERTS{{alertname="ProvisionNodeXidFatal",alertstate="firing",host="{host}"}}'
    try:
        with urllib.request.urlopen(f"http://{lb}:9090/api/v1/query?query={urllib.parse.quote(q)}", timeout=5) as r:
            return bool(json.loads(r.read())["data"]["result"])
    except OSError:
        return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rack", required=True)
    ap.add_argument("--faults", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds per round before it counts as missed")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "alert_loop_bench.json")
    ap.add_argument("--summary", action="store_true", help="record the figure in benchmarks/summary.json")
    a = ap.parse_args()
    from _summary import loadavg, record
    from ansible.parsing.vault import VaultLib, VaultSecret

    from provisioner.inventory import load_fleet
    from provisioner_testbed import rack as testbed
    from provisioner_testbed import vault

    vault.export_for_tests()
    st = testbed.RackState.load(a.rack)
    if st is None:
        print(f"no rack {a.rack!r}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="alert-bench-"))
    inv_dir = work / "inventory"
    shutil.copytree(Path(st.inventory).parent, inv_dir)
    inv = inv_dir / Path(st.inventory).name
    fleet = load_fleet(inv)
    nodes = sorted(h.name for h in fleet.gpu_nodes)
    lb = fleet.hosts["lb01"].address
    controller = ".".join(lb.split(".")[:3] + ["1"])
    token = "alert-bench-0123456789abcdef"
    cipher = VaultLib([("default", VaultSecret(vault.password_file().read_text().strip().encode()))]).encrypt(token)
    with inv.open("a") as f:
        f.write("\n[monitoring]\nlb01\n")
    (inv_dir / "group_vars" / "monitoring.yml").write_text(
        'monitoring_alertmanagers: ["127.0.0.1:9093"]\nmonitoring_dcgm_exporter: false\n'
        f"alertmanager_receiver_url: http://{controller}:{RX_PORT}/alerts\n"
        "alert_receiver_token: !vault |\n" + "".join(f"  {ln}\n" for ln in cipher.decode().splitlines()))
    t = time.monotonic()
    r = subprocess.run([PROVISION, "run", str(inv), "-t", "monitoring,alerting"], capture_output=True, text=True)
    setup_s = round(time.monotonic() - t, 1)
    if r.returncode != 0:
        print((r.stdout + r.stderr)[-4000:], file=sys.stderr)
        return 1
    subprocess.run(testbed.hostmod.ssh_argv(st, lb, "systemctl", "start", "prometheus-alertmanager"),
                   capture_output=True, timeout=60)
    log = work / "receiver.log"
    with log.open("ab") as out:
        rx = subprocess.Popen([PROVISION, "receiver", "serve", str(inv), "--listen", f"{controller}:{RX_PORT}",
                               "--state", str(work / "rx.sqlite3")], stdout=out, stderr=subprocess.STDOUT)
    rounds: list[dict] = []
    load0 = loadavg()
    try:
        time.sleep(20)  # the first scrapes of every node
        for i in range(a.faults):
            node = nodes[i % len(nodes)]
            start = len(log.read_text().splitlines())
            t0 = time.monotonic()
            testbed.fault(a.rack, node, ["xid=79"])
            marks: dict[str, float] = {}
            while time.monotonic() - t0 < a.timeout and "acted_s" not in marks:
                lines = log.read_text().splitlines()[start:]
                now = round(time.monotonic() - t0, 2)
                if "firing_s" not in marks and prom_firing(lb, node):
                    marks["firing_s"] = now
                if "received_s" not in marks and any(f"host={node} status=firing: queued" in ln for ln in lines):
                    marks["received_s"] = now
                if "received_s" in marks and any(" action " in f" {ln} " and f"host={node}:" in ln for ln in lines):
                    marks["acted_s"] = now
                time.sleep(0.25)
            testbed.clear(a.rack, node)
            t1 = time.monotonic()
            while time.monotonic() - t1 < a.timeout:  # the resolve reaches the receiver before the next fault
                if any(f"host={node} status=resolved" in ln for ln in log.read_text().splitlines()[start:]):
                    marks["resolved_after_clear_s"] = round(time.monotonic() - t1, 2)
                    break
                time.sleep(0.5)
            rounds.append({"round": i, "node": node, **marks, "load1": loadavg()})
            print(json.dumps(rounds[-1]), flush=True)
    finally:
        rx.terminate()
        rx.wait(10)
        subprocess.run(testbed.hostmod.ssh_argv(st, lb, "systemctl", "stop", "prometheus-alertmanager"),
                       capture_output=True, timeout=60)
        for n in nodes:
            testbed.clear(a.rack, n)
    load1 = loadavg()
    figs = {k: [r[k] for r in rounds if k in r] for k in ("firing_s", "received_s", "acted_s")}
    total = {"faults": len(rounds), "missed": sum("received_s" not in r for r in rounds), "setup_s": setup_s,
             **{f"{k}_p50": pct(v, 50) for k, v in figs.items()}, **{f"{k}_p99": pct(v, 99) for k, v in figs.items()},
             "load": {"start": load0, "end": load1, "max_round": max((r["load1"] for r in rounds), default=None)}}
    print("TOTAL " + json.dumps(total), flush=True)
    a.out.write_text(json.dumps({"total": total, "rounds": rounds}, indent=2) + "\n")
    if a.summary and rounds:
        p99 = total["received_s_p99"]
        record("alert_loop_rack_fault_to_receiver_p99_s",
               anchor="issue 44 section 2: a fatal signal quarantines the node and drains its cluster within 60 s "
                      "p99; this is the fault -> receiver part (detection), the drain adds the test's figure",
               ours=total, ratio=None if p99 is None else round(60.0 / p99, 2),
               met=None if p99 is None else bool(p99 <= 60 and total["missed"] == 0),
               load={"min": min(load0, load1), "max": max(load0, load1, total["load"]["max_round"] or 0)},
               source=f"benchmarks/alert_loop_bench.py --rack {a.rack} --faults {a.faults}",
               detail={"file": str(a.out.relative_to(ROOT)) if a.out.is_relative_to(ROOT) else str(a.out)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
