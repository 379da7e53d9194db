"""Parsers on real outputs (tests/fixtures/real, captured on an H200) and the documented public formats."""

from __future__ import annotations

from pathlib import Path

from provisioner.probes import parsers as p

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real"
PUB = Path(__file__).resolve().parents[1] / "fixtures" / "public"


def real(name: str) -> str:
    return (REAL / name).read_text()


def test_query_gpu_real_h200() -> None:
    gpus = p.parse_query_gpu(real("query-gpu-full.csv"))
    assert gpus == [p.GpuInfo(0, "NVIDIA H200", 143771, "580.159.04", "Enabled", "00000000:00:06.0")]
    # the 5-field form the reference documents
    g = p.parse_query_gpu(real("query-gpu.csv"), p.QUERY_GPU_FIELDS[:5])
    assert [(x.name, x.memory_mib, x.driver_version) for x in g] == [("NVIDIA H200", 143771, "580.159.04")]


def test_query_gpu_with_header_and_units() -> None:
    g = p.parse_query_gpu(real("query-gpu-header.csv"), p.QUERY_GPU_FIELDS[:5])
    assert len(g) == 1 and g[0].memory_mib == 143771


def test_query_csv_name_with_comma_and_garbage() -> None:
    rows = p.parse_query_csv("0, Weird, Name, 80\n\nnot a row\n", ["index", "name", "memory.total"])
    assert rows == [{"index": "0", "name": "Weird, Name", "memory.total": "80"}]
    assert p.parse_query_gpu("") == []


def test_ecc_query_real() -> None:
    f = "index,ecc.mode.current,ecc.errors.uncorrected.volatile.total,remapped_rows.pending,remapped_rows.failure"
    rows = p.parse_query_csv(real("query-ecc.csv"), f.split(","))
    assert rows == [{"index": "0", "ecc.mode.current": "Enabled", "ecc.errors.uncorrected.volatile.total": "0",
                     "remapped_rows.pending": "No", "remapped_rows.failure": "No"}]


def test_smi_q_real() -> None:
    q = p.parse_smi_q(real("smi-q.txt"))
    assert q["header"]["Driver Version"] == "580.159.04"
    assert q["header"]["Attached GPUs"] == "1"
    (g,) = q["gpus"]
    assert g["Product Name"] == "NVIDIA H200"
    assert p.dig(g, "Fabric", "State") == "N/A"  # no NVSwitch on this machine
    assert p.dig(g, "ECC Errors", "Volatile", "DRAM Uncorrectable") == "0"
    assert p.dig(g, "Remapped Rows", "Pending") == "No"
    assert p.dig(g, "Persistence Mode") == "Enabled"


def test_topo_real_single_gpu() -> None:
    t = p.parse_topo_m(real("topo-m.txt"))
    assert t.columns == ("GPU0",)
    assert t.link("GPU0", "GPU0") == "X"
    assert t.cpu_affinity == {"GPU0": "0-15"} and t.numa_affinity == {"GPU0": 0}
    assert t.nics == [] and t.nearest_nic("GPU0") == (None, None)


def test_topo_hgx_8gpu() -> None:
    t = p.parse_topo_m((PUB / "topo-m-hgx-h100-8gpu.txt").read_text())
    assert len(t.gpus) == 8 and len(t.nics) == 8
    assert t.link("GPU0", "GPU7") == "NV18"
    assert t.link("GPU5", "NIC5") == "PIX"
    assert t.numa_affinity["GPU6"] == 1 and t.cpu_affinity["GPU0"] == "0-55,112-167"
    assert t.nic_names["NIC3"] == "mlx5_3"
    assert t.nearest_nic("GPU3") == ("mlx5_3", "PIX")


