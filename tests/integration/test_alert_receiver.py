"""`provision receiver serve` as a real process behind a real Alertmanager (Debian's prometheus-alertmanager, the
config rendered from templates/alertmanager.yml.j2 and checked by amtool), no rack: the GPU nodes sit at a closed
port of 127.0.0.1, so the receiver's `provision health --limit NODE` finds the node unreachable and records that in
the ledger, and `provision remediate --limit NODE` runs on it. Proven: the bearer token (vaulted in the inventory,
a file for Alertmanager) is required, Alertmanager's real webhook payload is read, one firing alert runs health +
remediate for its node exactly once (Alertmanager's resends, a resolve, a receiver restart and a replayed body do
nothing more), other alerts and unknown hosts do nothing, /metrics counts it all, nothing echoes the token.
Not proven here: the drain itself (tests/vllm/test_vllm_alert_loop.py on the vLLM rack)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner import PROJECT_ROOT

TOKEN = "rx-token-0123456789abcdef"
AMTOOL = shutil.which("amtool")
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
needs_alertmanager = pytest.mark.skipif(ALERTMANAGER is None and not os.environ.get("CI"),
                                        reason="needs prometheus-alertmanager (apt-get install prometheus-alertmanager)")
INI = """\
[gpu_nodes]
n1 ansible_host=127.0.0.1 ansible_port=1
n2 ansible_host=127.0.0.1 ansible_port=1

[c1]
n1 node_rank=0
n2 node_rank=1
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _http(url: str, body: Any = None, token: str | None = None, raw: bytes | None = None) -> tuple[int, str]:
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    req.add_header("Content-Type", "application/json")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _metrics(url: str) -> dict[str, float]:
    text = _http(url + "/metrics")[1]
    return {k: float(v) for k, v in (ln.rsplit(" ", 1) for ln in text.splitlines() if ln and ln[0] != "#")}


def _wait(cond: Any, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


class Rx:
    def __init__(self, tmp: Path, inv: Path, pw: Path) -> None:
        self.tmp, self.inv, self.pw = tmp, inv, pw
        self.port = _port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / "receiver.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_VAULT")}
        env.update(PROVISION_LEDGER=str(self.tmp / "ledger.sqlite3"), PROVISION_RUNS_DIR=str(self.tmp / "runs"),
                   ANSIBLE_VAULT_PASSWORD_FILE=str(self.pw), PYTHONPATH=str(PROJECT_ROOT))
        with self.log.open("ab") as f:
            self.proc = subprocess.Popen(
                [str(Path(sys.executable).parent / "provision"), "receiver", "serve", str(self.inv), "--listen",
                 f"127.0.0.1:{self.port}", "--state", str(self.tmp / "rx.sqlite3"), "--timeout", "120"],
                stdout=f, stderr=subprocess.STDOUT, env=env, cwd=PROJECT_ROOT)
        _wait(lambda: self._up(), 60, "the receiver to listen")

    def _up(self) -> bool:
        assert self.proc is not None and self.proc.poll() is None, self.log.read_text()
        try:
            return _http(self.url + "/healthz")[0] == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture()
def rx(tmp_path: Path) -> Iterator[Rx]:
    from ansible.parsing.vault import VaultLib, VaultSecret

    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.ini").write_text(INI)
    cipher = VaultLib([("default", VaultSecret(b"rx-vault-pw"))]).encrypt(TOKEN).decode()
    (inv / "group_vars" / "all.yml").write_text(
        "alert_receiver_token: !vault |\n" + "".join(f"  {ln}\n" for ln in cipher.splitlines()))
    (inv / "group_vars" / "gpu_nodes.yml").write_text(yaml.safe_dump({
        "gpu_model": "H100-SXM5-80GB", "gpu_count": 8, "fabric": "ethernet", "bootstrap_interface": "eth0",
        "ansible_ssh_common_args": "-o ConnectTimeout=3"}))
    (inv / "group_vars" / "c1.yml").write_text(yaml.safe_dump({"vllm_cluster": {
        "model": "/models/Qwen2-72B", "model_arch": "Qwen2-72B", "tensor_parallel_size": 8,
        "pipeline_parallel_size": 2, "max_model_len": 4096, "max_num_seqs": 64}}))
    pw = tmp_path / "vault-pass"
    pw.write_text("rx-vault-pw\n")
    r = Rx(tmp_path, inv / "hosts.ini", pw)
    r.start()
    yield r
    r.stop()
    assert TOKEN not in r.log.read_text()


