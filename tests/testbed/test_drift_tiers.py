"""Drift from any state (issue 16) and the two-tier drift's correctness (issue 27), on one rack and one site.yml run
from bare:
- any state a host can be in is drift (exit 3, exactly the named resources per host: kind, resource, role), never
  "could not be checked" (exit 1), and every host stays byte-for-byte as it was (HOST_SNAPSHOT before and after);
  `provision run --limit` heals it;
- in every scenario `provision drift` (probe, then Ansible for the hosts it sends on) reports exactly the exit code,
  host states and items that `provision drift --full` (Ansible for everyone) reports, and each host is in the tier
  the scenario predicts.

One rack of its own (PROVISIONER_DRIFT_TIERS_RACK, default `drift-tiers`, 4 hosts, no vLLM layer: the rack `make demo`
builds), reset to fresh disks, its own run directory and ledger. Runs and drifts skip the vllm tag except where said.
Where every host goes to Ansible for a reason another scenario already compares with `--full` (no record: 6;
inputs changed: the inventory change), the tiered drift alone is run: it is the same check of the same hosts.
Scenarios, in order (each tampers with different hosts, so one tiered and one `--full` drift check them together):
1. bare: every role of site.yml including the vLLM area (node01-03 are vLLM cluster members, node04 is in none);
2. `provision run` from bare (`make demo`): every host recorded;
3. each tamper kind (file content, mode, removed; unit stopped, disabled, masked; hold removed, package removed;
   nftables table deleted) as half-applied roles on node01-03 (table ROUND), node04 left clean;
4. healed with --limit (node04 keeps the first run's record: probe only);
5. an inventory change not applied (-e); a rotated vaulted secret; a role template change not applied;
6. node01 after a failed run (its package download refused mid-run), then masked/edited by hand; node02's record
   deleted, node03's corrupted, node04 unreachable; then healed;
7. the demo state drifted on the whole site.yml (the issue 16 case): vLLM items only, node04 clean.
"""

from __future__ import annotations

import concurrent.futures
import difflib
import json
import os
import shutil
import sqlite3
import sys
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from testbed_rigs import HOST_SNAPSHOT, CliRig  # noqa: E402  (same directory)

pytestmark = pytest.mark.testbed

RACK = os.environ.get("PROVISIONER_DRIFT_TIERS_RACK", "drift-tiers")
HOSTS = ("node01", "node02", "node03", "node04")
VLLM_MEMBERS = ("node01", "node02", "node03")  # vllm_pp = node01+node02, vllm_single = node03
SKIP = ("--skip-tags", "vllm")  # runs and drifts alike (the rack has no vLLM layer)
PROJECT = Path(__file__).resolve().parents[2]
# the package download refused (apt's proxy and the repository): a run dies at the first package it must fetch
BLOCK = ("nft add table inet h27block; nft add chain inet h27block out '{ type filter hook output priority 0; }'; "
         "nft add rule inet h27block out tcp dport '{ 3128, 8090, 8091 }' reject")
FW_UNIT = "/etc/systemd/system/provisioner-firewall.service"
FW_RULES = "/etc/nftables.d/provisioner-cluster.nft"
LIMITS = "/etc/security/limits.d/90-provisioner-rdma.conf"
LOAD_TABLE = "Load the table (it was removed from the running ruleset)"
DRIVER_PKGS = ("nvidia-kernel-open-580", "nvidia-open-580", "nvidia-utils-580")
CUDA_PKGS = ("cuda-cudart-12-8", "libnccl2", "libnccl-dev")
IB_PKGS = ("rdma-core", "ibverbs-utils", "infiniband-diags", "perftest")


