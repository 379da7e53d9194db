"""Pure parts of the testbed network: addresses, names."""

from __future__ import annotations

import ipaddress

import pytest

from provisioner_testbed import network


def test_default_rack_matches_the_contract() -> None:
    assert str(network.subnet(0)) == "198.18.0.0/24"
    assert network.gateway(0) == "198.18.0.1"
    assert network.bridge_name(0) == "pvbr0"
    assert [network.host_address(0, i) for i in (1, 2, 16)] == ["198.18.0.11", "198.18.0.12", "198.18.0.26"]


def test_every_rack_subnet_stays_inside_the_benchmark_range() -> None:
    base = ipaddress.IPv4Network("198.18.0.0/15")
    nets = [network.subnet(i) for i in range(network.MAX_RACKS)]
    assert all(n.subnet_of(base) for n in nets)
    assert len(set(nets)) == network.MAX_RACKS
    assert str(network.subnet(256)) == "198.19.0.0/24"
    with pytest.raises(ValueError):
        network.subnet(network.MAX_RACKS)


def test_host_numbers_are_bounded() -> None:
    assert network.host_address(0, network.MAX_HOSTS) == "198.18.0.254"
    with pytest.raises(ValueError):
        network.host_address(0, network.MAX_HOSTS + 1)
    with pytest.raises(ValueError):
        network.host_address(0, 0)


def test_veth_names_fit_the_kernel_limit_and_never_collide_across_racks() -> None:
    names = {f"vb-{network.machine_name(r, h)}" for r in range(network.MAX_RACKS) for h in (1, 9, 64)}
    assert len(names) == network.MAX_RACKS * 3
    assert max(len(n) for n in names) <= 15
