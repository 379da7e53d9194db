"""`provision status / history / node` in-process, the ledger in tmp_path (PROVISION_LEDGER)."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import pytest

from cli_inproc import provision
from inventory_factory import write_inventory
from provisioner.ledger import Ledger
from provisioner.ledger.record import record_result
from provisioner.ledger.site import path_site
from provisioner.results import RunResult

INI_2 = """\
[gpu_nodes]
n1 ansible_host=10.0.0.1
n2 ansible_host=10.0.0.2
n3 ansible_host=10.0.0.3
n4 ansible_host=10.0.0.4

[c1]
n1 node_rank=0
n2 node_rank=1

[c2]
n3 node_rank=0
n4 node_rank=1
"""
INV: list[Path] = []  # the fixture's inventory (its site is its resolved path)
C = {"vllm_cluster": {"model": "/models/Qwen2-72B", "model_arch": "Qwen2-72B", "tensor_parallel_size": 8,
                      "pipeline_parallel_size": 2, "max_model_len": 4096, "max_num_seqs": 64}}


@pytest.fixture
def site(tmp_path: Path) -> tuple[Path, dict[str, str], Path]:
    inv = write_inventory(tmp_path / "inv", ini=INI_2, group_vars={"c2": C})
    INV[:] = [inv]
    db = tmp_path / "ledger.sqlite3"
    return inv, {"PROVISION_LEDGER": str(db)}, db


def node(site: tuple[Path, dict[str, str], Path], host: str, state: str, *extra: str) -> tuple[int, str, str]:
    inv, env, _ = site
    r = provision("node", str(inv), host, "--state", state, "--reason", f"to {state}", *extra, env=env)
    return r.returncode, r.stdout, r.stderr


def healthy(db: Path, *hosts: str, inv: Path | None = None) -> None:
    with Ledger.open(db, site=path_site(inv or INV[0])) as lg:
        run = lg.run_started("health", "inv")
        lg.run_finished(run, "ok", hosts=[{"host": h, "status": "ok"} for h in hosts])


def burnt(db: Path, host: str, inv: Path) -> None:
    """A passed `provision burn-in --tier quick` of `host`, recorded as the command records it (the burn-in gate)."""
    import time

    from provisioner.ledger.record import record_burnin
    from provisioner.probes.burnin import HostBurnin

    row = {"check": "gemm_bf16", "gpu": 0, "status": "pass", "metric": "gemm_bf16_tflops", "value": 689.0,
           "message": "ok"}
    record_burnin({host: HostBurnin(host, reachable=True, tier="quick", rc=0, results=[row], summary={"check": "summary"})}, "quick",
                  inv, time.time(), 0.0, db)


def to_service(site: tuple[Path, dict[str, str], Path], host: str) -> None:
    for s in ("provisioning", "burn-in"):
        assert node(site, host, s)[0] == 0
    healthy(site[2], host, inv=site[0])
    burnt(site[2], host, site[0])
    rc, out, err = node(site, host, "in-service")
    assert rc == 0, err


def test_status_of_a_fresh_fleet_reads_new_and_creates_nothing(site: tuple[Path, dict[str, str], Path]) -> None:
    inv, env, db = site
    r = provision("status", str(inv), "--format", "json", env=env)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["hosts"]
    assert [(x["host"], x["state"], x["cluster"], x["last_run"]) for x in rows] == [
        ("n1", "new", "c1", None), ("n2", "new", "c1", None), ("n3", "new", "c2", None), ("n4", "new", "c2", None)]
    assert not db.exists()
    t = provision("status", str(inv), env=env, columns=200)
    assert t.returncode == 0 and "n4" in t.stdout and "new" in t.stdout


def test_node_moves_and_status_history_show_it(site: tuple[Path, dict[str, str], Path]) -> None:
    inv, env, db = site
    rc, out, _ = node(site, "n1", "provisioning")
    assert rc == 0 and out == "n1: new -> provisioning (to provisioning)\n"
    rows = json.loads(provision("status", str(inv), "-f", "json", env=env).stdout)["hosts"]
    assert rows[0]["state"] == "provisioning" and rows[0]["since"] is not None and rows[1]["state"] == "new"
    h = json.loads(provision("history", "n1", "--inventory", str(inv), "-f", "json", env=env).stdout)
    assert h["state"] == "provisioning"
    assert [(t["from"], t["to"], t["reason"]) for t in h["transitions"]] == [("new", "provisioning", "to provisioning")]
    assert h["transitions"][0]["actor"].startswith("user:")
    text = provision("history", "n1", env=env)
    assert text.returncode == 0 and "new -> provisioning" in text.stdout


def test_refusals_exit_1_with_one_line(site: tuple[Path, dict[str, str], Path]) -> None:
    rc, _, err = node(site, "n1", "in-service")
    assert rc == 1 and err == ("refused: n1: new -> in-service is not a lifecycle transition; from new: provisioning, "
                               "retired\n")
    node(site, "n1", "provisioning")
    node(site, "n1", "burn-in")
    rc, _, err = node(site, "n1", "in-service")  # no health pass yet
    assert rc == 1 and "needs a passed health gate first" in err and len(err.splitlines()) == 1


def test_a_health_pass_before_the_present_state_does_not_count(site: tuple[Path, dict[str, str], Path]) -> None:
    healthy(site[2], "n1", inv=site[0])
    node(site, "n1", "provisioning")
    node(site, "n1", "burn-in")
    burnt(site[2], "n1", site[0])  # the burn-in gate passed: the health gate is what refuses
    rc, _, err = node(site, "n1", "in-service")
    assert rc == 1 and "needs a passed health gate first" in err
    healthy(site[2], "n1", inv=site[0])
    assert node(site, "n1", "in-service")[0] == 0


def test_draining_the_last_serving_cluster_needs_force(site: tuple[Path, dict[str, str], Path]) -> None:
    for h in ("n1", "n2", "n3", "n4"):
        to_service(site, h)
    rc, out, _ = node(site, "n1", "draining")
    assert rc == 0 and "note: cluster c1 drains as a whole (with n2)" in out
    rc, _, err = node(site, "n3", "draining")
    assert rc == 1 and "cluster c2 is the last one serving Qwen2-72B" in err and "--force" in err
    rc, out, _ = node(site, "n3", "draining", "--force")
    assert rc == 0 and "forced" in out
    h = json.loads(provision("history", "n3", "-f", "json", env=site[1]).stdout)
    assert h["transitions"][-1]["forced"] is True


@pytest.mark.parametrize(("args", "needle"), [
    (["node", "INV", "n9", "--state", "retired", "--reason", "x"], "n9 is not a host of the inventory"),
    (["node", "INV", "n1", "--state", "serving", "--reason", "x"], "'serving' is not one of"),
    (["node", "INV", "n1", "--state", "retired"], "Missing option '--reason'"),
    (["node", "INV", "n1", "--state", "retired", "--reason", " "], "--reason must say why"),
    (["history", "n9", "--inventory", "INV"], "n9 is not a host of the inventory"),
    (["status", "INV", "--format", "html"], "'html' is not one of"),
])
def test_usage_errors_are_one_line_exit_2(site: tuple[Path, dict[str, str], Path], args: list[str],
                                         needle: str) -> None:
    inv, env, db = site
    r = provision(*[str(inv) if a == "INV" else a for a in args], env=env)
    assert r.returncode == 2, r.stdout + r.stderr
    assert needle in r.stderr and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_status_shows_the_last_run_and_an_interrupted_one(site: tuple[Path, dict[str, str], Path],
                                                          tmp_path: Path) -> None:
    inv, env, db = site
    result = RunResult(command="run", inventory=str(inv), playbook="site.yml", run_dir=str(tmp_path / "r1"),
                       artifact_dir="a", started=1000.0, duration=3.0, status="successful", rc=0,
                       targeted=["n1", "n2"])
    for h in ("n1", "n2"):
        result.host(h).seen = True
    result.host("n2").failed = 1
    result.status, result.rc = "failed", 2
    with Ledger.open(db, site=path_site(inv)) as lg:
        record_result(lg, result)
        lg.run_started("run", str(inv), pid=2**31 - 2, hosts=["n3"])  # never finished, its process gone
    rows = {x["host"]: x["last_run"] for x in json.loads(
        provision("status", str(inv), "-f", "json", env=env).stdout)["hosts"]}
    assert rows["n1"]["outcome"] == "ok" and rows["n1"]["status"] == "failed"
    assert rows["n2"]["outcome"] == "failed" and rows["n2"]["run_dir"] == str(tmp_path / "r1")
    assert rows["n3"]["status"] == rows["n3"]["outcome"] == "interrupted" and rows["n4"] is None
    h = json.loads(provision("history", "n3", "-f", "json", env=env).stdout)
    assert h["runs"][0]["outcome"] == "interrupted"
    text = provision("status", str(inv), env=env, columns=250).stdout
    assert ": interrupted" in text and "(run interrupted)" not in text


def test_status_shows_last_health_and_drift(site: tuple[Path, dict[str, str], Path]) -> None:
    inv, env, db = site
    with Ledger.open(db, site=path_site(inv)) as lg:
        h = lg.run_started("health", str(inv), started=100.0)
        lg.run_finished(h, "failed", hosts=[{"host": "n1", "status": "failed"}, {"host": "n2", "status": "ok"}],
                        health=[("n1", "ecc", "fail", "row remap pending"), ("n1", "gpus", "pass", None)])
        d = lg.run_started("drift", str(inv), started=200.0)
        lg.run_finished(d, "drift", hosts=[{"host": "n1", "status": "changed", "changed": 1}],
                        drift=[("n1", "file:/etc/nccl.conf"), ("n1", "service:vllm")])
    rows = {x["host"]: x for x in json.loads(provision("status", str(inv), "-f", "json", env=env).stdout)["hosts"]}
    assert rows["n1"]["health"] == {"run": h, "started": 100.0, "result": "failed", "failed": ["ecc"]}
    assert rows["n1"]["drift"] == {"run": d, "started": 200.0, "outcome": "changed", "items": 2}
    assert rows["n2"]["health"]["result"] == "ok" and rows["n2"]["drift"] is None and rows["n3"]["health"] is None
    text = provision("status", str(inv), env=env, columns=250).stdout
    assert "failed (ecc)" in text and "2 item(s)" in text


class _Page(HTMLParser):
    """The status table's rows (cells' text), each node section's timeline items, every tag and attribute seen."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self.timeline: dict[str, list[tuple[str, str]]] = {}
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self._cell: list[str] | None = None
        self._li: tuple[str, list[str]] | None = None
        self._section = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag == "tr" and "data-host" in a:
            self.rows.append([])
        elif tag == "td" and self.rows:
            self._cell = []
        elif tag == "section":
            self._section = str(a["id"]).removeprefix("node-")
            self.timeline[self._section] = []
        elif tag == "li":
            self._li = (str(a["data-kind"]), [])

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._cell is not None:
            self.rows[-1].append("".join(self._cell))
            self._cell = None
        elif tag == "li" and self._li is not None:
            self.timeline[self._section].append((self._li[0], "".join(self._li[1])))
            self._li = None

    def handle_data(self, data: str) -> None:
        for buf in (self._cell, self._li[1] if self._li else None):
            if buf is not None:
                buf.append(data)


