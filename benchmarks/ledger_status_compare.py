"""status_rows (bulk) vs the per-host queries it replaced, on a ledger (CPU seconds, in-process).

    .venv/bin/python benchmarks/ledger_status_compare.py INV LEDGER SAMPLE
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from provisioner.inventory import load_fleet
from provisioner.ledger import Ledger
from provisioner.ledger.site import site_of
from provisioner.ledger.view import recorded_seen, status_rows


def main() -> None:
    inv, db, sample = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    t = time.process_time()
    fleet = load_fleet(inv)
    load = time.process_time() - t
    with Ledger.open(db, site=site_of(fleet)) as lg:
        t, w = time.process_time(), time.monotonic()
        rows = status_rows(fleet, lg)
        bulk, bulk_wall = time.process_time() - t, time.monotonic() - w
        hosts = [h.name for h in fleet.gpu_nodes][:sample]
        t = time.process_time()
        for h in hosts:  # what status_rows asked per host before
            lg.records([h])
            lg.last_outcome(h)
            hr, dr = lg.last_run_for(h, "health"), lg.last_run_for(h, "drift")
            lg.transitions(h)
            if hr:
                lg.health(h, hr[0].id)
            if dr:
                lg.drift_items(dr[0].id, h)
            recorded_seen(lg, h, None, time.time())
        per = (time.process_time() - t) / len(hosts)
    print(f"hosts {len(rows)}: load_fleet {load:.2f} s CPU; status_rows bulk {bulk:.2f} s CPU ({bulk_wall:.2f} s "
          f"wall); per-host queries {1000 * per:.1f} ms CPU/host -> {per * len(rows):.1f} s for all")


if __name__ == "__main__":
    main()
