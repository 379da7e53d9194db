"""Measure the simulated rack: cold base root build, warm `up` of 4 and 16 hosts, idle memory per host, `down`.

    sudo .venv/bin/python benchmarks/testbed_bench.py [--cold] [--sizes 4,16] [--settle 30]

`--cold` builds a base root in a throw-away cache (downloads from Debian's mirror, ~100 MB). Racks are named
`bench<N>` so a running default rack is left alone. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def cmd(*args: str) -> float:
    t0 = time.monotonic()
    subprocess.run([str(Path(sys.executable).with_name("provision")), "testbed", *args], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return round(time.monotonic() - t0, 2)


def main() -> int:
    from provisioner_testbed import rack, rootfs
    from provisioner_testbed.state import RackState

    ap = argparse.ArgumentParser()
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--sizes", default="4,16")
    ap.add_argument("--settle", type=float, default=30.0)
    a = ap.parse_args()
    out: dict[str, object] = {"cpus": os.cpu_count(), "loadavg_start": os.getloadavg()[0]}
    if a.cold:
        tmp = Path(tempfile.mkdtemp(prefix="bench-cache-", dir="/var/tmp"))
        try:
            t0 = time.monotonic()
            base = rootfs.ensure_base(tmp)
            out["base_cold_s"] = round(time.monotonic() - t0, 1)
            out["base_mib"] = int(subprocess.run(["du", "-sm", str(base)], capture_output=True, text=True)
                                  .stdout.split()[0])
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    for n in (int(x) for x in a.sizes.split(",")):
        name = f"bench{n}"
        cmd("down", "--name", name)
        up_s = cmd("up", "--name", name, "--nodes", str(n))
        st = RackState.load(name)
        assert st is not None
        noop_s = cmd("up", "--name", name, "--nodes", str(n))
        time.sleep(a.settle)
        mem = [r.memory_mib or 0.0 for r in rack.status(name)]
        down_s = cmd("down", "--name", name)
        out[f"up_{n}"] = {"cli_s": up_s, "phases_s": st.timings, "second_up_s": noop_s, "down_s": down_s,
                          "idle_pss_mib_per_host": round(sum(mem) / len(mem), 1),
                          "idle_pss_mib_max": round(max(mem), 1)}
    out["loadavg_end"] = os.getloadavg()[0]
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
