"""`Ledger`: the one interface the commands use, on SQLite (a file) or PostgreSQL (a `postgresql://` URL:
provisioner/ledger/pg.py adapts the connection)."""

from __future__ import annotations

import json
import os
import secrets
import socket
import sqlite3
import stat
import time
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provisioner.errors import Failure
from provisioner.ledger.day2 import Day2Records
from provisioner.ledger.schema import MIGRATIONS, VERSION


class LedgerError(Failure):
    """The ledger cannot be opened or written (a path, a newer schema, a locked or corrupt file)."""


@dataclass(frozen=True)
class Run:
    id: int
    command: str
    inventory: str
    started: float
    ended: float | None
    status: str  # as read: a run never closed whose process is gone reads `interrupted`
    run_dir: str | None


@dataclass(frozen=True)
class Transition:
    host: str
    from_state: str
    to_state: str
    reason: str
    at: float
    actor: str
    run: int | None
    forced: bool


@dataclass(frozen=True)
class Remediation:
    host: str
    step: str  # gpu_reset, reboot, power_cycle, replace
    outcome: str  # done, failed, skipped; marked (replace)
    detail: str | None
    at: float
    actor: str


@dataclass(frozen=True)
class RolloutCluster:
    cluster: str
    position: int
    status: str  # pending, draining, upgrading, returning, done, failed
    step: str | None  # where a failed cluster stopped
    detail: str | None
    at: float | None
    seconds: float | None


@dataclass(frozen=True)
class Rollout:
    id: int
    inventory: str
    spec: dict[str, Any]
    digest: str
    started: float
    ended: float | None
    status: str  # running, stopped, done, aborted; a running one whose process is gone reads `interrupted`
    detail: str | None
    pid: int | None
    node: str | None
    clusters: tuple[RolloutCluster, ...]

    @property
    def open(self) -> bool:
        """Not finished: resumable (stopped, interrupted) or still running."""
        return self.status in ("running", "stopped", "interrupted")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def proc_token(pid: int) -> str | None:
    """`<boot id>:<start time>` of process `pid` on this machine (None where /proc cannot tell): a pid reused by a
    later process, or the same pid after a reboot, has another token."""
    boot = _boot_id()
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[-1].split()
    if boot is None or len(fields) < 20:
        return None
    return f"{boot}:{fields[19]}"  # field 22 of proc(5): starttime, in clock ticks since boot


def process_gone(pid: int | None, node: str | None, token: str | None) -> bool:
    """Is the controller process of a run or rollout gone? Only decidable on the controller that wrote it: there,
    gone when its token (boot id and start time) no longer matches, or (no token) its pid is not alive."""
    if pid is None or node != socket.gethostname():
        return False
    boot = _boot_id()
    if not token or boot is None:
        return not _pid_alive(int(pid))
    if not token.startswith(boot + ":"):
        return True  # the controller rebooted since
    return proc_token(int(pid)) != token


class _Guarded:
    """The connection with every database error turned into one LedgerError line (a locked or read-only file, a
    lost server): the commands print it, never a traceback."""

    def __init__(self, conn: Any, where: str) -> None:
        self._conn, self._where = conn, where

    def _fail(self, exc: BaseException) -> LedgerError:
        from provisioner.ledger import pg

        text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        where = pg.redact(self._where) if pg.is_url(self._where) else self._where
        return LedgerError(f"the ledger {where}: {text}")

    def execute(self, sql: str, params: Any = ()) -> Any:
        return self._call(self._conn.execute, sql, params)

    def executemany(self, sql: str, rows: Any) -> Any:
        return self._call(self._conn.executemany, sql, rows)

    def _call(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except LedgerError:
            raise
        except Exception as exc:
            if _db_error(exc):
                raise self._fail(exc) from None
            raise

    def close(self) -> None:
        try:
            self._conn.close()
        except Exception as exc:  # noqa: BLE001 (closing: nothing left to say)
            if not _db_error(exc):
                raise


def _db_error(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.Error) or type(exc).__module__.split(".")[0] == "psycopg"


def _private_file(where: str) -> None:
    """The SQLite file created 0600 (an existing one of ours narrowed to it), its directory created 0700."""
    path = Path(where)
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=0o700)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        st = path.stat()
        if st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) & 0o077:
            path.chmod(0o600)
        return
    os.close(fd)
    try:
        from provisioner.paths import runs_dir

        d = path.parent
        if d.resolve() == runs_dir().resolve() and d.stat().st_uid == os.getuid():
            d.chmod(0o700)  # the default place: the runs directory it indexes
    except OSError:
        pass


