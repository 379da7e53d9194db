"""Load an Ansible inventory into the typed `Fleet` model.

The only module that touches Ansible's inventory API: ansible-core's own InventoryManager/VariableManager read
INI or YAML inventories with group_vars/ and host_vars/ exactly as ansible-playbook would.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from provisioner.errors import UsageError
from provisioner.model import Cluster, Fleet, Host, freeze

# Defaults applied to every vllm_cluster dict (documented in docs/inventory.md).
VLLM_CLUSTER_DEFAULTS: dict[str, Any] = {
    "dtype": "bfloat16",
    "quantization": None,
    "kv_cache_dtype": "auto",
    "tensor_parallel_size": 1,
    "pipeline_parallel_size": 1,
    "max_model_len": 4096,
    "max_num_seqs": 256,
    "max_num_batched_tokens": None,
    "gpu_memory_utilization": 0.9,
    "block_size": 16,
    "enable_chunked_prefill": True,
    "enable_prefix_caching": True,
    "executor": "mp",
    "port": 8000,
    "master_port": 29501,
    "extra_args": [],
}


def _quiet_ansible() -> None:
    # Keep ansible's own warnings (e.g. "provided hosts list is empty") off our output; we report ourselves.
    os.environ.setdefault("ANSIBLE_LOCALHOST_WARNING", "False")
    os.environ.setdefault("ANSIBLE_INVENTORY_UNPARSED_WARNING", "False")


def load_fleet(path: str | os.PathLike[str]) -> Fleet:
    """Read the inventory at `path`; raise UsageError (exit 2) when it cannot be read or parsed."""
    p = Path(path)
    if not p.exists():
        raise UsageError("inventory not found", path=str(p))
    if not os.access(p, os.R_OK):
        raise UsageError("inventory is not readable", path=str(p))
    _quiet_ansible()
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    try:
        # "unparsed" inventories do not raise by default: make ansible fail loudly on a source it cannot parse.
        from ansible import constants as C

        C.INVENTORY_UNPARSED_IS_FAILED = True  # type: ignore[attr-defined]
        inv = InventoryManager(loader=loader, sources=[str(p)])
        vm = VariableManager(loader=loader, inventory=inv)
        hosts: dict[str, Host] = {}
        for h in inv.get_hosts():
            hv = vm.get_vars(host=h, include_hostvars=False)
            groups = tuple(sorted(g.name for g in h.get_groups() if g.name != "all"))
            merged = {k: v for k, v in hv.items() if not k.startswith("ansible_") or k in _ANSIBLE_KEEP}
            hosts[h.name] = Host(
                name=h.name,
                address=str(hv.get("ansible_host") or h.name),
                groups=groups,
                vars=freeze(merged),
            )
        group_vars = _group_vars(loader, inv, p)
    except AnsibleError as exc:
        raise UsageError(f"cannot parse inventory: {_first_line(exc)}", path=str(p)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read inventory: {exc}", path=str(p)) from None

    clusters = _clusters(inv, hosts, group_vars)
    return Fleet(source=p, hosts=freeze(hosts), clusters=freeze(clusters), group_vars=freeze(group_vars))


_ANSIBLE_KEEP = {"ansible_host", "ansible_port", "ansible_user", "ansible_ssh_common_args", "ansible_python_interpreter"}


def _first_line(exc: Exception) -> str:
    msg = getattr(exc, "message", None) or str(exc)
    return str(msg).strip().splitlines()[0] if str(msg).strip() else type(exc).__name__


def _group_vars(loader: Any, inv: Any, source: Path) -> dict[str, Any]:
    """Each group's own vars: inline ([g:vars] / YAML vars) combined with group_vars/ files, as Ansible does."""
    from ansible.utils.vars import combine_vars
    from ansible.vars.plugins import get_vars_from_inventory_sources

    sources = [str(source)]
    out: dict[str, Any] = {}
    for name, g in inv.groups.items():
        plugin_vars = get_vars_from_inventory_sources(loader, sources, [g], "all")
        out[name] = freeze(combine_vars(g.get_vars(), plugin_vars))
    return out


def _clusters(inv: Any, hosts: dict[str, Host], group_vars: dict[str, Any]) -> dict[str, Cluster]:
    """A cluster is a group whose *own* vars (inline or group_vars/) define `vllm_cluster`."""
    out: dict[str, Cluster] = {}
    for name, g in inv.groups.items():
        gv = group_vars.get(name, {})
        if "vllm_cluster" not in gv:
            continue
        raw = gv.get("vllm_cluster")
        settings = dict(VLLM_CLUSTER_DEFAULTS)
        if isinstance(raw, dict):
            settings.update(raw)
        member_names = [h.name for h in g.get_hosts()]

        def key(n: str) -> tuple[int, int, str]:
            r = hosts[n].node_rank
            return (0, r, n) if r is not None else (1, 0, n)

        out[name] = Cluster(name=name, settings=freeze(settings), members=tuple(sorted(member_names, key=key)))
    return out
