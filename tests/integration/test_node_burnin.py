"""roles/node_burnin/files/node_burnin.py, run for real (a subprocess) against the testbed's stand-ins reading a
resolved hardware spec from a temporary HWSIM_DIR: nvidia-smi (clocks, reasons and the PCIe link under load),
hwsim-burnin (the GPU measurements burnin_torch.py makes on a real GPU), the kmsg file. Each burn-in degraded mode
of the spec is caught by its check with its code and the GPU named; a healthy node passes; the controller's parser
and re-judging read the same output. No root, no network, no GPU.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from provisioner import PROJECT_ROOT, burnin
from provisioner.probes import burnin as probe
from provisioner.probes.ssh import ExecResult

PROGRAM = PROJECT_ROOT / "roles" / "node_burnin" / "files" / "node_burnin.py"
PACKAGES = PROJECT_ROOT / "provisioner_testbed" / "packages"
hwsim = pytest.importorskip("provisioner_testbed.hwsim")
#: the load phase's length: nvidia-smi's samples count from a quarter of it on, and the stand-in nvidia-smi (python)
#: takes seconds to answer on a loaded machine (a CI rehearsal at load 10 got none within a 2 s load: clocks skipped)
LOAD_S = 6


class Node:
    def __init__(self, root: Path) -> None:
        self.root, self.bin, self.hwsim, self.run_dir = root, root / "bin", root / "hwsim", root / "run"
        for d in (self.bin, self.hwsim, self.run_dir):
            d.mkdir(parents=True, exist_ok=True)
        marker = root / "nvidia.ko"
        marker.write_text("")
        pkgroot = root / "pkg"
        self.tools = {}
        for pkg, tool in (("nvidia-utils", "nvidia-smi"), ("nvidia-utils", "hwsim-burnin"), ("dcgm", "dcgmi"),
                          ("nvidia-utils", "hwsim-ib-write-bw"), ("nvidia-utils", "hwsim-all-reduce-perf")):
            dst = pkgroot / "usr" / "bin" / tool
            dst.parent.mkdir(parents=True, exist_ok=True)
            text = (PACKAGES / pkg / "root" / "usr" / "bin" / tool).read_text()
            dst.write_text(text.replace("@PACKAGE@", pkg).replace("@UPSTREAM@", "580.95.05"))
            lib = pkgroot / "usr" / "lib" / "nvidia-hwsim" / pkg
            lib.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(PACKAGES / "common" / "hwsimrt.py", lib / "hwsimrt.py")
            wrapper = self.bin / tool
            wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{dst}" "$@"\n')
            wrapper.chmod(0o755)
            self.tools[tool] = wrapper
        self.env = dict(os.environ, PATH=f"{self.bin}:/usr/bin:/bin", HWSIM_DIR=str(self.hwsim),
                        HWSIM_RUN_DIR=str(self.run_dir), HWSIM_MODULE_MARKER=str(marker))

    def spec(self, **kw: Any) -> None:
        kw.setdefault("node", "node01")
        hwsim.materialize(kw, self.hwsim)

    def run(self, tier: str = "quick", gpus: int = 8, *extra: str) -> tuple[int, str, list[dict[str, Any]]]:
        doc = burnin.thresholds("H100-SXM5-80GB", gpus)
        argv = [sys.executable, str(PROGRAM), "--tier", tier, "--thresholds", json.dumps(doc),
                "--measure-cmd", str(self.tools["hwsim-burnin"]), "--kmsg", str(self.hwsim / "kmsg"),
                "--load-seconds", str(LOAD_S), "--stress-seconds", "2", "--skip", "dcgm", *extra]
        p = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=120)
        return p.returncode, p.stdout, [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def failed(results: list[dict[str, Any]]) -> list[tuple[str, Any, str]]:
    return [(r["check"], r.get("gpu"), r.get("code")) for r in results
            if r["status"] == "fail" and r["check"] != "summary"]


def test_healthy_node_passes_every_check(node: Node) -> None:
    node.spec()
    rc, out, res = node.run()
    assert rc == 0, out
    assert failed(res) == []
    checks = {(r["check"], r.get("gpu")) for r in res}
    for g in range(8):
        for c in ("gemm_bf16", "gemm_fp8", "hbm", "h2d", "d2h", "sdc_known", "sdc_repeat", "sustained", "clocks",
                  "pcie", "ecc_delta"):
            assert (c, g) in checks, (c, g)
    by = {(r["check"], r.get("gpu")): r for r in res}
    assert by[("clocks", 0)]["found"]["reasons"] == ["sw_power_cap"]  # sampled from nvidia-smi under load
    assert by[("pcie", 0)]["message"] == "GPU 0: PCIe gen 5 x16 (seen under load)"
    assert by[("nccl", None)]["status"] == "pass" and by[("sdc_agree", None)]["status"] == "pass"
    assert res[-1]["check"] == "summary" and res[-1]["status"] == "pass"


def test_each_degraded_mode_is_caught_with_its_code_and_gpu(node: Node) -> None:
    """All the modes at once, each on its own GPU (one run keeps the lane short): every one caught by its check with
    its code and GPU, nothing else fails; the controller reads the same lines as data and agrees."""
    node.spec(faults={"gemm_slow": {"gpu": 3, "fraction": 0.9}, "hbm_low": {"gpu": 5, "fraction": 0.8},
                      "pcie_downtrained": [{"gpu": 1, "width": 8}, {"gpu": 6, "gen": 4}], "thermal_slowdown": 2,
                      "sdc_mismatch": 4, "nccl_low": 0.8, "xid": {"gpu": 7, "code": 79}})
    rc, out, res = node.run()
    want = {("gemm_bf16", 3, "BRN001"), ("gemm_fp8", 3, "BRN001"), ("sustained", 3, "BRN006"),
            ("hbm", 5, "BRN002"), ("pcie", 1, "BRN004"), ("pcie", 6, "BRN004"),
            ("clocks", 2, "BRN005"), ("sustained", 2, "BRN006"),
            ("sdc_known", 4, "BRN009"), ("sdc_repeat", 4, "BRN010"), ("sdc_agree", 4, "BRN011"),
            ("nccl", None, "BRN012")}  # the XID from before the test is the health gate's, not a burn-in delta
    assert set(failed(res)) == want, out
    assert rc == 1
    by = {(r["check"], r.get("gpu")): r.get("message", "") for r in res}
    assert by[("pcie", 1)] == "GPU 1: PCIe link down-trained: x8 < x16 (seen under load)"
    assert by[("pcie", 6)] == "GPU 6: PCIe link down-trained: gen 4 < 5 (seen under load)"
    assert "hw_thermal_slowdown" in by[("clocks", 2)] and "91 C" in by[("clocks", 2)]
    h = probe.parse_output("node01", "quick", ExecResult("node01", ok=True, rc=rc, stdout=out),
                           burnin.thresholds("H100-SXM5-80GB", 8))
    assert h.error is None and {(r["check"], r.get("gpu"), r.get("code")) for r in h.failed} == want


def test_standard_tier_plans_the_cluster_checks_and_skips_them_on_one_node(node: Node) -> None:
    node.spec()
    rc, out, res = node.run("standard")
    assert rc == 0, out
    skips = {r["check"]: r["message"] for r in res if r["status"] == "skip"}
    assert "runs from the controller across the cluster's members" in skips["nccl_cluster"]
    assert "ib_pair" in skips
    assert sum(1 for r in res if r["check"] == "p2p") == 56  # every ordered pair of 8 GPUs
    assert any(r["check"] == "stress" for r in res) and any(r["check"] == "thermal" for r in res)


def test_one_gpu_skips_the_all_reduce_saying_why(node: Node) -> None:
    node.spec(gpu_count=1)
    rc, out, res = node.run("quick", 1)
    assert rc == 0, out
    nccl = [r for r in res if r["check"] == "nccl"]
    assert nccl and nccl[0]["status"] == "skip" and "needs >= 2 GPUs" in nccl[0]["message"]


def test_no_torch_and_no_stand_in_skips_the_gpu_work(node: Node) -> None:
    node.spec()
    argv = [sys.executable, str(PROGRAM), "--tier", "quick", "--torch-python", "/nonexistent/python", "--kmsg",
            str(node.hwsim / "kmsg"), "--skip", "dcgm"]
    p = subprocess.run(argv, env=node.env, capture_output=True, text=True, timeout=60)
    res = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
    assert p.returncode == 0, p.stdout + p.stderr
    assert [r["message"] for r in res if r["check"] == "torch"][0].startswith("GPU workload checks skipped: no python")


def test_dcgm_diag_runs_where_dcgmi_is_and_skips_without_its_host_engine(node: Node) -> None:
    node.spec(faults={"ecc_uncorrectable": {"gpu": 1, "count": 2}})
    argv = [sys.executable, str(PROGRAM), "--tier", "quick", "--measure-cmd", str(node.tools["hwsim-burnin"]),
            "--kmsg", str(node.hwsim / "kmsg"), "--skip", "load", "--skip", "nccl", "--dcgmi", str(node.tools["dcgmi"])]
    p = subprocess.run(argv, env=node.env, capture_output=True, text=True, timeout=60)
    dcgm = [json.loads(x) for x in p.stdout.splitlines() if '"check": "dcgm"' in x][0]
    assert dcgm["status"] == "skip" and "host engine" in dcgm["message"], dcgm
    # with the host engine up (the stand-in reads its pid file), level 2 runs and fails on GPU 1's ECC errors
    engine = subprocess.Popen(["bash", "-c", "exec -a nv-hostengine sleep 60"])  # its command line names it
    try:
        (node.run_dir / "nvhostengine.pid").write_text(f"{engine.pid}\n")
        p = subprocess.run(argv, env=node.env, capture_output=True, text=True, timeout=60)
    finally:
        engine.kill()
        engine.wait()
    dcgm = [json.loads(x) for x in p.stdout.splitlines() if '"check": "dcgm"' in x][0]
    assert (dcgm["status"], dcgm.get("code")) == ("fail", "BRN013"), dcgm
    assert "software GPU 1" in dcgm["message"]


def test_ib_link_at_half_rate_is_caught_naming_the_port_and_a_healthy_fabric_passes(node: Node) -> None:
    """The HCA ports the inventory names, read from the node's sysfs (the stand-in's files): each judged against the
    model's catalog rate and width (400 Gb/s, 4X); mlx5_2 trained at HDR 200 fails BRN019 naming mlx5_2:1, the
    others pass; the controller keeps the finding and names the port in the failed-check label."""
    hcas = ",".join(f"mlx5_{i}" for i in range(8))
    quick = ("--skip", "load", "--skip", "nccl", "--sysfs-root", str(node.hwsim), "--ib-hca", hcas)
    node.spec()
    rc, out, res = node.run("quick", 8, *quick)
    links = {r["link"]: r for r in res if r["check"] == "ib_link"}
    assert rc == 0 and set(links) == {f"mlx5_{i}:1" for i in range(8)}, out
    assert all(r["status"] == "pass" and r["value"] == 400 for r in links.values())
    node.spec(faults={"hca_rate": {"mlx5_2": 200}})
    rc, out, res = node.run("quick", 8, *quick)
    assert rc == 1 and failed(res) == [("ib_link", None, "BRN019")], out
    bad = [r for r in res if r["status"] == "fail"][0]
    assert bad["link"] == "mlx5_2:1" and "rate 200 Gb/s < 400" in bad["message"], bad
    assert res[-1]["failed"] == ["ib_link[mlx5_2:1]"]
    h = probe.parse_output("node01", "quick", ExecResult("node01", ok=True, rc=rc, stdout=out),
                           burnin.thresholds("H100-SXM5-80GB", 8))
    assert [(r["check"], r.get("link"), r.get("code")) for r in h.failed] == [("ib_link", "mlx5_2:1", "BRN019")]
    # a site on HDR (inventory ib_rate_gbps: 200): the controller judges the same figure against 200 and passes it
    hdr = probe.parse_output("node01", "quick", ExecResult("node01", ok=True, rc=0, stdout=out.replace(
        '"status": "fail"', '"status": "pass"')), burnin.thresholds("H100-SXM5-80GB", 8, 200))
    assert hdr.failed == []
    # a port down (hca_down) fails on its state whatever the rate
    node.spec(faults={"hca_down": "mlx5_5"})
    rc, out, res = node.run("quick", 8, *quick)
    bad = [r for r in res if r["status"] == "fail" and r["check"] != "summary"]
    assert [r.get("link") for r in bad] == ["mlx5_5:1"] and "state DOWN" in bad[0]["message"], out


PAIR = PROJECT_ROOT / "roles" / "node_burnin" / "files" / "burnin_pair.py"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1]) + 0


def pair_run(a: Node, b: Node, kind: str) -> list[dict[str, Any]]:
    """burnin_pair.py's two sides at once, as the controller starts them: `b` serves, `a` connects over TCP (here
    loopback; on the rack, the rack network); each side's stand-in reads its own node's hardware spec. The
    connecting side's lines, read and judged as the controller does."""
    port = _free_port()
    hcas = "mlx5_1,mlx5_2"  # two rails of eight keep the lane short
    common = ["--port", str(port), "--timeout", "60"]
    if kind == "ib":
        common += ["--hcas", hcas, "--seconds", "1", "--cmd", str(a.tools["hwsim-ib-write-bw"])]
    else:
        common += ["--cmd", str(a.tools["hwsim-all-reduce-perf"]), "--peer", "127.0.0.1"]
    serve = subprocess.Popen([sys.executable, str(PAIR), kind, "serve", "--name", "node02", "--peer-name", "node01",
                              *common], env=b.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    c = subprocess.run([sys.executable, str(PAIR), kind, "connect", "--name", "node01", "--peer-name", "node02",
                        "--peer", "127.0.0.1", *common], env=a.env, capture_output=True, text=True, timeout=120)
    serve.communicate(timeout=60)
    doc = burnin.thresholds("H100-SXM5-80GB", 8)
    out = []
    for line in c.stdout.splitlines():
        rec, why = probe.result_record(json.loads(line))
        assert rec is not None, why
        out.append(burnin.rejudge(rec, doc))
    assert out, c.stdout + c.stderr
    return out


def test_cross_node_pair_ib_rail_at_half_rate_and_nccl_low_are_caught_naming_pair_and_rail(tmp_path: Path) -> None:
    a, b = Node(tmp_path / "a"), Node(tmp_path / "b")
    a.spec(node="node01")
    b.spec(node="node02")
    ib = pair_run(a, b, "ib")
    assert [(r["link"], r["status"], r["value"]) for r in ib] == [
        (f"node01/mlx5_{i}:1-node02/mlx5_{i}:1", "pass", 384.0) for i in (1, 2)], ib
    nccl = pair_run(a, b, "nccl")
    assert [(r["check"], r["link"], r["status"], r["value"]) for r in nccl] == [
        ("nccl_cluster", "node01-node02", "pass", 360.0)], nccl
    # node02's mlx5_2 trained at HDR 200: that rail's pair fails BRN016, the pair and rail named; node01's NCCL 20% low
    b.spec(node="node02", faults={"hca_rate": {"mlx5_2": 200}})
    a.spec(node="node01", faults={"nccl_low": 0.8})
    ib = pair_run(a, b, "ib")
    bad = [(r["link"], r.get("code"), r["value"]) for r in ib if r["status"] == "fail"]
    assert bad == [("node01/mlx5_2:1-node02/mlx5_2:1", "BRN016", 192.0)], ib
    assert "node01/mlx5_2:1-node02/mlx5_2:1: ib_pair_gbps 192.0 < 345.6" in [r["message"] for r in ib][1]
    nccl = pair_run(a, b, "nccl")  # the ring is as fast as its slowest rail: node02's half-rate rail
    assert [(r["status"], r.get("code"), r["value"]) for r in nccl] == [("fail", "BRN017", 180.0)], nccl
    b.spec(node="node02")
    nccl = pair_run(a, b, "nccl")  # node01's 20% low NCCL alone
    assert [(r["status"], r.get("code"), r["value"]) for r in nccl] == [("fail", "BRN017", 288.0)], nccl
    assert nccl[0]["message"].startswith("node01-node02: nccl_cluster_busbw_gbps 288.0 < 324.0")
