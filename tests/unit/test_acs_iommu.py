"""The ACS/IOMMU check, pure: `nodeparse.parse_lspci` (the PCI tree from `Bus: secondary/subordinate`),
`acs_redirects` (redirect on at a bridge above a GPU or HCA), `iommu_mode`, and preflight's `acs` / `iommu` checks
over NodeFacts. The text is shaped as `lspci -D -vvv` prints an HGX H100 host (a root port, a Broadcom switch, its
downstream ports above a ConnectX-7 and an H100, an NVMe drive beside them)."""

from __future__ import annotations

import pytest

from provisioner.probes import parsers as p
from provisioner.probes.nodeparse import ACS_FIX, acs_message, acs_redirects, iommu_mode, parse_lspci

OFF = "SrcValid- TransBlk- ReqRedir- CmpltRedir- UpstreamFwd- EgressCtrl- DirectTrans-"
ON = "SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-"


def bridge(addr: str, sec: int, sub: int, ctl: str | None, name: str = "Broadcom / LSI PEX890xx PCIe Gen 5 Switch"
           ) -> str:
    text = (f"{addr} PCI bridge: {name} (rev b0) (prog-if 00 [Normal decode])\n"
            f"\tControl: I/O+ Mem+ BusMaster+\n"
            f"\tBus: primary={addr.split(':')[1]}, secondary={sec:02x}, subordinate={sub:02x}, sec-latency=0\n")
    if ctl is not None:
        text += ("\tCapabilities: [220 v1] Access Control Services\n"
                 "\t\tACSCap:\tSrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl+ DirectTrans+\n"
                 f"\t\tACSCtl:\t{ctl}\n")
    return text + "\tKernel driver in use: pcieport\n\n"


def host(root: str = OFF, hca_port: str = OFF, gpu_port: str = OFF, nvme_port: str = OFF) -> str:
    return (bridge("0000:15:01.0", 0x16, 0x1c, root, "Intel Corporation Device 352a")
            + bridge("0000:16:00.0", 0x17, 0x1c, None)
            + bridge("0000:17:00.0", 0x18, 0x18, hca_port)
            + bridge("0000:17:03.0", 0x1b, 0x1b, gpu_port)
            + bridge("0000:17:04.0", 0x1c, 0x1c, nvme_port)
            + "0000:18:00.0 Infiniband controller: Mellanox Technologies MT2910 Family [ConnectX-7]\n"
              "\tKernel driver in use: mlx5_core\n\n"
              "0000:1b:00.0 3D controller: NVIDIA Corporation GH100 [H100 SXM5 80GB] (rev a1)\n"
              "\tKernel driver in use: nvidia\n\n"
              "0000:1c:00.0 Non-Volatile memory controller: Samsung Electronics Co Ltd NVMe SSD Controller PM9A1\n"
              "\tKernel driver in use: nvme\n")


def test_tree_and_kinds() -> None:
    fs = {f.address: f for f in parse_lspci(host())}
    assert list(fs) == ["0000:15:01.0", "0000:16:00.0", "0000:17:00.0", "0000:17:03.0", "0000:17:04.0",
                        "0000:18:00.0", "0000:1b:00.0", "0000:1c:00.0"]
    assert fs["0000:16:00.0"].acs is None and fs["0000:17:03.0"].acs == {k: False for k in (
        "SrcValid", "TransBlk", "ReqRedir", "CmpltRedir", "UpstreamFwd", "EgressCtrl", "DirectTrans")}
    assert (fs["0000:1b:00.0"].kind, fs["0000:18:00.0"].kind, fs["0000:1c:00.0"].kind) == ("GPU", "HCA", None)
    assert fs["0000:15:01.0"].covers(fs["0000:1b:00.0"]) and fs["0000:17:03.0"].covers(fs["0000:1b:00.0"])
    assert not fs["0000:17:00.0"].covers(fs["0000:1b:00.0"])  # the HCA's port is not above the GPU


def test_acs_off_everywhere_passes() -> None:
    assert acs_redirects(parse_lspci(host())) == []


def test_redirect_on_the_gpus_port_names_the_bridge_and_the_gpu() -> None:
    (r,) = acs_redirects(parse_lspci(host(gpu_port=ON)))
    assert r.line() == "ACS redirect on at bridge 0000:17:03.0 above GPU 0000:1b:00.0"
    (r,) = acs_redirects(parse_lspci(host(hca_port="SrcValid+ ReqRedir- CmpltRedir+")))
    assert r.line() == "ACS redirect on at bridge 0000:17:00.0 above HCA 0000:18:00.0"


def test_redirect_at_the_root_port_names_everything_below() -> None:
    (r,) = acs_redirects(parse_lspci(host(root=ON)))
    assert r.line() == "ACS redirect on at bridge 0000:15:01.0 above HCA 0000:18:00.0, GPU 0000:1b:00.0"