class Rig(CliRig):
    env: dict[str, str] = {}

    def cli(self, *args: str, timeout: float = 2400) -> Any:
        old = dict(os.environ)
        os.environ.update(self.env)
        try:
            return super().cli(*args, timeout=timeout)
        finally:
            os.environ.clear()
            os.environ.update(old)

    def run(self, *args: str) -> dict[str, Any]:
        p = self.cli("run", self.inv, "--json", *SKIP, *args)
        try:
            return {**json.loads(p.stdout), "exit": p.returncode, "stderr": p.stderr}
        except ValueError:
            raise AssertionError(f"no JSON from provision run (rc {p.returncode}): {p.stdout}\n{p.stderr}") from None

    def drift(self, *args: str, skip: bool = True) -> tuple[int, dict[str, Any]]:
        p = self.cli("drift", self.inv, "--report", "json", "--quiet", *(SKIP if skip else ()), *args)
        try:
            return p.returncode, json.loads(p.stdout)
        except ValueError:
            raise AssertionError(f"no JSON from provision drift (rc {p.returncode}): {p.stdout}\n{p.stderr}") from None

    def ssh(self, host: str, cmd: str) -> str:
        r = self.h.ssh(host, cmd, timeout=600)
        assert r.returncode == 0, f"{host}: {cmd}: {r.stdout}{r.stderr}"
        return r.stdout

    def on_hosts(self, cmds: dict[str, str]) -> dict[str, str]:
        with concurrent.futures.ThreadPoolExecutor(len(cmds)) as ex:
            futs = {h: ex.submit(self.ssh, h, c) for h, c in cmds.items()}
            return {h: f.result() for h, f in futs.items()}

    def snapshots(self, hosts: tuple[str, ...] = HOSTS) -> dict[str, str]:
        return self.on_hosts({h: HOST_SNAPSHOT for h in hosts})

    @property
    def ledger(self) -> Path:
        return self.runs / "ledger.sqlite3"


def _view(doc: dict[str, Any]) -> dict[str, Any]:
    """What must be equal between the tiers and --full: per host its state and its items."""
    return {h: (v["state"], sorted((i["kind"], i["resource"], i["role"] or "") for i in v["drift"]))
            for h, v in doc["hosts"].items()}


def same_as_full(rig: Rig, *args: str, skip: bool = True) -> tuple[int, dict[str, Any]]:
    """Tiered drift, then --full; assert the same outcome; return the tiered one."""
    rc, doc = rig.drift(*args, skip=skip)
    rc_full, full = rig.drift("--full", *args, skip=skip)
    assert (rc, _view(doc)) == (rc_full, _view(full)), json.dumps(
        {"tiered": [rc, _view(doc), {h: v["tier_reason"] for h, v in doc["hosts"].items()}],
         "full": [rc_full, _view(full)]}, indent=1)
    assert all(v["tier"] == 2 for v in full["hosts"].values()), full["summary"]
    return rc, doc


def tiers(doc: dict[str, Any]) -> dict[str, int]:
    return {h: v["tier"] for h, v in doc["hosts"].items()}


def reason(doc: dict[str, Any], host: str) -> str:
    return doc["hosts"][host]["tier_reason"] or ""


def _items(doc: dict[str, Any], host: str) -> set[tuple[str, str, str | None]]:
    return {(i["kind"], i["resource"], i["role"]) for i in doc["hosts"][host]["drift"]}


def _assert_unchanged(before: dict[str, str], after: dict[str, str]) -> None:
    for h in before:
        assert after[h] == before[h], f"a drift changed {h}:\n" + "".join(
            list(difflib.unified_diff(before[h].splitlines(True), after[h].splitlines(True)))[:80])


def _assert_drift_only(rc: int, doc: dict[str, Any]) -> None:
    """Exit 3, every host checked (no "could not be checked"), none failed or unreachable."""
    bad = {n: h["errors"] or h["unreachable_message"] for n, h in doc["hosts"].items()
           if h["state"] in ("check_failed", "unreachable", "not_checked")}
    assert not bad and doc["complete"], json.dumps(bad, indent=1)
    assert rc == 3, json.dumps(doc["summary"], indent=1)


def _assert_exact(doc: dict[str, Any], host: str, want: set[tuple[str, str, Any]]) -> None:
    got = _items(doc, host)
    assert got == want, f"{host}: extra {sorted(got - want, key=str)}, missing {sorted(want - got, key=str)}"