def test_status_html_is_the_table_and_each_nodes_timeline(site: tuple[Path, dict[str, str], Path],
                                                          tmp_path: Path) -> None:
    inv, env, db = site
    evil = "<script>alert('x')</script> & more"
    with Ledger.open(db, site=path_site(inv)) as lg:
        for a, b in (("new", "provisioning"), ("provisioning", "burn-in")):
            lg.record_transition("n1", a, b, reason=evil if b == "burn-in" else "racked", actor="user:t", at=100.0)
        h = lg.run_started("health", str(inv), started=200.0)
        lg.run_finished(h, "failed", hosts=[{"host": "n1", "status": "failed"}],
                        health=[("n1", "ecc", "fail", "row remap pending")])
        lg.record_transition("n1", "burn-in", "quarantined", reason="ecc: row remap pending", actor="policy:remediate",
                             at=300.0)
        lg.record_step("n1", "gpu_reset", "failed", actor="policy:remediate", detail="GPU held by 42 <python3>",
                       at=400.0)
    page = tmp_path / "out" / "status.html"
    r = provision("status", str(inv), "--html", str(page), env=env, columns=250)
    assert r.returncode == 0, r.stderr
    text = page.read_text()
    assert "<script>" not in text and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; more" in text
    p = _Page()
    p.feed(text)
    assert [row[:2] for row in p.rows] == [["n1", "quarantined"], ["n2", "new"], ["n3", "new"], ["n4", "new"]]
    assert p.rows[0][4].startswith("health #") and p.rows[0][5] == "1970-01-01 00:03:20Z: failed (ecc)"
    assert p.timeline["n1"] == [
        ("transition", "1970-01-01 00:01:40Znew -> provisioning by user:t: racked"),
        ("transition", f"1970-01-01 00:01:40Zprovisioning -> burn-in by user:t: {evil}"),
        ("health", "1970-01-01 00:03:20Zhealth #1: failed (failed: ecc)"),
        ("transition", "1970-01-01 00:05:00Zburn-in -> quarantined by policy:remediate: ecc: row remap pending"),
        ("remediation", "1970-01-01 00:06:40Zgpu_reset failed: GPU held by 42 <python3>")]
    assert p.timeline["n2"] == []
    # self-contained: nothing loaded from anywhere, no script at all
    assert not [t for t, a in p.tags if t in ("script", "link", "img", "iframe") or "src" in a]
    assert all(str(a.get("href", "#")).startswith("#") for _, a in p.tags)