def test_ibstat_public() -> None:
    ib = p.parse_ibstat((PUB / "ibstat.txt").read_text())
    assert set(ib) == {"mlx5_0", "mlx5_1", "mlx5_2"}
    assert ib["mlx5_0"][1].active and ib["mlx5_0"][1].link_up and ib["mlx5_0"][1].rate_gbps == 400
    assert not ib["mlx5_1"][1].active and ib["mlx5_1"][1].phys_state == "Disabled"
    assert ib["mlx5_2"][1].rate_gbps == 200 and ib["mlx5_2"][1].link_layer == "InfiniBand"


def test_ibstat_missing_real() -> None:
    assert p.parse_ibstat(real("ibstat.txt")) == {}  # the H200 machine has no ibstat and no HCA


def test_ibdev2netdev() -> None:
    d = p.parse_ibdev2netdev((PUB / "ibdev2netdev.txt").read_text())
    assert d["mlx5_0"] == {"port": 1, "netdev": "ibp24s0", "up": True}
    assert d["mlx5_1"]["up"] is False


def test_ib_sysfs_dump() -> None:
    dump = ("/sys/class/infiniband/mlx5_0/ports/1/state\t4: ACTIVE\n"
            "/sys/class/infiniband/mlx5_0/ports/1/phys_state\t5: LinkUp\n"
            "/sys/class/infiniband/mlx5_0/ports/1/rate\t400 Gb/sec (4X NDR)\n"
            "/sys/class/infiniband/mlx5_0/ports/1/link_layer\tInfiniBand\n"
            "/sys/class/infiniband/mlx5_1/ports/1/state\t1: DOWN\n"
            "/sys/class/infiniband/mlx5_1/ports/1/phys_state\t3: Disabled\n"
            "/sys/class/infiniband/mlx5_1/ports/1/rate\t200 Gb/sec (4X HDR)\n")
    ports = p.parse_ib_sysfs(p.parse_file_dump(dump))
    a, b = ports["mlx5_0"][1], ports["mlx5_1"][1]
    assert (a.state, a.phys_state, a.rate_gbps, a.active, a.link_up) == ("ACTIVE", "LinkUp", 400.0, True, True)
    assert (b.state, b.phys_state, b.rate_gbps, b.active) == ("DOWN", "Disabled", 200.0, False)


def test_nccl_ib_hca() -> None:
    assert p.parse_nccl_ib_hca("=mlx5_0:1,mlx5_1:1") == (True, False, [("mlx5_0", 1), ("mlx5_1", 1)])
    assert p.parse_nccl_ib_hca("mlx5") == (False, False, [("mlx5", None)])
    assert p.parse_nccl_ib_hca("^=mlx5_3") == (True, True, [("mlx5_3", None)])


def test_nvlink_status() -> None:
    assert p.parse_nvlink_status(real("nvlink-status.txt")) == {}  # single H200: nothing printed
    links = p.parse_nvlink_status((PUB / "nvlink-status-h100.txt").read_text())
    assert len(links) == 8 and all(len(v) == 18 for v in links.values())
    assert links[3][4] == "inactive" and links[0][0] == "26.562 GB/s"


def test_xids() -> None:
    assert p.parse_xids(real("dmesg.txt")) == []  # real log, NVRM lines but no XID
    xs = p.parse_xids((PUB / "kmsg-xid79.txt").read_text())
    assert [(x.pci, x.code, x.critical) for x in xs] == [("0000:18:00", 13, False), ("0000:9d:00", 79, True)]
    assert "fallen off the bus" in xs[1].detail


def test_os_release_and_df_real() -> None:
    o = p.parse_os_release(real("os-release.txt"))
    assert (o["ID"], o["VERSION_ID"], o["PRETTY_NAME"]) == ("ubuntu", "24.04", "Ubuntu 24.04.3 LTS")
    (d,) = p.parse_df(real("df-P-B1.txt"))
    assert (d.filesystem, d.mount, d.avail) == ("/dev/vda", "/", 68702048256)
    t = p.parse_df(real("df-PT.txt"))
    assert [(x.fstype, x.mount) for x in t][:2] == [("tmpfs", "/dev/shm"), ("ext4", "/")]


