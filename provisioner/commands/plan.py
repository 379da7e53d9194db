"""`provision plan INVENTORY [--host H] [--format text|json|yaml]`: the fleet plan, as the play computes it.

The same function (provisioner.plan.compute) as the play's provisioner_plan action and `provision render`, on the
same Fleet, so what it prints is what every role reads. Each host's entry also says where its inputs were set.
"""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from provisioner.commands.common import (
    EXTRA_VARS_HELP,
    VAULT_HELP,
    extra_vars,
    finding_line,
    unwrap,
    use_vault,
    validate,
)
from provisioner.errors import Exit, UsageError

err = Console(stderr=True, highlight=False, soft_wrap=True)

HELP = unwrap("""Print the fleet plan: what every host gets, and from where.

The plan is computed once per run at the top of every playbook (the provisioner_plan role) by the same function this
command calls: per host its vLLM cluster, members and rank, the exact `vllm serve` command line and units, the IMEX
tray list and the firewall's cluster members; per cluster the start order; the balancer and monitoring targets.
`sources` names the file (and line) each input came from, where Ansible records it.

Exit codes: 0 ok, 1 the inventory has validation errors (no plan), 2 usage (unknown host, unreadable inventory).""")


class PlanFormat(str, Enum):
    text = "text"
    json = "json"
    yaml = "yaml"


#: Host variables whose origin the plan shows (the inputs of its computation).
SOURCE_VARS = ("vllm_cluster", "node_rank", "ansible_host", "vllm_host_ip", "gpu_count", "nvlink_domain",
               "imex_address", "vllm_venv", "vllm_unit_dir")


def sources(fleet: Any, host: str) -> dict[str, str]:
    """variable -> 'file:line' for the plan's inputs that `host` sets (or its cluster group sets)."""
    from provisioner.plan import cluster_of
    from provisioner.rules import origin

    h = fleet.hosts[host]
    out: dict[str, str] = {}
    c = cluster_of(fleet, host)
    for var in SOURCE_VARS:
        value = fleet.group_vars.get(c.name, {}).get(var) if (c and var == "vllm_cluster") else h.vars.get(var)
        where = origin(value)
        if where:
            out[var] = where
    return out


def _text(plan: dict[str, Any], hosts: list[str]) -> str:
    lines = []
    for name in hosts:
        hp = plan["hosts"][name]
        v = hp["vllm"]
        head = f"{name}: " + (f"cluster {hp['cluster']} ({v['role']}, rank {v['rank']} of {v['nnodes']}; members "
                              f"{', '.join(hp['cluster_members'])})" if v else "in no vLLM cluster")
        lines.append(head)
        if v:
            for u in v["units"]:
                lines.append(f"  unit {u['dest']}")
            lines.append(f"  ExecStart={v['exec_start'] or v['ray_exec_start']}")
        if hp["imex_nodes"]:
            lines.append(f"  IMEX nodes: {', '.join(hp['imex_nodes'])}")
        for var, where in hp.get("sources", {}).items():
            lines.append(f"  {var} from {where}")
    if len(hosts) > 1:
        for c in plan["clusters"]:
            order = ", ".join(f"{s['host']} {s['unit']}" for s in c["steps"])
            lines.append(f"cluster {c['name']}: head {c['head']}, port {c['port']}; start order: {order}")
    return "\n".join(lines) + "\n"


def register(app: typer.Typer) -> None:
    @app.command("plan", help=HELP)
    def plan_cmd(
        inventory: Annotated[Path, typer.Argument(help="Inventory file (INI/YAML) with group_vars/ beside it.",
                                                  show_default=False)],
        host: Annotated[list[str] | None, typer.Option(
            "--host", help="Only this host's plan (repeat for more).", show_default=False)] = None,
        fmt: Annotated[PlanFormat, typer.Option("--format", "-f", help="text, json or yaml.")] = PlanFormat.text,
        extra: Annotated[list[str] | None, typer.Option("--extra-vars", "-e", help=EXTRA_VARS_HELP)] = None,
        vault_password_file: Annotated[Path | None, typer.Option("--vault-password-file", help=VAULT_HELP)] = None,
    ) -> None:
        use_vault(vault_password_file)
        from provisioner.inventory import load_fleet
        from provisioner.plan import compute

        fleet = load_fleet(inventory, extra_vars=extra_vars(extra))
        for h in host or []:
            if h not in fleet.hosts:
                known = ", ".join(sorted(fleet.hosts)[:10])
                raise UsageError(f"unknown host {h!r} (hosts: {known})", path=str(inventory))
        errors, _ = validate(fleet)
        if errors:
            for f in errors:
                err.print(finding_line(f), markup=False)
            err.print(f"{inventory}: {len(errors)} validation error(s): no plan (provision validate {inventory})",
                      markup=False)
            raise typer.Exit(int(Exit.FAIL))
        plan = compute(fleet)
        names = list(host) if host else list(fleet.hosts)
        if host:
            plan = {**plan, "hosts": {h: plan["hosts"][h] for h in names}}
        for n in names:
            plan["hosts"][n] = {**plan["hosts"][n], "sources": sources(fleet, n)}
        if fmt is PlanFormat.json:
            sys.stdout.write(json.dumps(plan, indent=2, default=str) + "\n")
        elif fmt is PlanFormat.yaml:
            import yaml

            sys.stdout.write(yaml.safe_dump(json.loads(json.dumps(plan, default=str)), sort_keys=False))
        else:
            sys.stdout.write(_text(plan, names))
