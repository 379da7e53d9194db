"""vLLM memory sizing: weights per GPU, KV cache per token, full-length sequences that fit. Pure functions.

The model (what vLLM does at start-up, simplified to what can be known before deploying):
- weights per GPU  = params x bytes per weight / (TP x PP)       (bytes per weight: fp8 -> 1, bf16/fp16 -> 2)
- budget per GPU   = GPU memory x gpu_memory_utilization
- KV cache per GPU = budget - weights per GPU                   (activation peaks and CUDA graphs are not modelled:
                                                                 the prediction is an upper bound)
- KV bytes/token   = 2 (K and V) x layers x kv_heads x head_dim x KV dtype bytes   (whole model)
  per GPU: layers split over PP (the largest stage), KV heads split over TP (replicated when TP > kv_heads)
- full-length sequences that fit = KV cache per GPU // (KV bytes/token per GPU x max_model_len)
vLLM refuses to start when not even one max_model_len sequence fits; that is rule MEM002.

Anchors (tests/unit/test_sizing.py): Qwen2-72B weighs ~145 GB in bf16 and ~73 GB in FP8; its KV cache is
~1.3 GB per 4096-token sequence and ~10.7 GB at 32768 tokens in bf16.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from provisioner.catalog import GpuSpec, ModelSpec

DTYPE_BYTES: Mapping[str, int] = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}
# weight bytes for the quantization methods sizing knows (None: the dtype decides)
QUANT_BYTES: Mapping[str, float] = {"fp8": 1}
KV_DTYPE_BYTES: Mapping[str, int] = {"fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


def bytes_per_weight(dtype: str, quantization: str | None) -> float:
    """Bytes one parameter takes on the GPU (quantization wins over dtype)."""
    if quantization is not None:
        return QUANT_BYTES[quantization]
    return DTYPE_BYTES[dtype]


def kv_bytes_per_element(kv_cache_dtype: str, dtype: str) -> int:
    """`auto` stores the KV cache in the model dtype (also under fp8 weight quantization)."""
    if kv_cache_dtype == "auto":
        return DTYPE_BYTES[dtype]
    return KV_DTYPE_BYTES[kv_cache_dtype]


def weight_bytes(model: ModelSpec, dtype: str, quantization: str | None) -> int:
    return int(model.params * bytes_per_weight(dtype, quantization))


def kv_cache_bytes_per_token(model: ModelSpec, kv_cache_dtype: str, dtype: str) -> int:
    """K and V for every layer and KV head, for one token: the whole model, before any split over GPUs."""
    return 2 * model.layers * model.kv_heads * model.head_dim * kv_bytes_per_element(kv_cache_dtype, dtype)


def kv_cache_bytes_per_token_per_gpu(model: ModelSpec, tp: int, pp: int, kv_cache_dtype: str, dtype: str) -> int:
    layers = -(-model.layers // pp)  # the largest pipeline stage
    kv_heads = max(1, -(-model.kv_heads // tp))  # replicated when TP > kv_heads
    return 2 * layers * kv_heads * model.head_dim * kv_bytes_per_element(kv_cache_dtype, dtype)


@dataclass(frozen=True)
class Sizing:
    """Memory picture of one cluster (bytes, per GPU unless named otherwise)."""

    weight_bytes_total: int
    weight_bytes_per_gpu: int
    budget_bytes_per_gpu: int  # GPU memory x gpu_memory_utilization
    kv_cache_bytes_per_gpu: int  # budget - weights; negative when the weights do not fit
    kv_cache_bytes_per_token: int  # whole model
    kv_cache_bytes_per_token_per_gpu: int
    sequence_bytes_per_gpu: int  # one max_model_len sequence's KV cache on one GPU
    max_full_length_seqs: int

    @property
    def weights_fit(self) -> bool:
        return self.kv_cache_bytes_per_gpu > 0


def size(model: ModelSpec, gpu: GpuSpec, settings: Mapping[str, Any]) -> Sizing:
    """Sizing for a cluster's (validated) vllm_cluster settings on `gpu`."""
    tp = int(settings["tensor_parallel_size"])
    pp = int(settings["pipeline_parallel_size"])
    dtype = str(settings["dtype"])
    quant = settings.get("quantization")
    kv_dtype = str(settings["kv_cache_dtype"])
    max_len = int(settings["max_model_len"])
    util = float(settings["gpu_memory_utilization"])

    total = weight_bytes(model, dtype, quant)
    per_gpu = -(-total // (tp * pp))
    budget = int(gpu.memory_bytes * util)
    kv_gpu = budget - per_gpu
    tok_gpu = kv_cache_bytes_per_token_per_gpu(model, tp, pp, kv_dtype, dtype)
    seq = tok_gpu * max_len
    return Sizing(
        weight_bytes_total=total,
        weight_bytes_per_gpu=per_gpu,
        budget_bytes_per_gpu=budget,
        kv_cache_bytes_per_gpu=kv_gpu,
        kv_cache_bytes_per_token=kv_cache_bytes_per_token(model, kv_dtype, dtype),
        kv_cache_bytes_per_token_per_gpu=tok_gpu,
        sequence_bytes_per_gpu=seq,
        max_full_length_seqs=max(0, kv_gpu) // seq if seq > 0 else 0,
    )


def human(n: float) -> str:
    """Bytes for people: decimal GB like the model cards (145.4 GB), MB/kB below."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"
