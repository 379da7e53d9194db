"""The two-tier drift's correctness matrix (issue 27): in every scenario, `provision drift` (probe, then Ansible for
the hosts it sends on) reports exactly the exit code, host states and items (kind, resource, role) that
`provision drift --full` (Ansible for everyone) reports, and each host is in the tier the scenario predicts.

One rack of its own (PROVISIONER_DRIFT_TIERS_RACK, default `drift-tiers`, 4 hosts, no vLLM layer), reset to fresh
disks, its own run directory and ledger. Scenarios, in order: bare hosts (no records); converged (probe only);
a tamper per kind (file content, file mode, file removed, unit stopped, unit masked, hold removed, package removed,
nftables table deleted; one host left clean); healed with --limit (the others' records stay); an inventory change
not applied (-e); a role template change not applied (a copy of the suite's data); a failed last run, a record
deleted, a record corrupted and an unreachable host, together.
"""

from __future__ import annotations

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
SKIP = ("--skip-tags", "vllm")  # runs and drifts alike (the rack has no vLLM layer)
PROJECT = Path(__file__).resolve().parents[2]
# the package download refused (apt's proxy and the repository): a run dies at the first package it must fetch
BLOCK = ("nft add table inet h27block; nft add chain inet h27block out '{ type filter hook output priority 0; }'; "
         "nft add rule inet h27block out tcp dport '{ 3128, 8090, 8091 }' reject")


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

    def drift(self, *args: str) -> tuple[int, dict[str, Any]]:
        p = self.cli("drift", self.inv, "--report", "json", "--quiet", *SKIP, *args)
        try:
            return p.returncode, json.loads(p.stdout)
        except ValueError:
            raise AssertionError(f"no JSON from provision drift (rc {p.returncode}): {p.stdout}\n{p.stderr}") from None

    def ssh(self, host: str, cmd: str) -> str:
        r = self.h.ssh(host, cmd, timeout=600)
        assert r.returncode == 0, f"{host}: {cmd}: {r.stdout}{r.stderr}"
        return r.stdout

    @property
    def ledger(self) -> Path:
        return self.runs / "ledger.sqlite3"


def _view(doc: dict[str, Any]) -> dict[str, Any]:
    """What must be equal between the tiers and --full: per host its state and its items."""
    return {h: (v["state"], sorted((i["kind"], i["resource"], i["role"] or "") for i in v["drift"]))
            for h, v in doc["hosts"].items()}


def same_as_full(rig: Rig, *args: str) -> tuple[int, dict[str, Any]]:
    """Tiered drift, then --full; assert the same outcome; return the tiered one."""
    rc, doc = rig.drift(*args)
    rc_full, full = rig.drift("--full", *args)
    assert (rc, _view(doc)) == (rc_full, _view(full)), json.dumps(
        {"tiered": [rc, _view(doc), {h: v["tier_reason"] for h, v in doc["hosts"].items()}],
         "full": [rc_full, _view(full)]}, indent=1)
    assert all(v["tier"] == 2 for v in full["hosts"].values()), full["summary"]
    return rc, doc


def tiers(doc: dict[str, Any]) -> dict[str, int]:
    return {h: v["tier"] for h, v in doc["hosts"].items()}


def reason(doc: dict[str, Any], host: str) -> str:
    return doc["hosts"][host]["tier_reason"] or ""


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


def test_bare_hosts_go_to_ansible_then_a_run_records_them(rig: Rig) -> None:
    rc, doc = same_as_full(rig)
    assert rc == 3 and set(tiers(doc).values()) == {2}
    assert all(reason(doc, h).startswith("no recorded state") for h in HOSTS), doc["summary"]["tiers"]
    data = rig.run()
    assert data["exit"] == 0 and "not recorded" not in data["stderr"], data["stderr"]
    with closing(sqlite3.connect(rig.ledger)) as db, db:
        assert sorted(r[0] for r in db.execute("SELECT host FROM host_state")) == list(HOSTS)


def test_converged_hosts_are_clean_by_the_probe_alone(rig: Rig) -> None:
    rc, doc = same_as_full(rig)
    assert rc == 0 and tiers(doc) == dict.fromkeys(HOSTS, 1), doc["summary"]
    assert doc["summary"]["tiers"]["tier1"] == 4 and doc["summary"]["tiers"]["tier2"] == 0


