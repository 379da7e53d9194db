"""Burn-in in the ledger (schema step 9), `provision status` (burn-in column, slow nodes) and the lifecycle's burn-in
gate, in-process with the ledger in tmp_path."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from cli_inproc import provision
from inventory_factory import write_inventory

from provisioner.day2.lifecycle import Context, Refused, transition
from provisioner.ledger import Ledger
from provisioner.ledger.record import record_burnin
from provisioner.ledger.site import path_site
from provisioner.probes.burnin import HostBurnin

INI = """\
[gpu_nodes]
n1 ansible_host=10.0.0.1
n2 ansible_host=10.0.0.2
n3 ansible_host=10.0.0.3
n4 ansible_host=10.0.0.4
"""
GV = {"all": {"gpu_model": "H100-SXM5-80GB", "gpu_count": 8}}


def result(host: str, gemm: float, *, fail_gpu: int | None = None) -> HostBurnin:
    rows = []
    for g in range(8):
        v = 600.0 if g == fail_gpu else gemm
        rows.append({"check": "gemm_bf16", "gpu": g, "status": "fail" if g == fail_gpu else "pass",
                     "metric": "gemm_bf16_tflops", "value": v, "message": f"GPU {g}: {v}",
                     **({"code": "BRN001"} if g == fail_gpu else {})})
    rows.append({"check": "nccl", "gpu": None, "status": "pass", "metric": "nccl_allreduce_busbw_gbps",
                 "value": 470.0, "message": "ok"})
    return HostBurnin(host, reachable=True, tier="quick", rc=0, results=rows, summary={"check": "summary"})


@pytest.fixture
def inv(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    inv = write_inventory(tmp_path / "inv", ini=INI, group_vars=GV)
    db = tmp_path / "ledger.sqlite3"
    return inv, db, {"PROVISION_LEDGER": str(db)}


def test_recorded_per_check_per_gpu_and_status_shows_failures_and_the_slow_node(
        inv: tuple[Path, Path, dict[str, str]]) -> None:
    path, db, env = inv
    res = {"n1": result("n1", 689.0), "n2": result("n2", 689.0 * 0.93), "n3": result("n3", 690.0, fail_gpu=5),
           "n4": result("n4", 688.0)}
    run = record_burnin(res, "quick", path, time.time(), 12.0, db)
    assert run is not None
    with Ledger.open(db, site=path_site(path)) as lg:
        rows = lg.burnin("n3")
        assert len(rows) == 9 and rows[5]["gpu"] == 5 and rows[5]["code"] == "BRN001" and rows[8]["gpu"] == -1
        assert lg.burnin_last("n3")["status"] == "failed" and lg.burnin_last("n3", passed=True) is None
        assert lg.burnin_figures()["n3"]["gemm_bf16_tflops"] == 600.0  # the node's slowest GPU
    r = provision("status", str(path), "--format", "json", env=env)
    assert r.returncode == 0, r.stderr
    hosts = {h["host"]: h for h in json.loads(r.stdout)["hosts"]}
    assert hosts["n3"]["burnin"]["failed"] == ["gemm_bf16[gpu5] BRN001"]
    assert hosts["n1"]["burnin"] == {"run": run, "tier": "quick", "ended": hosts["n1"]["burnin"]["ended"],
                                     "result": "ok", "failed": []}
    # node figures (slowest GPU): 689, 640.8, 600, 688 -> median 664.4: n3 is 9.7% below it; n2 (3.6%) is not
    assert {h: [s["metric"] for s in x["slow"]] for h, x in hosts.items()} == {
        "n1": [], "n2": [], "n3": ["gemm_bf16_tflops"], "n4": []}
    text = provision("status", str(path), env=env, columns=250).stdout
    assert "SLOW gemm_bf16_tflops -9.7%" in text and "gemm_bf16[gpu5] BRN001" in text
    page = Path(path).parent / "status.html"
    assert provision("status", str(path), "--html", str(page), env=env).returncode == 0
    html = page.read_text()
    assert "SLOW gemm_bf16_tflops" in html and 'class="slow"' in html
    # the distribution per metric: every node's figure, the median, the outlier marked
    dist = html[html.index('<table class="dist" data-metric="gemm_bf16_tflops">'):]
    dist = dist[:dist.index("</table>")]
    assert "median 664.4" in dist and '<tr class="slow"><td>n3</td><td>600.0</td>' in dist
    assert dist.count('<tr class="slow">') == 1 and "SLOW -9.7%" in dist
    hist = provision("history", "n3", "--inventory", str(path), "--format", "json", env=env)
    assert hist.returncode == 0, hist.stderr
    assert [(x["command"], x["failed_checks"]) for x in json.loads(hist.stdout)["runs"]] == [
        ("burn-in", ["gemm_bf16[gpu5] BRN001"])]


def test_burnin_gate_refuses_in_service_without_a_passed_burnin() -> None:
    gated = Context(health_passed=True, burnin_required=True, burnin_passed=False, inventory="inv/hosts.ini")
    with pytest.raises(Refused, match=r"^n1: burn-in -> in-service needs a passed burn-in .*: run provision burn-in "
                                      r"inv/hosts.ini n1 --tier quick$"):
        transition("burn-in", "in-service", reason="r", host="n1", context=gated)
    with pytest.raises(Refused, match="burn-in"):
        transition("burn-in", "in-service", reason="r", host="n1", force=True, context=gated)
    ok = transition("burn-in", "in-service", reason="r", host="n1",
                    context=Context(health_passed=True, burnin_required=True, burnin_passed=True))
    assert ok.to_state == "in-service"
    # a site that turned the gate off: the health gate alone decides
    assert transition("burn-in", "in-service", reason="r", context=Context(health_passed=True)).to_state == "in-service"


def _health_ok(db: Path, path: Path, host: str) -> None:
    with Ledger.open(db, site=path_site(path)) as lg:
        run = lg.run_started("health", "inv")
        lg.run_finished(run, "ok", hosts=[{"host": host, "status": "ok"}])


def _in_burnin_healthy(tmp_path: Path, path: Path) -> tuple[Path, dict[str, str]]:
    """A fresh ledger with n1 moved to burn-in by hand and a passed health run: (ledger, env for `provision`)."""
    db = tmp_path / "ledger.sqlite3"
    env = {"PROVISION_LEDGER": str(db)}
    for s in ("provisioning", "burn-in"):
        assert provision("node", str(path), "n1", "--state", s, "--reason", s, env=env).returncode == 0
    _health_ok(db, path, "n1")
    return db, env


def test_node_command_applies_the_gate_by_default(tmp_path: Path) -> None:
    path = write_inventory(tmp_path / "inv", ini=INI, group_vars=GV)  # no burnin_gate: on
    db, env = _in_burnin_healthy(tmp_path, path)
    r = provision("node", str(path), "n1", "--state", "in-service", "--reason", "go", env=env)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [
        f"refused: n1: burn-in -> in-service needs a passed burn-in since it left service (burnin_gate): run "
        f"provision burn-in {path} n1 --tier quick"]
    record_burnin({"n1": result("n1", 689.0)}, "quick", path, time.time(), 0.0, db)
    r = provision("node", str(path), "n1", "--state", "in-service", "--reason", "go", env=env)
    assert r.returncode == 0, r.stderr
    # out and back: the burn-in from before it left service does not count, one passed since it did does
    for s in ("draining", "maintenance", "burn-in"):
        assert provision("node", str(path), "n1", "--state", s, "--reason", s, env=env).returncode == 0
    _health_ok(db, path, "n1")
    r = provision("node", str(path), "n1", "--state", "in-service", "--reason", "back", env=env)
    assert r.returncode == 1 and "needs a passed burn-in" in r.stderr
    record_burnin({"n1": result("n1", 689.0)}, "quick", path, time.time(), 0.0, db)  # in burn-in: counts
    # ... unless a later tier failed
    record_burnin({"n1": result("n1", 689.0, fail_gpu=2)}, "quick", path, time.time(), 0.0, db)
    r = provision("node", str(path), "n1", "--state", "in-service", "--reason", "back", env=env)
    assert r.returncode == 1 and "needs a passed burn-in" in r.stderr
    record_burnin({"n1": result("n1", 689.0)}, "quick", path, time.time(), 0.0, db)
    r = provision("node", str(path), "n1", "--state", "in-service", "--reason", "back", env=env)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize(("value", "gated"), [("false", False), ("off", False), ("no", False), ("true", True),
                                               ("flase", True)])
def test_burnin_gate_off_only_when_the_site_says_so(tmp_path: Path, value: str, gated: bool) -> None:
    path = write_inventory(tmp_path / "inv", ini=INI, group_vars={"all": {**GV["all"], "burnin_gate": value}})
    db, env = _in_burnin_healthy(tmp_path, path)
    r = provision("node", str(path), "n1", "--state", "in-service", "--reason", "go", env=env)
    assert (r.returncode == 1 and "needs a passed burn-in" in r.stderr) if gated else r.returncode == 0


def test_a_bad_burnin_variable_is_one_line_naming_host_and_variable(tmp_path: Path) -> None:
    path = write_inventory(tmp_path / "inv", ini=INI, group_vars={"all": {**GV["all"], "burnin_slow_fraction": "lots"}})
    r = provision("status", str(path), env={"PROVISION_LEDGER": str(tmp_path / "l.sqlite3")})
    record_burnin({"n1": result("n1", 689.0)}, "quick", path, time.time(), 5.0, tmp_path / "l.sqlite3")
    r = provision("status", str(path), env={"PROVISION_LEDGER": str(tmp_path / "l.sqlite3")})
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "burnin_slow_fraction = 'lots': expected a fraction between 0 and 1" in r.stderr
    bad = write_inventory(tmp_path / "inv2", ini=INI, group_vars={"all": {**GV["all"], "burnin_load_seconds": "x"}})
    r = provision("burn-in", str(bad), "n1", "--timeout", "1")
    assert r.returncode == 2 and "host n1: burnin_load_seconds = 'x': expected a whole number >= 1" in r.stderr


def test_adopting_a_serving_node_waives_the_burnin_gate_once_and_says_so(tmp_path: Path) -> None:
    """A fleet that served before the ledger knew it: `--adopt` records each node in service (health gate held, the
    burn-in gate waived, forced, in the reason); a node the ledger knows cannot be adopted past the gate."""
    path = write_inventory(tmp_path / "inv", ini=INI, group_vars=GV)
    db = tmp_path / "ledger.sqlite3"
    env = {"PROVISION_LEDGER": str(db)}
    adopt = ("--state", "in-service", "--adopt", "--reason", "serving before the ledger")
    r = provision("node", str(path), "n1", *adopt, env=env)
    assert r.returncode == 1 and r.stderr.strip() == (
        f"refused: n1: adopting it needs a passed health gate first: run provision health {path} --limit n1")
    _health_ok(db, path, "n1")
    r = provision("node", str(path), "n1", *adopt, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-2:] == [
        "n1: burn-in -> in-service (adopted, no burn-in on record: serving before the ledger)",
        "  note: burn-in gate waived: n1 serves already; its first return runs burnin_return_tier"]
    with Ledger.open(db, site=path_site(path)) as lg:
        ts = lg.transitions("n1")
        assert [(t.from_state, t.to_state, t.forced) for t in ts] == [
            ("new", "provisioning", False), ("provisioning", "burn-in", False), ("burn-in", "in-service", True)]
    # once: a node with a history comes back through the gate
    for s in ("draining", "maintenance"):
        assert provision("node", str(path), "n1", "--state", s, "--reason", s, env=env).returncode == 0
    r = provision("node", str(path), "n1", *adopt, env=env)
    assert r.returncode == 1 and "--adopt is for a node the ledger has never seen; it is maintenance" in r.stderr
    r = provision("node", str(path), "n2", "--state", "burn-in", "--adopt", "--reason", "x", env=env)
    assert r.returncode == 2 and "--adopt records a serving node: it goes with --state in-service" in r.stderr
