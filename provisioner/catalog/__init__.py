"""GPU and model catalogs: data files (`gpus.yaml`, `models.yaml`) read into typed, immutable specs.

API:
- `gpus() -> Mapping[str, GpuSpec]`, `gpu(name) -> GpuSpec | None`
- `models() -> Mapping[str, ModelSpec]`, `model(name) -> ModelSpec | None`
- `instances() -> Mapping[str, InstanceSpec]`: cloud instance shapes with EFA (`instances.yaml`)
- `model_from_hf_config(config, name) -> ModelSpec` (a Hugging Face config.json dict; ValueError when unusable)
- `load_model_config(path) -> ModelSpec` (reads config.json; ValueError with the reason when unreadable/unusable)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

#: yaml's safe loader, libyaml's (CSafeLoader, ~10x faster) where PyYAML was built with it: the catalogs and the role
#: defaults are read on every CLI start
SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

CATALOG_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class GpuSpec:
    name: str
    smi_name: str
    memory_bytes: int
    architecture: str
    nvlink: bool
    nvswitch: bool
    fabric_manager: bool  # the node needs nvidia-fabricmanager (NVSwitch systems)
    fp8: bool
    max_per_node: int
    allreduce_busbw_gbps: float  # single-node all-reduce busbw pass threshold (GB/s)
    all_reduce_gpus: int
    nvlsm: bool = False  # NVLSM + mlx5_ib/ib_umad beside Fabric Manager (HGX B200/B300)
    imex: bool = False  # nvidia-imex + IMEX channels, never Fabric Manager (NVL72 trays)
    cpu_arch: str = "x86_64"  # ansible_architecture of the node: x86_64 | aarch64
    nvlink_domain_size: int = 8  # GPUs joined by one NVLink domain (8 HGX, 72 NVL72)
    min_driver: str | None = None  # oldest supporting driver, "570.133.20"; None: no minimum


@dataclass(frozen=True)
class ModelSpec:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    params: int
    vocab: int
    max_position_embeddings: int | None = None


@dataclass(frozen=True)
class InstanceSpec:
    name: str  # the AWS instance type, e.g. p5.48xlarge
    gpu_model: str | None  # a key of gpus.yaml (None: a GPU the GPU catalog does not carry)
    gpu_count: int
    efa_devices: int  # EFA devices with every EFA-capable network card in use


def _load(name: str) -> dict[str, Any]:
    with open(CATALOG_DIR / name, encoding="utf-8") as fh:
        data = yaml.load(fh, Loader=SAFE_LOADER)  # noqa: S506 (the safe loader, libyaml's when built with it)
    assert isinstance(data, dict), f"{name} must be a mapping"
    return data


@lru_cache(maxsize=1)
def gpus() -> Mapping[str, GpuSpec]:
    return MappingProxyType({k: GpuSpec(name=k, **v) for k, v in _load("gpus.yaml").items()})


@lru_cache(maxsize=1)
def models() -> Mapping[str, ModelSpec]:
    return MappingProxyType({k: ModelSpec(name=k, **v) for k, v in _load("models.yaml").items()})


@lru_cache(maxsize=1)
def instances() -> Mapping[str, InstanceSpec]:
    return MappingProxyType({k: InstanceSpec(name=k, **v) for k, v in _load("instances.yaml").items()})


def gpu(name: object) -> GpuSpec | None:
    return gpus().get(name) if isinstance(name, str) else None


def model(name: object) -> ModelSpec | None:
    return models().get(name) if isinstance(name, str) else None


def _int(cfg: Mapping[str, Any], *keys: str) -> int | None:
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def estimate_params(cfg: Mapping[str, Any]) -> int:
    """Parameter count of a decoder-only transformer from its HF config (dense or MoE, GQA aware).

    Embeddings + lm_head (unless tied) + per layer: q/k/v/o projections, gated MLP (3 matrices, x experts) and norms.
    Matches the published totals of Llama/Qwen2/Mixtral within 0.1 %.
    """
    layers = _int(cfg, "num_hidden_layers", "n_layer") or 0
    hidden = _int(cfg, "hidden_size", "n_embd") or 0
    heads = _int(cfg, "num_attention_heads", "n_head") or 1
    kv_heads = _int(cfg, "num_key_value_heads") or heads
    head_dim = _int(cfg, "head_dim") or hidden // heads
    inter = _int(cfg, "intermediate_size") or 4 * hidden
    vocab = _int(cfg, "vocab_size") or 0
    experts = _int(cfg, "num_local_experts", "num_experts") or 1
    attn = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    if cfg.get("attention_bias") or cfg.get("model_type") == "qwen2":
        attn += heads * head_dim + 2 * kv_heads * head_dim
    mlp = 3 * hidden * inter * experts + (hidden * experts if experts > 1 else 0)
    per_layer = attn + mlp + 2 * hidden
    embed = vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2)
    return layers * per_layer + embed + hidden


def model_from_hf_config(cfg: Mapping[str, Any], name: str) -> ModelSpec:
    """A ModelSpec from a Hugging Face `config.json` dict; ValueError naming the missing key otherwise."""
    if not isinstance(cfg, Mapping):
        raise ValueError("config.json must hold a JSON object")
    text_cfg = cfg.get("text_config")
    if isinstance(text_cfg, Mapping) and "num_hidden_layers" not in cfg:
        cfg = text_cfg  # multimodal wrappers keep the language model under text_config
    layers = _int(cfg, "num_hidden_layers", "n_layer")
    hidden = _int(cfg, "hidden_size", "n_embd")
    heads = _int(cfg, "num_attention_heads", "n_head")
    for key, val in (("num_hidden_layers", layers), ("hidden_size", hidden), ("num_attention_heads", heads)):
        if val is None:
            raise ValueError(f"config.json has no positive integer {key!r}")
    assert layers and hidden and heads
    kv_heads = _int(cfg, "num_key_value_heads") or heads
    head_dim = _int(cfg, "head_dim") or hidden // heads
    return ModelSpec(
        name=name,
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        params=estimate_params(cfg),
        vocab=_int(cfg, "vocab_size") or 0,
        max_position_embeddings=_int(cfg, "max_position_embeddings"),
    )


def load_model_config(path: Path) -> ModelSpec:
    """Read an HF config.json (a file, or a directory holding one); ValueError with the reason on failure."""
    p = path / "config.json" if path.is_dir() else path
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{p} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {p}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{p}:{exc.lineno}: not valid JSON: {exc.msg}") from None
    return model_from_hf_config(cfg, name=str(cfg.get("_name_or_path") or p.parent.name or p.name)
                                if isinstance(cfg, dict) else p.name)
