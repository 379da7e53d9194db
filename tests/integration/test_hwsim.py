"""The hardware simulator: spec validation and faults, the materialized files, and the stand-in tools run as shipped.

The tools are laid out exactly as their packages install them (`repo.stage`) and run with the system python3
against a materialized spec directory (HWSIM_DIR), a private runtime dir (HWSIM_RUN_DIR) and a kernel-module marker
(HWSIM_MODULE_MARKER). Daemons they start are stopped by pid at teardown.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

from provisioner.errors import UsageError
from provisioner_testbed import hwsim, hwspec, repo

PY3 = shutil.which("python3", path="/usr/bin:/bin")
pytestmark = pytest.mark.skipif(PY3 is None, reason="the simulators run with the system /usr/bin/python3")


# --- spec ---------------------------------------------------------------------------------------------------------
def test_defaults_are_an_8x_h100_node_with_8_ndr_hcas() -> None:
    s = hwspec.resolve({})
    assert [g["name"] for g in s["gpus"]] == ["NVIDIA H100 80GB HBM3"] * 8
    assert [g["index"] for g in s["gpus"]] == list(range(8))
    assert len({g["uuid"] for g in s["gpus"]}) == 8
    assert [h["name"] for h in s["hcas"]] == [f"mlx5_{i}" for i in range(8)]
    assert all(h["ports"] == [{"port": 1, "state": "ACTIVE", "phys_state": "LinkUp", "rate": 400,
                               "link_layer": "InfiniBand", "lid": h["ports"][0]["lid"], "sm_lid": 1}]
               for h in s["hcas"])
    assert s["driver"] == {"version": "580.95.05", "kernel_module_version": "580.95.05", "cuda_version": "13.0"}
    assert hwspec.resolve({"node": "node01"})["gpus"][0]["uuid"] != s["gpus"][0]["uuid"]
    assert hwspec.resolve({"node": "node01"}) == hwspec.resolve({"node": "node01"})  # stable per node


@pytest.mark.parametrize(("spec", "message"), [
    ({"gpu_modell": "x"}, r"gpu_modell: unknown key"),
    ({"gpu_model": "A100"}, r"gpu_model: unknown model 'A100' \(known: H100-SXM5-80GB, H200-SXM-141GB, B200-SXM-180GB, GB200-186GB\)"),
    ({"gpu_count": "8"}, r"gpu_count: expected an integer, got '8'"),
    ({"faults": {"hca_dwn": "mlx5_3"}}, r"faults: unknown fault 'hca_dwn'"),
    ({"faults": {"hca_down": "mlx5_9"}}, r"faults.hca_down: unknown HCA 'mlx5_9' \(this node has mlx5_0, "),
    ({"faults": {"hca_rate": {"mlx5_2": 300}}}, r"faults.hca_rate.mlx5_2: 300 is not an InfiniBand rate"),
    ({"faults": {"xid": {"gpu": 8, "code": 79}}}, r"faults.xid\[0\]: no GPU 8 \(this node has 8 GPUs: 0..7\)"),
    ({"faults": {"xid": {"code": 79}}}, r"faults.xid\[0\]: expected \{gpu: N, code: XID\}"),
    ({"faults": {"ecc_uncorrectable": {"gpu": 1, "count": 0}}}, r"count: 0 is out of range"),
    ({"faults": {"missing_gpu": 9}}, r"faults.missing_gpu: 9 is out of range \(allowed 1..8\)"),
    ({"faults": {"fm_mismatch": "580.95.05"}}, r"is the installed driver's own version"),
    ({"cuda_version": 13.0}, r"cuda_version: expected a version such as '13.0' \(quote it in YAML\)"),
    ({"kernel_module_version": 580}, r"kernel_module_version: expected a version such as '580.82.07', got 580"),
    ({"kernel_module_version": "580.82.07", "faults": {"fm_mismatch": True}},
     r"kernel_module_version: set it or the fault fm_mismatch, not both"),
    ({"iommu": "on"}, r"iommu: unknown mode 'on' \(known: off, passthrough, translated\)"),
    ({"faults": {"acs_on": 8}}, r"faults.acs_on: 8 is out of range \(allowed 0..7\)"),
    ({"faults": {"acs_on": "0000:a0:00.0"}},
     r"faults.acs_on: no PCIe bridge with ACS at '0000:a0:00.0' \(this node has 0000:15:01.0, 0000:17:00.0, "),
    ({"faults": {"acs_on": "yes"}}, r"faults.acs_on: no PCIe bridge with ACS at 'yes'"),
    ({"faults": {"acs_on": [1.5]}}, r"faults.acs_on: expected true, a GPU index, a bridge address or a list"),
    ({"faults": {"acs_on": []}},
     r"faults.acs_on: expected true, a GPU index, a bridge address or a list of them, got \[\]"),
])
def test_invalid_specs_are_usage_errors_that_name_the_key(spec: dict, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        hwspec.resolve(spec)


def test_faults_change_only_what_they_name() -> None:
    s = hwspec.resolve({"faults": {
        "hca_down": "mlx5_3", "hca_rate": {"mlx5_2": 200}, "xid": {"gpu": 3, "code": 79},
        "ecc_uncorrectable": {"gpu": 1, "count": 2}, "row_remap_pending": {"gpu": 5}, "nvlink_down": {"gpu": 6},
        "fm_mismatch": True, "persistence_off": True}})
    hcas = {h["name"]: h["ports"][0] for h in s["hcas"]}
    assert (hcas["mlx5_3"]["state"], hcas["mlx5_3"]["phys_state"]) == ("DOWN", "Polling")
    assert hcas["mlx5_2"]["rate"] == 200 and hcas["mlx5_2"]["state"] == "ACTIVE"
    assert all(p["state"] == "ACTIVE" and p["rate"] == 400 for n, p in hcas.items() if n not in ("mlx5_2", "mlx5_3"))
    assert s["xids"] == [{"pci_bus_id": "00000000:61:00.0", "gpu": 3, "code": 79,
                          "text": "GPU has fallen off the bus."}]
    assert [g["ecc"]["volatile_uncorrected"] for g in s["gpus"]] == [0, 2, 0, 0, 0, 0, 0, 0]
    assert [g["remapped_rows"]["pending"] for g in s["gpus"]] == [False] * 5 + [True, False, False]
    assert [all(not lk["active"] for lk in g["nvlinks"]) for g in s["gpus"]] == [False] * 6 + [True, False]
    assert s["driver"]["kernel_module_version"] == "580.82.07" and s["driver"]["version"] == "580.95.05"
    assert s["persistence"]["forced_off"] is True


def test_missing_gpu_reindexes_what_is_left_in_pci_order() -> None:
    s = hwspec.resolve({"faults": {"missing_gpu": [2]}})
    assert [g["index"] for g in s["gpus"]] == list(range(7))
    assert "00000000:52:00.0" not in [g["pci_bus_id"] for g in s["gpus"]]
    assert s["gpus_missing"] == ["00000000:52:00.0"]
    assert len(hwspec.resolve({"faults": {"missing_gpu": 2}})["gpus"]) == 6


def test_rack_file_merges_defaults_and_host_faults(tmp_path: Path) -> None:
    f = tmp_path / "rack.yml"
    f.write_text("defaults:\n  gpu_model: H200-SXM-141GB\n  faults: {persistence_off: true}\n"
                 "hosts:\n  node02:\n    faults: {hca_down: mlx5_3}\n")
    doc = hwspec.load(f)
    n2 = hwspec.resolve(hwspec.for_host(doc, "node02"))
    n1 = hwspec.resolve(hwspec.for_host(doc, "node01"))
    assert n2["node"] == "node02" and n2["gpus"][0]["name"] == "NVIDIA H200"
    assert n2["hcas"][3]["ports"][0]["state"] == "DOWN" and n1["hcas"][3]["ports"][0]["state"] == "ACTIVE"
    assert n1["persistence"]["forced_off"] and n2["persistence"]["forced_off"]


# --- materialized files -------------------------------------------------------------------------------------------
def test_sysfs_tree_uses_the_kernels_formats(tmp_path: Path) -> None:
    hwsim.materialize({"faults": {"hca_down": "mlx5_3", "hca_rate": {"mlx5_2": 200}}}, tmp_path)
    ib = tmp_path / "sys/class/infiniband"
    assert sorted(p.name for p in ib.iterdir()) == [f"mlx5_{i}" for i in range(8)]
    port = ib / "mlx5_0/ports/1"
    assert [(port / f).read_text() for f in ("state", "phys_state", "rate", "link_layer")] == [
        "4: ACTIVE\n", "5: LinkUp\n", "400 Gb/sec (4X NDR)\n", "InfiniBand\n"]
    assert (ib / "mlx5_3/ports/1/state").read_text() == "1: DOWN\n"
    assert (ib / "mlx5_3/ports/1/phys_state").read_text() == "2: Polling\n"
    assert (ib / "mlx5_2/ports/1/rate").read_text() == "200 Gb/sec (4X HDR)\n"
    assert re.fullmatch(r"[0-9a-f]{4}(:[0-9a-f]{4}){3}\n", (ib / "mlx5_0/node_guid").read_text())
    assert (ib / "mlx5_0/device/net/ibp24s0/operstate").read_text() == "up\n"
    assert (tmp_path / "sys/module/nvidia/version").read_text() == "580.95.05\n"
    assert (tmp_path / "proc/driver/nvidia/version").read_text().startswith(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build")


def test_lspci_shows_a_pcie_switch_per_gpu_hca_pair_with_acs_off(tmp_path: Path) -> None:
    from provisioner.probes.nodeparse import acs_redirects, parse_lspci

    hwsim.materialize({}, tmp_path)
    fs = parse_lspci((tmp_path / "lspci").read_text())
    assert [f.address for f in fs if f.kind == "GPU"] == [f"0000:{b.lower()}:00.0" for b in hwspec._GPU_BUSES]
    assert [f.address for f in fs if f.kind == "HCA"] == [f"0000:{b.lower()}:00.0" for b in hwspec._NIC_BUSES]
    bridges = {f.address: f for f in fs if f.is_bridge}
    assert len(bridges) == 8 * 4  # root port, switch upstream port, 2 downstream ports per pair
    gpu0 = next(f for f in fs if f.address == "0000:1b:00.0")
    assert sorted(a for a, b in bridges.items() if b.covers(gpu0)) == ["0000:15:01.0", "0000:16:00.0", "0000:17:03.0"]
    assert sum(b.acs is not None for b in bridges.values()) == 24 and not any(b.redirect for b in bridges.values())
    assert acs_redirects(fs) == []
    assert (tmp_path / "proc/cmdline").read_text().endswith(" ro quiet\n")
    assert not (tmp_path / "sys/kernel").exists()  # iommu off: no groups


@pytest.mark.parametrize(("acs_on", "bridges"), [
    (True, 24),
    ([0], ["0000:17:03.0"]),
    ({"gpu": 7}, ["0000:db:03.0"]),
    ("0000:17:00.0", ["0000:17:00.0"]),
    (["15:01.0", 2], ["0000:15:01.0", "0000:4e:03.0"]),
])
def test_acs_on_turns_redirect_on_at_the_bridges_it_names(tmp_path: Path, acs_on: object, bridges: object) -> None:
    from provisioner.probes.nodeparse import parse_lspci

    hwsim.materialize({"faults": {"acs_on": acs_on}}, tmp_path)
    text = (tmp_path / "lspci").read_text()
    on = [f.address for f in parse_lspci(text) if f.redirect]
    assert (len(on) if isinstance(bridges, int) else on) == bridges
    assert "ACSCtl:\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-\n" in text


def test_acs_on_and_missing_gpu_a_failed_gpu_stays_on_the_bus(tmp_path: Path) -> None:
    from provisioner.probes.nodeparse import acs_redirects, parse_lspci

    hwsim.materialize({"faults": {"missing_gpu": [7], "acs_on": 7}}, tmp_path)
    (r,) = acs_redirects(parse_lspci((tmp_path / "lspci").read_text()))
    assert r.line() == "ACS redirect on at bridge 0000:db:03.0 above GPU 0000:df:00.0"


@pytest.mark.parametrize(("iommu", "args", "kind"), [("passthrough", " intel_iommu=on iommu=pt", "identity"),
                                                      ("translated", " intel_iommu=on", "DMA-FQ")])
def test_iommu_mode_files(tmp_path: Path, iommu: str, args: str, kind: str) -> None:
    hwsim.materialize({"iommu": iommu}, tmp_path)
    assert (tmp_path / "proc/cmdline").read_text().endswith(args + "\n")
    types = sorted((tmp_path / "sys/kernel/iommu_groups").glob("*/type"))
    assert len(types) == 48 and {t.read_text() for t in types} == {kind + "\n"}
    hwsim.materialize({}, tmp_path)  # back to off: the groups are pruned
    assert not (tmp_path / "sys/kernel/iommu_groups").exists()


def _preflight(tmp_path: Path, spec: dict) -> list:
    """Run the real preflight probe snippet with the hardware boundary at a materialized spec; compare as node01."""
    from provisioner import INVENTORIES
    from provisioner.inventory import load_fleet
    from provisioner.probes import parsers, preflight

    hwsim.materialize(spec, tmp_path / "hwsim")
    script = preflight.probe_script(str(tmp_path / "models"), hwsim_dir=str(tmp_path / "hwsim"))
    r = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, timeout=60)
    facts = parsers.parse_probe(r.stdout)
    fleet = load_fleet(INVENTORIES / "rack-a.ini")
    return [m for m in preflight.compare(fleet, fleet.hosts["node01"], facts) if m.check in ("acs", "iommu")]


def test_preflight_catches_acs_on_naming_the_bridge_and_passes_without_it(tmp_path: Path) -> None:
    assert _preflight(tmp_path, {"iommu": "passthrough"}) == []
    (m,) = _preflight(tmp_path, {"faults": {"acs_on": [0]}})
    assert m.severity == "error"
    assert m.line().startswith("acs: expected ACS redirect off on the PCIe bridges above GPUs and HCAs (GPUDirect "
                               "P2P/RDMA), found ACS redirect on at bridge 0000:17:03.0 above GPU 0000:1b:00.0 (fix: "
                               "disable PCIe ACS in the BIOS")
    (m,) = _preflight(tmp_path, {"faults": {"acs_on": "0000:3f:00.0"}})
    assert "bridge 0000:3f:00.0 above HCA 0000:40:00.0 (" in m.found
    (acs, iommu) = _preflight(tmp_path, {"iommu": "translated", "faults": {"acs_on": True}})
    assert acs.found.count("ACS redirect on at bridge") == 4 and "and 20 more bridge(s)" in acs.found
    assert (iommu.check, iommu.severity, iommu.found) == ("iommu", "warning", "translated (iommu_groups type DMA-FQ)")


def test_kernel_module_version_is_the_loaded_module_not_the_installed_driver(tmp_path: Path) -> None:
    """A node that installed 580.95.05 and still runs the 580.82.07 module (no reboot yet): every file the loaded
    module answers through says 580.82.07; the spec keeps the installed driver."""
    s = hwspec.resolve({"kernel_module_version": "580.82.07"})
    assert s["driver"] == {"version": "580.95.05", "kernel_module_version": "580.82.07", "cuda_version": "13.0"}
    assert hwspec.resolve({})["driver"]["kernel_module_version"] == "580.95.05"  # default: the installed driver
    hwsim.materialize({"kernel_module_version": "580.82.07"}, tmp_path)
    assert (tmp_path / "sys/module/nvidia/version").read_text() == "580.82.07\n"
    assert (tmp_path / "proc/driver/nvidia/version").read_text().startswith(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.82.07  Release Build")
    assert "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.82.07" in (tmp_path / "kmsg").read_text()
    hwsim.materialize({}, tmp_path)  # the reboot: the loaded module is the installed one again
    assert (tmp_path / "sys/module/nvidia/version").read_text() == "580.95.05\n"


def test_kmsg_carries_nvrm_xid_lines_in_the_real_format(tmp_path: Path) -> None:
    hwsim.materialize({"faults": {"xid": [{"gpu": 3, "code": 79}, {"gpu": 0, "code": 48}]}}, tmp_path)
    kmsg = (tmp_path / "kmsg").read_text().splitlines()
    assert all(re.fullmatch(r"\d,\d+,\d+,-;.+", line) for line in kmsg)
    xids = [line.split(";", 1)[1] for line in kmsg if "Xid" in line]
    assert xids[0] == "NVRM: Xid (PCI:0000:61:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    assert xids[1].startswith("NVRM: Xid (PCI:0000:1b:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable")
    # What a health check greps for (`dmesg | grep -E 'NVRM: Xid'`) finds the codes in dmesg's format too.
    dmesg = (tmp_path / "dmesg").read_text()
    assert re.findall(r"^\[\s*\d+\.\d{6}\] NVRM: Xid \(PCI:[0-9a-f:]+\): (\d+),", dmesg, re.M) == ["79", "48"]


def test_rewrite_is_in_place_idempotent_and_prunes_what_is_gone(tmp_path: Path) -> None:
    hwsim.materialize({}, tmp_path)
    inode = tmp_path.stat().st_ino
    state = tmp_path / "sys/class/infiniband/mlx5_3/ports/1/state"
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()}
    hwsim.materialize({}, tmp_path)  # same spec: nothing rewritten
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()} == before
    with state.open() as held:  # a reader holding the old file keeps a consistent old view
        hwsim.materialize({"faults": {"hca_down": "mlx5_3"}}, tmp_path)
        assert held.read() == "4: ACTIVE\n"
    assert state.read_text() == "1: DOWN\n" and tmp_path.stat().st_ino == inode
    hwsim.materialize({"hcas": 4}, tmp_path)
    assert sorted(p.name for p in (tmp_path / "sys/class/infiniband").iterdir()) == [f"mlx5_{i}" for i in range(4)]
    assert not list(tmp_path.rglob(".*"))  # no temp files left behind
    spec = json.loads((tmp_path / "spec.json").read_text())
    assert spec["schema"] == "hwsim/1" and spec["input"] == {"hcas": 4}
    hwsim.materialize(spec, tmp_path)  # a resolved spec re-materializes to itself (faults not applied twice)
    assert json.loads((tmp_path / "spec.json").read_text()) == spec


def test_invalid_spec_leaves_the_directory_untouched(tmp_path: Path) -> None:
    hwsim.materialize({}, tmp_path)
    before = (tmp_path / "spec.json").read_text()
    with pytest.raises(hwspec.HwSpecError):
        hwsim.materialize({"faults": {"hca_down": "mlx5_42"}}, tmp_path)
    assert (tmp_path / "spec.json").read_text() == before


# --- the tools, as packaged ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tools(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Roots with each package's files laid out as installed (a root per Fabric Manager version)."""
    base = tmp_path_factory.mktemp("pkgs")
    roots: dict[str, Path] = {}
    for pkg in repo.load_manifest():
        if pkg.runtime:
            key = pkg.name if pkg.name != "nvidia-fabricmanager-580" else f"fm-{pkg.upstream}"
            roots[key] = repo.stage(pkg, base / key)
    return roots


