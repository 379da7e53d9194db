"""The inventory `provision testbed up --with-vllm` writes for a 3-host rack (node01-03, one simulated GPU each), on
disk under tmp_path without a rack: the tiny model's config.json where the layer build exports it, then the inventory
writer with the vLLM layer's settings. Shared by the unit tests of the writer and of the endpoints report."""

from __future__ import annotations

import json
from pathlib import Path

from provisioner_testbed import inventory_writer as invw
from provisioner_testbed import vllm_image

TINY_LLAMA_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
                     "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
                     "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 512, "max_position_embeddings": 2048,
                     "torch_dtype": "float32"}


def write_vllm_rack_inventory(tmp_path: Path, *, model_config: bool = True) -> Path:
    """hosts.ini of the written inventory directory (tmp_path/inv); the cache is tmp_path/cache."""
    cache = tmp_path / "cache"
    if model_config:
        cfg = vllm_image.model_config_path(cache)  # what the layer build exports on the controller
        cfg.parent.mkdir(parents=True)
        cfg.write_text(json.dumps(TINY_LLAMA_CONFIG))
    hosts = tuple(invw.InvHost(name=f"node{i:02d}", address=f"198.18.7.{10 + i}", gpu_count=1) for i in (1, 2, 3))
    extra, cluster_vars = vllm_image.testbed_rack_inventory(
        invw.clusters([h.name for h in hosts]), {h.name: h.gpu_count for h in hosts}, "198.18.7.1/24", cache)
    r = invw.InvRack(name="v", hosts=hosts, key_file="/k", known_hosts="/kh", repo_url="http://198.18.7.1:8090/nvidia/",
                     proxy_url="http://198.18.7.1:3128", extra_vars=extra, cluster_vars=cluster_vars)
    return invw.write(r, tmp_path / "inv")
