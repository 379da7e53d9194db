"""The ledger's schema as ordered migrations: MIGRATIONS[i] takes the database from version i to i + 1.

Append new steps; never edit a released one (a database at version N has run steps 1..N exactly as written).
`schema_version` holds one row, the version reached. Times are epoch seconds (REAL, UTC).
"""

from __future__ import annotations

MIGRATIONS: tuple[str, ...] = (
    # 1: runs, per-host outcomes, health results, drift items, lifecycle transitions
    """
    CREATE TABLE runs (
        id        INTEGER PRIMARY KEY,
        command   TEXT NOT NULL,             -- run, drift, onboard, onboard-launch, health, ...
        inventory TEXT NOT NULL,
        started   REAL NOT NULL,
        ended     REAL,                      -- NULL while running (or killed: see Ledger.run_status)
        status    TEXT NOT NULL DEFAULT 'running',  -- running, ok, failed, drift, interrupted, error
        run_dir   TEXT,                      -- the artifacts (.runs/<time>-<command>/); NULL for health
        pid       INTEGER,                   -- the controller process, to tell a killed run from a running one
        node      TEXT                       -- the controller's host name (the pid means nothing elsewhere)
    );
    CREATE INDEX runs_started ON runs (started);
    CREATE TABLE host_outcomes (
        run     INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        host    TEXT NOT NULL,
        status  TEXT NOT NULL,               -- ok, changed, failed, unreachable, not-run, drift, ...
        changed INTEGER NOT NULL DEFAULT 0,
        failed  INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (run, host)
    );
    CREATE INDEX host_outcomes_host ON host_outcomes (host);
    CREATE TABLE health_results (
        run    INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        host   TEXT NOT NULL,
        "check" TEXT NOT NULL,
        result TEXT NOT NULL,                -- pass, fail, skip, ...
        detail TEXT,
        PRIMARY KEY (run, host, "check")
    );
    CREATE INDEX health_results_host ON health_results (host);
    CREATE TABLE drift_items (
        run  INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        host TEXT NOT NULL,
        item TEXT NOT NULL                   -- DriftItem.key(): kind:resource
    );
    CREATE INDEX drift_items_host ON drift_items (host);
    CREATE TABLE transitions (
        id         INTEGER PRIMARY KEY,
        host       TEXT NOT NULL,
        from_state TEXT NOT NULL,
        to_state   TEXT NOT NULL,
        reason     TEXT NOT NULL,
        at         REAL NOT NULL,
        actor      TEXT NOT NULL,            -- who asked: a user (provision node) or a command
        run        INTEGER REFERENCES runs (id) ON DELETE SET NULL,
        forced     INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX transitions_host ON transitions (host, id);
    """,
    # 2: remediation records (provision remediate): the steps tried on a quarantined node, replacement marks
    """
    CREATE TABLE remediations (
        id      INTEGER PRIMARY KEY,
        host    TEXT NOT NULL,
        step    TEXT NOT NULL,               -- gpu_reset, reboot, power_cycle, replace
        outcome TEXT NOT NULL,               -- done, failed, skipped; marked (replace)
        detail  TEXT,
        at      REAL NOT NULL,
        actor   TEXT NOT NULL,
        run     INTEGER REFERENCES runs (id) ON DELETE SET NULL
    );
    CREATE INDEX remediations_host ON remediations (host, id);
    """,
    # 3: each host's recorded state (the two-tier drift's tier 1 compares a probe with it); one row per host, the
    # last complete run's; `state` = zlib-compressed JSON of the state map, `digest` = sha256 of that map
    """
    CREATE TABLE host_state (
        host     TEXT PRIMARY KEY,
        run      INTEGER REFERENCES runs (id) ON DELETE SET NULL,
        recorded REAL NOT NULL,
        inputs   TEXT NOT NULL,              -- hoststate.inputs_digest of the run that converged it
        digest   TEXT NOT NULL,
        state    BLOB NOT NULL
    );
    CREATE TABLE full_drifts (                -- the last `provision drift --full` per inventory (--full-every)
        inventory TEXT PRIMARY KEY,
        at        REAL NOT NULL
    );
    """,
    # 4: the roles that ran tasks on the host in the recorded run (a tier-1 host's report lists them, as tier 2 does)
    """
    ALTER TABLE host_state ADD COLUMN roles TEXT NOT NULL DEFAULT '[]';  -- JSON list
    """,
    # 5: rolling upgrades (provision upgrade): one row per rollout, one per cluster in rollout order
    """
    CREATE TABLE rollouts (
        id        INTEGER PRIMARY KEY,
        inventory TEXT NOT NULL,
        spec      TEXT NOT NULL,             -- JSON: the extra vars, --max-unavailable, the cluster order
        digest    TEXT NOT NULL,             -- of the members' inputs: a rerun with the same digest resumes
        started   REAL NOT NULL,
        ended     REAL,
        status    TEXT NOT NULL DEFAULT 'running',  -- running, stopped, done, aborted (killed: read interrupted)
        detail    TEXT,                      -- why it stopped
        pid       INTEGER,
        node      TEXT
    );
    CREATE INDEX rollouts_inventory ON rollouts (inventory, id);
    CREATE TABLE rollout_clusters (
        rollout  INTEGER NOT NULL REFERENCES rollouts (id) ON DELETE CASCADE,
        cluster  TEXT NOT NULL,
        position INTEGER NOT NULL,
        status   TEXT NOT NULL DEFAULT 'pending',  -- pending, draining, upgrading, returning, done, failed
        step     TEXT,                       -- the step a failed cluster stopped in
        detail   TEXT,
        at       REAL,
        seconds  REAL,                       -- drain to return, for a done cluster
        PRIMARY KEY (rollout, cluster)
    );
    """,
    # 6: sites (issue 43): every record belongs to the site of the inventory that wrote it (`provision_site`, else the
    # inventory's resolved path); rows from before get site '' (unowned) until `provision ledger adopt INVENTORY`
    # gives them to one site. host_state is keyed by (site, host) and starts empty: its old rows held plain sha256
    # digests of files (the vLLM env file with its API key among them); records are keyed digests from now on
    # (HMAC-SHA256 with ledger_meta.digest_key). `proc`: the controller's boot id and the process start time, so a
    # reused pid (or a reboot) does not keep a dead run `running`.
    """
    ALTER TABLE runs ADD COLUMN site TEXT NOT NULL DEFAULT '';
    ALTER TABLE runs ADD COLUMN proc TEXT;
    CREATE INDEX runs_site ON runs (site, id);
    ALTER TABLE transitions ADD COLUMN site TEXT NOT NULL DEFAULT '';
    CREATE INDEX transitions_site_host ON transitions (site, host, id);
    ALTER TABLE remediations ADD COLUMN site TEXT NOT NULL DEFAULT '';
    CREATE INDEX remediations_site_host ON remediations (site, host, id);
    ALTER TABLE rollouts ADD COLUMN site TEXT NOT NULL DEFAULT '';
    ALTER TABLE rollouts ADD COLUMN proc TEXT;
    DROP TABLE host_state;
    CREATE TABLE host_state (
        site     TEXT NOT NULL,
        host     TEXT NOT NULL,
        run      INTEGER REFERENCES runs (id) ON DELETE SET NULL,
        recorded REAL NOT NULL,
        inputs   TEXT NOT NULL,              -- keyed digest (HMAC) of hoststate.inputs_digest
        digest   TEXT NOT NULL,
        state    BLOB NOT NULL,              -- file contents as keyed digests (hoststate.seal)
        roles    TEXT NOT NULL DEFAULT '[]',
        PRIMARY KEY (site, host)
    );
    CREATE TABLE ledger_meta (
        name  TEXT PRIMARY KEY,
        value TEXT NOT NULL
    );
    """,
    # 7: day-2 automation (issue 44): every automated action with its source, mode and outcome (a rail that held
    # it; a recommendation waiting for --approve), the alert keys already acted on (idempotency), the circuit
    # breaker's openings and closings, and incidents (detected -> quarantined -> drained -> steps -> returned or
    # marked for replacement), one row each with its timestamps
    """
    CREATE TABLE day2_actions (
        id         INTEGER PRIMARY KEY,
        site       TEXT NOT NULL DEFAULT '',
        at         REAL NOT NULL,
        host       TEXT NOT NULL,
        kind       TEXT NOT NULL,            -- quarantine, replace, remediate, gate, return, restart_cluster
        step       TEXT,
        "check"    TEXT,
        cluster    TEXT,
        model      TEXT,
        reason     TEXT NOT NULL,
        source     TEXT NOT NULL,            -- operator, timer, alert
        mode       TEXT NOT NULL,            -- observe, recommend, act
        status     TEXT NOT NULL,            -- observed, recommended, approved, done, failed, blocked, stale
        rail       TEXT,                     -- breaker, flap, cooldown, rate, floor (blocked)
        detail     TEXT,
        alert_key  TEXT,
        incident   INTEGER,
        decided_by TEXT,                     -- who approved it
        decided_at REAL
    );
    CREATE INDEX day2_actions_site ON day2_actions (site, id);
    CREATE INDEX day2_actions_site_at ON day2_actions (site, at);
    CREATE INDEX day2_actions_site_host ON day2_actions (site, host, id);
    CREATE TABLE alert_keys (
        site   TEXT NOT NULL,
        key    TEXT NOT NULL,
        at     REAL NOT NULL,
        host   TEXT,
        outcome TEXT,
        PRIMARY KEY (site, key)
    );
    CREATE TABLE breaker_events (
        id     INTEGER PRIMARY KEY,
        site   TEXT NOT NULL DEFAULT '',
        at     REAL NOT NULL,
        state  TEXT NOT NULL,                -- open, closed
        why    TEXT NOT NULL,
        actor  TEXT NOT NULL,
        source TEXT
    );
    CREATE INDEX breaker_events_site ON breaker_events (site, id);
    CREATE TABLE incidents (
        id          INTEGER PRIMARY KEY,
        site        TEXT NOT NULL DEFAULT '',
        host        TEXT NOT NULL,
        cluster     TEXT,
        source      TEXT NOT NULL,
        cause       TEXT NOT NULL,
        signal      REAL NOT NULL,           -- when the signal was seen (the health pass, the alert's start)
        detected    REAL NOT NULL,           -- when the loop decided to act
        quarantined REAL,
        drained     REAL,
        returned    REAL,
        replaced    REAL,
        status      TEXT NOT NULL DEFAULT 'open',  -- open, returned, replaced
        steps       TEXT NOT NULL DEFAULT '[]'     -- JSON: [{step, at, outcome}]
    );
    CREATE INDEX incidents_site_host ON incidents (site, host, id);
    """,
    # 8: retention (issue 47): per-check rows (host outcomes, health results, drift items) of runs older than the window
    # are folded into one row per (site, UTC day, host, command) by provisioner/ledger/retention.py; transitions,
    # remediations, incidents, runs and recorded states are kept. drift_items gets the index by run the fold deletes by.
    """
    CREATE TABLE check_days (
        site          TEXT NOT NULL,
        day           TEXT NOT NULL,         -- UTC date of the runs' start, YYYY-MM-DD
        host          TEXT NOT NULL,
        command       TEXT NOT NULL,         -- health, drift, run, ...
        runs          INTEGER NOT NULL,      -- runs of `command` that day with an outcome for the host
        ok            INTEGER NOT NULL,      -- outcomes ok (clean, passed)
        changed       INTEGER NOT NULL,      -- outcomes changed
        drift         INTEGER NOT NULL,      -- outcomes drift
        failed        INTEGER NOT NULL,      -- every other outcome (failed, unreachable, interrupted, ...)
        failed_checks TEXT NOT NULL DEFAULT '',  -- health checks that failed that day, comma-separated
        drift_items   INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (site, day, host, command)
    );
    CREATE INDEX check_days_host ON check_days (site, host, day);
    CREATE INDEX drift_items_run ON drift_items (run);
    """,
)

# 9: burn-in results (issue 45): one row per check per GPU of a `provision burn-in` run (gpu -1: node-wide), the
# tier it ran, the figure measured and the controller's verdict. Kept as its own step (BURNIN_RESULTS) so a merge
# beside other new steps only renumbers it.
BURNIN_RESULTS = """
    CREATE TABLE burnin_results (
        run     INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        host    TEXT NOT NULL,
        seq     INTEGER NOT NULL,            -- the result's place in the node's output
        tier    TEXT NOT NULL,               -- quick, standard, soak
        "check" TEXT NOT NULL,
        gpu     INTEGER NOT NULL DEFAULT -1, -- the GPU index; -1 for a node-wide check
        result  TEXT NOT NULL,               -- pass, fail, warn, skip
        code    TEXT,                        -- BRNnnn when failed
        metric  TEXT,
        value   REAL,
        detail  TEXT,
        PRIMARY KEY (run, host, seq)
    );
    CREATE INDEX burnin_results_host ON burnin_results (host, run);
    """
MIGRATIONS = MIGRATIONS + (BURNIN_RESULTS,)

#: The version a database opened by this code ends at.
VERSION = len(MIGRATIONS)
