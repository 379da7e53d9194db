"""The stand-in NVIDIA apt repository: real .debs, a signed flat repo apt accepts, resolution like NVIDIA's repo.

Builds the repo once into a temp cache (needs dpkg-deb, apt-ftparchive, gpg, gpgv, apt-get, dpkg: no root, no
network), then checks it with the real tools.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from provisioner_testbed import hwsim, repo

PINNED = {  # docs/development.md "Pinned NVIDIA stack"
    "nvidia-open-580": ["580.105.08-1", "580.95.05-1"],  # 580.105.08: a rolling driver upgrade (sorted as strings)
    "nvidia-kernel-open-580": ["580.105.08-1", "580.95.05-1"],
    "nvidia-utils-580": ["580.105.08-1", "580.95.05-1"],
    "nvidia-persistenced": ["580.105.08-1", "580.95.05-1"],
    "nvidia-fabricmanager-580": ["580.105.08-1", "580.82.07-1", "580.95.05-1"],
    "libnvidia-nscq-580": ["580.105.08-1", "580.82.07-1", "580.95.05-1"],
    "cuda-cudart-12-8": ["12.8.90-1"],
    "libnccl2": ["2.27.7-1+cuda12.8"],
    "libnccl-dev": ["2.27.7-1+cuda12.8"],
    "datacenter-gpu-manager-4-core": ["1:4.4.1-1"],
    "nvlsm": ["580.95.05-1"],  # HGX B200 (roles/nvlsm defaults: the driver's version)
    "libnvsdm-580": ["580.95.05-1"],
    "nvidia-imex-580": ["580.95.05-1"],  # GB200 trays (roles/imex: the driver's exact version)
}
TOOLS = ("dpkg-deb", "apt-ftparchive", "gpg", "gpgv", "apt-get", "dpkg")
pytestmark = pytest.mark.skipif(any(shutil.which(t) is None for t in TOOLS),
                                reason="needs dpkg-dev/apt-utils/gnupg (installed by .ci/run)")

# A dpkg status file saying the base packages the stand-ins depend on are installed (hermetic apt/dpkg runs).
BASE_STATUS = "".join(
    f"Package: {name}\nStatus: install ok installed\nPriority: optional\nSection: misc\nMaintainer: seed <s@x>\n"
    f"Version: {version}\nArchitecture: amd64\nDescription: seeded\n\n"
    for name, version in (("python3", "3.11.2-1+b1"), ("passwd", "1:4.13+dfsg1-1")))


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def served(cache: Path) -> Path:
    return repo.ensure_repo(cache)


def stanzas(text: str) -> list[dict[str, str]]:
    out = []
    for block in text.strip().split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            if line[:1] not in (" ", "\t") and ":" in line:
                k, v = line.split(":", 1)
                fields[k] = v.strip()
        out.append(fields)
    return out


def test_repo_holds_every_pinned_package_at_its_version(served: Path) -> None:
    pkgs = stanzas((served / "Packages").read_text())
    found: dict[str, list[str]] = {}
    for p in pkgs:
        found.setdefault(p["Package"], []).append(p["Version"])
        assert p["Architecture"] in ("amd64", "all")
        assert (served / p["Filename"]).is_file()
    assert {k: sorted(v) for k, v in found.items()} == PINNED
    by = {(p["Package"], p["Version"]): p for p in pkgs}
    assert by[("nvidia-open-580", "580.95.05-1")]["Depends"] == (
        "nvidia-kernel-open-580 (= 580.95.05-1), nvidia-utils-580 (= 580.95.05-1)")
    assert "libnvidia-nscq-580 (= 580.82.07-1)" in by[("nvidia-fabricmanager-580", "580.82.07-1")]["Depends"]
    assert by[("libnccl-dev", "2.27.7-1+cuda12.8")]["Depends"] == "libnccl2 (= 2.27.7-1+cuda12.8)"


def test_release_is_signed_by_the_exported_key_and_tampering_is_caught(served: Path, tmp_path: Path) -> None:
    keyring = served / repo.KEYRING
    ok = subprocess.run(["gpgv", "--keyring", str(keyring), str(served / "InRelease")], capture_output=True)
    assert ok.returncode == 0, ok.stderr
    ok = subprocess.run(["gpgv", "--keyring", str(keyring), str(served / "Release.gpg"), str(served / "Release")],
                        capture_output=True)
    assert ok.returncode == 0, ok.stderr
    assert keyring.read_bytes()[:1] != b"-"  # binary keyring, usable with signed-by=
    tampered = tmp_path / "Release"
    tampered.write_text((served / "Release").read_text().replace("Origin: provisioner-testbed", "Origin: x"))
    bad = subprocess.run(["gpgv", "--keyring", str(keyring), str(served / "Release.gpg"), str(tampered)],
                         capture_output=True)
    assert bad.returncode != 0
    release = (served / "Release").read_text()
    assert "Packages.gz" in release and "SHA256:" in release


def test_second_call_reuses_the_build_and_a_source_change_rebuilds(cache: Path, served: Path,
                                                                   tmp_path: Path) -> None:
    link = cache / "nvidia-repo" / "nvidia"
    assert os.readlink(link) == f"builds/{served.name}"
    stamp = (served / "InRelease").stat().st_mtime_ns
    assert repo.ensure_repo(cache) == served
    assert os.readlink(link) == f"builds/{served.name}" and (served / "InRelease").stat().st_mtime_ns == stamp

    # A changed package source (copied tree) gives another source hash.
    src = tmp_path / "packages"
    shutil.copytree(repo.SOURCES, src)
    assert repo.source_hash(src) == repo.source_hash()
    (src / "nvidia-utils" / "root" / "usr" / "bin" / "nvidia-smi").write_text("#!/bin/sh\n")
    assert repo.source_hash(src) != repo.source_hash()


def test_identical_sources_build_identical_debs(tmp_path: Path) -> None:
    pkg = next(p for p in repo.load_manifest() if p.name == "nvidia-utils-580")
    a = repo.build_deb(pkg, tmp_path / "wa", _mk(tmp_path / "a"))
    b = repo.build_deb(pkg, tmp_path / "wb", _mk(tmp_path / "b"))
    assert a.read_bytes() == b.read_bytes()


def _mk(p: Path) -> Path:
    p.mkdir(parents=True)
    return p


def _apt(tmp_path: Path, served: Path) -> list[str]:
    root = tmp_path / "apt"
    for d in ("lists/partial", "cache/archives/partial", "etc/parts"):
        (root / d).mkdir(parents=True)
    (root / "status").write_text(BASE_STATUS)
    (root / "etc" / "sources.list").write_text(
        f"deb [signed-by={served / repo.KEYRING}] file:{served.resolve()}/ /\n")
    opts = [f"Dir::State::Lists={root}/lists", f"Dir::State::status={root}/status", f"Dir::Cache={root}/cache",
            f"Dir::Etc::SourceList={root}/etc/sources.list", f"Dir::Etc::SourceParts={root}/etc/parts",
            f"Dir::Etc::Preferences={root}/etc/preferences", f"Dir::Etc::PreferencesParts={root}/etc/parts",
            "APT::Sandbox::User=root" if os.geteuid() == 0 else "APT::Sandbox::User=", "Debug::NoLocking=1",
            "Acquire::AllowInsecureRepositories=false"]
    return [x for o in opts for x in ("-o", o)]


def test_apt_verifies_the_repo_and_resolves_the_driver_like_nvidias_repo(served: Path, tmp_path: Path) -> None:
    o = _apt(tmp_path, served)
    upd = subprocess.run(["apt-get", *o, "update"], capture_output=True, text=True)
    assert upd.returncode == 0 and "NO_PUBKEY" not in upd.stderr and "not signed" not in upd.stderr, upd.stderr
    # The role names every driver package at its exact version (unpinned, apt takes the newest: 580.105.08).
    pin = "=580.95.05-1"
    sim = subprocess.run(["apt-get", *o, "install", "-s", f"nvidia-kernel-open-580{pin}", f"nvidia-open-580{pin}",
                          f"nvidia-utils-580{pin}", f"nvidia-fabricmanager-580{pin}", f"libnvidia-nscq-580{pin}",
                          f"nvidia-persistenced{pin}",
                          "libnccl-dev", "datacenter-gpu-manager-4-core", "cuda-cudart-12-8"],
                         capture_output=True, text=True)
    assert sim.returncode == 0, sim.stdout + sim.stderr
    inst = dict(re.findall(r"^Inst (\S+) \((\S+) ", sim.stdout, re.M))
    assert inst == {
        "nvidia-open-580": "580.95.05-1", "nvidia-kernel-open-580": "580.95.05-1",
        "nvidia-utils-580": "580.95.05-1", "nvidia-fabricmanager-580": "580.95.05-1",
        "libnvidia-nscq-580": "580.95.05-1", "nvidia-persistenced": "580.95.05-1",
        "libnccl-dev": "2.27.7-1+cuda12.8", "libnccl2": "2.27.7-1+cuda12.8",
        "datacenter-gpu-manager-4-core": "1:4.4.1-1", "cuda-cudart-12-8": "12.8.90-1"}
    # The older Fabric Manager (mismatch rehearsal): its exact-version nscq must be named too, as with NVIDIA's repo.
    old = subprocess.run(["apt-get", *o, "install", "-s", "nvidia-fabricmanager-580=580.82.07-1"],
                         capture_output=True, text=True)
    assert old.returncode != 0 and "Depends: libnvidia-nscq-580 (= 580.82.07-1)" in old.stdout
    old = subprocess.run(["apt-get", *o, "install", "-s", "nvidia-fabricmanager-580=580.82.07-1",
                          "libnvidia-nscq-580=580.82.07-1"], capture_output=True, text=True)
    assert "Inst libnvidia-nscq-580 (580.82.07-1" in old.stdout, old.stdout + old.stderr
    assert "W: " not in sim.stderr + old.stderr
    # Unpinned, apt takes the newest driver, with its own exact-version kernel module and tools (the upgrade).
    new = subprocess.run(["apt-get", *o, "install", "-s", "nvidia-open-580"], capture_output=True, text=True)
    assert dict(re.findall(r"^Inst (\S+) \((\S+) ", new.stdout, re.M)) == {
        "nvidia-open-580": "580.105.08-1", "nvidia-kernel-open-580": "580.105.08-1",
        "nvidia-utils-580": "580.105.08-1"}, new.stdout + new.stderr


def test_dpkg_installs_the_driver_into_a_root_and_nvidia_smi_answers_from_the_spec(served: Path,
                                                                                    tmp_path: Path) -> None:
    root = tmp_path / "root"
    for d in ("info", "updates", "triggers"):
        (root / "var/lib/dpkg" / d).mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text(BASE_STATUS)
    (root / "var/lib/dpkg/available").write_text("")
    debs = [str(next(served.glob(f"{n}_580.95.05-1_amd64.deb")))
            for n in ("nvidia-kernel-open-580", "nvidia-utils-580", "nvidia-open-580")]
    dpkg = ["dpkg", f"--root={root}", "--force-script-chrootless", "--force-not-root", "--log=/dev/null"]
    res = subprocess.run([*dpkg, "-i", *debs], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    marker = root / "usr/lib/modules" / platform.release() / "updates/dkms/nvidia.ko"
    assert marker.is_file()  # the postinst stand-in for the DKMS build
    assert (root / "usr/src/nvidia-580.95.05/dkms.conf").is_file()

    spec_dir = tmp_path / "hwsim"
    hwsim.materialize({}, spec_dir)
    env = {**os.environ, "HWSIM_DIR": str(spec_dir), "HWSIM_RUN_DIR": str(tmp_path / "run"),
           "HWSIM_MODULE_MARKER": str(marker)}
    smi = subprocess.run([str(root / "usr/bin/nvidia-smi"), "--query-gpu=index,name,driver_version",
                          "--format=csv,noheader"], capture_output=True, text=True, env=env)
    assert smi.returncode == 0, smi.stdout + smi.stderr
    assert smi.stdout.splitlines()[0] == "0, NVIDIA H100 80GB HBM3, 580.95.05"

    res = subprocess.run([*dpkg, "-r", "nvidia-open-580", "nvidia-kernel-open-580"], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert not marker.exists()
    gone = subprocess.run([str(root / "usr/bin/nvidia-smi")], capture_output=True, text=True, env=env)
    assert gone.returncode == 9 and "couldn't communicate with the NVIDIA driver" in gone.stdout


def test_package_contents_follow_the_real_layout(served: Path) -> None:
    def contents(name: str) -> str:
        deb = next(served.glob(f"{name}_*.deb"))
        return subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True).stdout

    assert re.search(r"^-rwxr-xr-x root/root .* \./usr/bin/nvidia-smi$", contents("nvidia-utils-580"), re.M)
    fm = contents("nvidia-fabricmanager-580_580.95.05-1")
    assert "./usr/bin/nv-fabricmanager" in fm and "./lib/systemd/system/nvidia-fabricmanager.service" in fm
    assert "./usr/share/nvidia/nvswitch/fabricmanager.cfg" in fm
    assert "./lib/systemd/system/nvidia-persistenced.service" in contents("nvidia-persistenced")
    nccl = contents("libnccl2")
    assert "./usr/lib/x86_64-linux-gnu/libnccl.so.2 -> libnccl.so.2.27.7" in nccl
    dcgm = contents("datacenter-gpu-manager-4-core")
    assert "./usr/bin/dcgmi" in dcgm and "./usr/bin/nv-hostengine" in dcgm
    deb = next(served.glob("libnccl-dev_*.deb"))
    header = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True).stdout
    assert b"#define NCCL_MAJOR 2\n" in header and b"#define NCCL_MINOR 27\n" in header
    assert b"#define NCCL_PATCH 7\n" in header


def test_no_gpg_agent_is_left_running(cache: Path, served: Path) -> None:
    home = str(cache / "nvidia-repo" / "gnupg")
    agents = [p for p in Path("/proc").glob("[0-9]*") if _cmdline(p).startswith("gpg-agent") and home in _cmdline(p)]
    assert agents == []


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_missing_tool_is_a_clear_usage_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no tools at all
    with pytest.raises(repo.RepoError, match="apt-get install .*apt-utils.*gnupg"):
        repo.ensure_repo(tmp_path / "cache")


def test_efa_installer_tarball_is_served_with_its_sha256(served: Path, tmp_path: Path) -> None:
    """The stand-in EFA installer: a real tarball beside the repo (the layout of aws-efa-installer), its sha256 in a
    side file the inventory writer reads, and an installer script that refuses to run without -y."""
    import hashlib
    import tarfile

    version = repo.efa_installer()[0]
    tarball = served / repo.EFA_DIR / repo.efa_tarball_name(version)
    digest, name = (served / repo.EFA_DIR / (tarball.name + ".sha256")).read_text().split()
    assert name == tarball.name and hashlib.sha256(tarball.read_bytes()).hexdigest() == digest
    with tarfile.open(tarball) as tar:
        names = set(tar.getnames())
        tar.extractall(tmp_path, filter="data")
    assert {"aws-efa-installer/efa_installer.sh", "aws-efa-installer/README"} <= names
    debs = sorted(n.split("/")[-1].split("_")[0] for n in names if n.endswith(".deb"))
    assert debs == ["efa-config", "libfabric1-aws", "libnccl-ofi"]
    script = tmp_path / "aws-efa-installer" / "efa_installer.sh"
    assert f'VERSION="{version}"' in script.read_text()
    bad = subprocess.run(["bash", str(script), "--no-such-flag"], capture_output=True, text=True)
    assert bad.returncode == 1 and "Unknown option: --no-such-flag" in bad.stderr
    contents = subprocess.run(["dpkg-deb", "-c", str(next((tmp_path / "aws-efa-installer" / "DEBS").glob("libnccl-ofi_*")))],
                              capture_output=True, text=True, check=True).stdout
    assert "./opt/amazon/ofi-nccl/lib/libnccl-ofi-tuner.so" in contents
    assert "./opt/amazon/ofi-nccl/lib/libnccl-net.so -> libnccl-net-ofi.so" in contents