def test_parse_probe_sections() -> None:
    text = "\n".join([
        "@@pv@@ begin query-gpu", real("query-gpu-full.csv").rstrip(), "@@pv@@ end query-gpu 0",
        "@@pv@@ begin topo", real("topo-m.txt").rstrip(), "@@pv@@ end topo 0",
        "@@pv@@ begin ib-sysfs", "@@pv@@ end ib-sysfs 0",
        "@@pv@@ begin gpu-numa", "/sys/bus/pci/drivers/nvidia/0000:00:06.0/numa_node\t0", "@@pv@@ end gpu-numa 0",
        "@@pv@@ begin os-release", real("os-release.txt").rstrip(), "@@pv@@ end os-release 0",
        "@@pv@@ begin kernel", real("uname-r.txt").rstrip(), "@@pv@@ end kernel 0",
        "@@pv@@ begin df", real("df-P-B1.txt").rstrip(), "@@pv@@ end df 0",
    ])
    f = p.parse_probe(text, "/opt/models")
    assert [g.name for g in f.gpus] == ["NVIDIA H200"] and f.gpu_error is None
    assert f.kernel == "6.18.44-fc-v657-gpu" and f.os_release["ID"] == "ubuntu"
    assert f.disk is not None and f.disk.avail == 68702048256
    assert f.gpu_numa == {"0000:00:06.0": 0} and f.ib_ports == {}


def test_parse_probe_nvidia_smi_missing() -> None:
    text = "@@pv@@ begin query-gpu\nsh: 1: nvidia-smi: not found\n@@pv@@ end query-gpu 127\n"
    f = p.parse_probe(text)
    assert f.gpus == [] and "not found" in (f.gpu_error or "") and "127" in (f.gpu_error or "")


# ---------------------------------------------------------------------------------------------- preflight compare
def _hgx_facts(**over: object) -> p.NodeFacts:
    """An HGX H100 node as the probe would see it (public topo -m, sysfs dump, Ubuntu, plenty of disk)."""
    gpus = "\n".join(f"{i}, NVIDIA H100 80GB HBM3, 81559, 580.95.05, Enabled, 00000000:{b}:00.0"
                     for i, b in enumerate(["1B", "43", "52", "61", "9D", "C3", "D1", "DF"]))
    dump = []
    for i in range(8):
        base = f"/sys/class/infiniband/mlx5_{i}/ports/1"
        dump += [f"{base}/state\t4: ACTIVE", f"{base}/phys_state\t5: LinkUp", f"{base}/rate\t400 Gb/sec (4X NDR)"]
    f = p.NodeFacts(
        gpus=p.parse_query_gpu(gpus),
        topology=p.parse_topo_m((PUB / "topo-m-hgx-h100-8gpu.txt").read_text()),
        ib_ports=p.parse_ib_sysfs(p.parse_file_dump("\n".join(dump))),
        hca_numa={f"mlx5_{i}": 0 if i < 4 else 1 for i in range(8)},
        os_release=p.parse_os_release(real("os-release.txt")),
        kernel="6.8.0-45-generic",
        disk=p.DfEntry("/dev/nvme0n1p2", 4_000_000_000_000, 1_000_000_000_000, 3_000_000_000_000, "/"),
        disk_path="/opt/models",
    )
    for k, v in over.items():
        setattr(f, k, v)
    return f


def _fleet():
    from provisioner.inventory import load_fleet
    from provisioner import INVENTORIES

    return load_fleet(INVENTORIES / "rack-a.ini")


def test_compare_matching_hgx_node() -> None:
    from provisioner.probes.preflight import compare

    fleet = _fleet()
    assert compare(fleet, fleet.hosts["node01"], _hgx_facts()) == []


