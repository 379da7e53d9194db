"""Data and helpers shared by tests/unit/test_inventory.py (in-process)
and tests/integration/test_inventory_process.py (its process cases)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class _NoFacts(dict):  # type: ignore[type-arg]
    def get(self, key: Any, default: Any = None) -> Any:
        raise KeyError(key)  # what Ansible's fact cache raises for a host without facts


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
    """What the provisioner_plan action builds inside a play: each host's variables through ansible's HostVars
    (`raw_get`, public) over the play's own objects, and the play's `groups`."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.hostvars import HostVars
    from ansible.vars.manager import VariableManager

    from provisioner.plan import fleet_from_vars

    loader = DataLoader()
    inv = InventoryManager(loader=loader, sources=[str(path)])
    vm = VariableManager(loader=loader, inventory=inv)
    vm._fact_cache = _NoFacts()
    if extra:
        vm._extra_vars = extra
    hv = HostVars(inventory=inv, variable_manager=vm, loader=loader)
    groups = inv.get_groups_dict()  # the play's `groups` magic variable
    fleet = fleet_from_vars({h: hv.raw_get(h) for h in groups["all"]}, groups, source=path)
    return fleet, vm, inv


_WHERE = {"inventory_file", "inventory_dir"}  # where each host came from: differs between twins by design


def _same(a: Any, b: Any) -> None:
    def hv(f: Any) -> dict[str, Any]:
        return {n: {k: v for k, v in h.vars.items() if k not in _WHERE} for n, h in f.hosts.items()}

    assert hv(a) == hv(b)
    assert {n: (dict(c.settings), c.members) for n, c in a.clusters.items()} == \
        {n: (dict(c.settings), c.members) for n, c in b.clusters.items()}
    if a.ansible_inventory is None:  # a play's Fleet: the clusters' vllm_cluster is all it knows of group vars
        assert {k: v["vllm_cluster"] for k, v in a.group_vars.items()} == \
            {k: b.group_vars[k]["vllm_cluster"] for k in b.clusters}
    else:
        assert {k: dict(v) for k, v in a.group_vars.items()} == {k: dict(v) for k, v in b.group_vars.items()}
    assert dict(a.groups) == dict(b.groups)
