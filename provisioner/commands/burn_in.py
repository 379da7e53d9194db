"""`provision burn-in INVENTORY HOST... --tier`: run the burn-in tier on GPU nodes, judge it, record it."""

from __future__ import annotations

import sys
import time
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

import provisioner.probes  # noqa: F401  (keeps the SSH key variables in the fleet model)
from provisioner.commands.common import VAULT_HELP, Format, load_targets, unwrap, use_vault
from provisioner.errors import Exit


class Tier(str, Enum):
    quick = "quick"
    standard = "standard"
    soak = "soak"


HELP = unwrap("""Run a burn-in tier on GPU nodes and judge every GPU against the GPU model's thresholds.

Runs roles/node_burnin/files/node_burnin.py on each HOST (over SSH, in parallel; the program travels in the
command). quick (<= 5 min): GEMM bf16/fp8, HBM copy, host<->device copy, silent-data-corruption GEMMs, clocks,
throttle reasons and the PCIe link under load, single-node NCCL all-reduce, ECC/XID deltas, DCGM level 2 where
installed. standard (<= 45 min): quick + P2P bandwidth, a sustained stress with the thermal watch, DCGM level 3.
soak (hours): the stress repeated, DCGM level 4. Thresholds: provisioner/catalog/burnin.yaml (docs/burn-in.md).
Every check per GPU goes into the ledger; `provision status` shows the last burn-in and slow nodes.

Exit codes: 0 every host passed, 1 a check failed or a host was unreachable, 2 usage.""")


def register(app: typer.Typer) -> None:
    @app.command("burn-in", help=HELP)
    def burnin_cmd(
        inventory: Annotated[Path, typer.Argument(help="Inventory file or directory.", show_default=False)],
        hosts: Annotated[list[str] | None, typer.Argument(
            help="Hosts/groups/globs (Ansible style); none: every GPU node.", show_default=False)] = None,
        tier: Annotated[Tier, typer.Option("--tier", "-t", help="Which tier to run.")] = Tier.quick,
        fmt: Annotated[Format, typer.Option("--format", "-f", help="Report on stdout.")] = Format.text,
        timeout: Annotated[float | None, typer.Option(
            "--timeout", help="Seconds per host (default: 600 quick, 3600 standard, 43200 soak).")] = None,
        forks: Annotated[int, typer.Option("--forks", help="Hosts at once.")] = 64,
        vault_password_file: Annotated[Path | None, typer.Option("--vault-password-file", help=VAULT_HELP)] = None,
    ) -> None:
        use_vault(vault_password_file)
        from provisioner.ledger.record import record_burnin
        from provisioner.probes.burnin import render_json, render_text, run_burnin

        secs = timeout if timeout is not None else {"quick": 600.0, "standard": 3600.0, "soak": 43200.0}[tier.value]
        fleet, targets = load_targets(inventory, ":".join(hosts) if hosts else None, secs, forks)
        t0, started = time.monotonic(), time.time()
        results = run_burnin(fleet, targets, tier=tier.value, timeout=secs, forks=forks)
        seconds = time.monotonic() - t0
        record_burnin(results, tier.value, inventory, started, seconds, fleet=fleet)
        sys.stdout.write(render_json(results, seconds) if fmt is Format.json else render_text(results, seconds))
        raise typer.Exit(int(Exit.OK if all(h.ok for h in results.values()) else Exit.FAIL))
