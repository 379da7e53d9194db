"""Data and helpers shared by tests/unit/test_preflight_iface.py (in-process)
and tests/integration/test_preflight_iface_process.py (its process cases)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from provisioner.model import Fleet, Host, freeze


def _host(**vars: Any) -> Host:
    base = {"gpu_model": "H100-SXM5-80GB", "gpu_count": 8, "fabric": "infiniband", "ib_hcas": ["mlx5_0"]}
    return Host("node01", "10.0.0.11", ("gpu_nodes",), freeze({**base, **vars}))


def _fleet(host: Host) -> Fleet:
    return Fleet(source=Path("inv.ini"), hosts=freeze({host.name: host}), clusters=freeze({}))


# --- the probe snippet, run by a real /bin/sh against a fake node ---------------------------------------------------
def _fake_node(root: Path) -> dict[str, str]:
    for name in ("lo", "eth0", "ib0"):
        (root / "sys/class/net" / name).mkdir(parents=True)
    port = root / "sys/class/infiniband/mlx5_0/ports/1"
    port.mkdir(parents=True)
    for f, v in {"state": "4: ACTIVE", "phys_state": "5: LinkUp", "rate": "400 Gb/sec (4X NDR)",
                 "link_layer": "InfiniBand"}.items():
        (port / f).write_text(v + "\n")
    (root / "sys/class/infiniband/mlx5_0/device").mkdir()
    (root / "sys/class/infiniband/mlx5_0/device/numa_node").write_text("0\n")
    gpu = root / "sys/bus/pci/devices/0000:18:00.0"
    gpu.mkdir(parents=True)
    for f, v in {"vendor": "0x10de", "class": "0x030200", "device": "0x2330"}.items():
        (gpu / f).write_text(v + "\n")
    nic = root / "sys/bus/pci/devices/0000:19:00.0"
    nic.mkdir(parents=True)
    (nic / "vendor").write_text("0x15b3\n")
    (root / "etc").mkdir()
    (root / "etc/os-release").write_text('PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_ID="12"')
    (root / "proc/sys/kernel").mkdir(parents=True)
    (root / "proc/sys/kernel/osrelease").write_text("6.1.0-test\n")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text('#!/bin/sh\ncase "$1" in topo) printf "\\tGPU0\\tNIC0\\nGPU0\\t X \\tPIX\\n\\nNIC Legend:\\n\\n'
                   '  NIC0: mlx5_0\\n";; *) echo "0, NVIDIA H100 80GB HBM3, 81559, 580.95.05, Enabled, '
                   '00000000:18:00.0";; esac\n')
    smi.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
