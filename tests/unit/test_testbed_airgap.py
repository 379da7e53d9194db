"""provisioner_testbed/airgap.py's inventory steps (benchmarks/bundle_bench.py --rack): the rack's inventory cut to
the GPU nodes with a mirror host, then pointed at a bundle (no proxy, the bundle's site variables)."""

from __future__ import annotations

from pathlib import Path

import pytest
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


def test_the_mirror_gets_a_certificate_from_the_rack_ca_and_its_key_vaulted(tmp_path: Path) -> None:
    """The rack's CA (the one its inventory gives the nodes) issues the mirror's certificate; the key reaches the
    inventory only vaulted."""
    import ssl

    from ansible.parsing.vault import VaultLib, VaultSecret
    from cryptography import x509

    from provisioner_testbed import tls

    ca = tmp_path / "repo-tls"
    tls.ensure(ca, "198.18.9.1", "test CA")
    assert oct((ca / "ca.key").stat().st_mode & 0o777) == "0o600"
    cert, key = tls.issue(ca, "198.18.9.11", tmp_path / "issued")
    assert tls.issue(ca, "198.18.9.11", tmp_path / "issued") == (cert, key)  # made once
    assert oct((tmp_path / "issued" / "server.key").stat().st_mode & 0o777) == "0o600"
    c = x509.load_pem_x509_certificate(cert.encode())
    root = x509.load_pem_x509_certificate((ca / "ca.pem").read_bytes())
    c.verify_directly_issued_by(root)
    assert [str(a) for a in c.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            .get_values_for_type(x509.IPAddress)] == ["198.18.9.11"]
    ctx = ssl.create_default_context(cafile=str(ca / "ca.pem"))  # the pair loads as nginx would load it
    ctx.load_cert_chain(tmp_path / "issued" / "server.pem", tmp_path / "issued" / "server.key")
    pw = tmp_path / "pw"
    pw.write_text("s3cret\n")
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    f = airgap.mirror_tls(inv, cert, key, pw)
    text = f.read_text()
    body = key.splitlines()[1]
    assert body not in text and "$ANSIBLE_VAULT" in text
    doc = yaml.load(text, Loader=_VaultLoader)
    assert doc["bundle_mirror_tls_certificate"] == cert
    lib = VaultLib([("default", VaultSecret(b"s3cret"))])
    assert lib.decrypt(doc["bundle_mirror_tls_key"].encode()).decode() == key


class _VaultLoader(yaml.SafeLoader):
    pass


_VaultLoader.add_constructor("!vault", lambda loader, node: loader.construct_scalar(node))


def test_an_example_inventory_is_rewritten_to_the_rack(tmp_path: Path) -> None:
    ex = tmp_path / "example"
    (ex / "group_vars").mkdir(parents=True)
    (ex / "site.ini").write_text("# a site\n[gpu_nodes]\nnode01 ansible_host=10.20.0.11\n; off\n"
                                 "node02 ansible_host=10.20.0.12 note=x\n\n[c1]\nnode01 node_rank=0\n")
    (ex / "group_vars" / "gpu_nodes.yml").write_text("gpu_count: 4\nbootstrap_interface: ens10f0np0\nnccl_algo: Ring\n")
    rack = _rack_inventory(tmp_path)
    (rack.parent / "hosts.ini").write_text("[gpu_nodes]\nnode01 ansible_host=198.18.9.11\n"
                                           "node02 ansible_host=198.18.9.12\n")
    (rack.parent / "group_vars" / "gpu_nodes.yml").write_text("gpu_count: 8\nbootstrap_interface: host0\n")
    hosts = {"node01": "198.18.9.11", "node02": "198.18.9.12", "lb01": "198.18.9.20"}
    inv = airgap.shaped_like(ex / "site.ini", rack, hosts, tmp_path / "out", "lb01")
    text = inv.read_text()
    assert "10.20.0." not in text  # the example's addresses are never used
    assert text.splitlines()[1:] == ["[gpu_nodes]", "node01 ansible_host=198.18.9.11",
                                     "node02 ansible_host=198.18.9.12 note=x", "", "[bundle_mirror]",
                                     "lb01 ansible_host=198.18.9.20"]
    gv = yaml.safe_load((inv.parent / "group_vars" / "gpu_nodes.yml").read_text())
    assert gv == {"gpu_count": 4, "bootstrap_interface": "host0", "nccl_algo": "Ring"}
    assert sorted(p.name for p in (inv.parent / "group_vars").iterdir()) == ["all.yml", "gpu_nodes.yml"]
    assert "provision_site: testbed-x" in (inv.parent / "group_vars" / "all.yml").read_text()  # the rack's
    (ex / "site.ini").write_text("[gpu_nodes]\nnode09 ansible_host=10.20.0.19\n")
    with pytest.raises(RuntimeError, match="host node09 is not in the rack"):
        airgap.shaped_like(ex / "site.ini", rack, hosts, tmp_path / "out2", "lb01")


def _vllm_rack_inventory(tmp_path: Path) -> Path:
    d = tmp_path / "rack"
    (d / "group_vars").mkdir(parents=True)
    (d / "hosts.ini").write_text(
        "[gpu_nodes]\nnode01 ansible_host=198.18.9.11 node_rank=0\nnode02 ansible_host=198.18.9.12 node_rank=1\n"
        "node03 ansible_host=198.18.9.13 node_rank=0\n\n[vllm_pp]\nnode01\nnode02\n\n[vllm_single]\nnode03\n\n"
        "[lb]\nlb01 ansible_host=198.18.9.14\n\n[monitoring]\nlb01\n")
    (d / "group_vars" / "all.yml").write_text("apt_proxy: http://198.18.9.1:3128\nvllm_device: cpu\n")
    for g in ("gpu_nodes", "vllm_pp", "vllm_single", "monitoring"):
        (d / "group_vars" / f"{g}.yml").write_text(f"# {g}\n---\nx_{g}: 1\n")
    return d / "hosts.ini"


def test_the_vllm_site_inventory_is_one_node_its_cluster_and_a_mirror(tmp_path: Path) -> None:
    inv = airgap.vllm_site_inventory(_vllm_rack_inventory(tmp_path), tmp_path / "out", "node03", "vllm_single",
                                     "node01", ["torchvision"])
    assert inv.read_text() == ("[gpu_nodes]\nnode03 ansible_host=198.18.9.13 node_rank=0\n\n[vllm_single]\nnode03\n\n"
                               "[bundle_mirror]\nnode01 ansible_host=198.18.9.11\n")
    gv = inv.parent / "group_vars"
    assert sorted(p.name for p in gv.iterdir()) == ["all.yml", "gpu_nodes.yml", "vllm_single.yml"]
    assert yaml.safe_load((gv / "all.yml").read_text())["vllm_pip_remove_packages"] == ["torchvision"]
    assert yaml.safe_load((gv / "vllm_single.yml").read_text()) == {"x_vllm_single": 1,
                                                                   "vllm_launch_require_in_service": False}


def test_the_vllm_site_inventory_refuses_a_shared_cluster_or_an_unknown_host(tmp_path: Path) -> None:
    rack = _vllm_rack_inventory(tmp_path)
    with pytest.raises(RuntimeError, match=r"node01 is not the only member of \[vllm_pp\]"):
        airgap.vllm_site_inventory(rack, tmp_path / "o1", "node01", "vllm_pp", "lb01", [])
    with pytest.raises(RuntimeError, match="no host node09"):
        airgap.vllm_site_inventory(rack, tmp_path / "o2", "node03", "vllm_single", "node09", [])
