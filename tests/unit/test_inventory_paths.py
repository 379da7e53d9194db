"""An inventory path is resolved as `ansible-playbook -i` resolves it, from any working directory (issue 28, item 1):
a relative, a `./` and an absolute path to the same file (or directory) give the same variables, group_vars/
included, in validate, render and the shared loaders of run/drift/preflight/health."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cli_inproc import provision
from provisioner import INVENTORIES
from provisioner.commands.common import load_run_targets, load_targets
from provisioner.inventory import load_fleet


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A copy of inventories/ (rack-a.ini + group_vars/, and the directory inventory b200-rack/), plus an empty
    sibling directory to run from."""
    shutil.copytree(INVENTORIES, tmp_path / "inv")
    (tmp_path / "elsewhere").mkdir()
    return tmp_path


# (working directory under the site, the path given) -> all name inventories/rack-a.ini
RACK_A = [("inv", "rack-a.ini"), ("inv", "./rack-a.ini"), ("elsewhere", "../inv/rack-a.ini"),
          ("elsewhere", "{site}/inv/rack-a.ini"), (".", "inv/rack-a.ini")]
B200 = [("inv", "b200-rack"), ("inv", "./b200-rack/"), ("elsewhere", "../inv/b200-rack"),
        ("elsewhere", "{site}/inv/b200-rack")]


def _arg(site: Path, path: str) -> str:
    return path.format(site=site)


@pytest.mark.parametrize(("cwd", "path"), RACK_A + B200)
def test_validate_reads_group_vars_from_any_working_directory(site: Path, cwd: str, path: str) -> None:
    p = provision("validate", _arg(site, path), cwd=site / cwd)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "HW001" not in p.stdout
    assert ": valid (0 error(s)" in p.stdout


@pytest.mark.parametrize(("cwd", "path"), RACK_A)
def test_render_reads_group_vars_from_any_working_directory(site: Path, cwd: str, path: str) -> None:
    p = provision("render", _arg(site, path), "--host", "node01", cwd=site / cwd)
    assert p.returncode == 0, p.stderr
    assert "NCCL_IB_HCA==mlx5_0:1" in p.stdout
    assert "NCCL_SOCKET_IFNAME==ens10f0np0" in p.stdout
    assert "# ==> /etc/vllm/vllm.env" in p.stdout


@pytest.mark.parametrize(("cwd", "path"), RACK_A)
def test_shared_loaders_of_run_drift_preflight_health(site: Path, cwd: str, path: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(site / cwd)
    fleet, _, _, targeted = load_run_targets(Path(_arg(site, path)), None, None, None, None)  # run, drift
    assert fleet.hosts["node01"].vars["gpu_model"] == "H100-SXM5-80GB"
    assert set(fleet.clusters) == {"qwen2_72b", "llama31_70b", "mixtral"}
    assert "node01" in targeted
    fleet, hosts = load_targets(Path(_arg(site, path)), None, 10.0, 4)  # preflight, health
    assert fleet.hosts["node04"].vars["fabric"] and hosts
    assert fleet.source.is_absolute()


def test_same_relative_path_in_two_working_directories(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ansible-core caches vars-plugin lookups per directory string: a second load of `rack-a.ini` from another
    directory must read that directory's group_vars/, not the first one's (nor none)."""
    other = site / "other"
    other.mkdir()
    shutil.copy(site / "inv" / "rack-a.ini", other / "rack-a.ini")  # no group_vars/ here
    monkeypatch.chdir(site / "inv")
    assert load_fleet("rack-a.ini").hosts["node01"].vars.get("gpu_model") == "H100-SXM5-80GB"
    monkeypatch.chdir(other)
    assert load_fleet("rack-a.ini").hosts["node01"].vars.get("gpu_model") is None
    (other / "group_vars").mkdir()  # created after a lookup found none: still read
    shutil.copy(site / "inv" / "group_vars" / "gpu_nodes.yml", other / "group_vars" / "gpu_nodes.yml")
    assert load_fleet("rack-a.ini").hosts["node01"].vars.get("gpu_model") == "H100-SXM5-80GB"
    monkeypatch.chdir(site / "inv")
    assert load_fleet("./rack-a.ini").hosts["node01"].vars.get("gpu_model") == "H100-SXM5-80GB"


def test_symlinked_inventory_reads_group_vars_beside_the_link(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As `ansible-playbook -i link.ini`: group_vars/ beside the link, not beside its target."""
    linked = site / "linked"
    linked.mkdir()
    (linked / "rack.ini").symlink_to(site / "inv" / "rack-a.ini")
    monkeypatch.chdir(linked)
    assert load_fleet("rack.ini").hosts["node01"].vars.get("gpu_model") is None
    assert load_fleet(site / "inv" / "rack-a.ini").hosts["node01"].vars.get("gpu_model") == "H100-SXM5-80GB"
