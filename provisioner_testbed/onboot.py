"""What a boot does to a simulated host's hardware: the kernel loads the NVIDIA module that is installed.

The host's supervisor (`hosts.SUPERVISOR`) runs `python -m provisioner_testbed.onboot HOST_DIR` before every boot of
nspawn (the first, each reboot from inside, each power on through the BMC). It reads the stand-in DKMS marker of the
installed `nvidia-kernel-open` package from the host's disk, records its version in `HOST_DIR/loaded-module` and
re-materializes the hardware directory, so a driver upgrade is loaded by the next boot and not before, as on a
real node. A spec that sets `kernel_module_version` or the fault `fm_mismatch` keeps that (a fault wins).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

#: hosts/HOST/loaded-module: the NVIDIA kernel module version the host booted with (absent: none installed)
LOADED = "loaded-module"
_MARKER = re.compile(r"nvidia\.ko (\d+\.\d+(?:\.\d+)?) ")


def installed_module(root: Path) -> str | None:
    """The version of the NVIDIA kernel module installed under the host's root (the stand-in DKMS marker)."""
    for p in sorted(Path(root).glob("usr/lib/modules/*/updates/dkms/nvidia.ko")):
        try:
            m = _MARKER.search(p.read_text(errors="replace"))
        except OSError:
            continue
        if m:
            return m.group(1)
    return None


def loaded_module(host_dir: Path) -> str | None:
    try:
        return (Path(host_dir) / LOADED).read_text().strip() or None
    except OSError:
        return None


def effective_spec(spec: dict, loaded: str | None) -> dict:
    """The spec the hardware directory is materialized from: the booted module unless the spec sets one."""
    faults = spec.get("faults") or {}
    if not loaded or "kernel_module_version" in spec or faults.get("fm_mismatch"):
        return spec
    return {**spec, "kernel_module_version": loaded}


def on_boot(host_dir: Path) -> str | None:
    """Record the module this boot loads and re-materialize the host's hardware; return the version."""
    from provisioner_testbed import hosts as hostmod
    from provisioner_testbed.rack import materialize

    hp = hostmod.HostPaths(Path(host_dir))
    version = installed_module(hp.merged)
    mark = hp.root / LOADED
    if version:
        mark.write_text(version + "\n")
    else:
        mark.unlink(missing_ok=True)
    if hp.spec.is_file():
        materialize(hp, json.loads(hp.spec.read_text()))
    return version


if __name__ == "__main__":
    v = on_boot(Path(sys.argv[1]))
    print(f"provisioner-testbed: boot loads NVIDIA kernel module {v or '(none installed)'}", file=sys.stderr)
