"""roles/node_health/files/node_health.py, run for real (a subprocess) against:

- the testbed's stand-in `nvidia-smi` / `nv-fabricmanager` (provisioner_testbed/packages) reading a resolved hardware
  spec (provisioner_testbed.hwspec) from a temporary HWSIM_DIR, put first on a fake PATH;
- the sysfs-shaped InfiniBand tree (--sysfs-root) and the kmsg-shaped file (--kmsg) that
  provisioner_testbed.hwsim.materialize writes from that spec, as on the simulated rack;
- fake `systemctl` / `journalctl` / `dpkg-query` (the only stand-ins written here: a unit state, a log line, the
  installed kernel module package) and the node's own reboot-required mark (a file in the temp dir);
- and the real outputs captured on an H200 (tests/fixtures/real) replayed by a one-line fake nvidia-smi.
No root, no network.
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

from provisioner import PROJECT_ROOT

PROGRAM = PROJECT_ROOT / "roles" / "node_health" / "files" / "node_health.py"
PACKAGES = PROJECT_ROOT / "provisioner_testbed" / "packages"
REAL = PROJECT_ROOT / "tests" / "fixtures" / "real"
PUB = PROJECT_ROOT / "tests" / "fixtures" / "public"

hwspec = pytest.importorskip("provisioner_testbed.hwspec")
hwsim = pytest.importorskip("provisioner_testbed.hwsim")



def _script(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


class Node:
    """A simulated GPU node in a temp dir: spec, sysfs tree, kmsg file, PATH with the stand-in tools."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = root / "bin"
        self.hwsim = root / "hwsim"
        self.run_dir = root / "run"
        for d in (self.bin, self.hwsim, self.run_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.marker = root / "nvidia.ko"
        self.marker.write_text("")
        pkgroot = root / "pkg"
        for pkg, tool in (("nvidia-utils", "nvidia-smi"), ("nvidia-fabricmanager", "nv-fabricmanager")):
            src = PACKAGES / pkg / "root" / "usr" / "bin" / tool
            dst = pkgroot / "usr" / "bin" / tool
            dst.parent.mkdir(parents=True, exist_ok=True)
            text = src.read_text().replace("@PACKAGE@", pkg).replace("@UPSTREAM@", "580.95.05") \
                .replace("@VERSION@", "580.95.05-1")
            dst.write_text(text)
            lib = pkgroot / "usr" / "lib" / "nvidia-hwsim" / pkg
            lib.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(PACKAGES / "common" / "hwsimrt.py", lib / "hwsimrt.py")
            _script(self.bin / tool, f'#!/bin/sh\nexec "{sys.executable}" "{dst}" "$@"\n')
        self.fm_state = root / "fm-state"
        self.fm_journal = root / "fm-journal"
        self.fm_state.write_text("inactive\n")
        self.fm_journal.write_text("")
        _script(self.bin / "systemctl", f'#!/bin/sh\ns=$(cat "{self.fm_state}"); echo "$s"; '
                                        '[ "$s" = active ] && exit 0 || exit 3\n')
        _script(self.bin / "journalctl", f'#!/bin/sh\ncat "{self.fm_journal}"\n')
        # what dpkg-query -W says of the kernel module package (the role installs and holds it: `hi`); empty = none
        self.dpkg = root / "dpkg-installed"
        self.dpkg.write_text("nvidia-kernel-open-580 hi  580.95.05-1\n")
        _script(self.bin / "dpkg-query", f'#!/bin/sh\ncat "{self.dpkg}"; [ -s "{self.dpkg}" ]\n')
        self.reboot_mark = self.run_dir / "reboot-required"
        self.env = dict(os.environ, PATH=f"{self.bin}:/usr/bin:/bin", HWSIM_DIR=str(self.hwsim),
                        HWSIM_RUN_DIR=str(self.run_dir), HWSIM_MODULE_MARKER=str(self.marker))
        self.spec: dict[str, Any] = {}

    def set_spec(self, **kw: Any) -> dict[str, Any]:
        """Materialize the hardware exactly as the simulated rack does (spec.json, sysfs tree, kmsg, proc files)."""
        kw.setdefault("node", "node01")
        hwsim.materialize(kw, self.hwsim)
        self.spec = json.loads((self.hwsim / "spec.json").read_text())
        return self.spec

    def persistence_on(self) -> None:
        subprocess.run(["nvidia-smi", "-pm", "1"], env=self.env, check=True, capture_output=True)

    def run(self, *args: str, python: str = sys.executable) -> tuple[int, dict[str, dict[str, Any]], str]:
        argv = [python, str(PROGRAM), "--sysfs-root", str(self.hwsim), "--kmsg", str(self.hwsim / "kmsg"),
                "--nccl-conf", str(self.root / "nccl.conf"), "--allreduce", "off",
                "--reboot-required-file", str(self.reboot_mark), "--modinfo", str(self.root / "no-modinfo"), *args]
        p = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=120)
        results = {}
        for line in p.stdout.splitlines():
            if line.startswith("{"):
                r = json.loads(line)
                results[r["check"]] = r
        return p.returncode, results, p.stdout + p.stderr


@pytest.fixture
def node(tmp_path: Path) -> Node:
    if not (PACKAGES / "nvidia-utils" / "root" / "usr" / "bin" / "nvidia-smi").is_file():
        pytest.skip("testbed stand-in nvidia-smi not present")
    return Node(tmp_path)


H100 = ("--gpu-count", "8", "--gpu-name", "NVIDIA H100 80GB HBM3", "--driver", "580.95.05-1",
        "--ib-hca", "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1", "--ib-rate", "400",
        "--fabricmanager", "off")


def statuses(results: dict[str, dict[str, Any]]) -> dict[str, str]:
    return {k: v["status"] for k, v in results.items()}


def test_healthy_node_passes(node: Node) -> None:
    node.set_spec()
    node.persistence_on()
    rc, res, out = node.run(*H100)
    assert rc == 0, out
    st = statuses(res)
    assert st["summary"] == "pass"
    for c in ("gpu", "driver", "reboot", "persistence", "ecc", "xid", "nvlink", "ib"):
        assert st[c] == "pass", (c, res[c])
    assert res["gpu"]["found"]["count"] == 8
    assert res["ib"]["message"].startswith("8 ports ACTIVE")
    assert res["nvlink"]["message"] == "144 links active on 8 GPUs"


def test_acs_on_fails_naming_the_bridge_and_passes_without_it(node: Node) -> None:
    node.set_spec(iommu="passthrough")
    rc, res, out = node.run(*H100, "--only", "acs")
    assert rc == 0 and res["acs"]["status"] == "pass", out
    assert res["acs"]["message"] == "ACS redirect off on 24 bridges; IOMMU passthrough"
    node.set_spec(faults={"acs_on": [3]})
    rc, res, out = node.run(*H100, "--only", "acs")
    assert rc == 1 and res["acs"]["status"] == "fail", out
    assert res["acs"]["message"].startswith("ACS redirect on at bridge 0000:5d:03.0 above GPU 0000:61:00.0 (fix: "
                                            "disable PCIe ACS in the BIOS")
    assert res["acs"]["found"]["redirect"] == [{"bridge": "0000:5d:03.0", "below": ["0000:61:00.0"]}]
    node.set_spec(iommu="translated")
    rc, res, out = node.run(*H100, "--only", "acs")
    assert rc == 0 and res["acs"]["status"] == "warn" and "IOMMU translated (iommu_groups type DMA-FQ)" in \
        res["acs"]["message"], out


