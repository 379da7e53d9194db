"""`provision ledger adopt INVENTORY` (records from before sites to one site) and `provision ledger compact INVENTORY`
(retention: old per-check rows into daily summaries)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from provisioner.commands.common import unwrap
from provisioner.errors import Exit, UsageError
from provisioner.ledger.retention import DEFAULT_ARCHIVE_DAYS, DEFAULT_KEEP_DAYS, DEFAULT_SUMMARY_DAYS

ADOPT_HELP = unwrap("""Give every record the ledger holds from before sites to INVENTORY's site.

A ledger written before sites keyed hosts by name alone: its runs, transitions, remediation steps and rollouts
belong to no site, no inventory sees them, and commands that move lifecycle states refuse until they have an owner
(docs/lifecycle.md, Sites). Run this once with the inventory that wrote them. A ledger that several inventories
shared before cannot be split by host name (two racks' node01 are one name): adopt it with one of them; the others
start with their hosts `new`.

Exit codes: 0 adopted (or nothing to adopt), 1 the ledger cannot be written, 2 usage.""")


def adopt(inventory: Path) -> int:
    from provisioner.inventory import load_fleet
    from provisioner.ledger import Ledger
    from provisioner.ledger.site import site_of
    from provisioner.paths import ledger_path

    site = site_of(load_fleet(inventory))
    path = ledger_path()
    if not str(path).startswith(("postgresql://", "postgres://")) and not Path(path).exists():
        sys.stdout.write(f"no ledger at {path}: nothing to adopt\n")
        return int(Exit.OK)
    with Ledger.open(path, site=site) as ledger:
        moved = ledger.adopt()
    n = sum(moved.values())
    if not n:
        sys.stdout.write(f"nothing to adopt: every record of {ledger.where} has a site\n")
    else:
        sys.stdout.write(f"site {site}: adopted " + ", ".join(f"{v} {k}" for k, v in moved.items() if v) + "\n")
    return int(Exit.OK)


COMPACT_HELP = unwrap("""Fold INVENTORY's site's per-check ledger rows older than --keep-days into daily summaries.

Host outcomes, health results and drift items of runs that began before the window become one row per host, UTC
day and command (counts per outcome, the failed checks, the number of drift items: `provision history` shows them).
Kept whatever their age: runs, lifecycle transitions, remediation steps, incidents, rollouts, recorded host states,
and each host's newest outcome of each command (status and the health gate read it). Idempotent; the nightly timer
runs it after the drift check (playbooks/drift_timer.yml, drift_ledger_keep_days). docs/lifecycle.md, Retention.

Bounded over years: daily summaries older than --summary-days become one row per host, month and command, only for
the months with a non-ok outcome; monthly rows older than --archive-days are dropped.

Exit codes: 0 compacted (or nothing to do), 1 the ledger cannot be written, 2 usage.""")


def compact(inventory: Path, keep_days: int, summary_days: int = DEFAULT_SUMMARY_DAYS,
            archive_days: int = DEFAULT_ARCHIVE_DAYS) -> int:
    from provisioner.inventory import load_fleet
    from provisioner.ledger import Ledger
    from provisioner.ledger.retention import compact as fold
    from provisioner.ledger.retention import day_of
    from provisioner.ledger.site import site_of
    from provisioner.paths import ledger_path

    if keep_days < 1:
        raise UsageError(f"--keep-days must be at least 1, got {keep_days}")
    if not keep_days <= summary_days <= archive_days:
        raise UsageError(f"need --keep-days <= --summary-days <= --archive-days, got {keep_days}, {summary_days}, "
                         f"{archive_days}")
    site = site_of(load_fleet(inventory))
    path = ledger_path()
    if not str(path).startswith(("postgresql://", "postgres://")) and not Path(path).exists():
        sys.stdout.write(f"no ledger at {path}: nothing to compact\n")
        return int(Exit.OK)
    with Ledger.open(path, site=site) as ledger:
        done = fold(ledger, keep_days, summary_days=summary_days, archive_days=archive_days)
    sys.stdout.write(f"site {site}: {done.runs} run(s) before {day_of(done.cutoff)} folded: {done.outcomes} host "
                     f"outcome(s), {done.health} health result(s), {done.drift} drift item(s) -> {done.summaries} "
                     "daily summary row(s); "
                     f"{done.rolled} daily summary row(s) rolled into {done.months} monthly row(s), "
                     f"{done.expired} monthly row(s) expired\n")
    return int(Exit.OK)


def register(app: typer.Typer) -> None:
    group = typer.Typer(name="ledger", help="The fleet ledger's upkeep (docs/lifecycle.md).", no_args_is_help=True)

    @group.command("adopt", help=ADOPT_HELP)
    def adopt_cmd(
        inventory: Annotated[Path, typer.Argument(help="Inventory file or directory.", show_default=False)],
    ) -> None:
        raise typer.Exit(adopt(inventory))

    @group.command("compact", help=COMPACT_HELP)
    def compact_cmd(
        inventory: Annotated[Path, typer.Argument(help="Inventory file or directory.", show_default=False)],
        keep_days: Annotated[int, typer.Option(
            "--keep-days", min=1, help="Days of per-check rows kept in full.")] = DEFAULT_KEEP_DAYS,
        summary_days: Annotated[int, typer.Option(
            "--summary-days", min=1, help="Days of daily summaries kept; older: monthly rows.")] = DEFAULT_SUMMARY_DAYS,
        archive_days: Annotated[int, typer.Option(
            "--archive-days", min=1, help="Days of monthly rows kept.")] = DEFAULT_ARCHIVE_DAYS,
    ) -> None:
        raise typer.Exit(compact(inventory, keep_days, summary_days, archive_days))

    app.add_typer(group)
