"""Sharded runs on the simulated rack (issue 17 item 4): two rack hosts act as execution nodes, each running its shard
through ansible-runner's own streaming (`transmit` over SSH to `ansible-runner worker`, `process` back here).

Rack `shards` (PROVISIONER_SHARD_RACK), 6 hosts: node01-04 are the targets (cluster vllm_pp = node01+02, vllm_single =
node03, node04 alone), node05/06 the execution nodes (group execution_nodes, a copy of the rack's inventory). The
nodes' Python 3.12+ is the controller's own interpreter, bound read-only into every rack host by the testbed
(provisioner_testbed.hosts.controller_python); their wheelhouse is `pip wheel` of this checkout (the controller's pip).

The inventory is the rack's own, its secrets vaulted: the workers get the vault password inside each job's stream.

1. `provision run --limit execution_nodes` sets the nodes up; a second run changes nothing.
2. `provision run --exec-node node05,node06` provisions node01-04: two shards (a cluster never split), every host
   converged (its nccl.conf really there), nothing of the jobs left on the nodes, no key, vault password or vaulted
   value in the run directory or on the nodes.
3. tamper node02 (shard 1) and node04 (shard 2): the sharded drift and a single-controller drift report the same items
   per host in the same JSON shape; the hosts stay unchanged.
4. node06 powered off: its shard's hosts are unreachable naming the node, the other shard is checked; exit 1.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from testbed_rigs import own_rack  # noqa: E402  (same directory)

pytestmark = pytest.mark.testbed

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
NODES = ["node05", "node06"]
TARGETS = ["node01", "node02", "node03", "node04"]


def wheelhouse() -> Path:
    """`pip wheel` of this checkout (provisioner + its dependencies) for the execution nodes, by the controller's own
    pip (its index, CA and proxy); cached in the testbed cache per pyproject.toml."""
    from provisioner_testbed import rootfs

    key = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:12]
    dest = rootfs.cache_dir() / f"exec-wheelhouse-{key}"
    if not dest.is_dir():
        tmp = dest.with_name(dest.name + ".part")
        shutil.rmtree(tmp, ignore_errors=True)
        r = subprocess.run([str(BIN / "pip"), "wheel", "-q", "--disable-pip-version-check", "--wheel-dir", str(tmp),
                            str(ROOT)], capture_output=True, text=True, timeout=1200)
        assert r.returncode == 0, f"pip wheel for the execution nodes failed:\n{r.stderr[-3000:]}"
        tmp.rename(dest)
    return dest


@dataclass
class Rig:
    h: Any  # provisioner_testbed.rack.Handle
    inv: Path

    def cli(self, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(BIN / "provision"), *args], capture_output=True, text=True, timeout=timeout,
                              cwd=ROOT)

    def ssh(self, host: str, command: str) -> str:
        r = self.h.ssh(host, command)
        assert r.returncode == 0, f"{host}: {command}: {r.stderr}"
        return r.stdout


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    from provisioner_testbed.hosts import controller_python

    py = controller_python()
    if py is None:
        pytest.fail(f"the execution nodes need a Python 3.12+ the rack can run: this controller's Python "
                    f"({sys.base_prefix}) is the system's; run the suite from a pyenv/python.org build")
    with own_rack("PROVISIONER_SHARD_RACK", "shards", 6) as h:
        inv = tmp_path_factory.mktemp("shard-inv") / "inv"
        shutil.copytree(h.inventory.parent, inv)
        text = (inv / "hosts.ini").read_text()
        lines = text.splitlines()
        moved = [ln for ln in lines if ln.split(" ")[0] in NODES]
        kept = [ln for ln in lines if ln not in moved]
        (inv / "hosts.ini").write_text("\n".join([*kept, "", "[execution_nodes]", *moved]) + "\n")
        (inv / "group_vars" / "execution_nodes.yml").write_text(
            f"execution_node_python: {py}/bin/python3\nexecution_node_wheelhouse: {wheelhouse()}\n")
        assert "!vault" in (inv / "group_vars" / "all.yml").read_text()  # the rack's vaulted secrets, as they are
        yield Rig(h, inv / "hosts.ini")


def _vaulted(inv: Path) -> dict[str, str]:
    """{variable: plain text} of every vaulted value of the rack's inventory (its API key, BMC password...)."""
    from ansible.parsing.vault import VaultLib, VaultSecret

    from provisioner_testbed import vault
    from provisioner_testbed.inventory_writer import vaulted_values

    lib = VaultLib([("default", VaultSecret(vault.password_file().read_text().strip().encode()))])
    text = (inv / "group_vars" / "all.yml").read_text()
    plain = {var: lib.decrypt(c.encode()).decode() for var, c in vaulted_values(text).items()}
    assert "vllm_api_key" in plain and all(len(p) >= 8 for p in plain.values())
    return plain


