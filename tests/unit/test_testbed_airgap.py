"""provisioner_testbed/airgap.py's inventory steps (benchmarks/bundle_bench.py --rack): the rack's inventory cut to
the GPU nodes with a mirror host, then pointed at a bundle (no proxy, the bundle's site variables)."""

from __future__ import annotations

from pathlib import Path

import yaml

from provisioner_testbed import airgap


def _rack_inventory(tmp_path: Path) -> Path:
    d = tmp_path / "rack"
    (d / "group_vars").mkdir(parents=True)
    (d / "hosts.ini").write_text("[gpu_nodes]\nnode01 ansible_host=198.18.9.11 node_rank=0\n\n[vllm_pp]\nnode01\n")
    (d / "group_vars" / "all.yml").write_text(
        "apt_proxy: http://198.18.9.1:3128\nnvidia_repo_url: https://198.18.9.1:8091/\n"
        "nvidia_repo_key_url: https://198.18.9.1:8091/key.gpg\nnvidia_repo_key_fingerprints:\n- " + "A" * 40 + "\n"
        "provision_site: testbed-x\n")
    (d / "group_vars" / "gpu_nodes.yml").write_text("gpu_count: 8\n")
    (d / "group_vars" / "vllm_pp.yml").write_text("vllm_cluster: {}\n")
    return d / "hosts.ini"


def test_the_plain_inventory_keeps_the_gpu_nodes_and_names_the_mirror(tmp_path: Path) -> None:
    inv = airgap.plain_inventory(_rack_inventory(tmp_path), tmp_path / "out", "node01")
    assert inv.read_text() == "[gpu_nodes]\nnode01 ansible_host=198.18.9.11 node_rank=0\n\n[bundle_mirror]\nnode01\n"
    assert sorted(p.name for p in (inv.parent / "group_vars").iterdir()) == ["all.yml", "gpu_nodes.yml"]
    assert "[bundle_mirror]" not in airgap.plain_inventory(_rack_inventory(tmp_path / "b"), tmp_path / "o2",
                                                           None).read_text()


def test_pointing_at_the_bundle_drops_the_proxy_and_the_racks_repo(tmp_path: Path) -> None:
    inv = airgap.plain_inventory(_rack_inventory(tmp_path), tmp_path / "out", "node01")
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "site-vars.yml").write_text("nvidia_repo_url: http://198.18.9.11:8091/apt/debian12/\n"
                                          "nvidia_repo_key_fingerprints: [" + "B" * 40 + "]\n")
    airgap.point_at_bundle(inv.parent, bundle)
    got = yaml.safe_load((inv.parent / "group_vars" / "all.yml").read_text())
    assert "apt_proxy" not in got and "nvidia_repo_key_url" not in got
    assert got["nvidia_repo_url"] == "http://198.18.9.11:8091/apt/debian12/"
    assert got["nvidia_repo_key_fingerprints"] == ["B" * 40]
    assert got["bundle_mirror_source"] == str(bundle) and got["provision_site"] == "testbed-x"
    assert airgap.table_name("bundle2-bench") == "provisioner_airgap_bundle2_bench"
