"""The parts of tests/unit/test_inventory.py that need a real process (moved from the unit lane, which runs in-process)."""
from __future__ import annotations
from pathlib import Path
from typing import Any
from inventory_factory import write_inventory
from provisioner.inventory import load_fleet
_SKIP = {"groups", "ansible_facts", "playbook_dir", "ansible_playbook_python", "ansible_config_file",
         "ansible_version", "omit", "hostvars", "ansible_local"}
class _NoFacts(dict):  # type: ignore[type-arg]
    def get(self, key: Any, default: Any = None) -> Any:
        raise KeyError(key)  # what Ansible's fact cache raises for a host without facts
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
    from provisioner.inventory import _ANSIBLE_KEEP

    return {h: {k: v for k, v in vs.items() if keep_ansible or not k.startswith("ansible_") or k in _ANSIBLE_KEEP}
            for h, vs in d.items()}
TRICKY_INI = """\
[gpu_nodes:children]
rack1
rack2

[rack1]
a ansible_host=10.0.0.1 x=host_inline
b ansible_host=10.0.0.2

[rack2]
c ansible_host=10.0.0.3

[c1]
a node_rank=0
c node_rank=1

[rack1:vars]
x=rack1
ansible_group_priority=5
v=1.5

[gpu_nodes:vars]
x=gpu_nodes
y=gpu_nodes

[all:vars]
y=all
z=all
"""
def _play_fleet(path: Path, extra: dict[str, Any] | None = None) -> Any:
    """What a filter/action plugin sees inside a play: ansible's HostVars over the play's own objects."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.hostvars import HostVars
    from ansible.vars.manager import VariableManager

    from provisioner.inventory import fleet_from_play

    loader = DataLoader()
    inv = InventoryManager(loader=loader, sources=[str(path)])
    vm = VariableManager(loader=loader, inventory=inv)
    vm._fact_cache = _NoFacts()
    if extra:
        vm._extra_vars = extra
    hv = HostVars(inventory=inv, variable_manager=vm, loader=loader)
    fleet = fleet_from_play(hv)
    assert fleet_from_play(hv) is fleet  # cached for the play
    return fleet, vm, inv
_WHERE = {"inventory_file", "inventory_dir"}  # where each host came from: differs between twins by design
def _same(a: Any, b: Any) -> None:
    def hv(f: Any) -> dict[str, Any]:
        return {n: {k: v for k, v in h.vars.items() if k not in _WHERE} for n, h in f.hosts.items()}

    assert hv(a) == hv(b)
    assert {n: (dict(c.settings), c.members) for n, c in a.clusters.items()} == \
        {n: (dict(c.settings), c.members) for n, c in b.clusters.items()}
    assert {k: dict(v) for k, v in a.group_vars.items()} == {k: dict(v) for k, v in b.group_vars.items()}
    assert dict(a.groups) == dict(b.groups)


def test_script_inventory_loads_like_its_ini_twin(tmp_path: Path) -> None:
    from inventory_factory import script_twin

    ini = write_inventory(tmp_path, ini=TRICKY_INI, base=False,
                          group_vars={"c1": {"vllm_cluster": {"model": "/m", "model_arch": "Qwen2-72B"}}})
    script = script_twin(ini, tmp_path / "dynamic.py")
    _same(load_fleet(script), load_fleet(ini))
    _same(_play_fleet(script)[0], load_fleet(ini))
