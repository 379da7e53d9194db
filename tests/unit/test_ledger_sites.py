"""One ledger, several sites (issue 43, class 4): two inventories in one checkout that both have a `node01` keep
apart (states, onboarding's marks, runs, status, history, the drift's recorded states); a ledger from before sites
migrates with its records unowned until `provision ledger adopt`; a ledger error after open is one LedgerError
line; the file is 0600 in a 0700 directory; a run whose process is gone (or whose pid was reused) is `interrupted`
in the database, with every host it targeted."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import stat
from pathlib import Path

import pytest
from cli_inproc import provision
from inventory_factory import write_inventory

from provisioner.inventory import load_fleet
from provisioner.ledger import Ledger, LedgerError
from provisioner.ledger.record import record_result
from provisioner.ledger.schema import MIGRATIONS, VERSION
from provisioner.ledger.store import _statements
from provisioner.results import RunResult

# provisioner.ledger.site and the store's new helpers are imported where used, after the CLI-only assertions: this
# file also runs against the code before sites, to show where that code fails


def site_of(fleet: object) -> str:
    from provisioner.ledger.site import site_of as real

    return real(fleet)

RACK_A = "[gpu_nodes]\nnode01 ansible_host=10.0.0.1\nnode02 ansible_host=10.0.0.2\n\n[c1]\nnode01 node_rank=0\n" \
         "node02 node_rank=1\n"
RACK_B = "[gpu_nodes]\nnode01 ansible_host=10.0.1.1\nnode02 ansible_host=10.0.1.2\n\n[c1]\nnode01 node_rank=0\n" \
         "node02 node_rank=1\n"


@pytest.fixture
def checkout(tmp_path: Path) -> dict[str, object]:
    a = write_inventory(tmp_path / "rack-a", ini=RACK_A)
    b = write_inventory(tmp_path / "rack-b", ini=RACK_B)
    db = tmp_path / "runs" / "ledger.sqlite3"
    return {"a": a, "b": b, "db": db, "env": {"PROVISION_LEDGER": str(db)}}


def _status(c: dict[str, object], inv: object) -> dict[str, dict[str, object]]:
    r = provision("status", str(inv), "-f", "json", env=c["env"])  # type: ignore[arg-type]
    assert r.returncode == 0, r.stderr
    return {h["host"]: h for h in json.loads(r.stdout)["hosts"]}


def _run(inventory: Path, hosts: list[str], started: float) -> RunResult:
    r = RunResult(command="run", inventory=str(inventory), playbook="site.yml", run_dir=f"/runs/{started}",
                  artifact_dir="a", started=started, duration=1.0, status="successful", rc=0, targeted=hosts)
    for h in hosts:
        r.host(h).seen = True
    return r


def test_the_site_is_provision_site_else_the_resolved_path(tmp_path: Path) -> None:
    a = write_inventory(tmp_path / "a", ini=RACK_A)
    assert site_of(load_fleet(a)) == str(a.resolve())
    named = write_inventory(tmp_path / "n", ini=RACK_A, group_vars={"all": {"provision_site": "dc1-rack-a"}})
    assert site_of(load_fleet(named)) == "dc1-rack-a"
    bad = write_inventory(tmp_path / "bad", ini=RACK_A, group_vars={"all": {"provision_site": "x\ny"}})
    with pytest.raises(Exception, match="provision_site must be a non-empty string"):
        site_of(load_fleet(bad))


def test_two_racks_with_node01_keep_apart(checkout: dict[str, object], monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's scenario: onboarding/marking the second rack leaves the first's never-onboarded node01 alone;
    each status and history shows its own runs only; a run on one keeps the other's recorded state."""
    from provisioner.day2.onboard import Outcome
    from provisioner.day2.executor import record_onboarding

    a, b, db = checkout["a"], checkout["b"], checkout["db"]
    monkeypatch.setenv("PROVISION_LEDGER", str(db))
    warnings: list[str] = []
    fleet_b = load_fleet(b)  # type: ignore[arg-type]
    record_onboarding(fleet_b, {"node01": Outcome(host="node01", in_service=True, passed=["health", "burn-in"],
                                                  burnin="standard")}, warnings.append)
    assert warnings == []
    r = provision("node", str(b), "node02", "--state", "provisioning", "--reason", "racked", env=checkout["env"])
    assert r.returncode == 0, r.stderr
    sa, sb = _status(checkout, a), _status(checkout, b)
    assert (sa["node01"]["state"], sa["node02"]["state"]) == ("new", "new")  # rack A untouched
    assert (sb["node01"]["state"], sb["node02"]["state"]) == ("in-service", "provisioning")

    with Ledger.open(db, site=site_of(load_fleet(a))) as lg:  # type: ignore[arg-type]
        ra = record_result(lg, _run(a, ["node01"], 100.0))  # type: ignore[arg-type]
    with Ledger.open(db, site=site_of(fleet_b)) as lg:  # type: ignore[arg-type]
        rb = record_result(lg, _run(b, ["node01", "node02"], 200.0))  # type: ignore[arg-type]
    assert _status(checkout, a)["node01"]["last_run"]["id"] == ra  # type: ignore[index]
    assert _status(checkout, b)["node01"]["last_run"]["id"] == rb  # type: ignore[index]
    assert _status(checkout, a)["node02"]["last_run"] is None

    ha = json.loads(provision("history", "node01", "-i", str(a), "-f", "json", env=checkout["env"]).stdout)
    hb = json.loads(provision("history", "node01", "-i", str(b), "-f", "json", env=checkout["env"]).stdout)
    assert [x["id"] for x in ha["runs"]] == [ra] and ha["transitions"] == [] and ha["state"] == "new"
    assert [x["id"] for x in hb["runs"]] == [rb] and [t["to"] for t in hb["transitions"]] == [
        "provisioning", "burn-in", "in-service"]
    both = provision("history", "node01", env=checkout["env"])  # two sites have a node01: say which
    assert both.returncode == 2 and "2 sites" in both.stderr and "--inventory" in both.stderr, both.stderr
    only_b = json.loads(provision("history", "node02", "-f", "json", env=checkout["env"]).stdout)
    assert only_b["site"] == site_of(fleet_b) and only_b["state"] == "provisioning"

    # the drift's recorded states: a run on rack B does not replace rack A's node01 record
    with Ledger.open(db, site=site_of(load_fleet(a))) as lg:  # type: ignore[arg-type]
        lg.put_states([("node01", ra, "inputs-a", {"file:/etc/nccl.conf": "a" * 64 + " 644 0 0"})])
    with Ledger.open(db, site=site_of(fleet_b)) as lg:  # type: ignore[arg-type]
        lg.put_states([("node01", rb, "inputs-b", {"file:/etc/nccl.conf": "b" * 64 + " 644 0 0"})],
                      drop=["node02"])
        assert lg.records(["node01"])["node01"].inputs == "inputs-b"
    with Ledger.open(db, site=site_of(load_fleet(a))) as lg:  # type: ignore[arg-type]
        rec = lg.records(["node01"])["node01"]
        assert rec.run == ra and rec.inputs == "inputs-a"

    r = provision("status", "--all-sites", "-f", "json", env=checkout["env"])
    assert r.returncode == 0, r.stderr
    sites = {s["site"]: s for s in json.loads(r.stdout)["sites"]}
    assert set(sites) == {str(Path(a).resolve()), str(Path(b).resolve())}  # type: ignore[arg-type]
    assert sites[str(Path(b).resolve())]["states"] == {"in-service": 1, "provisioning": 1}  # type: ignore[arg-type]
    assert sites[str(Path(a).resolve())]["runs"] == 1  # type: ignore[arg-type]
    text = provision("status", "--all-sites", env=checkout["env"], columns=60).stdout
    assert str(Path(b).resolve()) in text  # type: ignore[arg-type]
    assert provision("status", env=checkout["env"]).returncode == 2


