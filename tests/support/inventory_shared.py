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
