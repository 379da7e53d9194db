"""Host-level rules: messages name the host, the variable, the value found and the fix."""

from __future__ import annotations

from pathlib import Path

from inventory_factory import BASE_INI, DELETE, gpu_nodes
from rules_helpers import findings

from provisioner.rules import Finding


def test_base_inventory_is_clean(tmp_path: Path) -> None:
    assert findings(tmp_path) == []


def test_missing_var_per_host(tmp_path: Path) -> None:
    fs = findings(tmp_path, "HW001", group_vars=gpu_nodes(fabric=DELETE))
    assert {(f.host, f.var) for f in fs} == {("n1", "fabric"), ("n2", "fabric")}
    assert all(f.severity == "error" and "group_vars/gpu_nodes.yml" in f.message for f in fs)


def test_quoted_count_gets_a_hint(tmp_path: Path) -> None:
    (f, _) = findings(tmp_path, "HW002", group_vars=gpu_nodes(gpu_count="8"))
    assert f.var == "gpu_count" and "'8'" in f.message and "without quotes" in f.message


def test_hca_string_gets_list_advice(tmp_path: Path) -> None:
    fs = findings(tmp_path, "HW002", group_vars=gpu_nodes(ib_hcas="mlx5_0,mlx5_1"))
    assert "[mlx5_0, mlx5_1]" in fs[0].message


def test_unknown_gpu_suggests(tmp_path: Path) -> None:
    fs = findings(tmp_path, "HW003", group_vars=gpu_nodes(gpu_model="H100-SXM-80GB"))
    assert "did you mean 'H100-SXM5-80GB'" in fs[0].message


def test_exact_prefix_hca_explains(tmp_path: Path) -> None:
    fs = findings(tmp_path, "HW006", group_vars=gpu_nodes(ib_hcas=["=mlx5_0"]))
    assert "exact-match" in fs[0].message


def test_duplicate_address_names_both(tmp_path: Path) -> None:
    fs = findings(tmp_path, "HW007", ini=BASE_INI.replace("10.0.0.2", "10.0.0.1"))
    assert len(fs) == 1 and fs[0].host == "n2" and "n1" in fs[0].message


def test_same_address_other_port_is_fine(tmp_path: Path) -> None:
    ini = BASE_INI.replace("n2 ansible_host=10.0.0.2", "n2 ansible_host=10.0.0.1 ansible_port=2222")
    assert findings(tmp_path, "HW007", ini=ini) == []


def test_non_gpu_hosts_are_not_checked_for_hardware(tmp_path: Path) -> None:
    assert findings(tmp_path, "HW001", ini=BASE_INI + "\n[lb]\nlb1 ansible_host=10.0.0.9\n") == []


def test_version_float_names_group_once(tmp_path: Path) -> None:
    fs = findings(tmp_path, "VAR001", ini=BASE_INI + "\n[gpu_nodes:vars]\ncuda_version=12.10\n")
    assert [(f.group, f.host, f.var) for f in fs] == [("gpu_nodes", None, "cuda_version")]
    assert "12.1" in fs[0].message and "quote" in fs[0].message


def test_messages_say_where_the_value_was_set(tmp_path: Path) -> None:
    (f, _) = findings(tmp_path, "HW002", group_vars=gpu_nodes(gpu_count="8"))
    lines = (tmp_path / "group_vars" / "gpu_nodes.yml").read_text().splitlines()
    line = 1 + next(i for i, t in enumerate(lines) if t.startswith("gpu_count:"))
    assert f.message.endswith(f"group_vars/gpu_nodes.yml:{line})"), f.message
    (g,) = findings(tmp_path / "b", "NCCL001", ini=BASE_INI.replace("n1 ansible_host=10.0.0.1",
                                                                       "n1 ansible_host=10.0.0.1 nccl_ib_timeout=40"))
    assert g.message.endswith("hosts.ini:2)"), g.message



def test_catalog_overrides_say_what_the_catalog_says(tmp_path: Path) -> None:
    def one(d: str, **gv: object) -> Finding:
        fs = [f for f in findings(tmp_path / d, "HW016", group_vars=gpu_nodes(**gv)) if f.host == "n1"]
        assert len(fs) == 1, fs
        return fs[0]

    f = one("fm-off", gpu_needs_fabric_manager=False)
    assert f.severity == "warning" and "catalog says fabric_manager: true for H100-SXM5-80GB" in f.message
    f = one("imex-on", gpu_needs_imex="yes")
    assert f.severity == "error" and "catalog says imex: false for H100-SXM5-80GB" in f.message
    f = one("names", node_health_gpu_names=["NVIDIA H100 PCIe"])
    assert f.severity == "warning" and "'NVIDIA H100 80GB HBM3'" in f.message
    f = one("count", gpu_model="L40S-48GB", gpu_count=10)
    assert f.severity == "warning" and "at most 8 GPUs per node for L40S-48GB" in f.message
    assert not findings(tmp_path / "jinja", "HW016", group_vars=gpu_nodes(gpu_needs_imex="{{ x | bool }}"))
