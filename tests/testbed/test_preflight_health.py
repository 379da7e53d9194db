"""Preflight and the node health gate on the simulated rack: every injected hardware fault is caught, naming the host
and the check; the hosts without a fault pass.

Uses its own rack (PROVISIONER_HEALTH_RACK, default `health`, 4 hosts) because it injects faults; the faults are
cleared at the end. The stand-in GPU stack (driver, nvidia-smi, persistenced, Fabric Manager at the pinned 580.95.05)
is installed with apt from the rack's repository directly, so this test depends on the simulated hardware and the
packages, not on the roles' state.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from testbed_rigs import own_rack  # noqa: E402  (same directory)

from provisioner import PROJECT_ROOT

pytestmark = pytest.mark.testbed

PROVISION = [sys.executable, "-m", "provisioner.cli"]
PIN = "580.95.05-1"
STACK = ["nvidia-open-580", "nvidia-kernel-open-580", "nvidia-utils-580", "nvidia-persistenced",
         "nvidia-fabricmanager-580", "libnvidia-nscq-580"]


def _install_stack(h: Any, host: str) -> None:
    repo = h.repo_url.rstrip("/") + "/"
    gw = h.gateway
    pkgs = " ".join(f"{p}={PIN}" for p in STACK)
    script = f"""set -e