def test_status_html_to_an_unwritable_place_is_a_usage_error(site: tuple[Path, dict[str, str], Path],
                                                             tmp_path: Path) -> None:
    inv, env, _ = site
    (tmp_path / "f").write_text("")
    r = provision("status", str(inv), "--html", str(tmp_path / "f" / "x.html"), env=env)
    assert r.returncode == 2 and "cannot write the HTML page" in r.stderr and "Traceback" not in r.stderr


LONG = ["gpu-node-01.rack7.example.org", "gpu-node-02.rack7.example.org"]


@pytest.mark.parametrize("columns", [None, 40, 80, 120, 400])
def test_status_never_cuts_a_host_name_and_shows_the_reason(tmp_path: Path, columns: int | None) -> None:
    """Piped (rich's default width 80 when COLUMNS is unset), at 80 columns, narrower and wider: every host name is
    printed whole, and a quarantined / maintenance node's reason is shown (text and JSON)."""
    ini = "[gpu_nodes]\n" + "".join(f"{h} ansible_host=10.0.0.{i}\n" for i, h in enumerate(LONG, 1))
    inv = write_inventory(tmp_path / "inv", ini=ini)
    db = tmp_path / "ledger.sqlite3"
    env = {"PROVISION_LEDGER": str(db)}
    why = {LONG[0]: "ecc: uncorrectable ECC errors on GPU 3 (row remap pending)",
           LONG[1]: "rack 7 PDU swap [ticket 42]"}
    with Ledger.open(db, site=path_site(inv)) as lg:
        for h, last in ((LONG[0], "quarantined"), (LONG[1], "maintenance")):
            prev = "new"
            for s in ("provisioning", "burn-in", last):
                lg.record_transition(h, prev, s, reason=why[h] if s == last else "x", actor="test")
                prev = s
    r = provision("status", str(inv), env=env, columns=columns)
    assert r.returncode == 0, r.stderr
    for h in LONG:
        assert h in r.stdout, r.stdout
        assert why[h] in r.stdout, r.stdout
    assert "…" not in r.stdout
    rows = {x["host"]: x for x in json.loads(provision("status", str(inv), "-f", "json", env=env).stdout)["hosts"]}
    assert {h: (rows[h]["state"], rows[h]["reason"]) for h in LONG} == {
        LONG[0]: ("quarantined", why[LONG[0]]), LONG[1]: ("maintenance", why[LONG[1]])}


def test_status_reason_is_none_for_a_new_host(site: tuple[Path, dict[str, str], Path]) -> None:
    inv, env, _ = site
    node(site, "n1", "provisioning")
    rows = {x["host"]: x for x in json.loads(provision("status", str(inv), "-f", "json", env=env).stdout)["hosts"]}
    assert rows["n1"]["reason"] == "to provisioning" and rows["n2"]["reason"] is None
    text = provision("status", str(inv), env=env, columns=400).stdout
    assert "to provisioning" not in text  # the text shows the reason of the states an operator must act on only
