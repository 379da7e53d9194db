"""Drift from any state (issue 16): `provision drift` reports every state a host can be in as drift (exit 3), never as
"could not be checked" (exit 1), and leaves the host byte-for-byte as it was; `provision run --limit` heals it.

One rack of its own (PROVISIONER_DRIFT_MATRIX_RACK, default `drift-matrix`, 4 hosts, no vLLM layer: the rack
`make demo` builds), reset to fresh disks at the start. Each round puts the hosts in different states by hand, over
SSH, with the real tools (apt-mark, dpkg, rm, systemctl, nft), all hosts in one drift run:

1. bare (fresh disks, nothing installed), every role of site.yml including the vLLM area (node01-03 are vLLM cluster
   members, node04 is in none);
2. converged with `--skip-tags vllm` (`make demo`), then the whole site.yml: the issue's case (the vllm role ran the
   missing venv's python and drift said "could not be checked"): exit 3, vLLM items only, node04 clean;
3. half-applied, one role state per resource (table in ROUND_HALF);
4. after a failed run (node04: the package download is refused mid-run), plus services stopped/disabled/masked.

Every round: exit 3, exactly the named resources per host (kind, resource, role), hosts unchanged (SNAPSHOT before
and after), then `provision run --limit <hosts> --skip-tags vllm` and a clean drift. Debugging:
PROVISIONER_DRIFT_MATRIX_NO_RESET=1 keeps the rack's disks.
"""

from __future__ import annotations

import concurrent.futures
import difflib
import json
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from testbed_rigs import HOST_SNAPSHOT, CliRig  # noqa: E402  (same directory)

pytestmark = pytest.mark.testbed

PROVISION = [sys.executable, "-m", "provisioner.cli"]
RACK = os.environ.get("PROVISIONER_DRIFT_MATRIX_RACK", "drift-matrix")
HOSTS = ("node01", "node02", "node03", "node04")
VLLM_MEMBERS = ("node01", "node02", "node03")  # vllm_pp = node01+node02, vllm_single = node03


FW_UNIT = "/etc/systemd/system/provisioner-firewall.service"
FW_RULES = "/etc/nftables.d/provisioner-cluster.nft"
LOAD_TABLE = "Load the table (it was removed from the running ruleset)"
DRIVER_PKGS = ("nvidia-kernel-open-580", "nvidia-open-580", "nvidia-utils-580")
CUDA_PKGS = ("cuda-cudart-12-8", "libnccl2", "libnccl-dev")
IB_PKGS = ("rdma-core", "ibverbs-utils", "infiniband-diags", "perftest")


def _norm(s: str) -> str:
    return " ".join(s.split())


class Rig(CliRig):

    def run(self, *args: str) -> dict[str, Any]:
        p = self.cli("run", self.inv, "--json", "--skip-tags", "vllm", *args)
        try:
            return {**json.loads(p.stdout), "exit": p.returncode}  # "rc" is ansible-playbook's
        except ValueError:
            raise AssertionError(f"no JSON from provision run (rc {p.returncode}): {p.stdout}\n{p.stderr}") from None

    def drift(self, *args: str) -> tuple[int, dict[str, Any]]:
        p = self.cli("drift", self.inv, "--report", "json", "--quiet", *args)
        try:
            return p.returncode, json.loads(p.stdout)
        except ValueError:
            raise AssertionError(f"no JSON from provision drift (rc {p.returncode}): {p.stdout}\n{p.stderr}") from None

    def ssh(self, host: str, cmd: str, timeout: float = 600) -> str:
        r = self.h.ssh(host, cmd, timeout=timeout)
        assert r.returncode == 0, f"{host}: {cmd}: {r.stdout}{r.stderr}"
        return r.stdout

    def on_hosts(self, cmds: dict[str, str]) -> dict[str, str]:
        with concurrent.futures.ThreadPoolExecutor(len(cmds)) as ex:
            futs = {h: ex.submit(self.ssh, h, c) for h, c in cmds.items()}
            return {h: f.result() for h, f in futs.items()}

    def snapshots(self, hosts: tuple[str, ...] = HOSTS) -> dict[str, str]:
        return self.on_hosts({h: HOST_SNAPSHOT for h in hosts})


