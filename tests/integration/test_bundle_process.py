"""`provision bundle build|verify` and `provision run --bundle`, as processes, offline: the upstreams are the rack's
stand-in NVIDIA repository and a local signed stand-in of Debian's archive (tests/support/bundle_sources.py), the
wheels a local directory. Checks the real outcomes with the real tools: apt resolves every package the inventory
needs from the bundle's repository alone (signed by the bundle key), pip installs vLLM from its PEP 503 index alone,
a second build is the same manifest and a version bump fetches only what changed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from bundle_sources import debian_repo, wheel

from provisioner_testbed import repo as standin

PROVISION = str(Path(sys.executable).with_name("provision"))
# pip sees only what the test gives it (this machine's pip config names indexes and find-links of its own)
ENV = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "NO_COLOR": "1", "COLUMNS": "200"}


def _fpr(key: Path, home: Path) -> str:
    out = subprocess.run(["gpg", "--homedir", str(home), "--batch", "--with-colons",
                          "--show-keys", str(key)], capture_output=True, text=True, check=True).stdout
    return next(line.split(":")[9] for line in out.splitlines() if line.startswith("fpr:"))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> dict:
    d = tmp_path_factory.mktemp("site")
    nvidia = standin.ensure_repo(d / "cache")
    (d / ".gpg-show").mkdir(mode=0o700)
    deb, deb_key = debian_repo(d / "debian")
    wheels = d / "wheels"
    wheel(wheels, "vllm", "0.32.0", ("tinydep>=1",))
    wheel(wheels, "tinydep", "1.0")
    inv = d / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.ini").write_text("[gpu_nodes]\nnode01 ansible_host=198.18.0.11 node_rank=0\n\n[qwen]\nnode01\n")
    key = nvidia / "testbed-archive-keyring.gpg"
    (inv / "group_vars" / "gpu_nodes.yml").write_text(
        "gpu_model: H100-SXM5-80GB\ngpu_count: 1\nfabric: infiniband\nbootstrap_interface: eth0\nib_hcas: [mlx5_0]\n"
        "nvidia_driver_install_headers: false\n"
        f"nvidia_repo_url: file:{nvidia}/\nnvidia_repo_key_url: file:{key}\n"
        f"nvidia_repo_key_fingerprints: [{_fpr(key, d / '.gpg-show')}]\n")
    (inv / "group_vars" / "qwen.yml").write_text(
        "vllm_cluster: {model: Qwen/Qwen2-7B-Instruct, model_arch: Qwen2-7B, tensor_parallel_size: 1}\n")
    args = ["--no-suite", "--apt-source", f"deb [signed-by={deb_key}] file:{deb}/ /", "--find-links", str(wheels),
            "--no-index", "--key-home", str(d / "bundle-key"), "--mirror-url", "https://198.18.0.1:8091/"]
    return {"dir": d, "inv": inv / "hosts.ini", "args": args, "nvidia": nvidia}


def provision(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROVISION, *args], capture_output=True, text=True, env=ENV, timeout=600)


@pytest.fixture(scope="module")
def built(site: dict) -> Path:
    out = site["dir"] / "bundle"
    res = provision("bundle", "build", str(site["inv"]), "--out", str(out), *site["args"])
    assert res.returncode == 0, res.stderr
    assert re.search(r"signing key fingerprint: [0-9A-F]{40}", res.stdout)
    return out


def _manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def test_the_manifest_lists_the_pinned_packages_their_closure_and_the_wheels(built: Path) -> None:
    arts = {(a["kind"], a["name"]): a for a in _manifest(built)["artifacts"]}
    drv = arts[("deb", "nvidia-open-580")]
    assert drv["version"] == "580.95.05-1" and drv["roles"] == ["nvidia_driver"]
    assert drv["origin"].startswith("file:") and len(drv["sha256"]) == 64
    assert arts[("deb", "nvidia-fabricmanager-580")]["roles"] == ["fabric_manager"]
    # closure: nvidia-utils depends on python3, python3 on libpython3-stub (neither asked for by a role)
    assert "nvidia_driver" in arts[("deb", "libpython3-stub")]["roles"]
    assert arts[("deb", "python3.11-venv")]["roles"] == ["vllm"]  # python3-venv's dependency
    assert ("deb", "nvidia-imex-580") not in arts  # H100: no IMEX
    assert arts[("wheel", "vllm")]["version"] == "0.32.0" and ("wheel", "tinydep") in arts
    site_vars = (built / "site-vars.yml").read_text()
    assert f"nvidia_repo_key_fingerprints: [{_manifest(built)['key_fingerprint']}]" in site_vars
    assert 'vllm_pip_index_url: "https://198.18.0.1:8091/python/simple/"' in site_vars


def test_apt_resolves_every_needed_package_from_the_bundle_alone(built: Path, tmp_path: Path) -> None:
    root = tmp_path / "apt"
    for d in ("etc/apt/preferences.d", "etc/apt/sources.list.d", "var/lib/apt/lists/partial", "cache/partial"):
        (root / d).mkdir(parents=True)
    (root / "status").write_text("")
    repo = built / "apt" / "debian12"
    (root / "etc/apt/sources.list").write_text(f"deb [signed-by={repo}/bundle-archive-keyring.gpg] file:{repo}/ /\n")
    opts = ["-o", f"Dir={root}", "-o", f"Dir::State::status={root}/status", "-o", "Debug::NoLocking=1",
            "-o", f"Dir::Cache::archives={root}/cache", "-o", "APT::Sandbox::User=root",
            "-o", "Dir::Etc::trusted=/dev/null", "-o", f"Dir::Etc::trustedparts={root}"]
    upd = subprocess.run(["apt-get", *opts, "update"], capture_output=True, text=True)
    assert upd.returncode == 0 and "W:" not in upd.stderr, upd.stderr  # signed by the key it carries
    needs = [n for n in _manifest(built)["needs"] if n["kind"] == "apt"]
    pkgs = [f"{n['name']}={n['version']}" if n["version"] else n["name"] for n in needs]
    sim = subprocess.run(["apt-get", *opts, "install", "-s", "-y", *pkgs], capture_output=True, text=True)
    assert sim.returncode == 0, sim.stdout + sim.stderr
    assert "Inst nvidia-open-580 (580.95.05-1" in sim.stdout


def test_pip_installs_vllm_from_the_bundle_index_alone(built: Path, tmp_path: Path) -> None:
    page = (built / "python" / "simple" / "vllm" / "index.html").read_text()
    assert re.search(r'href="\.\./\.\./wheels/vllm-0\.32\.0-py3-none-any\.whl#sha256=[0-9a-f]{64}"', page)
    res = subprocess.run([sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-d",
                          str(tmp_path), "--index-url", (built / "python" / "simple").as_uri() + "/", "vllm==0.32.0"],
                         capture_output=True, text=True, env=ENV)
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tinydep-1.0-py3-none-any.whl",
                                                          "vllm-0.32.0-py3-none-any.whl"]


def test_verify_passes_and_catches_a_changed_file_and_an_unsigned_index(built: Path, site: dict,
                                                                       tmp_path: Path) -> None:
    ok = provision("bundle", "verify", str(built), str(site["inv"]))
    assert ok.returncode == 0, ok.stderr
    assert "complete for" in ok.stderr
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(built), str(copy)], check=True)
    deb = next((copy / "apt" / "debian12").glob("nftables_*.deb"))
    deb.write_bytes(deb.read_bytes()[:-1] + b"\0")
    (copy / "apt" / "debian12" / "Packages").write_text("")
    bad = provision("bundle", "verify", str(copy))
    assert bad.returncode == 1
    assert f"apt/debian12/{deb.name}: sha256" in bad.stderr
    assert "Packages: not the one InRelease signs" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_the_same_inputs_give_the_same_manifest(built: Path, site: dict) -> None:
    again = site["dir"] / "again"
    res = provision("bundle", "build", str(site["inv"]), "--out", str(again), *site["args"])
    assert res.returncode == 0, res.stderr
    assert (again / "manifest.json").read_bytes() == (built / "manifest.json").read_bytes()
    res = provision("bundle", "build", str(site["inv"]), "--out", str(again), *site["args"])
    assert res.returncode == 0 and ", 0 fetched, 0 changed," in res.stderr, res.stderr


def test_a_version_bump_is_refused_by_run_then_fetched_alone_by_a_rebuild(built: Path, site: dict) -> None:
    out = site["dir"] / "bump"
    subprocess.run(["cp", "-a", str(built), str(out)], check=True)
    debian_before = {p.name: p.stat().st_ino for p in (out / "apt" / "debian12").glob("python3*.deb")}
    bump = ["-e", "nvidia_driver_version=580.105.08-1"]
    run = provision("run", str(site["inv"]), "--bundle", str(out), *bump)
    assert run.returncode == 1
    assert ("apt package nvidia-open-580=580.105.08-1 is not in the bundle (role nvidia_driver, release debian12, "
            "hosts node01; the bundle has 580.95.05-1)") in run.stderr
    assert "preflight" not in run.stderr and "refusing to run: the bundle lacks 6 items" in run.stderr

    gv = site["inv"].parent / "group_vars" / "gpu_nodes.yml"
    text = gv.read_text()
    try:
        gv.write_text(text + 'nvidia_driver_version: "580.105.08-1"\n')
        res = provision("bundle", "build", str(site["inv"]), "--out", str(out), *site["args"])
        assert res.returncode == 0, res.stderr
        assert "+ apt/debian12/nvidia-open-580_580.105.08-1_amd64.deb" in res.stdout
        assert "- apt/debian12/nvidia-open-580_580.95.05-1_amd64.deb" in res.stdout
        changed = [ln for ln in res.stdout.splitlines() if ln.startswith("+ ")]
        assert len(changed) == 6 and ", 6 fetched, 12 changed," in res.stderr, res.stdout + res.stderr
        # what did not change was not fetched again (the same files, not rewritten)
        assert {p.name: p.stat().st_ino for p in (out / "apt" / "debian12").glob("python3*.deb")} == debian_before
        assert provision("bundle", "verify", str(out), str(site["inv"])).returncode == 0
    finally:
        gv.write_text(text)


@pytest.mark.package
def test_the_suite_installs_from_the_bundle_in_a_network_namespace_with_no_route(site: dict, tmp_path: Path) -> None:
    from installed_wheel import installed, wheelhouse

    wheel = installed(tmp_path / "wheel").wheel  # fills the offline wheelhouse with the suite's dependencies once
    out = site["dir"] / "with-suite"
    args = [a for a in site["args"] if a != "--no-suite"]
    res = provision("bundle", "build", str(site["inv"]), "--out", str(out), *args, "--find-links", str(wheelhouse()),
                    "--suite-wheel", str(wheel))
    assert res.returncode == 0, res.stderr
    kinds = {(a["kind"], a["name"]) for a in _manifest(out)["artifacts"]}
    assert ("wheel", "provisioner") in kinds and ("collection", "provisioner.gpu") in kinds
    assert ("wheel", "ansible_core") in kinds  # the suite's dependencies, for the controller's Python
    venv, coll = tmp_path / "venv", tmp_path / "collections"
    tarball = next((out / "suite").glob("*.tar.gz"))
    script = (f"set -e; ip -o route; {sys.executable} -m venv {venv}; "
              f"{venv}/bin/pip install -q --disable-pip-version-check --index-url "
              f"{(out / 'python' / 'simple').as_uri()}/ provisioner; {venv}/bin/provision --version; "
              f"{venv}/bin/ansible-galaxy collection install --offline --force -p {coll} {tarball}")
    r = subprocess.run(["unshare", "--user", "--map-root-user", "--net", "sh", "-c", script], capture_output=True,
                       text=True, env=ENV, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.startswith("provision"), r.stdout  # `ip -o route` printed nothing: no route at all
    assert (coll / "ansible_collections" / "provisioner" / "gpu" / "MANIFEST.json").is_file()
