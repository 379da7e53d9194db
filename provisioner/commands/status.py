"""`provision status INVENTORY`: one table of every inventory host's lifecycle state (from the ledger)."""

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from provisioner.commands.common import VAULT_HELP, Format, printable, unwrap, use_vault
from provisioner.errors import Exit, UsageError

if TYPE_CHECKING:
    import typer

#: provisioner.cli's fast path (no typer import: ~0.3 s of a 10,000-host `status`); --all-sites, --help and anything
#: unusual go through typer (register()).
FAST_OPTIONS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "--format": ("fmt", Format), "-f": ("fmt", Format), "--html": ("html", Path), "--nodes": ("nodes", bool),
    "--vault-password-file": ("vault_password_file", Path),
}

HELP = unwrap("""Show every host of INVENTORY: lifecycle state and since, cluster, last run, health and drift.

The states and runs come from the ledger (PROVISION_LEDGER, else ledger.sqlite3 in the runs directory: see
docs/lifecycle.md); a host the ledger has never seen is `new`. A run whose process was killed reads `interrupted`.
Under the table: the remediation breaker when open, the open incidents and the recommendations waiting for
`provision remediate --approve ID` (JSON: `day2`).

--html FILE also writes one self-contained page: the same table and each node's timeline of transitions, health
passes and remediation steps.

The mark, driver and vllm columns say what was seen of the in-service mark, the NVIDIA driver and vLLM: without
--nodes, what the ledger holds (the driver from the last health pass or the last complete run's recorded state;
the mark `recorded` when that state holds /etc/provisioner/in-service; `-` unknown). --nodes reads all three on
every node, one SSH exec each, in parallel; a node that does not answer reads `unreachable`; and it runs the
generation probe on every cluster head (one more exec each: a greedy completion with the API key, which stays on the
head, compared with the head's launch answer; docs/serving.md): a `serving` line per cluster, `NOT serving` with why.

Only the records of the inventory's site are shown (`provision_site`, else the inventory's resolved path): another
inventory's node01 is another host. --all-sites (no INVENTORY) lists every site in the ledger instead.

Exit codes: 0 shown, 1 the ledger cannot be read, 2 usage.""")


def all_sites(fmt: Format = Format.text) -> int:
    """`provision status --all-sites`: one row per site of the ledger."""
    from provisioner.ledger.view import read_ledger, when

    with read_ledger() as ledger:
        sites = ledger.sites()
    if fmt is Format.json:
        sys.stdout.write(json.dumps({"sites": sites}, indent=2) + "\n")
        return int(Exit.OK)
    if not sites:
        sys.stdout.write("no sites: the ledger is empty\n")
        return int(Exit.OK)
    for s in sites:  # one block per site: the name is never cut, whatever the width
        last = s["last_run"]
        states = ", ".join(f"{n} {k}" for k, n in s["states"].items()) or "-"
        sys.stdout.write(f"{s['site'] or '(unowned: from before sites, provision ledger adopt INVENTORY)'}\n"
                         f"  hosts {s['hosts']} ({states}); runs {s['runs']}" + (
                             f"; last {last['command']} #{last['id']} {when(last['started'])}: {last['status']}"
                             if last else "") + "\n")
    return int(Exit.OK)


