"""The EFA instance-shape rule (HW017): an EFA node is an AWS instance of a known shape, and efa_device_count must be
that shape's count (provisioner/catalog/instances.yaml)."""

from __future__ import annotations

from pathlib import Path

from inventory_factory import DELETE, gpu_nodes
from rules_helpers import findings

from provisioner import catalog

EFA = {"fabric": "efa", "ib_hcas": DELETE, "efa_device_count": 32, "efa_installer_sha256": "0" * 64,
       "efa_installer_url": "https://mirror.example/efa/aws-efa-installer-1.43.2.tar.gz"}


def test_h100_on_efa_is_a_p5_with_32_devices(tmp_path: Path) -> None:
    fs = findings(tmp_path, "HW017", group_vars=gpu_nodes(**{**EFA, "efa_device_count": 16}))
    assert {f.host for f in fs} == {"n1", "n2"}
    f = fs[0]
    assert f.severity == "error" and f.var == "efa_device_count" and f.host in ("n1", "n2")
    assert "efa_device_count = 16" in f.message and "p5.48xlarge (32 EFA devices)" in f.message
    assert "set efa_device_count: 32" in f.message


def test_h200_is_a_p5e_or_a_p5en(tmp_path: Path) -> None:
    h200 = {**EFA, "gpu_model": "H200-SXM-141GB"}
    assert findings(tmp_path, "HW017", group_vars=gpu_nodes(**{**h200, "efa_device_count": 16})) == []
    assert findings(tmp_path / "b", "HW017", group_vars=gpu_nodes(**h200)) == []
    fs = findings(tmp_path / "c", "HW017", group_vars=gpu_nodes(**{**h200, "efa_device_count": 8}))
    assert fs and "p5e.48xlarge (32 EFA devices) or a p5en.48xlarge (16 EFA devices)" in fs[0].message
    fs = findings(tmp_path / "d", "HW017", group_vars=gpu_nodes(**{**h200, "aws_instance_type": "p5en.48xlarge"}))
    assert fs and "a p5en.48xlarge has 16 EFA devices" in fs[0].message


def test_instance_type_must_be_known_and_carry_the_hosts_gpus(tmp_path: Path) -> None:
    fs = findings(tmp_path, "HW017", group_vars=gpu_nodes(**{**EFA, "aws_instance_type": "p5.48xl"}))
    assert fs and fs[0].var == "aws_instance_type" and "did you mean 'p5.48xlarge'" in fs[0].message
    fs = findings(tmp_path / "b", "HW017", group_vars=gpu_nodes(**{**EFA, "aws_instance_type": "p6-b200.48xlarge"}))
    assert fs and "8 x B200-SXM-180GB" in fs[0].message and "8 x H100-SXM5-80GB" in fs[0].message


def test_an_unknown_gpu_shape_is_only_a_warning(tmp_path: Path) -> None:
    (f, *_) = findings(tmp_path, "HW017", group_vars=gpu_nodes(**{**EFA, "gpu_count": 4}))
    assert f.severity == "warning" and "4 x H100-SXM5-80GB" in f.message


def test_instance_catalog_names_catalog_gpus() -> None:
    gpus = catalog.gpus()
    for s in catalog.instances().values():
        assert s.gpu_model is None or s.gpu_model in gpus, s
        assert 1 <= s.efa_devices <= 32 and 1 <= s.gpu_count <= 8
    assert {n: s.efa_devices for n, s in catalog.instances().items() if n.startswith("p5")} == {
        "p5.48xlarge": 32, "p5e.48xlarge": 32, "p5en.48xlarge": 16}