def test_missing_gpu(node: Node) -> None:
    node.set_spec(faults={"missing_gpu": 1})
    node.persistence_on()
    rc, res, out = node.run(*H100)
    assert rc == 1
    assert res["gpu"]["status"] == "fail" and res["gpu"]["message"] == "7 GPUs, expected 8"
    assert res["summary"]["failed"] == ["gpu"]


def test_hca_down_and_slow(node: Node) -> None:
    node.set_spec(faults={"hca_down": "mlx5_3", "hca_rate": {"mlx5_5": 200}})
    node.persistence_on()
    rc, res, out = node.run(*H100)
    assert rc == 1
    msg = res["ib"]["message"]
    assert "mlx5_3:1: state DOWN" in msg and "mlx5_3:1: phys_state Polling" in msg
    assert "mlx5_5:1: rate 200 Gb/s, expected 400" in msg
    assert res["summary"]["failed"] == ["ib"]


def test_ib_hca_from_nccl_conf_prefix_and_missing(node: Node) -> None:
    node.set_spec(hcas=2)
    node.persistence_on()
    (node.root / "nccl.conf").write_text("# rendered\nNCCL_IB_HCA==mlx5_0:1,mlx5_9:1\nNCCL_ALGO=Ring\n")
    args = [a for a in H100 if a not in ("--ib-hca",) and not a.startswith("=")]
    rc, res, _ = node.run(*args)
    assert res["ib"]["status"] == "fail" and "mlx5_9: no such HCA" in res["ib"]["message"]
    assert res["ib"]["found"]["source"].endswith("nccl.conf")
    (node.root / "nccl.conf").write_text("NCCL_IB_HCA=mlx5\n")  # prefix: every mlx5_* device
    rc, res, _ = node.run(*args)
    assert res["ib"]["status"] == "pass" and set(res["ib"]["found"]["ports"]) == {"mlx5_0:1", "mlx5_1:1"}



def _netdev(root: Path, name: str, operstate: str, flags: str = "0x1003") -> None:
    d = root / name
    d.mkdir(parents=True)
    (d / "operstate").write_text(operstate + "\n")
    (d / "flags").write_text(flags + "\n")


def test_socket_ifname_exists_and_up(node: Node) -> None:
    """NCCL_SOCKET_IFNAME: an interface it selects must exist and be up (else NCCL: "no socket interface found");
    NCCL's rules: prefix by default, "=" exact, "^" excludes; --socket-ifname, else the environment, else nccl.conf."""
    node.set_spec()
    node.persistence_on()
    net = node.root / "net"
    _netdev(net, "lo", "unknown", "0x9")
    _netdev(net, "host0", "up")
    _netdev(net, "eth10", "down", "0x1002")
    base = (*H100, "--net-dir", str(net), "--only", "socket_ifname")

    rc, res, out = node.run(*base, "--socket-ifname", "=host0")
    assert rc == 0 and res["socket_ifname"]["status"] == "pass", out
    assert res["socket_ifname"]["message"] == "NCCL_SOCKET_IFNAME==host0: host0 up"

    # exact name missing on the node: the bootstrap failure, named
    rc, res, out = node.run(*base, "--socket-ifname", "=ens10f0np0")
    assert rc == 1 and res["summary"]["failed"] == ["socket_ifname"], out
    msg = res["socket_ifname"]["message"]
    assert "NCCL_SOCKET_IFNAME==ens10f0np0 matches no interface" in msg and "host0" in msg
    assert "no socket interface found" in msg

    # "=" is exact: "host" alone matches nothing; without "=" it is a prefix and matches host0
    assert node.run(*base, "--socket-ifname", "=host")[1]["socket_ifname"]["status"] == "fail"
    assert node.run(*base, "--socket-ifname", "host")[1]["socket_ifname"]["status"] == "pass"

    # present but down
    rc, res, _ = node.run(*base, "--socket-ifname", "=eth10")
    assert rc == 1 and res["socket_ifname"]["message"] == "NCCL_SOCKET_IFNAME==eth10: eth10 not up (eth10 down)"

    # comma list: one usable interface is enough, the missing name is a warning
    rc, res, _ = node.run(*base, "--socket-ifname", "=host0,ib9")
    assert rc == 0 and res["socket_ifname"]["status"] == "warn" and "ib9" in res["socket_ifname"]["message"]

    # "^" excludes: everything but host0 and eth* leaves only lo (unknown + IFF_UP counts as up)
    rc, res, _ = node.run(*base, "--socket-ifname", "^host0,eth")
    assert rc == 0 and res["socket_ifname"]["found"]["matching"] == {"lo": "unknown"}
    rc, res, _ = node.run(*base, "--socket-ifname", "^host,eth,lo")
    assert rc == 1 and "matches no interface" in res["socket_ifname"]["message"]

    # from /etc/nccl.conf (what nccl_tuning renders), and not set at all: skipped
    (node.root / "nccl.conf").write_text("NCCL_IB_HCA==mlx5_0:1\nNCCL_SOCKET_IFNAME==eth10\n")
    rc, res, _ = node.run(*base)
    assert res["socket_ifname"]["status"] == "fail" and res["socket_ifname"]["found"]["source"].endswith("nccl.conf")
    # a key twice (bootstrap_interface, then nccl_extra): NCCL takes the first line, so does the check
    (node.root / "nccl.conf").write_text("NCCL_SOCKET_IFNAME==host0\nNCCL_SOCKET_IFNAME==eth10\n")
    rc, res, _ = node.run(*base)
    assert rc == 0 and res["socket_ifname"]["message"] == "NCCL_SOCKET_IFNAME==host0: host0 up"
    (node.root / "nccl.conf").write_text("NCCL_IB_HCA==mlx5_0:1\n")
    rc, res, _ = node.run(*base)
    assert rc == 0 and res["socket_ifname"]["status"] == "skip"


def test_xid79(node: Node) -> None:
    node.set_spec(faults={"xid": [{"gpu": 2, "code": 79}, {"gpu": 0, "code": 13}]})
    node.persistence_on()
    rc, res, _ = node.run(*H100)
    assert rc == 1
    assert res["xid"]["status"] == "fail"
    assert res["xid"]["message"] == "critical XID 79 on 0000:52:00 in the kernel log"  # XID 13 is not critical


def test_xid_public_kmsg_and_missing_log(node: Node, tmp_path: Path) -> None:
    node.set_spec()
    rc, res, _ = node.run("--only", "xid", "--kmsg", str(PUB / "kmsg-xid79.txt"))
    assert res["xid"]["status"] == "fail" and "79 on 0000:9d:00" in res["xid"]["message"]
    rc, res, _ = node.run("--only", "xid", "--kmsg", str(tmp_path / "nope"))
    assert rc == 1 and res["xid"]["message"].startswith("cannot read the kernel log")


def test_ecc_uncorrectable_and_row_remap(node: Node) -> None:
    node.set_spec(faults={"ecc_uncorrectable": {"gpu": 4, "count": 3}, "row_remap_pending": 6})
    node.persistence_on()
    rc, res, _ = node.run(*H100)
    assert rc == 1
    assert res["ecc"]["message"] == "GPU 4: 3 uncorrectable ECC errors; GPU 6: row remap pending (reset the GPU)"