def test_compare_reports_expected_and_found() -> None:
    from provisioner.probes.preflight import compare

    fleet = _fleet()
    f = _hgx_facts()
    f.gpus = f.gpus[:7]
    f.ib_ports = dict(f.ib_ports)
    f.ib_ports["mlx5_3"] = {1: p.IbPort("mlx5_3", 1, "DOWN", "Disabled", 400.0)}
    f.ib_ports["mlx5_5"] = {1: p.IbPort("mlx5_5", 1, "ACTIVE", "LinkUp", 200.0)}
    del f.ib_ports["mlx5_7"]
    f.disk = p.DfEntry("/dev/sda", 100_000_000_000, 90_000_000_000, 10_000_000_000, "/")
    lines = [m.line() for m in compare(fleet, fleet.hosts["node01"], f) if m.severity == "error"]
    assert lines[:4] == [
        "gpu_count: expected 8, found 7",
        "ib_state: expected mlx5_3:1 ACTIVE/LinkUp, found DOWN/Disabled",
        "ib_rate: expected mlx5_5:1 400 Gb/s, found 200 Gb/s",
        "ib_hca: expected mlx5_7 present, found absent (found mlx5_0, mlx5_1, mlx5_2, mlx5_3, mlx5_4, mlx5_5, mlx5_6)",
    ]
    assert lines[4].startswith("disk: expected >= ") and lines[4].endswith("found 10 GB free on /")


def test_compare_wrong_model_and_numa() -> None:
    from provisioner.probes.preflight import compare

    fleet = _fleet()
    (h200,) = p.parse_query_gpu(real("query-gpu-full.csv"))
    f = _hgx_facts(gpus=[p.GpuInfo(i, h200.name, h200.memory_mib, h200.driver_version, "Enabled") for i in range(8)])
    f.hca_numa = {h: 0 for h in f.hca_numa}  # every HCA on socket 0: GPUs 4-7 have none nearby
    ms = {m.check: m for m in compare(fleet, fleet.hosts["node01"], f)}
    assert ms["gpu_model"].expected == "H100-SXM5-80GB ('NVIDIA H100 80GB HBM3')"
    assert ms["gpu_model"].found.startswith("'NVIDIA H200' on GPU")
    assert ms["numa_affinity"].found == "GPU 4,5,6,7 on NUMA 1 (HCAs on NUMA 0)"


def test_compare_unreachable_and_no_driver() -> None:
    from provisioner.probes.preflight import compare, report_from
    from provisioner.probes.ssh import ExecResult

    fleet = _fleet()
    r = report_from(fleet, fleet.hosts["node02"], ExecResult("node02", ok=False, error="connect timed out after 5s"))
    assert not r.ok and r.message == "unreachable: connect timed out after 5s"
    f = _hgx_facts(gpus=[], gpu_error="nvidia-smi: not found (rc 127)", smi_missing=True,
                   pci_gpus=[(f"0000:{b}:00.0", "0x2330") for b in ("1b", "43", "52", "61", "9d", "c3")])
    assert [m.line() for m in compare(fleet, fleet.hosts["node02"], f)] == [
        "gpu_count: expected 8, found 6 on the PCI bus (no driver)"]


def test_select_hosts_limit() -> None:
    from provisioner.probes.preflight import select_hosts

    fleet = _fleet()
    assert select_hosts(fleet, None) == ["node01", "node02", "node03", "node04"]
    assert select_hosts(fleet, "qwen2_72b") == ["node01", "node02"]
    assert select_hosts(fleet, "gpu_nodes,!node03") == ["node01", "node02", "node04"]
    assert select_hosts(fleet, "node0*:&qwen2_72b") == ["node01", "node02"]
    assert select_hosts(fleet, "nothing") == []


