"""The serving edge on the simulated rack: roles/serving_lb, run by real ansible-playbook over SSH, puts nginx on a
rack host in front of the two CPU vLLM clusters (`vllm_pp` head node01, `vllm_single` node03, both serving
`tiny-llama`, so one upstream with two heads). Completions and streams go through it with the API key, both clusters
take requests, the key is not logged, and with one cluster stopped every request still succeeds.

The balancer runs on node03 on port 8080 (vLLM owns 8000 there). As `site.yml` would, the heads' cluster firewall is
applied with node03 in group `lb` first (the API port admits only clients, members and balancers). Afterwards the
rack's own firewall is put back, and the stopped cluster is started again and waited for, so the tests after these
find the rack as it was (nginx stays installed on node03, on a port nothing else uses).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from provisioner import PROJECT_ROOT

from vllm_e2e import PROVISION, VllmRack, http  # noqa: E402  (tests/vllm's shared helpers)


pytestmark = pytest.mark.vllm

LB_HOST = "node03"
LB_PORT = 8080
MODEL = "tiny-llama"
STOP_CLUSTER = "vllm_single"  # its head is node03; nginx on node03 keeps running
HEALTH_BOUND_S = 900  # CPU vLLM start-up on a shared 2-core machine
BODY = {"model": MODEL, "prompt": "The quick brown fox", "max_tokens": 4, "temperature": 0}


@dataclass
class Edge:
    rack: VllmRack
    url: str
    play_output: str
    inventory: Path  # the rack's inventory with node03 in group lb


def e2e_count(rack: VllmRack, cluster: str) -> float:
    """Finished requests a head has counted (vllm:e2e_request_latency_seconds_count, all label sets)."""
    code, text = http(rack.url(cluster, "/metrics"), timeout=30)
    assert code == 200, text[:500]
    return sum(float(m.group(1)) for m in re.finditer(r"^vllm:e2e_request_latency_seconds_count\{[^}]*\} (\S+)$",
                                                       text, re.M))


def access_log(rack: VllmRack) -> str:
    r = rack.ssh(LB_HOST, "cat /var/log/nginx/vllm-lb-access.log")
    assert r.returncode == 0, r.stderr
    return r.stdout


FIREWALL_PLAY = """\
- name: Cluster firewall (the heads' API port admits the hosts in group lb)
  hosts: gpu_nodes
  gather_facts: true
  gather_subset: ["!all", "min"]
  become: true
  roles:
    - role: cluster_firewall
"""


def playbook(inventory: Path, play: Path, *args: str) -> subprocess.CompletedProcess[str]:
    bin_dir = Path(sys.executable).parent
    env = dict(os.environ, ANSIBLE_CONFIG=str(PROJECT_ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_ROLES_PATH=str(PROJECT_ROOT / "roles"), PATH=f"{bin_dir}:{os.environ.get('PATH', '')}")
    return subprocess.run([str(bin_dir / "ansible-playbook"), "-i", str(inventory), str(play), *args],
                          cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=1800)


@pytest.fixture(scope="module")
def edge(vllm_rack: VllmRack, tmp_path_factory) -> Iterator[Edge]:
    for cluster in vllm_rack.heads:
        if vllm_rack.wait_healthy(cluster, HEALTH_BOUND_S) is None:
            pytest.fail(f"cluster {cluster} is not healthy before the balancer test")
    work = tmp_path_factory.mktemp("edge")
    # the rack's inventory (hosts.ini + group_vars/) with node03 also in group `lb`
    inv_dir = work / "inventory"
    shutil.copytree(Path(vllm_rack.inventory).parent, inv_dir)
    hosts = inv_dir / Path(vllm_rack.inventory).name
    hosts.write_text(hosts.read_text() + f"\n[lb]\n{LB_HOST}\n\n[lb:vars]\nserving_lb_listen_port={LB_PORT}\n")
    firewall = work / "firewall.yml"
    firewall.write_text(FIREWALL_PLAY)
    # As site.yml does (fabric.yml before serving.yml): the heads' cluster firewall lets the balancer in, then nginx.
    p = playbook(hosts, firewall)
    assert p.returncode == 0, (p.stdout + p.stderr)[-5000:]
    try:
        p = playbook(hosts, PROJECT_ROOT / "playbooks" / "serving.yml", "--tags", "serving")
        assert p.returncode == 0, (p.stdout + p.stderr)[-5000:]
        from provisioner.inventory import load_fleet

        address = load_fleet(hosts).hosts[LB_HOST].address
        yield Edge(vllm_rack, f"http://{address}:{LB_PORT}", p.stdout, hosts)
    finally:
        # the rack's own firewall back (the tests after this one expect a second `provision run` to change nothing)
        r = playbook(Path(vllm_rack.inventory), firewall)
        assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]


def test_balancer_proxies_completions_with_the_api_key(edge: Edge) -> None:
    code, text = http(edge.url + "/v1/completions", data=BODY, key=edge.rack.api_key, timeout=300)
    assert code == 200, text
    out = json.loads(text)
    assert out["model"] == MODEL and out["choices"][0]["text"] and out["usage"]["completion_tokens"] == 4
    # the key reaches vLLM (which enforces it): without it, vLLM's 401 comes back through the balancer
    assert http(edge.url + "/v1/completions", data=BODY, timeout=120)[0] == 401
    # the balancer answers /v1/models itself and routes an unknown model to nothing
    code, text = http(edge.url + "/v1/models", timeout=30)
    assert code == 200 and [m["id"] for m in json.loads(text)["data"]] == [MODEL]
    code, text = http(edge.url + "/v1/completions", data={**BODY, "model": "nope"}, key=edge.rack.api_key)
    assert code == 404 and json.loads(text)["error"]["param"] == "model"


def test_both_clusters_take_requests(edge: Edge) -> None:
    rack = edge.rack
    before = {c: e2e_count(rack, c) for c in rack.heads}
    for _ in range(6):
        code, text = http(edge.url + "/v1/completions", data=BODY, key=rack.api_key, timeout=300)
        assert code == 200, text
    after = {c: e2e_count(rack, c) for c in rack.heads}
    served = {c: after[c] - before[c] for c in rack.heads}
    assert sum(served.values()) == 6 and all(n > 0 for n in served.values()), served


def test_stream_through_the_balancer(edge: Edge) -> None:
    req = urllib.request.Request(edge.url + "/v1/completions", method="POST",
                                 data=json.dumps({**BODY, "stream": True, "max_tokens": 6}).encode(),
                                 headers={"Content-Type": "application/json",
                                          "Authorization": f"Bearer {edge.rack.api_key}"})
    events = []
    with urllib.request.urlopen(req, timeout=300) as r:  # noqa: S310 - our own test host
        assert r.headers["Content-Type"].startswith("text/event-stream")
        for line in r:
            if line.startswith(b"data:"):
                events.append(line.strip())
    assert events[-1] == b"data: [DONE]"
    tokens = [json.loads(e[5:]) for e in events[:-1]]
    assert len(tokens) >= 6 and all(t["choices"][0]["text"] is not None for t in tokens)


def test_api_key_not_in_the_access_log(edge: Edge) -> None:
    log = access_log(edge.rack)
    heads = {f"{a}:{edge.rack.ports[c]}" for c, a in edge.rack.heads.items()}
    assert "POST /v1/completions" in log
    assert all(f"upstream={h}" in log for h in heads), log[-2000:]
    assert edge.rack.api_key not in log and "Bearer" not in log


def test_keeps_serving_when_one_cluster_is_stopped(edge: Edge) -> None:
    rack = edge.rack
    stopped_head = rack.heads[STOP_CLUSTER]
    r = rack.ssh(LB_HOST, "systemctl stop vllm.service")
    assert r.returncode == 0, r.stderr
    try:
        assert http(rack.url(STOP_CLUSTER, "/health"), timeout=10)[0] != 200
        results = [http(edge.url + "/v1/completions", data=BODY, key=rack.api_key, timeout=300) for _ in range(6)]
        assert [c for c, _ in results] == [200] * 6, results
        tail = access_log(rack).splitlines()[-6:]
        assert all(" 200 " in ln for ln in tail), tail
        # every request was answered by the other cluster: $upstream_addr lists the heads tried in order
        # ("STOPPED:8000, OTHER:8000" while passive health still counts failures), the last one answered
        answered = [re.search(r" upstream=(.*?) ustatus=", ln).group(1).split(", ")[-1] for ln in tail]  # type: ignore[union-attr]
        assert all(a.startswith(rack.heads["vllm_pp"] + ":") for a in answered), tail
        assert not any(a.startswith(stopped_head + ":") for a in answered), tail
    finally:
        rack.ssh(LB_HOST, "systemctl start vllm.service")
        healthy = rack.wait_healthy(STOP_CLUSTER, HEALTH_BOUND_S)
    assert healthy is not None, f"{STOP_CLUSTER} did not come back within {HEALTH_BOUND_S} s"


class ClientLoop:
    """Completions to the balancer, one after another from `threads` threads, until stopped: every status kept."""

    def __init__(self, url: str, key: str, threads: int = 2) -> None:
        self.url, self.key, self.codes = url, key, []  # type: ignore[var-annotated]
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(threads)]

    def _loop(self) -> None:
        while not self._stop.is_set():
            code, text = http(self.url + "/v1/completions", data=BODY, key=self.key, timeout=300)
            self.codes.append(code)
            if code != 200:
                self.failures.append(f"{code}: {text[:200]}")

    def __enter__(self) -> ClientLoop:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=320)


def provision(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROVISION, *args], capture_output=True, text=True, timeout=timeout, cwd=PROJECT_ROOT)


def lb_conf(rack: VllmRack) -> str:
    r = rack.ssh(LB_HOST, "cat /etc/nginx/conf.d/vllm-lb.conf")
    assert r.returncode == 0, r.stderr
    return r.stdout


def lifecycle_state(host: str) -> str:
    from provisioner.ledger import Ledger
    from provisioner.paths import ledger_path

    with Ledger.open(ledger_path()) as ledger:
        return str(ledger.state(host)[0])


def test_drain_and_return_a_cluster_with_no_failed_request(edge: Edge) -> None:
    """`provision drain` takes vllm_single out (balancer first, in flight, stop, mark) while a client loop runs
    against the balancer; draining vllm_pp then is refused (the last cluster serving tiny-llama); `provision return`
    gates, marks, launches and puts it back. Not one client request fails."""
    from provisioner.probes.health import IN_SERVICE

    rack, inv = edge.rack, str(edge.inventory)
    server = f"{rack.heads[STOP_CLUSTER]}:{rack.ports[STOP_CLUSTER]}"
    pp_hosts = ("node01", "node02")
    with ClientLoop(edge.url, rack.api_key) as loop:
        time.sleep(5)
        t0 = time.monotonic()
        d = provision("drain", inv, STOP_CLUSTER, "--reason", "rack test: drain")
        drain_s = time.monotonic() - t0
        assert d.returncode == 0, d.stdout + d.stderr
        assert "balancer (node03)" in d.stdout and "in flight:" in d.stdout, d.stdout
        conf = lb_conf(rack)
        assert re.search(rf"server {re.escape(server)}\b[^;]* down;", conf), conf
        assert rack.ssh(LB_HOST, "systemctl is-active vllm.service").stdout.strip() != "active"
        assert rack.ssh(LB_HOST, f"test -e {IN_SERVICE}").returncode == 1
        assert lifecycle_state(LB_HOST) == "maintenance"
        sent_drained = len(loop.codes)
        time.sleep(10)  # the loop keeps going through the other cluster alone
        assert len(loop.codes) > sent_drained, "the client loop stalled with one cluster drained"

        # the other cluster is now the last one serving the model: refused, nothing changed
        r = provision("drain", inv, "node02", "--reason", "rack test: must be refused")
        assert r.returncode == 1 and "refused" in r.stderr and "last" in r.stderr, r.stdout + r.stderr
        assert all(lifecycle_state(h) == "in-service" for h in pp_hosts)
        assert all(rack.ssh(h, f"test -e {IN_SERVICE}").returncode == 0 for h in pp_hosts)

        t1 = time.monotonic()
        b = provision("return", inv, STOP_CLUSTER, "--reason", "rack test: return")
        return_s = time.monotonic() - t1
        assert b.returncode == 0, b.stdout + b.stderr
        assert "health gate: pass" in b.stdout and "back into the balancer" in b.stdout, b.stdout
        time.sleep(10)  # requests reach the returned cluster again
    assert not re.search(rf"server {re.escape(server)}\b[^;]* down;", lb_conf(rack))
    assert rack.ssh(LB_HOST, f"test -e {IN_SERVICE}").returncode == 0
    assert lifecycle_state(LB_HOST) == "in-service"
    from provisioner.ledger import Ledger
    from provisioner.paths import ledger_path

    with Ledger.open(ledger_path()) as ledger:
        path = [(t.from_state, t.to_state) for t in ledger.transitions(LB_HOST)][-4:]
    assert path == [("in-service", "draining"), ("draining", "maintenance"), ("maintenance", "burn-in"),
                    ("burn-in", "in-service")], path
    figures = {"drain_s": round(drain_s, 1), "return_s": round(return_s, 1), "requests_sent": len(loop.codes),
               "requests_failed": len(loop.failures)}
    (PROJECT_ROOT / ".runs").mkdir(exist_ok=True)
    (PROJECT_ROOT / ".runs" / "lifecycle-drain-figures.json").write_text(json.dumps(figures, indent=2) + "\n")
    print(f"drain/return figures: {json.dumps(figures)}")
    assert loop.failures == [], loop.failures[:5]
    assert e2e_count(rack, STOP_CLUSTER) > 0