def test_persistence_off(node: Node) -> None:
    node.set_spec(faults={"persistence_off": True})
    rc, res, _ = node.run(*H100)
    assert res["persistence"]["status"] == "fail" and "0,1,2,3,4,5,6,7" in res["persistence"]["message"]


def test_nvlink_down(node: Node) -> None:
    node.set_spec(faults={"nvlink_down": 5})
    node.persistence_on()
    rc, res, _ = node.run(*H100)
    assert res["nvlink"]["status"] == "fail" and res["nvlink"]["message"].startswith("inactive NVLinks: GPU 5 links 0,")


def test_fabric_manager_mismatch(node: Node) -> None:
    node.set_spec(faults={"fm_mismatch": True})
    node.persistence_on()
    node.fm_journal.write_text("[ERROR] fabric manager NVIDIA GPU driver interface version 580.95.05 don't match "
                               "with driver version 580.82.07. Please update with matching NVIDIA driver package.\n")
    args = [a for a in H100 if a not in ("--fabricmanager", "off")]
    rc, res, _ = node.run(*args)
    assert rc == 1
    assert res["driver"]["message"] == "driver 580.82.07, pinned 580.95.05"
    fm = res["fabricmanager"]
    assert fm["status"] == "fail"
    assert "fabric manager version 580.95.05 != driver 580.82.07" in fm["message"]
    assert "nvidia-fabricmanager is inactive" in fm["message"]
    assert "don't match with driver version 580.82.07" in fm["message"]
    # the loaded module is not the installed package either: the node must reboot (issue 28)
    assert res["reboot"]["status"] == "fail" and "reboot the node" in res["reboot"]["message"]


# ------------------------------------------------------------------ reboot pending (issue 28, "first hour", item 3)
MARK = "*** System restart required: NVIDIA kernel module 580.95.05-1 installed (provisioner) ***\n"


def test_reboot_required_mark_fails_the_node_until_it_rebooted(node: Node) -> None:
    """What the nvidia_driver handler writes when the module changed and provision_allow_reboot is false."""
    node.set_spec()
    node.persistence_on()
    node.reboot_mark.write_text(MARK)
    rc, res, out = node.run(*H100)
    assert rc == 1, out
    assert res["summary"]["failed"] == ["reboot"]
    assert res["reboot"]["message"] == (
        f'{node.reboot_mark} exists (written by provisioner\'s nvidia_driver role: "{MARK.strip()}"): reboot the node')
    assert res["reboot"]["found"]["reboot_required_file"] is True
    # the reboot: /run is a tmpfs, the mark is gone; the loaded module already is the installed one
    node.reboot_mark.unlink()
    rc, res, out = node.run(*H100)
    assert rc == 0, out
    assert res["reboot"]["status"] == "pass"
    assert res["reboot"]["message"] == (f"no {node.reboot_mark}; loaded kernel module 580.95.05 == installed driver "
                                        "(nvidia-kernel-open-580 580.95.05-1)")


def test_reboot_required_by_a_package_names_the_packages(node: Node) -> None:
    node.set_spec()
    node.reboot_mark.write_text("*** System restart required ***\n")
    Path(f"{node.reboot_mark}.pkgs").write_text("linux-image-6.1.0-30-amd64\nlinux-base\n")
    rc, res, _ = node.run(*H100, "--only", "reboot")
    assert rc == 1
    assert res["reboot"]["message"] == (f"{node.reboot_mark} exists (written by a package install "
                                        "(linux-image-6.1.0-30-amd64, linux-base): \"*** System restart required "
                                        "***\"): reboot the node")


def test_loaded_module_not_the_installed_driver_fails_until_reboot(node: Node) -> None:
    """The simulated node's loaded module (hwspec `kernel_module_version`) is older than the installed package."""
    node.set_spec(kernel_module_version="580.82.07")
    node.persistence_on()
    rc, res, out = node.run(*H100)
    assert rc == 1, out
    loaded = node.hwsim / "sys" / "module" / "nvidia" / "version"
    assert res["reboot"]["message"] == (
        f"loaded NVIDIA kernel module 580.82.07 ({loaded}) is not the installed driver 580.95.05 "
        "(nvidia-kernel-open-580 580.95.05-1): reboot the node to load it")
    assert res["reboot"]["found"]["loaded"] == {"version": "580.82.07", "source": str(loaded)}
    assert res["reboot"]["found"]["installed"] == {"version": "580.95.05-1",
                                                   "source": "nvidia-kernel-open-580 580.95.05-1"}
    # nvidia-smi reports the loaded module too, so the pinned-driver check says the same from its side
    assert res["summary"]["failed"] == ["driver", "reboot"]
    node.set_spec()  # rebooted: the installed module is the loaded one
    rc, res, out = node.run(*H100)
    assert rc == 0 and res["reboot"]["status"] == "pass", out


def test_loaded_module_from_proc_and_installed_from_modinfo(node: Node) -> None:
    """No /sys/module/nvidia/version: /proc/driver/nvidia/version; no kernel module package (a .run install):
    `modinfo -F version nvidia` (the module file the next boot loads)."""
    node.set_spec(kernel_module_version="580.82.07")
    (node.hwsim / "sys" / "module" / "nvidia" / "version").unlink()
    node.dpkg.write_text("")
    _script(node.root / "modinfo", '#!/bin/sh\n[ "$*" = "-F version nvidia" ] && echo 580.95.05\n')
    rc, res, _ = node.run(*H100, "--only", "reboot", "--modinfo", str(node.root / "modinfo"))
    assert rc == 1
    assert res["reboot"]["message"] == (
        f"loaded NVIDIA kernel module 580.82.07 ({node.hwsim / 'proc' / 'driver' / 'nvidia' / 'version'}) is not the "
        "installed driver 580.95.05 (modinfo nvidia): reboot the node to load it")


def test_no_driver_installed_yet_is_not_a_reboot(node: Node) -> None:
    node.set_spec()
    node.dpkg.write_text("")
    rc, res, _ = node.run(*H100, "--only", "reboot")
    assert rc == 0
    assert res["reboot"]["message"] == (
        f"no {node.reboot_mark} (loaded module not compared: installed driver unknown: no "
        "nvidia-kernel-open-*,nvidia-dkms-* package, modinfo nvidia failed)")


def test_fabric_manager_running(node: Node) -> None:
    node.set_spec()
    node.persistence_on()
    # a live process whose command line names nv-fabricmanager, registered where the stand-in looks for it
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "nv-fabricmanager"])
    try:
        pid = node.run_dir / "nvidia-fabricmanager" / "nv-fabricmanager.pid"
        pid.parent.mkdir(parents=True)
        pid.write_text(f"{proc.pid}\n")
        node.fm_state.write_text("active\n")
        args = [a for a in H100 if a not in ("--fabricmanager", "off")]
        rc, res, out = node.run(*args)
        assert res["fabricmanager"]["status"] == "pass", res["fabricmanager"]
        assert res["fabricmanager"]["found"]["fabric_state"] == ["Completed"]
        assert rc == 0, out
        proc.kill()
        proc.wait()
        rc, res, _ = node.run(*args)  # FM died: fabric state no longer Completed
        assert res["fabricmanager"]["status"] == "fail" and "fabric state Not Started" in res["fabricmanager"]["message"]
    finally:
        proc.kill()