command -v nvidia-smi >/dev/null && systemctl is-active -q nvidia-fabricmanager && exit 0
mkdir -p /etc/apt/keyrings
python3 -c 'import urllib.request,sys; sys.stdout.buffer.write(urllib.request.urlopen("{repo}testbed-archive-keyring.gpg").read())' > /etc/apt/keyrings/testbed-nvidia.gpg
echo 'deb [signed-by=/etc/apt/keyrings/testbed-nvidia.gpg] {repo} /' > /etc/apt/sources.list.d/testbed-nvidia.list
echo 'Acquire::http::Proxy::{gw} "DIRECT";' > /etc/apt/apt.conf.d/91testbed-direct
apt-get update -qq -o Dir::Etc::sourcelist=/dev/null -o Dir::Etc::sourceparts=/etc/apt/sources.list.d
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq {pkgs} >/dev/null
systemctl enable --now nvidia-persistenced nvidia-fabricmanager
"""
    r = h.ssh(host, script, timeout=600)
    assert r.returncode == 0, f"{host}: installing the stand-in stack failed: {r.stdout}{r.stderr}"


@pytest.fixture(scope="module")
def rig() -> Iterator[Any]:
    from provisioner_testbed import rack

    with own_rack("PROVISIONER_HEALTH_RACK", "health", 4) as h:
        for host in h.names:
            rack.clear(h.name, host)
            _install_stack(h, host)
        yield h
        for host in h.names:
            rack.clear(h.name, host)


def provision(*args: str) -> tuple[int, Any, str]:
    p = subprocess.run([*PROVISION, *args], capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=900)
    try:
        doc = json.loads(p.stdout)
    except ValueError:
        doc = None
    return p.returncode, doc, p.stdout + p.stderr


def fault(h: Any, host: str, *faults: str) -> None:
    from provisioner_testbed import rack

    rack.fault(h.name, host, list(faults))


def clear_all(h: Any) -> None:
    from provisioner_testbed import rack

    for host in h.names:
        rack.clear(h.name, host)


def pf_errors(doc: dict[str, Any], host: str) -> dict[str, str]:
    return {m["check"]: f"expected {m['expected']}, found {m['found']}"
            for m in doc["hosts"][host]["mismatches"] if m["severity"] == "error"}


def health_failed(doc: dict[str, Any], host: str) -> dict[str, str]:
    return {c["check"]: c["message"] for c in doc["hosts"][host]["checks"] if c["status"] == "fail"}


def test_clean_rack_passes(rig: Any) -> None:
    clear_all(rig)
    rc, doc, out = provision("preflight", str(rig.inventory), "--format", "json")
    assert rc == 0, out
    assert all(not pf_errors(doc, h) for h in rig.names)
    rc, doc, out = provision("health", str(rig.inventory), "--format", "json")
    assert rc == 0, out
    for h in rig.names:
        st = {c["check"]: c["status"] for c in doc["hosts"][h]["checks"]}
        assert st["gpu"] == st["driver"] == st["fabricmanager"] == st["ib"] == st["xid"] == st["ecc"] == "pass", st


def test_gpu_and_hca_faults(rig: Any, tmp_path: Path) -> None:
    clear_all(rig)
    n1, n2, n3, n4 = rig.names
    fault(rig, n1, "missing_gpu")
    fault(rig, n2, "hca_down=mlx5_3")
    fault(rig, n3, "hca_rate=mlx5_2:200")
    try:
        rc, pf, out = provision("preflight", str(rig.inventory), "--format", "json")
        assert rc == 1, out
        assert pf_errors(pf, n1) == {"gpu_count": "expected 8, found 7"}
        assert pf_errors(pf, n2) == {"ib_state": "expected mlx5_3:1 ACTIVE/LinkUp, found DOWN/Polling"}
        assert pf_errors(pf, n3) == {"ib_rate": "expected mlx5_2:1 400 Gb/s, found 200 Gb/s"}
        assert pf_errors(pf, n4) == {} and pf["hosts"][n4]["ok"]

        # the text form names host and check on one line
        rc, _, text = provision("preflight", str(rig.inventory))
        assert rc == 1
        assert f"{n1}: gpu_count: expected 8, found 7" in text
        assert f"{n3}: ib_rate: expected mlx5_2:1 400 Gb/s, found 200 Gb/s" in text

        prom = tmp_path / "health.prom"
        rc, hd, out = provision("health", str(rig.inventory), "--format", "json", "--prometheus", str(prom))
        assert rc == 1, out
        assert health_failed(hd, n1) == {"gpu": "7 GPUs, expected 8"}
        f2 = health_failed(hd, n2)
        assert list(f2) == ["ib"] and "mlx5_3:1: state DOWN" in f2["ib"]
        assert health_failed(hd, n3) == {"ib": "mlx5_2:1: rate 200 Gb/s, expected 400"}
        assert health_failed(hd, n4) == {} and hd["hosts"][n4]["ok"]
        text = prom.read_text()
        assert f'provisioner_node_health_ok{{host="{n1}"}} 0' in text
        assert f'provisioner_node_health_ok{{host="{n4}"}} 1' in text
        assert f'provisioner_node_health_check_ok{{host="{n3}",check="ib",status="fail"}} 0' in text
    finally:
        clear_all(rig)


def test_xid_ecc_fm_faults(rig: Any) -> None:
    clear_all(rig)
    n1, n2, n3, n4 = rig.names
    fault(rig, n1, "xid=3:79")
    fault(rig, n2, "ecc_uncorrectable=5:2")
    fault(rig, n3, "fm_mismatch")
    try:
        rc, hd, out = provision("health", str(rig.inventory), "--format", "json")
        assert rc == 1, out
        f1 = health_failed(hd, n1)
        assert list(f1) == ["xid"] and f1["xid"].startswith("critical XID 79 on ")
        assert health_failed(hd, n2) == {"ecc": "GPU 5: 2 uncorrectable ECC errors"}
        f3 = health_failed(hd, n3)
        assert f3["driver"] == "driver 580.82.07, pinned 580.95.05"
        assert "fabric manager version 580.95.05 != driver 580.82.07" in f3["fabricmanager"]
        assert health_failed(hd, n4) == {}
        rc, _, text = provision("health", str(rig.inventory))
        assert rc == 1
        assert f"{n1}: xid: critical XID 79" in text and f"{n2}: ecc: GPU 5: 2 uncorrectable ECC errors" in text
        # preflight does not read the kernel log or ECC: those hosts still match the inventory there
        rc, pf, _ = provision("preflight", str(rig.inventory), "--format", "json")
        assert pf_errors(pf, n1) == {} and pf_errors(pf, n2) == {}
    finally:
        clear_all(rig)


def test_acs_redirect_on_is_caught_by_preflight_and_health_naming_the_bridge(rig: Any) -> None:
    """ACS redirect on a PCIe bridge above a GPU (the switch port above GPU 0) on one host, on every ACS bridge on
    another: preflight and the health gate fail those two, naming the bridge and the GPU below it; onboarding leaves
    them out (issue 26). lspci -D -vvv of the simulated node, as root over SSH."""
    clear_all(rig)
    n1, n2, n3, n4 = rig.names
    fault(rig, n1, "acs_on=0")
    fault(rig, n2, "acs_on")
    try:
        rc, pf, out = provision("preflight", str(rig.inventory), "--format", "json")
        assert rc == 1, out
        e1, e2 = pf_errors(pf, n1), pf_errors(pf, n2)
        assert list(e1) == ["acs"] and re.search(r"ACS redirect on at bridge 0000:17:03\.0 above GPU 0000:\S+", e1["acs"])
        assert "0000:17:00.0" not in e1["acs"]  # only the bridge the fault named
        assert list(e2) == ["acs"] and re.search(r"and \d+ more bridge\(s\)", e2["acs"]), e2
        assert pf_errors(pf, n3) == {} and pf_errors(pf, n4) == {}
        assert pf["hosts"][n1]["facts"]["acs_redirect"] == ["0000:17:03.0"]
        rc, _, text = provision("preflight", str(rig.inventory))
        assert rc == 1 and f"{n1}: acs: " in text and "0000:17:03.0" in text

        rc, hd, out = provision("health", str(rig.inventory), "--format", "json")
        assert rc == 1, out
        h1 = health_failed(hd, n1)
        assert list(h1) == ["acs"] and "0000:17:03.0" in h1["acs"], h1
        assert list(health_failed(hd, n2)) == ["acs"]
        assert health_failed(hd, n3) == {} and health_failed(hd, n4) == {}
    finally:
        clear_all(rig)
    rc, pf, out = provision("preflight", str(rig.inventory), "--format", "json", "--limit", f"{n1},{n2}")
    assert rc == 0 and pf_errors(pf, n1) == {} and pf_errors(pf, n2) == {}, out


def test_unreachable_and_usage(rig: Any, tmp_path: Path) -> None:
    clear_all(rig)
    # a host key that is not in known_hosts is refused (RejectPolicy), reported as unreachable: exit 1
    inv = tmp_path / "hosts.ini"
    first = rig.names[0]
    inv.write_text(f"[gpu_nodes]\n{first} ansible_host={rig.hosts[first]} ansible_user=root "
                   f"ansible_ssh_private_key_file={rig.key} "
                   f"ansible_ssh_common_args='-o UserKnownHostsFile={tmp_path / 'empty_known_hosts'}'\n"
                   "[gpu_nodes:vars]\ngpu_model=H100-SXM5-80GB\ngpu_count=8\n")
    (tmp_path / "empty_known_hosts").write_text("")
    old = Path.home() / ".ssh" / "known_hosts"
    if old.is_file() and rig.hosts[first] in old.read_text():
        pytest.skip("the user's own known_hosts knows this host")
    rc, doc, out = provision("preflight", str(inv), "--format", "json")
    assert rc == 1, out
    assert doc["hosts"][first]["reachable"] is False and "known_hosts" in doc["hosts"][first]["error"]
    # usage errors: exit 2, one line, no traceback
    rc, _, out = provision("preflight", str(tmp_path / "missing.ini"))
    assert rc == 2 and "Traceback" not in out
    rc, _, out = provision("preflight", str(rig.inventory), "--format", "yaml")
    assert rc == 2 and "Traceback" not in out
    rc, _, out = provision("health", str(rig.inventory), "--limit", "nosuchhost")
    assert rc == 2 and "no GPU nodes match" in out


def test_onboard_marks_passing_hosts_and_leaves_out_failing(rig: Any) -> None:
    clear_all(rig)
    n1, n2, n3, _ = rig.names
    fault(rig, n2, "xid=79")
    fault(rig, n3, "missing_gpu")
    try:
        # the provisioning step runs playbooks/health.yml through provisioner.runner (serial 1)
        rc, doc, out = provision("onboard", str(rig.inventory), n1, n2, n3, "--playbook",
                                 str(PROJECT_ROOT / "playbooks" / "health.yml"), "--format", "json")
        assert rc == 1, out
        hosts = doc["hosts"]
        assert hosts[n1]["in_service"] is True and hosts[n1]["marked"] is True
        # the burn-in gate (on by default): the tier onboarding ran is what lets the ledger move it into service
        assert (hosts[n1]["burnin"], hosts[n1]["lifecycle"]) == ("standard", "in-service"), hosts[n1]
        assert hosts[n3]["stage"] == "preflight" and hosts[n3]["problems"] == ["gpu_count: expected 8, found 7"]
        # n2 passes preflight, then the run's own health play fails it (XID 79) before the health gate
        assert hosts[n2]["in_service"] is False and hosts[n2]["stage"] in ("run", "health")
        assert any("XID 79" in p for p in hosts[n2]["problems"]), hosts[n2]
        assert set(doc["clusters_affected"]) == set(hosts[n2]["clusters"]) | set(hosts[n3]["clusters"])
        assert rig.ssh(n1, "cat /etc/provisioner/in-service").returncode == 0
        for n in (n2, n3):
            assert rig.ssh(n, "test -e /etc/provisioner/in-service").returncode == 1
        # text form: one line per host naming the gate and the check
        rc, _, text = provision("onboard", str(rig.inventory), n1, n3, "--skip-run")
        assert rc == 1
        assert f"{n1}: IN SERVICE (preflight, health, burn-in passed" in text  # burn-in: burnin_onboard_tier
        assert f"{n3}: LEFT OUT at preflight: gpu_count: expected 8, found 7" in text
    finally:
        clear_all(rig)


def test_missing_bootstrap_interface_fails_socket_ifname(rig: Any, tmp_path: Path) -> None:
    """NCCL_SOCKET_IFNAME (= the inventory's bootstrap_interface) names an interface the node does not have: NCCL's
    bootstrap would fail ("no socket interface found"); the health gate says so for that host only."""
    import shutil

    clear_all(rig)
    n1, n2 = rig.names[:2]
    inv_dir = tmp_path / "inv"
    shutil.copytree(Path(rig.inventory).parent, inv_dir)
    (inv_dir / "host_vars").mkdir(exist_ok=True)
    (inv_dir / "host_vars" / f"{n1}.yml").write_text("---\nbootstrap_interface: ens99f0np0\n")
    inv = inv_dir / Path(rig.inventory).name
    rc, hd, out = provision("health", str(inv), "--limit", f"{n1},{n2}", "--format", "json")
    assert rc == 1, out
    f1 = health_failed(hd, n1)
    assert list(f1) == ["socket_ifname"], f1
    assert "NCCL_SOCKET_IFNAME==ens99f0np0 matches no interface" in f1["socket_ifname"]
    assert "host0" in f1["socket_ifname"] and "no socket interface found" in f1["socket_ifname"]
    assert health_failed(hd, n2) == {} and hd["hosts"][n2]["ok"]
    st = {c["check"]: c for c in hd["hosts"][n2]["checks"]}["socket_ifname"]
    assert st["status"] == "pass" and st["message"] == "NCCL_SOCKET_IFNAME==host0: host0 up"


# --- burn-in (issue 45): the degraded modes of the hardware spec, over SSH, on this module's rack -----------------
def burn_in(ledger: Path, *args: str) -> tuple[int, Any, str]:
    import os

    p = subprocess.run([*PROVISION, *args], capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=900,
                       env={**os.environ, "PROVISION_LEDGER": str(ledger)})
    try:
        doc = json.loads(p.stdout)
    except ValueError:
        doc = None
    return p.returncode, doc, p.stdout + p.stderr


def burnin_failed(doc: dict[str, Any], host: str) -> set[tuple[str, Any, str]]:
    return {(r["check"], r.get("gpu"), r.get("code")) for r in doc["hosts"][host]["results"] if r["status"] == "fail"}


def test_burn_in_catches_each_degraded_mode_and_a_healthy_node_passes(rig: Any, tmp_path: Path) -> None:
    clear_all(rig)
    n1, n2, n3, n4 = rig.names
    fault(rig, n1, "gemm_slow=3:0.9", "hbm_low=5:0.8")
    fault(rig, n2, "pcie_downtrained=1:x8", "thermal_slowdown=2")
    fault(rig, n3, "sdc_mismatch=4", "nccl_low=0.8")
    db = tmp_path / "ledger.sqlite3"
    try:
        rc, doc, out = burn_in(db, "burn-in", str(rig.inventory), "--tier", "quick", "--format", "json")
        assert rc == 1, out
        assert burnin_failed(doc, n1) == {("gemm_bf16", 3, "BRN001"), ("gemm_fp8", 3, "BRN001"),
                                          ("sustained", 3, "BRN006"), ("hbm", 5, "BRN002")}, out
        assert burnin_failed(doc, n2) == {("pcie", 1, "BRN004"), ("clocks", 2, "BRN005"), ("sustained", 2, "BRN006")}
        assert burnin_failed(doc, n3) == {("sdc_known", 4, "BRN009"), ("sdc_repeat", 4, "BRN010"),
                                          ("sdc_agree", 4, "BRN011"), ("nccl", None, "BRN012")}
        assert burnin_failed(doc, n4) == set() and doc["hosts"][n4]["ok"]
        # every check per GPU is in the ledger, and status names the failed ones
        rc, st, out = burn_in(db, "status", str(rig.inventory), "--format", "json")
        assert rc == 0, out
        rows = {r["host"]: r for r in st["hosts"]}
        assert rows[n1]["burnin"]["tier"] == "quick" and rows[n1]["burnin"]["result"] == "failed"
        assert "gemm_bf16[gpu3] BRN001" in rows[n1]["burnin"]["failed"]
        assert rows[n4]["burnin"]["result"] == "ok" and rows[n4]["burnin"]["failed"] == []
        from provisioner.inventory import load_fleet
        from provisioner.ledger import Ledger
        from provisioner.ledger.site import site_of

        with Ledger.open(db, site=site_of(load_fleet(rig.inventory))) as lg:
            rows4 = lg.burnin(n4)
            assert len(rows4) > 8 * 10 and {r["result"] for r in rows4} <= {"pass", "skip", "warn"}
    finally:
        clear_all(rig)


def test_burn_in_flags_the_slow_node_of_four_and_no_other(rig: Any, tmp_path: Path) -> None:
    """Every GPU of one node at 93% (within every fixed threshold): the fleet median names it, metric and gap."""
    clear_all(rig)
    n1, n2, n3, n4 = rig.names
    fault(rig, n2, "gemm_slow=all:0.93")
    db = tmp_path / "ledger.sqlite3"
    try:
        rc, doc, out = burn_in(db, "burn-in", str(rig.inventory), "--format", "json")
        assert rc == 0, out  # 640 TFLOP/s passes the H100's 633.0 minimum
        rc, st, out = burn_in(db, "status", str(rig.inventory), "--format", "json")
        assert rc == 0, out
        slow = {r["host"]: [s["metric"] for s in r["slow"]] for r in st["hosts"]}
        assert slow[n2] and set(slow[n2]) == {"gemm_bf16_tflops", "gemm_fp8_tflops", "sustained_bf16_tflops"}
        assert slow[n1] == slow[n3] == slow[n4] == []
        text = burn_in(db, "status", str(rig.inventory))[2]
        assert "SLOW gemm_bf16_tflops -7.0%" in text
    finally:
        clear_all(rig)


def test_burn_in_standard_catches_a_half_rate_rail_and_low_nccl_across_the_cluster_pair(rig: Any,
                                                                                         tmp_path: Path) -> None:
    """standard on the rack: node 2's mlx5_2 trained at HDR 200 and node 1's NCCL 20% low. The cluster pair (the
    rack's 2-node vLLM cluster: nodes 1 and 2) measures every rail with ib_write_bw and a two-node all-reduce over
    the rack network; the half-rate rail fails on that pair and rail (BRN016) and node 2's ib_link names the port
    (BRN019); the all-reduce fails (BRN017); node 3 (alone in its cluster) and node 4 (in none) pass, saying why."""
    clear_all(rig)
    n1, n2, n3, n4 = rig.names
    fault(rig, n2, "hca_rate=mlx5_2:200")
    fault(rig, n1, "nccl_low=0.8")
    db = tmp_path / "ledger.sqlite3"
    try:
        rc, doc, out = burn_in(db, "burn-in", str(rig.inventory), "--tier", "standard", "--format", "json")
        assert rc == 1, out
        rail = f"{n1}/mlx5_2:1-{n2}/mlx5_2:1"
        for n in (n1, n2):
            res = doc["hosts"][n]["results"]
            failed = {(r["check"], r.get("link"), r.get("code")) for r in res if r["status"] == "fail"}
            assert ("ib_pair", rail, "BRN016") in failed and ("nccl_cluster", f"{n1}-{n2}", "BRN017") in failed, out
            assert sum(1 for r in res if r["check"] == "ib_pair" and r["status"] == "pass") == 7
        assert ("ib_link", "mlx5_2:1", "BRN019") in {(r["check"], r.get("link"), r.get("code"))
                                                      for r in doc["hosts"][n2]["results"]}
        assert ("nccl", None, "BRN012") in burnin_failed(doc, n1)
        for n, why in ((n3, "the only member of cluster"), (n4, "not a member of a vLLM cluster")):
            assert doc["hosts"][n]["ok"], out
            skips = {r["check"]: r["message"] for r in doc["hosts"][n]["results"] if r["status"] == "skip"}
            assert why in skips["ib_pair"] and why in skips["nccl_cluster"]
        rc, st, out = burn_in(db, "status", str(rig.inventory), "--format", "json")
        rows = {r["host"]: r for r in st["hosts"]}
        assert f"ib_pair[{rail}] BRN016" in rows[n2]["burnin"]["failed"], rows[n2]
        assert "ib_link[mlx5_2:1] BRN019" in rows[n2]["burnin"]["failed"]
    finally:
        clear_all(rig)
