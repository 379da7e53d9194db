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