def test_runs_on_system_python(node: Node) -> None:
    """The program targets the node's own python3 (Debian 12: 3.11), not our venv."""
    py = shutil.which("python3", path="/usr/bin:/bin")
    if not py:
        pytest.skip("no system python3")
    node.set_spec()
    node.persistence_on()
    rc, res, out = node.run(*H100, python=py)
    assert rc == 0, out


def test_text_format_and_usage(node: Node) -> None:
    node.set_spec(faults={"missing_gpu": 2})
    node.persistence_on()
    p = subprocess.run([sys.executable, str(PROGRAM), "--format", "text", "--only", "gpu", "--gpu-count", "8"],
                       env=node.env, capture_output=True, text=True)
    assert p.returncode == 1
    assert p.stdout.splitlines()[0].split() == ["gpu", "FAIL", "6", "GPUs,", "expected", "8"]
    p = subprocess.run([sys.executable, str(PROGRAM), "--only", "bogus"], capture_output=True, text=True)
    assert p.returncode == 2 and "Traceback" not in p.stderr


# -------------------------------------------------------------------------- replay of the real H200 captures
REAL2 = PROJECT_ROOT / "tests" / "fixtures" / "real-2xh200"


def _replay_smi(tmp_path: Path, d: Path) -> dict[str, str]:
    """A fake nvidia-smi that prints what the real one printed on the H200 machine for the same arguments."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    table = {
        "--query-gpu=index,name,memory.total,driver_version,persistence_mode,pci.bus_id "
        "--format=csv,noheader,nounits": "query-gpu-full.csv",
        "--query-gpu=index,ecc.mode.current,ecc.errors.uncorrected.volatile.total,remapped_rows.pending,"
        "remapped_rows.failure --format=csv,noheader,nounits": "query-ecc.csv",
        "-q": "smi-q.txt",
        "nvlink --status": "nvlink-status.txt",
    }
    cases = "".join(f'  "{k}") cat "{d / v}";;\n' for k, v in table.items())
    _script(bindir / "nvidia-smi", f'#!/bin/sh\ncase "$*" in\n{cases}  *) echo "unexpected: $*" >&2; exit 2;;\n'
                                   "esac\n")
    return dict(os.environ, PATH=f"{bindir}:/usr/bin:/bin")


def _real_replay_argv(d: Path, tmp_path: Path, count: int) -> list[str]:
    """node_health.py's arguments for a replay of the captures in `d` (nothing else of the machine is read)."""
    return ["--gpu-count", str(count), "--gpu-name", "NVIDIA H200", "--driver", "580.159.04", "--kmsg",
            str(d / "dmesg.txt"), "--allreduce", "off", "--sysfs-root", str(tmp_path), "--nccl-conf",
            str(tmp_path / "none"), "--fabricmanager-bin", str(tmp_path / "no-fm"), "--reboot-required-file",
            str(tmp_path / "no-reboot-required"), "--dpkg-query", str(tmp_path / "no-dpkg"), "--modinfo",
            str(tmp_path / "no-modinfo")]


@pytest.mark.parametrize("d, count, expect", [
    (REAL, 1, {"fabricmanager": "skip", "nvlink": "skip"}),
    # 2x H200 VM: NV18 between the GPUs, fabric Completed/Success, Fabric Manager outside the guest
    (REAL2, 2, {"fabricmanager": "warn", "nvlink": "pass"}),
])
def test_real_h200_outputs(tmp_path: Path, d: Path, count: int, expect: dict[str, str]) -> None:
    env = _replay_smi(tmp_path, d)
    p = subprocess.run([sys.executable, str(PROGRAM), *_real_replay_argv(d, tmp_path, count)],
                       env=env, capture_output=True, text=True)
    res = {json.loads(x)["check"]: json.loads(x) for x in p.stdout.splitlines()}
    assert p.returncode == 0, p.stdout + p.stderr
    assert statuses(res) == {"gpu": "pass", "driver": "pass", "reboot": "pass", "persistence": "pass", "ecc": "pass",
                             "xid": "pass", "ib": "skip", "socket_ifname": "skip", "gpudirect": "skip",
                             "acs": "skip", "allreduce": "skip", "efa": "skip", "nvlsm": "skip", "imex": "skip", "summary": "pass",
                             **expect}
    assert res["gpu"]["found"] == {"count": count, "names": ["NVIDIA H200"], "memory_mib": ["143771"]}


def test_recorded_real_run_is_consistent() -> None:
    """The JSON lines node_health.py printed on the H200 machine (unmodified) parse and say what we claim."""
    lines = [json.loads(x) for x in (REAL / "node_health-pass.jsonl").read_text().splitlines()]
    res = {r["check"]: r for r in lines}
    assert res["summary"]["status"] == "pass"
    assert res["gpu"]["found"] == {"count": 1, "names": ["NVIDIA H200"], "memory_mib": ["143771"]}
    ar = res["allreduce"]["found"]
    assert ar["tool"] == "torch.distributed/nccl" and ar["nccl"] == "2.28.9"
    assert all(s["correct"] for s in ar["sizes"]) and ar["sizes"][-1]["bytes"] == 4 << 30
    assert res["gpudirect"]["status"] == "pass"  # open kernel module on kernel 6.18: DMA-BUF
    pin = (REAL / "node_health-pin.txt").read_text()
    assert "driver         FAIL  driver 580.159.04, pinned 580.95.05" in pin


def test_recorded_2xh200_allreduce() -> None:
    """node_health.py on the lent 2x H200 machine: torch/NCCL all-reduce busbw at 4 GiB (the issue expects ~350)."""
    res = {r["check"]: r for r in map(json.loads, (REAL2 / "node_health-pass.jsonl").read_text().splitlines())}
    ar = res["allreduce"]
    assert ar["status"] == "pass" and ar["found"]["gpus"] == 2
    assert 300 <= ar["found"]["busbw_gbps"] <= 450 and all(s["correct"] for s in ar["found"]["sizes"])
    assert res["nvlink"]["message"] == "36 links active on 2 GPUs"


def test_role_mirrors_the_gpu_catalog() -> None:
    """roles/node_health/vars/main.yml must say what provisioner/catalog/gpus.yaml says (the role runs without it)."""
    import yaml

    from provisioner import catalog

    v = yaml.safe_load((PROJECT_ROOT / "roles" / "node_health" / "vars" / "main.yml").read_text())
    for name, spec in catalog.gpus().items():
        if name in v["__node_health_smi_names"]:
            assert spec.smi_name in v["__node_health_smi_names"][name], name
        assert bool(v["__node_health_nvswitch"].get(name, False)) == bool(spec.nvswitch), name
        if spec.allreduce_busbw_gbps and name in v["__node_health_busbw"]:
            assert v["__node_health_busbw"][name] == spec.allreduce_busbw_gbps, name
        assert v["__node_health_allreduce_gpus"][name] == spec.all_reduce_gpus, name
        assert bool(v["__node_health_nvlsm"].get(name, False)) == spec.nvlsm, name
        assert bool(v["__node_health_imex"].get(name, False)) == spec.imex, name


