"""The burn-in on the way back into service (issue 45): a node returning from quarantine or maintenance runs the tier
its `burnin_return_tier` names (default quick; off) after the health gate passed. The day-2 executors call
`return_burnin` beside their health gate; it runs, records and answers per host."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from provisioner.day2.onboard import check_line
from provisioner.model import Fleet

TIERS = ("quick", "standard", "soak")


def return_tier(fleet: Fleet, host: str) -> str | None:
    """The tier `host` runs on its way back (None: off)."""
    h = fleet.hosts.get(host)
    v = str((h.vars if h is not None else {}).get("burnin_return_tier", "quick")).strip().lower()
    return v if v in TIERS else None


def return_burnin(fleet: Fleet, inventory: Any, hosts: Iterable[str], *, path: Path | None = None,
                  timeout: float = 600.0) -> dict[str, tuple[bool, str]]:
    """{host: (passed, one line)} for the hosts whose return tier is on (others are not in the answer); each tier's
    pass is recorded as `provision burn-in` records it (a run `burn-in` in the inventory's site)."""
    from provisioner.ledger.record import record_burnin
    from provisioner.probes.burnin import run_burnin

    by_tier: dict[str, list[str]] = {}
    for h in hosts:
        t = return_tier(fleet, h)
        if t is not None:
            by_tier.setdefault(t, []).append(h)
    out: dict[str, tuple[bool, str]] = {}
    for tier, names in by_tier.items():
        started = time.time()
        res = run_burnin(fleet, names, tier=tier, timeout=timeout)
        record_burnin(res, tier, inventory, started, time.time() - started, path, fleet=fleet)
        for n, hb in res.items():
            why = "; ".join(check_line(r, message=False) for r in hb.failed[:4])
            out[n] = (hb.ok, f"burn-in {tier}: " + ("pass" if hb.ok else f"fail ({why or hb.error})"))
    return out
