"""The host roles end to end on the simulated rack (real Debian 12 systemd hosts over SSH, the signed stand-in NVIDIA
apt repository, Debian's mirror through the rack's proxy).

The host-role part of site.yml (`playbooks/node.yml`: the GPU stack and fabric roles in one play) runs with
ansible-playbook against the rack's own inventory; pytest-testinfra then checks over SSH (host key
checking on): every package at its pinned version and held, /etc/nccl.conf byte for byte, persistenced and Fabric
Manager enabled and active, memlock limits, the nftables table present and scoped to the cluster's members (with a
real connection test); the second run reports changed=0; a Fabric Manager/driver mismatch injected on one node fails
that node with a message naming both versions while the other nodes complete.

Uses its own rack (PROVISIONER_ROLES_RACK, default `roles`, 3 hosts: a 2-node cluster and a 1-node cluster) because
it injects a fault; the fault is cleared at the end. PROVISIONER_TESTBED_TEARDOWN=1 removes the rack afterwards
when this session created it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from provisioner import PROJECT_ROOT

pytestmark = pytest.mark.testbed

ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))
# The host-role part of site.yml, imported as site.yml does.
HOST_ROLES = (
    "---\n"
    f"- name: GPU node\n  ansible.builtin.import_playbook: {PROJECT_ROOT / 'playbooks/node.yml'}\n"
)
RACK = os.environ.get("PROVISIONER_ROLES_RACK", "roles")
NODES = 3

# docs/development.md "Pinned NVIDIA stack" == the role defaults.
PINNED = {
    "nvidia-open-580": "580.95.05-1",
    "nvidia-kernel-open-580": "580.95.05-1",
    "nvidia-utils-580": "580.95.05-1",
    "nvidia-persistenced": "580.95.05-1",
    "nvidia-fabricmanager-580": "580.95.05-1",
    "libnvidia-nscq-580": "580.95.05-1",
    "cuda-cudart-12-8": "12.8.90-1",
    "libnccl2": "2.27.7-1+cuda12.8",
    "libnccl-dev": "2.27.7-1+cuda12.8",
}
INBOX = ["rdma-core", "ibverbs-utils", "infiniband-diags", "perftest", "nftables"]

NCCL_CONF = (
    "# /etc/nccl.conf for {host}: managed by provisioner (templates/nccl.conf.j2).\n"
    "# Local edits are overwritten on the next run: change the nccl_* inventory variables instead.\n"
    "# Precedence: process environment > NCCL_CONF_FILE or ~/.nccl.conf > this file.\n"
    "NCCL_IB_HCA==mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1\n"
    "NCCL_SOCKET_IFNAME==host0\n"
    "NCCL_ALGO=Ring\n"
    "NCCL_IB_TIMEOUT=22\n"
    "NCCL_IB_RETRY_CNT=7\n"
    "NCCL_CROSS_NIC=0\n"
)
LIMITS = (
    "# Managed by provisioner (role infiniband): RDMA registers (pins) memory; ibverbs needs it unlimited.\n"
    "*    soft    memlock    unlimited\n"
    "*    hard    memlock    unlimited\n"
    "root soft    memlock    unlimited\n"
    "root hard    memlock    unlimited\n"
)


def playbook(h: Any, *extra: str) -> subprocess.CompletedProcess[str]:
    pb = Path(tempfile.gettempdir()) / f"provisioner-test-host-roles-{h.name}.yml"
    pb.write_text(HOST_ROLES)
    env = dict(os.environ, ANSIBLE_CONFIG=str(PROJECT_ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_CACHE_PLUGIN_CONNECTION=str(PROJECT_ROOT / ".cache" / f"facts-{h.name}"))
    return subprocess.run([ANSIBLE_PLAYBOOK, "-i", str(h.inventory), str(pb), *extra], cwd=PROJECT_ROOT,
                          env=env, capture_output=True, text=True, timeout=1500)


def recap(out: str) -> dict[str, dict[str, int]]:
    """PLAY RECAP lines -> {host: {ok, changed, unreachable, failed, ...}}."""
    stats: dict[str, dict[str, int]] = {}
    for m in re.finditer(r"^(\S+)\s+:\s+((?:\w+=\d+\s*)+)$", out, re.M):
        stats[m.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
    return stats


@pytest.fixture(scope="module")
def rig() -> Iterator[Any]:
    if os.geteuid() != 0:
        pytest.skip("the simulated rack needs root")
    from provisioner_testbed import rack
    from provisioner_testbed.state import RackState

    existed = RackState.load(RACK) is not None
    h = rack.ensure(RACK, NODES, log=lambda m: print(f"testbed: {m}"))
    for host in h.names:
        rack.clear(RACK, host)
    yield h
    for host in h.names:
        rack.clear(RACK, host)
    if not existed and os.environ.get("PROVISIONER_TESTBED_TEARDOWN") == "1":
        rack.down(RACK)


@pytest.fixture(scope="module")
def first_run(rig: Any) -> subprocess.CompletedProcess[str]:
    t = time.monotonic()
    r = playbook(rig)
    print(f"first run: {time.monotonic() - t:.0f} s")
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    return r


@pytest.fixture(scope="module")
def hosts(rig: Any, first_run: Any) -> dict[str, Any]:
    import testinfra

    extra = f"-o UserKnownHostsFile={rig.known_hosts} -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes -o LogLevel=ERROR"
    return {
        name: testinfra.get_host(f"ssh://root@{addr}", ssh_identity_file=str(rig.key), ssh_extra_args=extra)
        for name, addr in rig.hosts.items()
    }


def test_every_host_completed(rig: Any, first_run: Any) -> None:
    stats = recap(first_run.stdout)
    assert set(stats) == set(rig.names)
    assert all(s["failed"] == 0 and s["unreachable"] == 0 for s in stats.values()), stats


def test_packages_pinned_and_held(hosts: dict[str, Any]) -> None:
    for name, host in hosts.items():
        for pkg, version in PINNED.items():
            p = host.package(pkg)
            assert p.is_installed, f"{name}: {pkg} not installed"
            assert p.version == version, f"{name}: {pkg} {p.version} != {version}"
            sel = host.check_output(f"dpkg-query -W -f='${{Status}}' {pkg}")
            assert sel.startswith("hold "), f"{name}: {pkg} not held ({sel})"
        for pkg in INBOX:
            assert host.package(pkg).is_installed, f"{name}: {pkg} not installed"
        pin = host.file("/etc/apt/preferences.d/nvidia-driver").content_string
        assert "Pin: version 580.95.05-1*\nPin-Priority: 1001\n" in pin
        assert host.file("/etc/apt/sources.list.d/nvidia-cuda.sources").contains("^Signed-By: /etc/apt/keyrings/nvidia-cuda.gpg$")


def test_nccl_conf_byte_for_byte(hosts: dict[str, Any]) -> None:
    for name, host in hosts.items():
        f = host.file("/etc/nccl.conf")
        assert (f.user, f.group, f.mode) == ("root", "root", 0o644)
        assert f.content == NCCL_CONF.format(host=name).encode()


def test_nccl_conf_is_what_provision_render_shows(rig: Any, hosts: dict[str, Any]) -> None:
    from provisioner.inventory import load_fleet
    from provisioner.render import host_files

    fleet = load_fleet(rig.inventory)
    for name, host in hosts.items():
        files = {f.dest: f.content for f in host_files(fleet, name)}
        assert host.file("/etc/nccl.conf").content == files["/etc/nccl.conf"].encode()


def test_services_enabled_and_active(hosts: dict[str, Any]) -> None:
    for name, host in hosts.items():
        for unit in ("nvidia-persistenced", "nvidia-fabricmanager", "provisioner-firewall"):
            s = host.service(unit)
            assert s.is_enabled and s.is_running, f"{name}: {unit} enabled={s.is_enabled} running={s.is_running}"


def test_memlock_limits(hosts: dict[str, Any]) -> None:
    # The file PAM reads (pam_limits); the containers cannot raise their own hard limit (no CAP_SYS_RESOURCE), so the
    # effective `ulimit -l` of a session is not checked here.
    for host in hosts.values():
        f = host.file("/etc/security/limits.d/90-provisioner-rdma.conf")
        assert f.content_string == LIMITS and f.mode == 0o644
        assert not host.file("/etc/modules-load.d/nvidia-peermem.conf").exists  # DMA-BUF by default


def test_nftables_table_scoped_to_cluster_members(rig: Any, hosts: dict[str, Any]) -> None:
    from provisioner_testbed.inventory_writer import clusters

    for members in clusters(rig.names).values():
        for m in members:
            host = hosts[m]
            for other, address in rig.hosts.items():
                r = host.run(f"nft get element inet provisioner_cluster members4 '{{ {address} }}'")
                assert (r.rc == 0) == (other in members), f"{m}: {other} ({address}) in members4: {r.rc == 0}"
            ruleset = host.check_output("nft list ruleset")
            assert "flush ruleset" not in ruleset
            table = host.check_output("nft list table inet provisioner_cluster")
            assert "policy accept;" in table and 'tcp dport 22 accept comment "SSH stays open"' in table
            assert "tcp dport { 29501, 32768-60999 } ip saddr @members4 accept" in table
            assert re.search(r"tcp dport \{ 8000, 29501, 32768-60999 \} counter packets \d+ bytes \d+ drop", table)
            assert "0.0.0.0/0" not in table  # never "allow all"


def test_master_port_reachable_from_members_only(rig: Any, hosts: dict[str, Any]) -> None:
    """A real listener on the head's master port: the other member connects, a host outside the cluster does not."""
    from provisioner_testbed.inventory_writer import MULTI_GROUP, SINGLE_GROUP, clusters

    groups = clusters(rig.names)
    head, worker = groups[MULTI_GROUP]
    outsider = groups[SINGLE_GROUP][0]
    port = 29501
    listener = f"nohup timeout 60 python3 -m http.server {port} --bind 0.0.0.0 </dev/null >/dev/null 2>&1 &"
    rig.ssh(head, listener)
    probe = (f"python3 -c 'import socket,sys;socket.create_connection((\"{rig.hosts[head]}\",{port}),3);"
             f"print(\"open\")' 2>&1 || true")
    try:
        deadline = time.monotonic() + 20
        ok = ""
        while time.monotonic() < deadline and "open" not in ok:
            ok = rig.ssh(worker, probe).stdout
            time.sleep(0.5)
        assert "open" in ok, f"{worker} (member) could not reach {head}:{port}: {ok}"
        blocked = rig.ssh(outsider, probe).stdout
        assert "open" not in blocked and "timed out" in blocked, f"{outsider} (not a member) reached {head}:{port}"
    finally:
        rig.ssh(head, f"pkill -f 'http.server {port}' || true")


