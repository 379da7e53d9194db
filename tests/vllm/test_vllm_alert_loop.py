"""The alert loop on the vLLM rack (issue 44 sections 2 and 3), no command typed: a fatal hardware signal on a
serving node drains its cluster, a bad push (the same fatal XID on every node) opens the circuit breaker before the
last cluster goes, and once the faults clear the loop brings the cluster back.

The session rack has it all from the start (its `make demo-vllm` installs it: lb01 is the rack's `monitoring` host
with Prometheus + Alertmanager routed to the controller's receiver, the GPU nodes run the fault watch); this module
only starts `provision receiver serve` on the controller (the rack bridge's address, port 9095) with a copy of the
rack's inventory that adds an opt-in lifecycle_policy and the rails' window (`remediation_rails`, see RAILS), and a
client loop through the balancer that runs throughout (requests sent / failed per phase). In order:

1. at once: a bouncing IB port on node03 acts on nothing (ProvisionNodeIbPortDown holds 15 s); a fatal XID 79 on
   node01 (vllm_pp's head): Prometheus -> Alertmanager -> the receiver -> `provision health` + `provision remediate`:
   node01 quarantined, vllm_pp out of the balancer and stopped, vllm_single serving, not one client request failed;
2. the bad push: XID 79 on node01, node02 and node03 within a few seconds: node03's quarantine (it would take the
   model's last cluster) opens the breaker instead (2 of 3 nodes within the window, breaker_share 0.25); the ledger
   (breaker_events) and the status page say so; vllm_single serves on;
3. the faults cleared: the resolve of node01's alert makes the receiver run health + remediate again, whose policy
   returns node01 (vllm_pp relaunched, back into the balancer, the incident's returned_at set); then the operator
   closes the breaker (`provision remediate --close-breaker`).

The rails and the later tests of the lane: node01 is the one node taken out (cool-down per node: test_vllm_balancer.py
takes node02 out later); closing the breaker restarts its window; 1 automated take-out of actions_per_hour 3.
What it adds to the lane (2026-12-07): 206 s at load 2-3.6 (124 s of it the return, mostly vllm_pp's relaunch); 385
s at load 7 before the flap ran alongside the XID; the setup's share is in benchmarks/README.md. Figures:
.runs/alert-loop-figures.json (benchmarks/README.md, "The alert loop")."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from vllm_e2e import LB_HOST, PROVISION, VllmRack, http

from provisioner import PROJECT_ROOT

pytestmark = pytest.mark.vllm

NODE = "node01"  # vllm_pp's head
MEMBER = "node02"  # vllm_pp's other member
SINGLE = "node03"  # vllm_single's one member: the model's last cluster while vllm_pp is out
CLUSTER = "vllm_pp"
DEADLINE_S = 180  # generous: the goal is 60 s (figures in .runs/alert-loop-figures.json)
HEALTH_BOUND_S = 900
RETURN_BOUND_S = 1200  # the alert's resolve, health, the relaunch of vllm_pp on CPU, back into the balancer
POLICY = {"quarantine_on": ["ecc", "xid", "nvlink", "ib", "fabricmanager"], "remediation": ["gpu_reset"],
          "replace_after": {"quarantines": 9, "window_days": 30}}
#: the rack's rails (mode act, the defaults) with a window that surely holds phase 1's take-out when the bad push
#: comes (the receiver acts one alert at a time: node01's gpu_reset and gate run before node03's alert)
RAILS = {"mode": "act", "breaker_window_s": 900}
FIGURES = PROJECT_ROOT / ".runs" / "alert-loop-figures.json"
BODY = {"model": "tiny-llama", "prompt": "The quick brown fox", "max_tokens": 4, "temperature": 0}


def provision(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROVISION, *args], capture_output=True, text=True, timeout=timeout, cwd=PROJECT_ROOT)


def _ledger(site: str):  # type: ignore[no-untyped-def]
    from provisioner.ledger import Ledger
    from provisioner.paths import ledger_path

    return Ledger.open(ledger_path(), site=site)


def _state(site: str, host: str) -> str:
    with _ledger(site) as lg:
        return str(lg.state(host)[0])


def _metrics(url: str) -> dict[str, float]:
    code, text = http(url + "/metrics", timeout=10)
    assert code == 200, text
    return {k: float(v) for k, v in (ln.rsplit(" ", 1) for ln in text.splitlines() if ln and ln[0] != "#")}


def _prom(address: str, query: str) -> list[dict]:
    code, text = http(f"http://{address}:9090/api/v1/query?query={urllib.parse.quote(query)}", timeout=10)
    return json.loads(text)["data"]["result"] if code == 200 else []


def _wait(cond: Callable[[], bool], timeout: float, step: float = 1.0) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if cond():
            return time.monotonic() - t0
        time.sleep(step)
    return None


class Client:
    """One paced client through the balancer (a request every `period` s: the CPU clusters share 2 cores), every
    status kept with its phase."""

    def __init__(self, url: str, key: str, period: float = 4.0) -> None:
        self.url, self.key, self.period, self.phase = url, key, period, "before"
        self.codes: list[tuple[str, int]] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            phase = self.phase
            code, _ = http(self.url + "/v1/completions", data=BODY, key=self.key, timeout=300)
            self.codes.append((phase, code))
            self._stop.wait(max(0.0, self.period - (time.monotonic() - t0)))

    def counts(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for phase, code in list(self.codes):
            c = out.setdefault(phase, {"sent": 0, "failed": 0})
            c["sent"] += 1
            c["failed"] += code != 200
        return out

    def start(self) -> None:
        self._t.start()

    def stop(self) -> None:
        self._stop.set()
        self._t.join(timeout=320)


@dataclass
class Loop:
    rack: VllmRack
    name: str
    inv: Path
    site: str
    lb_addr: str
    url: str  # the receiver
    log: Path
    client: Client
    hca: str  # node03's first HCA of NCCL_IB_HCA (the flapping port)
    figures: dict[str, object] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)  # a phase that failed: the later ones skip

    def text(self) -> str:
        return self.log.read_text()

    def out_of_balancer(self, cluster: str) -> bool:
        return cluster in self.rack.out_of_balancer()

    def actions(self) -> float:
        return sum(v for k, v in _metrics(self.url).items() if k.startswith("provisioner_receiver_actions_total"))

    def need(self, phase: str) -> None:
        if self.failed:
            pytest.skip(f"an earlier phase failed: {self.failed[0]}")


@pytest.fixture(scope="module")
def loop(vllm_rack: VllmRack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loop]:
    from provisioner.inventory import load_fleet
    from provisioner.ledger.site import site_of
    from provisioner_testbed import rack as testbed

    rack = vllm_rack
    name = rack.handle.name  # type: ignore[attr-defined]
    for c in rack.heads:
        assert rack.wait_healthy(c, HEALTH_BOUND_S) is not None, f"{c} not serving before the test"
    tmp = tmp_path_factory.mktemp("alert-loop")
    inv_dir = tmp / "inventory"
    shutil.copytree(Path(rack.inventory).parent, inv_dir)
    inv = inv_dir / Path(rack.inventory).name
    all_yml = inv_dir / "group_vars" / "all.yml"
    text = all_yml.read_text()
    assert "remediation_rails:\n  mode: act\n" in text, text  # the rack's rails (inventory_writer.py)
    all_yml.write_text(text.replace("remediation_rails:\n  mode: act\n",
                                    yaml.safe_dump({"remediation_rails": RAILS}, default_flow_style=False)))
    with (inv_dir / "group_vars" / "gpu_nodes.yml").open("a") as f:
        f.write(yaml.safe_dump({"lifecycle_policy": POLICY}))
    fleet = load_fleet(inv)
    assert LB_HOST in fleet.groups.get("monitoring", ()), "the rack has no monitoring host: an old `testbed up`?"
    lb_addr = fleet.hosts[LB_HOST].address
    # where the rack's Alertmanager sends: the controller's address on the rack bridge
    target = urllib.parse.urlsplit(str(fleet.hosts[LB_HOST].vars["alertmanager_receiver_url"]))
    gw, port = str(target.hostname), int(target.port or 80)
    log = tmp / "receiver.log"
    url = f"http://{gw}:{port}"
    with log.open("ab") as out:
        rx = subprocess.Popen([PROVISION, "receiver", "serve", str(inv), "--listen", f"{gw}:{port}",
                               "--state", str(tmp / "rx.sqlite3")], stdout=out, stderr=subprocess.STDOUT,
                              cwd=PROJECT_ROOT)
    client = Client(f"http://{lb_addr}:8000", rack.api_key)
    lp = Loop(rack, name, inv, site_of(fleet), lb_addr, url, log, client, str(fleet.hosts[SINGLE].get("ib_hcas")[0]))
    t0 = time.monotonic()
    try:
        assert _wait(lambda: http(url + "/healthz", timeout=3)[0] == 200, 60), log.read_text()
        # every node's five signals scraped, all 0 (the rack's Prometheus, installed by the session's setup)
        assert _wait(lambda: len([s for s in _prom(lb_addr, 'provisioner_node_fault{job="node_signals"}')
                                  if s["value"][1] == "0"]) == 15, 180, 3), _prom(lb_addr, "up")
        lp.figures["ready_s"] = round(time.monotonic() - t0, 1)
        client.start()
        yield lp
    finally:
        client.stop()
        lp.figures["client"] = client.counts()
        lp.figures["receiver_log"] = [ln for ln in log.read_text().splitlines() if " alert " in ln or " action " in ln]
        FIGURES.parent.mkdir(exist_ok=True)
        FIGURES.write_text(json.dumps(lp.figures, indent=2) + "\n")
        print(f"alert loop figures: {json.dumps({k: v for k, v in lp.figures.items() if k != 'receiver_log'})}")
        for h in (NODE, MEMBER, SINGLE):
            testbed.clear(name, h)
        # the later tests find the rack as the fixture left it: vllm_pp serving, the breaker closed
        if any(_state(lp.site, h) != "in-service" for h in (NODE, MEMBER)):
            _wait(lambda: rx.poll() is not None or _state(lp.site, NODE) == "in-service", 600, 5)
        rx.terminate()
        rx.wait(30)
        if _state(lp.site, NODE) != "in-service":
            provision("health", str(inv))
            provision("remediate", str(inv), timeout=2400)
        if any(_state(lp.site, h) != "in-service" for h in (NODE, MEMBER)):
            provision("return", str(inv), CLUSTER, "--reason", "rack test cleanup", timeout=2400)
        with _ledger(lp.site) as lg:
            still_open = lg.breaker()[0] is not None
        if still_open:
            provision("remediate", str(inv), "--close-breaker", "--reason", "rack test cleanup")


def test_a_fatal_xid_drains_its_cluster_with_no_command(loop: Loop) -> None:
    from provisioner_testbed import rack as testbed

    lp, fig = loop, loop.figures
    try:
        # --- at once: a bouncing IB port on node03 (never 15 s down: no alert, no action) and a fatal XID on
        # node01, live: quarantined and drained with no command ----------------------------------------------------
        def flap() -> None:
            for _ in range(3):
                testbed.fault(lp.name, SINGLE, [f"hca_down={lp.hca}"])
                time.sleep(6)
                testbed.clear(lp.name, SINGLE)
                time.sleep(8)

        flapper = threading.Thread(target=flap, daemon=True)
        lp.client.phase = "xid"
        t0 = time.monotonic()
        flapper.start()
        testbed.fault(lp.name, NODE, ["xid=79"])
        marks: dict[str, float] = {}

        def progressed() -> bool:
            if "alert" not in marks and "queued: health + remediate" in lp.text():
                marks["alert"] = time.monotonic() - t0
            if "quarantined" not in marks and _state(lp.site, NODE) == "quarantined":
                marks["quarantined"] = time.monotonic() - t0
            if "out_of_balancer" not in marks and lp.out_of_balancer(CLUSTER):
                marks["out_of_balancer"] = time.monotonic() - t0
            return len(marks) == 3 and http(lp.rack.url(CLUSTER, "/health"), timeout=3)[0] != 200

        done = _wait(progressed, DEADLINE_S)
        fig.update({k: round(v, 1) for k, v in marks.items()})
        fig["drained_s"] = None if done is None else round(time.monotonic() - t0, 1)  # vllm_pp stopped too
        assert done is not None, (marks, lp.text()[-3000:])
        assert _state(lp.site, MEMBER) == "maintenance" and _state(lp.site, SINGLE) == "in-service"
        # the action ends after the gpu_reset and the gate that still fails: one action, no other node touched
        assert _wait(lambda: lp.actions() == 1, 300, 2), lp.text()[-2000:]
        fig["action_done_s"] = round(time.monotonic() - t0, 1)
        assert _state(lp.site, NODE) == "quarantined"
        assert not lp.out_of_balancer("vllm_single")
        flapper.join(60)
        time.sleep(5)  # the last scrape after the port came back
        seen = _prom(lp.lb_addr, f'max_over_time(provisioner_node_fault{{job="node_signals",host="{SINGLE}",'
                                 f'signal="ib"}}[2m])')
        fig["flap_seen_by_prometheus"] = bool(seen and seen[0]["value"][1] == "1")
        assert fig["flap_seen_by_prometheus"], seen  # the port really went down where Prometheus looks
        assert _metrics(lp.url)['provisioner_receiver_alerts_total{outcome="act"}'] == 1, lp.text()  # node01's
        assert f"host={SINGLE} status=firing" not in lp.text() and _state(lp.site, SINGLE) == "in-service"
        counts = lp.client.counts()
        assert all(c["failed"] == 0 for c in counts.values()), counts  # vllm_single served throughout
    except BaseException:
        lp.failed.append("phase 1 (fatal XID)")
        raise


def test_a_bad_push_opens_the_breaker_before_the_last_cluster_goes(loop: Loop) -> None:
    from provisioner_testbed import rack as testbed

    lp, fig = loop, loop.figures
    lp.need("bad push")
    try:
        lp.client.phase = "bad_push"
        acted = lp.actions()
        t0 = time.monotonic()
        for h in (NODE, MEMBER, SINGLE):  # the same fatal XID everywhere within a few seconds
            testbed.fault(lp.name, h, ["xid=79"])

        def opened() -> bool:
            with _ledger(lp.site) as lg:
                return lg.breaker()[0] is not None

        assert _wait(opened, DEADLINE_S, 2) is not None, lp.text()[-3000:]
        fig["bad_push_breaker_open_s"] = round(time.monotonic() - t0, 1)
        # node02's and node03's alerts both acted on (node01's is still the one of phase 1: a duplicate)
        assert _wait(lambda: lp.actions() >= acted + 2, 300, 2), lp.text()[-3000:]
        with _ledger(lp.site) as lg:
            ev = lg.breaker()[0]
            blocked = [a for a in lg.actions(host=SINGLE, limit=10) if a.status == "blocked"]
        assert ev is not None and "2 of 3 nodes" in ev.why, ev
        assert blocked and blocked[-1].rail == "breaker", blocked
        assert _state(lp.site, SINGLE) == "in-service" and not lp.out_of_balancer("vllm_single")
        assert http(lp.rack.url("vllm_single", "/health"), timeout=10)[0] == 200
        page = lp.inv.parent / "status.html"
        st = provision("status", str(lp.inv), "--html", str(page))
        assert st.returncode == 0 and "remediation breaker: OPEN since" in st.stdout, st.stdout + st.stderr
        html = page.read_text()
        assert 'id="breaker"' in html and "OPEN" in html, html[:2000]

        def paged() -> bool:  # Prometheus scrapes the receiver's /metrics (the ledger's breaker): the alert fires
            return any(s["metric"].get("alertname") == "ProvisionRemediationBreakerOpen"
                       for s in _prom(lp.lb_addr, 'ALERTS{alertstate="firing"}'))

        assert _wait(paged, 180, 3) is not None, _prom(lp.lb_addr, 'up{job="provision_receiver"}')
        sent = len(lp.client.codes)
        assert _wait(lambda: len(lp.client.codes) > sent, 60), "the client loop stalled"
        counts = lp.client.counts()
        fig["bad_push_client"] = counts.get("bad_push")
        assert all(c["failed"] == 0 for c in counts.values()), counts
    except BaseException:
        lp.failed.append("phase 2 (bad push)")
        raise


def test_cleared_the_loop_returns_the_cluster_and_the_operator_closes_the_breaker(loop: Loop) -> None:
    from provisioner_testbed import rack as testbed

    lp, fig = loop, loop.figures
    lp.need("return")
    lp.client.phase = "return"
    for h in (NODE, MEMBER, SINGLE):
        testbed.clear(lp.name, h)
    back = _wait(lambda: _state(lp.site, NODE) == "in-service" and _state(lp.site, MEMBER) == "in-service"
                 and not lp.out_of_balancer(CLUSTER), RETURN_BOUND_S, 5)
    fig["cleared_to_returned_s"] = None if back is None else round(back, 1)
    assert back is not None, lp.text()[-3000:]
    assert "ProvisionNodeXidFatal host=node01 status=resolved: queued: health + remediate (the return)" in lp.text()
    code, text = http(lp.rack.url(CLUSTER, "/v1/completions"), data=BODY, key=lp.rack.api_key, timeout=120)
    assert code == 200, text[:300]
    with _ledger(lp.site) as lg:
        inc = [i for i in lg.incidents(host=NODE) if i.source == "alert"][-1]
        took = [a for a in lg.actions(since=time.time() - 3 * 3600, limit=1000)
                if a.kind in ("quarantine", "replace", "restart_cluster") and a.status in ("done", "failed")]
    assert inc.status == "returned" and inc.returned is not None and inc.drained is not None, inc
    fig["incident"] = {"detect_s": round(inc.detected - inc.signal, 1), "drain_s": round(inc.drained - inc.detected, 1),
                       "return_s": round(inc.returned - inc.detected, 1)}
    assert [a.host for a in took if a.at >= inc.detected - 1] == [NODE], took  # the one take-out of this module

    r = provision("remediate", str(lp.inv), "--close-breaker", "--reason", "bad push rolled back")
    assert r.returncode == 0 and "breaker closed" in r.stdout, r.stdout + r.stderr
    with _ledger(lp.site) as lg:
        assert lg.breaker()[0] is None
        assert [e.state for e in lg.breaker_events(limit=2)] == ["open", "closed"]
    counts = lp.client.counts()
    fig["return_client"] = counts.get("return")
    assert all(c["failed"] == 0 for c in counts.values()), counts