class Ledger(Day2Records):
    """One open ledger. `Ledger.open(path)` creates the file and migrates the schema; use as a context manager or
    call close(). Every write method is one transaction."""

    def __init__(self, conn: Any, path: str, site: str = "") -> None:
        self._db = _Guarded(conn, path)
        self.path = path
        self.site = site  # every read and write is of this site; '' = the records from before sites (unowned)
        self._depth = 0
        self._key: bytes | None = None

    @property
    def shown(self) -> str:
        """The ledger's path or URL as messages show it (a URL's password redacted in every form)."""
        from provisioner.ledger import pg

        return pg.redact(self.path) if pg.is_url(self.path) else self.path

    # -- opening ------------------------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike[str], *, site: str = "", timeout: float = 10.0) -> Ledger:
        """Open (create) the ledger at `path` (":memory:" for a throwaway one) for `site` (provisioner/ledger/site.py)
        and bring its schema up to VERSION. Runs and rollouts whose controller process is gone are marked
        `interrupted` here (best effort: a read-only file is read as it is)."""
        where = str(path)
        from provisioner.ledger import pg

        if pg.is_url(where):
            try:
                ledger = cls(pg.Connection(where, timeout), where, site)
                ledger._migrate()
                ledger._sweep()
            except ImportError:
                raise LedgerError("a postgresql:// ledger needs psycopg: pip install 'provisioner[postgresql]'") \
                    from None
            except Exception as exc:  # psycopg.Error and its kin: one line, never the password
                if isinstance(exc, LedgerError):
                    raise
                text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise LedgerError(f"cannot open the ledger {pg.redact(where)}: {pg.scrub(text, where)}") from None
            return ledger
        try:
            if where != ":memory:":
                _private_file(where)
            # isolation_level=None: we issue BEGIN/COMMIT ourselves (BEGIN IMMEDIATE: writers queue, never deadlock)
            conn = sqlite3.connect(where, timeout=timeout, isolation_level=None)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute("PRAGMA secure_delete = ON")  # what is deleted (the old plain digests) is overwritten
            if where != ":memory:":
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("PRAGMA synchronous = NORMAL")
            ledger = cls(conn, where, site)
            ledger._migrate()
        except (OSError, sqlite3.Error) as exc:
            raise LedgerError(f"cannot open the ledger {where}: {exc}") from None
        except LedgerError as exc:
            text = str(exc)
            if not text.startswith(f"the ledger {where}: "):
                raise  # names the ledger already ("... has schema version N, newer than ...")
            raise LedgerError(f"cannot open the ledger {where}: {text.removeprefix(f'the ledger {where}: ')}") \
                from None
        ledger._sweep()
        return ledger

    def _sweep(self) -> None:
        """Mark `interrupted` every run and rollout of this controller whose process is gone, with the targeted hosts'
        outcomes still `running` (best effort: a read-only or locked ledger is left as it is and read so)."""
        try:
            here = socket.gethostname()
            runs = [r["id"] for r in self._db.execute(
                "SELECT id, pid, node, proc FROM runs WHERE ended IS NULL AND status = 'running' AND node = ?",
                (here,)).fetchall() if process_gone(r["pid"], r["node"], r["proc"])]
            ros = [r["id"] for r in self._db.execute(
                "SELECT id, pid, node, proc FROM rollouts WHERE status = 'running' AND node = ?",
                (here,)).fetchall() if process_gone(r["pid"], r["node"], r["proc"])]
            if not runs and not ros:
                return
            with self._tx() as db:
                for run in runs:
                    db.execute("UPDATE runs SET status = 'interrupted' WHERE id = ? AND ended IS NULL "
                               "AND status = 'running'", (run,))
                    db.execute("UPDATE host_outcomes SET status = 'interrupted' WHERE run = ? AND status = 'running'",
                               (run,))
                for ro in ros:
                    db.execute("UPDATE rollouts SET status = 'interrupted' WHERE id = ? AND status = 'running'",
                               (ro,))
        except LedgerError:
            pass

    # -- sites --------------------------------------------------------------------------------------------------
    def unowned(self) -> int:
        """How many records predate sites (site ''): runs, transitions, remediation steps, rollouts."""
        return sum(int(self._db.execute(f"SELECT COUNT(*) FROM {t} WHERE site = ''").fetchone()[0])
                   for t in ("runs", "transitions", "remediations", "rollouts"))

    def require_owned(self) -> None:
        """Refuse (LedgerError) to change lifecycle states while records from before sites are unowned: their hosts'
        states would be ignored (a serving cluster read as `new`, the last-cluster guard blind)."""
        n = self.unowned() if self.site else 0
        if n:
            raise LedgerError(f"the ledger {self.where} holds {n} record(s) from before sites, owned by no site: "
                              "give them to their inventory with `provision ledger adopt INVENTORY` first "
                              "(docs/lifecycle.md, Sites)")

    def adopt(self) -> dict[str, int]:
        """Give every unowned record (site '') to this ledger's site, in one transaction: {table: rows moved}."""
        if not self.site:
            raise LedgerError("adopt needs a site")
        out = {}
        with self._tx() as db:
            for t in ("runs", "transitions", "remediations", "rollouts"):
                out[t] = int(db.execute(f"SELECT COUNT(*) FROM {t} WHERE site = ''").fetchone()[0])
                db.execute(f"UPDATE {t} SET site = ? WHERE site = ''", (self.site,))
        return out

    def sites(self) -> list[dict[str, Any]]:
        """Every site with a record: its hosts (from transitions and run outcomes), their states, its runs and its
        newest run. '' is the unowned records' (from before sites)."""
        names = sorted({r[0] for t in ("runs", "transitions", "remediations", "rollouts")
                        for r in self._db.execute(f"SELECT DISTINCT site FROM {t}")})
        out = []
        for name in names:
            view = Ledger.__new__(Ledger)
            view.__dict__.update(self.__dict__)
            view.site = name
            states = view.states()
            hosts = sorted(set(states) | {r[0] for r in self._db.execute(
                "SELECT DISTINCT host FROM host_outcomes JOIN runs ON runs.id = host_outcomes.run WHERE runs.site = ?",
                (name,))})
            counts: dict[str, int] = {}
            for h in hosts:
                s = states.get(h, ("new", None))[0]
                counts[s] = counts.get(s, 0) + 1
            n = int(self._db.execute("SELECT COUNT(*) FROM runs WHERE site = ?", (name,)).fetchone()[0])
            last = view.runs(limit=1)
            out.append({"site": name, "hosts": len(hosts), "states": dict(sorted(counts.items())), "runs": n,
                        "last_run": None if not last else {"id": last[0].id, "command": last[0].command,
                                                           "started": last[0].started, "status": last[0].status}})
        return out

    def sites_of(self, host: str) -> list[str]:
        """The sites with a record of `host` (a transition, a run outcome, a health result, a remediation step)."""
        rows = self._db.execute(
            "SELECT site FROM transitions WHERE host = ? UNION SELECT site FROM remediations WHERE host = ? "
            "UNION SELECT runs.site FROM runs JOIN host_outcomes ON host_outcomes.run = runs.id WHERE "
            "host_outcomes.host = ? UNION SELECT runs.site FROM runs JOIN health_results ON health_results.run = "
            "runs.id WHERE health_results.host = ?", (host, host, host, host))
        return sorted({r[0] for r in rows})

    @property
    def where(self) -> str:
        from provisioner.ledger import pg

        return pg.redact(self.path) if pg.is_url(self.path) else self.path

    # -- keyed digests (no plain digest of a file that may hold a secret) ---------------------------------------
    def digest_key(self) -> bytes:
        """The ledger's one digest key (`ledger_meta.digest_key`, 32 random bytes made on first use): the input and
        spec digests (hoststate.keyed_digest) and the recorded file digests (sealer) are keyed with it, so every
        controller sharing the ledger shares it and nothing else holds it."""
        if self._key is None:
            row = self._db.execute("SELECT value FROM ledger_meta WHERE name = 'digest_key'").fetchone()
            if row is None:
                with self._tx() as db:
                    row = db.execute("SELECT value FROM ledger_meta WHERE name = 'digest_key'").fetchone()
                    if row is None:
                        db.execute("INSERT INTO ledger_meta (name, value) VALUES ('digest_key', ?)",
                                   (secrets.token_hex(32),))
                        row = db.execute("SELECT value FROM ledger_meta WHERE name = 'digest_key'").fetchone()
            self._key = bytes.fromhex(str(row[0]))
        return self._key

    def sealer(self) -> Any:
        """The function that turns a probed state map into what this ledger records (hoststate.seal with its key)."""
        from provisioner.drift.state import seal

        key = self.digest_key()
        return lambda state: seal(state, key)

    def _migrate(self) -> None:
        try:  # a current schema needs no write lock (an open must not wait for another controller's transaction)
            row = self._db.execute("SELECT version FROM schema_version").fetchone()
            if row is not None and int(row[0]) == VERSION:
                return
        except LedgerError:
            pass  # a new database: no table yet
        with self._tx() as db:
            db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            row = db.execute("SELECT version FROM schema_version").fetchone()
            have = int(row[0]) if row else 0
            if have > VERSION:
                raise LedgerError(f"the ledger {self.shown} has schema version {have}, newer than this provisioner "
                                  f"({VERSION}): upgrade provisioner")
            for step in MIGRATIONS[have:]:
                for stmt in _statements(step):
                    db.execute(stmt)
            if row is None:
                db.execute("INSERT INTO schema_version (version) VALUES (?)", (VERSION,))
            elif have != VERSION:
                db.execute("UPDATE schema_version SET version = ?", (VERSION,))

    @property
    def version(self) -> int:
        return int(self._db.execute("SELECT version FROM schema_version").fetchone()[0])

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self) -> Iterator[Any]:
        if self._depth:  # inside atomic(): part of its transaction
            yield self._db
            return
        self._db.execute("BEGIN IMMEDIATE")
        self._depth += 1
        try:
            yield self._db
        except BaseException:
            self._depth -= 1
            try:
                self._db.execute("ROLLBACK")
            except LedgerError:
                pass
            raise
        self._depth -= 1
        self._db.execute("COMMIT")

    @contextmanager
    def atomic(self) -> Iterator[Ledger]:
        """One write transaction around whatever the block reads and writes (SQLite: BEGIN IMMEDIATE; PostgreSQL:
        the advisory lock every write transaction takes): a check and the write it allows cannot interleave with
        another controller's (the last-cluster guard of drain and upgrade)."""
        with self._tx():
            yield self

    # -- runs ---------------------------------------------------------------------------------------------------
    def run_started(self, command: str, inventory: str, *, run_dir: str | None = None, hosts: Iterable[str] = (),
                    started: float | None = None, pid: int | None = None) -> int:
        """A run begins: its row, status `running`, with this process's pid (so a kill reads `interrupted`), and an
        outcome `running` for each of `hosts` (the targeted ones; run_finished replaces them)."""
        pid = os.getpid() if pid is None else pid
        with self._tx() as db:
            row = db.execute(
                "INSERT INTO runs (command, inventory, started, run_dir, pid, node, site, proc) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                (command, inventory, time.time() if started is None else started, run_dir, pid, socket.gethostname(),
                 self.site, proc_token(pid))).fetchone()
            run = int(row[0])
            db.executemany("INSERT INTO host_outcomes (run, host, status) VALUES (?, ?, 'running')",
                           [(run, h) for h in dict.fromkeys(hosts)])
            return run

    def run_finished(self, run: int, status: str, *, hosts: Iterable[dict[str, Any]] = (),
                     drift: Iterable[tuple[str, str]] = (), health: Iterable[tuple[str, str, str, str | None]] = (),
                     ended: float | None = None) -> None:
        """Close run `run` with its outcome, in one transaction: `hosts` = {host, status, changed, failed} rows,
        `drift` = (host, item), `health` = (host, check, result, detail)."""
        with self._tx() as db:
            db.executemany(
                "INSERT OR REPLACE INTO host_outcomes (run, host, status, changed, failed) VALUES (?, ?, ?, ?, ?)",
                [(run, h["host"], h["status"], int(h.get("changed", 0)), int(h.get("failed", 0))) for h in hosts])
            db.executemany("INSERT INTO drift_items (run, host, item) VALUES (?, ?, ?)",
                           [(run, h, i) for h, i in drift])
            db.executemany(
                'INSERT OR REPLACE INTO health_results (run, host, "check", result, detail) VALUES (?, ?, ?, ?, ?)',
                [(run, h, c, r, d) for h, c, r, d in health])
            db.execute("UPDATE runs SET ended = ?, status = ? WHERE id = ?",
                       (time.time() if ended is None else ended, status, run))

    def _run(self, row: Any) -> Run:
        status = row["status"]
        if row["ended"] is None and status == "running" and process_gone(row["pid"], row["node"], row["proc"]):
            status = "interrupted"
        return Run(id=row["id"], command=row["command"], inventory=row["inventory"], started=row["started"],
                   ended=row["ended"], status=status, run_dir=row["run_dir"])

    def runs(self, *, host: str | None = None, limit: int = 50) -> list[Run]:
        """The newest runs first; with `host`, only the runs that had an outcome for it (or are still open)."""
        if host is None:
            rows = self._db.execute("SELECT * FROM runs WHERE site = ? ORDER BY id DESC LIMIT ?",
                                    (self.site, limit)).fetchall()
        else:
            rows = self._db.execute(
                "SELECT * FROM runs WHERE site = ? AND (id IN (SELECT run FROM host_outcomes WHERE host = ?) "
                "OR id IN (SELECT run FROM health_results WHERE host = ?)) ORDER BY id DESC LIMIT ?",
                (self.site, host, host, limit)).fetchall()
        return [self._run(r) for r in rows]

    def run(self, run: int) -> Run | None:
        row = self._db.execute("SELECT * FROM runs WHERE id = ? AND site = ?", (run, self.site)).fetchone()
        return self._run(row) if row else None

    def host_outcomes(self, run: int) -> dict[str, dict[str, Any]]:
        rows = self._db.execute("SELECT host, status, changed, failed FROM host_outcomes WHERE run = ?", (run,))
        return {r["host"]: dict(r) for r in rows}

    def last_outcome(self, host: str) -> tuple[Run, str] | None:
        """(the newest run with an outcome for `host`, that outcome's status)."""
        row = self._db.execute(
            "SELECT runs.*, host_outcomes.status AS outcome FROM host_outcomes JOIN runs ON runs.id = "
            "host_outcomes.run WHERE host_outcomes.host = ? AND runs.site = ? ORDER BY runs.id DESC LIMIT 1",
            (host, self.site)).fetchone()
        return self._with_outcome(row) if row else None

    def _with_outcome(self, row: Any) -> tuple[Run, str]:
        run = self._run(row)
        outcome = row["outcome"]
        return run, ("interrupted" if outcome == "running" and run.status == "interrupted" else outcome)

    def last_run_for(self, host: str, command: str) -> tuple[Run, str] | None:
        """(the newest `command` run with an outcome for `host`, that outcome's status)."""
        row = self._db.execute(
            "SELECT runs.*, host_outcomes.status AS outcome FROM host_outcomes JOIN runs ON runs.id = "
            "host_outcomes.run WHERE host_outcomes.host = ? AND runs.command = ? AND runs.site = ? "
            "ORDER BY runs.id DESC LIMIT 1", (host, command, self.site)).fetchone()
        return self._with_outcome(row) if row else None

    def health(self, host: str, run: int | None = None) -> list[dict[str, Any]]:
        """Health results of `host`: of run `run`, else of its newest health run."""
        if run is None:
            row = self._db.execute("SELECT MAX(run) FROM health_results WHERE host = ? AND run IN "
                                   "(SELECT id FROM runs WHERE site = ?)", (host, self.site)).fetchone()
            run = row[0] if row else None
            if run is None:
                return []
        rows = self._db.execute('SELECT run, host, "check", result, detail FROM health_results '
                                'WHERE host = ? AND run = ? ORDER BY "check"', (host, run))
        return [dict(r) for r in rows]

    def drift_items(self, run: int, host: str | None = None) -> list[tuple[str, str]]:
        q = "SELECT host, item FROM drift_items WHERE run = ?" + (" AND host = ?" if host else "")
        return [(r[0], r[1]) for r in self._db.execute(q, (run, host) if host else (run,))]

    # -- lifecycle ----------------------------------------------------------------------------------------------
    def record_transition(self, host: str, from_state: str, to_state: str, *, reason: str, actor: str,
                          run: int | None = None, forced: bool = False, at: float | None = None) -> Transition:
        """Append one transition; refuses (LedgerError) when `from_state` is not the host's state now (another
        controller moved it meanwhile): the check and the write are one transaction."""
        when = time.time() if at is None else at
        with self._tx() as db:
            row = db.execute("SELECT to_state FROM transitions WHERE site = ? AND host = ? ORDER BY id DESC LIMIT 1",
                             (self.site, host)).fetchone()
            now = row[0] if row else "new"
            if now != from_state:
                raise LedgerError(f"{host} is {now} now, not {from_state} (changed meanwhile): look again")
            db.execute("INSERT INTO transitions (host, from_state, to_state, reason, at, actor, run, forced, site) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", (host, from_state, to_state, reason, when, actor, run,
                                                             int(forced), self.site))
        return Transition(host, from_state, to_state, reason, when, actor, run, forced)

    def transitions(self, host: str | None = None) -> list[Transition]:
        """Oldest first."""
        q = "SELECT * FROM transitions WHERE site = ?" + (" AND host = ?" if host else "") + " ORDER BY id"
        return [Transition(r["host"], r["from_state"], r["to_state"], r["reason"], r["at"], r["actor"], r["run"],
                           bool(r["forced"])) for r in self._db.execute(q, (self.site, host) if host else
                                                                        (self.site,))]

    def record_step(self, host: str, step: str, outcome: str, *, actor: str, detail: str | None = None,
                    run: int | None = None, at: float | None = None) -> Remediation:
        """Append one remediation record (a step tried on `host`, or a replacement mark)."""
        when = time.time() if at is None else at
        with self._tx() as db:
            db.execute("INSERT INTO remediations (host, step, outcome, detail, at, actor, run, site) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (host, step, outcome, detail, when, actor, run, self.site))
        return Remediation(host, step, outcome, detail, when, actor)

    def remediations(self, host: str | None = None) -> list[Remediation]:
        """Oldest first."""
        q = "SELECT * FROM remediations WHERE site = ?" + (" AND host = ?" if host else "") + " ORDER BY id"
        return [Remediation(r["host"], r["step"], r["outcome"], r["detail"], r["at"], r["actor"])
                for r in self._db.execute(q, (self.site, host) if host else (self.site,))]

    def states(self) -> dict[str, tuple[str, float]]:
        """{host: (lifecycle state, since)} for every host with a transition (the others are `new`)."""
        rows = self._db.execute(
            "SELECT host, to_state, at FROM transitions WHERE id IN (SELECT MAX(id) FROM transitions WHERE site = ? "
            "GROUP BY host)", (self.site,))
        return {r[0]: (r[1], r[2]) for r in rows}

    def state(self, host: str) -> tuple[str, float | None]:
        """(lifecycle state, since when; None for a host never moved: `new`)."""
        return self.states().get(host, ("new", None))

    # -- recorded host states (the two-tier drift) ----------------------------------------------------------------
    def put_states(self, rows: Iterable[tuple[str, int | None, str, dict[str, str]]
                                        | tuple[str, int | None, str, dict[str, str], Iterable[str]]], *,
                   drop: Iterable[str] = ()) -> None:
        """In one transaction: record (host, run, inputs digest, state map[, roles that ran]) per host of this site
        (replacing its last record) and forget the records of `drop` (hosts whose run failed: their state is no
        longer converged). The inputs digest comes keyed with `digest_key()` (tiers.host_inputs) and every file's
        content digest is keyed here (sealer): the ledger holds no plain digest of a file that may hold a secret."""
        from provisioner.drift.state import state_digest

        now = time.time()
        seal = self.sealer()
        sealed: list[tuple[str, int | None, str, dict[str, str], list[str]]] = [
            (row[0], row[1], row[2], seal(row[3]), list(row[4]) if len(row) > 4 else [])
            for row in rows]
        with self._tx() as db:
            db.executemany("DELETE FROM host_state WHERE site = ? AND host = ?", [(self.site, h) for h in drop])
            db.executemany(
                "INSERT OR REPLACE INTO host_state (site, host, run, recorded, inputs, digest, state, roles) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(self.site, host, run, now, inputs, state_digest(state),
                  zlib.compress(json.dumps(state, sort_keys=True).encode(), 6), json.dumps(roles))
                 for host, run, inputs, state, roles in sealed])

    def records(self, hosts: Iterable[str]) -> dict[str, Any]:
        """{host: hoststate.Record} for the hosts that have one; a row that cannot be decoded comes back with an empty
        state (its digest then fails: `corrupted`)."""
        from provisioner.drift.state import Record

        out: dict[str, Any] = {}
        for h in hosts:
            r = self._db.execute("SELECT * FROM host_state WHERE site = ? AND host = ?", (self.site, h)).fetchone()
            if r is None:
                continue
            try:
                state = json.loads(zlib.decompress(r["state"]).decode())
                state = {str(k): str(v) for k, v in state.items()} if isinstance(state, dict) else {}
            except (zlib.error, ValueError, TypeError, AttributeError):
                state = {}
            out[h] = Record(host=h, run=r["run"], recorded=r["recorded"], inputs=r["inputs"], state=state,
                            digest=r["digest"], roles=_roles(r["roles"]))
        return out

    # -- rolling upgrades ---------------------------------------------------------------------------------------
    def rollout_started(self, inventory: str, spec: dict[str, Any], digest: str, clusters: Iterable[str], *,
                        pid: int | None = None) -> int:
        """A rollout begins (status running, this process's pid) with every cluster pending, in rollout order."""
        pid = os.getpid() if pid is None else pid
        with self._tx() as db:
            row = db.execute("INSERT INTO rollouts (inventory, spec, digest, started, pid, node, site, proc) "
                             "VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                             (inventory, json.dumps(spec, sort_keys=True), digest, time.time(), pid,
                              socket.gethostname(), self.site, proc_token(pid))).fetchone()
            rid = int(row[0])
            db.executemany("INSERT INTO rollout_clusters (rollout, cluster, position) VALUES (?, ?, ?)",
                           [(rid, c, i) for i, c in enumerate(clusters)])
            return rid

    def rollout_claimed(self, rollout: int) -> None:
        """A resumed rollout: running again, under this process."""
        with self._tx() as db:
            db.execute("UPDATE rollouts SET status = 'running', detail = NULL, ended = NULL, pid = ?, node = ?, "
                       "proc = ? WHERE id = ? AND site = ?",
                       (os.getpid(), socket.gethostname(), proc_token(os.getpid()), rollout, self.site))

    def rollout_step(self, rollout: int, clusters: Iterable[str], status: str, *, step: str | None = None,
                     detail: str | None = None, seconds: float | None = None) -> None:
        with self._tx() as db:
            db.executemany("UPDATE rollout_clusters SET status = ?, step = ?, detail = ?, at = ?, seconds = ? "
                           "WHERE rollout = ? AND cluster = ?",
                           [(status, step, detail, time.time(), seconds, rollout, c) for c in clusters])

    def rollout_ended(self, rollout: int, status: str, detail: str | None = None) -> None:
        """stopped (a step failed: resumable), done or aborted."""
        with self._tx() as db:
            db.execute("UPDATE rollouts SET status = ?, detail = ?, ended = ? WHERE id = ?",
                       (status, detail, time.time(), rollout))

    def _rollout(self, row: Any) -> Rollout:
        status = row["status"]
        if status == "running" and process_gone(row["pid"], row["node"], row["proc"]):
            status = "interrupted"
        clusters = tuple(RolloutCluster(r["cluster"], r["position"], r["status"], r["step"], r["detail"], r["at"],
                                        r["seconds"]) for r in self._db.execute(
            "SELECT * FROM rollout_clusters WHERE rollout = ? ORDER BY position", (row["id"],)))
        try:
            spec = json.loads(row["spec"])
        except ValueError:
            spec = {}
        return Rollout(id=row["id"], inventory=row["inventory"], spec=spec if isinstance(spec, dict) else {},
                       digest=row["digest"], started=row["started"], ended=row["ended"], status=status,
                       detail=row["detail"], pid=row["pid"], node=row["node"], clusters=clusters)

    def rollouts(self, inventory: str | None = None, limit: int = 20) -> list[Rollout]:
        """Newest first."""
        q = "SELECT * FROM rollouts WHERE site = ?" + (" AND inventory = ?" if inventory else "") + \
            " ORDER BY id DESC LIMIT ?"
        return [self._rollout(r) for r in self._db.execute(
            q, (self.site,) + ((inventory,) if inventory else ()) + (limit,))]

    def rollout(self, rollout: int) -> Rollout:
        row = self._db.execute("SELECT * FROM rollouts WHERE id = ? AND site = ?", (rollout, self.site)).fetchone()
        if row is None:
            raise LedgerError(f"no rollout {rollout} in the ledger")
        return self._rollout(row)

    def open_rollout(self, inventory: str | None = None) -> Rollout | None:
        """The site's (with `inventory`: that inventory's) newest rollout when it is not finished (running, stopped
        or interrupted)."""
        last = self.rollouts(inventory, limit=1)
        return last[0] if last and last[0].open else None

    def full_drift_done(self, inventory: str, at: float | None = None) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO full_drifts (inventory, at) VALUES (?, ?)",
                       (inventory, time.time() if at is None else at))

    def last_full_drift(self, inventory: str) -> float | None:
        row = self._db.execute("SELECT at FROM full_drifts WHERE inventory = ?", (inventory,)).fetchone()
        return float(row[0]) if row else None

    # -- burn-in (issue 45) ---------------------------------------------------------------------------------------
    def burnin_recorded(self, run: int, tier: str, rows: Iterable[tuple[str, dict[str, Any]]]) -> None:
        """The results of burn-in run `run`: (host, result) pairs, each result a checked node record (`check`, `gpu`,
        `status`, `code`, `metric`, `value`, `message`), in the node's order."""
        seq: dict[str, int] = {}
        out = []
        for host, r in rows:
            seq[host] = seq.get(host, -1) + 1
            gpu = r.get("gpu")
            value = r.get("value")
            out.append((run, host, seq[host], tier, str(r.get("check")), gpu if isinstance(gpu, int) else -1,
                        str(r.get("status")), r.get("code"), r.get("metric"),
                        float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None,
                        r.get("message")))
        with self._tx() as db:
            db.executemany('INSERT INTO burnin_results (run, host, seq, tier, "check", gpu, result, code, metric, '
                           'value, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)', out)

    def burnin(self, host: str, run: int | None = None) -> list[dict[str, Any]]:
        """Burn-in results of `host`: of run `run`, else of its newest burn-in run in this site."""
        if run is None:
            last = self.burnin_last(host)
            if last is None:
                return []
            run = int(last["run"])
        rows = self._db.execute('SELECT run, host, seq, tier, "check", gpu, result, code, metric, value, detail '
                                'FROM burnin_results WHERE host = ? AND run = ? ORDER BY seq', (host, run))
        return [dict(r) for r in rows]

    def burnin_last(self, host: str, *, passed: bool = False) -> dict[str, Any] | None:
        """{run, tier, ended, status} of the newest (passed) burn-in of `host` in this site."""
        row = self._db.execute(
            "SELECT runs.id AS run, runs.ended AS ended, host_outcomes.status AS status, "
            "(SELECT tier FROM burnin_results b WHERE b.run = runs.id AND b.host = host_outcomes.host LIMIT 1) AS tier "
            "FROM runs JOIN host_outcomes ON host_outcomes.run = runs.id WHERE runs.command = 'burn-in' AND "
            "runs.site = ? AND host_outcomes.host = ?" + (" AND host_outcomes.status = 'ok'" if passed else "") +
            " ORDER BY runs.id DESC LIMIT 1", (self.site, host)).fetchone()
        return dict(row) if row else None

    def burnin_hosts(self) -> set[str]:
        """The hosts with at least one burn-in in this site (status reads the newest of those only)."""
        return {str(r[0]) for r in self._db.execute(
            "SELECT DISTINCT host_outcomes.host FROM runs JOIN host_outcomes ON host_outcomes.run = runs.id "
            "WHERE runs.command = 'burn-in' AND runs.site = ?", (self.site,))}

    def burnin_figures(self) -> dict[str, dict[str, float]]:
        """{host: {metric: its slowest GPU's figure}} from each host's newest burn-in run in this site (the slow-node
        comparison's input)."""
        rows = self._db.execute(
            "SELECT b.host, b.metric, MIN(b.value) AS v FROM burnin_results b JOIN runs ON runs.id = b.run "
            "WHERE runs.site = ? AND b.value IS NOT NULL AND b.metric IS NOT NULL AND b.result != 'skip' AND b.run = "
            "(SELECT MAX(b2.run) FROM burnin_results b2 JOIN runs r2 ON r2.id = b2.run WHERE b2.host = b.host "
            "AND r2.site = ?) GROUP BY b.host, b.metric", (self.site, self.site)).fetchall()
        out: dict[str, dict[str, float]] = {}
        for r in rows:
            out.setdefault(r["host"], {})[r["metric"]] = float(r["v"])
        return out


def _roles(text: str | None) -> tuple[str, ...]:
    try:
        v = json.loads(text or "[]")
    except ValueError:
        return ()
    return tuple(str(x) for x in v) if isinstance(v, list) else ()


def _statements(script: str) -> list[str]:
    """A migration step's statements (split on `;` at line ends; no triggers or strings with `;` in the steps)."""
    out, buf = [], []
    for line in script.splitlines():
        code = line.split("--", 1)[0].rstrip()
        buf.append(code)
        if code.endswith(";"):
            stmt = "\n".join(buf).strip().rstrip(";")
            if stmt:
                out.append(stmt)
            buf = []
    tail = "\n".join(buf).strip()
    if tail:
        out.append(tail)
    return out
