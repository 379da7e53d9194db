"""The fleet ledger: runs, per-host outcomes, health results, drift items, lifecycle transitions, remediation steps,
recorded host states and rolling upgrades in a database: SQLite by default, PostgreSQL for a `postgresql://` URL in
PROVISION_LEDGER (provisioner/ledger/pg.py). The run directories stay as artifacts; the ledger indexes them.

Schema: versioned migrations (`schema.MIGRATIONS`), applied in one transaction at open. A run or rollout opened and
never closed reads as `interrupted` once its process is gone: nothing has to clean up after a crash.
"""

from __future__ import annotations

from provisioner.ledger.store import Ledger, LedgerError, Remediation, Rollout, RolloutCluster, Run, Transition

__all__ = ["Ledger", "LedgerError", "Remediation", "Rollout", "RolloutCluster", "Run", "Transition"]
