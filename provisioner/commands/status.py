"""`provision status INVENTORY`: one table of every inventory host's lifecycle state (from the ledger)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from provisioner.commands.common import VAULT_HELP, Format, unwrap, use_vault
from provisioner.errors import Exit, UsageError

HELP = unwrap("""Show every host of INVENTORY: lifecycle state and since, cluster, last run, health and drift.

The states and runs come from the ledger (PROVISION_LEDGER, else ledger.sqlite3 in the runs directory: see
docs/lifecycle.md); a host the ledger has never seen is `new`. A run whose process was killed reads `interrupted`.
--html FILE also writes one self-contained page: the same table and each node's timeline of transitions, health
passes and remediation steps.

The mark, driver and vllm columns say what was seen of the in-service mark, the NVIDIA driver and vLLM: without
--nodes, what the ledger holds (the driver from the last health pass or the last complete run's recorded state;
the mark `recorded` when that state holds /etc/provisioner/in-service; `-` unknown). --nodes reads all three on
every node, one SSH exec each, in parallel; a node that does not answer reads `unreachable`.

Exit codes: 0 shown, 1 the ledger cannot be read, 2 usage.""")


def run(inventory: Path, fmt: Format = Format.text, html: Path | None = None, nodes: bool = False) -> int:
    from provisioner.inventory import load_fleet
    from provisioner.ledger import LedgerError
    from provisioner.ledger.view import history, read_ledger, status_rows, when

    fleet = load_fleet(inventory)
    try:
        with read_ledger() as ledger:
            rows = status_rows(fleet, ledger)
            histories = {r["host"]: history(ledger, r["host"]) for r in rows} if html is not None else {}
    except LedgerError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return int(Exit.FAIL)
    if nodes:
        from provisioner.probes.seen import look

        seen = look(fleet, [r["host"] for r in rows])
        for r in rows:
            r.update(seen[r["host"]])
    if html is not None:
        import time

        from provisioner.reports.status_html import render
        from provisioner.reports.textfile import write_atomic

        try:
            write_atomic(html, render(str(inventory), rows, histories, when, time.time()))
        except OSError as exc:
            raise UsageError(f"cannot write the HTML page: {exc.strerror or exc}", path=str(html)) from None
    if fmt is Format.json:
        sys.stdout.write(json.dumps({"inventory": str(inventory), "hosts": rows}, indent=2) + "\n")
        return int(Exit.OK)
    from rich.console import Console
    from rich.table import Table

    from provisioner.probes.seen import cell

    table = Table(title=f"fleet status: {inventory}", title_justify="left")
    for col in ("host", "state", "since", "cluster", "last run", "health", "drift", "mark", "driver", "vllm"):
        table.add_column(col)
    for r in rows:
        last, health, drift = r["last_run"], r["health"], r["drift"]
        lr = "-" if last is None else f"{last['command']} #{last['id']} {when(last['started'])}: {last['outcome']}" + (
            f" (run {last['status']})" if last["status"] in ("running", "interrupted")
            and last["status"] != last["outcome"] else "")
        hl = "-" if health is None else f"{when(health['started'])}: {health['result']}" + (
            f" ({', '.join(health['failed'])})" if health["failed"] else "")
        dr = "-" if drift is None else f"{when(drift['started'])}: {drift['items']} item(s)" + (
            "" if drift["outcome"] in ("ok", "changed") else f" ({drift['outcome']})")
        table.add_row(r["host"], r["state"], when(r["since"]), r["cluster"] or "-", lr, hl, dr,
                      cell(r.get("mark"), "mark"), cell(r.get("driver")), cell(r.get("vllm")))
    Console(highlight=False, soft_wrap=True).print(table)
    return int(Exit.OK)


def register(app: typer.Typer) -> None:
    @app.command("status", help=HELP)
    def status_cmd(
        inventory: Annotated[Path, typer.Argument(help="Inventory file or directory.", show_default=False)],
        fmt: Annotated[Format, typer.Option("--format", "-f", help="Table (text) or JSON.")] = Format.text,
        html: Annotated[Path | None, typer.Option(
            "--html", help="Also write a self-contained HTML page (table + each node's timeline) here.",
            show_default=False)] = None,
        nodes: Annotated[bool, typer.Option(
            "--nodes", help="Read the in-service mark, driver and vLLM versions on every node (one SSH exec each).",
        )] = False,
        vault_password_file: Annotated[Path | None, typer.Option("--vault-password-file", help=VAULT_HELP)] = None,
    ) -> None:
        use_vault(vault_password_file)
        raise typer.Exit(run(inventory, fmt, html, nodes))
