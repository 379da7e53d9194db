"""The inventory loader: Ansible's own merge (checked against VariableManager.get_vars), model API, errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from inventory_factory import write_inventory
from inventory_shared import TRICKY_INI, _NoFacts, _play_fleet, _same

from provisioner import INVENTORIES
from provisioner.errors import UsageError
from provisioner.inventory import load_fleet

# magic / play-context variables VariableManager adds that Host.vars leaves out on purpose
_SKIP = {"groups", "ansible_facts", "playbook_dir", "ansible_playbook_python", "ansible_config_file",
         "ansible_version", "omit", "hostvars", "ansible_local",
         "group_names", "inventory_hostname", "inventory_hostname_short"}  # magic: not inventory data (plan.MAGIC_VARS)


def ansible_vars(path: Path) -> dict[str, dict[str, Any]]:
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    inv = InventoryManager(loader=loader, sources=[str(path)])
    vm = VariableManager(loader=loader, inventory=inv)
    vm._fact_cache = _NoFacts()  # facts (ansible.cfg's fact cache) are not inventory: validate never reads them
    out = {}
    for h in inv.get_hosts():
        v = vm.get_vars(host=h, include_hostvars=False)
        out[h.name] = {k: x for k, x in v.items() if k not in _SKIP}
    return out


def ours(path: Path) -> dict[str, dict[str, Any]]:
    fleet = load_fleet(path)
    return {n: {k: v for k, v in h.vars.items()} for n, h in fleet.hosts.items()}


def _comparable(d: dict[str, dict[str, Any]], keep_ansible: bool) -> dict[str, dict[str, Any]]:
    from provisioner.plan import ANSIBLE_KEEP as _ANSIBLE_KEEP

    return {h: {k: v for k, v in vs.items() if keep_ansible or not k.startswith("ansible_") or k in _ANSIBLE_KEEP}
            for h, vs in d.items()}


def test_merge_matches_ansible_variable_manager(tmp_path: Path) -> None:
    inv = write_inventory(
        tmp_path, ini=TRICKY_INI, base=False,
        group_vars={"all": {"z": "gv_all", "d": {"k1": 1}}, "rack2": {"y": "gv_rack2", "d": {"k2": 2}},
                    "c1": {"vllm_cluster": {"model": "/m", "model_arch": "Qwen2-72B"}, "x": "gv_c1"}},
        host_vars={"b": {"x": "hv_b"}},
        files={"group_vars/rack1/a.yml": "w: dir_a\n", "group_vars/rack1/b.yml": "w2: dir_b\n"},
    )
    assert _comparable(ours(inv), False) == _comparable(ansible_vars(inv), False)


def test_merge_matches_ansible_on_rack_a() -> None:
    p = INVENTORIES / "rack-a.ini"
    assert _comparable(ours(p), False) == _comparable(ansible_vars(p), False)


def test_merge_matches_ansible_on_yaml_inventory(tmp_path: Path) -> None:
    doc = {"all": {"vars": {"q": 1}, "children": {
        "gpu_nodes": {"vars": {"q": 2}, "hosts": {"h1": {"ansible_host": "10.9.0.1", "q": 3}, "h2": None}},
        "other": {"hosts": {"h2": {"r": [1, 2]}}},
    }}}
    inv = write_inventory(tmp_path, ini=yaml.safe_dump(doc), base=False, name="hosts.yml",
                          group_vars={"other": {"q": 4}})
    assert _comparable(ours(inv), False) == _comparable(ansible_vars(inv), False)


def test_fleet_model(tmp_path: Path) -> None:
    fleet = load_fleet(INVENTORIES / "rack-a.ini")
    assert set(fleet.hosts) == {"node01", "node02", "node03", "node04"}
    h = fleet.hosts["node02"]
    assert h.address == "10.20.0.12" and h.is_gpu_node and h.gpu_model == "H100-SXM5-80GB" and h.gpu_count == 8
    assert h.fabric == "infiniband" and len(h.ib_hcas) == 8 and h.bootstrap_interface == "ens10f0np0"
    assert h.node_rank == 1 and h.ssh_user == "ubuntu" and h.ssh_port == 22
    assert "qwen2_72b" in h.groups and "gpu_nodes" in h.groups and "all" not in h.groups
    c = fleet.clusters["qwen2_72b"]
    assert c.members == ("node01", "node02") and c.head == "node01"
    assert c.settings["tensor_parallel_size"] == 8 and c.settings["executor"] == "mp"
    assert c.settings["block_size"] == 16  # a default the group did not set
    assert fleet.cluster_of("node03") == ["llama31_70b"]
    assert fleet.groups["qwen2_72b"] == ("node01", "node02")
    assert set(fleet.groups["all"]) == set(fleet.hosts)
    assert fleet.group_vars["gpu_nodes"]["gpu_count"] == 8
    assert "vllm_clusters" not in fleet.clusters  # only groups whose own vars define vllm_cluster


def test_members_ordered_by_rank(tmp_path: Path) -> None:
    ini = "[gpu_nodes]\nz\ny\nx\n[c1]\nz node_rank=0\ny node_rank=2\nx node_rank=1\n"
    fleet = load_fleet(write_inventory(tmp_path, ini=ini))
    assert fleet.clusters["c1"].members == ("z", "x", "y")


def test_ini_version_arrives_as_float(tmp_path: Path) -> None:
    """The gotcha rule VAR001 exists for: Ansible literal-evaluates INI values."""
    fleet = load_fleet(write_inventory(tmp_path, ini="[gpu_nodes]\nn1\n[gpu_nodes:vars]\ncuda_version=12.10\n"))
    assert fleet.hosts["n1"].vars["cuda_version"] == 12.1


@pytest.mark.parametrize(
    ("ini", "name", "expect"),
    [
        ("[gpu_nodes\nn1\n", "hosts.ini", "hosts.ini:1: cannot parse inventory: section header '[gpu_nodes'"),
        ("[gpu_nodes]\nn1\n\nn2 foo\n", "hosts.ini", "hosts.ini:4: cannot parse inventory: Expected key=value"),
        ("[g:children]\nnope\n", "hosts.ini", "hosts.ini:2: cannot parse inventory: Section [g:children] includes "
                                              "undefined group 'nope'"),
        ("[g]\nn[1:x]\n", "hosts.ini", "hosts.ini:2: cannot parse inventory: cannot read 'n[1:x]'"),
        ("all:\n  hosts:\n    n1: {a: 1\n", "hosts.yml", "hosts.yml:4: cannot parse inventory: invalid YAML"),
        ("all:\n  hosts: [a]\n", "hosts.yml", 'requires a dictionary, found list instead'),
        ("", "hosts.ini", "inventory is empty"),
    ],
)
def test_parse_errors_name_file_line_and_reason(tmp_path: Path, ini: str, name: str, expect: str) -> None:
    inv = write_inventory(tmp_path, ini=ini, name=name, base=False)
    with pytest.raises(UsageError) as ei:
        load_fleet(inv)
    assert expect in str(ei.value)
    assert str(inv) in str(ei.value)


def test_bad_group_vars_yaml_names_the_file_and_line(tmp_path: Path) -> None:
    inv = write_inventory(tmp_path, files={"group_vars/gpu_nodes.yml": "gpu_count: 8\n- oops\n"})
    with pytest.raises(UsageError) as ei:
        load_fleet(inv)
    msg = str(ei.value)
    assert "group_vars/gpu_nodes.yml:2" in msg and "YAML" in msg


def test_missing_and_unreadable(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="inventory not found"):
        load_fleet(tmp_path / "nope.ini")


# --- plan.fleet_from_vars: the same Fleet from a play's own resolved inventory (hostvars), -e on top --------------


def test_play_fleet_equals_load_fleet() -> None:
    p = INVENTORIES / "rack-a.ini"
    fleet, _, _ = _play_fleet(p)
    _same(fleet, load_fleet(p))
    assert fleet.source == p


def test_play_fleet_ignores_limit_and_serial_batches() -> None:
    """--limit node01 and a serial batch [node01] still see whole clusters (node02 is node01's peer)."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.hostvars import HostVars
    from ansible.vars.manager import VariableManager

    from provisioner.plan import fleet_from_vars

    p = INVENTORIES / "rack-a.ini"
    loader = DataLoader()
    inv = InventoryManager(loader=loader, sources=[str(p)])
    inv.subset("node01")
    inv.restrict_to_hosts([inv.get_host("node01")])
    hv = HostVars(inventory=inv, variable_manager=VariableManager(loader=loader, inventory=inv), loader=loader)
    groups = inv.get_groups_dict()
    fleet = fleet_from_vars({h: hv.raw_get(h) for h in groups["all"]}, groups, source=p)
    _same(fleet, load_fleet(p))


def test_play_fleet_puts_extra_vars_on_top_as_ansible_does(tmp_path: Path) -> None:
    inv = write_inventory(tmp_path, host_vars={"n1": {"nccl_ib_timeout": 20}})
    extra = {"nccl_ib_timeout": 19, "vllm_cluster": {"model": "/m", "model_arch": "Qwen2-72B",
                                                       "tensor_parallel_size": 8, "pipeline_parallel_size": 2,
                                                       "max_num_seqs": 7}}
    fleet, vm, ansible_inv = _play_fleet(inv, extra)
    for h in ansible_inv.get_hosts():  # Ansible's own view of every host: extra vars win
        v = vm.get_vars(host=h, include_hostvars=False)
        assert fleet.hosts[h.name].vars["nccl_ib_timeout"] == v["nccl_ib_timeout"] == 19
        assert fleet.hosts[h.name].vars["vllm_cluster"] == v["vllm_cluster"]
    assert fleet.clusters["c1"].settings["max_num_seqs"] == 7
    assert fleet.clusters["c1"].settings["max_model_len"] == 4096  # a default under the -e dict
    assert set(fleet.clusters) == {"c1"}  # -e does not make every group a cluster
    assert "nccl_ib_timeout" not in fleet.group_vars.get("gpu_nodes", {})  # nor adds variables to groups
