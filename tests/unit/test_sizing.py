"""Sizing against the public anchors and by hand."""

from __future__ import annotations

import json

import pytest

from provisioner import catalog, sizing
from provisioner.catalog import estimate_params, model_from_hf_config

QWEN = catalog.model("Qwen2-72B")
H100 = catalog.gpu("H100-SXM5-80GB")

# Qwen2-72B's config.json (the keys sizing reads)
QWEN_CONFIG = {
    "model_type": "qwen2", "hidden_size": 8192, "intermediate_size": 29568, "num_attention_heads": 64,
    "num_hidden_layers": 80, "num_key_value_heads": 8, "vocab_size": 152064, "tie_word_embeddings": False,
    "max_position_embeddings": 32768,
}


def test_qwen2_72b_weights_anchor() -> None:
    assert QWEN is not None
    assert sizing.weight_bytes(QWEN, "bfloat16", None) == pytest.approx(145e9, rel=0.01)
    assert sizing.weight_bytes(QWEN, "bfloat16", "fp8") == pytest.approx(73e9, rel=0.01)


def test_qwen2_72b_kv_anchor() -> None:
    assert QWEN is not None
    per_token = sizing.kv_cache_bytes_per_token(QWEN, "auto", "bfloat16")
    assert per_token == 2 * 80 * 8 * 128 * 2 == 327_680
    assert per_token * 4096 == pytest.approx(1.3e9, rel=0.05)
    assert per_token * 32768 == pytest.approx(10.7e9, rel=0.01)
    assert sizing.kv_cache_bytes_per_token(QWEN, "fp8", "bfloat16") == per_token // 2


def test_per_gpu_split_and_sequences() -> None:
    assert QWEN is not None and H100 is not None
    s = {"tensor_parallel_size": 8, "pipeline_parallel_size": 2, "dtype": "bfloat16", "quantization": None,
         "kv_cache_dtype": "auto", "max_model_len": 32768, "gpu_memory_utilization": 0.9}
    z = sizing.size(QWEN, H100, s)
    assert z.weight_bytes_per_gpu == -(-QWEN.params * 2 // 16)
    assert z.kv_cache_bytes_per_token_per_gpu == 2 * 40 * 1 * 128 * 2  # 80 layers / PP 2, 8 KV heads / TP 8
    budget = int(H100.memory_bytes * 0.9)
    assert z.kv_cache_bytes_per_gpu == budget - z.weight_bytes_per_gpu
    assert z.max_full_length_seqs == z.kv_cache_bytes_per_gpu // (20480 * 32768) == 101


def test_kv_heads_replicate_when_tp_exceeds_them() -> None:
    m = catalog.model("Llama-3.1-405B")
    assert m is not None and m.kv_heads == 8
    assert sizing.kv_cache_bytes_per_token_per_gpu(m, 16, 1, "auto", "bfloat16") == 2 * 126 * 1 * 128 * 2


def test_weights_that_do_not_fit_leave_no_sequences() -> None:
    m = catalog.model("Llama-3.1-405B")
    g = catalog.gpu("A10G-24GB")
    assert m is not None and g is not None
    z = sizing.size(m, g, {"tensor_parallel_size": 8, "pipeline_parallel_size": 1, "dtype": "bfloat16",
                           "kv_cache_dtype": "auto", "max_model_len": 4096, "gpu_memory_utilization": 0.9})
    assert not z.weights_fit and z.max_full_length_seqs == 0


@pytest.mark.parametrize("name", ["Qwen2-72B", "Llama-3.1-70B", "Mixtral-8x7B", "Llama-2-7B"])
def test_param_estimate_matches_catalog(name: str) -> None:
    m = catalog.model(name)
    assert m is not None
    cfgs = {
        "Qwen2-72B": QWEN_CONFIG,
        "Llama-3.1-70B": {"hidden_size": 8192, "intermediate_size": 28672, "num_attention_heads": 64,
                          "num_hidden_layers": 80, "num_key_value_heads": 8, "vocab_size": 128256},
        "Mixtral-8x7B": {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
                         "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 32000,
                         "num_local_experts": 8},
        "Llama-2-7B": {"hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
                       "num_hidden_layers": 32, "num_key_value_heads": 32, "vocab_size": 32000},
    }
    assert estimate_params(cfgs[name]) == pytest.approx(m.params, rel=0.001)


def test_model_config_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "config.json").write_text(json.dumps(QWEN_CONFIG))
    spec = catalog.load_model_config(tmp_path)
    assert QWEN is not None
    assert (spec.layers, spec.heads, spec.kv_heads, spec.head_dim) == (80, 64, 8, 128)
    assert spec.params == pytest.approx(QWEN.params, rel=0.001)
    with pytest.raises(ValueError, match="num_hidden_layers"):
        model_from_hf_config({"hidden_size": 1}, "x")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        catalog.load_model_config(tmp_path / "bad.json")


def test_catalogs_cover_the_contract() -> None:
    for g in ("H100-SXM5-80GB", "H100-PCIe-80GB", "H100-NVL-94GB", "H200-SXM-141GB", "A100-SXM4-80GB", "A10G-24GB",
              "L40S-48GB"):
        spec = catalog.gpu(g)
        assert spec is not None and spec.memory_bytes > 20e9 and spec.allreduce_busbw_gbps > 0
        assert spec.fabric_manager == spec.nvswitch
    for m in ("Qwen2-72B", "Llama-2-13B", "Llama-3.1-70B", "Llama-3.1-405B", "Llama-2-7B", "Mixtral-8x7B"):
        spec = catalog.model(m)
        assert spec is not None and spec.heads % spec.kv_heads == 0
