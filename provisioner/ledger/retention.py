"""The ledger's retention: per-check rows older than a window become daily summaries, so a year of nightly runs over
a large fleet stays bounded (docs/lifecycle.md, Retention).

`compact(ledger, keep_days)` folds, for every finished run of the ledger's site that began before the window (UTC day
boundaries), its host outcomes, health results and drift items into `check_days` (one row per site, day, host and
command: counts per outcome, the failed checks, the number of drift items) and deletes them. Never touched: runs
themselves, lifecycle transitions, remediation steps, incidents, rollouts and recorded host states; nor a host's
newest outcome of each command (status, history and the health gate read it, however old). Idempotent: a second
pass finds nothing left to fold. One transaction per run folded: an interrupted pass leaves whole runs.

Bounded over years, in the same pass: daily summaries older than `summary_days` are rolled into one row per host,
UTC month and command (`day` = `YYYY-MM`) for the host-months with a non-ok outcome (clean host-months leave no
row), and monthly rows older than `archive_days` are dropped. So the per-host rows stop growing: at most
`summary_days - keep_days` days of daily rows, plus the non-ok host-months of `archive_days`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

#: The window kept in full by default (days); `provision ledger compact --keep-days`, drift_ledger_keep_days.
DEFAULT_KEEP_DAYS = 90
#: Daily summaries kept (days from now); older ones become monthly rows (`--summary-days`).
DEFAULT_SUMMARY_DAYS = 180
#: Monthly rows kept (days from now); older ones are dropped (`--archive-days`).
DEFAULT_ARCHIVE_DAYS = 1096


@dataclass
class Compacted:
    runs: int = 0
    outcomes: int = 0
    health: int = 0
    drift: int = 0
    summaries: int = 0
    cutoff: float = 0.0
    rolled: int = 0  # daily summaries rolled into months (or dropped: clean host-months)
    months: int = 0  # monthly rows written or added to
    expired: int = 0  # monthly rows past archive_days, dropped


def cutoff_of(now: float, keep_days: int) -> float:
    """The window's start: the UTC midnight `keep_days` days before `now`'s day (whole days are folded)."""
    return float((int(now // 86400) - keep_days) * 86400)


def day_of(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d")


def _bucket(status: str) -> int:
    """Index of an outcome's counter: ok, changed, drift, failed (every other)."""
    return {"ok": 0, "changed": 1, "drift": 2}.get(status, 3)


def compact(ledger: Any, keep_days: int = DEFAULT_KEEP_DAYS, *, now: float | None = None,
            summary_days: int = DEFAULT_SUMMARY_DAYS, archive_days: int = DEFAULT_ARCHIVE_DAYS) -> Compacted:
    """Fold the per-check rows of the site's runs older than `keep_days` into check_days, roll daily summaries older
    than `summary_days` into months, drop months older than `archive_days` (see the module doc)."""
    if keep_days < 1:
        raise ValueError(f"keep_days must be at least 1, got {keep_days}")
    if not keep_days <= summary_days <= archive_days:
        raise ValueError(f"need keep_days <= summary_days <= archive_days, got {keep_days}, {summary_days}, "
                         f"{archive_days}")
    now = time.time() if now is None else now
    out = Compacted(cutoff=cutoff_of(now, keep_days))
    _fold_runs(ledger, out)
    with ledger._tx() as tx:
        _roll_months(tx, ledger.site, day_of(cutoff_of(now, summary_days)), day_of(cutoff_of(now, archive_days)),
                     out)
    return out


def _roll_months(db: Any, site: str, daily_before: str, monthly_before: str, out: Compacted) -> None:
    """Daily rows before `daily_before` (YYYY-MM-DD) -> one row per host, month and command when not all ok; monthly
    rows of months before `monthly_before`'s month are dropped."""
    rows = db.execute(
        "SELECT host, command, day, runs, ok, changed, drift, failed, failed_checks, drift_items FROM check_days "
        "WHERE site = ? AND length(day) = 10 AND day < ?", (site, daily_before)).fetchall()
    months: dict[tuple[str, str, str], list[Any]] = {}
    for host, command, day, *counts, checks, items in rows:
        m = months.setdefault((str(host), str(command), str(day)[:7]), [0, 0, 0, 0, 0, set(), 0])
        for i, v in enumerate(counts):
            m[i] += int(v)
        m[5].update(c for c in str(checks or "").split(",") if c)
        m[6] += int(items)
    out.rolled += len(rows)
    keep = [(site, month, host, command, *m[:5], ",".join(sorted(m[5])), m[6])
            for (host, command, month), m in sorted(months.items()) if m[2] + m[3] + m[4] + m[6]]
    if keep:
        db.executemany(
            "INSERT INTO check_days (site, day, host, command, runs, ok, changed, drift, failed, failed_checks, "
            "drift_items) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (site, day, host, command) DO UPDATE "
            "SET runs = check_days.runs + excluded.runs, ok = check_days.ok + excluded.ok, "
            "changed = check_days.changed + excluded.changed, drift = check_days.drift + excluded.drift, "
            "failed = check_days.failed + excluded.failed, "
            "drift_items = check_days.drift_items + excluded.drift_items, "
            "failed_checks = CASE WHEN check_days.failed_checks = '' THEN excluded.failed_checks "
            "WHEN excluded.failed_checks = '' THEN check_days.failed_checks "
            "ELSE check_days.failed_checks || ',' || excluded.failed_checks END", keep)
        out.months += len(keep)
    if rows:
        db.execute("DELETE FROM check_days WHERE site = ? AND length(day) = 10 AND day < ?", (site, daily_before))
    cur = db.execute("DELETE FROM check_days WHERE site = ? AND length(day) = 7 AND day < ?",
                     (site, monthly_before[:7]))
    out.expired += max(int(cur.rowcount or 0), 0)


