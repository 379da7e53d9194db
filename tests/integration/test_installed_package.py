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
    tracked = subprocess.run(["git", "ls-files", "galaxy.yml", "meta", "ansible.cfg", "playbooks", "roles",
                              "plugins", "templates"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
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
    assert "provisioner/_data/plugins/modules/provisioner_apt.py" in names
    # the checkout's link to itself as a collection is not carried (each run links the data root instead)
    assert not [n for n in names if n.startswith("provisioner/_data/collections")]
    # a symlink in the repository (node_health's nodeparse.py is provisioner/probes') is a real file in the install
    link = pkg.site_packages / "provisioner/_data/roles/node_health/files/nodeparse.py"
    assert not link.is_symlink()
    assert link.read_bytes() == (REPO / "provisioner/probes/nodeparse.py").read_bytes()


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


# every command reads the inventory first, and its clusters take their defaults from the one home of shared defaults
SHARED = "roles/provisioner_plan/defaults/main.yml"


@pytest.mark.parametrize(("args", "missing"), [
    (("render", "inventories/rack-a.ini", "--host", "node01"), SHARED),
    (("run", "inventories/rack-a.ini", "--check", "--skip-preflight"), SHARED),
    (("drift", "inventories/rack-a.ini"), SHARED),
    (("monitoring", "inventories/rack-a.ini", "--out", "mon"), SHARED),
    (("health", "inventories/rack-a.ini"), SHARED),
    (("plan", "inventories/rack-a.ini"), SHARED),
])
def test_missing_data_is_one_line_and_exit_2(pkg: Installed, site: Path, tmp_path: Path, args: tuple[str, ...],
                                             missing: str) -> None:
    nodata = tmp_path / "nodata"
    nodata.mkdir()
    r = pkg.provision(*args, cwd=site, env=pkg.env(PROVISION_DATA_DIR=str(nodata), HOME=str(tmp_path / "home")),
                      timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "provisioner data missing" in lines[0], r.stderr
    assert str(nodata / missing) in lines[0]


RUN_CODE = """
import json, sys
from provisioner.runner import run_playbook
r = run_playbook(sys.argv[1], playbook=sys.argv[2], runs_dir=sys.argv[3], progress=None)
print(json.dumps({"rc": r.rc, "failed": [f.message for h in r.hosts.values() for f in h.failures],
                  "error": r.error, "ok": {n: h.ok for n, h in r.hosts.items()}}))
"""


def test_a_run_finds_the_collection_in_the_installed_data(pkg: Installed, site: Path, tmp_path: Path) -> None:
    """The roles call provisioner.gpu.* by FQCN: the installed runner links its data root as that collection in the
    run directory (the repository's own link is not in the wheel), so the module and the filters resolve."""
    # the play runs on the implicit localhost only: rack-a's hosts are never contacted, the filter reads the play's
    # own inventory (hostvars) of them
    play = site / "fqcn.yml"
    play.write_text(
        "- name: The collection from the installed data\n  hosts: localhost\n  connection: local\n"
        f"  gather_facts: false\n  vars:\n    ansible_python_interpreter: {pkg.python}\n  tasks:\n"
        "    - name: The collection's plan action (the installed provisioner package computes it)\n"
        "      provisioner.gpu.provisioner_plan:\n      register: plan\n"
        "    - name: Its balancer/monitoring targets\n      ansible.builtin.copy:\n"
        f"        dest: {tmp_path}/fleet.json\n        mode: '0644'\n"
        "        content: \"{{ plan.plan.targets | to_json }}\"\n"
        "    - name: The collection's module, check mode\n      provisioner.gpu.provisioner_apt:\n"
        "        packages: [dpkg]\n      check_mode: true\n")
    r = subprocess.run([str(pkg.python), "-c", RUN_CODE, "inventories/rack-a.ini", "fqcn.yml", str(tmp_path / "runs")], cwd=site,
                       env=pkg.env(HOME=str(tmp_path / "home")), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["rc"] == 0 and not out["failed"] and out["error"] is None, out
    fleet = json.loads((tmp_path / "fleet.json").read_text())
    assert len(fleet["gpu_nodes"]) == 4 and fleet["heads"], fleet
    run_dir = next(p for p in (tmp_path / "runs").iterdir() if p.is_dir())  # the ledger file lies beside it
    link = run_dir / "collections/ansible_collections/provisioner/gpu"
    assert link.is_symlink() and link.resolve() == pkg.site_packages / "provisioner" / "_data"