def test_ssh_args_from_inventory() -> None:
    from provisioner.probes.ssh import parse_ssh_args

    o = parse_ssh_args("-o UserKnownHostsFile=/r/kh -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes -i /r/id "
                       "-o ConnectTimeout=7 -p 2222")
    assert (o.known_hosts, o.identity, o.strict, o.connect_timeout, o.port) == (["/r/kh"], ["/r/id"], "yes", 7.0,
                                                                                 2222)
    assert parse_ssh_args("-o StrictHostKeyChecking=no").strict == "no"
    assert parse_ssh_args("-oStrictHostKeyChecking=off").strict == "no"
    assert parse_ssh_args("-o StrictHostKeyChecking=accept-new").strict == "accept-new"
    assert parse_ssh_args("-o StrictHostKeyChecking=bogus").strict == "yes"  # never a relaxation
    # UserKnownHostsFile=/dev/null replaces only the user's files: checking stays ON (issue 43), as in ssh(1)
    o = parse_ssh_args("-o StrictHostKeyChecking=yes -o UserKnownHostsFile=/dev/null")
    assert (o.strict, o.known_hosts, o.global_known_hosts) == ("yes", ["/dev/null"], None)
    assert parse_ssh_args("-o UserKnownHostsFile=/dev/null").strict is None  # unset: ssh's `ask`, refused here
    assert parse_ssh_args("-o UserKnownHostsFile='/a /b' -o UserKnownHostsFile=/c").known_hosts == ["/a", "/b"]
    assert parse_ssh_args("-o GlobalKnownHostsFile=none").global_known_hosts == []
    assert parse_ssh_args("-o 'unbalanced").known_hosts is None


# ---------------------------------------------------------------------------------------------- 2x H200, real probe
REAL2 = Path(__file__).resolve().parents[1] / "fixtures" / "real-2xh200"


def test_topo_and_nvlink_real_2xh200() -> None:
    t = p.parse_topo_m((REAL2 / "topo-m.txt").read_text())
    assert t.gpus == ["GPU0", "GPU1"] and t.link("GPU0", "GPU1") == "NV18" and t.link("GPU1", "GPU1") == "X"
    assert t.cpu_affinity == {"GPU0": "0-31", "GPU1": "0-31"} and t.numa_affinity == {"GPU0": 0, "GPU1": 0}
    links = p.parse_nvlink_status((REAL2 / "nvlink-status.txt").read_text())
    assert sorted(links) == [0, 1] and all(v == {i: "26.562 GB/s" for i in range(18)} for v in links.values())
    q = p.parse_smi_q((REAL2 / "smi-q.txt").read_text())
    assert [p.dig(g, "Fabric", "State") for g in q["gpus"]] == ["Completed", "Completed"]
    gpus = p.parse_query_gpu((REAL2 / "query-gpu-full.csv").read_text())
    assert [(g.index, g.name, g.memory_mib) for g in gpus] == [(0, "NVIDIA H200", 143771), (1, "NVIDIA H200", 143771)]


def test_real_probe_output() -> None:
    """The preflight snippet run as is on the H200 machine (tests/fixtures/real/capture2.sh)."""
    f = p.parse_probe(real("probe-output.txt"), "/opt/models")
    assert [(g.index, g.name, g.driver_version) for g in f.gpus] == [(0, "NVIDIA H200", "580.159.04")]
    assert f.pci_gpus == [("0000:00:06.0", "0x2335")] and p.PCI_GPU_NAMES["0x2335"] == "NVIDIA H200"
    assert f.gpu_numa == {"0000:00:06.0": None}  # the VM reports numa_node -1
    assert f.topology is not None and f.topology.gpus == ["GPU0"]
    assert f.ib_ports == {} and f.kernel == "6.18.44-fc-v657-gpu" and f.os_release["VERSION_ID"] == "24.04"
    assert f.disk is not None and f.disk.mount == "/" and f.disk.avail == 68699537408


