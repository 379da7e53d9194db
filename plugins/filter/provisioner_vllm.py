"""`provisioner_vllm_facts`: this host's vLLM facts (cluster, rank, the exact `vllm serve` argv, unit list) computed
by the suite's own Python (provisioner.render.vllm_facts over provisioner.vllm_args.serve_args), so the roles and
`provision render` cannot drift apart.

    vllm_facts: "{{ hostvars | provisioner.gpu.provisioner_vllm_facts(inventory_hostname, {'vllm_venv': vllm_venv, ...}) }}"

Data flows one way (docs/development.md, "Data flow"): the fleet is the play's own inventory as Ansible resolved it
(`hostvars`: whatever source the play was given, with the `-e` extra vars on top; provisioner.inventory.
fleet_from_play), never the inventory file read again; the role settings the computation needs (venv, unit paths,
watch intervals) are passed in by the calling task from its own variables, never re-read from defaults/main.yml.
The `provisioner` package must be installed in the controller's Python (pip; an execution environment installs it).
"""

from __future__ import annotations

from typing import Any, Mapping


def _import():
    from provisioner import render
    from provisioner.inventory import fleet_from_play

    return render, fleet_from_play


def provisioner_vllm_facts(hostvars: Any, host: str, variables: Mapping[str, Any] | None = None) -> Any:
    """None when `host` is in no vLLM cluster. `hostvars`: the play's; `variables`: the role settings the facts
    use (vllm_venv, vllm_libexec_dir, vllm_unit_dir, vllm_ray_port, vllm_watch_misses, vllm_watch_interval,
    vllm_head_watch_interval, vllm_join_timeout), as the calling task resolved them (-e included)."""
    render, fleet_from_play = _import()
    return render.vllm_facts(fleet_from_play(hostvars), str(host), dict(variables or {}))


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
