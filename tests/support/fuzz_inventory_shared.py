"""Data and helpers shared by tests/unit/test_fuzz_inventory.py (in-process)
and tests/integration/test_fuzz_inventory_process.py (its process cases)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st
from inventory_factory import BASE_GROUP_VARS, BASE_INI

HW_KEYS = ["gpu_model", "gpu_count", "fabric", "ib_hcas", "bootstrap_interface", "node_rank", "nccl_algo",
           "nccl_ib_timeout", "nccl_ib_retry_cnt", "nccl_ib_gid_index", "nccl_cross_nic", "nccl_extra", "nccl_ib_hca",
           "ansible_host", "ansible_port", "cuda_version", "vllm_host_ip"]


CL_KEYS = ["model", "model_arch", "model_config", "dtype", "quantization", "kv_cache_dtype", "tensor_parallel_size",
           "pipeline_parallel_size", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
           "gpu_memory_utilization", "block_size", "enable_chunked_prefill", "enable_prefix_caching", "executor", "port",
           "master_port", "extra_args", "served_model_name"]


GOOD = {**BASE_GROUP_VARS["gpu_nodes"], **BASE_GROUP_VARS["c1"]["vllm_cluster"]}


scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 2**40), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12), st.sampled_from(["Qwen2-72B", "H100-SXM5-80GB", "infiniband", "mlx5_0", "fp8", "ray",
                                           "--swap-space", "Ring", "allreduce:ring;x", "bfloat16", "auto", "0", "8"]),
)


values = st.recursive(scalars, lambda c: st.one_of(st.lists(c, max_size=4),
                                                    st.dictionaries(st.text(max_size=6), c, max_size=4)), max_leaves=8)


def _mostly_good(keys: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    """Dicts that start from valid values and get some keys replaced, dropped or added."""
    return st.dictionaries(st.sampled_from(keys), values, max_size=6).flatmap(
        lambda bad: st.booleans().map(lambda keep: {**({k: GOOD[k] for k in keys if k in GOOD} if keep else {}), **bad})
    )


ini_lines = st.one_of(
    st.sampled_from(["[gpu_nodes]", "[c1]", "[c1:vars]", "[gpu_nodes:children]", "[gpu_nodes:vars]", "[all:vars]",
                     "[c2]", "[bad", "[x:y]", "n1", "n2 node_rank=0", "n3 node_rank=1 ansible_host=10.0.0.1",
                     "n[1:3]", "c1", "cuda_version=12.10", "gpu_count=8", "gpu_count='8'", "vllm_cluster={'model': 1}",
                     "x=[1,", "; comment", "n1 foo", "= =", "n1 ansible_port=abc"]),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20),
)


@st.composite
def inventories(draw: Any) -> dict[str, Any]:
    kind = draw(st.sampled_from(["base", "base", "ini", "ini", "yaml", "junk"]))
    files: dict[str, str] = {}
    if kind == "base":  # a valid inventory file: the random part is in group_vars / host_vars
        files["hosts.ini"] = BASE_INI
    elif kind == "ini":
        lines = draw(st.lists(ini_lines, max_size=12))
        text = BASE_INI + "\n".join(lines) if draw(st.booleans()) else "\n".join(lines)
        files["hosts.ini"] = text
    elif kind == "yaml":
        doc = draw(st.one_of(values, st.just({"all": {"children": {"gpu_nodes": {"hosts": {"n1": None}},
                                                                   "c1": {"hosts": {"n1": {"node_rank": 0}}}}}})))
        files["hosts.yml"] = yaml.safe_dump(doc) if draw(st.booleans()) else str(doc)
    else:
        files["hosts.ini"] = draw(st.binary(max_size=60)).decode("latin-1")
    gv_gpu = draw(_mostly_good(HW_KEYS))
    cl = draw(st.one_of(_mostly_good(CL_KEYS), values))
    files["group_vars/gpu_nodes.yml"] = yaml.safe_dump(gv_gpu) if draw(st.integers(0, 4)) else draw(
        st.sampled_from(["gpu_count: [8", "- a\nb: 1", "{{ x }}: y", "\t:", "gpu_count: 8\n"]))
    files["group_vars/c1.yml"] = yaml.safe_dump({"vllm_cluster": cl})
    if draw(st.booleans()):
        files["host_vars/n1.yml"] = yaml.safe_dump(draw(_mostly_good(HW_KEYS)))
    return files


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8", errors="surrogateescape")
    return root / ("hosts.yml" if "hosts.yml" in files else "hosts.ini")