def test_health_argv_from_inventory() -> None:
    from provisioner import INVENTORIES
    from provisioner.inventory import load_fleet
    from provisioner.probes.health import health_argv, remote_command

    fleet = load_fleet(INVENTORIES / "rack-a.ini")
    argv = health_argv(fleet, fleet.hosts["node01"])
    joined = " ".join(argv)
    assert "--gpu-count 8" in joined and "--gpu-name NVIDIA H100 80GB HBM3" in joined
    assert "--driver 580.95.05-1" in joined and "--fabricmanager required" in joined
    assert "--ib-hca =mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1" in joined
    assert "--busbw-min 460" in joined and "--kmsg" not in joined  # not a simulated host
    assert "--socket-ifname =ens10f0np0" in joined  # bootstrap_interface, exact, as nccl.conf.j2 renders it
    cmd = remote_command(argv, sudo=True, files={"node_health.py": "print(1)\n"})
    last = cmd.splitlines()[-1]
    assert last.startswith('sudo -n python3 -B "$d/node_health.py" --gpu-count 8 ')
    assert "'NVIDIA H100 80GB HBM3'" in last
    # the files land side by side in a temporary directory that is gone afterwards; the program's status is kept
    main = "import os, sys, helper\nprint(sys.argv[1:], helper.X, os.path.dirname(__file__))\nsys.exit(3)\n"
    files = {"helper.py": "X = 'helper'", "main.py": main}
    p = subprocess.run(["bash", "-c", remote_command(["--x", "a b"], sudo=False, files=files)],
                       capture_output=True, text=True)
    args, mod, where = p.stdout.strip().rsplit(" ", 2)
    assert (p.returncode, args, mod) == (3, "['--x', 'a b']", "helper"), p.stdout + p.stderr
    assert not Path(where).exists()


def test_health_reports_from_real_output() -> None:
    """The controller side folds node_health.py's real output (2x H200) into table, JSON and Prometheus."""
    from provisioner.probes.health import parse_output, render_json, render_prometheus, render_text
    from provisioner.probes.ssh import ExecResult

    out = (REAL2 / "node_health-final.jsonl").read_text()
    ok = parse_output("h200x2", ExecResult("h200x2", ok=True, rc=0, stdout=out))
    bad_lines = [json.loads(x) for x in out.splitlines()]
    bad_lines[0] = {**bad_lines[0], "status": "fail", "message": "1 GPUs, expected 2"}
    bad_lines[-1] = {**bad_lines[-1], "status": "fail", "failed": ["gpu"]}
    bad = parse_output("h200b", ExecResult("h200b", ok=True, rc=1, stdout="\n".join(map(json.dumps, bad_lines))))
    gone = parse_output("down1", ExecResult("down1", ok=False, error="connect timed out after 30s"))
    junk = parse_output("junk", ExecResult("junk", ok=True, rc=1, stdout="", stderr="sudo: a password is required"))
    res = {r.host: r for r in (ok, bad, gone, junk)}
    assert ok.ok and not bad.ok and not gone.ok and not junk.ok
    assert "passwordless sudo" in (junk.error or "")
    text = render_text(res)
    assert text.splitlines()[1].split()[:3] == ["h200x2", "PASS", "ok"]
    assert "h200b: gpu: 1 GPUs, expected 2" in text
    assert any(x.split()[:2] == ["down1", "UNREACHABLE"] and x.endswith("connect timed out after 30s")
               for x in text.splitlines())
    assert text.rstrip().endswith("health: 4 hosts, 1 pass, 2 fail, 1 unreachable")
    doc = json.loads(render_json(res))
    assert doc["ok"] is False and doc["hosts"]["h200b"]["failed"] == ["gpu"]
    prom = render_prometheus(res, now=1.0)
    assert 'provisioner_node_health_ok{host="h200x2"} 1' in prom
    assert 'provisioner_node_health_check_ok{host="h200b",check="gpu",status="fail"} 0' in prom
    assert 'provisioner_node_health_allreduce_busbw_gbps{host="h200x2"} 347.02' in prom
    assert 'provisioner_node_health_reachable{host="down1"} 0' in prom


def test_allreduce_off_runs_no_bandwidth_test(tmp_path: Path) -> None:
    """`--allreduce off` skips the check without starting nccl-tests (found on the real 2x H200: it used to run)."""
    env = _replay_smi(tmp_path, REAL2)
    marker = tmp_path / "all_reduce_perf-ran"
    tool = tmp_path / "all_reduce_perf"
    tool.write_text(f"#!/bin/sh\ntouch {marker}\necho '#  Avg bus bandwidth    : 300.0'\n")
    tool.chmod(0o755)
    base = [sys.executable, str(PROGRAM), "--gpu-count", "2", "--gpu-name", "NVIDIA H200", "--driver", "580.159.04",
            "--kmsg", str(REAL2 / "dmesg.txt"), "--sysfs-root", str(tmp_path), "--nccl-conf", str(tmp_path / "none"),
            "--fabricmanager-bin", str(tmp_path / "no-fm"), "--nccl-tests", str(tool), "--only", "allreduce"]
    p = subprocess.run([*base, "--allreduce", "off"], env=env, capture_output=True, text=True)
    res = {json.loads(x)["check"]: json.loads(x) for x in p.stdout.splitlines()}
    assert res["allreduce"]["status"] == "skip" and "off" in res["allreduce"]["message"], p.stdout + p.stderr
    assert not marker.exists()
    p = subprocess.run([*base, "--allreduce", "required"], env=env, capture_output=True, text=True)
    assert marker.exists(), p.stdout + p.stderr  # the same command line without `off` does start it


# -------------------------------------------------------------------------- `required` never passes silently
def _nccl_tests_tool(tmp_path: Path, busbw: float) -> Path:
    """A stand-in all_reduce_perf printing one row of nccl-tests' table (size count type redop root time algbw busbw
    #wrong) at 4 GiB, at the 2x H200's measured busbw (tests/fixtures/real-2xh200: 349.4 GB/s; 2 ranks: algbw ==
    busbw)."""
    tool = tmp_path / "all_reduce_perf"
    row = f"  4294967296  2147483648  bfloat16  sum  -1  12290  {busbw:.2f}  {busbw:.2f}  0"
    _script(tool, "#!/bin/sh\necho '#  size  count  type  redop  root  time  algbw  busbw  #wrong'\n"
                  f"echo '{row}'\necho '# Avg bus bandwidth    : {busbw:.2f}'\n")
    return tool


def _replay(tmp_path: Path, d: Path, count: int, *extra: str) -> tuple[int, dict[str, dict[str, Any]]]:
    tmp_path = tmp_path / f"run{len(list(tmp_path.glob('run*')))}"  # a fresh stand-in directory per run
    tmp_path.mkdir()
    env = _replay_smi(tmp_path, d)
    argv = list(_real_replay_argv(d, tmp_path, count))
    i = argv.index("--allreduce")
    del argv[i:i + 2]
    p = subprocess.run([sys.executable, str(PROGRAM), *argv, *extra], env=env, capture_output=True, text=True)
    assert "Traceback" not in p.stderr, p.stderr
    return p.returncode, {json.loads(x)["check"]: json.loads(x) for x in p.stdout.splitlines()}


