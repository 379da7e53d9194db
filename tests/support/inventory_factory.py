"""Write small, real inventories (INI + group_vars/ + host_vars/) for the validate tests.

`write_inventory(root, ini=..., group_vars={group: {...}}, host_vars={host: {...}}, files={relpath: text})`
writes them; group_vars given here are deep-merged over BASE_GROUP_VARS (a valid 2-node Qwen2-72B TP8 x PP2
cluster `c1` on 8x H100 nodes); a value DELETE removes the key.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

DELETE = object()

BASE_INI = """\
[gpu_nodes]
n1 ansible_host=10.0.0.1
n2 ansible_host=10.0.0.2

[c1]
n1 node_rank=0
n2 node_rank=1
"""

BASE_GROUP_VARS: dict[str, dict[str, Any]] = {
    "gpu_nodes": {
        "gpu_model": "H100-SXM5-80GB",
        "gpu_count": 8,
        "fabric": "infiniband",
        "ib_hcas": [f"mlx5_{i}:1" for i in range(8)],
        "bootstrap_interface": "ens10f0np0",
    },
    "c1": {
        "vllm_cluster": {
            "model": "/models/Qwen2-72B",
            "model_arch": "Qwen2-72B",
            "tensor_parallel_size": 8,
            "pipeline_parallel_size": 2,
            "max_model_len": 4096,
            "max_num_seqs": 64,
        }
    },
}


def merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            if v is DELETE:
                out.pop(k, None)
            else:
                out[k] = merge(base.get(k), v)
        return out
    return copy.deepcopy(over)


def write_inventory(
    root: Path,
    ini: str = BASE_INI,
    group_vars: dict[str, Any] | None = None,
    host_vars: dict[str, Any] | None = None,
    files: dict[str, str] | None = None,
    base: bool = True,
    name: str = "hosts.ini",
) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    gv = merge(BASE_GROUP_VARS, group_vars or {}) if base else (group_vars or {})
    (root / "group_vars").mkdir(exist_ok=True)
    for g, v in gv.items():
        (root / "group_vars" / f"{g}.yml").write_text(yaml.safe_dump(v, sort_keys=False))
    if host_vars:
        (root / "host_vars").mkdir(exist_ok=True)
        for h, v in host_vars.items():
            (root / "host_vars" / f"{h}.yml").write_text(yaml.safe_dump(v, sort_keys=False))
    for rel, text in (files or {}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    inv = root / name
    inv.write_text(ini)
    return inv


def cluster(**settings: Any) -> dict[str, Any]:
    """group_vars override for c1's vllm_cluster."""
    return {"c1": {"vllm_cluster": settings}}


def gpu_nodes(**hw: Any) -> dict[str, Any]:
    return {"gpu_nodes": hw}


TINY_CONFIG = {
    "model_type": "llama",
    "num_hidden_layers": 1,
    "hidden_size": 512,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "intermediate_size": 1024,
    "vocab_size": 1000,
    "max_position_embeddings": 8192,
}


def script_twin(ini: Path, out: Path) -> Path:
    """An executable `script` inventory (Ansible's JSON protocol: --list with _meta.hostvars) holding the same
    groups, hosts and inline variables as the INI file `ini` (group_vars/ and host_vars/ next to `out` are read by
    Ansible's vars plugins for any source, so put the script next to them)."""
    import json
    import os

    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader

    def plain(v: Any) -> Any:  # ansible's tagged values -> JSON-able plain values
        return json.loads(json.dumps(v))

    inv = InventoryManager(loader=DataLoader(), sources=[str(ini)])
    doc: dict[str, Any] = {"_meta": {"hostvars": {h.name: plain(h.get_vars()) for h in inv.hosts.values()}}}
    for h in doc["_meta"]["hostvars"].values():  # magic variables the INI parser adds
        for k in ("inventory_file", "inventory_dir", "inventory_hostname", "inventory_hostname_short", "group_names"):
            h.pop(k, None)
    for name, g in inv.groups.items():
        if name == "ungrouped" and not g.hosts:
            continue
        doc[name] = {"hosts": [h.name for h in g.hosts], "vars": plain(g.get_vars()),
                     "children": [c.name for c in g.child_groups]}
    out.write_text("#!/usr/bin/env python3\n# a dynamic inventory (script protocol), twin of " + ini.name + "\n"
                   "import json, sys\n"
                   f"DOC = json.loads({json.dumps(json.dumps(doc, sort_keys=True))})\n"
                   "print(json.dumps(DOC if '--list' in sys.argv else {}))\n")
    os.chmod(out, 0o755)
    return out