def _items(doc: dict[str, Any], host: str) -> set[tuple[str, str, str | None]]:
    return {(i["kind"], i["resource"], i["role"]) for i in doc["hosts"][host]["drift"]}


def _assert_unchanged(before: dict[str, str], after: dict[str, str]) -> None:
    for h in before:
        assert after[h] == before[h], f"the drift check changed {h}:\n" + "".join(
            list(difflib.unified_diff(before[h].splitlines(True), after[h].splitlines(True)))[:80])


def _assert_drift_only(rc: int, doc: dict[str, Any]) -> None:
    """Exit 3, every host checked (no "could not be checked"), none failed or unreachable."""
    bad = {n: h["errors"] or h["unreachable_message"] for n, h in doc["hosts"].items()
           if h["state"] in ("check_failed", "unreachable", "not_checked")}
    assert not bad and doc["complete"], json.dumps(bad, indent=1)
    assert rc == 3, json.dumps(doc["summary"], indent=1)


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    if os.geteuid() != 0:
        pytest.skip("the simulated rack needs root")
    from provisioner_testbed import rack

    existed = rack.RackState.load(RACK) is not None
    rack.ensure(RACK, len(HOSTS), log=lambda m: print(f"testbed: {m}"))
    if os.environ.get("PROVISIONER_DRIFT_MATRIX_NO_RESET") != "1":
        rack.reset(RACK, log=lambda m: print(f"testbed: {m}"))
    h = rack.ensure(RACK, len(HOSTS), log=lambda m: print(f"testbed: {m}"))
    yield Rig(h, tmp_path_factory.mktemp("runs"))
    if not existed and os.environ.get("PROVISIONER_TESTBED_TEARDOWN") == "1":
        rack.down(RACK)


# ------------------------------------------------------------------------------------------------ 1. bare hosts
# A bare host lacks every resource; packages and services are named exactly. A file that does not exist yet is named
# by its path where Ansible's check-mode result carries one (file, get_url, copy with content, an existing file's
# diff); template returns only {"changed": true} for a new file, so the report falls back to the task name, and a
# `copy src=` to the source's path (runner.resources_of).
BARE_NAMED = {
    *{("package", p, "nvidia_driver") for p in DRIVER_PKGS},
    ("file", "/etc/apt/preferences.d/nvidia-driver", "nvidia_driver"),
    ("package", "nvidia-persistenced", "nvidia_persistenced"),
    ("file", "/etc/apt/preferences.d/nvidia-persistenced", "nvidia_persistenced"),
    ("service", "nvidia-persistenced", "nvidia_persistenced"),
    ("package", "nvidia-fabricmanager-580", "fabric_manager"),
    ("service", "nvidia-fabricmanager", "fabric_manager"),
    *{("package", p, "cuda_nccl") for p in CUDA_PKGS},
    *{("package", p, "infiniband") for p in IB_PKGS},
    ("package", "nftables", "cluster_firewall"),
    ("file", "/etc/nftables.d", "cluster_firewall"),
    ("service", "provisioner-firewall", "cluster_firewall"),
}
# role -> files it creates on a bare host (counted: named by path or by task name, see above)
BARE_FILES = {None: 1, "nvidia_driver": 3, "nvidia_persistenced": 1, "infiniband": 1, "nccl_tuning": 1,
              "cluster_firewall": 3}
VLLM_BARE = {("other", "vLLM venv /opt/vllm/venv missing, would install vllm==0.32.0", "vllm"),
             ("package", "python3-venv", "vllm"), ("package", "libnuma1", "vllm")}