def _v5_ledger(path: Path) -> None:
    """A ledger as written before sites (schema version 5), with a run, transitions and a recorded state."""
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    for step in MIGRATIONS[:5]:
        for stmt in _statements(step):
            db.execute(stmt)
    db.execute("INSERT INTO schema_version VALUES (5)")
    db.execute("INSERT INTO runs (id, command, inventory, started, ended, status) VALUES (1, 'run', 'hosts.ini', "
               "10, 11, 'ok')")
    db.execute("INSERT INTO host_outcomes (run, host, status) VALUES (1, 'node01', 'ok')")
    for i, (a, b) in enumerate((("new", "provisioning"), ("provisioning", "burn-in"), ("burn-in", "in-service"))):
        db.execute("INSERT INTO transitions (host, from_state, to_state, reason, at, actor) VALUES "
                   "('node01', ?, ?, 'x', ?, 't')", (a, b, 20.0 + i))
    db.execute("INSERT INTO host_state (host, run, recorded, inputs, digest, state) VALUES ('node01', 1, 12, "
               "'plain-inputs', 'd', X'00')")
    db.commit()
    db.close()


def test_a_ledger_from_before_sites_is_adopted_explicitly(checkout: dict[str, object]) -> None:
    a, b, db, env = checkout["a"], checkout["b"], checkout["db"], checkout["env"]
    Path(db).parent.mkdir()  # type: ignore[arg-type]
    _v5_ledger(db)  # type: ignore[arg-type]
    with Ledger.open(db) as lg:  # type: ignore[arg-type]
        assert lg.version == VERSION and lg.unowned() == 4  # 1 run, 3 transitions
        assert lg.state("node01")[0] == "in-service"  # site '': the unowned records
        assert lg._db.execute("SELECT COUNT(*) FROM host_state").fetchone()[0] == 0  # plain digests gone
    r = provision("status", str(a), "-f", "json", env=env)  # type: ignore[arg-type]
    assert r.returncode == 0 and json.loads(r.stdout)["hosts"][0]["state"] == "new"
    assert r.stderr.count("\n") == 1 and "provision ledger adopt" in r.stderr, r.stderr
    r = provision("node", str(b), "node01", "--state", "provisioning", "--reason", "x", env=env)  # type: ignore
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "provision ledger adopt" in r.stderr, r.stderr
    r = provision("ledger", "adopt", str(a), env=env)  # type: ignore[arg-type]
    assert r.returncode == 0 and "adopted 1 runs, 3 transitions" in r.stdout, r.stdout + r.stderr
    sa = _status(checkout, a)
    assert sa["node01"]["state"] == "in-service" and sa["node01"]["last_run"]["id"] == 1  # type: ignore[index]
    assert _status(checkout, b)["node01"]["state"] == "new"
    r = provision("node", str(b), "node01", "--state", "provisioning", "--reason", "x", env=env)  # type: ignore
    assert r.returncode == 0, r.stderr
    assert "nothing to adopt" in provision("ledger", "adopt", str(b), env=env).stdout  # type: ignore[arg-type]