def test_real_kmsg_records() -> None:
    text = real("kmsg-raw.txt")
    assert text.startswith("5,0,0,-;Linux version") and "NVRM: loading NVIDIA UNIX Open Kernel Module" in text
    assert p.parse_xids(text) == []
    # the same record format with an XID line appended parses to the XID (record format from the real capture)
    rec = "3,999,98120511,-;NVRM: Xid (PCI:0000:00:06): 79, pid=1930, name=python3, GPU has fallen off the bus."
    (x,) = p.parse_xids(text + rec + "\n")
    assert (x.pci, x.code, x.critical) == ("0000:00:06", 79, True)


def test_real_probe_output_2xh200() -> None:
    f = p.parse_probe((REAL2 / "probe-output.txt").read_text(), "/opt/models")
    assert [g.index for g in f.gpus] == [0, 1] and {g.name for g in f.gpus} == {"NVIDIA H200"}
    assert f.pci_gpus == [("0000:00:06.0", "0x2335"), ("0000:00:07.0", "0x2335")]
    assert f.topology is not None and f.topology.link("GPU0", "GPU1") == "NV18"
    res = {r["check"]: r for r in map(__import__("json").loads,
                                      (REAL2 / "node_health-final.jsonl").read_text().splitlines())}
    assert res["summary"]["status"] == "pass" and res["fabricmanager"]["status"] == "warn"
    assert res["allreduce"]["found"]["busbw_gbps"] == 347.02


def test_real_probe_output_2xh200_v3_lists_interfaces() -> None:
    """The probe as it is now (builtins only, /sys/class/net included), run under /bin/sh on the real 2x H200
    machine (tests/fixtures/real/capture3.sh): the interfaces parse, and NCCL's matching of the inventory's
    ens10f0np0 finds none of them while =eth0 finds eth0 (what node_health.py said there, same capture)."""
    f = p.parse_probe((REAL2 / "v3-probe-output.txt").read_text(), "/opt/models")
    assert f.net_ifaces == ["eth0", "ifb0", "ifb1", "lo"]
    assert [g.index for g in f.gpus] == [0, 1] and f.topology is not None
    assert p.select_interfaces("=ens10f0np0", f.net_ifaces)[0] == []
    assert p.select_interfaces("=eth0", f.net_ifaces)[0] == ["eth0"]
    good = (REAL2 / "v3-node_health-ifname-good.txt").read_text()
    bad = (REAL2 / "v3-node_health-ifname-missing.txt").read_text()
    assert "socket_ifname  PASS  NCCL_SOCKET_IFNAME==eth0: eth0 up" in good
    assert "socket_ifname  FAIL  NCCL_SOCKET_IFNAME==ens10f0np0 matches no interface" in bad
    assert (REAL2 / "v3-node_health-ifname-missing.txt.rc").read_text().strip() == "1"


# ------------------------------------------------------------- behaviours where node_health.py's own copy had drifted
def test_nccl_conf_first_occurrence_wins() -> None:
    """NCCL reads nccl.conf with setenv(key, value, 0): the first line of a key wins (node_health.py took the last)."""
    conf = "# managed\nNCCL_IB_HCA==mlx5_0:1\nNCCL_SOCKET_IFNAME==host0\n\nbroken line\nNCCL_SOCKET_IFNAME=eth\n"
    assert p.parse_nccl_conf(conf) == {"NCCL_IB_HCA": "=mlx5_0:1", "NCCL_SOCKET_IFNAME": "=host0"}
    assert p.parse_nccl_conf("") == {}


def test_smi_q_ansi_and_bus_id() -> None:
    """ANSI escapes are stripped; a GPU header is `GPU <domain:bus:dev.fn>` as on the H200 (`00000000:00:06.0`)."""
    text = ("\x1b[1mGPU 00000000:18:00.0\x1b[0m\n    Product Name   : NVIDIA H200\n"
            "    Fabric\n        State : Completed\n")
    (g,) = p.parse_smi_q(text)["gpus"]
    assert g["_bus_id"] == "00000000:18:00.0" and p.dig(g, "Fabric", "State") == "Completed"
    assert [x["_bus_id"] for x in p.parse_smi_q(real("smi-q.txt"))["gpus"]] == ["00000000:00:06.0"]
    assert p.parse_smi_q("GPU 0\n    Product Name : X\n")["gpus"] == []  # not a -q GPU header


