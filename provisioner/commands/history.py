"""`provision history HOST`: a host's lifecycle transitions and runs, from the ledger."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from provisioner.commands.common import VAULT_HELP, Format, printable, unwrap, use_vault
from provisioner.errors import Exit, UsageError

HELP = unwrap("""Show HOST's lifecycle transitions (oldest first) and the runs that touched it (newest first).

Read from the ledger (docs/lifecycle.md), for one site: the site of --inventory (HOST must be one of its hosts: a
typo is a usage error instead of an empty history), or --site; with neither, the one site that has records of
HOST (a usage error when several do: two racks that both have a node01).

Exit codes: 0 shown, 1 the ledger cannot be read, 2 usage.""")


def run(host: str, inventory: Path | None = None, fmt: Format = Format.text, site: str | None = None) -> int:
    from provisioner.ledger.site import site_name, site_of
    from provisioner.ledger.view import history, read_ledger, unowned_warning, when

    if inventory is not None and site is not None:
        raise UsageError("give --inventory or --site, not both")
    if inventory is not None:
        from provisioner.inventory import load_fleet

        fleet = load_fleet(inventory)
        if host not in fleet.hosts:
            raise UsageError(f"{host} is not a host of the inventory", path=str(inventory))
        site = site_of(fleet)
    elif site is not None:
        site = site_name(site)
    with read_ledger() as ledger:
        if site is None:
            found = ledger.sites_of(host)
            if len(found) > 1:
                raise UsageError(f"{host} has records in {len(found)} sites ({', '.join(found)}): name one with "
                                 "--inventory or --site")
            site = found[0] if found else ""
        ledger.site = site
        h = history(ledger, host)
        warning = unowned_warning(ledger)
    if warning:
        sys.stderr.write(warning + "\n")
    h = {"site": site, **h}
    if fmt is Format.json:
        sys.stdout.write(json.dumps(h, indent=2) + "\n")
        return int(Exit.OK)
    out = [f"{host}: {h['state']} since {when(h['since'])}"]
    out.append("transitions:" if h["transitions"] else "transitions: none")
    for t in h["transitions"]:
        forced = " (forced)" if t["forced"] else ""
        out.append(f"  {when(t['at'])}  {t['from']} -> {t['to']}{forced}  by {t['actor']}: {t['reason']}")
    out.append("runs:" if h["runs"] else "runs: none")
    for r in h["runs"]:
        extra = ""
        if r["failed_checks"]:
            extra += f"  failed: {', '.join(r['failed_checks'])}"
        if r["drift"]:
            extra += f"  drift: {len(r['drift'])} item(s)"
        out.append(f"  #{r['id']} {when(r['started'])}  {r['command']}  {r['outcome'] or '-'} (run {r['status']})"
                   f"{extra}" + (f"  {r['run_dir']}" if r["run_dir"] else ""))
    if h.get("days"):
        out.append("older runs, one line per day (ledger retention):")
        for d in h["days"]:
            extra = f"  failed: {', '.join(d['failed_checks'])}" if d["failed_checks"] else ""
            extra += f"  drift: {d['drift_items']} item(s)" if d["drift_items"] else ""
            out.append(f"  {d['day']}  {d['command']}  {d['runs']} run(s): {d['ok']} ok, {d['changed']} changed, "
                       f"{d['drift']} drift, {d['failed']} failed{extra}")
    sys.stdout.write("\n".join(printable(line) for line in out) + "\n")  # a reason's ESC [ ... shows as text
    return int(Exit.OK)


def register(app: typer.Typer) -> None:
    @app.command("history", help=HELP)
    def history_cmd(
        host: Annotated[str, typer.Argument(help="Inventory host name.", show_default=False)],
        inventory: Annotated[Path | None, typer.Option(
            "--inventory", "-i", help="Check HOST against this inventory.", show_default=False)] = None,
        fmt: Annotated[Format, typer.Option("--format", "-f", help="Text or JSON.")] = Format.text,
        site: Annotated[str | None, typer.Option(
            "--site", help="The site to read (as `provision status --all-sites` names it).", show_default=False)]
        = None,
        vault_password_file: Annotated[Path | None, typer.Option("--vault-password-file", help=VAULT_HELP)] = None,
    ) -> None:
        use_vault(vault_password_file)
        raise typer.Exit(run(host, inventory, fmt, site))
