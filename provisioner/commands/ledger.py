"""`provision ledger adopt INVENTORY`: give the ledger's records from before sites to one inventory's site."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from provisioner.commands.common import unwrap
from provisioner.errors import Exit

ADOPT_HELP = unwrap("""Give every record the ledger holds from before sites to INVENTORY's site.

A ledger written before sites keyed hosts by name alone: its runs, transitions, remediation steps and rollouts
belong to no site, no inventory sees them, and commands that move lifecycle states refuse until they have an owner
(docs/lifecycle.md, Sites). Run this once with the inventory that wrote them. A ledger that several inventories
shared before cannot be split by host name (two racks' node01 are one name): adopt it with one of them; the others
start with their hosts `new`.

Exit codes: 0 adopted (or nothing to adopt), 1 the ledger cannot be written, 2 usage.""")


def adopt(inventory: Path) -> int:
    from provisioner.inventory import load_fleet
    from provisioner.ledger import Ledger, LedgerError
    from provisioner.ledger.site import site_of
    from provisioner.paths import ledger_path

    site = site_of(load_fleet(inventory))
    path = ledger_path()
    if not str(path).startswith(("postgresql://", "postgres://")) and not Path(path).exists():
        sys.stdout.write(f"no ledger at {path}: nothing to adopt\n")
        return int(Exit.OK)
    try:
        with Ledger.open(path, site=site) as ledger:
            moved = ledger.adopt()
    except LedgerError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return int(Exit.FAIL)
    n = sum(moved.values())
    if not n:
        sys.stdout.write(f"nothing to adopt: every record of {ledger.where} has a site\n")
    else:
        sys.stdout.write(f"site {site}: adopted " + ", ".join(f"{v} {k}" for k, v in moved.items() if v) + "\n")
    return int(Exit.OK)


def register(app: typer.Typer) -> None:
    group = typer.Typer(name="ledger", help="The fleet ledger's upkeep (docs/lifecycle.md).", no_args_is_help=True)

    @group.command("adopt", help=ADOPT_HELP)
    def adopt_cmd(
        inventory: Annotated[Path, typer.Argument(help="Inventory file or directory.", show_default=False)],
    ) -> None:
        raise typer.Exit(adopt(inventory))

    app.add_typer(group)
