"""Serving truth on the CPU vLLM rack (issue 44 section 1): "this cluster serves" means it just generated.

The launch wait recorded each head's answer to the generation probe (a greedy completion of a fixed prompt with the
API key) on the head; the balancer's active check (serving_lb's default; the balancer's run here reads the launch
records, which the session's setup ran before the clusters launched) posts the same probe to both heads every few
seconds and compares; a head that is only slow stays while its engine's token counters advance (busy, not stuck).
Shown with a paced client loop through the balancer running throughout: a head whose answer no longer matches its
launch record is taken out; a head whose engine is wedged (SIGSTOP of `VLLM::EngineCore`/`VLLM::Worker*`, the API
server still answering `/health` 200 and `/metrics`, its token counters flat) is taken out, no request that starts
after that reaches it, failures only among those in flight at the wedge moment, and it is back after SIGCONT.
Deadlines here are generous (no timed tests): the figures are benchmarks/wedge_bench.py's.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from vllm_e2e import PROVISION, VllmRack

from provisioner import PROJECT_ROOT
from provisioner_testbed import wedge

pytestmark = pytest.mark.vllm

LB = "lb01"
WEDGED = "node03"  # vllm_single's head
OTHER = "node01"  # vllm_pp's head
BOUND_S = 180  # generous: the goal (30 s) is measured by benchmarks/wedge_bench.py
PROBE_TIMEOUT_S = 10  # vllm_probe_timeout: an answer slower than this after the head is out would be suspect
BODY = {"model": "tiny-llama", "prompt": "The quick brown fox", "max_tokens": 4, "temperature": 0}


def provision(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROVISION, *args], capture_output=True, text=True, timeout=1800, cwd=PROJECT_ROOT)


def record(rack: VllmRack, host: str) -> dict:
    r = rack.ssh(host, "cat /var/lib/provisioner/vllm-probe.json")
    assert r.returncode == 0, f"{host}: no launch answer recorded: {r.stderr}"
    return json.loads(r.stdout)


def test_launch_answers_recorded_and_the_balancer_drops_a_wedged_engine(vllm_rack: VllmRack) -> None:
    rack = vllm_rack
    for cluster in rack.heads:
        assert rack.wait_healthy(cluster, 900) is not None, f"{cluster} is not healthy"
    # the launch wait recorded what each head generated (same model, same weights: the same greedy answer)
    recs = {h: record(rack, h) for h in (OTHER, WEDGED)}
    assert {r["model"] for r in recs.values()} == {"tiny-llama"}
    assert recs[OTHER]["text"] and recs[OTHER]["text"] == recs[WEDGED]["text"], recs
    assert rack.api_key not in json.dumps(recs) and rack.api_key not in rack.run_output
    # graceful stop aligned with the drain's wait: vLLM drains in-flight requests for drain_wait s on SIGTERM
    unit = rack.ssh(WEDGED, "systemctl show -p TimeoutStopUSec -p ExecStart vllm.service").stdout
    assert "--shutdown-timeout 120 " in unit and "TimeoutStopUSec=2min 30s" in unit, unit

    inv = str(rack.inventory)
    from provisioner.inventory import load_fleet

    fleet = load_fleet(Path(inv))
    servers = {h: f"{fleet.hosts[h].address}:8000" for h in (OTHER, WEDGED)}
    lb_url = f"http://{fleet.hosts[LB].address}:8000"
    p = provision("run", inv, "--limit", LB)
    try:
        assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
        assert rack.api_key not in p.stdout + p.stderr
        st = rack.ssh(LB, "stat -c '%a %U' /var/lib/vllm-lb/probe.json").stdout.split()
        assert st == ["600", "root"], st
        assert wedge.wait_for(lambda: not any(wedge.marked_down(rack.handle, LB, s)  # type: ignore[arg-type]
                                              for s in servers.values()), BOUND_S) is not None

        # an answer other than the launch record takes the head out (the probe file says what node01 said)
        # edited on lb01 itself (the file holds the API key: it never travels in an argv)
        edit = ("import json; p = '/var/lib/vllm-lb/probe.json'; d = json.load(open(p)); "
                f"d['servers']['{servers[OTHER]}']['expected'] = ' not what it said at launch'; "
                "json.dump(d, open(p, 'w'))")
        assert rack.ssh(LB, f"cp -p /var/lib/vllm-lb/probe.json /var/lib/vllm-lb/probe.json.saved && "
                            f"python3 -c \"{edit}\"").returncode == 0
        try:
            assert wedge.wait_for(lambda: wedge.marked_down(rack.handle, LB, servers[OTHER]),  # type: ignore[arg-type]
                                  BOUND_S) is not None, "a wrong answer did not take the head out"
        finally:
            assert rack.ssh(LB, "mv /var/lib/vllm-lb/probe.json.saved /var/lib/vllm-lb/probe.json").returncode == 0
        assert wedge.wait_for(lambda: not wedge.marked_down(rack.handle, LB, servers[OTHER]),  # type: ignore[arg-type]
                              BOUND_S) is not None

        # a wedged engine: /health stays 200, the balancer takes it out, new requests go to the other cluster
        with wedge.Client(lb_url, rack.api_key, BODY, threads=2, period=2.0, timeout=120) as client:
            time.sleep(4)
            w = wedge.wedge_cycle(rack.handle, WEDGED, LB, servers[WEDGED], bound=BOUND_S, hold=6,  # type: ignore[arg-type]
                                  health_url=f"http://{servers[WEDGED]}/health")
            time.sleep(4)
        assert w.pids, "no engine process found to wedge"
        assert w.health_while_wedged == 200, "the premise: vLLM's /health answers 200 while the engine is stopped"
        assert w.out_s is not None, f"the wedged head was not taken out within {BOUND_S} s"
        assert w.back_s is not None, f"the head did not come back within {BOUND_S} s of SIGCONT"
        out_at = w.stopped_at + w.out_s
        after = client.between(out_at + 1.0, w.resumed_at or out_at)  # +1 s: nginx's reload
        assert after, "no request started while the head was out"
        assert all(r.code == 200 and r.end - r.start < PROBE_TIMEOUT_S for r in after), after
        in_flight = client.in_flight(w.stopped_at)
        failed = [r for r in client.done if r.code != 200]
        assert all(r in in_flight for r in failed), (failed, in_flight)
        # busy or stuck: the check read the wedged engine's token counters on /metrics (vLLM's names on this
        # version: a missing counter would say "no token counters") and found them flat
        log = rack.ssh(LB, "journalctl -u vllm-lb-healthcheck.service -o cat --no-pager -n 300").stdout
        verdicts = [json.loads(ln) for ln in log.splitlines() if ln.startswith("{") and '"why"' in ln]
        stuck = [v["why"].get(servers[WEDGED], "") for v in verdicts if servers[WEDGED] in v["down"]]
        assert any("token counters flat" in why for why in stuck), (stuck[-5:], log[-2000:])
        busy = sum(len(v.get("busy", [])) for v in verdicts)
        print(f"wedge: out after {w.out_s:.1f} s, back {w.back_s:.1f} s after SIGCONT; {len(client.done)} requests, "
              f"{len(in_flight)} in flight at the wedge, {len(failed)} failed, {len(after)} started while out; "
              f"{len(verdicts)} check runs, {busy} busy verdicts")
    finally:
        wedge.signal_engine(rack.handle, WEDGED, "CONT")  # type: ignore[arg-type]
