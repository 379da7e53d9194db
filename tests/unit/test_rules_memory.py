"""Memory rules predict what vLLM would refuse at start-up."""

from __future__ import annotations

from pathlib import Path

from inventory_factory import cluster
from rules_helpers import findings


def test_weights_do_not_fit(tmp_path: Path) -> None:
    (f,) = findings(tmp_path, "MEM001", group_vars=cluster(gpu_memory_utilization=0.1))
    assert "9.1 GB per GPU" in f.message and "fp8" in f.message


def test_fp8_makes_them_fit(tmp_path: Path) -> None:
    assert findings(tmp_path, "MEM001", group_vars=cluster(gpu_memory_utilization=0.1, quantization="fp8")) == []


def test_one_sequence_must_fit_and_says_the_longest_that_does(tmp_path: Path) -> None:
    (f,) = findings(tmp_path, "MEM002", group_vars=cluster(gpu_memory_utilization=0.11, max_model_len=32768))
    assert "refuse to start" in f.message and "at most" in f.message
    # the advised length really fits
    longest = int(f.message.split("at most ")[1].split(")")[0])
    assert not findings(tmp_path / "b", "MEM002",
                        group_vars=cluster(gpu_memory_utilization=0.11, max_model_len=longest))


def test_concurrency_warning_reports_how_many(tmp_path: Path) -> None:
    (f,) = findings(tmp_path, "MEM003", group_vars=cluster(max_model_len=32768, max_num_seqs=256))
    assert f.severity == "warning" and "holds 101 full-length" in f.message


def test_fp8_kv_cache_doubles_capacity(tmp_path: Path) -> None:
    assert not findings(tmp_path, "MEM003", group_vars=cluster(max_model_len=32768, max_num_seqs=200,
                                                               kv_cache_dtype="fp8"))
