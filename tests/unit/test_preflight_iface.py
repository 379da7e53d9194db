"""Preflight's NCCL bootstrap interface check (`socket_ifname`): NCCL's NCCL_SOCKET_IFNAME rules, the value the
rendered /etc/nccl.conf carries, the comparison, the probe snippet's `net` section run by a real /bin/sh, and the
CLI's fast path (plain arguments without typer; everything else through typer)."""

from __future__ import annotations

from typing import Any

import pytest
from preflight_iface_shared import _fleet, _host

from provisioner.model import Host
from provisioner.probes import parsers as p
from provisioner.probes import preflight as pf


def _facts(ifaces: list[str] | None) -> p.NodeFacts:
    port = p.IbPort("mlx5_0", 1, "ACTIVE", "LinkUp", 400.0, "InfiniBand")
    return p.NodeFacts(gpus=[p.GpuInfo(i, "NVIDIA H100 80GB HBM3", 81559, "580.95.05", "Enabled") for i in range(8)],
                       ib_ports={"mlx5_0": {1: port}}, os_release={"ID": "debian", "VERSION_ID": "12"},
                       kernel="6.1.0", disk=p.DfEntry("/dev/sda1", 10**12, 0, 10**12, "/"), net_ifaces=ifaces)


def _iface_mismatches(host: Host, ifaces: list[str] | None) -> list[pf.Mismatch]:
    return [m for m in pf.compare(_fleet(host), host, _facts(ifaces)) if m.check == "socket_ifname"]


# --- NCCL's rules -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("value", "parsed"), [
    ("=eth0", (True, False, ["eth0"])),
    ("eth", (False, False, ["eth"])),
    ("^docker,lo", (False, True, ["docker", "lo"])),
    ("^=docker0", (True, True, ["docker0"])),
    ("=ens1f0, ens1f1 ,", (True, False, ["ens1f0", "ens1f1"])),
    ("", (False, False, [])),
])
def test_parse_socket_ifname(value: str, parsed: tuple[bool, bool, list[str]]) -> None:
    assert p.parse_socket_ifname(value) == parsed


@pytest.mark.parametrize(("value", "chosen", "unmatched"), [
    ("=eth0", ["eth0"], []),
    ("=eth", [], ["eth"]),  # exact: a prefix of a name is not a match
    ("eth", ["eth0", "eth10"], []),  # prefix: eth matches eth0 and eth10
    ("=eth0,ib0", ["eth0"], ["ib0"]),
    ("^docker", ["eth0", "eth10", "lo"], []),
    ("^=docker0,eth0,eth10,lo", ["docker1"], []),
    ("^eth,docker,lo", [], []),  # everything excluded
])
def test_select_interfaces(value: str, chosen: list[str], unmatched: list[str]) -> None:
    present = ["docker0", "docker1", "eth0", "eth10", "lo"]
    assert p.select_interfaces(value, present) == (chosen, unmatched)


def test_parse_net_section() -> None:
    assert p.parse_net_ifaces("lo\nhost0\n\n") == ["host0", "lo"]
    facts = p.parse_probe("@@pv@@ begin net\neth0\nlo\n@@pv@@ end net 0\n")
    assert facts.net_ifaces == ["eth0", "lo"]
    assert p.parse_probe("@@pv@@ begin kernel\n6.1\n@@pv@@ end kernel 0\n").net_ifaces is None  # not probed


# --- the value /etc/nccl.conf carries -------------------------------------------------------------------------------
def _rendered_socket_ifname(host: Host) -> str | None:
    """NCCL_SOCKET_IFNAME as NCCL reads the really rendered /etc/nccl.conf (first occurrence of a key wins)."""
    from provisioner import render

    v = render.role_defaults()
    v.update(host.vars)
    v["inventory_hostname"] = host.name
    return p.parse_nccl_conf(render.render_template("nccl.conf.j2", v)).get("NCCL_SOCKET_IFNAME")


@pytest.mark.parametrize("vars", [
    {"bootstrap_interface": "host0"},
    {"bootstrap_interface": "=ens1f0"},
    {"bootstrap_interface": "^docker"},
    {"bootstrap_interface": ""},
    {},
    {"nccl_extra": {"NCCL_SOCKET_IFNAME": "eth"}},
    {"bootstrap_interface": "bond0", "nccl_extra": {"NCCL_SOCKET_IFNAME": "eth"}},
])
def test_setting_is_what_the_rendered_nccl_conf_says(vars: dict[str, Any]) -> None:
    host = _host(**vars)
    want = pf.nccl_socket_ifname(host)
    assert (want[0] if want else None) == _rendered_socket_ifname(host)


def test_setting_names_the_inventory_variable() -> None:
    assert pf.nccl_socket_ifname(_host(bootstrap_interface="eth9")) == ("=eth9", "bootstrap_interface")
    assert pf.nccl_socket_ifname(_host(nccl_extra={"NCCL_SOCKET_IFNAME": "^lo"})) == (
        "^lo", "nccl_extra.NCCL_SOCKET_IFNAME")
    assert pf.nccl_socket_ifname(_host()) is None


# --- the check ------------------------------------------------------------------------------------------------------
def test_missing_interface_is_an_error_with_expected_and_found() -> None:
    ms = _iface_mismatches(_host(bootstrap_interface="eth9"), ["eth0", "lo"])
    assert [(m.severity, m.line()) for m in ms] == [
        ("error", "socket_ifname: expected NCCL_SOCKET_IFNAME==eth9 (bootstrap_interface) to match an interface, "
                  "found no such interface (interfaces: eth0, lo)")]
    report = pf.HostReport("node01", reachable=True, mismatches=ms)
    assert not report.ok and "eth9" in report.message


def test_present_interface_passes() -> None:
    assert _iface_mismatches(_host(bootstrap_interface="host0"), ["host0", "lo"]) == []
    assert _iface_mismatches(_host(bootstrap_interface="^docker"), ["docker0", "eth0"]) == []


def test_every_interface_excluded_is_an_error() -> None:
    ms = _iface_mismatches(_host(bootstrap_interface="^eth"), ["eth0", "eth1"])
    assert [m.severity for m in ms] == ["error"]


def test_list_with_one_missing_name_warns() -> None:
    ms = _iface_mismatches(_host(bootstrap_interface="=eth0,eth9"), ["eth0", "lo"])
    assert [(m.severity, m.found) for m in ms] == [("warning", "no eth9 (NCCL uses eth0; interfaces: eth0, lo)")]
    assert pf.HostReport("node01", reachable=True, mismatches=ms).ok


def test_no_setting_or_no_listing_checks_nothing() -> None:
    assert _iface_mismatches(_host(), ["eth0"]) == []
    assert _iface_mismatches(_host(bootstrap_interface="eth9"), None) == []


# --- the CLI fast path ----------------------------------------------------------------------------------------------
def test_fast_path_parses_only_plain_arguments() -> None:
    from provisioner.cli import parse_plain
    from provisioner.commands.preflight import FAST_OPTIONS

    assert parse_plain(["inv.ini", "--limit", "node01", "-f", "json", "--forks=4", "--timeout", "2.5"],
                       FAST_OPTIONS) == ("inv.ini", {"limit": "node01", "fmt": "json", "forks": 4, "timeout": 2.5})
    for argv in (["--help"], ["inv.ini", "--no-such-option"], ["inv.ini", "--forks", "x"], ["inv.ini", "--limit"],
                 [], ["a.ini", "b.ini"]):
        assert parse_plain(argv, FAST_OPTIONS) is None, argv
