"""The day-2 records of a ledger (schema 7) exercised the same way on SQLite (tests/unit/test_ledger_day2.py) and on
PostgreSQL (tests/integration/test_ledger_postgres.py): actions, alert keys, the breaker, incidents."""

from __future__ import annotations

import threading
from typing import Any

from provisioner.ledger import Ledger


def exercise(lg: Ledger) -> None:
    # actions: recorded, updated, filtered, site-scoped
    a = lg.record_action("n1", "quarantine", reason="xid: XID 79", source="alert", mode="recommend",
                         status="recommended", check="xid", cluster="c1", model="llama", alert_key="k1", at=100.0)
    b = lg.record_action("n2", "quarantine", reason="ib down", source="timer", mode="act", status="blocked",
                         rail="flap", detail="flap damping: 1 of 3", at=200.0)
    assert b > a
    got = lg.action(a)
    assert got is not None and (got.host, got.status, got.source, got.check, got.alert_key) == (
        "n1", "recommended", "alert", "xid", "k1")
    lg.action_done(a, "done", incident=7, decided_by="user:op")
    got = lg.action(a)
    assert got is not None and (got.status, got.incident, got.decided_by) == ("done", 7, "user:op")
    assert got.decided_at is not None
    assert [x.id for x in lg.actions()] == [a, b]
    assert [x.id for x in lg.actions(status="blocked")] == [b] and lg.actions(host="n9") == []
    assert [x.id for x in lg.actions(since=150.0)] == [b]
    assert [x.id for x in lg.actions(kinds=("quarantine",), statuses=("done", "failed"))] == [a]
    assert [x.id for x in lg.actions(limit=1)] == [b]
    # alert keys: one claim wins
    assert lg.claim_alert_key("fp:1", "n1") is True
    assert lg.claim_alert_key("fp:1", "n1") is False
    lg.alert_key_outcome("fp:1", "n1: quarantine")
    assert (lg.alert_key("fp:1") or {})["outcome"] == "n1: quarantine" and lg.alert_key("fp:2") is None
    # the breaker
    assert lg.breaker() == (None, 0.0)
    lg.breaker_event("open", "2 of 4 nodes", actor="policy:remediate", source="alert")
    ev, closed = lg.breaker()
    assert ev is not None and ev.why == "2 of 4 nodes" and closed == 0.0
    lg.breaker_event("closed", "rolled back", actor="user:op")
    ev, closed = lg.breaker()
    assert ev is None and closed > 0 and [e.state for e in lg.breaker_events()] == ["open", "closed"]
    # incidents
    i = lg.incident_opened("n1", cluster="c1", source="alert", cause="xid: XID 79", signal=10.0, detected=12.0)
    assert lg.open_incident("n1") is not None and lg.open_incident("n2") is None
    lg.incident_mark(i, "quarantined", at=13.0)
    lg.incident_mark(i, "drained", at=40.0)
    lg.incident_mark(i, "drained", at=99.0)  # the first time only
    lg.incident_step(i, "gpu_reset", "failed", at=50.0)
    lg.incident_step(i, "reboot", "done", at=80.0)
    lg.incident_mark(i, "returned", at=300.0)
    [inc] = lg.incidents()
    assert (inc.signal, inc.detected, inc.quarantined, inc.drained, inc.returned, inc.status) == (
        10.0, 12.0, 13.0, 40.0, 300.0, "returned")
    assert [(s["step"], s["outcome"]) for s in inc.steps] == [("gpu_reset", "failed"), ("reboot", "done")]
    assert lg.open_incident("n1") is None and lg.incidents(status="open") == []


def other_site_sees_nothing(lg: Ledger) -> None:
    assert lg.actions() == [] and lg.incidents() == [] and lg.breaker() == (None, 0.0)
    assert lg.alert_key("fp:1") is None and lg.claim_alert_key("fp:1", "n1") is True


def race_alert_key(open_ledger: Any, key: str) -> list[bool]:
    """Two controllers claim one alert key at once: [True, False] in some order."""
    start = threading.Barrier(2)
    out: list[bool] = []

    def one() -> None:
        with open_ledger() as lg:
            start.wait()
            out.append(lg.claim_alert_key(key, "n1"))

    ts = [threading.Thread(target=one) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sorted(out)
