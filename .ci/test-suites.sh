#!/usr/bin/env bash
# `make test`: the three suites at once, each in its own pytest process with its own log: unit (no rack), the
# simulated-rack suite (tests/testbed) and vLLM end to end (tests/vllm). They share no rack (each test module names
# its own), and most of a rack test's wall time is waiting on hosts, so running them side by side roughly halves the
# whole suite's wall time on a 2-core machine. Exit: the first failing suite's code (5 = collected no tests).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTEST=${PYTEST:-.venv/bin/pytest}
LOGS=${PROVISIONER_TEST_LOGS:-.runs/test-logs}
mkdir -p "$LOGS"
# test_shards.py (~13 min) runs in the vLLM lane, the shorter of the two rack lanes (tests/testbed is the long pole)
declare -A args=([unit]='tests -m "not testbed and not vllm"' [testbed]='tests/testbed --ignore=tests/testbed/test_shards.py'
                 [vllm]='tests/vllm tests/testbed/test_shards.py')
declare -A pid
for s in unit testbed vllm; do
  ( t0=$(date +%s); eval "$PYTEST ${args[$s]} $*" >"$LOGS/$s.log" 2>&1
    echo "$? $(( $(date +%s) - t0 ))" >"$LOGS/$s.rc" ) &
  pid[$s]=$!
  echo "== $s: $PYTEST ${args[$s]} (log $LOGS/$s.log)"
done
rc=0
for s in unit testbed vllm; do
  wait "${pid[$s]}"
  read -r r secs <"$LOGS/$s.rc" 2>/dev/null || { r=1; secs=?; }
  echo; echo "== $s: rc=$r in ${secs}s; its log:"
  cat "$LOGS/$s.log"
  if [ "$rc" -eq 0 ] && [ "$r" -ne 0 ]; then rc=$r; fi
done
exit "$rc"
