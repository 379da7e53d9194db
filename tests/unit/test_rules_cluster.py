"""Cluster rules: settings schema (pure), topology and rank messages."""

from __future__ import annotations

from pathlib import Path

from inventory_factory import BASE_INI, cluster
from provisioner.plan import cluster_defaults
from provisioner.rules.cluster import setting_problems
from rules_helpers import findings


def test_defaults_are_valid() -> None:
    assert setting_problems(dict(cluster_defaults(), model="/m", model_arch="Qwen2-72B")) == []


def test_setting_problems_name_key_and_fix() -> None:
    s = dict(cluster_defaults(), dtype="bf16", enable_chunked_prefill="true", block_size=24, port=0)
    keys = {k for k, _ in setting_problems(s)}
    assert keys == {"dtype", "enable_chunked_prefill", "block_size", "port"}
    msgs = dict(setting_problems(s))
    assert "bfloat16" in msgs["dtype"] and "without quotes" in msgs["enable_chunked_prefill"]


def test_world_size_message_suggests_a_split(tmp_path: Path) -> None:
    (f,) = findings(tmp_path, "CL003", group_vars=cluster(pipeline_parallel_size=1))
    assert f.group == "c1" and f.var == "vllm_cluster.tensor_parallel_size"
    assert "8 x 1 = 8" in f.message and "16 GPUs" in f.message and "pipeline_parallel_size: 2" in f.message


def test_tp_across_nodes_is_a_warning_with_advice(tmp_path: Path) -> None:
    (f,) = findings(tmp_path, "CL010", group_vars=cluster(tensor_parallel_size=16, pipeline_parallel_size=1))
    assert f.severity == "warning" and "prefer tensor_parallel_size: 8, pipeline_parallel_size: 2" in f.message


def test_rank_gap(tmp_path: Path) -> None:
    (f,) = findings(tmp_path, "CL007", ini=BASE_INI.replace("n2 node_rank=1", "n2 node_rank=3"))
    assert "0..1" in f.message


def test_head_must_be_rank_zero(tmp_path: Path) -> None:
    fs = findings(tmp_path, "CL007", ini=BASE_INI.replace("n1 node_rank=0", "n1 node_rank=2"))
    assert fs


def test_inline_string_cluster_explains_ini(tmp_path: Path) -> None:
    (f,) = findings(tmp_path, "CL001", group_vars={"c1": {"vllm_cluster": "Qwen2-72B"}})
    assert "group_vars/c1.yml" in f.message


def test_unknown_key_suggests(tmp_path: Path) -> None:
    (f,) = findings(tmp_path, "CL016", group_vars=cluster(max_num_seq=8))
    assert "did you mean 'max_num_seqs'" in f.message


def test_ray_executor_on_the_cpu_build_is_refused_with_vllms_error(tmp_path: Path) -> None:
    gv = {**cluster(executor="ray"), "gpu_nodes": {"vllm_device": "cpu"}}
    (f,) = findings(tmp_path, "CL018", group_vars=gv)
    assert f.severity == "error" and f.group == "c1" and f.var == "vllm_cluster.executor"
    assert "n1, n2" in f.message and "current platform cpu does not support ray" in f.message
    assert "executor: mp" in f.message
    # the same cluster on the CUDA build (the role default), or mp on cpu: nothing to refuse
    assert findings(tmp_path / "cuda", "CL018", group_vars=cluster(executor="ray")) == []
    assert findings(tmp_path / "mp", "CL018", group_vars={"gpu_nodes": {"vllm_device": "cpu"}}) == []


def test_unknown_vllm_device_names_host_and_fix(tmp_path: Path) -> None:
    fs = findings(tmp_path, "CL018", group_vars={"gpu_nodes": {"vllm_device": "cpus"}})
    assert {f.host for f in fs} == {"n1", "n2"}
    assert all(f.var == "vllm_device" and "'cpu'" in f.message for f in fs)
