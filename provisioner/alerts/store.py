"""What the receiver has done, per alert key, in a small SQLite file: survives restarts, so an alert Alertmanager
resends (same fingerprint and startsAt) is acted on once, and an alert accepted but not finished when the receiver
stopped is finished at the next start."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

SCHEMA = """CREATE TABLE IF NOT EXISTS alerts (
  key TEXT PRIMARY KEY, host TEXT NOT NULL, alertname TEXT NOT NULL, state TEXT NOT NULL,
  received REAL NOT NULL, finished REAL, detail TEXT NOT NULL DEFAULT '')"""


class Store:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(SCHEMA)
        self._lock = threading.Lock()

    def claim(self, key: str, host: str, alertname: str) -> bool:
        """Record the alert as queued; False when this key was seen before (nothing recorded)."""
        with self._lock:
            cur = self._db.execute("INSERT OR IGNORE INTO alerts (key, host, alertname, state, received) "
                                   "VALUES (?, ?, ?, 'queued', ?)", (key, host, alertname, time.time()))
            return cur.rowcount == 1

    def seen(self, key: str) -> bool:
        with self._lock:
            return self._db.execute("SELECT 1 FROM alerts WHERE key = ?", (key,)).fetchone() is not None

    def finish(self, key: str, state: str, detail: str) -> None:
        with self._lock:
            self._db.execute("UPDATE alerts SET state = ?, finished = ?, detail = ? WHERE key = ?",
                             (state, time.time(), detail[:500], key))

    def unfinished(self) -> list[tuple[str, str, str]]:
        """(key, host, alertname) accepted but not finished (the receiver stopped in between), oldest first."""
        with self._lock:
            return list(self._db.execute("SELECT key, host, alertname FROM alerts WHERE state = 'queued' "
                                         "ORDER BY received"))

    def rows(self) -> list[tuple[str, str, str, str]]:
        with self._lock:
            return list(self._db.execute("SELECT key, host, alertname, state FROM alerts ORDER BY received"))

    def close(self) -> None:
        with self._lock:
            self._db.close()
