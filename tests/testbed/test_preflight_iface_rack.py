"""Preflight's NCCL bootstrap interface check on the simulated rack: an inventory whose `bootstrap_interface` names
an interface the node does not have (the rendered /etc/nccl.conf would say NCCL_SOCKET_IFNAME==eth9, and NCCL's
bootstrap would die with "no socket interface found") fails that host, naming the host, the check, the expected
setting and the interfaces found; the other host passes.

Uses the session rack `rack` (`make demo`'s, read-only here) and a copy of its inventory; nothing on the hosts is
changed (no GPU stack needed: the check reads /sys/class/net in the same single SSH exec).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner import PROJECT_ROOT

pytestmark = pytest.mark.testbed

PROVISION = [sys.executable, "-m", "provisioner.cli"]


@pytest.fixture(scope="module")
def rig(testbed: Any) -> Any:
    return testbed


def inventory_copy(h: Any, dest: Path, host_vars: dict[str, dict[str, str]]) -> Path:
    """The rack's inventory directory copied to `dest`, with host_vars/<host>.yml added."""
    inv_dir = dest / "inv"
    shutil.copytree(h.inventory.parent, inv_dir)
    (inv_dir / "host_vars").mkdir(exist_ok=True)
    for host, values in host_vars.items():
        f = inv_dir / "host_vars" / f"{host}.yml"
        merged = {**(yaml.safe_load(f.read_text()) or {} if f.exists() else {}), **values}
        f.write_text(yaml.safe_dump(merged))
    return inv_dir / h.inventory.name


def preflight(inventory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PROVISION, "preflight", str(inventory), *args], capture_output=True, text=True,
                          cwd=PROJECT_ROOT, timeout=600)


def errors(doc: dict[str, Any], host: str) -> dict[str, dict[str, str]]:
    return {m["check"]: m for m in doc["hosts"][host]["mismatches"] if m["severity"] == "error"}


def test_the_racks_own_interface_passes(rig: Any) -> None:
    r = preflight(rig.inventory, "--format", "json")
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    for host in rig.names:
        assert "host0" in doc["hosts"][host]["facts"]["net_ifaces"]
        assert "socket_ifname" not in errors(doc, host)


def test_missing_bootstrap_interface_fails_that_host(rig: Any, tmp_path: Path) -> None:
    good, bad = rig.names[:2]
    inv = inventory_copy(rig, tmp_path, {bad: {"bootstrap_interface": "eth9"}})
    r = preflight(inv, "--format", "json")
    assert r.returncode == 1, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["summary"]["mismatched"] == 1
    m = errors(doc, bad)["socket_ifname"]
    assert m["expected"] == "NCCL_SOCKET_IFNAME==eth9 (bootstrap_interface) to match an interface"
    assert m["found"].startswith("no such interface (interfaces: ") and "host0" in m["found"]
    assert doc["hosts"][good]["ok"] and not errors(doc, good)

    text = preflight(inv)
    assert text.returncode == 1
    assert f"{bad}: socket_ifname: expected NCCL_SOCKET_IFNAME==eth9 (bootstrap_interface)" in text.stdout
    assert f"{bad}  MISMATCH" in text.stdout and f"{good}  OK" in text.stdout


def test_list_with_one_missing_interface_only_warns(rig: Any, tmp_path: Path) -> None:
    host = rig.names[0]
    inv = inventory_copy(rig, tmp_path, {host: {"bootstrap_interface": "=host0,eth9"}})
    r = preflight(inv, "--format", "json", "--limit", host)
    assert r.returncode == 0, r.stdout + r.stderr
    warn = [m for m in json.loads(r.stdout)["hosts"][host]["mismatches"] if m["check"] == "socket_ifname"]
    assert [(m["severity"], m["found"].split(" (")[0]) for m in warn] == [("warning", "no eth9")]