def _assert_healed(rig: Rig, hosts: tuple[str, ...]) -> None:
    """Healed for real: the units unmasked, enabled and running."""
    units = "nvidia-persistenced nvidia-fabricmanager provisioner-firewall"
    for h in hosts:
        assert rig.ssh(h, f"systemctl is-active {units}").split() == ["active"] * 3, h
        assert rig.ssh(h, f"systemctl is-enabled {units}").split() == ["enabled"] * 3, h


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    if os.geteuid() != 0:
        pytest.skip("the simulated rack needs root")
    from provisioner_testbed import rack

    existed = rack.RackState.load(RACK) is not None
    rack.ensure(RACK, len(HOSTS), log=lambda m: print(f"testbed: {m}"))
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


def test_bare_hosts_are_drift_not_errors_and_all_go_to_ansible(rig: Rig) -> None:
    before = rig.snapshots()
    rc, doc = rig.drift(skip=False)  # the whole site.yml, the vLLM area too
    _assert_unchanged(before, rig.snapshots())
    _assert_drift_only(rc, doc)
    assert set(tiers(doc).values()) == {2}
    assert all(reason(doc, h).startswith("no recorded state") for h in HOSTS), doc["summary"]["tiers"]
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


def test_a_run_from_bare_records_every_host(rig: Rig) -> None:
    data = rig.run()  # `make demo`: site.yml without the vLLM area
    assert data["exit"] == 0 and "not recorded" not in data["stderr"], data["stderr"]
    with closing(sqlite3.connect(rig.ledger)) as db, db:
        assert sorted(r[0] for r in db.execute("SELECT host FROM host_state")) == list(HOSTS)


# ------------------------------------------------------------- 3. each tamper kind, as half-applied roles, one drift
# host -> (commands that put it in the state, the exact drift items expected)
ROUND: dict[str, tuple[str, set[tuple[str, str, Any]]]] = {
    # driver packages installed but not held, its pin file gone; persistenced stopped and disabled; nccl.conf gone
    "node01": ("apt-mark unhold nvidia-open-580 nvidia-utils-580 >/dev/null; rm /etc/apt/preferences.d/nvidia-driver;"
               " systemctl disable --now nvidia-persistenced 2>/dev/null; rm /etc/nccl.conf",
               {("package", "nvidia-open-580", "nvidia_driver"), ("package", "nvidia-utils-580", "nvidia_driver"),
                ("file", "/etc/apt/preferences.d/nvidia-driver", "nvidia_driver"),
                ("service", "nvidia-persistenced", "nvidia_persistenced"),
                ("file", "/etc/nccl.conf", "nccl_tuning")}),
    # Fabric Manager removed (its unit with it); NCCL installed but not held; our nftables table deleted;
    # persistenced stopped (still enabled); the RDMA limits file's mode changed
    "node02": ("apt-mark unhold nvidia-fabricmanager-580 libnccl2 >/dev/null; "
               "dpkg -r nvidia-fabricmanager-580 >/dev/null 2>&1; nft delete table inet provisioner_cluster; "
               f"systemctl stop nvidia-persistenced; chmod 600 {LIMITS}",
               {("package", "nvidia-fabricmanager-580", "fabric_manager"),
                ("service", "nvidia-fabricmanager", "fabric_manager"),
                ("package", "libnccl2", "cuda_nccl"),
                ("other", LOAD_TABLE, "cluster_firewall"),
                ("service", "nvidia-persistenced", "nvidia_persistenced"),
                ("file", LIMITS, "infiniband")}),
    # persistenced masked; the firewall's unit file removed (table still loaded); RDMA limits file and a package
    # gone; the repository key gone; a line appended to nccl.conf
    "node03": (f"systemctl mask nvidia-persistenced 2>/dev/null; rm {FW_UNIT}; systemctl daemon-reload; "
               f"rm {LIMITS}; rm /etc/apt/keyrings/nvidia-cuda.*; echo '# tampered' >> /etc/nccl.conf; "
               "DEBIAN_FRONTEND=noninteractive apt-get -q -y remove perftest >/dev/null 2>&1",
               {("service", "nvidia-persistenced", "nvidia_persistenced"),
                ("file", FW_UNIT, "cluster_firewall"),
                ("service", "provisioner-firewall", "cluster_firewall"),
                ("file", LIMITS, "infiniband"),
                ("file", "KEYRING", "nvidia_driver"),
                ("file", "/etc/nccl.conf", "nccl_tuning"),
                ("package", "perftest", "infiniband")}),
}
# items the probe need not have seen itself (tier 2): services whose unit went with its package or unit file
NOT_PROBED = {("service", "nvidia-fabricmanager", "fabric_manager"),
              ("service", "provisioner-firewall", "cluster_firewall")}


