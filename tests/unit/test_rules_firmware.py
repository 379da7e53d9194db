"""BMC variables and the `firmware` map (provisioner/rules/firmware.py), the pure parts of provisioner/bmc/:
component names, version strings, the comparison `provision firmware` prints, and password resolution."""

from __future__ import annotations

from pathlib import Path

import pytest

from inventory_factory import BASE_INI, gpu_nodes, write_inventory
from provisioner.bmc.components import classify, version_problem
from provisioner.bmc.config import BmcConfigError, resolve_password, target
from provisioner.bmc.firmware import HostFirmware, Item, compare, items_from_inventory, wanted_map, with_fallbacks
from provisioner.inventory import load_fleet
from provisioner.rules import run_rules
from rules_helpers import findings

BMC = {"bmc_address": "10.1.0.1", "bmc_username": "admin", "bmc_password_env": "BMC_PASSWORD"}
SECRET = "s3cret-Pa55"


def _vault_yaml(plaintext: str, password: bytes = b"vault-pw") -> str:
    from ansible.parsing.vault import VaultLib, VaultSecret

    text = VaultLib([("default", VaultSecret(password))]).encrypt(plaintext).decode()
    return "bmc_password: !vault |\n" + "".join(f"  {line}\n" for line in text.splitlines())


def test_url_in_bmc_address_names_the_fix(tmp_path: Path) -> None:
    (f,) = findings(tmp_path, "BMC001", host_vars={"n1": {**BMC, "bmc_address": "https://10.1.0.1/redfish"}})
    assert f.host == "n1" and "bmc_address: '10.1.0.1'" in f.message


def test_port_in_bmc_address_and_quoted_port(tmp_path: Path) -> None:
    fs = findings(tmp_path, "BMC001", host_vars={"n1": {**BMC, "bmc_address": "bmc-n1:8443"},
                                                 "n2": {**BMC, "bmc_address": "10.1.0.2", "bmc_port": "443"}})
    by = {f.host: f.message for f in fs}
    assert "bmc_port: 8443" in by["n1"] and "without quotes" in by["n2"]


def test_bad_group_value_is_reported_once_on_the_group(tmp_path: Path) -> None:
    fs = findings(tmp_path, "BMC001", group_vars=gpu_nodes(bmc_tls_verify="no"))
    assert [(f.group, f.host) for f in fs] == [("gpu_nodes", None)]


def test_shared_bmc_names_both_hosts(tmp_path: Path) -> None:
    (f,) = findings(tmp_path, "BMC002", host_vars={"n1": BMC, "n2": BMC})
    assert f.host == "n2" and "n1" in f.message
    # the same address on another port is another BMC (one BMC per port on a shared front end)
    assert findings(tmp_path / "p", "BMC002", host_vars={"n1": BMC, "n2": {**BMC, "bmc_port": 8443}}) == []


def test_credentials_missing_or_both(tmp_path: Path) -> None:
    fs = findings(tmp_path, "BMC003", host_vars={"n1": {"bmc_address": "10.1.0.1"},
                                                 "n2": {**BMC, "bmc_address": "10.1.0.2", "bmc_password": "x"}})
    assert {(f.host, f.var) for f in fs} == {("n1", "bmc_username"), ("n1", "bmc_password"),
                                             ("n2", "bmc_password_env")}


def test_plaintext_password_in_ini_is_a_warning_naming_the_file(tmp_path: Path) -> None:
    ini = BASE_INI.replace("n1 ansible_host=10.0.0.1", "n1 ansible_host=10.0.0.1 bmc_address=10.1.0.1 "
                           f"bmc_username=admin bmc_password={SECRET}")
    (f,) = findings(tmp_path, "BMC004", ini=ini)
    assert f.severity == "warning" and "hosts.ini" in f.message and "INI inventory cannot hold a vault" in f.message
    assert SECRET not in f.line()


def test_vaulted_password_is_neither_decrypted_nor_flagged(tmp_path: Path) -> None:
    inv = write_inventory(tmp_path, host_vars={"n1": {k: v for k, v in BMC.items() if k != "bmc_password_env"}},
                          files={"host_vars/n2.yml": _vault_yaml(SECRET) + "bmc_address: 10.1.0.2\n"
                                 "bmc_username: admin\n"})
    # host_vars/n1.yml holds no password: BMC003 for n1 only; n2's vault value needs no vault secret to be checked
    fs = [f for f in run_rules(load_fleet(inv)) if f.code.startswith(("BMC", "FW"))]
    assert [(f.code, f.host) for f in fs] == [("BMC003", "n1")]


