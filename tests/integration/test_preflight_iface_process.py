"""The parts of tests/unit/test_preflight_iface.py that need a real process (moved from the unit lane, which runs in-process)."""
from __future__ import annotations
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from provisioner.model import Fleet, Host, freeze
from provisioner.probes import parsers as p
from provisioner.probes import preflight as pf
def _host(**vars: Any) -> Host:
    base = {"gpu_model": "H100-SXM5-80GB", "gpu_count": 8, "fabric": "infiniband", "ib_hcas": ["mlx5_0"]}
    return Host("node01", "10.0.0.11", ("gpu_nodes",), freeze({**base, **vars}))
def _fleet(host: Host) -> Fleet:
    return Fleet(source=Path("inv.ini"), hosts=freeze({host.name: host}), clusters=freeze({}))
def _facts(ifaces: list[str] | None) -> p.NodeFacts:
    port = p.IbPort("mlx5_0", 1, "ACTIVE", "LinkUp", 400.0, "InfiniBand")
    return p.NodeFacts(gpus=[p.GpuInfo(i, "NVIDIA H100 80GB HBM3", 81559, "580.95.05", "Enabled") for i in range(8)],
                       ib_ports={"mlx5_0": {1: port}}, os_release={"ID": "debian", "VERSION_ID": "12"},
                       kernel="6.1.0", disk=p.DfEntry("/dev/sda1", 10**12, 0, 10**12, "/"), net_ifaces=ifaces)
def _iface_mismatches(host: Host, ifaces: list[str] | None) -> list[pf.Mismatch]:
    return [m for m in pf.compare(_fleet(host), host, _facts(ifaces)) if m.check == "socket_ifname"]
def _rendered_socket_ifname(host: Host) -> str | None:
    """NCCL_SOCKET_IFNAME as NCCL reads the really rendered /etc/nccl.conf (first occurrence of a key wins)."""
    from provisioner import render

    v = render.role_defaults()
    v.update(host.vars)
    v["inventory_hostname"] = host.name
    return p.parse_nccl_conf(render.render_template("nccl.conf.j2", v)).get("NCCL_SOCKET_IFNAME")
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


def test_probe_snippet_lists_interfaces_with_shell_builtins(tmp_path: Path) -> None:
    env = _fake_node(tmp_path)
    script = pf.probe_script(str(tmp_path / "opt/models/none"))
    script = re.sub(r"(?<![\w/])/(sys|proc|etc)/", lambda m: f"{tmp_path}/{m.group(1)}/", script)  # onto the fake
    r = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    facts = p.parse_probe(r.stdout, disk_path=str(tmp_path / "opt/models/none"))
    assert facts.net_ifaces == ["eth0", "ib0", "lo"]
    assert [g.name for g in facts.gpus] == ["NVIDIA H100 80GB HBM3"]
    assert facts.pci_gpus == [("0000:18:00.0", "0x2330")]
    assert facts.ib_ports["mlx5_0"][1].active and facts.ib_ports["mlx5_0"][1].rate_gbps == 400.0
    assert facts.hca_numa == {"mlx5_0": 0}
    assert facts.os_release["VERSION_ID"] == "12"  # the last line has no newline: still read
    assert facts.kernel == "6.1.0-test"
    assert facts.disk is not None  # df ran on the nearest existing parent
    assert facts.topology is not None and facts.topology.nic_names == {"NIC0": "mlx5_0"}
    host = _host(bootstrap_interface="eth9", gpu_count=1)
    assert [m.check for m in pf.compare(_fleet(host), host, facts) if m.severity == "error"] == ["socket_ifname"]
    host = _host(bootstrap_interface="eth0", gpu_count=1)
    assert [m for m in pf.compare(_fleet(host), host, facts) if m.severity == "error"] == []


def test_fast_path_user_error_is_one_line_exit_2(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "provisioner.cli", "preflight", str(tmp_path / "missing.ini")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr == f"error: {tmp_path / 'missing.ini'}: inventory not found\n"
    r = subprocess.run([sys.executable, "-m", "provisioner.cli", "preflight", str(tmp_path / "x.ini"), "--forks",
                        "x"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--forks" in r.stderr and "Traceback" not in r.stderr  # typer's message


def test_preflight_fast_path_imports_no_cli_framework(tmp_path: Path) -> None:
    inv = tmp_path / "hosts.ini"
    inv.write_text("[gpu_nodes]\nnode01 ansible_host=192.0.2.1 gpu_count=8\n")
    code = ("import sys; sys.argv = ['provision', 'preflight', sys.argv[1], '--limit', 'nothing']\n"
            "import provisioner.cli as c\n"
            "try:\n    c.main()\nexcept SystemExit as e:\n    rc = e.code\n"
            "print(rc, sorted(m for m in ('typer', 'rich', 'pydantic', 'invoke') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code, str(inv)], capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "2 []", r.stdout + r.stderr
    assert "no GPU nodes match --limit nothing" in r.stderr