def test_each_tamper_kind_is_found_by_the_probe_and_named_exactly_by_ansible(rig: Rig) -> None:
    keyring = rig.ssh("node01", "ls /etc/apt/keyrings/nvidia-cuda.*").strip()
    rig.on_hosts({h: "set -e; " + cmd for h, (cmd, _) in ROUND.items()})
    before = rig.snapshots()
    rc, doc = same_as_full(rig)
    _assert_unchanged(before, rig.snapshots())
    _assert_drift_only(rc, doc)
    assert tiers(doc) == {"node01": 2, "node02": 2, "node03": 2, "node04": 1}
    assert doc["hosts"]["node04"]["state"] == "clean"
    for h, (_, want) in ROUND.items():
        _assert_exact(doc, h, {(k, keyring if r == "KEYRING" else r, role) for k, r, role in want})
        assert reason(doc, h).startswith("probe found"), reason(doc, h)
        unseen = [i for i in doc["hosts"][h]["drift"] if i["tier"] != 1 and i["kind"] != "other"
                  and (i["kind"], i["resource"], i["role"]) not in NOT_PROBED]
        assert not unseen, (h, unseen)
    probe = doc["hosts"]["node02"]["probe_changes"]
    assert any("nvidia-persistenced.service" in c for c in probe) and any("nftables" in c for c in probe), probe


def test_healed_with_limit_the_others_keep_their_records(rig: Rig) -> None:
    data = rig.run("--limit", ",".join(ROUND))
    assert data["exit"] == 0, json.dumps(data["failures"], indent=1)
    rc, doc = same_as_full(rig)
    assert rc == 0 and tiers(doc) == dict.fromkeys(HOSTS, 1), {h: reason(doc, h) for h in HOSTS}
    assert doc["summary"]["tiers"]["tier1"] == 4 and doc["summary"]["tiers"]["tier2"] == 0
    # healed for real: units unmasked, enabled and running, holds and the table back
    _assert_healed(rig, tuple(ROUND))
    assert "provisioner_cluster" in rig.ssh("node02", "nft list tables")
    assert {"nvidia-open-580", "nvidia-utils-580"} <= set(rig.ssh("node01", "apt-mark showhold").split())
    assert "libnccl2" in rig.ssh("node02", "apt-mark showhold").split()


# -------------------------------------------------------------------------- 5. inputs changed, not applied yet
def test_an_inventory_change_not_applied_goes_to_ansible(rig: Rig) -> None:
    rc, doc = same_as_full(rig, "-e", '{"nccl_ib_timeout": 21}')
    assert rc == 3 and tiers(doc) == dict.fromkeys(HOSTS, 2)
    assert all(reason(doc, h).startswith("inputs changed") for h in HOSTS)
    assert all(("file", "/etc/nccl.conf", "nccl_tuning") in {(i["kind"], i["resource"], i["role"])
                                                             for i in doc["hosts"][h]["drift"]} for h in HOSTS)
    rc, doc = rig.drift()  # the inventory as applied: the probe again
    assert rc == 0 and tiers(doc) == dict.fromkeys(HOSTS, 1)