def test_bare_hosts_are_drift_not_errors(rig: Rig) -> None:
    before = rig.snapshots()
    rc, doc = rig.drift()
    after = rig.snapshots()
    _assert_drift_only(rc, doc)
    _assert_unchanged(before, after)
    for h in HOSTS:
        got = _items(doc, h)
        want = BARE_NAMED | (VLLM_BARE if h in VLLM_MEMBERS else set())
        missing = want - got
        assert not missing, f"{h}: not reported: {sorted(missing, key=str)}\ngot: {sorted(got, key=str)}"
        files = {role: sum(1 for k, _, r in got if k == "file" and r == role) for role in BARE_FILES}
        assert all(files[r] >= n for r, n in BARE_FILES.items()), (h, files)
        roles = {r for _, _, r in got}
        # site_trust: the rack hands its own CA to the nodes (site_ca_certificates, the HTTPS stand-in repo)
        assert roles - {"vllm", "vllm_launch"} == set(BARE_FILES) | {"fabric_manager", "cuda_nccl", "site_trust"}, \
            (h, roles)
        assert ("vllm" in roles) == (h in VLLM_MEMBERS), (h, roles)


# ------------------------------------- 2. converged without the vLLM area (`make demo`), then drift on the whole site
def test_demo_state_reports_vllm_as_drift(rig: Rig) -> None:
    data = rig.run()
    assert data["exit"] == 0, json.dumps(data["failures"], indent=1)
    before = rig.snapshots()
    rc, doc = rig.drift()  # the command: `make demo`, then `provision drift inventories/.../hosts.ini`
    _assert_unchanged(before, rig.snapshots())
    _assert_drift_only(rc, doc)
    assert doc["summary"]["drifted_hosts"] == list(VLLM_MEMBERS), doc["summary"]
    assert doc["hosts"]["node04"]["state"] == "clean"  # in no vLLM cluster: the node roles are converged
    for h in VLLM_MEMBERS:
        got = _items(doc, h)
        assert {r for _, _, r in got} == {"vllm", "vllm_launch"}, sorted(got, key=str)
        assert got >= VLLM_BARE, sorted(got, key=str)


# ----------------------------------------------------- 3. half-applied roles, after a failed run, units masked
# host -> (commands that put it in the state, the exact drift items expected)
ROUND: dict[str, tuple[str, set[tuple[str, str, Any]]]] = {
    # driver packages installed but not held, its pin file gone; persistenced stopped and disabled; nccl.conf gone
    "node01": ("apt-mark unhold nvidia-open-580 nvidia-utils-580 >/dev/null; rm /etc/apt/preferences.d/nvidia-driver;"
               " systemctl disable --now nvidia-persistenced 2>/dev/null; rm /etc/nccl.conf",
               {("package", "nvidia-open-580", "nvidia_driver"), ("package", "nvidia-utils-580", "nvidia_driver"),
                ("file", "/etc/apt/preferences.d/nvidia-driver", "nvidia_driver"),
                ("service", "nvidia-persistenced", "nvidia_persistenced"),
                ("file", "/etc/nccl.conf", "nccl_tuning")}),
    # Fabric Manager removed (its unit with it); NCCL installed but not held; our nftables table deleted
    "node02": ("apt-mark unhold nvidia-fabricmanager-580 libnccl2 >/dev/null; "
               "dpkg -r nvidia-fabricmanager-580 >/dev/null 2>&1; nft delete table inet provisioner_cluster",
               {("package", "nvidia-fabricmanager-580", "fabric_manager"),
                ("service", "nvidia-fabricmanager", "fabric_manager"),
                ("package", "libnccl2", "cuda_nccl"),
                ("other", LOAD_TABLE, "cluster_firewall")}),
    # persistenced masked; the firewall's unit file removed (table still loaded); RDMA limits file and a package
    # gone; the repository key gone
    "node03": (f"systemctl mask nvidia-persistenced 2>/dev/null; rm {FW_UNIT}; systemctl daemon-reload; "
               "rm /etc/security/limits.d/90-provisioner-rdma.conf; rm /etc/apt/keyrings/nvidia-cuda.*; "
               "DEBIAN_FRONTEND=noninteractive apt-get -q -y remove perftest >/dev/null 2>&1",
               {("service", "nvidia-persistenced", "nvidia_persistenced"),
                ("file", FW_UNIT, "cluster_firewall"),
                ("service", "provisioner-firewall", "cluster_firewall"),
                ("file", "/etc/security/limits.d/90-provisioner-rdma.conf", "infiniband"),
                ("file", "KEYRING", "nvidia_driver"),
                ("package", "perftest", "infiniband")}),
    # after the failed run below (persistenced removed, nccl.conf removed, the firewall stopped: its ExecStop
    # deletes the table); then Fabric Manager masked, the rules file edited, the apt proxy file removed
    "node04": ("systemctl mask --now nvidia-fabricmanager 2>/dev/null; "
               f"echo '# edited' >> {FW_RULES}; rm /etc/apt/apt.conf.d/90provisioner-proxy",
               {("package", "nvidia-persistenced", "nvidia_persistenced"),
                ("service", "nvidia-persistenced", "nvidia_persistenced"),
                ("file", "/etc/nccl.conf", "nccl_tuning"),
                ("service", "provisioner-firewall", "cluster_firewall"), ("other", LOAD_TABLE, "cluster_firewall"),
                ("file", FW_RULES, "cluster_firewall"),
                ("service", "nvidia-fabricmanager", "fabric_manager"),
                ("file", "/etc/apt/apt.conf.d/90provisioner-proxy", None)}),
}
# the package download refused (apt's proxy and the repository): a run dies at the first package it must fetch
BLOCK = ("nft add table inet h16block; nft add chain inet h16block out '{ type filter hook output priority 0; }'; "
         "nft add rule inet h16block out tcp dport '{ 3128, 8090, 8091 }' reject")


