"""The air-gapped bundle's size and build time for an inventory (docs/airgap.md), and a rebuild's cost.

    .venv/bin/python benchmarks/bundle_bench.py INVENTORY --out DIR [--label NAME] [--json FILE] [--summary]
        [-- BUILD-ARGS...]

Runs `provision bundle build INVENTORY --out DIR BUILD-ARGS` twice as the user runs it (a fresh process each): the
first into an empty DIR (every artifact fetched), the second unchanged (nothing fetched: the cost of checking), and
records wall time, the process tree's CPU, the artifact count and bytes by kind, the 1-minute load at start and end,
and the commit. `--summary` writes the record `bundle_build_<label>` into benchmarks/summary.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _summary import commit, loadavg, record  # noqa: E402

PROVISION = str(Path(sys.executable).with_name("provision"))


def _build(inv: str, out: Path, extra: list[str]) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    r = subprocess.run([PROVISION, "bundle", "build", inv, "--out", str(out), *extra], capture_output=True, text=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise SystemExit(f"bundle build failed (exit {r.returncode}): {r.stderr[-2000:]}")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "summary": r.stderr.strip().splitlines()[-1]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("inventory")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--label", default="")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--summary", action="store_true")
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    a = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    shutil.rmtree(a.out, ignore_errors=True)
    load0 = loadavg()
    first = _build(a.inventory, a.out, extra)
    second = _build(a.inventory, a.out, extra)
    load1 = loadavg()
    arts = json.loads((a.out / "manifest.json").read_text())["artifacts"]
    by_kind: dict[str, dict[str, int]] = {}
    for x in arts:
        k = by_kind.setdefault(x["kind"], {"count": 0, "bytes": 0})
        k["count"] += 1
        k["bytes"] += x["size"]
    res = {"inventory": a.inventory, "build_args": extra, "first": first, "unchanged_rebuild": second,
           "artifacts": len(arts), "bytes": sum(x["size"] for x in arts), "by_kind": by_kind,
           "load": {"start": load0, "end": load1}, "commit": commit(), "cpus": os.cpu_count()}
    print(json.dumps(res, indent=1))
    if a.json:
        a.json.write_text(json.dumps(res, indent=1) + "\n")
    if a.summary:
        label = a.label or Path(a.inventory).stem
        record(f"bundle_build_{label}", anchor="none (a figure for the note: size and build time of the bundle)",
               ours={"bytes": res["bytes"], "artifacts": res["artifacts"], "first_wall_s": first["wall_s"],
                     "unchanged_rebuild_wall_s": second["wall_s"]}, ratio=None, met=None,
               load={"min": min(load0, load1), "max": max(load0, load1)},
               source=f"benchmarks/bundle_bench.py {a.inventory} --out {a.out} -- {' '.join(extra)}",
               detail={"by_kind": by_kind})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