def test_smi_q_repeated_section_merges() -> None:
    text = "GPU 00000000:18:00.0\n    Clocks\n        Graphics : 1 MHz\n    Clocks\n        SM : 2 MHz\n"
    (g,) = p.parse_smi_q(text)["gpus"]
    assert g["Clocks"] == {"Graphics": "1 MHz", "SM": "2 MHz"}


def test_query_csv_and_nvlink_strip_ansi() -> None:
    assert p.parse_query_csv("\x1b[0m0, NVIDIA H200\n", ["index", "name"]) == [{"index": "0", "name": "NVIDIA H200"}]
    nvlink = "\x1b[1mGPU 0: NVIDIA H200\x1b[0m\n\t Link 0: 26.562 GB/s\n"
    assert p.parse_nvlink_status(nvlink) == {0: {0: "26.562 GB/s"}}


def test_rate_never_raises() -> None:
    assert p.parse_rate("400 Gb/sec (4X NDR)") == 400.0 and p.parse_rate("2.5 Gb/sec (1X SDR)") == 2.5
    assert p.parse_rate("1.2.3") == 1.2 and p.parse_rate(".") is None and p.parse_rate(None) is None


def test_select_ib_hcas() -> None:
    present = ["mlx5_0", "mlx5_1", "mlx5_10", "mlx5_2"]
    assert p.select_ib_hcas("=mlx5_1:1,mlx5_9:1", present) == ([("mlx5_1", 1)], ["mlx5_9"])
    assert p.select_ib_hcas("mlx5_1", present) == ([("mlx5_1", None), ("mlx5_10", None)], [])  # a prefix
    assert p.select_ib_hcas("^mlx5_1", present) == ([("mlx5_0", None), ("mlx5_2", None)], [])
    assert p.select_ib_hcas("^=mlx5_1", present) == ([("mlx5_0", None), ("mlx5_10", None), ("mlx5_2", None)], [])
    assert p.select_ib_hcas("", present) == ([], [])


def test_fi_info_p5_counts_each_efa_device_once() -> None:
    doms = p.parse_fi_info((PUB / "fi-info-efa-p5.txt").read_text())
    assert len(doms) == 96 and doms[0] == p.FiDomain("efa", "efa-direct", "rdmap79s0-rdm", "FI_EP_RDM")
    devs = p.efa_devices(doms)
    assert len(devs) == 32 and devs[0] == "rdmap100s0" and "rdmap86s0" in devs and "rdmap87s0" not in devs
    assert p.efa_devices([d for d in doms if d.device != "rdmap80s0"]) == [x for x in devs if x != "rdmap80s0"]


def test_fi_info_without_a_device_and_other_providers() -> None:
    assert p.parse_fi_info((PUB / "fi-info-efa-none.txt").read_text()) == []
    tcp = "provider: tcp\n    fabric: 10.0.0.0/24\n    domain: ens5\n    type: FI_EP_MSG\n"
    assert p.efa_devices(p.parse_fi_info(tcp)) == []
    assert p.parse_fi_info("garbage\n  domain: x\n") == []


def test_imex_ctl_up() -> None:
    d = p.parse_imex_ctl((PUB / "imex-ctl-N-up.txt").read_text())
    assert d.state == "UP" and [n.address for n in d.nodes] == [f"10.50.0.{i}" for i in range(11, 15)]
    assert {n.status for n in d.nodes} == {"READY"} and d.nodes[0].version == "580.95.05"
    assert set(d.links) == {0, 1, 2, 3} and d.unconnected() == []