def test_half_applied_failed_run_masked_then_healed(rig: Rig) -> None:
    keyring = rig.ssh("node01", "ls /etc/apt/keyrings/nvidia-cuda.*").strip()
    # node04: a run that fails half-way (nvidia_persistenced cannot download its package: later roles never run)
    rig.ssh("node04", "set -e; apt-mark unhold nvidia-persistenced >/dev/null; systemctl stop nvidia-persistenced || true; "
                      "dpkg -r nvidia-persistenced >/dev/null 2>&1 || true; apt-get clean; rm -f /etc/nccl.conf; "
                      "systemctl stop provisioner-firewall; " + BLOCK)
    data = rig.run("--limit", "node04")
    assert data["exit"] == 1 and data["failed_hosts"] == ["node04"], json.dumps(data, indent=1)[:3000]
    assert data["hosts"]["node04"]["failures"][0]["role"] == "nvidia_persistenced", data["hosts"]["node04"]
    rig.ssh("node04", "nft delete table inet h16block")

    rig.on_hosts({h: "set -e; " + cmd for h, (cmd, _) in ROUND.items()})
    before = rig.snapshots()
    rc, doc = rig.drift("--skip-tags", "vllm")
    _assert_unchanged(before, rig.snapshots())
    _assert_drift_only(rc, doc)
    for h, (_, want) in ROUND.items():
        want = {(k, keyring if r == "KEYRING" else r, role) for k, r, role in want}
        got = _items(doc, h)
        assert got == want, f"{h}: extra {sorted(got - want, key=str)}, missing {sorted(want - got, key=str)}"

    data = rig.run("--limit", ",".join(ROUND))
    assert data["exit"] == 0, json.dumps(data["failures"], indent=1)
    rc, doc = rig.drift("--skip-tags", "vllm")
    assert rc == 0 and not doc["drift_found"], json.dumps({h: v["drift"] for h, v in doc["hosts"].items()}, indent=1)
    # healed for real: units unmasked, enabled and running, holds and the table back
    units = "nvidia-persistenced nvidia-fabricmanager provisioner-firewall"
    for h in HOSTS:
        assert rig.ssh(h, f"systemctl is-active {units}").split() == ["active"] * 3, h
        assert rig.ssh(h, f"systemctl is-enabled {units}").split() == ["enabled"] * 3, h
    assert "provisioner_cluster" in rig.ssh("node02", "nft list tables")
    assert {"libnccl2", "nvidia-open-580"} <= set(rig.ssh("node01", "apt-mark showhold").split()
                                                  + rig.ssh("node02", "apt-mark showhold").split())