def _secrets(inv: Path) -> list[str]:
    """The vaulted values' plain text, then the vault password itself."""
    from provisioner_testbed import vault

    return [*_vaulted(inv).values(), vault.password_file().read_text().strip()]


def _no_secret_left(rig: Rig, run_dir: Path) -> None:
    """No secret (vaulted values, the vault password, the SSH key) in any file of the run directory here, and nothing
    of the job on the execution nodes: their jobs dir is empty and no file there or in /tmp or /root holds one."""
    secrets = [*_secrets(rig.inv.parent), Path(rig.h.key).read_text()]
    for p in run_dir.rglob("*"):
        if p.is_file():
            text = p.read_text(errors="replace")
            assert not any(s in text for s in secrets), f"a secret in {p}"
    for node in NODES:
        assert rig.ssh(node, "ls -A /var/lib/provisioner/jobs").strip() == ""
        # the patterns on grep's stdin (-f -), never on a command line
        found = subprocess.run(rig.h.ssh_argv(node, "grep -rlF -f - /var/lib/provisioner /tmp /root; true"),
                               input="\n".join(secrets[:-1]) + "\n", capture_output=True, text=True, timeout=120)
        assert found.returncode == 0 and found.stdout.strip() == "", f"{node}: a secret in {found.stdout}"


