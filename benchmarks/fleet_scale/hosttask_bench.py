#!/usr/bin/env python3
"""Controller cost per host-task vs inventory size, no hosts involved (issue 17 item 3: does the per-host cost the
rack measured stay flat at thousands of hosts?).

    .venv/bin/python benchmarks/fleet_scale/hosttask_bench.py --sizes 100,400,1600 [--forks 50] [--json OUT]

For each size: validate_bench's generated inventory (every host in gpu_nodes, 2-node clusters with group_vars), then
`ansible-playbook hosttask-pb.yml` (4 controller-only tasks per host, forks 50, the repo's ansible.cfg): controller
CPU of the tree, the ansible-playbook main process's own CPU (the serial strategy loop) and peak PSS
(benchmarks/_measure.py), per host-task.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import _measure as M  # noqa: E402
import validate_bench as V  # noqa: E402

ROOT = HERE.parent.parent
TASKS = 4


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="100,400,1600")
    ap.add_argument("--forks", type=int, default=50)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    out = {"argv": sys.argv, "load_at_start": open("/proc/loadavg").read().split()[:3], "runs": []}
    bin_ = Path(sys.executable).parent
    for n in (int(s) for s in args.sizes.split(",")):
        with tempfile.TemporaryDirectory() as d:
            inv = V.generate(n, Path(d) / "inv")
            env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PATH": f"{bin_}:{os.environ['PATH']}",
                   "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(Path(d) / "facts")}
            load0 = float(open("/proc/loadavg").read().split()[0])
            r = M.run_measured([str(bin_ / "ansible-playbook"), "-i", str(inv), str(HERE / "hosttask-pb.yml"),
                                "-f", str(args.forks)], env=env, cwd=ROOT, stdout_path=Path(d) / "log")
            ht = n * TASKS
            r.update({"hosts": n, "host_tasks": ht, "load1_at_start": load0,
                      "controller_cpu_ms_per_host_task": round(1000 * r["controller_cpu_s"] / ht, 2),
                      "main_cpu_ms_per_host_task": round(1000 * r["playbook_main_cpu_s"] / ht, 2)})
            if r["rc"] != 0:
                r["log_tail"] = (Path(d) / "log").read_text()[-2000:]
        print(json.dumps({k: v for k, v in r.items() if k != "log_tail"}), file=sys.stderr, flush=True)
        out["runs"].append(r)
    out["load_at_end"] = open("/proc/loadavg").read().split()[:3]
    M.emit(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
