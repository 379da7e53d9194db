"""The installed package is a working tool: the wheel of this checkout, installed into a fresh venv, run from a
directory that holds nothing but an inventory (tests/unit/installed_wheel.py builds and installs it, ~30 s with the
wheelhouse filled; marker `package`: part of `make test` and `make test-unit`, `-m 'not package'` leaves it out).

- The wheel carries the Ansible side (ansible.cfg, playbooks/, roles/ with their filter plugins and files,
  templates/) under provisioner/_data/, symlinks as real files.
- `provision validate` and `provision render` work from the empty directory, and render gives byte for byte what
  the checkout's render gives.
- Run directories and the fact cache go to the per-user state directory, not into site-packages.
- With the data missing, every command that needs it says which file in one line and exits 2.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from installed_wheel import REPO, Installed, installed

pytestmark = pytest.mark.package

CHECKOUT_PROVISION = str(Path(sys.executable).with_name("provision"))
RACK_A = REPO / "inventories" / "rack-a.ini"


@pytest.fixture(scope="session")
def pkg(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    return installed(tmp_path_factory.mktemp("wheel"))


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """An empty working directory with only a copy of inventories/rack-a.ini and its group_vars/."""
    d = tmp_path / "site"
    (d / "inventories").mkdir(parents=True)
    shutil.copy(RACK_A, d / "inventories" / "rack-a.ini")
    shutil.copytree(REPO / "inventories" / "group_vars", d / "inventories" / "group_vars")
    return d


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_wheel_carries_the_ansible_side(pkg: Installed) -> None:
    names = set(zipfile.ZipFile(pkg.wheel).namelist())
    tracked = subprocess.run(["git", "ls-files", "ansible.cfg", "playbooks", "roles", "templates"], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout.split()
    missing = [p for p in tracked if f"provisioner/_data/{p}" not in names]
    assert not missing, f"not in the wheel: {missing}"
    assert "provisioner/catalog/gpus.yaml" in names
    # the simulated rack: its own top-level package in the same wheel (stand-in package sources included), none of
    # it inside the product package
    testbed = subprocess.run(["git", "ls-files", "provisioner_testbed"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    assert "provisioner_testbed/packages/packages.toml" in testbed
    assert not [p for p in testbed if p not in names], "testbed files not in the wheel"
    assert not [n for n in names if n.startswith("provisioner/testbed/")]
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    # a symlink in the repository (monitoring's filter plugin is serving_lb's) is a real file in the install
    link = pkg.site_packages / "provisioner/_data/roles/monitoring/filter_plugins/provisioner_fleet.py"
    assert not link.is_symlink()
    assert link.read_bytes() == (REPO / "roles/serving_lb/filter_plugins/provisioner_fleet.py").read_bytes()


def test_installed_testbed_builds_the_same_standin_repo(pkg: Installed, site: Path) -> None:
    """The installed stand-in package sources (content and executable bits) hash as the checkout's do: a rack
    brought up from the wheel serves the same repository."""
    code = "import provisioner_testbed.repo as r; print(r.SOURCES); print(r.source_hash())"
    got = subprocess.run([str(pkg.python), "-c", code], cwd=site, env=pkg.env(), capture_output=True, text=True,
                         timeout=120)
    assert got.returncode == 0, got.stderr
    sources, digest = got.stdout.split()
    assert Path(sources) == pkg.site_packages / "provisioner_testbed" / "packages"
    from provisioner_testbed import repo
    assert digest == repo.source_hash()


def test_fresh_venv_does_not_see_the_checkout(pkg: Installed, site: Path) -> None:
    seen = pkg.probe(site)
    assert Path(seen["file"]) == pkg.site_packages / "provisioner" / "__init__.py"
    assert seen["checkout"] is False
    assert Path(seen["data_root"]) == pkg.site_packages / "provisioner" / "_data"
    assert not [p for p in seen["sys_path"] if p and Path(p).resolve() == REPO]


def test_validate_and_render_from_a_directory_with_only_an_inventory(pkg: Installed, site: Path,
                                                                      tmp_path: Path) -> None:
    v = pkg.provision("validate", "inventories/rack-a.ini", "--format", "json", cwd=site)
    assert v.returncode == 0, v.stdout + v.stderr
    doc = json.loads(v.stdout)
    assert doc["ok"] is True and doc["errors"] == []

    out = tmp_path / "installed"
    r = pkg.provision("render", "inventories/rack-a.ini", "--host", "node01", "--out", str(out), cwd=site)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    ref = tmp_path / "checkout"
    c = subprocess.run([CHECKOUT_PROVISION, "render", str(RACK_A), "--host", "node01", "--out", str(ref)],
                       capture_output=True, text=True, cwd=REPO, timeout=300)
    assert c.returncode == 0, c.stderr
    got, want = _tree(out), _tree(ref)
    assert "etc/nccl.conf" in got and "etc/systemd/system/vllm.service" in got, sorted(got)
    assert b"NCCL_IB_HCA=" in got["etc/nccl.conf"]
    assert got == want

    # the printed form too (the first thing an operator runs)
    p = pkg.provision("render", "inventories/rack-a.ini", "--host", "node01", cwd=site)
    assert p.returncode == 0 and "# ==> /etc/nccl.conf" in p.stdout, p.stderr


def test_state_goes_to_a_per_user_directory(pkg: Installed, site: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    seen = pkg.probe(site, pkg.env(HOME=str(home)))
    assert seen["runs"] == str(home / ".local/state/provisioner/runs")
    assert seen["facts"] == str(home / ".local/state/provisioner/facts.d")
    seen = pkg.probe(site, pkg.env(HOME=str(home), XDG_STATE_HOME=str(tmp_path / "xdg")))
    assert seen["runs"] == str(tmp_path / "xdg/provisioner/runs")
    seen = pkg.probe(site, pkg.env(HOME=str(home), PROVISION_STATE_DIR=str(tmp_path / "st")))
    assert (seen["runs"], seen["facts"]) == (str(tmp_path / "st/runs"), str(tmp_path / "st/facts.d"))


@pytest.mark.parametrize(("args", "missing"), [
    (("render", "inventories/rack-a.ini", "--host", "node01"), "roles/nccl_tuning/defaults/main.yml"),
    (("run", "inventories/rack-a.ini", "--check", "--skip-preflight"), "playbooks/site.yml"),
    (("drift", "inventories/rack-a.ini"), "playbooks/site.yml"),
    (("monitoring", "inventories/rack-a.ini", "--out", "mon"), "roles/monitoring"),
    (("health", "inventories/rack-a.ini"), None),  # reads the program files (nodeparse.py first) before any connection
])
def test_missing_data_is_one_line_and_exit_2(pkg: Installed, site: Path, tmp_path: Path, args: tuple[str, ...],
                                             missing: str | None) -> None:
    nodata = tmp_path / "nodata"
    nodata.mkdir()
    r = pkg.provision(*args, cwd=site, env=pkg.env(PROVISION_DATA_DIR=str(nodata), HOME=str(tmp_path / "home")),
                      timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "provisioner data missing" in lines[0], r.stderr
    assert str(nodata / (missing or "roles/node_health/files/nodeparse.py")) in lines[0]
