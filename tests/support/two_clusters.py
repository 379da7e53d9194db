"""Two 2-node clusters (`pp`: n1, n2; `pp2`: n3, n4) serving one model, as a rolling upgrade may take out one at a
time; `write(root, other_model=True)` makes pp2 serve another model (then each model has one cluster only)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inventory_factory import write_inventory

INI = """\
[gpu_nodes]
n1 ansible_host=198.18.0.11
n2 ansible_host=198.18.0.12
n3 ansible_host=198.18.0.13
n4 ansible_host=198.18.0.14

[pp]
n1 node_rank=0
n2 node_rank=1

[pp2]
n3 node_rank=0
n4 node_rank=1
"""
C = {"model": "/models/Qwen2-72B", "model_arch": "Qwen2-72B", "tensor_parallel_size": 8, "pipeline_parallel_size": 2,
     "max_model_len": 4096, "max_num_seqs": 64}
OTHER_MODEL = {"model": "/models/Llama-3.1-70B", "model_arch": "Llama-3.1-70B"}


def group_vars(other_model: bool = False) -> dict[str, Any]:
    return {"pp": {"vllm_cluster": {**C, "port": 8001}},
            "pp2": {"vllm_cluster": {**C, "port": 8000, **(OTHER_MODEL if other_model else {})}}}


#: two clusters serving one model
GROUP_VARS = group_vars()


def write(root: Path, other_model: bool = False) -> Path:
    """The inventory under `root` (INI + group_vars over inventory_factory's base)."""
    return write_inventory(root, ini=INI, group_vars=group_vars(other_model))
