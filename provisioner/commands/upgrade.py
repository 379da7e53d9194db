"""`provision upgrade INVENTORY [-e K=V]...`: a rolling upgrade of the vLLM clusters, cluster by cluster through drain
and return, recorded in the ledger so that a rerun resumes where it stopped."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

import provisioner.probes  # noqa: F401  (keeps the SSH key variables in the fleet model)
from provisioner.commands.common import EXTRA_VARS_HELP, VAULT_HELP, Format, finding_line, unwrap, use_vault
from provisioner.errors import Exit, UsageError

HELP = unwrap("""Roll a change (driver, Fabric Manager, CUDA/NCCL, vLLM pin; inventory or -e) over the vLLM clusters.

Cluster by cluster, at most --max-unavailable out at a time and never the last one serving a model (unless --force):
drain (balancer, in flight, stop, mark: as provision drain); check that no process holds /dev/nvidia* on the members
(the process is named and the rollout stops, the cluster left drained); run playbooks/site.yml on the members
without the vLLM launch, with provision_allow_reboot=true (the driver role reboots only where the kernel module
package changed); return (health gate, mark, vLLM launch with the same -e, /health, balancer). A line after each
batch says the clusters done and left and what serves now.

Every step is in the ledger. A failure stops the rollout with its cluster drained and the step that failed; rerun
the same command (same inventory, same -e) to resume from there. A different change is refused while one is open:
--abort first, which returns the clusters the rollout took out (their vLLM launched with the -e given to --abort)
and closes it. Hosts outside any vLLM cluster are not touched (provision run --limit for those).

Exit codes: 0 done (or nothing to abort), 1 refused, stopped or a return failed, 2 usage.""")


def _key(inventory: Path) -> str:
    return str(inventory.resolve())


def _models(fleet: Any) -> dict[str, str]:
    from provisioner.ledger.view import cluster_model

    return {n: cluster_model(c, n) for n, c in fleet.clusters.items()}


def run(inventory: Path, extra: list[str] | None = None, *, max_unavailable: int = 1, abort: bool = False,
        force: bool = False, reason: str | None = None, wait: float = 120.0, wait_healthy: float = 900.0,
        fmt: Format = Format.text) -> int:
    from provisioner.commands.common import extra_vars, validate
    from provisioner.day2.executor import Ops, actor_user, dumps, upgrade
    from provisioner.day2.rollout import spec_digest
    from provisioner.drift.tiers import host_inputs
    from provisioner.inventory import load_fleet
    from provisioner.ledger.view import open_ledger

    if max_unavailable < 1:
        raise UsageError("--max-unavailable must be >= 1")
    if wait < 0 or wait_healthy <= 0:
        raise UsageError("--wait must be >= 0 and --wait-healthy > 0")
    why = (reason or "").strip() or "rolling upgrade"
    xv = extra_vars(extra)
    fleet = load_fleet(inventory, extra_vars=xv)
    from provisioner import vault

    vault.require(fleet, sorted({m for c in fleet.clusters.values() for m in c.members}), xv, "provision upgrade")
    if not fleet.clusters:
        raise UsageError("no vLLM clusters in the inventory: nothing to roll (provision run applies a change)",
                         path=str(inventory))
    errors, _ = validate(fleet)
    if errors:
        for e in errors:
            sys.stderr.write(f"error {finding_line(e)}\n")
        sys.stderr.write(f"refusing to upgrade: {len(errors)} validation error(s) (see `provision validate "
                         f"{inventory}`)\n")
        return int(Exit.FAIL)
    models = _models(fleet)
    members = sorted({m for c in fleet.clusters.values() for m in c.members})
    with open_ledger(fleet) as ledger:
        key = ledger.digest_key()  # the ledger's one key (the spec digest is recorded there)
        digest = spec_digest(host_inputs(fleet, members, code=False, key=key), xv, key)
        ops = Ops(inventory, fleet, ledger, actor=actor_user(), quiet=fmt is Format.json, extravars=xv,
                  command="upgrade")
        ok, rid, refused = upgrade(ops, ledger, fleet, models, key=_key(inventory), digest=digest, xv=xv,
                                   max_unavailable=max_unavailable, abort=abort, force=force, reason=why,
                                   wait=wait, wait_healthy=wait_healthy)
    if refused is not None:
        sys.stderr.write(refused + "\n")
        return int(Exit.FAIL)
    if fmt is Format.json:
        sys.stdout.write(dumps(ops, rollout=rid))
    return int(Exit.OK if ok else Exit.FAIL)


Inv = Annotated[Path, typer.Argument(help="Inventory file or directory.", show_default=False)]


def register(app: typer.Typer) -> None:
    @app.command("upgrade", help=HELP)
    def upgrade_cmd(
        inventory: Inv,
        extra: Annotated[list[str] | None, typer.Option("--extra-vars", "-e", help=EXTRA_VARS_HELP)] = None,
        max_unavailable: Annotated[int, typer.Option(
            "--max-unavailable", help="Clusters out of service at a time.")] = 1,
        abort: Annotated[bool, typer.Option("--abort", help="Return what the open rollout took out, close it.")
                         ] = False,
        force: Annotated[bool, typer.Option("--force", help="Take out even the last cluster serving a model.")] = False,
        reason: Annotated[str | None, typer.Option("--reason", "-r", help="Why (kept in the ledger).")] = None,
        wait: Annotated[float, typer.Option("--wait", help="Seconds to wait for in-flight requests.")] = 120.0,
        wait_healthy: Annotated[float, typer.Option(
            "--wait-healthy", help="Seconds to wait for each head's /health after the launch.")] = 900.0,
        fmt: Annotated[Format, typer.Option("--format", "-f", help="Text or JSON.")] = Format.text,
        vault_password_file: Annotated[Path | None, typer.Option("--vault-password-file", help=VAULT_HELP)] = None,
    ) -> None:
        use_vault(vault_password_file)
        raise typer.Exit(run(inventory, extra, max_unavailable=max_unavailable, abort=abort, force=force,
                             reason=reason, wait=wait, wait_healthy=wait_healthy, fmt=fmt))