def result_of(r: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert r.stdout.strip(), r.stderr
    return json.loads(r.stdout)


def test_execution_nodes_are_set_up_and_a_second_run_changes_nothing(rig: Rig) -> None:
    first = rig.cli("run", str(rig.inv), "--limit", "execution_nodes", "--json")
    assert first.returncode == 0, first.stderr
    second = result_of(rig.cli("run", str(rig.inv), "--limit", "execution_nodes", "--json"))
    assert second["succeeded"] and second["totals"]["changed"] == 0, second["hosts"]
    for node in NODES:
        assert rig.ssh(node, "/opt/provisioner/venv/bin/ansible-runner --version").strip()
        assert rig.ssh(node, "stat -c %a /var/lib/provisioner/jobs").strip() == "700"


def test_sharded_run_provisions_every_host_in_one_report(rig: Rig) -> None:
    r = rig.cli("run", str(rig.inv), "--exec-node", "node05,node06", "--skip-tags", "vllm", "--json")
    res = result_of(r)
    assert r.returncode == 0, (r.stderr, res.get("shards"))
    shards = {s["node"]: s for s in res["shards"]}
    assert set(shards) == set(NODES)
    assert all(s["status"] == "successful" and s["events"] > 0 for s in shards.values()), shards
    where = {h: s["node"] for s in shards.values() for h in s["hosts"]}
    assert sorted(where) == TARGETS and where["node01"] == where["node02"]  # the PP cluster stays together
    assert sorted(res["hosts"]) == TARGETS
    assert all(h["state"] == "changed" and h["failed"] == 0 for h in res["hosts"].values()), res["hosts"]
    for host in TARGETS:  # really provisioned, by the node that ran its shard
        assert "NCCL_IB_HCA" in rig.ssh(host, "cat /etc/nccl.conf")
    run_dir = Path(res["run_dir"])
    assert (run_dir / "shards" / "node05" / "artifacts" / "ansible" / "job_events").is_dir()
    _no_secret_left(rig, run_dir)  # the workers decrypted the vaulted secrets, and nothing of them stayed


def test_the_workers_decrypt_the_vaulted_values(rig: Rig, tmp_path: Path) -> None:
    """A play that needs the vaulted API key's plain text on every target (compared by its sha256 only): each shard's
    worker decrypts it, so the sharded run succeeds; without the secrets in the job it fails on every host."""
    key = _vaulted(rig.inv.parent)["vllm_api_key"]
    want = hashlib.sha256(key.encode()).hexdigest()
    pb = tmp_path / "needs-the-key.yml"
    pb.write_text(
        "- hosts: gpu_nodes\n  gather_facts: false\n  tasks:\n"
        "    - name: The vaulted value, decrypted by this worker\n"
        "      ansible.builtin.assert:\n"
        f"        that: (vllm_api_key | string | hash('sha256')) == '{want}'\n"
        "        quiet: true\n      no_log: true\n")
    r = rig.cli("run", str(rig.inv), "--exec-node", "node05,node06", "--playbook", str(pb), "--json")
    res = result_of(r)
    assert r.returncode == 0, (r.stderr, res.get("shards"), res["hosts"])
    assert sorted(res["hosts"]) == TARGETS and all(h["failed"] == 0 for h in res["hosts"].values()), res["hosts"]
    assert {s["node"] for s in res["shards"]} == set(NODES)
    _no_secret_left(rig, Path(res["run_dir"]))


def _items(report: dict[str, Any]) -> dict[str, set[tuple[str, str, str, str]]]:
    return {name: {(d["kind"], d["resource"], d["task"], d.get("diff") or "") for d in h.get("drift", [])}
            for name, h in report["hosts"].items()}


def _shape(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _shape(v) for k, v in sorted(obj.items()) if k not in ("hosts",)}
    return type(obj).__name__ if obj is not None else None


def test_sharded_drift_reports_what_one_controller_reports_and_changes_nothing(rig: Rig) -> None:
    rig.ssh("node02", "echo 'NCCL_DEBUG=TRACE' >> /etc/nccl.conf")
    rig.ssh("node04", "systemctl stop nvidia-persistenced")
    before = rig.ssh("node02", "sha256sum /etc/nccl.conf; stat -c '%a %U %Y' /etc/nccl.conf")
    sharded = rig.cli("drift", str(rig.inv), "--exec-node", "node05", "--exec-node", "node06", "--skip-tags", "vllm",
                      "--report", "json", "--limit", ",".join(TARGETS))
    single = rig.cli("drift", str(rig.inv), "--skip-tags", "vllm", "--report", "json", "--limit", ",".join(TARGETS))
    assert sharded.returncode == 3 and single.returncode == 3, (sharded.stderr, single.stderr)
    a, b = result_of(sharded), result_of(single)
    assert _items(a) == _items(b)
    _no_secret_left(rig, Path(a["run_dir"]))
    assert ("file", "/etc/nccl.conf") in {i[:2] for i in _items(a)["node02"]}
    assert ("service", "nvidia-persistenced") in {i[:2] for i in _items(a)["node04"]}
    assert _items(a)["node01"] == _items(a)["node03"] == set()
    assert _shape(a) == _shape(b) and sorted(a["hosts"]) == sorted(b["hosts"]) == TARGETS
    assert {n: sorted(h) for n, h in a["hosts"].items()} == {n: sorted(h) for n, h in b["hosts"].items()}
    assert rig.ssh("node02", "sha256sum /etc/nccl.conf; stat -c '%a %U %Y' /etc/nccl.conf") == before
    assert rig.h.ssh("node04", "systemctl is-active nvidia-persistenced").stdout.strip() != "active"
    healed = rig.cli("run", str(rig.inv), "--exec-node", "node05,node06", "--skip-tags", "vllm", "--limit",
                     "node02,node04", "--quiet")
    assert healed.returncode == 0, healed.stderr + healed.stdout


def test_an_execution_node_that_is_down_leaves_its_hosts_unreachable_naming_it(rig: Rig) -> None:
    stop = rig.cli("testbed", "stop", "--name", rig.h.name, "node06", timeout=300)
    assert stop.returncode == 0, stop.stderr
    try:
        r = rig.cli("drift", str(rig.inv), "--exec-node", "node05,node06", "--skip-tags", "vllm", "--report", "json")
        res = result_of(r)
        assert r.returncode == 1, r.stderr
        shards = {s["node"]: s for s in res["shards"]}
        lost = shards["node06"]["hosts"]
        assert lost and re.search(r"execution node node06", shards["node06"]["error"] or ""), shards["node06"]
        for host in lost:
            assert res["hosts"][host]["state"] == "unreachable"
            assert "execution node node06" in res["hosts"][host]["unreachable_message"]
        for host in shards["node05"]["hosts"]:
            assert res["hosts"][host]["state"] == "clean", res["hosts"][host]
    finally:
        start = rig.cli("testbed", "start", "--name", rig.h.name, "node06", timeout=300)
        assert start.returncode == 0, start.stderr
