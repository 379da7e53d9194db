"""The ledger on a real PostgreSQL server (Debian's `postgresql` package; the test runs its own cluster on
127.0.0.1 with a password): the schema migrates, every write and read the commands use, upserts, the lifecycle's
check-and-write under two racing controllers, and the CLI with `PROVISION_LEDGER=postgresql://...` (the password in no
output, a wrong one a one-line error)."""

from __future__ import annotations

import glob
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from provisioner.ledger import Ledger, LedgerError
from provisioner.ledger.schema import VERSION

PASSWORD = "pg-secret-4711"
INI = "[gpu_nodes]\nn1 ansible_host=127.0.0.1 ansible_port=1\nn2 ansible_host=127.0.0.1 ansible_port=1\n"


def _as_postgres(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    assert bins, "no PostgreSQL server: install Debian's postgresql package (.ci/install-deps.sh)"
    bindir = Path(bins[-1]).parent
    d = Path(tempfile.mkdtemp(prefix="provisioner-pg-"))
    if os.geteuid() == 0:
        shutil.chown(d, "postgres", "postgres")
    pw = d / "pw"
    pw.write_text(PASSWORD + "\n")
    if os.geteuid() == 0:
        shutil.chown(pw, "postgres", "postgres")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = d / "data"
    subprocess.run(_as_postgres([str(bindir / "initdb"), "-D", str(data), "-U", "provisioner", "--pwfile", str(pw),
                                 "--auth=scram-sha-256", "-E", "UTF8"]), check=True, capture_output=True)
    subprocess.run(_as_postgres([str(bindir / "pg_ctl"), "-D", str(data), "-l", str(d / "log"), "-w", "-o",
                                 f"-k {d} -p {port} -c listen_addresses=127.0.0.1", "start"]),
                   check=True, capture_output=True)
    try:
        yield f"postgresql://provisioner:{PASSWORD}@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(_as_postgres([str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]),
                       capture_output=True)
        shutil.rmtree(d, ignore_errors=True)


def test_schema_writes_and_reads(pg_url: str) -> None:
    with Ledger.open(pg_url, site="api") as lg:
        assert lg.version == VERSION
        run = lg.run_started("run", "inv.ini", run_dir="/tmp/r", hosts=["n1", "n2"])
        assert lg.run(run).status == "running"  # type: ignore[union-attr]
        lg.run_finished(run, "ok", hosts=[{"host": "n1", "status": "changed", "changed": 3},
                                          {"host": "n2", "status": "failed", "failed": 1}],
                        drift=[("n1", "file:/etc/nccl.conf")])
        assert lg.host_outcomes(run)["n1"]["changed"] == 3 and lg.host_outcomes(run)["n2"]["status"] == "failed"
        assert lg.drift_items(run) == [("n1", "file:/etc/nccl.conf")]
        h = lg.run_started("health", "inv.ini", hosts=["n1"])
        lg.run_finished(h, "failed", hosts=[{"host": "n1", "status": "failed"}],
                        health=[("n1", "xid", "fail", "XID 79"), ("n1", "ecc", "pass", None)])
        lg.run_finished(h, "failed", health=[("n1", "xid", "fail", "XID 79, twice")])  # the same key: replaced
        assert [(r["check"], r["detail"]) for r in lg.health("n1")] == [("ecc", None), ("xid", "XID 79, twice")]
        assert lg.last_run_for("n1", "health")[0].id == h  # type: ignore[index]
        lg.put_states([("n1", run, "digest-1", {"file:/etc/nccl.conf": "sha256:ab"}, ["nccl_tuning"])])
        lg.put_states([("n1", run, "digest-2", {"file:/etc/nccl.conf": "sha256:cd"}, ["nccl_tuning"])])
        rec = lg.records(["n1", "n2"])
        assert rec["n1"].inputs == "digest-2"  # as given: keyed by the caller with lg.digest_key() (host_inputs)
        assert len(lg.digest_key()) == 32 and lg.digest_key() == lg.digest_key()
        assert list(rec) == ["n1"] and rec["n1"].roles == ("nccl_tuning",)
        assert rec["n1"].state == {"file:/etc/nccl.conf": "sha256:cd"}
        lg.full_drift_done("inv.ini", at=1.0)
        lg.full_drift_done("inv.ini", at=2.0)
        assert lg.last_full_drift("inv.ini") == 2.0
        lg.record_transition("n1", "new", "provisioning", reason="racked", actor="test")
        with pytest.raises(LedgerError, match="n1 is provisioning now, not new"):
            lg.record_transition("n1", "new", "provisioning", reason="again", actor="test")
        lg.record_step("n1", "reboot", "done", actor="test", detail="back")
        assert lg.state("n1")[0] == "provisioning" and lg.remediations("n1")[0].step == "reboot"
        # a run whose controller process is gone reads interrupted
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        killed = lg.run(lg.run_started("drift", "inv.ini", pid=dead.pid))
        assert killed is not None and killed.status == "interrupted"
    with Ledger.open(pg_url, site="api") as lg:  # reopening migrates nothing again
        assert lg.version == VERSION and lg.state("n1")[0] == "provisioning"


