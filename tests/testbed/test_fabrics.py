"""The shapes beyond HGX H100 + InfiniBand on the simulated rack: an AWS p5 pair (fabric efa) and a GB200 NVL72 slice
(4 trays of one NVLink domain) with an HGX B200 node, from the example specs in provisioner_testbed/specs/.

On each shape: the site run (`provision run`, site.yml without the vLLM area) passes, a second run changes nothing,
`provision drift` is clean and `provision health` passes; the shape's own state is checked over SSH (EFA installer
record, holds, fi_info, /etc/nccl.conf; IMEX at the driver's version, nodes_config.cfg, domain UP, no Fabric Manager
on the trays; NVLSM before Fabric Manager and the fabric Completed on the B200). Each new fault (efa_missing,
nvlsm_fail, imex_degraded) is injected live and caught by `provision health` naming the host and the check; a site
run after clearing it brings the node back.

Racks (each its own, 2 and 5 hosts): PROVISIONER_P5_RACK (default `fab-p5`), PROVISIONER_GB_RACK (default `fab-gb`);
PROVISIONER_TESTBED_TEARDOWN=1 removes a rack this session created. Needs root.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from testbed_rigs import CliRig  # noqa: E402  (same directory)

from provisioner import PROJECT_ROOT

pytestmark = pytest.mark.testbed

PROVISION = [sys.executable, "-m", "provisioner.cli"]
SPECS = PROJECT_ROOT / "provisioner_testbed" / "specs"
DRIVER = "580.95.05-1"
EFA_VERSION = "1.43.2"
EFA_PACKAGES = ["efa-config", "libfabric1-aws", "libnccl-ofi"]
TRAYS = ["node01", "node02", "node03", "node04"]
B200 = "node05"
# The health checks the new faults trip (node_health.py): efa devices, NVLSM/Fabric Manager state, IMEX domain.
EFA_CHECK = "efa"
FM_CHECK = "fabricmanager"
IMEX_CHECK = "imex"


class Rig(CliRig):
    def cli(self, *args: str, timeout: float = 2400) -> subprocess.CompletedProcess[str]:
        if args[0] in ("run", "drift"):
            args = (*args, "--skip-tags", "vllm")  # no vLLM layer on these racks (tests/vllm has its own)
        return super().cli(*args, timeout=timeout)

    def run(self) -> dict[str, Any]:
        p = self.cli("run", self.inv, "--json")
        try:
            data = json.loads(p.stdout)
        except ValueError:
            raise AssertionError(f"no JSON from provision run (rc {p.returncode}): {p.stdout}\n{p.stderr}") from None
        data["rc"] = p.returncode
        return data

    def health(self) -> tuple[int, dict[str, Any]]:
        p = self.cli("health", self.inv, "--format", "json")
        try:
            return p.returncode, json.loads(p.stdout)
        except ValueError:
            raise AssertionError(f"no JSON from provision health (rc {p.returncode}): {p.stdout}\n{p.stderr}") from None

    def ssh(self, host: str, cmd: str, *, check: bool = True) -> str:
        r = self.h.ssh(host, cmd, timeout=300)
        if check:
            assert r.returncode == 0, f"{host}: {cmd}: {r.stdout}{r.stderr}"
        return r.stdout


def _rig(key: str, nodes: int, spec: str, tmp: Path) -> Iterator[Rig]:
    if os.geteuid() != 0:
        pytest.skip("the simulated rack needs root")
    from provisioner_testbed import rack

    name = os.environ.get(f"PROVISIONER_{key.upper()}_RACK", f"fab-{key}")
    existed = rack.RackState.load(name) is not None
    h = rack.ensure(name, nodes, spec_file=SPECS / spec, log=lambda m: print(f"testbed: {m}"))
    for host in h.names:
        rack.clear(name, host)
    yield Rig(h, tmp)
    for host in h.names:
        rack.clear(name, host)
    if not existed and os.environ.get("PROVISIONER_TESTBED_TEARDOWN") == "1":
        rack.down(name)


@pytest.fixture(scope="module")
def p5(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    yield from _rig("p5", 2, "p5-pair.yaml", tmp_path_factory.mktemp("runs-p5"))


@pytest.fixture(scope="module")
def gb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    yield from _rig("gb", 5, "gb200-slice.yaml", tmp_path_factory.mktemp("runs-gb"))


def _first(rig: Rig) -> dict[str, Any]:
    t = time.monotonic()
    data = rig.run()
    print(f"first site run on {rig.h.name}: {time.monotonic() - t:.0f} s")
    bad = {n: h["failures"] for n, h in data["hosts"].items() if h["state"] not in ("ok", "changed")}
    assert data["rc"] == 0 and not bad, json.dumps(bad, indent=1)[:6000]
    return data


@pytest.fixture(scope="module")
def p5_run(p5: Rig) -> dict[str, Any]:
    return _first(p5)


@pytest.fixture(scope="module")
def gb_run(gb: Rig) -> dict[str, Any]:
    return _first(gb)


def _converged(rig: Rig) -> None:
    t = time.monotonic()
    data = rig.run()
    print(f"second site run on {rig.h.name}: {time.monotonic() - t:.0f} s")
    assert data["rc"] == 0
    changed = {n: h["changed"] for n, h in data["hosts"].items() if h["changed"]}
    assert changed == {}, changed
    p = rig.cli("drift", rig.inv, "--report", "json")
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    assert all(h["drift"] == [] for h in json.loads(p.stdout)["hosts"].values())
    rc, doc = rig.health()
    failed = {n: _failed(doc, n) for n in rig.h.names}
    assert rc == 0 and not any(failed.values()), failed


def _failed(doc: dict[str, Any], host: str) -> dict[str, str]:
    return {c["check"]: c["message"] for c in doc["hosts"][host]["checks"] if c["status"] == "fail"}


def _wait(rig: Rig, host: str, cmd: str, pattern: str, timeout: float = 60) -> str:
    end = time.monotonic() + timeout
    out = ""
    while time.monotonic() < end:
        out = rig.ssh(host, cmd, check=False)
        if re.search(pattern, out):
            return out
        time.sleep(2)
    raise AssertionError(f"{host}: {cmd}: no {pattern!r} within {timeout} s; last output:\n{out}")


# --------------------------------------------------------------------------------------------------- AWS p5 pair
def test_p5_site_run_installs_efa(p5: Rig, p5_run: dict[str, Any]) -> None:
    for host in p5.h.names:
        record = p5.ssh(host, "cat /opt/amazon/efa_installed_packages").splitlines()
        assert record[0] == f"# EFA installer version: {EFA_VERSION}"
        held = p5.ssh(host, "apt-mark showhold").split()
        assert set(EFA_PACKAGES) <= set(held), held
        assert p5.ssh(host, "/opt/amazon/efa/bin/fi_info -p efa -t FI_EP_RDM | grep -c '^provider: efa'").strip() == "32"
        p5.ssh(host, "test -e /opt/amazon/ofi-nccl/lib/libnccl-net.so && test -e /opt/amazon/ofi-nccl/lib/libnccl-ofi-tuner.so")
        conf = p5.ssh(host, "cat /etc/nccl.conf")
        assert "FI_PROVIDER=efa\n" in conf and "FI_EFA_FORK_SAFE=1\n" in conf
        assert "NCCL_TUNER_PLUGIN=/opt/amazon/ofi-nccl/lib/libnccl-ofi-tuner.so\n" in conf
        assert "NCCL_IB_HCA" not in conf and "NCCL_PROTO" not in conf and "FI_EFA_USE_DEVICE_RDMA" not in conf
        # the installer brings its own RDMA stack: the inbox one (infiniband role) is not installed on fabric efa
        assert p5.ssh(host, "dpkg-query -W -f='${Status}' rdma-core 2>/dev/null || true").strip() != (
            "install ok installed")
        # the tarball was removed after the install; nothing of the download is left to drift
        assert p5.ssh(host, "ls -A /opt/provisioner/efa-installer").strip() == ""


def test_p5_second_run_drift_and_health_clean(p5: Rig, p5_run: dict[str, Any]) -> None:
    _converged(p5)


def test_p5_efa_device_missing_is_caught(p5: Rig, p5_run: dict[str, Any]) -> None:
    from provisioner_testbed import rack

    rack.fault(p5.h.name, "node02", ["efa_missing=2"])
    try:
        assert p5.ssh("node02", "/opt/amazon/efa/bin/fi_info -p efa -t FI_EP_RDM | grep -c '^provider: efa'").strip() == "30"
        assert p5.ssh("node02", "ls /var/lib/hwsim/sys/class/infiniband | grep -c '^rdmap'").strip() == "30"
        rc, doc = p5.health()
        assert rc != 0
        assert _failed(doc, "node01") == {}
        failed = _failed(doc, "node02")
        assert EFA_CHECK in failed, failed
        assert "30" in failed[EFA_CHECK] and "32" in failed[EFA_CHECK], failed
    finally:
        rack.clear(p5.h.name, "node02")
    rc, doc = p5.health()
    assert rc == 0, {n: _failed(doc, n) for n in p5.h.names}


# ------------------------------------------------------------------------------------- GB200 slice + HGX B200
def test_gb_site_run_imex_on_trays_nvlsm_on_b200(gb: Rig, gb_run: dict[str, Any]) -> None:
    addresses = [gb.h.hosts[t] for t in TRAYS]
    for tray in TRAYS:
        assert gb.ssh(tray, "dpkg-query -W -f='${Version}' nvidia-imex-580") == DRIVER
        assert "nvidia-imex-580" in gb.ssh(tray, "apt-mark showhold").split()
        lines = [x for x in gb.ssh(tray, "cat /etc/nvidia-imex/nodes_config.cfg").splitlines() if x and x[0] != "#"]
        assert lines == addresses
        assert "options nvidia NVreg_CreateImexChannel0=1" in gb.ssh(tray, "cat /etc/modprobe.d/nvidia-imex-channel.conf")
        assert gb.ssh(tray, "systemctl is-enabled nvidia-imex; systemctl is-active nvidia-imex").split() == [
            "enabled", "active"]
        gb.ssh(tray, "test -e /dev/nvidia-caps-imex-channels/channel0")
        # Fabric Manager is never installed (nor run) on an NVL72 tray
        assert gb.ssh(tray, "dpkg-query -W -f='${Status}' nvidia-fabricmanager-580 2>/dev/null || true") != (
            "install ok installed")
        assert gb.ssh(tray, "systemctl is-active nvidia-fabricmanager", check=False).strip() != "active"
        assert gb.ssh(tray, "test -e /etc/modules-load.d/nvlsm.conf && echo yes || echo no").strip() == "no"
    out = _wait(gb, "node01", "nvidia-imex-ctl -N", r"Domain State: UP")
    assert out.count("READY") == len(TRAYS), out

    assert gb.ssh(B200, "dpkg-query -W -f='${Version}' nvlsm") == DRIVER
    assert {"nvlsm", "libnvsdm-580", "nvidia-fabricmanager-580"} <= set(gb.ssh(B200, "apt-mark showhold").split())
    assert gb.ssh(B200, "cat /etc/modules-load.d/nvlsm.conf").splitlines()[1:] == ["mlx5_ib", "ib_umad"]
    assert gb.ssh(B200, "systemctl is-active nvlsm nvidia-fabricmanager").split() == ["active", "active"]
    after = gb.ssh(B200, "systemctl show -p After --value nvidia-fabricmanager").split()
    assert "nvlsm.service" in after, after
    states = set(re.findall(r"^\s+State\s+:\s+(.+)$", gb.ssh(B200, "nvidia-smi -q"), re.M))
    assert "Completed" in states and "In Progress" not in states, states
    assert gb.ssh(B200, "dpkg-query -W -f='${Status}' nvidia-imex-580 2>/dev/null || true") != "install ok installed"


def test_gb_second_run_drift_and_health_clean(gb: Rig, gb_run: dict[str, Any]) -> None:
    _converged(gb)


def test_gb_nvlsm_not_running_and_imex_domain_degraded_are_caught(gb: Rig, gb_run: dict[str, Any]) -> None:
    from provisioner_testbed import rack

    rack.fault(gb.h.name, B200, ["nvlsm_fail"])
    rack.fault(gb.h.name, "node02", ["imex_degraded"])
    try:
        _wait(gb, B200, "systemctl is-active nvlsm", r"^(failed|inactive)")
        _wait(gb, B200, "nvidia-smi -q", r"State\s+:\s+In Progress")
        _wait(gb, "node02", "systemctl is-active nvidia-imex", r"^(failed|inactive)")
        out = _wait(gb, "node01", "nvidia-imex-ctl -N", r"Domain State: DEGRADED", timeout=90)
        assert re.search(rf"{re.escape(gb.h.hosts['node02'])}\s+- UNAVAILABLE", out), out
        rc, doc = gb.health()
        assert rc != 0
        failed = {n: _failed(doc, n) for n in gb.h.names}
        assert FM_CHECK in failed[B200] and "In Progress" in failed[B200][FM_CHECK], failed[B200]
        assert IMEX_CHECK in failed["node02"], failed["node02"]
        for tray in ("node01", "node03", "node04"):  # the rest of the domain sees it degraded
            assert IMEX_CHECK in failed[tray] and "DEGRADED" in failed[tray][IMEX_CHECK].upper(), failed[tray]
    finally:
        rack.clear(gb.h.name, B200)
        rack.clear(gb.h.name, "node02")
    # the daemons that died stay down after the hardware recovers (as on a node); the site run starts them again
    data = gb.run()
    assert data["rc"] == 0, json.dumps({n: h["failures"] for n, h in data["hosts"].items()}, indent=1)[:4000]
    _wait(gb, "node01", "nvidia-imex-ctl -N", r"Domain State: UP", timeout=90)
    rc, doc = gb.health()
    assert rc == 0, {n: _failed(doc, n) for n in gb.h.names}
