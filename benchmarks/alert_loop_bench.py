"""Time from a fatal XID on a GPU node to the alert receiver acting on it (issue 44 section 2: <= 60 s p99), over N
injected faults on a running vLLM rack. Two modes:

- detection only (default): the inventory copy has no lifecycle_policy, so the receiver's `provision remediate`
  decides nothing and every node keeps serving between rounds;
- `--cycle`: the full loop per fault, no command typed: the copy adds a lifecycle_policy and rails that let every
  round act (cooldown_s 0, actions_per_hour 1000, breaker shares 1.0: a benchmark, not a site's settings); each
  round injects `xid=79` on the node (`--node`, default node03: vllm_single's one member), waits for it quarantined
  and its cluster out of the balancer and stopped (`drained_s`), clears the fault and waits for the loop to return
  it (the resolve -> the receiver's health + remediate -> in service, back into the balancer: `returned_s`, from
  the clear), and reads the incident's own timestamps from the ledger (detect/drain/return).

- `--bad-push`: from a FULLY serving rack (every node in service, every cluster generating), the same fatal XID
  injected on every GPU node within a few seconds, with the rack's breaker (defaults: breaker_share 0.25, window 300
  s; take-outs of earlier runs waited out of the window first; cool-down and rate limit opened): the time until
  the breaker opens (`breaker_open_s`, the ledger's breaker event and
  why), which clusters still serve once every alert was acted on, the client's requests during the push; then the
  faults cleared, the taken-out cluster returned by the loop (`returned_after_clear_s`) and the breaker closed as an
  operator does (`provision remediate --close-breaker`). One round (`alert_loop_bench_bad_push.json`).

The rack's monitoring host (lb01 in group `monitoring`, Prometheus + Alertmanager routed to the controller on the
rack bridge: `testbed up --with-vllm --balancers 1` writes it, `make demo-vllm` installs it) is used as it is;
`provision receiver serve` runs on the controller for the benchmark. Polled every 0.25 s: Prometheus'
ALERTS{alertname="ProvisionNodeXidFatal", alertstate="firing"} for the host (`firing_s`), the receiver's "queued"
line (`received_s`) and its "action ... done" line (`acted_s`). With `--client-period S` (default 4, 0: none) one
paced client sends a tiny completion through the balancer (lb01:8000, the API key) throughout and counts requests
sent / failed per phase (the phase the request started in): `fault` (injection -> drained), `out` (drained -> the
clear), `return` (the clear -> returned), `between` (the rest). Needs root and a vLLM rack; run it under the rack
lock: `flock /tmp/provisioner-rack.lock .venv/bin/python benchmarks/alert_loop_bench.py --rack NAME --faults 10
[--cycle]`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
PROVISION = str(Path(sys.executable).with_name("provision"))
POLICY = {"quarantine_on": ["xid"], "remediation": ["gpu_reset"],
          "replace_after": {"quarantines": 1000, "window_days": 1}}
#: the breaker as a site has it (share 0.25, window 300 s); the rate limit and the cool-down opened so that earlier
#: rounds on the same rack (--cycle) do not hold the push's first take-out: the breaker alone is measured
BAD_PUSH_RAILS = {"mode": "act", "cooldown_s": 0, "actions_per_hour": 1000}
BENCH_RAILS = {"mode": "act", "cooldown_s": 0, "actions_per_hour": 1000, "breaker_share": 1.0,
               "breaker_model_share": 1.0}


def _state(site: str, host: str) -> str:
    from provisioner.ledger import Ledger
    from provisioner.paths import ledger_path

    with Ledger.open(ledger_path(), site=site) as lg:
        return str(lg.state(host)[0])


def _incident(site: str, host: str) -> dict[str, float]:
    """The node's newest incident's own durations (the ledger's timestamps)."""
    from provisioner.ledger import Ledger
    from provisioner.paths import ledger_path

    with Ledger.open(ledger_path(), site=site) as lg:
        inc = lg.incidents(host=host)
    if not inc:
        return {}
    i = inc[-1]
    out = {"detect_s": round(i.detected - i.signal, 2)}
    if i.drained is not None:
        out["drain_s"] = round(i.drained - i.detected, 2)
    if i.returned is not None:
        out["return_s"] = round(i.returned - i.detected, 2)
    return out


def _up(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as r:
            return bool(r.status == 200)
    except OSError:
        return False


class Client:
    """One paced client through the balancer: a request every `period` s, every status kept with its phase."""

    BODY = {"model": "tiny-llama", "prompt": "The quick brown fox", "max_tokens": 4, "temperature": 0}

    def __init__(self, url: str, key: str, period: float) -> None:
        self.url, self.key, self.period, self.phase = url, key, period, "between"
        self.codes: list[tuple[str, int]] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)

    def _one(self) -> int:
        req = urllib.request.Request(self.url + "/v1/completions", data=json.dumps(self.BODY).encode(),
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {self.key}"})
        try:
            with urllib.request.urlopen(req, timeout=300) as r:  # noqa: S310 - the rack's own balancer
                r.read()
                return int(r.status)
        except urllib.error.HTTPError as e:
            return int(e.code)
        except OSError:
            return 0

    def _loop(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            phase = self.phase
            self.codes.append((phase, self._one()))
            self._stop.wait(max(0.0, self.period - (time.monotonic() - t0)))

    def counts(self, since: int = 0) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for phase, code in list(self.codes)[since:]:
            c = out.setdefault(phase, {"sent": 0, "failed": 0})
            c["sent"] += 1
            c["failed"] += code != 200
        return out

    def start(self) -> None:
        if self.period > 0:
            self._t.start()

    def stop(self) -> None:
        self._stop.set()
        if self._t.is_alive():
            self._t.join(timeout=320)


def _utc_today(hhmm: str) -> float:
    """Epoch seconds of today's HH:MM UTC."""
    import datetime as dt

    h, m = (int(x) for x in hhmm.split(":"))
    now = dt.datetime.now(dt.UTC)
    return now.replace(hour=h, minute=m, second=0, microsecond=0).timestamp()


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


def _serving(fleet, cluster: str) -> bool:  # type: ignore[no-untyped-def]
    c = fleet.clusters[cluster]
    return _up(f"http://{fleet.hosts[c.head].address}:{c.settings.get('port', 8000)}")


def bad_push(a: argparse.Namespace, fleet, inv: Path, site: str, log: Path, client: Client,  # type: ignore[no-untyped-def]
             load0: float) -> int:
    """One bad push from a fully serving rack (see the module's docstring); writes a.out, records --summary."""
    from _summary import loadavg, record

    from provisioner.ledger import Ledger
    from provisioner.paths import ledger_path
    from provisioner_testbed import rack as testbed

    nodes = sorted(h.name for h in fleet.gpu_nodes)
    clusters = sorted(fleet.clusters)
    with Ledger.open(ledger_path(), site=site) as lg:
        if lg.breaker()[0] is not None:
            print("the breaker is open already: close it first (provision remediate --close-breaker)", file=sys.stderr)
            return 2
    with Ledger.open(ledger_path(), site=site) as lg:  # earlier take-outs out of the breaker's window (300 s)
        last = max((x.at for x in lg.actions(since=time.time() - 300, statuses=("done", "failed", "running"),
                                             limit=1000) if x.kind in ("quarantine", "replace", "restart_cluster")),
                   default=0.0)
    if last and time.time() - last < 305:
        print(f"waiting {305 - (time.time() - last):.0f} s: a take-out of an earlier run is in the breaker's window",
              flush=True)
        time.sleep(max(0.0, 305 - (time.time() - last)))
    states = {n: _state(site, n) for n in nodes}
    if any(s != "in-service" for s in states.values()) or not all(_serving(fleet, c) for c in clusters):
        print(f"not fully serving: {states}, serving {[c for c in clusters if _serving(fleet, c)]}", file=sys.stderr)
        return 2
    out: dict = {"nodes": nodes, "clusters": clusters, "rails": BAD_PUSH_RAILS}
    start = len(log.read_text().splitlines())
    sent0 = len(client.codes)
    client.phase = "bad_push"
    t0 = time.monotonic()
    for n in nodes:  # the same fatal XID everywhere within a few seconds
        testbed.fault(a.rack, n, ["xid=79"])
    out["injected_within_s"] = round(time.monotonic() - t0, 2)
    try:
        while time.monotonic() - t0 < a.timeout:
            with Ledger.open(ledger_path(), site=site) as lg:
                ev = lg.breaker()[0]
            if ev is not None:
                out["breaker_open_s"] = round(time.monotonic() - t0, 2)
                out["breaker_why"] = ev.why
                break
            time.sleep(1)
        # every node's alert acted on (done, or blocked by a rail): the receiver's "action ... host=N:" lines
        while time.monotonic() - t0 < a.timeout + 120:
            lines = log.read_text().splitlines()[start:]
            if all(any(" action " in f" {ln} " and f"host={n}:" in ln for ln in lines) for n in nodes):
                out["all_acted_s"] = round(time.monotonic() - t0, 2)
                break
            time.sleep(1)
        time.sleep(10)  # the client keeps going a little after the last action
        out["states"] = {n: _state(site, n) for n in nodes}
        out["serving"] = [c for c in clusters if _serving(fleet, c)]
        out["client_bad_push"] = client.counts(sent0).get("bad_push")
        print(json.dumps(out), flush=True)
        client.phase = "return"
        t1 = time.monotonic()
        for n in nodes:
            testbed.clear(a.rack, n)
        until = min(a.return_timeout, (_utc_today(a.end_by) - time.time()) if a.end_by else a.return_timeout)
        while time.monotonic() - t1 < until:
            if all(_state(site, n) == "in-service" for n in nodes) and all(_serving(fleet, c) for c in clusters):
                out["returned_after_clear_s"] = round(time.monotonic() - t1, 2)
                break
            time.sleep(2)
        client.phase = "between"
    finally:
        for n in nodes:
            testbed.clear(a.rack, n)
        r = subprocess.run([PROVISION, "remediate", str(inv), "--close-breaker", "--reason", "bench: bad push rolled "
                            "back"], capture_output=True, text=True, timeout=600)
        out["breaker_closed"] = r.returncode == 0 and "breaker closed" in r.stdout
    out["client"] = client.counts(sent0)
    load1 = loadavg()
    out["load"] = {"start": load0, "end": load1}
    failed = sum(c["failed"] for c in out["client"].values())
    met = bool(out.get("breaker_open_s") is not None and out["serving"] and failed == 0)
    print("TOTAL " + json.dumps(out), flush=True)
    a.out.write_text(json.dumps(out, indent=2) + "\n")
    if a.summary:
        record("alert_loop_rack_bad_push", anchor="issue 44 section 3: a bad push (the same fatal XID on every node "
               "within a few seconds): the breaker opens before the last cluster goes, the client keeps being served "
               "(ratio: none; met: the breaker opened, a cluster served throughout, 0 failed requests)",
               ours={k: out.get(k) for k in ("breaker_open_s", "serving", "states", "client",
                                             "returned_after_clear_s")}, ratio=None, met=met,
               load={"min": min(load0, load1), "max": max(load0, load1)},
               source=f"benchmarks/alert_loop_bench.py --rack {a.rack} --bad-push",
               detail={"file": str(a.out.relative_to(ROOT)) if a.out.is_relative_to(ROOT) else str(a.out)})
    return 0 if met else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rack", required=True)
    ap.add_argument("--faults", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds per round before it counts as missed")
    ap.add_argument("--out", type=Path, default=None, help="default: benchmarks/alert_loop_bench[_cycle].json")
    ap.add_argument("--summary", action="store_true", help="record the figure in benchmarks/summary.json")
    ap.add_argument("--cycle", action="store_true", help="the full loop per fault: drained, then returned")
    ap.add_argument("--bad-push", action="store_true", help="one round: the fatal XID on every node at once")
    ap.add_argument("--node", default="node03", help="--cycle: the node that faults (default: vllm_single's)")
    ap.add_argument("--return-timeout", type=float, default=900.0, help="--cycle: seconds for the return")
    ap.add_argument("--end-by", default=None, metavar="HH:MM",
                    help="UTC: start no round that could not finish by then (--round-budget s per round)")
    ap.add_argument("--round-budget", type=float, default=330.0, help="--end-by: the seconds one round may take")
    ap.add_argument("--client-period", type=float, default=4.0,
                    help="seconds between the client's requests through the balancer (0: no client)")
    a = ap.parse_args()
    if a.bad_push and a.cycle:
        ap.error("--bad-push and --cycle are two different runs")
    a.out = a.out or ROOT / "benchmarks" / ("alert_loop_bench_bad_push.json" if a.bad_push else
                                            "alert_loop_bench_cycle.json" if a.cycle else "alert_loop_bench.json")
    from _summary import loadavg, record

    from provisioner.inventory import load_fleet
    from provisioner.ledger.site import site_of
    from provisioner_testbed import rack as testbed
    from provisioner_testbed import vault, vllm_image

    vault.export_for_tests()
    st = testbed.RackState.load(a.rack)
    if st is None:
        print(f"no rack {a.rack!r}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="alert-bench-"))
    inv_dir = work / "inventory"
    shutil.copytree(Path(st.inventory).parent, inv_dir)
    inv = inv_dir / Path(st.inventory).name
    if a.cycle or a.bad_push:
        all_yml = inv_dir / "group_vars" / "all.yml"
        all_yml.write_text(all_yml.read_text().replace("remediation_rails:\n  mode: act\n", yaml.safe_dump(
            {"remediation_rails": BAD_PUSH_RAILS if a.bad_push else BENCH_RAILS}, default_flow_style=False)))
        with (inv_dir / "group_vars" / "gpu_nodes.yml").open("a") as f:
            f.write(yaml.safe_dump({"lifecycle_policy": POLICY}))
    fleet = load_fleet(inv)
    if "lb01" not in fleet.groups.get("monitoring", ()):
        print(f"rack {a.rack!r} has no monitoring host: `provision testbed up --with-vllm --balancers 1` writes it",
              file=sys.stderr)
        return 2
    nodes = [a.node] if a.cycle else sorted(h.name for h in fleet.gpu_nodes)
    lb = fleet.hosts["lb01"].address
    target = urllib.parse.urlsplit(str(fleet.hosts["lb01"].vars["alertmanager_receiver_url"]))
    site = site_of(fleet)
    setup_s = 0.0
    log = work / "receiver.log"
    with log.open("ab") as out:
        rx = subprocess.Popen([PROVISION, "receiver", "serve", str(inv), "--listen",
                               f"{target.hostname}:{target.port}", "--state", str(work / "rx.sqlite3")],
                              stdout=out, stderr=subprocess.STDOUT)
    rounds: list[dict] = []
    load0 = loadavg()
    client = Client(f"http://{lb}:8000", vllm_image.TESTBED_API_KEY, a.client_period)
    try:
        client.start()
        time.sleep(20)  # the first scrapes of every node
        if a.bad_push:
            return bad_push(a, fleet, inv, site, log, client, load0)
        for i in range(a.faults):
            if a.end_by and time.time() + a.round_budget > _utc_today(a.end_by):
                print(f"--end-by {a.end_by}: no time left for round {i}; stopping after {i} rounds", flush=True)
                break
            node = nodes[i % len(nodes)]
            start = len(log.read_text().splitlines())
            sent0 = len(client.codes)
            t0 = time.monotonic()
            client.phase = "fault"
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
            if a.cycle:  # quarantined, out of the balancer, stopped
                cluster = next(c for c, cl in fleet.clusters.items() if node in cl.members)
                head = fleet.clusters[cluster].head
                url = f"http://{fleet.hosts[head].address}:{fleet.clusters[cluster].settings.get('port', 8000)}"
                while time.monotonic() - t0 < a.timeout and "drained_s" not in marks:
                    if _state(site, node) == "quarantined" and not _up(url):
                        marks["drained_s"] = round(time.monotonic() - t0, 2)
                    time.sleep(0.5)
                client.phase = "out"
            client.phase = "return" if a.cycle else "between"
            testbed.clear(a.rack, node)
            t1 = time.monotonic()
            while time.monotonic() - t1 < a.timeout:  # the resolve reaches the receiver before the next fault
                if any(f"host={node} status=resolved" in ln for ln in log.read_text().splitlines()[start:]):
                    marks["resolved_after_clear_s"] = round(time.monotonic() - t1, 2)
                    break
                time.sleep(0.5)
            if a.cycle:  # the loop returns it: in service and generating again
                while time.monotonic() - t1 < a.return_timeout:
                    if _state(site, node) == "in-service" and _up(url):
                        marks["returned_after_clear_s"] = round(time.monotonic() - t1, 2)
                        break
                    time.sleep(1)
                client.phase = "between"
                t2 = time.monotonic()  # the return's remediate ends (the incident marked) after the balancer add
                while time.monotonic() - t2 < 120 and not any("/resolved " in ln and f"host={node}: done" in ln
                                                              for ln in log.read_text().splitlines()[start:]):
                    time.sleep(1)
                marks.update(_incident(site, node))
            rounds.append({"round": i, "node": node, **marks, "client": client.counts(sent0), "load1": loadavg()})
            print(json.dumps(rounds[-1]), flush=True)
    finally:
        client.stop()
        rx.terminate()
        rx.wait(10)
        for n in nodes:
            testbed.clear(a.rack, n)
    load1 = loadavg()
    figs = {k: [r[k] for r in rounds if k in r] for k in ("firing_s", "received_s", "acted_s", "drained_s",
                                                         "returned_after_clear_s", "detect_s", "drain_s",
                                                         "return_s")}
    total = {"faults": len(rounds), "missed": sum("received_s" not in r for r in rounds), "setup_s": setup_s,
             **{f"{k}_p50": pct(v, 50) for k, v in figs.items()}, **{f"{k}_p99": pct(v, 99) for k, v in figs.items()},
             "client": client.counts(), "client_period_s": a.client_period,
             "load": {"start": load0, "end": load1, "max_round": max((r["load1"] for r in rounds), default=None)}}
    print("TOTAL " + json.dumps(total), flush=True)
    a.out.write_text(json.dumps({"total": total, "rounds": rounds}, indent=2) + "\n")
    if a.summary and rounds and a.cycle:
        p99 = total["drained_s_p99"]
        record("alert_loop_rack_cycle_fault_to_drained_p99_s",
               anchor="issue 44 section 2: a fatal signal quarantines the node and drains its cluster within 60 s "
                      "p99, no command typed; cleared -> returned by the loop (return figures alongside)",
               ours=total, ratio=None if p99 is None else round(60.0 / p99, 2),
               met=None if p99 is None else bool(p99 <= 60 and total["missed"] == 0),
               load={"min": min(load0, load1), "max": max(load0, load1, total["load"]["max_round"] or 0)},
               source=f"benchmarks/alert_loop_bench.py --rack {a.rack} --faults {a.faults} --cycle --node {a.node}",
               detail={"file": str(a.out.relative_to(ROOT)) if a.out.is_relative_to(ROOT) else str(a.out)})
    elif a.summary and rounds:
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
