"""plugins/filter/provisioner_addresses.py: the firewall's address lists (ansible_host, else the name, in order)."""

from __future__ import annotations

import importlib.util

import pytest

from provisioner import PROJECT_ROOT

_spec = importlib.util.spec_from_file_location("provisioner_addresses",
                                               PROJECT_ROOT / "plugins/filter/provisioner_addresses.py")
assert _spec and _spec.loader
mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mod)

HOSTVARS = {"node01": {"ansible_host": "198.18.1.11"}, "node02": {"ansible_host": ""}, "lb01": {}}


def test_addresses_in_order_with_the_name_as_fallback() -> None:
    assert mod.provisioner_addresses(["node02", "node01", "lb01"], HOSTVARS) == ["node02", "198.18.1.11", "lb01"]
    assert mod.provisioner_addresses([], HOSTVARS) == []


def test_a_host_outside_the_inventory_is_named() -> None:
    with pytest.raises(ValueError, match="'node09' is not a host"):
        mod.provisioner_addresses(["node01", "node09"], HOSTVARS)


def test_registered_as_a_filter() -> None:
    assert mod.FilterModule().filters() == {"provisioner_addresses": mod.provisioner_addresses}
