"""NCCL rules, including the NCCL_ALGO grammar as a pure function."""

from __future__ import annotations

from pathlib import Path

import pytest

from inventory_factory import DELETE, gpu_nodes
from provisioner.rules.nccl import algo_problems
from rules_helpers import findings


@pytest.mark.parametrize("value", ["Ring", "ring,tree", "^NVLS", "NVLSTree", "PAT", "allreduce:ring;broadcast:tree",
                                   "allreduce:^nvls,collnetdirect;allgather:ring"])
def test_valid_algo(value: str) -> None:
    assert algo_problems(value) == []


@pytest.mark.parametrize(("value", "needle"), [("Rings", "did you mean 'ring'"), ("allreduce:foo", "'foo'"),
                                               ("allreduc:ring", "unknown collective"), (5, "expected a string"),
                                               ("", "expected a string")])
def test_invalid_algo(value: object, needle: str) -> None:
    assert any(needle in p for p in algo_problems(value))


def test_timeout_bounds(tmp_path: Path) -> None:
    assert findings(tmp_path / "a", "NCCL001", group_vars=gpu_nodes(nccl_ib_timeout=0))
    assert not findings(tmp_path / "b", "NCCL001", group_vars=gpu_nodes(nccl_ib_timeout=1))
    fs = findings(tmp_path / "c", "NCCL001", group_vars=gpu_nodes(nccl_ib_timeout=True))
    assert fs and "bool" in fs[0].message


def test_defaults_apply_when_unset(tmp_path: Path) -> None:
    # nothing set: nccl_algo Ring, timeout 22, retry 7 -> no finding
    assert [f for f in findings(tmp_path) if f.code.startswith("NCCL")] == []


EFA = {"fabric": "efa", "ib_hcas": DELETE, "efa_device_count": 32, "efa_installer_sha256": "0" * 64,
       "efa_installer_url": "https://mirror.example/efa/aws-efa-installer-1.43.2.tar.gz"}


def test_managed_key_in_nccl_extra_names_the_variable(tmp_path: Path) -> None:
    fs = findings(tmp_path, "NCCL006", group_vars=gpu_nodes(nccl_extra={"NCCL_IB_HCA": "=mlx5_0:1"}))
    assert [f.host for f in fs] == ["n1", "n2"]
    f = fs[0]
    assert f.severity == "error" and f.var == "nccl_extra"
    assert "NCCL_IB_HCA" in f.message and "set ib_hcas" in f.message and "first" in f.message
    assert "gpu_nodes.yml:" in f.message  # where nccl_extra is set


def test_tuner_plugin_is_managed_on_efa_only(tmp_path: Path) -> None:
    extra = {"NCCL_TUNER_PLUGIN": "/opt/x/libtuner.so"}
    assert not findings(tmp_path / "ib", "NCCL006", group_vars=gpu_nodes(nccl_extra=extra))
    fs = findings(tmp_path / "efa", "NCCL006", group_vars=gpu_nodes(**EFA, nccl_extra=extra))
    assert fs and "efa_nccl_tuner" in fs[0].message


def test_ib_keys_on_efa_are_refused_once(tmp_path: Path) -> None:
    fs = findings(tmp_path, group_vars=gpu_nodes(**EFA, nccl_extra={"NCCL_IB_HCA": "=mlx5_0", "NCCL_IB_SL": 1}))
    codes = sorted(f.code for f in fs if f.code.startswith("NCCL") and f.host == "n1")
    assert codes == ["NCCL007", "NCCL007"], fs
    assert all("aws-ofi-nccl" in f.message for f in fs if f.code == "NCCL007")


def test_ib_keys_on_ethernet_are_a_warning(tmp_path: Path) -> None:
    fs = findings(tmp_path, "NCCL007", group_vars=gpu_nodes(fabric="ethernet", ib_hcas=DELETE,
                                                            nccl_extra={"NCCL_IB_SL": 1}))
    fs = [f for f in fs if f.host == "n1"]
    assert [f.severity for f in fs] == ["warning"] and "NCCL_IB_DISABLE=1" in fs[0].message