def test_redirect_only_above_other_devices_or_srcvalid_only_passes() -> None:
    assert acs_redirects(parse_lspci(host(nvme_port=ON))) == []  # the NVMe drive's port: not a GPUDirect path
    assert acs_redirects(parse_lspci(host(gpu_port="SrcValid+ TransBlk- ReqRedir- CmpltRedir-"))) == []


def test_domainless_addresses_and_odd_input() -> None:
    text = host(gpu_port=ON).replace("0000:", "")  # `lspci -vvv` without -D
    (r,) = acs_redirects(parse_lspci(text))
    assert r.bridge == "0000:17:03.0" and r.devices[0][1] == "0000:1b:00.0"
    assert parse_lspci("") == [] and parse_lspci("\tBus: primary=00, secondary=01, subordinate=02\n") == []
    assert parse_lspci("garbage\n\tACSCtl:\tReqRedir+\n") == []


def test_message_caps_the_list_and_names_the_fix() -> None:
    many = acs_redirects(parse_lspci(host(root=ON, hca_port=ON, gpu_port=ON)))
    assert [r.bridge for r in many] == ["0000:15:01.0", "0000:17:00.0", "0000:17:03.0"]
    msg = acs_message(many, limit=2)
    assert msg.startswith("ACS redirect on at bridge 0000:15:01.0 above HCA 0000:18:00.0, GPU 0000:1b:00.0; "
                          "ACS redirect on at bridge 0000:17:00.0 above HCA 0000:18:00.0; and 1 more bridge(s) (")
    assert msg.endswith(f"({ACS_FIX})") and "BIOS" in ACS_FIX and "ECAP_ACS+0x6.w=0000" in ACS_FIX


@pytest.mark.parametrize(("cmdline", "types", "mode"), [
    ("BOOT_IMAGE=/vmlinuz ro quiet", [], "off"),
    ("BOOT_IMAGE=/vmlinuz intel_iommu=on iommu=pt", ["identity\n", "identity"], "passthrough"),
    ("BOOT_IMAGE=/vmlinuz intel_iommu=on", ["DMA-FQ", "DMA-FQ"], "translated"),
    ("BOOT_IMAGE=/vmlinuz intel_iommu=on", [], "translated"),  # kernel < 5.11: no type files
    ("amd_iommu=off", [], "off"),
    ("iommu.passthrough=1", [], "passthrough"),
    (None, ["identity", "DMA"], "translated"),  # one group translating is enough
])
def test_iommu_mode(cmdline: str | None, types: list[str], mode: str) -> None:
    assert iommu_mode(cmdline, types)[0] == mode


def _facts(lspci: str | None, rc: int = 0, iommu: str = "cmdline\tBOOT_IMAGE=/vmlinuz ro\n") -> p.NodeFacts:
    text = ""
    if lspci is not None:
        text += f"@@pv@@ begin lspci\n{lspci}@@pv@@ end lspci {rc}\n"
    text += f"@@pv@@ begin iommu\n{iommu}@@pv@@ end iommu 0\n"
    return p.parse_probe(text)


def test_preflight_acs_check() -> None:
    from provisioner.probes.preflight import _pcie

    assert _pcie(_facts(host())) == []
    (m,) = _pcie(_facts(host(gpu_port=ON)))
    assert (m.check, m.severity) == ("acs", "error")
    assert m.line().startswith("acs: expected ACS redirect off on the PCIe bridges above GPUs and HCAs (GPUDirect "
                               "P2P/RDMA), found ACS redirect on at bridge 0000:17:03.0 above GPU 0000:1b:00.0 (fix:")
    (m,) = _pcie(_facts("sh: 1: lspci: not found\n", rc=127))
    assert (m.check, m.severity) == ("acs", "warning") and "lspci not installed (pciutils)" in m.found
    denied = host().replace("\tCapabilities: [220 v1] Access Control Services\n", "\tCapabilities: <access denied>\n")
    denied = "\n".join(line for line in denied.splitlines() if "ACS" not in line) + "\n"
    (m,) = _pcie(_facts(denied))
    assert m.severity == "warning" and "without root" in m.found
    assert _pcie(_facts(None)) == []  # an older probe without the section: nothing to say


def test_preflight_iommu_warning() -> None:
    from provisioner.probes.preflight import _pcie

    pt = "cmdline\tBOOT_IMAGE=/vmlinuz intel_iommu=on iommu=pt\n/sys/kernel/iommu_groups/0/type\tidentity\n"
    assert _pcie(_facts(host(), iommu=pt)) == []
    dma = "cmdline\tBOOT_IMAGE=/vmlinuz intel_iommu=on\n/sys/kernel/iommu_groups/0/type\tDMA-FQ\n"
    (m,) = _pcie(_facts(host(), iommu=dma))
    assert (m.check, m.severity, m.found) == ("iommu", "warning", "translated (iommu_groups type DMA-FQ)")