class Node:
    """One simulated node: spec dir + runtime dir + module marker, and the tools run against them."""

    def __init__(self, tmp: Path, tools: dict[str, Path]) -> None:
        self.dir, self.run_dir, self.tools = tmp / "hwsim", tmp / "run", tools
        marker = tmp / "nvidia.ko"
        marker.write_text("marker\n")
        self.env = {**os.environ, "HWSIM_DIR": str(self.dir), "HWSIM_RUN_DIR": str(self.run_dir),
                    "HWSIM_MODULE_MARKER": str(marker)}
        self.pidfiles: list[Path] = []

    def spec(self, spec: dict) -> "Node":
        hwsim.materialize(spec, self.dir)
        return self

    def run(self, pkg: str, prog: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        exe = self.tools[pkg] / "usr/bin" / prog
        return subprocess.run([PY3, str(exe), *args], capture_output=True, text=True, env={**self.env, **env},
                              timeout=30)

    def smi(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run("nvidia-utils-580", "nvidia-smi", *args)

    def query(self, fields: str) -> list[list[str]]:
        res = self.smi(f"--query-gpu={fields}", "--format=csv,noheader,nounits")
        assert res.returncode == 0, res.stdout + res.stderr
        return [line.split(", ") for line in res.stdout.splitlines()]

    def stop_all(self) -> None:
        for pf in self.pidfiles:
            try:
                os.kill(int(pf.read_text()), signal.SIGTERM)  # daemons this test started, by pid
            except (OSError, ValueError):
                pass


@pytest.fixture
def node(tmp_path: Path, tools: dict[str, Path]) -> Iterator[Node]:
    n = Node(tmp_path, tools)
    n.pidfiles = [n.run_dir / "nvidia-persistenced/nvidia-persistenced.pid",
                  n.run_dir / "nvidia-fabricmanager/nv-fabricmanager.pid", n.run_dir / "nvhostengine.pid"]
    yield n
    n.stop_all()


def wait_gone(pid: int) -> None:
    for _ in range(100):
        if not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]:
            return
        time.sleep(0.05)
    raise AssertionError(f"pid {pid} still running")


def test_query_gpu_csv_forms(node: Node) -> None:
    node.spec({"faults": {"ecc_uncorrectable": {"gpu": 1, "count": 2}, "row_remap_pending": {"gpu": 0}}})
    res = node.smi("--query-gpu=index,name,memory.total,driver_version,persistence_mode,power.draw",
                   "--format=csv")
    lines = res.stdout.splitlines()
    assert lines[0] == "index, name, memory.total [MiB], driver_version, persistence_mode, power.draw [W]"
    assert re.fullmatch(r"0, NVIDIA H100 80GB HBM3, 81559 MiB, 580\.95\.05, Disabled, \d+\.\d\d W", lines[1])
    assert len(lines) == 9
    rows = node.query("index,uuid,pci.bus_id,ecc.errors.uncorrected.volatile.total,"
                      "ecc.errors.uncorrected.aggregate.total,remapped_rows.pending,retired_pages.pending,"
                      "memory.used,temperature.gpu,clocks.sm,pstate")
    assert rows[0][2] == "00000000:1B:00.0" and rows[0][1].startswith("GPU-")
    assert [r[3] for r in rows] == ["0", "2"] + ["0"] * 6 and rows[1][4] == "2"
    assert [r[5] for r in rows] == ["Yes"] + ["No"] * 7
    assert rows[0][6] == "[N/A]" and rows[0][7] == "0" and rows[0][10] == "P0"
    bad = node.smi("--query-gpu=index,bogus", "--format=csv")
    assert bad.returncode == 2 and 'Field "bogus" is not a valid field to query.' in bad.stdout
    one = node.smi("--query-gpu=index,name", "--format=csv,noheader", "-i", "3")
    assert one.stdout == "3, NVIDIA H100 80GB HBM3\n"


def test_topo_matrix_is_an_nvswitch_hgx_with_rail_nics(node: Node) -> None:
    out = node.spec({}).smi("topo", "-m").stdout
    lines = out.splitlines()
    header = re.sub(r"\x1b\[[0-9;]*m", "", lines[0]).split("\t")
    assert header[1:] == [f"GPU{i}" for i in range(8)] + [f"NIC{i}" for i in range(8)] + [
        "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]
    gpu0 = lines[1].split("\t")
    assert gpu0[:10] == ["GPU0", " X "] + ["NV18"] * 7 + ["PIX"]
    assert gpu0[10:17] == ["NODE"] * 3 + ["SYS"] * 4 and gpu0[17:] == ["0-55,112-167", "0", "", "N/A"]
    assert lines[9].split("\t")[:2] == ["NIC0", "PIX"]
    assert "NIC Legend:" in out and "  NIC3: mlx5_3" in lines and out.endswith("  NIC7: mlx5_7\n\n")
    down = node.spec({"faults": {"nvlink_down": {"gpu": 2}}}).smi("topo", "-m").stdout.splitlines()
    assert down[1].split("\t")[3] == "NODE" and down[1].split("\t")[2] == "NV18"


def test_q_nvlink_and_list(node: Node) -> None:
    node.spec({"faults": {"nvlink_down": {"gpu": 1}, "ecc_uncorrectable": {"gpu": 1, "count": 3}}})
    q = node.smi("-q").stdout
    assert re.search(r"^Driver Version {41}: 580\.95\.05$", q, re.M)
    assert re.search(r"^CUDA Version\s+: 13\.0$", q, re.M) and re.search(r"^Attached GPUs\s+: 8$", q, re.M)
    assert len(re.findall(r"^    Product Name {39}: NVIDIA H100 80GB HBM3$", q, re.M)) == 8
    assert "GPU 00000000:1B:00.0\n    Product Name" in q
    assert re.search(r"    Fabric\n        State\s+: Not Started\n        Status\s+: N/A", q)
    assert re.search(r"Remapped Rows\n        Correctable Error\s+: 0\n.*\n        Uncorrectable Error\s+: 0\n"
                     r".*\n        Pending\s+: No", q)
    q1 = node.smi("-q", "-i", "1").stdout
    assert q1.count("Product Name") == 1 and re.search(r"Volatile\n(.*\n){4}\s+DRAM Uncorrectable\s+: 3", q1)
    nv = node.smi("nvlink", "--status").stdout.splitlines()
    assert nv[0].startswith("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-")
    assert nv[1:19] == [f"         Link {i}: 26.562 GB/s" for i in range(18)]
    assert nv[20:38] == [f"         Link {i}: <inactive>" for i in range(18)]
    listing = node.smi("-L").stdout.splitlines()
    assert len(listing) == 8 and re.fullmatch(r"GPU 7: NVIDIA H100 80GB HBM3 \(UUID: GPU-[0-9a-f-]{36}\)", listing[7])
    assert "| NVIDIA-SMI 580.95.05" in node.smi().stdout


def test_no_spec_or_no_module_means_no_driver(node: Node, tmp_path: Path) -> None:
    res = node.smi("-L")  # nothing materialized
    assert res.returncode == 9 and res.stdout.startswith("NVIDIA-SMI has failed because it couldn't communicate")
    node.spec({})
    res = node.run("nvidia-utils-580", "nvidia-smi", "-L", HWSIM_MODULE_MARKER=str(tmp_path / "absent"))
    assert res.returncode == 9


def test_missing_gpu_and_h200(node: Node) -> None:
    assert len(node.spec({"faults": {"missing_gpu": 1}}).query("index")) == 7
    assert node.spec({"gpu_model": "H200-SXM-141GB", "gpu_count": 2}).query("name,memory.total") == [
        ["NVIDIA H200", "143771"]] * 2


def test_persistenced_keeps_persistence_on_while_it_runs(node: Node) -> None:
    node.spec({})
    assert {r[0] for r in node.query("persistence_mode")} == {"Disabled"}
    start = node.run("nvidia-persistenced", "nvidia-persistenced", "--verbose")
    assert start.returncode == 0, start.stderr
    assert {r[0] for r in node.query("persistence_mode")} == {"Enabled"}
    again = node.run("nvidia-persistenced", "nvidia-persistenced")
    assert again.returncode == 1 and "failed to initialize" in again.stderr
    pidfile = node.run_dir / "nvidia-persistenced/nvidia-persistenced.pid"
    pid = int(pidfile.read_text())  # read once: the daemon removes its pid file when it gets the signal
    os.kill(pid, signal.SIGTERM)
    wait_gone(pid)
    assert {r[0] for r in node.query("persistence_mode")} == {"Disabled"}
    node.run("nvidia-persistenced", "nvidia-persistenced", "--no-persistence-mode")
    assert {r[0] for r in node.query("persistence_mode")} == {"Disabled"}


def test_persistence_off_fault_wins_over_the_daemon(node: Node) -> None:
    node.spec({"faults": {"persistence_off": True}})
    assert node.run("nvidia-persistenced", "nvidia-persistenced").returncode == 0
    assert {r[0] for r in node.query("persistence_mode")} == {"Disabled"}
    if os.geteuid() == 0:
        pm = node.smi("-pm", "1")
        assert pm.returncode != 0 and "Unable to set persistence mode for GPU 00000000:1B:00.0" in pm.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="nvidia-smi -pm needs root, like the real one")
def test_pm_1_enables_legacy_persistence(node: Node) -> None:
    node.spec({})
    res = node.smi("-pm", "1", "-i", "0")
    assert res.stdout == "Enabled Legacy persistence mode for GPU 00000000:1B:00.0.\nAll done.\n"
    assert [r[0] for r in node.query("persistence_mode")][:2] == ["Enabled", "Disabled"]
    assert node.smi("-pm", "1", "-i", "0").stdout.startswith("Persistence mode is already Enabled")


@pytest.mark.skipif(os.geteuid() != 0, reason="nvidia-smi -r needs root, like the real one")
def test_gpu_reset_answers_as_r580_and_a_fault_stays(node: Node) -> None:
    # the R580 tool without -i resets every GPU ("GPU 00000000:00:06.0 was successfully reset." / "All done.",
    # checked on an H200 with 580.159.04); the simulated fault is the rack's to clear, not the reset's
    node.spec({"gpu_count": 2, "faults": {"row_remap_pending": 1}})
    res = node.smi("--gpu-reset")
    assert res.returncode == 0 and res.stdout == (
        "GPU 00000000:1B:00.0 was successfully reset.\nGPU 00000000:43:00.0 was successfully reset.\nAll done.\n"), res
    assert node.smi("-r", "-i", "1").stdout.splitlines() == ["GPU 00000000:43:00.0 was successfully reset.", "All done."]
    assert node.query("remapped_rows.pending") == [["No"], ["Yes"]]


def fm_cfg(node: Node) -> Path:
    cfg = node.run_dir.parent / "fabricmanager.cfg"
    src = node.tools["fm-580.95.05"] / "usr/share/nvidia/nvswitch/fabricmanager.cfg"
    cfg.write_text(src.read_text().replace("/var/log/fabricmanager.log", str(node.run_dir.parent / "fm.log")))
    return cfg


def test_fabric_manager_registers_the_gpus_while_it_runs(node: Node) -> None:
    node.spec({})
    res = node.run("fm-580.95.05", "nv-fabricmanager", "-c", str(fm_cfg(node)))
    assert res.returncode == 0, res.stderr
    assert node.query("fabric.state,fabric.status") == [["Completed", "Success"]] * 8
    assert re.search(r"Fabric\n        State\s+: Completed\n        Status\s+: Success", node.smi("-q").stdout)
    assert node.run("fm-580.95.05", "nv-fabricmanager", "-v").stdout == "Fabric Manager version is : 580.95.05\n"
    pidfile = node.run_dir / "nvidia-fabricmanager/nv-fabricmanager.pid"
    pid = int(pidfile.read_text())  # read once: the daemon removes its pid file when it gets the signal
    os.kill(pid, signal.SIGTERM)
    wait_gone(pid)
    assert node.query("fabric.state") == [["Not Started"]] * 8


@pytest.mark.parametrize(("spec", "fm", "driver"), [
    ({"faults": {"fm_mismatch": True}}, "fm-580.95.05", "580.82.07"),  # loaded driver differs from installed FM
    ({"kernel_module_version": "580.82.07"}, "fm-580.95.05", "580.82.07"),  # the same, as a spec field
    ({}, "fm-580.82.07", "580.95.05"),  # the older FM package installed next to the pinned driver
])
def test_fabric_manager_refuses_a_driver_of_another_version(node: Node, spec: dict, fm: str, driver: str) -> None:
    node.spec(spec)
    res = node.run(fm, "nv-fabricmanager", "-c", str(fm_cfg(node)))
    mine = "580.95.05" if fm == "fm-580.95.05" else "580.82.07"
    assert res.returncode == 1
    assert (f"fabric manager NVIDIA GPU driver interface version {mine} don't match with driver version {driver}"
            in res.stderr)
    assert f"don't match with driver version {driver}" in (node.run_dir.parent / "fm.log").read_text()
    assert node.query("driver_version,fabric.state") == [[driver, "Not Started"]] * 8


def test_dcgmi_needs_the_host_engine_and_diagnoses_the_spec(node: Node) -> None:
    node.spec({"faults": {"ecc_uncorrectable": {"gpu": 1, "count": 2}}})
    no = node.run("datacenter-gpu-manager-4-core", "dcgmi", "discovery", "-l")
    assert no.returncode != 0 and "Unable to connect to host engine" in no.stdout
    assert node.run("datacenter-gpu-manager-4-core", "nv-hostengine").returncode == 0
    assert node.run("nvidia-persistenced", "nvidia-persistenced").returncode == 0
    disc = node.run("datacenter-gpu-manager-4-core", "dcgmi", "discovery", "-l").stdout
    assert disc.startswith("8 GPUs found.\n") and "| 0      | Name: NVIDIA H100 80GB HBM3" in disc
    diag = node.run("datacenter-gpu-manager-4-core", "dcgmi", "diag", "-r", "1")
    assert diag.returncode != 0
    assert re.search(r"\| software\s+\| Fail", diag.stdout) and re.search(r"\|\s+\| GPU1: Fail", diag.stdout)
    assert re.search(r"\|\s+\| GPU0: Pass", diag.stdout)
    node.spec({})
    assert node.run("datacenter-gpu-manager-4-core", "dcgmi", "diag", "-r", "1").returncode == 0


# --- fidelity: the stand-in against outputs captured from a real R580 nvidia-smi (tests/fixtures/real) ---------
REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real"


def _skeleton(text: str) -> list[str]:
    """Keys, indentation and column of the colon; values (and the GPU's bus id) dropped."""
    return [line.split(" : ")[0] if " : " in line else re.sub(r"^GPU \S+$", "GPU", line)
            for line in text.splitlines()]


@pytest.mark.skipif(not (REAL / "smi-q.txt").is_file(), reason="no real captures")
def test_outputs_have_the_real_tools_layout(node: Node) -> None:
    node.spec({"gpu_model": "H200-SXM-141GB", "gpu_count": 1, "hcas": 0})
    assert _skeleton(node.smi("-q").stdout) == _skeleton((REAL / "smi-q.txt").read_text())
    ecc = node.smi("-q", "-d", "ECC,ROW_REMAPPER,PAGE_RETIREMENT").stdout
    assert _skeleton(ecc) == _skeleton((REAL / "smi-q-ecc.txt").read_text())
    topo = node.smi("topo", "-m").stdout.replace("0-55,112-167", "0-15")
    assert topo == (REAL / "topo-m.txt").read_text()
    header = node.smi("--query-gpu=index,name,memory.total,driver_version,persistence_mode", "--format=csv").stdout
    assert header.splitlines()[0] == (REAL / "query-gpu-header.csv").read_text().splitlines()[0]
    assert header.splitlines()[1].split(", ")[:3] == ["0", "NVIDIA H200", "143771 MiB"]
    real_table, table = (REAL / "nvidia-smi.txt").read_text().splitlines(), node.smi().stdout.splitlines()
    assert [len(x) for x in table] == [len(x) for x in real_table]
    assert table[4:8] == real_table[4:8] and table[11:] == real_table[11:]
    assert re.fullmatch(r"GPU 0: NVIDIA H200 \(UUID: GPU-[0-9a-f-]{36}\)\n", node.smi("-L").stdout)


@pytest.mark.skipif(not (REAL / "help-query-gpu.txt").is_file(), reason="no real captures")
def test_every_query_field_exists_in_the_real_tool(node: Node) -> None:
    real = set(re.findall(r'"([a-zA-Z0-9_.]+)"', (REAL / "help-query-gpu.txt").read_text()))
    exe = node.tools["nvidia-utils-580"] / "usr/bin/nvidia-smi"
    ours = re.findall(r'^    "([a-z0-9_.]+)": [("]', exe.read_text(), re.M)
    assert ours and [f for f in ours if f not in real] == []


# --- beyond HGX H100 + InfiniBand: EFA, B200 + NVLSM, GB200 + IMEX ---------------------------------------------------
def test_efa_devices_in_sysfs_and_the_efa_missing_fault(tmp_path: Path) -> None:
    spec = hwspec.resolve({"hcas": 0, "efa": 32, "faults": {"efa_missing": 2}})
    assert spec["hcas"] == [] and len(spec["efa"]) == 30
    assert [d["name"] for d in spec["efa"][:2]] == ["rdmap79s0", "rdmap80s0"]
    hwsim.materialize({"hcas": 0, "efa": ["rdmap79s0", "rdmap80s0"]}, tmp_path)
    port = tmp_path / "sys/class/infiniband/rdmap80s0/ports/1"
    assert (port / "state").read_text() == "4: ACTIVE\n"
    assert (port / "link_layer").read_text() == "Unspecified\n"
    assert (port / "rate").read_text() == "100 Gb/sec (4X EDR)\n"
    assert "DRIVER=efa" in (tmp_path / "sys/class/infiniband/rdmap80s0/device/uevent").read_text()
    hwsim.materialize({"hcas": 0, "efa": ["rdmap79s0", "rdmap80s0"], "faults": {"efa_missing": "rdmap80s0"}},
                      tmp_path)
    assert sorted(p.name for p in (tmp_path / "sys/class/infiniband").iterdir()) == ["rdmap79s0"]


@pytest.mark.parametrize(("spec", "message"), [
    ({"faults": {"efa_missing": 1}}, "no EFA devices"),
    ({"efa": 2, "faults": {"efa_missing": "rdmap1s0"}}, "unknown EFA device 'rdmap1s0'"),
    ({"faults": {"nvlsm_fail": True}}, "H100-SXM5-80GB has no NVLSM"),
    ({"gpu_model": "B200-SXM-180GB", "faults": {"imex_degraded": True}}, "runs no IMEX"),
    ({"efa": ["mlx5_0"]}, "efa: expected a count or a list of EFA device names"),
])
def test_new_faults_on_the_wrong_shape_are_usage_errors(spec: dict, message: str) -> None:
    with pytest.raises(hwspec.HwSpecError, match=re.escape(message)):
        hwspec.resolve(spec)


def test_gb200_tray_defaults_to_4_gpus_and_imex_degraded_downs_its_nvlinks() -> None:
    spec = hwspec.resolve({"gpu_model": "GB200-186GB", "faults": {"imex_degraded": True}})
    assert len(spec["gpus"]) == 4 and spec["imex"] and spec["imex_fail"] and spec["cpu_arch"] == "aarch64"
    assert not any(link["active"] for g in spec["gpus"] for link in g["nvlinks"])


@pytest.fixture(scope="module")
def efa_tools(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pkg = next(p for p in repo.efa_installer()[2] if p.name == "libfabric1-aws")
    return repo.stage(pkg, tmp_path_factory.mktemp("efa") / "libfabric")


def test_fi_info_lists_the_efa_devices_like_fi_info_p_efa(node: Node, efa_tools: Path) -> None:
    node.spec({"hcas": 0, "efa": 2})
    exe = efa_tools / "opt/amazon/efa/bin/fi_info"
    res = subprocess.run([PY3, str(exe), "-p", "efa"], capture_output=True, text=True, env=node.env, timeout=30)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("provider: efa\n    fabric: efa\n    domain: rdmap79s0-rdm\n    version: 122.0\n"
                                 "    type: FI_EP_RDM\n    protocol: FI_PROTO_EFA\n")
    assert res.stdout.count("provider: efa") == 4 and "domain: rdmap80s0-dgrm" in res.stdout
    rdm = subprocess.run([PY3, str(exe), "-p", "efa", "-t", "FI_EP_RDM"], capture_output=True, text=True,
                         env=node.env, timeout=30)
    assert rdm.stdout.count("provider: efa") == 2
    node.spec({"hcas": 0, "efa": 2, "faults": {"efa_missing": 2}})
    none = subprocess.run([PY3, str(exe), "-p", "efa"], capture_output=True, text=True, env=node.env, timeout=30)
    assert none.returncode == 1 and none.stdout == "fi_getinfo: -61 (No data available)\n"


def _nvlsm(node: Node, *args: str) -> subprocess.CompletedProcess[str]:
    exe = node.tools["nvlsm"] / "usr/sbin/nvlsm"
    return subprocess.run([PY3, str(exe), *args], capture_output=True, text=True, timeout=30,
                          env={**node.env, "NVLSM_LOG": str(node.run_dir.parent / "nvlsm.log")})


def test_b200_fabric_stays_in_progress_until_nvlsm_runs(node: Node) -> None:
    node.pidfiles.append(node.run_dir / "nvlsm/nvlsm.pid")
    node.spec({"gpu_model": "B200-SXM-180GB"})
    assert node.query("name,memory.total")[0] == ["NVIDIA B200", "183359"]
    assert node.run("fm-580.95.05", "nv-fabricmanager", "-c", str(fm_cfg(node))).returncode == 0
    assert node.query("fabric.state") == [["In Progress"]] * 8  # FM alone: NV_WARN_NOTHING_TO_DO
    res = _nvlsm(node, "-B")
    assert res.returncode == 0, res.stderr
    assert node.query("fabric.state,fabric.status") == [["Completed", "Success"]] * 8
    pid = int((node.run_dir / "nvlsm/nvlsm.pid").read_text())
    node.spec({"gpu_model": "B200-SXM-180GB", "faults": {"nvlsm_fail": True}})  # live: the daemon notices
    wait_gone_s(pid, 10)
    assert node.query("fabric.state") == [["In Progress"]] * 8
    again = _nvlsm(node, "-B")
    assert again.returncode == 1 and "cannot open umad port" in again.stderr


def wait_gone_s(pid: int, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]:
            return
        time.sleep(0.1)
    raise AssertionError(f"pid {pid} still running after {seconds} s")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_imex_joins_its_domain_creates_channel0_and_leaves_on_imex_degraded(node: Node, tmp_path: Path) -> None:
    node.pidfiles.append(node.run_dir / "nvidia-imex/nvidia-imex.pid")
    node.spec({"gpu_model": "GB200-186GB"})
    etc = tmp_path / "etc"
    (etc / "modprobe.d").mkdir(parents=True)
    (etc / "modprobe.d/nvidia-imex-channel.conf").write_text("options nvidia NVreg_CreateImexChannel0=1\n")
    (etc / "nodes_config.cfg").write_text("127.0.0.1\n127.0.0.2\n")
    cfg = etc / "config.cfg"
    cfg.write_text(f"LOG_FILE_NAME={tmp_path / 'imex.log'}\nSERVER_PORT={_free_port()}\n"
                   f"IMEX_NODE_CONFIG_FILE={etc / 'nodes_config.cfg'}\n")
    env = {"HWSIM_DEV_DIR": str(tmp_path / "dev"), "HWSIM_MODPROBE_DIR": str(etc / "modprobe.d")}
    assert node.run("nvidia-imex-580", "nvidia-imex-ctl", "-N").stdout.splitlines()[-1] == "Domain State: DOWN"
    res = node.run("nvidia-imex-580", "nvidia-imex", "-c", str(cfg), **env)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "dev/nvidia-caps-imex-channels/channel0").exists()
    for _ in range(50):
        out = node.run("nvidia-imex-580", "nvidia-imex-ctl", "-N").stdout
        if "Domain State: UP" in out:
            break
        time.sleep(0.2)
    assert "Domain State: UP" in out and out.count("READY") == 2, out
    assert re.search(r"^Node #0   - 127\.0\.0\.1\s+- READY\s+- Version: 580\.95\.05$", out, re.M), out
    pid = int((node.run_dir / "nvidia-imex/nvidia-imex.pid").read_text())
    node.spec({"gpu_model": "GB200-186GB", "faults": {"imex_degraded": True}})
    wait_gone_s(pid, 10)
    assert node.run("nvidia-imex-580", "nvidia-imex-ctl", "-N").stdout.splitlines()[-1] == "Domain State: DOWN"
    refused = node.run("nvidia-imex-580", "nvidia-imex", "-c", str(cfg), **env)
    assert refused.returncode == 1 and "NVLinks to the switch trays are down" in refused.stderr


def test_imex_refuses_another_driver_version_and_a_node_without_imex(node: Node, tmp_path: Path) -> None:
    cfg = tmp_path / "config.cfg"
    (tmp_path / "nodes.cfg").write_text("127.0.0.1\n")
    cfg.write_text(f"LOG_FILE_NAME={tmp_path / 'imex.log'}\nIMEX_NODE_CONFIG_FILE={tmp_path / 'nodes.cfg'}\n")
    node.spec({"gpu_model": "GB200-186GB", "faults": {"fm_mismatch": True}})
    res = node.run("nvidia-imex-580", "nvidia-imex", "-c", str(cfg))
    assert res.returncode == 1 and "does not match the loaded NVIDIA driver version 580.82.07" in res.stderr
    node.spec({})
    res = node.run("nvidia-imex-580", "nvidia-imex", "-c", str(cfg))
    assert res.returncode == 1 and "no multi-node NVLink" in res.stderr
