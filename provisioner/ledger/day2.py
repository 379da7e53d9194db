"""The ledger's day-2 automation records (schema 7, issue 44): actions with source, mode and outcome, alert keys
acted on, the circuit breaker's events, and incidents. A mixin of `Ledger` (provisioner/ledger/store.py): every
read and write is of the ledger's site, every write one transaction."""

from __future__ import annotations

import json
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Action:
    id: int
    at: float
    host: str
    kind: str
    step: str | None
    check: str | None
    cluster: str | None
    model: str | None
    reason: str
    source: str
    mode: str
    status: str
    rail: str | None
    detail: str | None
    alert_key: str | None
    incident: int | None
    decided_by: str | None
    decided_at: float | None


@dataclass(frozen=True)
class BreakerEvent:
    at: float
    state: str  # open, closed
    why: str
    actor: str
    source: str | None


@dataclass(frozen=True)
class Incident:
    id: int
    host: str
    cluster: str | None
    source: str
    cause: str
    signal: float
    detected: float
    quarantined: float | None
    drained: float | None
    returned: float | None
    replaced: float | None
    status: str  # open, returned, replaced
    steps: tuple[dict[str, Any], ...] = field(default_factory=tuple)


def _action(r: Any) -> Action:
    return Action(r["id"], r["at"], r["host"], r["kind"], r["step"], r["check"], r["cluster"], r["model"], r["reason"],
                  r["source"], r["mode"], r["status"], r["rail"], r["detail"], r["alert_key"], r["incident"],
                  r["decided_by"], r["decided_at"])


def _incident(r: Any) -> Incident:
    try:
        steps = tuple(s for s in json.loads(r["steps"] or "[]") if isinstance(s, dict))
    except ValueError:
        steps = ()
    return Incident(r["id"], r["host"], r["cluster"], r["source"], r["cause"], r["signal"], r["detected"],
                    r["quarantined"], r["drained"], r["returned"], r["replaced"], r["status"], steps)


