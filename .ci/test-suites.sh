#!/usr/bin/env bash
# `make test`: the lanes at once, each in its own pytest process with its own log: unit (in-process, no subprocess or
# network: tests/unit/conftest.py enforces it), integration (real ansible-playbook/ansible-runner, lint, wheel, galaxy,
# nginx, promtool; no rack), the simulated-rack suite (tests/testbed) and vLLM end to end (tests/vllm). Each lane's
# `--durations` table ends its log, so the next slow test is visible. Exit: the first failing lane's code (5 = a lane
# collected no tests, which fails CI).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTEST=${PYTEST:-.venv/bin/pytest}
LOGS=${PROVISIONER_TEST_LOGS:-.runs/test-logs}
mkdir -p "$LOGS"
# test_shards.py (~13 min) runs in the vLLM lane, the shorter of the two rack lanes (tests/testbed is the long pole)
declare -A args=([unit]='tests/unit' [integration]='tests/integration' [testbed]='tests/testbed --ignore=tests/testbed/test_shards.py'
                 [vllm]='tests/vllm tests/testbed/test_shards.py')
declare -A pid
# PROVISIONER_LANES="unit integration" runs only those lanes (developer loops); CI runs all four
LANES=${PROVISIONER_LANES:-unit integration testbed vllm}
for s in $LANES; do
  [ -n "${args[$s]:-}" ] || { echo "unknown lane '$s' (lanes: ${!args[*]})" >&2; exit 2; }
done
for s in $LANES; do
  ( t0=$(date +%s); eval "$PYTEST ${args[$s]} --durations=25 $*" >"$LOGS/$s.log" 2>&1
    echo "$? $(( $(date +%s) - t0 ))" >"$LOGS/$s.rc" ) &
  pid[$s]=$!
  echo "== $s: $PYTEST ${args[$s]} (log $LOGS/$s.log)"
done
rc=0
for s in $LANES; do
  wait "${pid[$s]}"
  read -r r secs <"$LOGS/$s.rc" 2>/dev/null || { r=1; secs=?; }
  echo; echo "== $s: rc=$r in ${secs}s; its log:"
  cat "$LOGS/$s.log"
  if [ "$rc" -eq 0 ] && [ "$r" -ne 0 ]; then rc=$r; fi
done
exit "$rc"
