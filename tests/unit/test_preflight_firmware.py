"""Preflight's `firmware` check: the node's own VBIOS / HCA fw_ver (the probe's `fw` section) against the gpu / hca
entries of the host's firmware map; the section is only in the probe when the map names them."""

from __future__ import annotations

import dataclasses

from preflight_iface_shared import _fleet, _host

from provisioner.probes import parsers as p
from provisioner.probes import preflight as pf

FW = "gpu 0 96.00.99.00.01\ngpu 1 96.00.11.00.01\nhca mlx5_0 28.43.1014\n"
MAP = {"gpu": ["96.00.99.00.01"], "hca": ["28.43.1014"], "bios": ["2.19.1"]}


def _facts(fw: str | None, smi_missing: bool = False) -> p.NodeFacts:
    port = p.IbPort("mlx5_0", 1, "ACTIVE", "LinkUp", 400.0, "InfiniBand")
    return p.NodeFacts(gpus=[p.GpuInfo(i, "NVIDIA H100 80GB HBM3", 81559, "580.95.05", "Enabled") for i in range(8)],
                       ib_ports={"mlx5_0": {1: port}}, os_release={"ID": "debian", "VERSION_ID": "12"},
                       kernel="6.1.0", disk=p.DfEntry("/dev/sda1", 10**12, 0, 10**12, "/"), firmware=fw,
                       smi_missing=smi_missing)


def _fw(host: object, facts: p.NodeFacts) -> list[pf.Mismatch]:
    return [m for m in pf.compare(_fleet(host), host, facts) if m.check == "firmware"]  # type: ignore[arg-type]


def test_a_gpu_with_another_vbios_is_an_error_naming_it() -> None:
    host = _host(firmware=MAP)
    (m,) = _fw(host, _facts(FW))
    assert m.severity == "error" and m.found == "96.00.11.00.01 on GPU1" and m.expected.startswith("gpu 96.00.99")


def test_a_bare_node_without_nvidia_smi_is_a_warning_for_the_vbios_only() -> None:
    host = _host(firmware=MAP)
    ms = _fw(host, _facts("hca mlx5_0 28.39.1002\n", smi_missing=True))
    assert [(m.severity, m.expected.split()[0]) for m in ms] == [("warning", "gpu"), ("error", "hca")]
    assert "before the driver is installed" in ms[0].found and ms[1].found == "28.39.1002 on mlx5_0"


def test_no_node_components_in_the_map_no_check_and_no_probe_section() -> None:
    host = _host(firmware={"bios": ["2.19.1"]})
    assert _fw(host, _facts(FW)) == []
    assert "b fw;" not in pf.probe_script() and "b fw;" in pf.probe_script(firmware=True)
    assert _fw(_host(firmware=MAP), dataclasses.replace(_facts(None))) == []  # not asked: not judged


def test_the_fw_section_is_parsed_from_the_probe_output() -> None:
    out = "@@pv@@ begin fw\n" + FW + "@@pv@@ end fw 0\n"
    assert p.parse_probe(out).firmware == FW