def run(inventory: Path, fmt: Format = Format.text, html: Path | None = None, nodes: bool = False,
        vault_password_file: Path | None = None) -> int:
    use_vault(vault_password_file)
    from provisioner.inventory import load_fleet
    from provisioner.ledger.site import site_of
    from provisioner.ledger.view import (
        burnin_distribution,
        day2_view,
        history,
        read_ledger,
        status_rows,
        unowned_warning,
        when,
    )

    fleet = load_fleet(inventory)
    site = site_of(fleet)
    with read_ledger(site=site) as ledger:
        rows = status_rows(fleet, ledger)
        day2 = day2_view(ledger)
        histories = {r["host"]: history(ledger, r["host"]) for r in rows} if html is not None else {}
        dist = burnin_distribution(fleet, ledger) if html is not None else []
        warning = unowned_warning(ledger)
    if warning:
        sys.stderr.write(warning + "\n")
    serving: list[dict] | None = None
    if nodes:
        from provisioner.probes.seen import look
        from provisioner.probes.serving import probe_heads

        seen = look(fleet, [r["host"] for r in rows])
        for r in rows:
            r.update(seen[r["host"]])
        serving = probe_heads(fleet)
    if html is not None:
        import time

        from provisioner.reports.status_html import render
        from provisioner.reports.textfile import write_atomic

        try:
            write_atomic(html, render(str(inventory), rows, histories, when, time.time(), day2=day2,
                                      distribution=dist, serving=serving))
        except OSError as exc:
            raise UsageError(f"cannot write the HTML page: {exc.strerror or exc}", path=str(html)) from None
    if fmt is Format.json:
        brief = {k: v for k, v in day2.items() if k != "incidents"}
        doc = {"inventory": str(inventory), "site": site, "hosts": rows, "day2": brief}
        if serving is not None:
            doc["serving"] = serving
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return int(Exit.OK)
    from rich.console import Console

    from provisioner.probes.seen import cell
    from provisioner.reports.status_text import cells
    from provisioner.reports.status_text import render as render_text

    render_text(Console(highlight=False), f"fleet status: {printable(str(inventory))}",
           [{k: printable(v) for k, v in cells(r, when, cell).items()} for r in rows])  # text, never a control
    for text in day2_lines(day2, when, str(inventory)):
        sys.stdout.write(printable(text) + "\n")
    if serving is not None:
        from provisioner.probes.serving import line

        for p in serving:
            sys.stdout.write(f"serving: {printable(line(p))}\n")
    return int(Exit.OK)


def day2_lines(day2: dict[str, Any], when: Any, inventory: str) -> list[str]:
    """The breaker, open incidents and waiting recommendations under the table (nothing when there are none)."""
    out = []
    b = day2["breaker"]
    if b["open"]:
        out.append(f"remediation breaker: OPEN since {when(b['since'])}: {b['why']} (automatic take-outs stopped; "
                   f"provision remediate {inventory} --close-breaker --reason WHY)")
    for r in day2["open_incidents"]:
        out.append(f"open incident #{r['id']}: {r['host']} since {when(r['detected'])} ({r['source']}): {r['cause']}")
    for a in day2["recommended"]:
        what = a["kind"] + (f" {a['step']}" if a["step"] else "")
        out.append(f"recommended #{a['id']}: {a['host']}: {what} ({a['reason']}): provision remediate {inventory} "
                   f"--approve {a['id']}")
    return out


def register(app: "typer.Typer") -> None:
    # no `from __future__ import annotations` in this module: typer reads these annotations, and typer is imported
    # here only (the fast path never imports it)
    import typer

    @app.command("status", help=HELP)
    def status_cmd(
        inventory: Annotated[Path | None, typer.Argument(help="Inventory file or directory.", show_default=False)]
        = None,
        fmt: Annotated[Format, typer.Option("--format", "-f", help="Table (text) or JSON.")] = Format.text,
        html: Annotated[Path | None, typer.Option(
            "--html", help="Also write a self-contained HTML page (table + each node's timeline) here.",
            show_default=False)] = None,
        nodes: Annotated[bool, typer.Option(
            "--nodes", help="Read the in-service mark, driver and vLLM versions on every node (one SSH exec each).",
        )] = False,
        every_site: Annotated[bool, typer.Option(
            "--all-sites", help="List every site in the ledger (no INVENTORY).")] = False,
        vault_password_file: Annotated[Path | None, typer.Option("--vault-password-file", help=VAULT_HELP)] = None,
    ) -> None:
        use_vault(vault_password_file)
        if every_site:
            if inventory is not None or html is not None or nodes:
                raise UsageError("--all-sites lists the sites of the ledger: it takes no INVENTORY, --html or --nodes")
            raise typer.Exit(all_sites(fmt))
        if inventory is None:
            raise UsageError("name an INVENTORY (or --all-sites)")
        raise typer.Exit(run(inventory, fmt, html, nodes, vault_password_file))
