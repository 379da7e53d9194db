"""The parsed-inventory cache (provisioner/inventory/cache.py): a second load of the same bytes is the same fleet
without Ansible's parse; any change to the inventory, group_vars/, host_vars/ or -e is a fresh parse; vaulted values
are kept as ciphertext only; an entry anyone else could have written is never unpickled."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from provisioner import vault
from provisioner.inventory import cache as inventory_cache
from provisioner.inventory import load_fleet
from tests.support.inventory_factory import write_inventory

PW = "cache-vault-pw"
SECRET = "sk-cache-secret-4711"


@pytest.fixture(autouse=True)
def cache_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    from ansible import constants as C

    monkeypatch.setenv("PROVISION_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("PROVISION_INVENTORY_CACHE", raising=False)
    monkeypatch.setattr(inventory_cache, "MIN_HOSTS", 1)  # the factory's inventories are small
    vault._reset_for_tests()
    monkeypatch.delenv("ANSIBLE_VAULT_PASSWORD_FILE", raising=False)
    monkeypatch.setattr(C, "DEFAULT_VAULT_PASSWORD_FILE", None, raising=False)
    monkeypatch.setattr(C, "DEFAULT_VAULT_IDENTITY_LIST", [], raising=False)
    yield tmp_path / "state" / "inventory-cache"
    vault._reset_for_tests()


def _entries(d: Path) -> list[Path]:
    return sorted(d.glob("*.pickle")) if d.is_dir() else []


def test_a_second_load_is_the_cached_fleet_and_equal(tmp_path: Path, cache_here: Path) -> None:
    inv = write_inventory(tmp_path / "inv")
    first = load_fleet(inv)
    assert first.ansible_inventory is not None and len(_entries(cache_here)) == 1
    assert oct(cache_here.stat().st_mode & 0o777) == "0o700"
    assert oct(_entries(cache_here)[0].stat().st_mode & 0o777) == "0o600"
    second = load_fleet(inv)
    assert second.ansible_inventory is None  # not parsed by Ansible
    assert second.hosts == first.hosts and second.clusters == first.clusters
    assert dict(second.group_vars) == dict(first.group_vars) and dict(second.groups) == dict(first.groups)
    from provisioner.inventory.origin import where

    value = second.hosts["n1"].vars["gpu_model"]  # the file and line a finding names survive the cache
    assert where(value) == where(first.hosts["n1"].vars["gpu_model"]) is not None
    assert str(where(value)[0]).endswith("group_vars/gpu_nodes.yml")  # type: ignore[index]


@pytest.mark.parametrize("change", ["group_vars", "host_vars", "inventory", "extra_vars"])
def test_any_change_to_what_the_parse_read_is_a_fresh_parse(tmp_path: Path, change: str) -> None:
    inv = write_inventory(tmp_path / "inv")
    load_fleet(inv)
    extra = None
    if change == "group_vars":
        (inv.parent / "group_vars" / "gpu_nodes.yml").write_text(
            (inv.parent / "group_vars" / "gpu_nodes.yml").read_text() + "cache_probe: 1\n")
    elif change == "host_vars":
        (inv.parent / "host_vars").mkdir(exist_ok=True)
        (inv.parent / "host_vars" / "n1.yml").write_text("cache_probe: 1\n")
    elif change == "inventory":
        inv.write_text(inv.read_text().replace("n1 ", "n1 cache_probe=1 ", 1))
    else:
        extra = {"cache_probe": 1}
    fleet = load_fleet(inv, extra_vars=extra)
    assert fleet.ansible_inventory is not None
    assert fleet.hosts["n1"].vars.get("cache_probe") == 1


def test_vaulted_values_are_cached_as_ciphertext_and_still_decrypt(tmp_path: Path, cache_here: Path) -> None:
    from ansible.parsing.vault import VaultLib, VaultSecret

    text = VaultLib([("default", VaultSecret(PW.encode()))]).encrypt(SECRET).decode()
    vaulted = "vllm_api_key: !vault |\n" + "".join(f"  {line}\n" for line in text.splitlines())
    inv = write_inventory(tmp_path / "inv", files={"group_vars/gpu_nodes/vault.yml": vaulted})
    pw = tmp_path / "pw"
    pw.write_text(PW + "\n")
    pw.chmod(0o600)
    first = load_fleet(inv, vault_password_file=pw)
    assert str(first.hosts["n1"].vars["vllm_api_key"]) == SECRET  # decrypted before the entry is written? never kept
    vault._reset_for_tests()
    inventory_cache.store(inv, inventory_cache.key(inv, None), first.hosts, first.clusters, first.group_vars,
                          first.groups)
    blob = _entries(cache_here)[0].read_bytes()
    assert SECRET.encode() not in blob
    second = load_fleet(inv, vault_password_file=pw)
    assert second.ansible_inventory is None
    value = second.hosts["n1"].vars["vllm_api_key"]
    assert vault.is_vaulted(value) and str(value) == SECRET


def test_an_entry_others_could_write_is_never_read(tmp_path: Path, cache_here: Path) -> None:
    inv = write_inventory(tmp_path / "inv")
    load_fleet(inv)
    entry = _entries(cache_here)[0]
    os.chmod(entry, 0o666)
    assert load_fleet(inv).ansible_inventory is not None  # parsed again, entry rewritten privately
    assert oct(_entries(cache_here)[0].stat().st_mode & 0o777) == "0o600"


def test_plugin_configs_executables_and_the_off_switch_are_never_cached(tmp_path: Path, cache_here: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    plugin = tmp_path / "aws.yml"
    plugin.write_text("plugin: amazon.aws.aws_ec2\nregions: [eu-west-1]\n")
    assert inventory_cache.key(plugin, None) is None
    script = tmp_path / "inv.py"
    script.write_text("#!/bin/sh\necho '{}'\n")
    script.chmod(0o755)
    assert inventory_cache.key(script, None) is None
    inv = write_inventory(tmp_path / "inv")
    monkeypatch.setenv("PROVISION_INVENTORY_CACHE", "0")
    load_fleet(inv)
    assert _entries(cache_here) == [] and load_fleet(inv).ansible_inventory is not None
