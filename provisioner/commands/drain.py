"""`provision drain INVENTORY TARGET...` and `provision return INVENTORY TARGET...`: take vLLM clusters out of
service through the balancer and bring them back through the health gate."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

import provisioner.probes  # noqa: F401  (keeps the SSH key variables in the fleet model)
from provisioner.commands.common import VAULT_HELP, Format, unwrap, use_vault
from provisioner.errors import Exit, UsageError

DRAIN_HELP = unwrap("""Take vLLM clusters out of service: balancer first, in-flight requests, then the cluster.

TARGET is a host or a vLLM cluster; a member takes its whole TP/PP cluster with it (said in the output). In order:
the members go in-service -> draining (refused, before anything changes, when that would drain the last cluster
serving a model, unless --force); every balancer (group lb) renders the heads `down` and reloads nginx (no
connection dropped); the heads' running and waiting requests are waited for (at most --wait seconds; what is left is
reported as cut); vLLM stops on the members; the in-service mark is removed (the launch gate then holds the
cluster); the members go draining -> maintenance. A drain stopped half way is finished by running it again.

Exit codes: 0 drained, 1 refused or a step failed (the line says which; the members stay draining), 2 usage.""")

RETURN_HELP = unwrap("""Bring drained vLLM clusters back: health gate, mark, launch, then the balancer.

TARGET is a host or a vLLM cluster (a member brings its whole cluster). The members go to burn-in (from
maintenance, quarantined or a drain left half way), `provision health` runs on them (recorded in the ledger), then
each member's burnin_return_tier (default quick; the burn-in gate, on unless burnin_gate: false, needs a passed tier
since the node left service), and only when every member passes: burn-in -> in-service, the in-service mark
written, vLLM launched (the playbook's vllm tag), the heads' /health waited for (at most --wait-healthy seconds),
and the heads put back into every balancer (group lb). A member failing the gate or its tier stays in burn-in and
its cluster stays out of the balancer.

Exit codes: 0 returned, 1 refused or a step failed, 2 usage.""")


def _prepare(inventory: Path, targets: list[str]) -> tuple[Any, Any]:
    from provisioner.day2.drain import plan
    from provisioner.inventory import load_fleet

    if not targets:
        raise UsageError("name at least one host or vLLM cluster to act on")
    fleet = load_fleet(inventory)
    return fleet, plan(fleet, targets)


def run(inventory: Path, targets: list[str], *, back: bool, reason: str | None, force: bool = False,
        wait: float = 120.0, wait_healthy: float = 900.0, fmt: Format = Format.text) -> int:
    from provisioner.day2.executor import Ops, actor_user, drain_clusters, dumps, return_clusters
    from provisioner.day2.lifecycle import Refused
    from provisioner.ledger.view import open_ledger

    if wait < 0 or wait_healthy <= 0:
        raise UsageError("--wait must be >= 0 and --wait-healthy > 0")
    why = (reason or "").strip() or ("returned" if back else "")
    if not why:
        raise UsageError("--reason must say why (it is kept in the ledger)")
    fleet, p = _prepare(inventory, targets)
    try:
        with open_ledger(fleet) as ledger:
            ops = Ops(inventory, fleet, ledger, actor=actor_user(), quiet=fmt is Format.json,
                      command="return" if back else "drain")
            ok = (return_clusters(ops, p, reason=why, wait_healthy=wait_healthy) if back
                  else drain_clusters(ops, p, reason=why, force=force, wait=wait))
    except Refused as exc:
        sys.stderr.write(f"refused: {exc}\n")
        return int(Exit.FAIL)
    if fmt is Format.json:
        sys.stdout.write(dumps(ops, clusters=list(p.clusters), hosts=list(p.hosts)))
    return int(Exit.OK if ok and not ops.failed else Exit.FAIL)


Inv = Annotated[Path, typer.Argument(help="Inventory file or directory.", show_default=False)]
Targets = Annotated[list[str], typer.Argument(help="Hosts or vLLM clusters.", show_default=False)]
Fmt = Annotated[Format, typer.Option("--format", "-f", help="Text or JSON.")]


def register(app: typer.Typer) -> None:
    @app.command("drain", help=DRAIN_HELP)
    def drain_cmd(
        inventory: Inv,
        targets: Targets,
        reason: Annotated[str, typer.Option("--reason", "-r", help="Why (kept in the ledger).",
                                            show_default=False)],
        force: Annotated[bool, typer.Option("--force", help="Drain even the last cluster serving a model.")] = False,
        wait: Annotated[float, typer.Option("--wait", help="Seconds to wait for in-flight requests.")] = 120.0,
        fmt: Fmt = Format.text,
        vault_password_file: Annotated[Path | None, typer.Option("--vault-password-file", help=VAULT_HELP)] = None,
    ) -> None:
        use_vault(vault_password_file)
        raise typer.Exit(run(inventory, targets, back=False, reason=reason, force=force, wait=wait, fmt=fmt))

    @app.command("return", help=RETURN_HELP)
    def return_cmd(
        inventory: Inv,
        targets: Targets,
        reason: Annotated[str, typer.Option("--reason", "-r", help="Why (kept in the ledger).")] = "returned",
        wait_healthy: Annotated[float, typer.Option(
            "--wait-healthy", help="Seconds to wait for each head's /health after the launch.")] = 900.0,
        fmt: Fmt = Format.text,
        vault_password_file: Annotated[Path | None, typer.Option("--vault-password-file", help=VAULT_HELP)] = None,
    ) -> None:
        use_vault(vault_password_file)
        raise typer.Exit(run(inventory, targets, back=True, reason=reason, wait_healthy=wait_healthy, fmt=fmt))