def test_a_new_vaulted_secret_not_applied_goes_to_ansible_and_the_ledger_cannot_reveal_it(rig: Rig,
                                                                                          tmp_path: Path) -> None:
    """The rack's API key is vaulted: a rotated key (a vaulted -e @FILE here) is a new input, so every host goes to
    Ansible; the ledger's input digests are keyed (its own ledger_meta key, no key file) and no file of the runs
    holds either key."""
    from provisioner_testbed import inventory_writer as invw
    from provisioner_testbed import vault

    rotated = "rotated-api-key-5150"
    cipher = invw.vault_encrypter(vault.password_file())("vllm_api_key", rotated)
    f = tmp_path / "rotated.yml"
    f.write_text("vllm_api_key: !vault |\n" + "".join(f"  {ln}\n" for ln in cipher.splitlines()))
    rc, doc = rig.drift("-e", f"@{f}")
    assert rc == 0 and tiers(doc) == dict.fromkeys(HOSTS, 2), {h: reason(doc, h) for h in HOSTS}
    assert all(reason(doc, h).startswith("inputs changed") for h in HOSTS)
    # Ansible found the hosts clean (this rack serves nothing with the key): their records were refreshed with the
    # rotated key's inputs; the same -e is the probe alone now, and the key as the inventory has it is new again
    rc, doc = rig.drift("-e", f"@{f}")
    assert rc == 0 and tiers(doc) == dict.fromkeys(HOSTS, 1), {h: reason(doc, h) for h in HOSTS}
    rc, doc = rig.drift()
    assert rc == 0 and all(reason(doc, h).startswith("inputs changed") for h in HOSTS), tiers(doc)
    rc, doc = rig.drift()
    assert rc == 0 and tiers(doc) == dict.fromkeys(HOSTS, 1), {h: reason(doc, h) for h in HOSTS}
    assert not (rig.ledger.parent / "digest.key").exists()  # one key: the ledger's
    hits = [str(p) for p in rig.runs.rglob("*") if p.is_file() and p.stat().st_size < 50_000_000
            for s in (rotated, "testbed-vllm-key") if s.encode() in p.read_bytes()]
    assert hits == []


def test_a_template_change_not_applied_goes_to_ansible(rig: Rig, tmp_path: Path) -> None:
    data = tmp_path / "data"
    for d in ("playbooks", "roles", "templates", "plugins"):
        shutil.copytree(PROJECT / d, data / d, symlinks=True)
    shutil.copytree(PROJECT / "meta", data / "meta")
    for f in ("ansible.cfg", "galaxy.yml"):
        shutil.copy(PROJECT / f, data / f)
    (tpl,) = [p for p in data.rglob("nccl.conf.j2")]
    tpl.write_text(tpl.read_text() + "# a new line in the template\n")
    rig.env = {"PROVISION_DATA_DIR": str(data)}
    try:
        rc, doc = rig.drift()
    finally:
        rig.env = {}
    assert rc == 3 and tiers(doc) == dict.fromkeys(HOSTS, 2)
    assert all(reason(doc, h).startswith("inputs changed") for h in HOSTS)


# ------------------------------------------ 6. after a failed run, records missing or corrupted, a host unreachable
# node01 after the failed run below (persistenced removed, nccl.conf removed, the firewall stopped: its ExecStop
# deletes the table); then Fabric Manager masked, the rules file edited, the apt proxy file removed
FAILED_THEN = ("systemctl mask --now nvidia-fabricmanager 2>/dev/null; "
               f"echo '# edited' >> {FW_RULES}; rm /etc/apt/apt.conf.d/90provisioner-proxy")
FAILED_ITEMS = {("package", "nvidia-persistenced", "nvidia_persistenced"),
                ("service", "nvidia-persistenced", "nvidia_persistenced"),
                ("file", "/etc/nccl.conf", "nccl_tuning"),
                ("service", "provisioner-firewall", "cluster_firewall"), ("other", LOAD_TABLE, "cluster_firewall"),
                ("file", FW_RULES, "cluster_firewall"),
                ("service", "nvidia-fabricmanager", "fabric_manager"),
                ("file", "/etc/apt/apt.conf.d/90provisioner-proxy", None)}