def test_required_allreduce_on_one_gpu_fails(tmp_path: Path) -> None:
    """The issue's case: `--allreduce required --busbw-min 100` on the real 1-GPU H200 printed `allreduce SKIP ...
    needs >= 2 GPUs` and `summary PASS`. Now it fails with the reason; `auto` still skips (and says the minimum was
    not checked)."""
    tool = _nccl_tests_tool(tmp_path, 349.4)
    rc, res = _replay(tmp_path, REAL, 1, "--allreduce", "required", "--busbw-min", "100", "--nccl-tests", str(tool))
    ar = res["allreduce"]
    assert (rc, ar["status"], res["summary"]["status"], res["summary"]["failed"]) == (1, "fail", "fail", ["allreduce"])
    assert ar["message"] == "required, but 1 GPU: bus bandwidth needs >= 2 GPUs (--busbw-min 100 cannot be checked)"
    assert ar["found"] == {"gpus": 1}
    rc, res = _replay(tmp_path, REAL, 1, "--allreduce", "required", "--only", "allreduce")
    assert rc == 1 and res["allreduce"]["message"] == "required, but 1 GPU: bus bandwidth needs >= 2 GPUs"
    rc, res = _replay(tmp_path, REAL, 1, "--allreduce", "auto", "--busbw-min", "100", "--nccl-tests", str(tool))
    assert (rc, res["allreduce"]["status"], res["summary"]["status"]) == (0, "skip", "pass")
    assert res["allreduce"]["message"].endswith("bus bandwidth needs >= 2 GPUs (--busbw-min 100 not checked)")


def test_required_allreduce_on_two_gpus(tmp_path: Path) -> None:
    """On the 2x H200 capture `required` passes only when the all-reduce really ran and met the minimum; without a
    tool to run it (no all_reduce_perf, no torch with CUDA here) it fails instead of skipping as `auto` does."""
    rc, res = _replay(tmp_path, REAL2, 2, "--allreduce", "required", "--only", "allreduce",
                      "--nccl-tests", str(tmp_path / "absent"))
    assert (rc, res["allreduce"]["status"]) == (1, "fail")
    assert res["allreduce"]["message"] == "neither nccl-tests (all_reduce_perf) nor torch with CUDA/NCCL found"
    rc, res = _replay(tmp_path, REAL2, 2, "--allreduce", "auto", "--only", "allreduce",
                      "--nccl-tests", str(tmp_path / "absent"))
    assert (rc, res["allreduce"]["status"]) == (0, "skip")
    tool = _nccl_tests_tool(tmp_path, 349.4)
    rc, res = _replay(tmp_path, REAL2, 2, "--allreduce", "required", "--busbw-min", "300", "--nccl-tests", str(tool))
    assert (rc, res["allreduce"]["status"]) == (0, "pass"), res["allreduce"]
    assert res["allreduce"]["found"]["busbw_gbps"] == 349.4
    rc, res = _replay(tmp_path, REAL2, 2, "--allreduce", "required", "--busbw-min", "400", "--nccl-tests", str(tool))
    assert (rc, res["allreduce"]["status"]) == (1, "fail")
    assert res["allreduce"]["message"].startswith("all-reduce busbw 349.4 GB/s < 400.0 GB/s (2 GPUs")


@pytest.mark.parametrize("d, count, auto, required_message", [
    # 1x H200 (PCIe-style, no NVSwitch): nothing to check in auto; required and no Fabric Manager installed
    (REAL, 1, "skip", "nv-fabricmanager not installed; nvidia-fabricmanager is "),  # + this machine's unit state
    # 2x H200 VM: the fabric is Completed/Success but Fabric Manager runs outside the guest: auto warns, required fails
    (REAL2, 2, "warn", "required, but nv-fabricmanager is not on this host (the NVLink fabric is Completed/Success: "
                       "managed outside this OS? then --fabricmanager auto)"),
])
def test_required_fabricmanager(tmp_path: Path, d: Path, count: int, auto: str, required_message: str) -> None:
    rc, res = _replay(tmp_path, d, count, "--allreduce", "off", "--fabricmanager", "auto")
    assert (rc, res["fabricmanager"]["status"]) == (0, auto)
    rc, res = _replay(tmp_path, d, count, "--allreduce", "off", "--fabricmanager", "required")
    fm = res["fabricmanager"]
    assert (rc, fm["status"], res["summary"]["failed"]) == (1, "fail", ["fabricmanager"])
    assert fm["message"].startswith(required_message), fm


def test_required_never_skips(tmp_path: Path) -> None:
    """Every check with a `required` mode, on both real captures and in every way we can make it unable to run:
    never `skip`, never `pass` without having run."""
    p = subprocess.run([sys.executable, str(PROGRAM), "--help"], capture_output=True, text=True)
    flags = ("--fabricmanager", "--allreduce", "--nvlsm", "--imex")
    modes = {flag for flag in flags if f"{flag} {{auto,required,off}}" in p.stdout}
    assert modes == set(flags), p.stdout  # a new check with a required mode: add it here
    for d, count in ((REAL, 1), (REAL2, 2)):
        sub = tmp_path / d.name
        sub.mkdir()
        rc, res = _replay(sub, d, count, "--allreduce", "required", "--fabricmanager", "required",
                          "--nccl-tests", str(sub / "absent"), "--nvlsm", "required", "--imex", "required",
                          "--nvlsm-bin", str(sub / "no-nvlsm"), "--imex-ctl", str(sub / "no-imex-ctl"))
        assert rc == 1 and res["fabricmanager"]["status"] == "fail" and res["allreduce"]["status"] == "fail", res
        assert res["nvlsm"]["status"] == "fail" and res["imex"]["status"] == "fail", res


# -------------------------------------------------------------------------- one copy of the parsers (nodeparse)
FILES = PROGRAM.parent
SHARED = PROJECT_ROOT / "provisioner" / "probes" / "nodeparse.py"


def test_role_ships_the_cli_parser_module() -> None:
    """files/nodeparse.py is the CLI's provisioner/probes/nodeparse.py (a relative symlink, not a second copy), and
    the role installs it next to node_health.py (tasks/install.yml, shared by the main and watch entry points)."""
    import yaml

    link = FILES / "nodeparse.py"
    assert link.is_symlink() and not os.path.isabs(os.readlink(link))
    assert link.resolve() == SHARED.resolve()
    tasks = yaml.safe_load((PROJECT_ROOT / "roles" / "node_health" / "tasks" / "install.yml").read_text())
    for entry in ("main.yml", "watch.yml"):
        imported = yaml.safe_load((PROJECT_ROOT / "roles" / "node_health" / "tasks" / entry).read_text())
        assert {"ansible.builtin.import_tasks": "install.yml"} in [
            {k: v for k, v in t.items() if k == "ansible.builtin.import_tasks"} for t in imported], entry
    install = next(t for t in tasks if "node_health.py" in (t.get("loop") or []))
    assert install["loop"] == ["nodeparse.py", "node_health.py"]
    assert install["ansible.builtin.copy"]["dest"] == "{{ node_health_dir }}/{{ item }}"


