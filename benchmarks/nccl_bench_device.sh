#!/usr/bin/env bash
# The NCCL all-reduce benchmark (benchmarks/nccl_bench.py) as one device-tool call on a lent GPU machine:
#   bash benchmarks/nccl_bench_device.sh "$OUT" [CONF] [TAG] [TIME_BUDGET_S]
# CONF: a rendered nccl.conf (default: the committed rack-a node01 render), TAG names the outputs
# ($OUT/nccl-bench-TAG*). NVLink multicast stays off (NCCL_NVLS_ENABLE=0 etc., as those machines require).
# 1. environment: GPUs, topo -m, interfaces, torch/NCCL versions, nccl-tests presence, any /etc/nccl.conf
# 2. the conf exactly as rendered (no substitution), NCCL_DEBUG=INFO, 1 MiB: does NCCL's bootstrap come up?
# 3. NCCL_DEBUG=INFO once for default and suite (NCCL_SOCKET_IFNAME fixed up if it names no interface here):
#    shows "set by environment" for the conf's values, the tuning table and the rings/trees NCCL built
# 4. the benchmark: default / suite / suite without NCCL_ALGO / NCCL_ALGO=Tree, alternating, rounds until budget
set -u
OUT=${1:?usage: nccl_bench_device.sh OUTDIR [CONF] [TAG] [TIME_BUDGET_S]}
CONF=${2:-tests/fixtures/real-2xh200/nccl-bench-rack-a-node01.conf}
TAG=${3:-2xh200}
BUDGET=${4:-200}
MAXSIZE=${MAXSIZE:-4G}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
P="$OUT/nccl-bench-$TAG"
{
  echo "# date"; date -u
  echo "# nvidia-smi -L"; nvidia-smi -L
  echo "# nvidia-smi topo -m"; nvidia-smi topo -m
  echo "# /sys/class/net"; ls /sys/class/net
  echo "# /proc/net/route"; cat /proc/net/route
  echo "# torch / nccl"; python3 -c 'import torch, sys; print(sys.executable, torch.__version__, torch.version.cuda, torch.cuda.nccl.version(), torch.cuda.device_count())'
  echo "# nccl-tests"; command -v all_reduce_perf || echo "all_reduce_perf: not found"
  echo "# nccl conf files"; ls -la /etc/nccl.conf ~/.nccl.conf 2>&1; cat /etc/nccl.conf 2>/dev/null
  echo "# NCCL env"; env | grep -E '^(NCCL|TORCH_SYMM|NVSHMEM)' | sort
  echo "# conf used ($CONF)"; cat "$CONF"
} > "$P-env.txt" 2>&1
cat "$P-env.txt"
echo "== 2. conf as rendered"
timeout 150 python3 benchmarks/nccl_bench.py debug --conf "$CONF" --configs suite --sizes 1M \
  --subsys INIT,ENV,BOOTSTRAP,NET --timeout 120 --log "$P-unmodified.log"; echo "rc $?"
grep -E "NCCL_SOCKET_IFNAME|socket interface|Bootstrap|WARN|Error|error" "$P-unmodified.log" | head -20
echo "== 3. debug"
timeout 200 python3 benchmarks/nccl_bench.py debug --conf "$CONF" --fix-ifname --configs default,suite \
  --sizes 1M,256M --timeout 150 --log "$P-debug.log"; echo "rc $?"
grep -E "set by environment|NCCL_CONF_FILE|Using network|NCCL version" "$P-debug.log" | sort | uniq -c | head -40
echo "== 4. benchmark"
python3 benchmarks/nccl_bench.py run --conf "$CONF" --fix-ifname --configs default,suite,suite-noalgo,algo-Tree \
  --max-size "$MAXSIZE" --rounds 6 --min-rounds 3 --time-budget "$BUDGET" \
  --json "$P.json" --report "$P.md" --log "$P-run.log"; echo "rc $?"
