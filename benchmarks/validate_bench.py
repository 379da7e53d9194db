"""Benchmark: `provision validate --format json` vs `ansible-inventory --list` on generated inventories.

    .venv/bin/python benchmarks/validate_bench.py [--sizes 1000 5000 10000] [--repeat 3] [--keep DIR]

For each size it writes a realistic rack inventory (INI + group_vars/: every host in gpu_nodes with an
ansible_host, 2-node vLLM clusters of Qwen2-72B TP 8 x PP 2 as in rack-a, each with its own group_vars file and
node_rank per host), then runs both commands `--repeat` times and reports the median wall time, the median CPU time
(user + sys: the fair figure on a shared, loaded machine) and the median peak RSS (os.wait4's ru_maxrss of that
very child). Prints a Markdown table (what benchmarks/README.md records).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
CLUSTER_NODES = 2  # Qwen2-72B, TP 8 x PP 2 over two 8-GPU nodes (as rack-a)

GPU_NODES_YML = """\
gpu_model: H100-SXM5-80GB
gpu_count: 8
fabric: infiniband
ib_hcas: [mlx5_0:1, mlx5_1:1, mlx5_2:1, mlx5_3:1, mlx5_4:1, mlx5_5:1, mlx5_6:1, mlx5_7:1]
bootstrap_interface: ens10f0np0
nccl_algo: Ring
nccl_ib_timeout: 22
nccl_ib_retry_cnt: 7
"""

CLUSTER_YML = """\
vllm_cluster:
  model: /models/Qwen2-72B-Instruct
  model_arch: Qwen2-72B
  tensor_parallel_size: 8
  pipeline_parallel_size: 2
  max_model_len: 32768
  max_num_seqs: 64
  extra_args: [--enable-log-requests]
"""


def generate(n: int, dest: Path) -> Path:
    """Write an n-host inventory under dest; returns the INI path."""
    (dest / "group_vars").mkdir(parents=True, exist_ok=True)
    (dest / "group_vars" / "all.yml").write_text("ansible_user: ubuntu\n")
    (dest / "group_vars" / "gpu_nodes.yml").write_text(GPU_NODES_YML)
    lines = ["[gpu_nodes]"]
    for i in range(n):
        lines.append(f"node{i:05d} ansible_host=10.{64 + i // 65536}.{(i // 256) % 256}.{i % 256}")
    clusters = n // CLUSTER_NODES
    for c in range(clusters):
        lines.append(f"\n[c{c:05d}]")
        for r in range(CLUSTER_NODES):
            lines.append(f"node{c * CLUSTER_NODES + r:05d} node_rank={r}")
        (dest / "group_vars" / f"c{c:05d}.yml").write_text(CLUSTER_YML)
    lines.append("\n[vllm_clusters:children]")
    lines.extend(f"c{c:05d}" for c in range(clusters))
    inv = dest / "hosts.ini"
    inv.write_text("\n".join(lines) + "\n")
    return inv


def measure(cmd: list[str]) -> tuple[float, float, int, int]:
    """(wall seconds, CPU seconds, peak RSS bytes, exit code) of one run; output discarded."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    if p.stderr is not None:
        p.stderr.close()
    p.returncode = os.waitstatus_to_exitcode(status)
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss * 1024, p.returncode


def bench(inv: Path, repeat: int) -> dict[str, tuple[float, float, float, int]]:
    cmds = {
        "provision validate --format json": [str(BIN / "provision"), "validate", str(inv), "--format", "json"],
        "ansible-inventory --list": [str(BIN / "ansible-inventory"), "-i", str(inv), "--list"],
    }
    out = {}
    for name, cmd in cmds.items():
        runs = [measure(cmd) for _ in range(repeat)]
        out[name] = (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs),
                     statistics.median(r[2] for r in runs), runs[-1][3])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 5000, 10000])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", type=Path, help="write the inventories here and keep them")
    args = ap.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="validate-bench-"))
    print("| hosts | command | median wall (s) | median CPU user+sys (s) | median peak RSS (MiB) | exit |")
    print("|---:|---|---:|---:|---:|---:|")
    try:
        for n in args.sizes:
            inv = generate(n, root / f"h{n}")
            for name, (wall, cpu, rss, rc) in bench(inv, args.repeat).items():
                print(f"| {n} | `{name}` | {wall:.2f} | {cpu:.2f} | {rss / 2**20:.0f} | {rc} |", flush=True)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