@pytest.mark.parametrize("python", ["python3", "python3.9"])
def test_self_contained_without_the_provisioner_package(tmp_path: Path, python: str) -> None:
    """node_health.py runs from a directory holding only the two files the role installs (symlink resolved), on a
    python that cannot import `provisioner` (-E -s -S, empty environment, another working directory): the node's
    python3 (the system one here), and 3.9, the oldest we allow, where installed."""
    py = shutil.which(python, path="/usr/bin:/bin") if python == "python3" else shutil.which(python)
    if py:  # the interpreter itself, not a wrapper (a pyenv shim needs the environment cleared below)
        r = subprocess.run([py, "-c", "import sys; print(sys.executable)"], capture_output=True, text=True)
        py = r.stdout.strip() if r.returncode == 0 else None
    if not py:
        pytest.skip(f"no {python}")
    inst = tmp_path / "usr-local-lib-provisioner"
    inst.mkdir()
    for name in ("nodeparse.py", "node_health.py"):
        shutil.copyfile(FILES / name, inst / name)  # copyfile follows the symlink, as ansible's copy does
    assert sorted(x.name for x in inst.iterdir()) == ["node_health.py", "nodeparse.py"]
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    smi_env = _replay_smi(tmp_path, REAL2)
    env = {"PATH": smi_env["PATH"]}
    iso = [py, "-E", "-s", "-S"]
    p = subprocess.run([*iso, "-c", "import provisioner"], cwd=cwd, env=env, capture_output=True, text=True)
    assert p.returncode != 0 and "ModuleNotFoundError" in p.stderr  # the package is out of reach
    p = subprocess.run([*iso, str(inst / "node_health.py"), *_real_replay_argv(REAL2, tmp_path, 2)], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=120)
    res = {json.loads(x)["check"]: json.loads(x) for x in p.stdout.splitlines()}
    assert p.returncode == 0 and res["summary"]["status"] == "pass", p.stdout + p.stderr
    assert res["nvlink"]["message"] == "36 links active on 2 GPUs"
    (inst / "nodeparse.py").unlink()  # and it does need the module beside it
    p = subprocess.run([*iso, str(inst / "node_health.py"), "--help"], cwd=cwd, env=env, capture_output=True, text=True)
    assert p.returncode == 1 and "No module named 'nodeparse'" in p.stderr


