"""Unit starts and restarts on the simulated rack are as reliable as on a real node.

Every host of the rack starts, restarts and stops two units (a oneshot that stays active, like the cluster firewall,
and a long-running service, whose restart kills its control group) many times at once on all hosts. Hosts that
shared one cgroup subtree (systemd-nspawn --keep-unit without a cgroup per host) failed a few of these with
status=219/CGROUP or "Failed to kill control group ... Input/output error".
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = pytest.mark.testbed

CYCLES = 60  # per host: 60 x (restart oneshot + restart service + stop/start service) = 240 unit jobs per host

SETUP = r"""
set -e
cat > /etc/systemd/system/pv-stress-oneshot.service <<'EOF'
[Unit]
Description=restart stress: oneshot that stays active
# systemd's own start rate limit (5 in 10 s) would refuse the loop's starts: this test is about cgroups
StartLimitIntervalSec=0
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/true
ExecReload=/bin/true
EOF
cat > /etc/systemd/system/pv-stress-daemon.service <<'EOF'
[Unit]
Description=restart stress: long-running service
StartLimitIntervalSec=0
[Service]
ExecStart=/bin/sleep infinity
EOF
systemctl daemon-reload
systemctl start pv-stress-oneshot.service pv-stress-daemon.service
"""

LOOP = r"""
fails=0
for i in $(seq {cycles}); do
  systemctl restart pv-stress-oneshot.service || fails=$((fails+1))
  systemctl restart pv-stress-daemon.service || fails=$((fails+1))
  systemctl stop pv-stress-daemon.service || fails=$((fails+1))
  systemctl start pv-stress-daemon.service || fails=$((fails+1))
done
echo "fails=$fails"
journalctl -q --no-pager -u pv-stress-oneshot.service -u pv-stress-daemon.service \
  | grep -E '219/CGROUP|Failed to kill control group|Failed to attach' | head -5 || true
"""

CLEANUP = r"""
systemctl stop pv-stress-oneshot.service pv-stress-daemon.service || true
rm -f /etc/systemd/system/pv-stress-oneshot.service /etc/systemd/system/pv-stress-daemon.service
systemctl daemon-reload
systemctl reset-failed 2>/dev/null || true
"""


def test_unit_restarts_never_fail_across_the_rack(testbed) -> None:
    hosts = list(testbed.names)
    for h in hosts:
        r = testbed.ssh(h, SETUP)
        assert r.returncode == 0, f"{h}: {r.stderr}"
    try:
        with ThreadPoolExecutor(len(hosts)) as ex:
            results = dict(zip(hosts, ex.map(lambda h: testbed.ssh(h, LOOP.format(cycles=CYCLES), timeout=900),
                                             hosts)))
    finally:
        for h in hosts:
            testbed.ssh(h, CLEANUP)
    report = {h: r.stdout.strip() for h, r in results.items()}
    jobs = CYCLES * 4 * len(hosts)
    print(f"{jobs} unit start/restart/stop jobs on {len(hosts)} hosts: {report}")
    for h, r in results.items():
        assert r.returncode == 0, f"{h}: {r.stderr}"
        assert r.stdout.strip().splitlines()[0] == "fails=0", f"{h}: {report[h]}"
        assert len(r.stdout.strip().splitlines()) == 1, f"{h}: journal shows cgroup failures: {report[h]}"