def test_failed_run_missing_and_corrupted_records_and_an_unreachable_host(rig: Rig) -> None:
    from provisioner_testbed import rack

    # node01: a run that fails half-way (nvidia_persistenced cannot download its package: later roles never run);
    # its record is dropped
    rig.ssh("node01", "set -e; apt-mark unhold nvidia-persistenced >/dev/null; systemctl stop nvidia-persistenced;"
                      " dpkg -r nvidia-persistenced >/dev/null 2>&1; apt-get clean; rm -f /etc/nccl.conf; "
                      "systemctl stop provisioner-firewall; " + BLOCK)
    data = rig.run("--limit", "node01")
    assert data["exit"] == 1 and data["failed_hosts"] == ["node01"], json.dumps(data["failures"])[:2000]
    assert data["hosts"]["node01"]["failures"][0]["role"] == "nvidia_persistenced", data["hosts"]["node01"]
    rig.ssh("node01", "set -e; nft delete table inet h27block; " + FAILED_THEN)
    with closing(sqlite3.connect(rig.ledger)) as db, db:
        assert db.execute("SELECT COUNT(*) FROM host_state WHERE host = 'node01'").fetchone()[0] == 0
        db.execute("DELETE FROM host_state WHERE host = 'node02'")  # missing
        db.execute("UPDATE host_state SET state = X'00' WHERE host = 'node03'")  # corrupted
    up = HOSTS[:3]
    before = rig.snapshots(up)
    rack.stop_host(RACK, "node04")
    try:
        rc, doc = same_as_full(rig)
    finally:
        rack.start_host_cmd(RACK, "node04")
    _assert_unchanged(before, rig.snapshots(up))
    assert rc == 1 and doc["hosts"]["node04"]["state"] == "unreachable"
    assert reason(doc, "node01").startswith("no recorded state") and reason(doc, "node02").startswith("no recorded")
    assert reason(doc, "node03").startswith("recorded state corrupted"), reason(doc, "node03")
    assert reason(doc, "node04").startswith("probe failed: unreachable"), reason(doc, "node04")
    assert doc["hosts"]["node01"]["state"] == "drifted" and doc["hosts"]["node02"]["state"] == "clean"
    _assert_exact(doc, "node01", FAILED_ITEMS)

    # node02 and node03 were clean under Ansible: they got fresh records; the rest heals with a run
    rack.ensure(RACK, len(HOSTS), log=lambda m: print(f"testbed: {m}"))
    data = rig.run("--limit", "node01,node04")
    assert data["exit"] == 0, json.dumps(data["failures"], indent=1)
    rc, doc = same_as_full(rig)
    assert rc == 0 and tiers(doc) == dict.fromkeys(HOSTS, 1), {h: reason(doc, h) for h in HOSTS}
    _assert_healed(rig, HOSTS)


# ------------------------------------------- 7. converged without the vLLM area (`make demo`), drift on the whole site
def test_demo_state_reports_vllm_as_drift(rig: Rig) -> None:
    """Last: Ansible refreshes node04's record with the whole site's inputs (clean), which a later --skip-tags vllm
    drift would see as changed inputs."""
    before = rig.snapshots()
    rc, doc = rig.drift(skip=False)  # the command: `make demo`, then `provision drift .../hosts.ini`
    _assert_unchanged(before, rig.snapshots())
    _assert_drift_only(rc, doc)
    assert doc["summary"]["drifted_hosts"] == list(VLLM_MEMBERS), doc["summary"]
    assert doc["hosts"]["node04"]["state"] == "clean"  # in no vLLM cluster: the node roles are converged
    for h in VLLM_MEMBERS:
        got = _items(doc, h)
        assert {r for _, _, r in got} == {"vllm", "vllm_launch"}, sorted(got, key=str)
        assert got >= VLLM_BARE, sorted(got, key=str)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
