"""NCCL rules, including the NCCL_ALGO grammar as a pure function."""

from __future__ import annotations

from pathlib import Path

import pytest

from inventory_factory import gpu_nodes
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
