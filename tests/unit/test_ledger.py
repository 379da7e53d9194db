"""The ledger (provisioner/ledger/): schema migrations, WAL, runs and their outcomes, a killed run reading
`interrupted`, transitions, and the runner's recording hook on a constructed RunResult."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from provisioner.ledger import Ledger, LedgerError
from provisioner.ledger import schema as ledger_schema
from provisioner.ledger.record import Recorder, record_health, record_result, run_status
from provisioner.ledger.site import path_site
from provisioner.results import DriftItem, RunResult

DEAD_PID = 2**31 - 2  # above any pid_max: no such process


def test_open_creates_the_schema_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "ledger.sqlite3"
    with Ledger.open(path) as lg:
        assert lg.version == ledger_schema.VERSION
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"schema_version", "runs", "host_outcomes", "health_results", "drift_items", "transitions"} <= tables
    assert db.execute("SELECT COUNT(*) FROM schema_version").fetchone()[0] == 1


def test_reopening_keeps_data_and_version(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite3"
    with Ledger.open(path) as lg:
        lg.record_transition("n1", "new", "provisioning", reason="r", actor="t")
    with Ledger.open(path) as lg:
        assert lg.version == ledger_schema.VERSION and lg.state("n1")[0] == "provisioning"


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite3"
    Ledger.open(path).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE schema_version SET version = 999")
    db.commit()
    db.close()
    with pytest.raises(LedgerError, match="schema version 999, newer"):
        Ledger.open(path)


def test_a_failing_migration_leaves_the_database_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "l.sqlite3"
    Ledger.open(path).close()
    steps = (*ledger_schema.MIGRATIONS, "CREATE TABLE extra (x INTEGER);\nTHIS IS NOT SQL;")
    monkeypatch.setattr("provisioner.ledger.store.MIGRATIONS", steps)
    monkeypatch.setattr("provisioner.ledger.store.VERSION", len(steps))
    with pytest.raises(LedgerError):
        Ledger.open(path)
    db = sqlite3.connect(path)
    assert db.execute("SELECT version FROM schema_version").fetchone()[0] == ledger_schema.VERSION
    assert not db.execute("SELECT name FROM sqlite_master WHERE name = 'extra'").fetchall()  # rolled back


def test_a_run_never_closed_reads_interrupted_once_its_process_is_gone(tmp_path: Path) -> None:
    with Ledger.open(tmp_path / "l.sqlite3") as lg:
        alive = lg.run_started("run", "inv")  # this process: still running
        killed = lg.run_started("run", "inv", pid=DEAD_PID)
        done = lg.run_started("run", "inv", pid=DEAD_PID)
        lg.run_finished(done, "ok", hosts=[{"host": "n1", "status": "ok"}])
        assert lg.run(alive).status == "running"
        assert lg.run(killed).status == "interrupted" and lg.run(killed).ended is None
        hosts = lg.run_started("run", "inv", pid=DEAD_PID, hosts=["n7"])
        assert lg.last_outcome("n7") == (lg.run(hosts), "interrupted")
        assert lg.run(done).status == "ok"


def test_run_finished_is_one_transaction(tmp_path: Path) -> None:
    with Ledger.open(tmp_path / "l.sqlite3") as lg:
        run = lg.run_started("run", "inv")
        with pytest.raises(LedgerError):  # the second row breaks a constraint: nothing of the run is written
            lg.run_finished(run, "ok", hosts=[{"host": "n1", "status": "ok"}, {"host": None, "status": "ok"}])
        assert lg.host_outcomes(run) == {} and lg.run(run).ended is None


def test_transitions_and_states(tmp_path: Path) -> None:
    with Ledger.open(tmp_path / "l.sqlite3") as lg:
        assert lg.state("n1") == ("new", None)
        lg.record_transition("n1", "new", "provisioning", reason="rack day", actor="t", at=10.0)
        lg.record_transition("n1", "provisioning", "burn-in", reason="ok", actor="t", at=20.0)
        assert lg.state("n1") == ("burn-in", 20.0) and lg.states() == {"n1": ("burn-in", 20.0)}
        assert [t.to_state for t in lg.transitions("n1")] == ["provisioning", "burn-in"]
        with pytest.raises(LedgerError, match="n1 is burn-in now, not new"):  # a stale view is refused
            lg.record_transition("n1", "new", "provisioning", reason="again", actor="t")


def result_with(tmp_path: Path) -> RunResult:
    r = RunResult(command="drift", inventory="inv.ini", playbook="site.yml", run_dir=str(tmp_path / "run"),
                  artifact_dir="a", started=1000.0, duration=5.0, check=True, status="successful", rc=0,
                  targeted=["n1", "n2"])
    for name in ("n1", "n2"):
        r.host(name).seen = True
        r.host(name).ok = 3
    r.host("n2").changed = 1
    r.host("n2").drift.append(DriftItem(host="n2", task="t", kind="file", resource="/etc/x"))
    return r


def test_record_result_writes_the_run_outcomes_and_drift(tmp_path: Path) -> None:
    result = result_with(tmp_path)
    assert run_status(result) == "drift"
    with Ledger.open(tmp_path / "l.sqlite3") as lg:
        run = record_result(lg, result)
        row = lg.run(run)
        assert (row.command, row.status, row.started, row.ended, row.run_dir) == (
            "drift", "drift", 1000.0, 1005.0, str(tmp_path / "run"))
        assert lg.host_outcomes(run)["n2"] == {"host": "n2", "status": "changed", "changed": 1, "failed": 0}
        assert lg.drift_items(run) == [("n2", "file:/etc/x")]
        assert lg.last_outcome("n1")[1] == "ok"


def test_failed_and_error_runs(tmp_path: Path) -> None:
    r = result_with(tmp_path)
    r.host("n1").failed = 1
    r.rc, r.status = 2, "failed"
    assert run_status(r) == "failed"
    r.error = "syntax error"
    assert run_status(r) == "error"


def test_recorder_opens_at_the_run_dir_and_closes_with_the_result(tmp_path: Path) -> None:
    seen: list[Path] = []
    rec = Recorder("run", "inv.ini", seen.append, ["n1", "n2"], path=tmp_path / "l.sqlite3")
    rec.on_run_dir(tmp_path / "run")
    assert seen == [tmp_path / "run"]
    with Ledger.open(tmp_path / "l.sqlite3", site=path_site("inv.ini")) as lg:  # an unreadable inventory: its path
        assert lg.run(rec.run).status == "running"  # a kill here leaves it to read `interrupted`
        assert lg.last_outcome("n2")[1] == "running"
    result = result_with(tmp_path)
    result.check = False
    assert rec.finish(result) is result
    with Ledger.open(tmp_path / "l.sqlite3", site=path_site("inv.ini")) as lg:
        assert lg.run(rec.run).status == "ok" and set(lg.host_outcomes(rec.run)) == {"n1", "n2"}
        assert len(lg.runs()) == 1


def test_recorder_defaults_beside_the_run_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PROVISION_LEDGER", raising=False)
    rec = Recorder("run", "inv.ini")
    (tmp_path / "runs").mkdir()
    rec.on_run_dir(tmp_path / "runs" / "20261202T000000Z-run")
    assert rec.path == tmp_path / "runs" / "ledger.sqlite3" and rec.path.exists()


def test_a_ledger_failure_is_one_warning_and_never_fails_the_run(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    rec = Recorder("run", "inv.ini", path=blocker / "ledger.sqlite3")  # under a file: cannot be created
    rec.on_run_dir(tmp_path / "run")
    result = result_with(tmp_path)
    assert rec.finish(result) is result
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("warning: ledger not updated:")


class _Health:
    def __init__(self, ok: bool, checks: list[dict[str, str]], reachable: bool = True) -> None:
        self.ok, self.checks, self.reachable, self.error = ok, checks, reachable, None


def test_record_health(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite3"
    run = record_health({"n1": _Health(True, [{"check": "ecc", "status": "pass"}]),
                         "n2": _Health(False, [{"check": "ecc", "status": "fail", "message": "row remap pending"}])},
                        "inv.ini", started=50.0, seconds=2.0, path=path)
    assert run is not None
    with Ledger.open(path, site=path_site("inv.ini")) as lg:
        assert lg.run(run).status == "failed" and lg.run(run).command == "health"
        assert lg.host_outcomes(run)["n1"]["status"] == "ok"
        assert lg.health("n2") == [{"run": run, "host": "n2", "check": "ecc", "result": "fail",
                                    "detail": "row remap pending"}]


def test_env_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from provisioner.paths import ledger_path

    monkeypatch.setenv("PROVISION_LEDGER", str(tmp_path / "x.sqlite3"))
    assert ledger_path() == tmp_path / "x.sqlite3"
    monkeypatch.delenv("PROVISION_LEDGER")
    monkeypatch.setenv("PROVISION_RUNS_DIR", str(tmp_path / "runs"))
    assert ledger_path() == tmp_path / "runs" / "ledger.sqlite3"
    assert os.environ.get("PROVISION_LEDGER") is None


def test_run_playbook_records_through_its_hook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hook's wiring in provisioner.runner.run_playbook: the row opens at the run directory (before Ansible)
    and closes with the result that execute returns (execute stubbed: no Ansible here)."""
    import provisioner.runner as runner

    monkeypatch.setenv("PROVISION_LEDGER", str(tmp_path / "l.sqlite3"))
    result = result_with(tmp_path)
    result.command, result.check = "run", False
    seen: list[str] = []

    def fake_execute(config, *, progress=None, on_event=None, on_run_dir=None, fleet=None):  # type: ignore[no-untyped-def]
        on_run_dir(tmp_path / "run")
        with Ledger.open(tmp_path / "l.sqlite3", site=path_site(tmp_path / "inv.ini")) as lg:
            seen.append(lg.runs()[0].status)
        return result

    monkeypatch.setattr(runner, "execute", fake_execute)
    got = runner.run_playbook(tmp_path / "inv.ini", command="run", on_run_dir=lambda d: seen.append(d.name))
    assert got is result and seen == ["run", "running"]
    with Ledger.open(tmp_path / "l.sqlite3", site=path_site(tmp_path / "inv.ini")) as lg:
        (run,) = lg.runs()
        assert (run.command, run.status, run.run_dir) == ("run", "ok", str(tmp_path / "run"))
        assert set(lg.host_outcomes(run.id)) == {"n1", "n2"}
