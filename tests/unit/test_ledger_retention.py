"""The ledger's retention (provisioner/ledger/retention.py): per-check rows of runs older than the window become daily
summaries; transitions and each host's newest outcome per command are kept; a second pass changes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioner.ledger import Ledger
from provisioner.ledger.retention import compact, cutoff_of, day_of, days

DAY = 86400.0
NOW = 1_800_000_000.0  # 2027-01-15


def _health(lg: Ledger, at: float, results: dict[str, list[tuple[str, str]]]) -> int:
    run = lg.run_started("health", "inv", started=at, hosts=results)
    lg.run_finished(run, "ok", hosts=[{"host": h, "status": "ok" if all(r == "pass" for _, r in c) else "failed"}
                                      for h, c in results.items()],
                    health=[(h, c, r, None) for h, cs in results.items() for c, r in cs], ended=at + 60)
    return run


def _drift(lg: Ledger, at: float, items: dict[str, list[str]]) -> int:
    run = lg.run_started("drift", "inv", started=at, hosts=items)
    lg.run_finished(run, "drift", hosts=[{"host": h, "status": "drift" if i else "ok"} for h, i in items.items()],
                    drift=[(h, i) for h, its in items.items() for i in its], ended=at + 30)
    return run


def _count(lg: Ledger, table: str, run: int) -> int:
    return int(lg._db.execute(f"SELECT COUNT(*) FROM {table} WHERE run = ?", (run,)).fetchone()[0])  # noqa: S608


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger.open(tmp_path / "ledger.sqlite3", site="s")


def test_old_rows_become_daily_summaries_and_the_rest_is_kept(ledger: Ledger) -> None:
    h_old = _health(ledger, NOW - 200 * DAY, {"n1": [("gpu", "fail"), ("nccl", "pass")], "n2": [("gpu", "pass")]})
    h_mid = _health(ledger, NOW - 100 * DAY, {"n1": [("gpu", "pass")], "n2": [("gpu", "pass")]})
    h_new = _health(ledger, NOW - 5 * DAY, {"n1": [("gpu", "pass")]})
    d_old = _drift(ledger, NOW - 200 * DAY + 3600, {"n1": ["file:/etc/nccl.conf", "package:x"], "n2": []})
    d_new = _drift(ledger, NOW - 5 * DAY, {"n1": [], "n2": []})
    ledger.record_transition("n1", "new", "provisioning", reason="onboard", actor="t")

    done = compact(ledger, keep_days=30, summary_days=365, now=NOW)

    assert done.cutoff == cutoff_of(NOW, 30) and done.runs == 3  # h_old, h_mid, d_old
    assert (done.outcomes, done.health, done.drift) == (5, 4, 2)
    for run in (h_old, d_old):  # folded whole
        assert all(_count(ledger, t, run) == 0 for t in ("host_outcomes", "health_results", "drift_items"))
    # n2's newest health pass is h_mid (100 days old): kept, so status and the health gate still see it
    assert ledger.host_outcomes(h_mid) == {"n2": {"host": "n2", "status": "ok", "changed": 0, "failed": 0}}
    assert ledger.last_run_for("n2", "health")[0].id == h_mid  # type: ignore[index]
    for run in (h_new, d_new):  # inside the window: untouched
        assert _count(ledger, "host_outcomes", run) >= 1
    assert [t.to_state for t in ledger.transitions("n1")] == ["provisioning"]
    assert ledger.run(h_old) is not None  # the runs themselves stay

    old_day = day_of(NOW - 200 * DAY)
    n1 = {(d["day"], d["command"]): d for d in days(ledger, "n1")}
    assert n1[(old_day, "health")] == {"day": old_day, "command": "health", "runs": 1, "ok": 0, "changed": 0,
                                       "drift": 0, "failed": 1, "failed_checks": ["gpu"], "drift_items": 0}
    assert n1[(old_day, "drift")]["drift"] == 1 and n1[(old_day, "drift")]["drift_items"] == 2
    assert n1[(day_of(NOW - 100 * DAY), "health")]["ok"] == 1
    assert {(d["day"], d["command"]) for d in days(ledger, "n2")} == {(old_day, "health"), (old_day, "drift")}

    from provisioner.ledger.view import history

    assert history(ledger, "n1")["days"] == days(ledger, "n1")  # `provision history` shows them
    again = compact(ledger, keep_days=30, summary_days=365, now=NOW)  # idempotent: nothing left to fold
    assert again.runs == 0 and days(ledger, "n1") == list(n1.values())


def test_a_newer_run_releases_a_kept_row_on_the_next_pass(ledger: Ledger) -> None:
    h_mid = _health(ledger, NOW - 100 * DAY, {"n2": [("gpu", "fail")]})
    compact(ledger, keep_days=30, summary_days=365, now=NOW)
    assert _count(ledger, "health_results", h_mid) == 1  # n2's newest
    _health(ledger, NOW - DAY, {"n2": [("gpu", "pass")]})
    done = compact(ledger, keep_days=30, summary_days=365, now=NOW)
    assert done.runs == 1 and _count(ledger, "health_results", h_mid) == 0
    assert days(ledger, "n2")[0]["failed_checks"] == ["gpu"]


def test_other_sites_are_not_touched(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite3"
    with Ledger.open(path, site="a") as a:
        ra = _drift(a, NOW - 200 * DAY, {"n1": []})
        _drift(a, NOW - DAY, {"n1": []})
    with Ledger.open(path, site="b") as b:
        assert compact(b, keep_days=30, now=NOW).runs == 0
    with Ledger.open(path, site="a") as a:
        assert _count(a, "host_outcomes", ra) == 1


def test_the_window_is_at_least_a_day(ledger: Ledger) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        compact(ledger, keep_days=0)


def _summary_rows(lg: Ledger) -> list[tuple[str, str, str]]:
    return [(str(r[0]), str(r[1]), str(r[2])) for r in lg._db.execute(
        "SELECT day, host, command FROM check_days WHERE site = ? ORDER BY day, host, command", (lg.site,))]


def test_old_summaries_roll_into_months_and_expire_so_years_stay_bounded(ledger: Ledger) -> None:
    # n1 fails a check on one night 300 days ago; n2 is clean every night; then a year goes by, compacted nightly
    for back in range(320, 280, -1):
        _health(ledger, NOW - back * DAY, {"n1": [("gpu", "fail" if back == 300 else "pass")], "n2": [("gpu", "pass")]})
        _drift(ledger, NOW - back * DAY + 600, {"n1": [], "n2": ["file:/etc/nccl.conf"] if back == 310 else []})
    ledger.record_transition("n1", "new", "provisioning", reason="onboard", actor="t")
    done = compact(ledger, keep_days=30, summary_days=100, archive_days=400, now=NOW)
    month = day_of(NOW - 300 * DAY)[:7]
    rows = _summary_rows(ledger)
    assert all(len(day) == 7 for day, _, _ in rows)  # every daily row is older than 100 days: rolled
    assert (month, "n1", "health") in rows and (day_of(NOW - 310 * DAY)[:7], "n2", "drift") in rows
    assert not any(h == "n2" and c == "health" for _, h, c in rows)  # clean host-months leave no row
    assert done.rolled > 0 and done.months == len(rows)
    n1 = {(d["day"], d["command"]): d for d in days(ledger, "n1")}
    assert n1[(month, "health")]["failed"] == 1 and n1[(month, "health")]["failed_checks"] == ["gpu"]
    assert n1[(month, "health")]["runs"] + sum(d["runs"] for (m, c), d in n1.items() if c == "health" and m != month
                                               ) <= 39  # the newest health run of each host stays whole

    # the rows left are bounded: a second pass changes nothing, and past archive_days they go, transitions stay
    assert _summary_rows(ledger) == rows and compact(ledger, keep_days=30, summary_days=100, archive_days=400,
                                                     now=NOW).months == 0
    later = compact(ledger, keep_days=30, summary_days=100, archive_days=400, now=NOW + 200 * DAY)
    assert later.expired == len(rows) and _summary_rows(ledger) == []
    assert [t.to_state for t in ledger.transitions("n1")] == ["provisioning"]


def test_the_windows_must_nest(ledger: Ledger) -> None:
    with pytest.raises(ValueError, match="summary_days"):
        compact(ledger, keep_days=90, summary_days=30, now=NOW)
