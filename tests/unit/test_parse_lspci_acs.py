"""`nodeparse.parse_lspci_acs` on `lspci -vvv` output shaped as an HGX host prints it (PLX/Broadcom PCIe switch
ports above the GPUs and HCAs, an AMD root port, a GPU without the capability)."""

from __future__ import annotations

from provisioner.probes.nodeparse import parse_lspci_acs

LSPCI = """\
0000:00:01.1 PCI bridge: Advanced Micro Devices, Inc. [AMD] Starship/Matisse GPP Bridge (prog-if 00 [Normal decode])
\tControl: I/O+ Mem+ BusMaster+ SpecCycle- MemWINV- VGASnoop- ParErr- Stepping- SERR- FastB2B- DisINTx+
\tBus: primary=00, secondary=01, subordinate=0a, sec-latency=0
\tCapabilities: [2a0 v1] Access Control Services
\t\tACSCap:\tSrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-
\t\tACSCtl:\tSrcValid- TransBlk- ReqRedir- CmpltRedir- UpstreamFwd- EgressCtrl- DirectTrans-
\tKernel driver in use: pcieport

0000:03:00.0 PCI bridge: Broadcom / LSI PEX890xx PCIe Gen 5 Switch (rev b0) (prog-if 00 [Normal decode])
\tCapabilities: [f24 v1] Access Control Services
\t\tACSCap:\tSrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl+ DirectTrans+
\t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-
\tKernel driver in use: pcieport

0000:04:00.0 3D controller: NVIDIA Corporation GH100 [H200 SXM 141GB] (rev a1)
\tSubsystem: NVIDIA Corporation Device 1887
\tCapabilities: [bcc v1] Single Root I/O Virtualization (SR-IOV)
\tKernel driver in use: nvidia

0000:05:00.0 PCI bridge: Broadcom / LSI PEX890xx PCIe Gen 5 Switch (rev b0) (prog-if 00 [Normal decode])
\tCapabilities: [f24 v1] Access Control Services
\t\tACSCap:\tSrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl+ DirectTrans+
\t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir- CmpltRedir- UpstreamFwd- EgressCtrl- DirectTrans-
\t\tACSCtl:\tnot a device's line
"""


def test_acs_per_bridge() -> None:
    devs = parse_lspci_acs(LSPCI)
    assert [d.address for d in devs] == ["0000:00:01.1", "0000:03:00.0", "0000:05:00.0", "0000:05:00.0"]
    root, switch, other = devs[:3]
    assert root.is_bridge and not root.enabled and not root.redirect
    assert switch.enabled and switch.redirect and switch.ctl["UpstreamFwd"] and not switch.ctl["EgressCtrl"]
    assert "PEX890xx" in switch.name and switch.device_class == "PCI bridge"
    assert other.enabled and not other.redirect  # SrcValid only: ACS on, no redirect
    assert devs[3].ctl == {}  # a malformed line is kept as an empty flag set, never raises


def test_no_capability_and_odd_input() -> None:
    assert parse_lspci_acs("") == []
    assert parse_lspci_acs("\t\tACSCtl:\tSrcValid+\n") == []  # no device header above it
    assert parse_lspci_acs("00:02.0 VGA compatible controller: Intel\n\tKernel driver in use: i915\n") == []
    (d,) = parse_lspci_acs("00:1c.0 PCI bridge: Intel PCH Root Port\n\t\tACSCtl:\tSrcValid+ ReqRedir+\n")
    assert d.address == "00:1c.0" and d.redirect
