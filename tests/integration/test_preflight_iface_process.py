"""The process cases of tests/unit/test_preflight_iface.py (the unit lane runs in-process);
their data and helpers are tests/support/preflight_iface_shared.py."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from preflight_iface_shared import _fake_node, _fleet, _host

from provisioner.probes import parsers as p
from provisioner.probes import preflight as pf


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
    # df ran on this machine's own disk: ask for 1 MB, not a model's 20 GB (a fresh-clone rehearsal on 2026-12-07, with
    # 16 GB free, failed this test on `disk`, which is not what it checks)
    host = _host(bootstrap_interface="eth9", gpu_count=1, preflight_min_free_gb=0.001)
    assert [m.check for m in pf.compare(_fleet(host), host, facts) if m.severity == "error"] == ["socket_ifname"]
    host = _host(bootstrap_interface="eth0", gpu_count=1, preflight_min_free_gb=0.001)
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