def test_provision_health_command_ships_both_files(tmp_path: Path) -> None:
    """The one SSH exec of `provision health` carries node_health.py and nodeparse.py and runs them as the role lays
    them out (here: run by bash locally, against the replayed 2x H200 outputs)."""
    from provisioner.probes.health import MAX_COMMAND, remote_command

    env = _replay_smi(tmp_path, REAL2)
    cmd = remote_command(_real_replay_argv(REAL2, tmp_path, 2), sudo=False)
    assert len(cmd.encode()) <= MAX_COMMAND
    assert cmd.count("<<'__PROVISIONER_NODE_HEALTH__'") == 2
    p = subprocess.run(["bash", "-c", cmd], env=env, capture_output=True, text=True, timeout=120)
    res = {json.loads(x)["check"]: json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")}
    assert p.returncode == 0 and res["summary"]["status"] == "pass", p.stdout + p.stderr


def _defs(tree: Any) -> set[str]:
    """Names a module defines anywhere: functions, classes, and module-level assignments."""
    import ast

    names = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    for n in tree.body:
        if isinstance(n, (ast.Assign, ast.AnnAssign)):
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                names |= {x.id for x in ast.walk(t) if isinstance(x, ast.Name)}
    return names


def test_parsers_are_defined_once() -> None:
    """No parser of nodeparse is defined again in node_health.py or in provisioner/probes/parsers.py (both import
    it); nodeparse imports only the standard library and parses as Python 3.9 (the oldest node python3 we allow)."""
    import ast

    shared = ast.parse(SHARED.read_text(), feature_version=(3, 9))
    shared_names = {n.name for n in shared.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    shared_names |= {t.id for n in shared.body if isinstance(n, ast.Assign) for t in n.targets
                     if isinstance(t, ast.Name)}
    assert {"parse_smi_q", "parse_query_csv", "parse_nvlink_status", "select_interfaces", "parse_rate"} <= shared_names
    for path in (PROGRAM, PROJECT_ROOT / "provisioner" / "probes" / "parsers.py"):
        tree = ast.parse(path.read_text(), feature_version=(3, 9))
        twice = sorted(_defs(tree) & shared_names)
        assert not twice, f"{path.name} defines {twice} again: import them from nodeparse"
    nh = ast.parse(PROGRAM.read_text())
    assert any(isinstance(n, ast.ImportFrom) and n.module == "nodeparse" for n in nh.body)
    mods = {a.name.split(".")[0] for n in ast.walk(shared) if isinstance(n, ast.Import) for a in n.names}
    mods |= {n.module.split(".")[0] for n in ast.walk(shared) if isinstance(n, ast.ImportFrom) and n.module}
    assert mods <= set(sys.stdlib_module_names) | {"__future__"}, mods - set(sys.stdlib_module_names)
    assert "sys.path" not in PROGRAM.read_text() and "sys.path" not in SHARED.read_text()


def test_health_table_shows_whole_check_names_in_aligned_columns() -> None:
    """`provision health`'s table: every check under its whole name (was cut to 8: `persiste`, `fabricma`), and each
    row's marks end where their header ends."""
    from provisioner.probes.health import CHECK_ORDER, HostHealth, render_text

    checks = [{"check": c, "status": "fail" if c == "persistence" else "pass", "message": "persistence mode off"}
              for c in CHECK_ORDER]
    text = render_text({"node01": HostHealth("node01", True, rc=1, checks=checks, summary={"status": "fail"})})
    head, row = text.splitlines()[:2]
    for c in CHECK_ORDER:
        assert f" {c}" in head, c
    ends = [head.index(c) + len(c) for c in CHECK_ORDER]
    marks = row.split()[2:]
    assert marks == ["FAIL" if c == "persistence" else "ok" for c in CHECK_ORDER]
    pos = 0
    for end, m in zip(ends, marks):
        pos = row.index(m, pos)
        assert pos + len(m) == end, (m, pos, end)
        pos += len(m)


# ------------------------------------------------------------------------------------------ node shapes (issue 18)
def _efa_sysfs(root: Path, names: list[str], down: tuple[str, ...] = ()) -> None:
    for n in names:
        port = root / "sys" / "class" / "infiniband" / n / "ports" / "1"
        port.mkdir(parents=True, exist_ok=True)
        (port / "state").write_text("1: DOWN\n" if n in down else "4: ACTIVE\n")
        (port / "phys_state").write_text("5: LinkUp\n")
        (port / "rate").write_text("100 Gb/sec (4X EDR)\n")
        (port / "link_layer").write_text("Unspecified\n")


def _replay_tool(node: Node, tool: str, fixture: Path, rc: int = 0) -> None:
    _script(node.bin / tool, f'#!/bin/sh\ncat "{fixture}"\nexit {rc}\n')


P5_DEVS = [f"rdmap{b}s0" for r in (79, 96, 113, 130) for b in range(r, r + 8)]


def test_efa_healthy_p5(node: Node) -> None:
    _efa_sysfs(node.hwsim, P5_DEVS)
    _replay_tool(node, "fi_info", PUB / "fi-info-efa-p5.txt")
    rc, res, out = node.run("--only", "efa", "--efa-devices", "32")
    assert rc == 0 and res["efa"]["status"] == "pass", out
    assert len(res["efa"]["found"]["fi_info"]) == 32


def test_efa_missing_device_is_named(node: Node, tmp_path: Path) -> None:
    _efa_sysfs(node.hwsim, [d for d in P5_DEVS if d != "rdmap80s0"], down=("rdmap81s0",))
    text = (PUB / "fi-info-efa-p5.txt").read_text().split("provider: efa\n")
    kept = "".join("provider: efa\n" + b for b in text[1:] if "rdmap80s0" not in b)
    (tmp_path / "fi.txt").write_text(kept)
    _replay_tool(node, "fi_info", tmp_path / "fi.txt")
    rc, res, out = node.run("--only", "efa", "--efa-devices", "32", "--efa-names", "rdmap80s0,rdmap79s0")
    assert rc == 1 and res["efa"]["status"] == "fail", out
    msg = res["efa"]["message"]
    assert "30 of 32 EFA devices ACTIVE" in msg and "rdmap81s0: port state DOWN" in msg
    assert "fi_info -p efa lists 31 of 32" in msg and "missing or down: rdmap80s0" in msg


def test_efa_without_fi_info_or_devices(node: Node) -> None:
    _replay_tool(node, "fi_info", PUB / "fi-info-efa-none.txt", rc=1)
    rc, res, out = node.run("--only", "efa", "--efa-devices", "4")
    assert rc == 1 and "0 of 4 EFA devices" in res["efa"]["message"] and "lists no EFA device" in res["efa"]["message"]
    rc, res, _ = node.run("--only", "efa")
    assert rc == 0 and res["efa"]["status"] == "skip"


def test_nvlsm_required_and_inactive_fails(node: Node) -> None:
    _script(node.bin / "nvlsm", "#!/bin/sh\nexit 0\n")
    rc, res, out = node.run("--only", "nvlsm", "--nvlsm", "required")
    assert rc == 1 and "nvlsm is inactive" in res["nvlsm"]["message"], out
    node.fm_state.write_text("active\n")
    rc, res, out = node.run("--only", "nvlsm", "--nvlsm", "required")
    assert rc == 0 and res["nvlsm"]["status"] == "pass", out
    (node.bin / "nvlsm").unlink()
    assert node.run("--only", "nvlsm")[1]["nvlsm"]["status"] == "skip"
    rc, res, _ = node.run("--only", "nvlsm", "--nvlsm", "required")
    assert rc == 1 and "nvlsm not installed" in res["nvlsm"]["message"]


def test_imex_up_with_channel_passes(node: Node, tmp_path: Path) -> None:
    chans = tmp_path / "imex-channels"
    chans.mkdir()
    (chans / "channel0").write_text("")
    node.fm_state.write_text("active\n")
    _replay_tool(node, "nvidia-imex-ctl", PUB / "imex-ctl-N-up.txt")
    rc, res, out = node.run("--only", "imex", "--imex", "required", "--imex-nodes", "4",
                            "--imex-channel-dir", str(chans))
    assert rc == 0 and res["imex"]["status"] == "pass", out
    rc, res, out = node.run("--only", "imex", "--imex", "required", "--imex-nodes", "18",
                            "--imex-channel-dir", str(chans))
    assert rc == 1 and "4 nodes, expected 18" in res["imex"]["message"], out


def test_imex_degraded_and_no_channel_fail_naming_the_tray(node: Node, tmp_path: Path) -> None:
    node.fm_state.write_text("active\n")
    _replay_tool(node, "nvidia-imex-ctl", PUB / "imex-ctl-N-degraded.txt")
    rc, res, out = node.run("--only", "imex", "--imex-channel-dir", str(tmp_path / "none"))
    assert rc == 1, out
    msg = res["imex"]["message"]
    assert "IMEX domain DEGRADED: not ready 10.50.0.14" in msg and "channel0 missing" in msg
    (node.bin / "nvidia-imex-ctl").unlink()
    assert node.run("--only", "imex")[1]["imex"]["status"] == "skip"


@pytest.mark.parametrize("shape,host,want,unwanted", [
    ("p5-pair", "p5-a", ["--efa-devices 32", "--nvlsm auto", "--imex auto", "--busbw-min 460",
                         "--gpu-name NVIDIA H100 80GB HBM3"], ["--ib-hca", "--imex-nodes", "--socket-ifname"]),
    ("b200-rack", "b200-01", ["--nvlsm required", "--imex auto", "--fabricmanager required", "--busbw-min 650",
                              "--gpu-name NVIDIA B200"], ["--efa-devices"]),
    ("gb200-nvl72", "tray05", ["--imex required", "--imex-nodes 18", "--nvlsm auto", "--fabricmanager auto",
                               "--gpu-count 4", "--busbw-min 650", "--gpu-name NVIDIA GB200"], ["--efa-devices"]),
])
def test_health_argv_per_shape(shape: str, host: str, want: list[str], unwanted: list[str]) -> None:
    """`provision health` asks each shape for its own checks: EFA count, NVLSM, IMEX domain size, the busbw gate of
    the model's full node (4 GPUs on a GB200 tray)."""
    from provisioner.inventory import load_fleet
    from provisioner.probes.health import health_argv

    fleet = load_fleet(PROJECT_ROOT / "inventories" / shape / "hosts.ini")
    joined = " ".join(health_argv(fleet, fleet.hosts[host]))
    assert all(w in joined for w in want), joined
    assert not any(u in joined for u in unwanted), joined


def _prom(text: str) -> dict[str, float]:
    """Samples of a textfile, `name{labels}` -> value (comments dropped)."""
    return {k: float(v) for k, v in (ln.rsplit(" ", 1) for ln in text.splitlines() if ln and not ln.startswith("#"))}


def test_watch_mode_writes_the_fault_signals_for_node_exporter(node: Node, tmp_path: Path) -> None:
    """`--watch` (one round here) writes provisioner_node_fault per fault check into the textfile, nothing else runs
    (no gpu/driver/allreduce checks), nothing on stdout; a live fatal XID and an HCA of NCCL_IB_HCA down turn their
    signals to 1, and the fatal XID's code is a label; XID 13 (not a fatal class) is not."""
    textfile = tmp_path / "prom" / "provisioner_node_watch.prom"
    textfile.parent.mkdir()
    node.set_spec()
    rc, res, out = node.run(*H100, "--watch", "5", "--textfile", str(textfile), "--watch-count", "1")
    assert rc == 0 and res == {}, out
    m = _prom(textfile.read_text())
    assert {k: v for k, v in m.items() if k.startswith("provisioner_node_fault")} == {
        f'provisioner_node_fault{{signal="{c}"}}': 0.0 for c in ("xid", "ecc", "nvlink", "ib", "fabricmanager")}
    assert m["provisioner_node_watch_timestamp_seconds"] > 1.7e9
    node.set_spec(faults={"xid": [{"gpu": 2, "code": 79}, {"gpu": 0, "code": 13}], "hca_down": ["mlx5_3"]})
    rc, _, out = node.run(*H100, "--watch", "5", "--textfile", str(textfile), "--watch-count", "1")
    m = _prom(textfile.read_text())
    assert rc == 0 and m['provisioner_node_fault{signal="xid"}'] == 1.0, textfile.read_text()
    assert m['provisioner_node_fault{signal="ib"}'] == 1.0 and m['provisioner_node_fault{signal="ecc"}'] == 0.0
    assert m['provisioner_node_xid_fatal{xid="79"}'] == 1.0 and 'provisioner_node_xid_fatal{xid="13"}' not in m
    assert [p.name for p in textfile.parent.iterdir()] == [textfile.name]  # the temporary file renamed, none left


def test_watch_needs_its_textfile(node: Node, tmp_path: Path) -> None:
    node.set_spec()
    for extra in (("--watch", "5"), ("--textfile", str(tmp_path / "x.prom")), ("--watch", "0", "--textfile", "x")):
        rc, _, out = node.run(*extra)
        assert rc == 2 and "--watch SECONDS (> 0) and --textfile FILE go together" in out, out
