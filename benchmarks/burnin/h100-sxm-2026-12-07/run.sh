#!/bin/bash
# the burn-in program of provisioner (roles/node_burnin/files, unmodified) on the lent GPU: 2 quick runs, 1 standard
cd "$(dirname "$0")"
export PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version,vbios_version,pcie.link.gen.max,pcie.link.width.max,power.limit,clocks.max.sm,memory.total --format=csv
  python3 -c "import torch,sys;print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.nccl.version())"
  nproc; uptime; sha256sum node_burnin.py burnin_torch.py burninjudge.py nodeparse.py; } > $OUT/env.txt 2>&1
for i in 1 2; do
  s=$(date +%s); timeout 300 python3 node_burnin.py --tier quick > $OUT/quick$i.jsonl 2>>$OUT/stderr.txt
  echo "quick$i rc=$? wall=$(( $(date +%s) - s ))s" >> $OUT/env.txt
done
s=$(date +%s); timeout 240 python3 node_burnin.py --tier standard --stress-seconds 60 > $OUT/standard.jsonl 2>>$OUT/stderr.txt
echo "standard(stress 60s) rc=$? wall=$(( $(date +%s) - s ))s" >> $OUT/env.txt
uptime >> $OUT/env.txt
cat $OUT/env.txt; grep -h '"value"' $OUT/*.jsonl | python3 -c "import sys,json;[print(d['check'],d.get('gpu'),d.get('value'),d['status']) for d in map(json.loads,sys.stdin)]"; tail -qn1 $OUT/*.jsonl | cut -c1-200; tail -5 $OUT/stderr.txt