def test_imex_ctl_degraded_names_the_missing_tray() -> None:
    d = p.parse_imex_ctl((PUB / "imex-ctl-N-degraded.txt").read_text())
    assert d.state == "DEGRADED" and d.nodes[3] == p.ImexNode(3, "10.50.0.14", "UNAVAILABLE", "580.95.05")
    assert (0, 3, "N") in d.unconnected() and (3, 0, "I") in d.unconnected()
    down = p.parse_imex_ctl("IMEX daemon is not running (nvidia-imex.service)\nDomain State: DOWN\n")
    assert down.state == "DOWN" and down.nodes == () and down.links == {}
    assert p.parse_imex_ctl("") == p.ImexDomain(None, (), {})


def test_parse_probe_arch() -> None:
    f = p.parse_probe("@@pv@@ begin arch\naarch64\n@@pv@@ end arch 0\n")
    assert f.arch == "aarch64"
    assert p.parse_probe("@@pv@@ begin arch\nsh: uname: not found\n@@pv@@ end arch 127\n").arch is None


def _shape_fleet(shape: str):
    from provisioner import PROJECT_ROOT
    from provisioner.inventory import load_fleet

    return load_fleet(PROJECT_ROOT / "inventories" / shape / "hosts.ini")


def test_preflight_efa_devices_counted_from_sysfs() -> None:
    """A p5 node before the EFA installer: the kernel's efa driver shows rdmap* under /sys/class/infiniband."""
    from provisioner.probes.preflight import compare

    fleet = _shape_fleet("p5-pair")
    devs = [f"rdmap{b}s0" for r in (79, 96, 113, 130) for b in range(r, r + 8)]

    def facts(down: tuple[str, ...] = (), gone: tuple[str, ...] = ()) -> p.NodeFacts:
        dump = []
        for d in devs:
            if d in gone:
                continue
            base = f"/sys/class/infiniband/{d}/ports/1"
            dump += [f"{base}/state\t{'1: DOWN' if d in down else '4: ACTIVE'}", f"{base}/phys_state\t5: LinkUp",
                     f"{base}/rate\t100 Gb/sec (4X EDR)", f"{base}/link_layer\tUnspecified"]
        return _hgx_facts(ib_ports=p.parse_ib_sysfs(p.parse_file_dump("\n".join(dump))), hca_numa={}, arch="x86_64")

    assert compare(fleet, fleet.hosts["p5-a"], facts()) == []
    (m,) = compare(fleet, fleet.hosts["p5-a"], facts(down=("rdmap80s0",), gone=("rdmap81s0",)))
    assert m.check == "efa_devices" and m.expected == "32 EFA devices ACTIVE"
    assert m.found == "30 ACTIVE (rdmap80s0 not ACTIVE)"


def test_preflight_gb200_tray_must_be_aarch64() -> None:
    from provisioner.probes.preflight import compare

    fleet = _shape_fleet("gb200-nvl72")
    h = fleet.hosts["tray01"]
    gpus = "\n".join(f"{i}, NVIDIA GB200, 189471, 580.95.05, Enabled, 00000008:0{i}:00.0" for i in range(4))
    dump = [f"/sys/class/infiniband/mlx5_{i}/ports/1/{k}\t{v}" for i in range(4)
            for k, v in (("state", "4: ACTIVE"), ("phys_state", "5: LinkUp"), ("rate", "400 Gb/sec (4X NDR)"))]
    f = _hgx_facts(gpus=p.parse_query_gpu(gpus), topology=None, hca_numa={},
                   ib_ports=p.parse_ib_sysfs(p.parse_file_dump("\n".join(dump))), arch="aarch64",
                   net_ifaces=["lo", "enP6p3s0f0np0"])
    assert compare(fleet, h, f) == []
    f.arch = "x86_64"
    assert [(m.check, m.expected, m.found) for m in compare(fleet, h, f)] == [
        ("cpu_arch", "aarch64 (GB200-186GB)", "x86_64")]