def _health_runs(tmp: Path) -> list[list[str]]:
    """The hosts of every `provision health` run in the receiver's ledger, oldest first."""
    from provisioner.ledger import Ledger
    from provisioner.ledger.site import path_site

    db = tmp / "ledger.sqlite3"
    if not db.exists():
        return []
    with Ledger.open(db, site=path_site(tmp / "inv" / "hosts.ini")) as lg:
        runs = [r for r in lg.runs(limit=50) if r.command == "health"]
        return [sorted(lg.host_outcomes(r.id)) for r in reversed(runs)]


def _alert(status: str, host: str, **labels: str) -> dict[str, Any]:
    return {"status": status, "labels": {"alertname": "ProvisionNodeXidFatal", "host": host, **labels},
            "annotations": {}, "startsAt": "2026-12-07T08:00:00.000Z", "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "", "fingerprint": "fp" + "".join(c for c in host if c.isalnum())}


def _body(*alerts: dict[str, Any]) -> dict[str, Any]:
    return {"version": "4", "status": "firing", "receiver": "provisioner", "groupKey": "{}", "truncatedAlerts": 0,
            "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {}, "externalURL": "", "alerts": list(alerts)}


def test_the_token_is_required_and_bad_bodies_are_refused(rx: Rx) -> None:
    body = _body(_alert("firing", "n1", remediate="true"))
    assert _http(rx.url + "/alerts", body)[0] == 401
    assert _http(rx.url + "/alerts", body, token="wrong-token-0123456789")[0] == 401
    assert _http(rx.url + "/alerts", raw=b"{not json", token=TOKEN)[0] == 400
    code, text = _http(rx.url + "/alerts", {"version": "3", "alerts": []}, token=TOKEN)
    assert code == 400 and "version 4" in text
    m = _metrics(rx.url)
    assert m['provisioner_receiver_requests_total{result="unauthorized"}'] == 2
    assert m['provisioner_receiver_requests_total{result="bad request"}'] == 2
    assert m['provisioner_receiver_actions_total{result="ok"}'] + m[
        'provisioner_receiver_actions_total{result="failed"}'] == 0 and _health_runs(rx.tmp) == []


def test_metrics_carry_the_sites_breaker_and_incidents_from_the_ledger(rx: Rx) -> None:
    """/metrics also serves the site's day-2 state read from the ledger (what Prometheus's provision_receiver job
    scrapes and the breaker alert reads): closed, then open once the ledger records the breaker opening."""
    from provisioner.ledger import Ledger
    from provisioner.ledger.site import path_site

    site = path_site(rx.tmp / "inv" / "hosts.ini")
    label = f'{{site="{site}"}}'
    m = _metrics(rx.url)
    assert m["provisioner_receiver_ledger_readable"] == 1, m
    assert m["provisioner_remediation_breaker_open" + label] == 0 and m["provisioner_incidents_open" + label] == 0
    assert m["provisioner_incident_detect_seconds_count" + label] == 0  # the incidents' histograms
    with Ledger.open(rx.tmp / "ledger.sqlite3", site=site) as lg:
        lg.breaker_event("open", "3 of 4 nodes would be taken out within 300 s", actor="test")
    _wait(lambda: _metrics(rx.url)["provisioner_remediation_breaker_open" + label] == 1, 30,
          "the open breaker on /metrics (kept 5 s)")


def test_what_does_not_act(rx: Rx) -> None:
    """A resolved alert the receiver never acted on, an alert without remediate="true", a host not in the inventory:
    no action at all."""
    body = _body(_alert("resolved", "n1", remediate="true"), _alert("firing", "n2"),
                 _alert("firing", "lb9", remediate="true"), _alert("firing", "n1;rm", remediate="true"))
    assert _http(rx.url + "/alerts", body, token=TOKEN) == (200, '{"queued": 0}')
    m = _metrics(rx.url)
    assert (m['provisioner_receiver_alerts_total{outcome="resolved"}'],
            m['provisioner_receiver_alerts_total{outcome="not an acting alert"}'],
            m['provisioner_receiver_alerts_total{outcome="unknown host"}']) == (1, 1, 2)
    time.sleep(1)
    assert _health_runs(rx.tmp) == []
    log = rx.log.read_text()
    assert "host=n1 status=resolved: no action (resolved)" in log and "host=lb9 status=firing: no action (unknown host)" in log


@needs_alertmanager
def test_alertmanager_webhook_acts_once_per_alert(rx: Rx, tmp_path: Path) -> None:
    from provisioner.inventory import load_fleet
    from provisioner.monitoring import render_template, template_context

    am_port = _port()
    conf = tmp_path / "am"
    conf.mkdir()
    (conf / "alert-receiver.token").write_text(TOKEN)
    ctx = template_context(load_fleet(rx.inv), roles=("alertmanager",), overrides={
        "alertmanager_receiver_url": rx.url + "/alerts", "alertmanager_config_dir": str(conf),
        "alertmanager_group_wait": "0s", "alertmanager_group_interval": "1s", "alertmanager_repeat_interval": "2s"})
    (conf / "alertmanager.yml").write_text(render_template("alertmanager.yml.j2", ctx))
    if AMTOOL:
        r = subprocess.run([AMTOOL, "check-config", str(conf / "alertmanager.yml")], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
    assert TOKEN not in (conf / "alertmanager.yml").read_text()
    assert ALERTMANAGER, "prometheus-alertmanager is not installed"
    am = subprocess.Popen([ALERTMANAGER, f"--config.file={conf / 'alertmanager.yml'}",
                           f"--storage.path={tmp_path / 'am-data'}", f"--web.listen-address=127.0.0.1:{am_port}",
                           "--cluster.listen-address="], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    am_url = f"http://127.0.0.1:{am_port}/api/v2/alerts"
    try:
        _wait(lambda: _try(lambda: _http(f"http://127.0.0.1:{am_port}/-/ready")[0] == 200), 30, "Alertmanager")
        now = datetime.now(UTC)
        fault = {"labels": {"alertname": "ProvisionNodeXidFatal", "host": "n1", "cluster": "c1",
                            "severity": "critical", "signal": "xid", "remediate": "true"},
                 "annotations": {"summary": "A fatal-class XID in the kernel log on n1"},
                 "startsAt": now.isoformat()}
        quiet = {"labels": {"alertname": "VllmHeadDown", "host": "n2", "severity": "critical"},
                 "startsAt": now.isoformat()}
        assert _http(am_url, [fault, quiet])[0] == 200
        _wait(lambda: sum(v for k, v in _metrics(rx.url).items() if k.startswith("provisioner_receiver_actions_total"))
              == 1, 180, "the receiver's health + remediate for n1")
        assert _health_runs(rx.tmp) == [["n1"]]  # `provision health --limit n1` ran and was recorded
        # Alertmanager resends the still-firing group (repeat_interval 2s): the same key, no second action
        _wait(lambda: _metrics(rx.url)['provisioner_receiver_alerts_total{outcome="duplicate"}'] >= 1, 30,
              "a resend from Alertmanager")
        # resolved: Alertmanager sends it (send_resolved); the receiver acted on this alert, so it queues the
        # node's return once (health + remediate again: the policy returns a node whose health passes)
        assert _http(am_url, [{**fault, "endsAt": datetime.now(UTC).isoformat()}])[0] == 200
        _wait(lambda: _metrics(rx.url)['provisioner_receiver_alerts_total{outcome="resolved"}'] >= 1, 30,
              "the resolved notification")
        _wait(lambda: _metrics(rx.url)['provisioner_receiver_action_seconds_count'] == 2, 180, "the return")
        m = _metrics(rx.url)
        assert m['provisioner_receiver_alerts_total{outcome="act"}'] == 1
        assert m["provisioner_receiver_queue"] == 0
        log = rx.log.read_text()
        assert "ProvisionNodeXidFatal host=n1 status=firing: queued: health + remediate" in log
        assert "ProvisionNodeXidFatal host=n1 status=resolved: queued: health + remediate (the return)" in log
        assert "host=n2" not in log  # VllmHeadDown has no remediate label: Alertmanager never routed it here
        acted = [ln for ln in log.splitlines() if ln.split(" ", 2)[1:2] == ["action"]]
        assert len(acted) == 2 and all("health rc=1" in a and "remediate rc=" in a for a in acted), acted
        assert "/resolved ProvisionNodeXidFatal" in acted[1], acted
        # the same alert again after a receiver restart (its state file): still one action
        key = next(ln.split()[2] for ln in log.splitlines() if "queued: health + remediate" in ln)
        rx.stop()
        rx.start()
        fp, _, starts = key.partition("@")
        replay = _body({**_alert("firing", "n1", remediate="true"), "fingerprint": fp, "startsAt": starts})
        assert _http(rx.url + "/alerts", replay, token=TOKEN) == (200, '{"queued": 0}')
        resolved = _body({**_alert("resolved", "n1", remediate="true"), "fingerprint": fp, "startsAt": starts})
        assert _http(rx.url + "/alerts", resolved, token=TOKEN) == (200, '{"queued": 0}')  # its return: queued once
        time.sleep(1)
        assert _health_runs(rx.tmp) == [["n1"], ["n1"]]
    finally:
        am.terminate()
        am.wait(10)


def test_a_storm_acts_once_per_alert_and_once_per_waiting_host(rx: Rx) -> None:
    """300 distinct firing alerts for n1 in 30 concurrent requests, each body also carrying a duplicate of its first
    alert and a resolve: every alert recorded and finished exactly once, one health + remediate for the host while
    the others wait (they join the next one: `coalesced`), never two actions at once. Each resolve is of an alert the
    receiver acted on, so it queues that alert's return once (key KEY/resolved), which joins the host's waiting
    action like any other. One host: the least time."""
    import sqlite3
    from concurrent.futures import ThreadPoolExecutor

    def storm_alert(i: int, status: str = "firing") -> dict[str, Any]:
        return {**_alert(status, "n1", remediate="true"), "fingerprint": f"storm{i:04d}"}

    bodies = [_body(*(storm_alert(i) for i in range(r * 10, r * 10 + 10)), storm_alert(r * 10),
                    storm_alert(r * 10 + 1, "resolved")) for r in range(30)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda b: _http(rx.url + "/alerts", b, token=TOKEN), bodies))
    assert all(code == 200 for code, _ in answers)
    assert sum(json.loads(text)["queued"] for _, text in answers) == 300 + 30  # the alerts and the 30 returns
    _wait(lambda: _metrics(rx.url)["provisioner_receiver_queue"] == 0, 240, "the storm's queue to drain")
    m = _metrics(rx.url)
    acted, joined = m['provisioner_receiver_alerts_total{outcome="act"}'], m[
        'provisioner_receiver_alerts_total{outcome="coalesced"}']
    assert acted + joined == 300 and m['provisioner_receiver_alerts_total{outcome="duplicate"}'] == 30
    assert m['provisioner_receiver_alerts_total{outcome="resolved"}'] == 30
    actions_run = m['provisioner_receiver_action_seconds_count']
    assert acted <= actions_run <= 6, m  # a return arriving while nothing waits starts an action of its own
    with sqlite3.connect(rx.tmp / "rx.sqlite3") as db:
        rows = db.execute("SELECT key, state FROM alerts").fetchall()
    assert len(rows) == len({k for k, _ in rows}) == 330 and {s for _, s in rows} <= {"done", "failed"}
    assert sum(k.endswith("/resolved") for k, _ in rows) == 30
    runs = _health_runs(rx.tmp)
    assert runs == [["n1"]] * int(actions_run)  # one health run per action
    actions = [ln for ln in rx.log.read_text().splitlines() if ln.split(" ", 2)[1:2] == ["action"]]
    assert len(actions) == actions_run and sum("coalesced)" in ln for ln in actions) >= 1, actions


def _try(f: Any) -> bool:
    try:
        return bool(f())
    except OSError:
        return False


def test_unit_carries_paths_not_secrets(tmp_path: Path) -> None:
    inv = tmp_path / "inv.ini"
    inv.write_text(INI)
    env = {**os.environ, "ANSIBLE_VAULT_PASSWORD_FILE": "/etc/provisioner/vault-pass"}
    exe = str(Path(sys.executable).parent / "provision")
    p = subprocess.run([exe, "receiver", "unit", str(inv), "--out", str(tmp_path / "u.service"), "--listen",
                        "198.18.0.1:9095"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    text = (tmp_path / "u.service").read_text()
    assert f"ExecStart={exe} receiver serve {inv} --listen 198.18.0.1:9095 --state " in text
    assert "Environment=ANSIBLE_VAULT_PASSWORD_FILE=/etc/provisioner/vault-pass" in text
    p = subprocess.run([exe, "receiver", "unit", str(inv), "--out", str(tmp_path / "v.service"), "--state",
                        "/var/lib/x y.db"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert p.returncode == 2 and "the unit carries only plain paths" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "v.service").exists()
