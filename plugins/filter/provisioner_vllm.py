"""`provisioner_vllm_facts`: this host's vLLM facts (cluster, rank, the exact `vllm serve` argv, unit list) computed
by the suite's own Python (provisioner.render.vllm_facts over provisioner.vllm_args.serve_args), so the roles and
`provision render` cannot drift apart.

    vllm_facts: "{{ inventory_file | provisioner.gpu.provisioner_vllm_facts(inventory_hostname) }}"

The fleet is read from the inventory file with the suite's loader (the same source `provision render` reads).
The `provisioner` package must be installed in the controller's Python (pip; an execution environment installs it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

_CACHE: dict[str, Any] = {}


def _import():
    from provisioner import render
    from provisioner.inventory import load_fleet

    return render, load_fleet


def provisioner_vllm_facts(inventory_file: str, host: str) -> Any:
    """None when `host` is in no vLLM cluster. Variables: role defaults + the host's inventory vars, exactly as
    `provision render` (extra vars given with -e do not reach this computation: put settings in the inventory)."""
    render, load_fleet = _import()
    key = str(Path(inventory_file).resolve())
    fleet = _CACHE.get(key)
    if fleet is None:
        fleet = _CACHE[key] = load_fleet(key)
    return render.host_variables(fleet, str(host))["vllm_facts"]


def provisioner_vllm_plan(hostvars: Any, play_hosts: list[str]) -> list[dict[str, Any]]:
    """Clusters with at least one member in the play: name, head, port, whether any member's files changed,
    whether every member is still in the play (a failed member keeps its cluster untouched), and the start order
    (`steps`: Ray units on every member first, then vllm.service)."""
    plan: dict[str, dict[str, Any]] = {}
    alive = set(play_hosts)
    for h in play_hosts:
        hv = hostvars[h]
        f = hv.get("vllm_facts")
        if not f:
            continue
        c = plan.setdefault(f["cluster"], {
            "name": f["cluster"], "head": f["head"], "port": f["port"], "members": list(f["members"]),
            "changed": False, "units": {},
        })
        c["changed"] = c["changed"] or bool(hv.get("vllm_launch_changed"))
        c["units"][h] = [u["name"] for u in f["units"]]
    out = []
    for name in sorted(plan):
        c = plan[name]
        c["complete"] = all(m in alive and m in c["units"] for m in c["members"])
        steps = []
        for unit in ("vllm-ray.service", "vllm.service"):
            for m in c["members"]:
                if unit in c["units"].get(m, []):
                    steps.append({"host": m, "unit": unit})
        c["steps"] = steps
        del c["units"]
        out.append(c)
    return out


class FilterModule:
    def filters(self):
        return {"provisioner_vllm_facts": provisioner_vllm_facts, "provisioner_vllm_plan": provisioner_vllm_plan}
