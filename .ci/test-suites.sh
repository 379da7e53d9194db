#!/usr/bin/env bash
# `make test`: the lanes at once, each in its own pytest process with its own log:
#   unit          tests/unit, in-process (no subprocess or network: tests/unit/conftest.py enforces it)
#   integration   tests/integration: real ansible-playbook/ansible-runner, lint, wheel, galaxy, nginx, promtool
#   rack-a/rack-b tests/testbed, split by module into two lanes of about the same length (each module brings up its
#                 own racks, so modules in different lanes never share one)
#   vllm          tests/vllm: vLLM CPU clusters on the rack; last, the air-gapped site (one node bare -> serving)
# Every tests/testbed module must be in exactly one rack lane (checked below: a new module is never left out).
# Each lane's `--durations` table ends its log, so the next slow test is visible. Exit: the first failing lane's
# code (5 = a lane collected no tests, which fails CI).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTEST=${PYTEST:-.venv/bin/pytest}
LOGS=${PROVISIONER_TEST_LOGS:-.runs/test-logs}
mkdir -p "$LOGS"
T=tests/testbed
# minutes measured on the 2-core machine with all lanes running (docs/development.md): keep the lanes even
# test_inservice_gate reuses test_preflight_health's rack `health` (after it). The air-gap test is in the vllm lane
# (tests/vllm/test_airgap.py, last: it resets node03 of the lane's session rack to a bare host)
RACK_A="$T/test_fabrics.py $T/test_dataflow.py $T/test_preflight_health.py
        $T/test_inservice_gate.py $T/test_site_trust.py $T/test_drift_tiers.py"
# test_demo converges the session rack `rack`; test_installed_rack, test_preflight_iface_rack, test_rack,
# test_unit_restarts and test_remediation_modes reuse it (in this order: test_rack stops and restarts a host)
RACK_B="$T/test_run_drift.py $T/test_site.py $T/test_bmc_rack.py $T/test_demo.py $T/test_installed_rack.py
        $T/test_preflight_iface_rack.py $T/test_rack.py $T/test_unit_restarts.py $T/test_remediation_modes.py
        $T/test_shards.py"
declare -A args=([unit]='tests/unit' [integration]='tests/integration' [rack-a]="$RACK_A" [rack-b]="$RACK_B"
                 [vllm]=tests/vllm)
# CPU priority: the rack and vLLM lanes are the long poles (~25 min); integration (~14 min) yields the CPU to them
# (docs/development.md, "Test suites and their durations"). PROVISIONER_LANE_NICE=0 turns it off.
declare -A nice=([integration]=${PROVISIONER_LANE_NICE:-10})
for f in $T/test_*.py; do
  n=$(printf '%s\n' $RACK_A $RACK_B | grep -cxF "$f")
  [ "$n" -eq 1 ] || { echo "$f is in $n rack lanes (.ci/test-suites.sh): put it in exactly one" >&2; exit 2; }
done
declare -A pid
# PROVISIONER_LANES="unit integration" runs only those lanes (developer loops); CI runs all of them
LANES=${PROVISIONER_LANES:-unit integration rack-a rack-b vllm}
for s in $LANES; do
  [ -n "${args[$s]:-}" ] || { echo "unknown lane '$s' (lanes: ${!args[*]})" >&2; exit 2; }
done
for s in $LANES; do
  # shellcheck disable=SC2086
  ( t0=$(date +%s); eval "nice -n ${nice[$s]:-0} $PYTEST $(echo ${args[$s]}) --durations=25 $*" >"$LOGS/$s.log" 2>&1
    echo "$? $(( $(date +%s) - t0 ))" >"$LOGS/$s.rc" ) &
  pid[$s]=$!
  echo "== $s: $PYTEST $(echo ${args[$s]}) (log $LOGS/$s.log)"
done
rc=0
for s in $LANES; do
  wait "${pid[$s]}"
  read -r r secs <"$LOGS/$s.rc" 2>/dev/null || { r=1; secs=?; }
  echo; echo "== $s: rc=$r in ${secs}s; its log:"
  cat "$LOGS/$s.log"
  if [ "$rc" -eq 0 ] && [ "$r" -ne 0 ]; then rc=$r; fi
done
echo; echo "== lanes (seconds):"
for s in $LANES; do read -r r secs <"$LOGS/$s.rc" 2>/dev/null && echo "   $s rc=$r ${secs}s"; done
exit "$rc"
