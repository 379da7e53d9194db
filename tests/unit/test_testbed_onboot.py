"""A simulated host's boot loads the NVIDIA kernel module that is installed on its disk (provisioner_testbed.onboot):
a driver upgrade shows as loaded only after the next boot, and a spec's own module (a fault) wins."""

from __future__ import annotations

import json
from pathlib import Path

from provisioner_testbed import hosts as hostmod
from provisioner_testbed import hwspec, onboot
from provisioner_testbed.rack import materialize

MARKER = "stand-in for nvidia.ko {} (open); nothing is loaded, see /usr/src/nvidia-{}/README.hwsim\n"


def _host(tmp_path: Path, spec: dict) -> hostmod.HostPaths:
    hp = hostmod.HostPaths(tmp_path / "node01")
    hp.merged.mkdir(parents=True)
    materialize(hp, spec)  # as `testbed up` does before the first boot
    return hp


def _install(hp: hostmod.HostPaths, version: str) -> None:
    d = hp.merged / "usr/lib/modules/6.1.0-41-amd64/updates/dkms"
    d.mkdir(parents=True, exist_ok=True)
    (d / "nvidia.ko").write_text(MARKER.format(version, version))


def _loaded(hp: hostmod.HostPaths) -> str:
    return (hp.hwsim / "sys/module/nvidia/version").read_text().strip()


def test_an_installed_upgrade_is_loaded_by_the_next_boot_not_before(tmp_path: Path) -> None:
    hp = _host(tmp_path, {"node": "node01", "gpu_count": 1})
    assert _loaded(hp) == hwspec.DEFAULT_DRIVER
    _install(hp, "580.105.08")  # the package is upgraded on the running host: nothing reloads
    assert _loaded(hp) == hwspec.DEFAULT_DRIVER
    assert onboot.on_boot(hp.root) == "580.105.08"
    assert _loaded(hp) == "580.105.08"
    smi = json.loads((hp.hwsim / "spec.json").read_text())
    assert smi["driver"]["kernel_module_version"] == "580.105.08"
    assert "580.105.08" in (hp.hwsim / "proc/driver/nvidia/version").read_text()
    # the spec as given stays as given; a fault injected later keeps the booted module
    assert "kernel_module_version" not in json.loads(hp.spec.read_text())
    materialize(hp, {"node": "node01", "gpu_count": 1, "faults": {"row_remap_pending": 0}})
    assert _loaded(hp) == "580.105.08"


def test_no_module_installed_is_the_specs_driver(tmp_path: Path) -> None:
    hp = _host(tmp_path, {"node": "node01"})
    _install(hp, "580.105.08")
    onboot.on_boot(hp.root)
    for ko in hp.merged.glob("usr/lib/modules/*/updates/dkms/nvidia.ko"):
        ko.unlink()  # the driver removed: the next boot loads none of ours, the spec's version stands
    assert onboot.on_boot(hp.root) is None
    assert not (hp.root / onboot.LOADED).exists()
    assert _loaded(hp) == hwspec.DEFAULT_DRIVER


def test_a_specs_own_module_or_fm_mismatch_wins_over_the_boot(tmp_path: Path) -> None:
    hp = _host(tmp_path, {"node": "node01", "faults": {"fm_mismatch": True}})
    _install(hp, "580.105.08")
    onboot.on_boot(hp.root)
    assert _loaded(hp) == hwspec.MISMATCH_DRIVER
    hp2 = _host(tmp_path / "b", {"node": "node01", "kernel_module_version": "580.82.07"})
    _install(hp2, hwspec.DEFAULT_DRIVER)
    onboot.on_boot(hp2.root)
    assert _loaded(hp2) == "580.82.07"
