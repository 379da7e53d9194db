"""The remediation modes on the simulated rack (the lane's session rack, no rack of its own): with a fatal XID injected
on node01, `observe` and `recommend` record what they would do and change nothing on the node (its in-service mark,
its boot) nor in its lifecycle; `--approve ID` then acts (the node quarantined, the mark removed over SSH). The real
health pass reads the injected XID from the node's kernel log. A ledger of its own (PROVISION_LEDGER) keeps the
lane's other tests' states apart; the fault is cleared and node01's in-service mark put back at the end."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.testbed

NODE = "node01"
MARK = "/etc/provisioner/in-service"
BOOT_ID = "cat /proc/sys/kernel/random/boot_id"


def _cli(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "provisioner.cli", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def _inventory(testbed: Any, tmp: Path, mode: str) -> Path:
    inv = tmp / f"inv-{mode}"
    if not inv.exists():
        shutil.copytree(testbed.inventory.parent, inv)
        with (inv / "group_vars" / "gpu_nodes.yml").open("a") as f:
            f.write("lifecycle_policy:\n  quarantine_on: [xid]\n  remediation: [gpu_reset]\n")
    path = inv / "group_vars" / "all.yml"
    # the rack's own rails say `mode: act` (provisioner_testbed/inventory_writer.py); each mode on this copy
    text = re.sub(r"(?m)^remediation_rails:\n(  .*\n)*", "", path.read_text())
    path.write_text(text.rstrip("\n") + f"\nremediation_rails:\n  mode: {mode}\n")
    return inv / testbed.inventory.name


def test_observe_and_recommend_change_nothing_and_approve_acts(testbed: Any, tmp_path: Path) -> None:
    from provisioner.ledger import Ledger
    from provisioner_testbed import rack

    env = dict(os.environ, PROVISION_LEDGER=str(tmp_path / "ledger.sqlite3"), PROVISION_RUNS_DIR=str(tmp_path / "runs"),
               COLUMNS="300")
    site = f"testbed-{testbed.name}"
    with Ledger.open(tmp_path / "ledger.sqlite3", site=site) as lg:  # node01 serving, as onboarding leaves it
        for a, b in (("new", "provisioning"), ("provisioning", "burn-in"), ("burn-in", "in-service")):
            lg.record_transition(NODE, a, b, reason="test setup", actor="test", at=time.time() - 7200)
    saved = testbed.ssh(NODE, f"base64 -w0 {MARK}")  # the session rack's mark, put back at the end
    r = testbed.ssh(NODE, f"install -d /etc/provisioner && echo '{{\"by\": \"test\"}}' > {MARK} && {BOOT_ID}")
    assert r.returncode == 0, r.stderr
    boot = r.stdout.strip()
    rack.fault(testbed.name, NODE, ["xid=79"])
    try:
        inv = _inventory(testbed, tmp_path, "observe")
        h = _cli(env, "health", str(inv), "--limit", NODE)
        assert h.returncode == 1 and "xid" in h.stdout, h.stdout + h.stderr
        for mode, word in (("observe", "observed"), ("recommend", "recommended")):
            inv = _inventory(testbed, tmp_path, mode)
            p = _cli(env, "remediate", str(inv), "--limit", NODE, "--format", "json")
            assert p.returncode == 0, p.stdout + p.stderr
            [line] = json.loads(p.stdout)["actions"]
            assert line["status"] == word and line["action"] == "quarantine", line
            # nothing changed on the node nor in its lifecycle
            assert testbed.ssh(NODE, f"test -f {MARK} && {BOOT_ID}").stdout.strip() == boot, mode
            with Ledger.open(tmp_path / "ledger.sqlite3", site=site) as lg:
                assert lg.state(NODE)[0] == "in-service" and lg.incidents() == []
        rec = line["id"]
        ok = _cli(env, "remediate", str(inv), "--limit", NODE, "--approve", str(rec))
        assert f"{NODE}: in-service -> draining" in ok.stdout and f"{NODE}: draining -> quarantined" in ok.stdout, \
            ok.stdout + ok.stderr
        assert f"{NODE}: remediate: gpu_reset" in ok.stdout and "recommended as #" in ok.stdout  # the step waits
        assert testbed.ssh(NODE, f"test -e {MARK}").returncode == 1  # the mark removed over SSH
        assert testbed.ssh(NODE, BOOT_ID).stdout.strip() == boot
        with Ledger.open(tmp_path / "ledger.sqlite3", site=site) as lg:
            assert lg.state(NODE)[0] == "quarantined"
            act = lg.action(rec)
            assert act is not None and act.status == "done" and act.decided_by, act
            [inc] = lg.incidents()
            assert inc.host == NODE and inc.quarantined is not None and inc.drained is not None
    finally:
        rack.clear(testbed.name, NODE)
        testbed.ssh(NODE, f"echo {saved.stdout.strip()} | base64 -d > {MARK}" if saved.returncode == 0 and
                    saved.stdout.strip() else f"rm -f {MARK}")