def _fold_runs(ledger: Any, out: Compacted) -> None:
    db = ledger._db
    site = ledger.site
    old = db.execute("SELECT id, command, started FROM runs WHERE site = ? AND started < ? AND ended IS NOT NULL "
                     "AND (EXISTS (SELECT 1 FROM host_outcomes WHERE run = runs.id) "
                     "OR EXISTS (SELECT 1 FROM health_results WHERE run = runs.id) "
                     "OR EXISTS (SELECT 1 FROM drift_items WHERE run = runs.id)) ORDER BY id",
                     (site, out.cutoff)).fetchall()
    if not old:
        return
    # each host's newest run of each command stays whole (only old runs can hold it: a host's last drift a year ago)
    newest: set[tuple[str, int]] = {
        (r[0], int(r[1])) for r in db.execute(
            "SELECT o.host, MAX(o.run) FROM host_outcomes o JOIN runs r ON r.id = o.run WHERE r.site = ? "
            "GROUP BY o.host, r.command", (site,))}
    for run_id, command, started in ((int(r[0]), str(r[1]), float(r[2])) for r in old):
        with ledger._tx() as tx:
            _fold(tx, site, run_id, command, day_of(started), newest, out)


def _fold(db: Any, site: str, run: int, command: str, day: str, newest: set[tuple[str, int]],
          out: Compacted) -> None:
    counts: dict[str, list[int]] = {}
    for host, status in db.execute("SELECT host, status FROM host_outcomes WHERE run = ?", (run,)).fetchall():
        if (host, run) not in newest:
            counts.setdefault(host, [0, 0, 0, 0])[_bucket(str(status))] += 1
    failed: dict[str, set[str]] = {}
    health_rows = 0
    for host, check, result in db.execute('SELECT host, "check", result FROM health_results WHERE run = ?',
                                          (run,)).fetchall():
        if (host, run) in newest:
            continue
        health_rows += 1
        if result == "fail":
            failed.setdefault(host, set()).add(str(check))
    items: dict[str, int] = {}
    for host, n in db.execute("SELECT host, COUNT(*) FROM drift_items WHERE run = ? GROUP BY host",
                              (run,)).fetchall():
        if (host, run) not in newest:
            items[host] = int(n)
    hosts = sorted(set(counts) | set(failed) | set(items))
    if not hosts:  # only some host's newest outcome is left in it
        return
    db.executemany(
        "INSERT INTO check_days (site, day, host, command, runs, ok, changed, drift, failed, failed_checks, "
        "drift_items) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (site, day, host, command) DO UPDATE SET "
        "runs = check_days.runs + excluded.runs, ok = check_days.ok + excluded.ok, "
        "changed = check_days.changed + excluded.changed, drift = check_days.drift + excluded.drift, "
        "failed = check_days.failed + excluded.failed, drift_items = check_days.drift_items + excluded.drift_items, "
        "failed_checks = CASE WHEN check_days.failed_checks = '' THEN excluded.failed_checks "
        "WHEN excluded.failed_checks = '' THEN check_days.failed_checks "
        "ELSE check_days.failed_checks || ',' || excluded.failed_checks END",
        [(site, day, h, command, 1 if h in counts else 0, *(counts.get(h) or (0, 0, 0, 0)),
          ",".join(sorted(failed.get(h, ()))), items.get(h, 0)) for h in hosts])
    out.runs += 1
    out.summaries += len(hosts)
    out.outcomes += sum(sum(c) for c in counts.values())
    out.health += health_rows
    out.drift += sum(items.values())
    kept = any(r == run for _, r in newest)
    for table in ("host_outcomes", "health_results", "drift_items"):  # fixed table names
        if kept:  # some host's newest outcome: only the others' rows go
            db.executemany(f"DELETE FROM {table} WHERE run = ? AND host = ?", [(run, h) for h in hosts])  # noqa: S608
        else:
            db.execute(f"DELETE FROM {table} WHERE run = ?", (run,))  # noqa: S608


def days(ledger: Any, host: str, limit: int = 400) -> list[dict[str, Any]]:
    """A host's daily summaries (newest day first): what `provision history` shows beyond the window."""
    rows = ledger._db.execute(
        "SELECT day, command, runs, ok, changed, drift, failed, failed_checks, drift_items FROM check_days "
        "WHERE site = ? AND host = ? ORDER BY day DESC, command LIMIT ?", (ledger.site, host, limit)).fetchall()
    return [{"day": r[0], "command": r[1], "runs": r[2], "ok": r[3], "changed": r[4], "drift": r[5],
             "failed": r[6], "failed_checks": list(dict.fromkeys(c for c in str(r[7]).split(",") if c)),
             "drift_items": r[8]}
            for r in rows]