def test_an_error_after_open_is_one_ledger_error(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite3"
    with Ledger.open(path, site="s", timeout=0.2) as lg:
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another controller holds the write lock
        with pytest.raises(LedgerError, match=r"^the ledger .*l\.sqlite3: database is locked$"):
            lg.record_transition("n1", "new", "provisioning", reason="r", actor="t")
        other.execute("ROLLBACK")
        lg._db.execute("PRAGMA query_only = ON")  # as a read-only file answers
        with pytest.raises(LedgerError, match="readonly database"):
            lg.run_started("run", "inv")
        assert lg.state("n1")[0] == "new"


def test_the_file_is_0600_in_a_0700_directory(tmp_path: Path) -> None:
    path = tmp_path / "state" / "ledger" / "l.sqlite3"
    Ledger.open(path).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    wide = tmp_path / "wide.sqlite3"
    wide.touch(mode=0o644)
    wide.chmod(0o644)
    Ledger.open(wide).close()
    assert stat.S_IMODE(wide.stat().st_mode) == 0o600


def test_a_dead_or_reused_pid_is_interrupted_in_the_database(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite3"
    with Ledger.open(path, site="s") as lg:
        dead = lg.run_started("upgrade", "inv", hosts=["n1", "n2"], pid=2**31 - 2)
        reused = lg.run_started("run", "inv", hosts=["n3"])  # this process: alive...
        lg._db.execute("UPDATE runs SET proc = 'another-boot:1' WHERE id = ?", (reused,))  # ...but not the writer
        live = lg.run_started("run", "inv", hosts=["n4"])
        elsewhere = lg.run_started("run", "inv", hosts=["n5"], pid=2**31 - 2)
        lg._db.execute("UPDATE runs SET node = 'other-controller' WHERE id = ?", (elsewhere,))
    from provisioner.ledger.store import proc_token

    assert proc_token(os.getpid()) is not None
    with Ledger.open(path, site="s") as lg:  # the next open marks them
        raw = {r[0]: r[1] for r in lg._db.execute("SELECT id, status FROM runs")}
        assert raw == {dead: "interrupted", reused: "interrupted", live: "running", elsewhere: "running"}
        assert lg.host_outcomes(dead) == {h: {"host": h, "status": "interrupted", "changed": 0, "failed": 0}
                                          for h in ("n1", "n2")}
        assert lg.last_outcome("n3")[1] == "interrupted" and lg.last_outcome("n4")[1] == "running"  # type: ignore
    assert socket.gethostname() != "other-controller"


def test_a_locked_ledger_is_one_line_from_the_command(checkout: dict[str, object],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Another controller holds the write lock past the wait: `provision node` says so in one line, exit 1."""
    b, db, env = checkout["b"], checkout["db"], checkout["env"]
    real = Ledger.open.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(Ledger, "open", classmethod(lambda cls, path, **kw: real(cls, path, **{**kw, "timeout": 0.2})))
    Ledger.open(db).close()  # type: ignore[arg-type]
    other = sqlite3.connect(db, isolation_level=None)  # type: ignore[arg-type]
    other.execute("BEGIN IMMEDIATE")
    try:
        r = provision("node", str(b), "node01", "--state", "provisioning", "--reason", "x", env=env)  # type: ignore
    finally:
        other.execute("ROLLBACK")
    assert r.returncode == 1 and r.stdout == "", r.stdout
    assert r.stderr.splitlines() == [f"error: the ledger {db}: database is locked"], r.stderr


@pytest.mark.parametrize("args", [
    ("status", "{b}"),  # the fast path (no typer)
    ("status", "{b}", "-f", "json", "--nodes"),  # typer
    ("history", "node01", "--inventory", "{b}"),
    ("incidents", "{b}"),
    ("node", "{b}", "node01", "--state", "provisioning", "--reason", "x"),
    ("ledger", "adopt", "{b}"),
])
def test_a_ledger_newer_than_the_code_is_one_line_from_every_command(checkout: dict[str, object],
                                                                       args: tuple[str, ...]) -> None:
    """A ledger error is one `error:` line and exit 1 from the CLI itself, whichever command opened the ledger."""
    b, db, env = checkout["b"], checkout["db"], checkout["env"]
    Ledger.open(db).close()  # type: ignore[arg-type]
    with sqlite3.connect(db) as con:  # type: ignore[arg-type]
        con.execute("UPDATE schema_version SET version = ?", (VERSION + 1,))
    r = provision(*(a.format(b=b) for a in args), env=env)  # type: ignore[arg-type]
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert r.stderr.splitlines() == [f"error: the ledger {db} has schema version {VERSION + 1}, newer than this "
                                     f"provisioner ({VERSION}): upgrade provisioner"], r.stderr
    assert "Traceback" not in r.stdout + r.stderr
