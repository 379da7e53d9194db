"""Sharding a run across execution nodes: the planner (a vLLM cluster, NVLink domain or rack is never split; shards as
even as the units allow), what a shard's worker carries to reach its hosts, and the CLI's refusals (one line, exit 2,
before any run directory exists). Real inventories read by ansible-core; the rack proof is
tests/testbed/test_shards.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cli_inproc import provision
from provisioner.errors import UsageError
from provisioner.inventory import load_fleet
from provisioner.runner.shards import connection, exec_nodes, plan

INVENTORY = """
[gpu_nodes]
n01 ansible_host=198.18.9.1 node_rank=0
n02 ansible_host=198.18.9.2 node_rank=1
n03 ansible_host=198.18.9.3 node_rank=2
n04 ansible_host=198.18.9.4 node_rank=3
n05 ansible_host=198.18.9.5 node_rank=0
n06 ansible_host=198.18.9.6 node_rank=1
n07 ansible_host=198.18.9.7 rack=r2
n08 ansible_host=198.18.9.8 rack=r2
n09 ansible_host=198.18.9.9 nvlink_domain=nvl-a
n10 ansible_host=198.18.9.10 nvlink_domain=nvl-a
n11 ansible_host=198.18.9.11
n12 ansible_host=198.18.9.12

[big]
n01
n02
n03
n04

[pair]
n05
n06

[vllm_clusters:children]
big
pair

[execution_nodes]
x1 ansible_host=198.18.9.101
x2 ansible_host=198.18.9.102
x3 ansible_host=198.18.9.103

