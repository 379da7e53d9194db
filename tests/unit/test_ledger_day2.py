"""The ledger's day-2 records on SQLite (schema 7): actions, alert keys, the breaker, incidents; a ledger at schema 6
migrates with its records kept. The same exercise runs on PostgreSQL in tests/integration/test_ledger_postgres.py."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from provisioner.ledger import Ledger
from provisioner.ledger import schema as ledger_schema
from tests.support.day2_ledger import exercise, other_site_sees_nothing, race_alert_key


def test_day2_records(tmp_path: Path) -> None:
    db = tmp_path / "l.sqlite3"
    with Ledger.open(db, site="rack-a") as lg:
        exercise(lg)
    with Ledger.open(db, site="rack-b") as lg:
        other_site_sees_nothing(lg)


def test_one_alert_key_claimed_by_two_controllers_acts_once(tmp_path: Path) -> None:
    db = tmp_path / "l.sqlite3"
    Ledger.open(db, site="s").close()
    assert race_alert_key(lambda: Ledger.open(db, site="s"), "fp:9") == [False, True]


def test_a_schema_6_ledger_migrates_to_7_keeping_its_records(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    db = tmp_path / "l.sqlite3"
    monkeypatch.setattr("provisioner.ledger.store.VERSION", 6)
    monkeypatch.setattr("provisioner.ledger.store.MIGRATIONS", ledger_schema.MIGRATIONS[:6])
    with Ledger.open(db, site="s") as lg:
        lg.record_transition("n1", "new", "provisioning", reason="racked", actor="t")
    assert "day2_actions" not in {r[0] for r in sqlite3.connect(db).execute(
        "SELECT name FROM sqlite_master WHERE type = 'table'")}
    monkeypatch.undo()
    with Ledger.open(db, site="s") as lg:
        assert lg.version == ledger_schema.VERSION == 9 and lg.state("n1")[0] == "provisioning"
        assert lg.incidents() == [] and lg.breaker() == (None, 0.0)