def test_second_run_changes_nothing(rig: Any, first_run: Any) -> None:
    t = time.monotonic()
    r = playbook(rig)
    print(f"second run: {time.monotonic() - t:.0f} s")
    assert r.returncode == 0, r.stdout[-6000:]
    stats = recap(r.stdout)
    changed = {h: s["changed"] for h, s in stats.items() if s["changed"]}
    assert not changed, "second run changed something:\n" + "\n".join(
        ln for ln in r.stdout.splitlines() if ln.startswith(("TASK", "changed"))
    )


def test_check_mode_sees_a_hand_edit_and_changes_nothing(rig: Any, hosts: dict[str, Any]) -> None:
    """Drift: --check --diff reports the hand-edited file on that host only and leaves it as it is."""
    edited = rig.names[0]
    f = hosts[edited].file("/etc/nccl.conf")
    rig.ssh(edited, "echo NCCL_DEBUG=INFO >> /etc/nccl.conf")
    try:
        r = playbook(rig, "--check", "--diff")
        assert r.returncode == 0, r.stdout[-6000:]
        stats = recap(r.stdout)
        assert stats[edited]["changed"] == 1, stats
        assert all(s["changed"] == 0 for h, s in stats.items() if h != edited), stats
        assert "-NCCL_DEBUG=INFO" in r.stdout
        assert f.content_string.endswith("NCCL_CROSS_NIC=0\nNCCL_DEBUG=INFO\n")  # check mode changed nothing
    finally:
        rig.ssh(edited, "sed -i '/^NCCL_DEBUG=INFO$/d' /etc/nccl.conf")
    assert f.content == NCCL_CONF.format(host=edited).encode()


def test_fabric_manager_mismatch_fails_only_that_node(rig: Any, first_run: Any) -> None:
    from provisioner_testbed import rack

    bad = rig.names[1]
    rack.fault(RACK, bad, ["fm_mismatch"])
    try:
        r = playbook(rig)
    finally:
        rack.clear(RACK, bad)
    out = r.stdout
    assert r.returncode != 0
    stats = recap(out)
    assert stats[bad]["failed"] == 1, stats
    for other in rig.names:
        if other != bad:
            assert stats[other]["failed"] == 0 and stats[other]["unreachable"] == 0, stats
    flat = " ".join(out.split())
    assert f"Fabric Manager/driver version mismatch on {bad}: nvidia-fabricmanager 580.95.05-1 but the driver reports 580.82.07" in flat, out[-4000:]
    # the healthy nodes went on to the fabric roles (same play); the failed one did not
    after = out.split("TASK [nccl_tuning : Render /etc/nccl.conf]")[1].split("TASK [")[0]
    assert re.search(rf"^ok: \[{rig.names[0]}\]", after, re.M), after
    assert f"[{bad}]" not in after, after
