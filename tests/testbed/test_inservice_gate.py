"""The vLLM launch's in-service gate on the simulated rack (roles/vllm_launch, docs/vllm.md "The in-service gate").

Rack PROVISIONER_HEALTH_RACK (default `health`, shared with test_preflight_health.py, which runs before it in its
lane: 4 plain hosts, `vllm_pp` = node01+node02, `vllm_single` = node03, node04 in no cluster). The
stand-in GPU stack is installed with apt (as test_preflight_health.py does) so the real health gate can pass; node01
and node03 get the mark through `provision onboard --skip-run` (preflight + health + mark), node02 does not.

A plain rack has no vLLM: the play runs the vllm role's first task only (vllm_facts, tag always) and the whole
vllm_launch role (tag vllm_launch, its nccl_tuning dependency included), with the vllm user's group and helper
directory made first. Then:
- node01 and node02 fail at the gate with the cluster, node02, the mark's path and the fix named; neither has any vLLM
  unit, env file or helper afterwards; exit 1;
- node03's cluster passes the gate and goes on (its env file and unit are written; starting fails later only because
  there is no vLLM binary on a plain rack);
- check mode (`provision drift`) reports the held-back cluster as one `other` drift item per member, not as a failed
  check.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from provisioner import PROJECT_ROOT
from testbed_rigs import own_rack, vllm_files_play  # noqa: E402  (same directory)

from test_preflight_health import _install_stack  # noqa: E402  (same directory)

pytestmark = pytest.mark.testbed

PROVISION = [sys.executable, "-m", "provisioner.cli"]
MARK = "/etc/provisioner/in-service"
VLLM_FILES = ("/etc/vllm/vllm.env", "/etc/systemd/system/vllm.service", "/etc/systemd/system/vllm-ray.service",
              "/usr/local/libexec/provisioner/vllm-group-run")
CLEAN = ("systemctl disable --now vllm.service 2>/dev/null; rm -f " + " ".join(VLLM_FILES) + f" {MARK}; "
         "rm -rf /etc/vllm; systemctl daemon-reload")

PLAY = vllm_files_play("vLLM launch with its in-service gate (plain rack, no vLLM)", {"vllm_health_timeout": 5})


def provision(*args: str, timeout: float = 1200) -> tuple[int, Any, str]:
    p = subprocess.run([*PROVISION, *args], capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=timeout)
    try:
        doc = json.loads(p.stdout)
    except ValueError:
        doc = None
    return p.returncode, doc, p.stdout + p.stderr


@pytest.fixture(scope="module")
def rig() -> Iterator[Any]:
    from provisioner_testbed import rack

    # the rack of test_preflight_health.py (same lane, runs first; same clusters: vllm_pp = node01+node02,
    # vllm_single = node03, node04 in none): its stand-in stack is installed already, faults and marks are cleared here
    with own_rack("PROVISIONER_HEALTH_RACK", "health", 4) as h:
        for host in h.names:
            rack.clear(h.name, host)
            assert h.ssh(host, CLEAN).returncode == 0
        for host in ("node01", "node03"):
            _install_stack(h, host)
        yield h
        for host in h.names:
            h.ssh(host, CLEAN)


def _exists(rig: Any, host: str, path: str) -> bool:
    return rig.ssh(host, f"test -e {path}").returncode == 0


def test_cluster_with_an_unmarked_member_is_held_back(rig: Any, tmp_path: Path) -> None:
    inv = str(rig.inventory)
    # the mark through the real path: preflight + health gate + mark (node02 is not onboarded)
    rc, doc, out = provision("onboard", inv, "node01", "node03", "--skip-run", "--format", "json")
    assert rc == 0, out
    assert doc["hosts"]["node01"]["in_service"] and doc["hosts"]["node03"]["in_service"]
    assert _exists(rig, "node01", MARK) and _exists(rig, "node03", MARK) and not _exists(rig, "node02", MARK)

    play = tmp_path / "launch.yml"
    play.write_text(PLAY)
    rc, rep, out = provision("run", inv, "--playbook", str(play), "--tags", "vllm_launch", "--skip-preflight",
                             "--json")
    assert rc == 1, out[-4000:]
    gate_task = "Stop when a member of this host's vLLM cluster is not in service (nothing of the cluster is changed)"
    by_host = {f["host"]: f for f in rep["failures"]}
    for host in ("node01", "node02"):
        f = by_host[host]
        assert f["task"] == gate_task and f["role"] == "vllm_launch", f
        msg = f["message"]
        assert msg.startswith("vLLM cluster vllm_pp is not launched"), msg
        assert f"node02 (no {MARK})" in msg and f"provision onboard {inv} node02" in msg, msg
        assert "vllm_launch_require_in_service: false" in msg
        assert rep["hosts"][host]["state"] == "failed"
        # nothing of the held-back cluster was written on any member
        for path in VLLM_FILES:
            assert not _exists(rig, host, path), (host, path)
    # the other cluster passed the gate and went on (it fails only where vLLM itself is needed: none on this rack)
    assert "node03" not in by_host or by_host["node03"]["task"] != gate_task, by_host.get("node03")
    assert _exists(rig, "node03", "/etc/vllm/vllm.env") and _exists(rig, "node03", "/etc/systemd/system/vllm.service")

    # check mode: the held-back cluster is drift ("a run would refuse it"), not a failed check
    rc, drift, out = provision("drift", inv, "--playbook", str(play), "--tags", "vllm_launch", "--report", "json",
                               "--limit", "vllm_pp", "--quiet")
    assert rc == 3, out[-4000:]
    for host in ("node01", "node02"):
        h = drift["hosts"][host]
        assert h["state"] == "drifted", h
        items = [(i["kind"], i["resource"]) for i in h["drift"]]
        assert items == [("other", f"vLLM cluster vllm_pp held back, not in service: node02 (no {MARK})")], items
        for path in VLLM_FILES:
            assert not _exists(rig, host, path), (host, path)
