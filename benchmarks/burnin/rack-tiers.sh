#!/bin/bash
# Burn-in tier budgets on the simulated rack (issue 45): `provision burn-in --tier quick` and `--tier standard`
# twice each over every host of rack RACK (default burnin2-health: 4 hosts, vllm_pp = nodes 1+2, vllm_single = node
# 3), with the rack inventory's documented knobs (burnin_load_seconds 3, burnin_stress_seconds 3,
# burnin_ib_seconds 1). Prints each host's seconds on the node (node_burnin.py) and over SSH (+ the cross-node pair
# for cluster members in standard). Run under the rack lock, on a rack that is up and healthy:
#   flock /tmp/provisioner-rack.lock bash benchmarks/burnin/rack-tiers.sh [RACK]
set -u
cd "$(dirname "$0")/../.."
RACK=${1:-burnin2-health}
INV=inventories/testbed-$RACK
DB=$(mktemp -d)/ledger.sqlite3
echo "commit $(git rev-parse --short HEAD) $(date -u +%FT%TZ) load: $(cut -d' ' -f1-3 /proc/loadavg)"
for tier in quick standard; do
  for i in 1 2; do
    out=$(mktemp)
    s=$(date +%s.%N)
    PROVISION_LEDGER=$DB .venv/bin/python -m provisioner.cli burn-in "$INV" --tier $tier --format json > "$out"
    rc=$?
    e=$(date +%s.%N)
    echo "tier $tier run $i rc=$rc wall=$(python3 -c "print(round($e-$s,1))")s load: $(cut -d' ' -f1-3 /proc/loadavg)"
    python3 - "$out" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for n, h in d["hosts"].items():
    cross = sum(1 for r in h["results"] if r["check"] in ("ib_pair", "nccl_cluster") and r["status"] != "skip")
    print(f"  {n} ok={h['ok']} node_s={h['node_seconds']} ssh_s={h['seconds']} cross_results={cross}")
print(f"  total_s={d['seconds']}")
PY
  done
done