TAMPER = {
    "node01": "echo '# tampered' >> /etc/nccl.conf; chmod 600 /etc/security/limits.d/90-provisioner-rdma.conf",
    "node02": "systemctl stop nvidia-persistenced; nft delete table inet provisioner_cluster; "
              "rm /etc/apt/preferences.d/nvidia-driver",
    "node03": "apt-mark unhold libnccl2 >/dev/null; systemctl mask nvidia-fabricmanager 2>/dev/null; "
              "DEBIAN_FRONTEND=noninteractive apt-get -q -y remove perftest >/dev/null 2>&1",
}


def test_each_tamper_kind_is_found_by_the_probe_and_described_by_ansible(rig: Rig) -> None:
    for h, cmd in TAMPER.items():
        rig.ssh(h, "set -e; " + cmd)
    before = {h: rig.ssh(h, HOST_SNAPSHOT) for h in HOSTS}
    rc, doc = same_as_full(rig)
    assert {h: rig.ssh(h, HOST_SNAPSHOT) for h in HOSTS} == before, "a drift changed a host"
    assert rc == 3 and tiers(doc) == {"node01": 2, "node02": 2, "node03": 2, "node04": 1}
    for h in TAMPER:
        assert reason(doc, h).startswith("probe found"), reason(doc, h)
        assert doc["hosts"][h]["drift"] and all(i["tier"] == 1 for i in doc["hosts"][h]["drift"]
                                                if i["kind"] != "other"), doc["hosts"][h]["drift"]
    probe = doc["hosts"]["node02"]["probe_changes"]
    assert any("nvidia-persistenced.service" in c for c in probe) and any("nftables" in c for c in probe), probe


def test_healed_with_limit_the_others_keep_their_records(rig: Rig) -> None:
    data = rig.run("--limit", ",".join(TAMPER))
    assert data["exit"] == 0, json.dumps(data["failures"], indent=1)
    rc, doc = same_as_full(rig)
    assert rc == 0 and tiers(doc) == dict.fromkeys(HOSTS, 1), {h: reason(doc, h) for h in HOSTS}


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
    rc, doc = same_as_full(rig, "-e", f"@{f}")
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
        rc, doc = same_as_full(rig)
    finally:
        rig.env = {}
    assert rc == 3 and tiers(doc) == dict.fromkeys(HOSTS, 2)
    assert all(reason(doc, h).startswith("inputs changed") for h in HOSTS)


def test_failed_run_missing_and_corrupted_records_and_an_unreachable_host(rig: Rig) -> None:
    from provisioner_testbed import rack

    # node01: a run that fails half-way (its package download refused): its record is dropped
    rig.ssh("node01", "set -e; apt-mark unhold nvidia-persistenced >/dev/null; systemctl stop nvidia-persistenced;"
                      " dpkg -r nvidia-persistenced >/dev/null 2>&1; apt-get clean; " + BLOCK)
    data = rig.run("--limit", "node01")
    assert data["exit"] == 1 and data["failed_hosts"] == ["node01"], json.dumps(data["failures"])[:2000]
    rig.ssh("node01", "nft delete table inet h27block")
    with closing(sqlite3.connect(rig.ledger)) as db, db:
        assert db.execute("SELECT COUNT(*) FROM host_state WHERE host = 'node01'").fetchone()[0] == 0
        db.execute("DELETE FROM host_state WHERE host = 'node02'")  # missing
        db.execute("UPDATE host_state SET state = X'00' WHERE host = 'node03'")  # corrupted
    rack.stop_host(RACK, "node04")
    try:
        rc, doc = same_as_full(rig)
    finally:
        rack.start_host_cmd(RACK, "node04")
    assert rc == 1 and doc["hosts"]["node04"]["state"] == "unreachable"
    assert reason(doc, "node01").startswith("no recorded state") and reason(doc, "node02").startswith("no recorded")
    assert reason(doc, "node03").startswith("recorded state corrupted"), reason(doc, "node03")
    assert reason(doc, "node04").startswith("probe failed: unreachable"), reason(doc, "node04")
    assert doc["hosts"]["node01"]["state"] == "drifted" and doc["hosts"]["node02"]["state"] == "clean"

    # node02 and node03 were clean under Ansible: they got fresh records; the rest heals with a run
    rack.ensure(RACK, len(HOSTS), log=lambda m: print(f"testbed: {m}"))
    data = rig.run("--limit", "node01,node04")
    assert data["exit"] == 0, json.dumps(data["failures"], indent=1)
    rc, doc = same_as_full(rig)
    assert rc == 0 and tiers(doc) == dict.fromkeys(HOSTS, 1), {h: reason(doc, h) for h in HOSTS}


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