def test_two_controllers_racing_for_one_transition_one_wins(pg_url: str) -> None:
    results: list[str] = []
    start = threading.Barrier(2)

    def controller(name: str) -> None:
        with Ledger.open(pg_url, site="api") as lg:
            start.wait()
            try:
                lg.record_transition("n2", "new", "provisioning", reason=name, actor=name)
                results.append("won")
            except LedgerError as exc:
                results.append(str(exc))

    threads = [threading.Thread(target=controller, args=(f"c{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["n2 is provisioning now, not new (changed meanwhile): look again", "won"]
    with Ledger.open(pg_url, site="api") as lg:
        assert [t.to_state for t in lg.transitions("n2")] == ["provisioning"]


def _cli(*args: str, ledger: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PROVISION_LEDGER": ledger, "PROVISION_RUNS_DIR": str(cwd / "runs")}
    return subprocess.run([str(Path(sys.executable).parent / "provision"), *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=120)


def test_the_commands_on_a_postgresql_ledger(pg_url: str, tmp_path: Path) -> None:
    inv = tmp_path / "hosts.ini"
    inv.write_text(INI)
    p = _cli("node", str(inv), "n2", "--state", "provisioning", "--reason", "racked", ledger=pg_url, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr  # its own site: the API tests' n2 above is another host
    p = _cli("node", str(inv), "n2", "--state", "burn-in", "--reason", "cabled", ledger=pg_url, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    p = _cli("status", str(inv), "--format", "json", ledger=pg_url, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    states = {h["host"]: h["state"] for h in json.loads(p.stdout)["hosts"]}
    assert states["n2"] == "burn-in"
    p2 = _cli("history", "n2", "-i", str(inv), "--format", "json", ledger=pg_url, cwd=tmp_path)
    assert p2.returncode == 0 and "cabled" in p2.stdout, p2.stdout + p2.stderr
    bad = _cli("status", str(inv), ledger=pg_url.replace(PASSWORD, "wrong"), cwd=tmp_path)
    assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert "cannot open the ledger postgresql://provisioner:***@127.0.0.1" in bad.stderr
    assert "Traceback" not in bad.stderr
    for out in (p.stdout, p.stderr, p2.stdout, p2.stderr, bad.stdout, bad.stderr):
        assert PASSWORD not in out and "wrong" not in out
    assert not (tmp_path / "runs" / "ledger.sqlite3").exists()  # nothing went to a file


def test_two_drains_of_a_models_two_clusters_one_is_refused(pg_url: str, tmp_path: Path) -> None:
    """The last-cluster guard across two real `provision drain` processes on PostgreSQL (issue 43; the harness:
    tests/support/ledger_race.py): while A is held between its check and its write, B is seen waiting for the
    advisory lock in pg_locks; released, A drains c1 and B, seeing it, is refused."""
    import psycopg
    from inventory_factory import write_inventory
    from ledger_race import GROUP_VARS, race, seed_serving, states
    from ledger_race import INI as RACE_INI

    inv = write_inventory(tmp_path / "inv", ini=RACE_INI, group_vars=GROUP_VARS, base=False)
    seed_serving(pg_url, inv)

    def b_waits_for_the_lock() -> bool:
        with psycopg.connect(pg_url, autocommit=True) as c:
            return bool(c.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
                        .fetchone()[0])  # type: ignore[index]

    a, b, how = race(tmp_path, inv, pg_url, blocked=b_waits_for_the_lock)
    assert "node01: in-service -> draining (race A)" in a.stdout, a.stdout + a.stderr
    drained = states(pg_url, inv)
    assert drained["node02"] == "in-service", f"both clusters of the model drained without --force: {drained}"
    assert how == "locking", "B made its check while A was between its check and its write"
    assert b.returncode == 1 and b.stderr.strip().splitlines() == [
        "refused: node02: cluster c2 is the last one serving /models/tiny: draining it stops the model "
        "(add --force to drain it anyway)"], b.stdout + b.stderr
    assert states(pg_url, inv)["node02"] == "in-service"
    for out in (a.stdout, a.stderr, b.stdout, b.stderr):
        assert PASSWORD not in out and "Traceback" not in out


def test_a_ledger_from_before_sites_migrates_and_is_adopted(pg_url: str) -> None:
    """A PostgreSQL ledger at schema version 5 (before sites): migration 6 keeps its runs and transitions, unowned
    (site ''), drops the recorded states (plain digests); `adopt` gives them to one site."""
    import psycopg

    from provisioner.ledger import pg
    from provisioner.ledger.schema import MIGRATIONS
    from provisioner.ledger.store import _statements

    with psycopg.connect(pg_url, autocommit=True) as c:
        c.execute("DROP DATABASE IF EXISTS v5")
        c.execute("CREATE DATABASE v5")
    url = pg_url.rsplit("/", 1)[0] + "/v5"
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        for step in MIGRATIONS[:5]:
            for stmt in _statements(step):
                c.execute(pg.ddl(stmt))
        c.execute("INSERT INTO schema_version VALUES (5)")
        c.execute("INSERT INTO runs (command, inventory, started, ended, status) VALUES ('run', 'hosts.ini', 1, 2, "
                  "'ok')")
        c.execute("INSERT INTO transitions (host, from_state, to_state, reason, at, actor) VALUES ('n1', 'new', "
                  "'provisioning', 'x', 3, 't')")
        c.execute("INSERT INTO host_state (host, run, recorded, inputs, digest, state) VALUES ('n1', NULL, 4, "
                  "'plain', 'd', '\\x00')")
    with Ledger.open(url, site="rack-a") as lg:
        assert lg.version == VERSION and lg.unowned() == 2 and lg.state("n1")[0] == "new"
        with pytest.raises(LedgerError, match="provision ledger adopt"):
            lg.require_owned()
        assert lg._db.execute("SELECT COUNT(*) FROM host_state").fetchone()[0] == 0
        assert lg.adopt() == {"runs": 1, "transitions": 1, "remediations": 0, "rollouts": 0}
        assert lg.state("n1")[0] == "provisioning" and [r.id for r in lg.runs()] == [1] and lg.unowned() == 0
        lg.require_owned()
    with Ledger.open(url, site="rack-b") as lg:
        assert lg.state("n1")[0] == "new" and lg.runs() == []
        assert [s["site"] for s in lg.sites()] == ["rack-a"]


def test_two_upgrades_started_at_once_the_second_is_refused_naming_the_first(pg_url: str, tmp_path: Path) -> None:
    """`provision upgrade` twice at once on PostgreSQL (tests/support/rollout_race.py): while A is held between its
    open-rollout check and its claim, B is seen waiting for the advisory lock; released, A records its rollout and B,
    seeing it running, is refused in one line naming it."""
    import psycopg
    import rollout_race
    import two_clusters

    inv = two_clusters.write(tmp_path / "inv")

    def b_waits_for_the_lock() -> bool:
        with psycopg.connect(pg_url, autocommit=True) as c:
            return bool(c.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
                        .fetchone()[0])  # type: ignore[index]

    a, b, how = rollout_race.race(tmp_path, inv, pg_url, blocked=b_waits_for_the_lock)
    with Ledger.open(pg_url, site=str(inv.resolve())) as lg:
        rollouts = lg.rollouts()
    assert len(rollouts) == 1, f"two rollouts started at once: {[(r.id, r.status) for r in rollouts]}"
    assert how == "locking" and a.returncode == 0, a.stdout + a.stderr
    assert b.returncode == 1 and b.stderr.strip().splitlines() == [
        f"refused: rollout {rollouts[0].id} of {inv} is running (pid {rollouts[0].pid} on {rollouts[0].node})"], \
        b.stdout + b.stderr
    for out in (a.stdout, a.stderr, b.stdout, b.stderr):
        assert PASSWORD not in out and "Traceback" not in out
def test_day2_records_and_one_alert_key_claimed_once(pg_url: str) -> None:
    """Schema 7 on PostgreSQL: the same exercise as on SQLite (tests/support/day2_ledger.py), another site sees none
    of it, and two controllers claiming one alert key act once (the advisory lock)."""
    from tests.support.day2_ledger import exercise, other_site_sees_nothing, race_alert_key

    with Ledger.open(pg_url, site="day2-a") as lg:
        exercise(lg)
    with Ledger.open(pg_url, site="day2-b") as lg:
        other_site_sees_nothing(lg)
    assert race_alert_key(lambda: Ledger.open(pg_url, site="day2-a"), "fp:race") == [False, True]
