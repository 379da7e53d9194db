"""benchmarks/summary.json: one machine-readable record per benchmark goal, next to README.md's table.

Each benchmark script calls `record(...)` for the goals it measures (only when run with `--summary`, so a trial run
does not overwrite the published figure). A record: `goal` (id), `anchor` (what it is compared with, the goal's
threshold), `ours` (our figure), `ratio` (anchor figure / ours, or ours / anchor where bigger is better: says which
in `anchor`), `met`, `date` (UTC), `load` (1-minute load average at the start and end of the measurement: the machine
is shared), `commit` (HEAD, `+dirty` when the tree had changes), plus `source` (the command) and free `detail`.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SUMMARY = Path(os.environ.get("PV_BENCH_SUMMARY", ROOT / "benchmarks" / "summary.json"))


def commit() -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    return head.strip() + ("+dirty" if dirty else "")


def loadavg() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def record(goal: str, *, anchor: str, ours: Any, ratio: float | None, met: bool | None, load: Any,
           source: str, detail: dict[str, Any] | None = None, date: str | None = None,
           from_file: Path | None = None, rev: str | None = None) -> dict:
    """Insert or replace the record of `goal` in summary.json; returns it. `from_file`: the figures come from an
    earlier saved run (then `date` is when it was measured and `commit` the commit that published that file).
    `rev`: the code the figures were measured with, when the caller knows it better than HEAD."""
    rev = rev or commit()
    if from_file is not None:
        rev = subprocess.run(["git", "log", "-1", "--format=%h", "--", str(from_file)], cwd=ROOT,
                             capture_output=True, text=True).stdout.strip() + " (published the saved run)"
    rec = {"goal": goal, "anchor": anchor, "ours": ours, "ratio": ratio, "met": met,
           "date": date or dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "load": load,
           "commit": rev, "fresh": from_file is None, "source": source, "detail": detail or {}}
    data = json.loads(SUMMARY.read_text()) if SUMMARY.is_file() else {"records": []}
    recs = [r for r in data["records"] if r["goal"] != goal] + [rec]
    data["records"] = sorted(recs, key=lambda r: r["goal"])
    tmp = SUMMARY.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(SUMMARY)
    return rec