class Day2Records:
    """Mixed into `Ledger`: it provides `_db`, `_tx()` and `site`."""

    _db: Any
    site: str

    def _tx(self) -> AbstractContextManager[Any]:  # provided by Ledger
        raise NotImplementedError

    # -- actions ------------------------------------------------------------------------------------------------
    def record_action(self, host: str, kind: str, *, reason: str, source: str, mode: str, status: str,
                      step: str | None = None, check: str | None = None, cluster: str | None = None,
                      model: str | None = None, rail: str | None = None, detail: str | None = None,
                      alert_key: str | None = None, incident: int | None = None, at: float | None = None) -> int:
        when = time.time() if at is None else at
        with self._tx() as db:
            db.execute('INSERT INTO day2_actions (site, at, host, kind, step, "check", cluster, model, reason, source, '
                       "mode, status, rail, detail, alert_key, incident) VALUES "
                       "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (self.site, when, host, kind, step, check, cluster, model, reason[:1000], source, mode, status,
                        rail, (detail or None) and detail[:1000], alert_key, incident))
            row = db.execute("SELECT MAX(id) FROM day2_actions WHERE site = ?", (self.site,)).fetchone()
        return int(row[0])

    def action_done(self, action: int, status: str, *, detail: str | None = None, incident: int | None = None,
                    decided_by: str | None = None) -> None:
        sets, args = ["status = ?"], [status]  # type: list[str], list[Any]
        for col, val in (("detail", (detail or None) and detail[:1000]), ("incident", incident),
                         ("decided_by", decided_by)):
            if val is not None:
                sets.append(f"{col} = ?")
                args.append(val)
        if decided_by is not None:
            sets.append("decided_at = ?")
            args.append(time.time())
        with self._tx() as db:
            db.execute(f"UPDATE day2_actions SET {', '.join(sets)} WHERE id = ? AND site = ?",
                       (*args, action, self.site))

    def actions(self, *, host: str | None = None, status: str | None = None, since: float | None = None,
                kinds: tuple[str, ...] = (), statuses: tuple[str, ...] = (), limit: int = 500) -> list[Action]:
        """The newest `limit` actions matching, newest last."""
        q = "SELECT * FROM day2_actions WHERE site = ?"
        args: list[Any] = [self.site]
        for col, val in (("host", host), ("status", status)):
            if val is not None:
                q += f" AND {col} = ?"
                args.append(val)
        for col, vals in (("kind", kinds), ("status", statuses)):
            if vals:
                q += f" AND {col} IN ({', '.join('?' for _ in vals)})"
                args += list(vals)
        if since is not None:
            q += " AND at >= ?"
            args.append(since)
        rows = self._db.execute(q + " ORDER BY id DESC LIMIT ?", (*args, limit)).fetchall()
        return [_action(r) for r in reversed(rows)]

    def action(self, action: int) -> Action | None:
        r = self._db.execute("SELECT * FROM day2_actions WHERE id = ? AND site = ?", (action, self.site)).fetchone()
        return None if r is None else _action(r)

    # -- alert keys (idempotency) ---------------------------------------------------------------------------------
    def claim_alert_key(self, key: str, host: str | None) -> bool:
        """Claim `key` for this call (True) or say it was acted on already (False); one transaction, so two receivers
        given the same alert act once."""
        with self._tx() as db:
            if db.execute("SELECT 1 FROM alert_keys WHERE site = ? AND key = ?", (self.site, key)).fetchone():
                return False
            db.execute("INSERT INTO alert_keys (site, key, at, host, outcome) VALUES (?, ?, ?, ?, ?)",
                       (self.site, key, time.time(), host, "claimed"))
        return True

    def alert_key_outcome(self, key: str, outcome: str) -> None:
        with self._tx() as db:
            db.execute("UPDATE alert_keys SET outcome = ? WHERE site = ? AND key = ?", (outcome[:500], self.site, key))

    def alert_key(self, key: str) -> dict[str, Any] | None:
        r = self._db.execute("SELECT * FROM alert_keys WHERE site = ? AND key = ?", (self.site, key)).fetchone()
        return None if r is None else {"key": r["key"], "at": r["at"], "host": r["host"], "outcome": r["outcome"]}

    # -- the circuit breaker --------------------------------------------------------------------------------------
    def breaker_event(self, state: str, why: str, *, actor: str, source: str | None = None) -> None:
        with self._tx() as db:
            db.execute("INSERT INTO breaker_events (site, at, state, why, actor, source) VALUES (?, ?, ?, ?, ?, ?)",
                       (self.site, time.time(), state, why[:1000], actor, source))

    def breaker_events(self, limit: int = 50) -> list[BreakerEvent]:
        """Newest last."""
        rows = self._db.execute("SELECT * FROM breaker_events WHERE site = ? ORDER BY id DESC LIMIT ?",
                                (self.site, limit)).fetchall()
        return [BreakerEvent(r["at"], r["state"], r["why"], r["actor"], r["source"]) for r in reversed(rows)]

    def breaker(self) -> tuple[BreakerEvent | None, float]:
        """(the open event when the breaker is open, else None; when it was last closed, 0 if never)."""
        ev = self.breaker_events(limit=1)
        closed = self._db.execute("SELECT MAX(at) FROM breaker_events WHERE site = ? AND state = 'closed'",
                                  (self.site,)).fetchone()[0]
        return (ev[0] if ev and ev[0].state == "open" else None), float(closed or 0.0)

    # -- incidents ----------------------------------------------------------------------------------------------
    def incident_opened(self, host: str, *, cluster: str | None, source: str, cause: str, signal: float,
                        detected: float | None = None) -> int:
        with self._tx() as db:
            db.execute("INSERT INTO incidents (site, host, cluster, source, cause, signal, detected) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?)", (self.site, host, cluster, source, cause[:1000], signal,
                                                        time.time() if detected is None else detected))
            row = db.execute("SELECT MAX(id) FROM incidents WHERE site = ?", (self.site,)).fetchone()
        return int(row[0])

    def incident_mark(self, incident: int, what: str, at: float | None = None) -> None:
        """Set one timestamp (quarantined, drained, returned, replaced) the first time; returned and replaced close
        the incident."""
        if what not in ("quarantined", "drained", "returned", "replaced"):
            raise ValueError(what)
        status = {"returned": "returned", "replaced": "replaced"}.get(what)
        with self._tx() as db:
            db.execute(f"UPDATE incidents SET {what} = COALESCE({what}, ?)" +
                       (", status = ?" if status else "") + " WHERE id = ? AND site = ?",
                       (time.time() if at is None else at, *((status,) if status else ()), incident, self.site))

    def incident_step(self, incident: int, step: str, outcome: str, at: float | None = None) -> None:
        with self._tx() as db:
            r = db.execute("SELECT steps FROM incidents WHERE id = ? AND site = ?", (incident, self.site)).fetchone()
            if r is None:
                return
            try:
                steps = json.loads(r[0] or "[]")
            except ValueError:
                steps = []
            steps.append({"step": step, "at": time.time() if at is None else at, "outcome": outcome})
            db.execute("UPDATE incidents SET steps = ? WHERE id = ? AND site = ?",
                       (json.dumps(steps), incident, self.site))

    def incidents(self, *, host: str | None = None, status: str | None = None, limit: int = 1000) -> list[Incident]:
        """Oldest first."""
        q = "SELECT * FROM incidents WHERE site = ?"
        args: list[Any] = [self.site]
        for col, val in (("host", host), ("status", status)):
            if val is not None:
                q += f" AND {col} = ?"
                args.append(val)
        rows = self._db.execute(q + " ORDER BY id DESC LIMIT ?", (*args, limit)).fetchall()
        return [_incident(r) for r in reversed(rows)]

    def open_incident(self, host: str) -> Incident | None:
        r = self._db.execute("SELECT * FROM incidents WHERE site = ? AND host = ? AND status = 'open' "
                             "ORDER BY id DESC LIMIT 1", (self.site, host)).fetchone()
        return None if r is None else _incident(r)