def test_tls_opt_out_and_http_are_warnings(tmp_path: Path) -> None:
    fs = findings(tmp_path, "BMC005", host_vars={
        "n1": {**BMC, "bmc_tls_verify": False, "bmc_ca_file": "/etc/ca.pem"},
        "n2": {**BMC, "bmc_address": "10.1.0.2", "bmc_scheme": "http"}})
    by = {f.host: f for f in fs}
    assert all(f.severity == "warning" for f in fs)
    assert "bmc_ca_file is ignored" in by["n1"].message and "in clear" in by["n2"].message


def test_firmware_map_findings(tmp_path: Path) -> None:
    fw = {"bios": ["2.3.1", 1.1], "bois": ["1"], "gpu": "96.00.89.00.01", "bmc": ["7.00 rc1"]}
    fs = findings(tmp_path, group_vars=gpu_nodes(firmware=fw))
    got = {(f.code, f.group) for f in fs if f.code.startswith("FW")}
    assert got == {("FW001", "gpu_nodes"), ("FW002", "gpu_nodes"), ("FW003", "gpu_nodes")}
    msgs = " ".join(f.message for f in fs if f.code.startswith("FW"))
    assert "did you mean 'bios'" in msgs and "write gpu: ['96.00.89.00.01']" in msgs and "quote it: '1.1'" in msgs
    assert "'7.00 rc1' is not a version" in msgs


def test_host_firmware_map_overrides_the_group_and_is_checked_on_the_host(tmp_path: Path) -> None:
    fs = findings(tmp_path, "FW002", group_vars=gpu_nodes(firmware={"bios": ["2.3.1"]}),
                  host_vars={"n2": {"firmware": {"nics": ["28.39.1002"]}}})
    assert [(f.host, f.group) for f in fs] == [("n2", None)] and "did you mean 'nic'" in fs[0].message


@pytest.mark.parametrize(("member_id", "name", "component"), [
    ("HGX_FW_GPU_SXM_1", "", "gpu"), ("HGX_FW_BMC_0", "", "hgx_bmc"), ("HGX_FW_PCIeRetimer_3", "", "pcie_retimer"),
    ("HGX_FW_NVSwitch_0", "", "nvswitch"), ("HGX_FW_ERoT_GPU_SXM_1", "", "erot"),
    ("Installed-25227-7.00.00.00", "Integrated Dell Remote Access Controller", "bmc"),
    ("Installed-159-2.19.1", "BIOS", "bios"), ("BMC", "BMC firmware", "bmc"),
    ("NIC.Slot.3-1", "Mellanox ConnectX-7", "nic"), ("Current-CPLD", "System CPLD", "cpld"),
    ("Disk.Bay.0", "Samsung NVMe", "nvme"), ("Foo", "Something else", None),
])
def test_classify(member_id: str, name: str, component: str | None) -> None:
    assert classify(member_id, name) == component


def test_version_problem() -> None:
    for ok in ("7.00.00.00", "2.13.1-rc2", "96.00.89.00.01", "1.0(3)", "U46_v2.10"):
        assert version_problem(ok) is None, ok
    for bad in (1.1, 7, True, "", " ", "7 00", "x" * 65, None):
        assert version_problem(bad), bad


def test_compare_mismatch_missing_and_unjudged() -> None:
    rep = HostFirmware("n1", tuple(items_from_inventory([
        {"Id": f"HGX_FW_GPU_SXM_{i}", "Name": "GPU", "Version": "96.00.89.00.01" if i < 7 else "96.00.61.00.01"}
        for i in range(1, 9)] + [{"Id": "CPLD", "Name": "CPLD", "Version": "1.2"}, {"Id": "NoVersion"}])))
    wanted = wanted_map({"gpu": ["96.00.89.00.01"], "bios": ["2.3.1"], "bogus": ["1"], "nic": [1.1]})
    assert wanted == {"gpu": ("96.00.89.00.01",), "bios": ("2.3.1",)}
    fs = compare(rep, wanted)
    assert [(f.code, f.component) for f in fs] == [("FW010", "gpu"), ("FW011", "bios")]
    gpu = fs[0]
    assert gpu.found == ("96.00.61.00.01",) and gpu.wanted == ("96.00.89.00.01",) and gpu.ids == ("HGX_FW_GPU_SXM_7",
                                                                                                    "HGX_FW_GPU_SXM_8")
    assert gpu.as_dict()["found"] == ["96.00.61.00.01"] and "firmware.gpu" in gpu.line()
    assert compare(HostFirmware("n2", error="n2: BMC https://x: the BMC is unreachable"), wanted)[0].code == "FW012"


