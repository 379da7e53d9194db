"""The fleet ledger: runs, per-host outcomes, health results, drift items and lifecycle transitions in a database,
not in files to grep (issue 25). The run directories stay as artifacts; the ledger indexes them (`runs.run_dir`).

- Backend: SQLite (stdlib `sqlite3`), one file, WAL mode, every write in a transaction. A PostgreSQL backend (for
  several controllers or execution-node shards writing at once) is NOT done: it would be a second class with the
  same methods as `Ledger` (the SQL is plain; placeholders and the id column differ), chosen by a URL in
  PROVISION_LEDGER.
- Where: `paths.ledger_path()` (PROVISION_LEDGER, else `ledger.sqlite3` in the runs directory it indexes).
- Schema: versioned migrations (`schema.MIGRATIONS`, ordered SQL steps), applied in one transaction at open.
- A run opened (`run_started`) and never closed reads as `interrupted` once its process is gone (the CLI was killed
  mid-run): nothing has to clean up after a crash for the ledger to tell the truth.

Only the standard library here.
"""

from __future__ import annotations

from provisioner.ledger.store import Ledger, LedgerError, Remediation, Run, Transition

__all__ = ["Ledger", "LedgerError", "Remediation", "Run", "Transition"]