[all:vars]
ansible_user=root
ansible_ssh_private_key_file=/keys/rack
ansible_ssh_common_args='-o UserKnownHostsFile=/keys/known_hosts -o StrictHostKeyChecking=yes'
"""

CLUSTER = "vllm_cluster: {model: m, model_arch: Llama-3.1-8B, tensor_parallel_size: 8, pipeline_parallel_size: %d}\n"


@pytest.fixture
def inv(tmp_path: Path) -> Path:
    d = tmp_path / "inv"
    (d / "group_vars").mkdir(parents=True)
    (d / "hosts.ini").write_text(INVENTORY)
    (d / "group_vars" / "big.yml").write_text(CLUSTER % 4)
    (d / "group_vars" / "pair.yml").write_text(CLUSTER % 2)
    return d / "hosts.ini"


GPU = [f"n{i:02d}" for i in range(1, 13)]


def test_clusters_domains_and_racks_stay_whole_and_shards_are_even(inv: Path) -> None:
    fleet = load_fleet(inv)
    shards = plan(fleet, GPU, ["x1", "x2", "x3"])
    where = {h: s.node for s in shards for h in s.hosts}
    assert sorted(where) == GPU  # every targeted host once
    for together in (["n01", "n02", "n03", "n04"], ["n05", "n06"], ["n07", "n08"], ["n09", "n10"]):
        assert len({where[h] for h in together}) == 1, together
    assert sorted(len(s.hosts) for s in shards) == [4, 4, 4]  # 4 | 2+2 | 2+1+1 (largest first, least loaded)
    units = {u for s in shards for u in s.units}
    assert {"cluster big", "cluster pair", "rack r2", "nvlink domain nvl-a", "host n11", "host n12"} == units


def test_a_limit_shards_only_the_targeted_members(inv: Path) -> None:
    fleet = load_fleet(inv)
    shards = plan(fleet, ["n02", "n03", "n11"], ["x1", "x2"])
    assert [(s.node, s.hosts) for s in shards] == [("x1", ("n02", "n03")), ("x2", ("n11",))]
    # more nodes than units: the spare node gets no shard
    assert [s.node for s in plan(fleet, ["n05", "n06"], ["x1", "x2", "x3"])] == ["x1"]


def test_execution_nodes_are_checked_against_the_inventory(inv: Path) -> None:
    fleet = load_fleet(inv)
    assert exec_nodes(fleet, ["x2,x1", "x2"]) == ["x2", "x1"]
    with pytest.raises(UsageError, match=r"--exec-node nosuch: no such host"):
        exec_nodes(fleet, ["nosuch"])
    with pytest.raises(UsageError, match=r"host n01 is not in group execution_nodes"):
        exec_nodes(fleet, ["n01"])
    with pytest.raises(UsageError, match=r"x1: an execution node cannot also be a target"):
        plan(fleet, ["x1", "n01"], ["x1"])


def test_the_shard_carries_its_key_and_known_hosts_rewritten_for_the_worker(inv: Path) -> None:
    fleet = load_fleet(inv)
    conn = connection(fleet, ["n01", "n02"], "/w/job")
    files = dict(conn.files)
    assert files["connection/ssh_key"] == "/keys/rack"
    kh = [k for k, v in files.items() if v == "/keys/known_hosts"]
    assert len(kh) == 1 and kh[0].startswith("connection/userknownhostsfile")
    xv = dict(conn.extravars)
    assert xv["ansible_ssh_private_key_file"] == "/w/job/connection/ssh_key"
    assert xv["ansible_ssh_common_args"] == f"-o UserKnownHostsFile=/w/job/{kh[0]} -o StrictHostKeyChecking=yes"


def test_a_connection_variable_that_differs_inside_a_shard_is_refused(inv: Path) -> None:
    (inv.parent / "host_vars").mkdir()
    (inv.parent / "host_vars" / "n02.yml").write_text("ansible_ssh_private_key_file: /keys/other\n")
    fleet = load_fleet(inv)
    with pytest.raises(UsageError, match=r"ansible_ssh_private_key_file differs between hosts n01 and n02"):
        connection(fleet, ["n01", "n02"], "/w/job")
    assert dict(connection(fleet, ["n03"], "/w/job").files)["connection/ssh_key"] == "/keys/rack"


@pytest.mark.parametrize(("args", "message"), [
    (["--exec-node", "nosuch"], "--exec-node nosuch: no such host in the inventory"),
    (["--exec-node", "n01"], "host n01 is not in group execution_nodes"),
    (["--exec-node", "x1", "--accelerate", "mitogen"], "--accelerate mitogen runs on this controller only"),
])
def test_cli_refuses_bad_execution_nodes_in_one_line(inv: Path, tmp_path: Path, args: list[str],
                                                     message: str) -> None:
    runs = tmp_path / "runs"
    for cmd in (["run", "--skip-preflight"], ["drift"]):
        r = provision(cmd[0], str(inv), *cmd[1:], *args, env={"PROVISION_RUNS_DIR": str(runs)})
        assert r.returncode == 2, (cmd, r.stdout, r.stderr)
        assert message in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert len([ln for ln in r.stderr.splitlines() if ln.strip()]) == 1, r.stderr
    assert not runs.exists() or not any(runs.iterdir())  # refused before any run directory


def test_a_node_with_several_shards_gets_that_many_and_the_slots_alternate_across_nodes(inv: Path) -> None:
    (inv.parent / "host_vars").mkdir()
    (inv.parent / "host_vars" / "x1.yml").write_text("execution_node_shards: 3\n")
    fleet = load_fleet(inv)
    shards = plan(fleet, GPU, ["x1", "x2"])
    assert [s.label for s in shards] == ["x1-1", "x1-2", "x1-3", "x2"]
    assert sorted(len(s.hosts) for s in shards) == [2, 3, 3, 4]  # 4 | 2 | 2+1 | 2+1: largest first, least loaded
    assert sorted(h for s in shards for h in s.hosts) == GPU
    bad = inv.parent.parent / "bad"  # a new directory: ansible-core's vars plugin caches what it found per directory
    shutil.copytree(inv.parent, bad)
    (bad / "host_vars" / "x2.yml").write_text("execution_node_shards: 0\n")
    with pytest.raises(UsageError, match=r"host x2 \(group execution_nodes\): execution_node_shards must be"):
        plan(load_fleet(bad / "hosts.ini"), GPU, ["x1", "x2"])


def test_known_hosts_options_are_carried_as_ssh_reads_them() -> None:
    from provisioner.runner.shards import _carry_known_hosts

    files: dict[str, str] = {}
    # /dev/null and `none` are no file to carry (a copy of /dev/null, a missing "none"); the strictness passes as is
    args = "-o StrictHostKeyChecking=yes -o UserKnownHostsFile=/dev/null -o GlobalKnownHostsFile=none"
    assert _carry_known_hosts(args, files, "/w") == args and files == {}
    # a whitespace list of files (one option value) is every file carried, not the first word of it
    out = _carry_known_hosts("-o 'UserKnownHostsFile=/a /b' -oGlobalKnownHostsFile=/g", files, "/w")
    assert sorted(files.values()) == ["/a", "/b", "/g"]
    assert out == ("'UserKnownHostsFile=/w/connection/userknownhostsfile-0 /w/connection/userknownhostsfile-1'"
                   .join(["-o ", ""]) + " -oGlobalKnownHostsFile=/w/connection/globalknownhostsfile-2")