def test_fallbacks_only_where_the_inventory_has_none() -> None:
    items = with_fallbacks([Item("bios", "BIOS", "BIOS", "2.3.1")], "9.9", "1.00")
    assert [(i.component, i.version, i.source) for i in items] == [
        ("bios", "2.3.1", "FirmwareInventory"), ("bmc", "1.00", "Manager")]


def test_password_from_env_never_in_errors() -> None:
    assert resolve_password("n1", BMC, environ={"BMC_PASSWORD": SECRET}) == SECRET
    with pytest.raises(BmcConfigError, match="BMC_PASSWORD, which is not set"):
        resolve_password("n1", BMC, environ={})
    t = target("n1", {**BMC, "bmc_port": 8443}, password=SECRET)
    assert SECRET not in repr(t) and t.url == "https://10.1.0.1:8443" and t.verify is True
    assert target("n1", {**BMC, "bmc_address": "fd00::5"}).url == "https://[fd00::5]"
    with pytest.raises(BmcConfigError, match="not a readable file"):
        target("n1", {**BMC, "bmc_ca_file": "/nonexistent/ca.pem"})


def test_vaulted_password_needs_the_vault_secret(tmp_path: Path) -> None:
    inv = write_inventory(tmp_path, files={"host_vars/n1.yml": _vault_yaml(SECRET) + "bmc_address: 10.1.0.1\n"})
    hv = load_fleet(inv).hosts["n1"].vars
    from ansible.parsing.vault import VaultSecretsContext

    if VaultSecretsContext.current(optional=True) is None:
        with pytest.raises(BmcConfigError, match="no vault password") as exc:
            resolve_password("n1", hv)
        assert SECRET not in str(exc.value)
    templated = {"bmc_password": "{{ vault_bmc_password }}", "vault_bmc_password": SECRET}
    assert resolve_password("n1", templated, templar=lambda s: templated["vault_bmc_password"]) == SECRET


NODE_OUT = """gpu 0 96.00.89.00.01
gpu 1 96.00.61.00.01
hca mlx5_0 28.43.1014
hca rdmap79s0 0.0.0.0
hca mlx5_1 not a version
garbage
"""


def test_the_nodes_own_report_is_parsed_into_items() -> None:
    from provisioner.bmc.firmware import items_from_node

    assert [(i.component, i.id, i.version, i.source) for i in items_from_node(NODE_OUT)] == [
        ("gpu", "GPU0", "96.00.89.00.01", "node"), ("gpu", "GPU1", "96.00.61.00.01", "node"),
        ("hca", "mlx5_0", "28.43.1014", "node")]


def test_node_items_are_judged_with_the_bmcs_and_survive_an_unreadable_bmc() -> None:
    from provisioner.bmc.firmware import items_from_node, merged

    wanted = wanted_map({"gpu": ["96.00.89.00.01"], "hca": ["28.43.1014"], "bios": ["2.3.1"]})
    bmc = HostFirmware("n1", (Item("bios", "BiosVersion", "ComputerSystem.BiosVersion", "2.3.1", "ComputerSystem"),))
    fs = compare(merged(bmc, items_from_node(NODE_OUT), None), wanted)
    assert [(f.code, f.component, f.found, f.ids) for f in fs] == [("FW010", "gpu", ("96.00.61.00.01",), ("GPU1",))]
    # the BMC unreadable: FW012, and the node's items are still judged; bios is not FW011 on top
    down = HostFirmware("n1", error="n1: BMC https://x: the BMC is unreachable")
    fs = compare(merged(down, items_from_node(NODE_OUT), None), wanted)
    assert [(f.code, f.component) for f in fs] == [("FW012", None), ("FW010", "gpu")]
    # the node unreadable too: FW011 for its components, naming why
    fs = compare(merged(bmc, [], "unreachable over SSH: timed out"), wanted)
    assert [(f.code, f.component) for f in fs] == [("FW011", "gpu"), ("FW011", "hca")]
    assert "neither the BMC nor the node reports gpu firmware (node: unreachable over SSH: timed out)" in fs[0].line()
