"""`provision incidents INVENTORY`: the incidents of the site (detected -> quarantined -> drained -> steps ->
returned or marked for replacement) with their times, per node the time between incidents, and the distributions."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from provisioner.commands.common import VAULT_HELP, Format, printable, unwrap, use_vault
from provisioner.errors import Exit, UsageError

HELP = unwrap("""List the incidents of INVENTORY's site with time to detect, drain and return.

One incident per fault the remediation loop acted on (provision remediate, its timer or the alert receiver): when
the signal was seen, when the loop decided (time to detect), when the node's cluster was out of service (time to
drain), each remediation step, and when the node returned (time to return) or was marked for replacement. Per node:
the incidents and the mean time between them. Then p50 / p99 / max of each time over the incidents listed, and the
remediation breaker's state.

--prometheus FILE also writes the incidents' histograms, the open incidents and the breaker's state in the
Prometheus text format (node_exporter's textfile collector; the alert receiver serves the same text).

Exit codes: 0 shown, 1 the ledger cannot be read, 2 usage.""")


def _s(v: Any) -> str:
    return "-" if v is None else f"{float(v):.1f}s"


def run(inventory: Path, fmt: Format = Format.text, host: str | None = None, open_only: bool = False,
        prometheus: Path | None = None) -> int:
    from provisioner.day2.incidents import distributions, per_node
    from provisioner.inventory import load_fleet
    from provisioner.ledger.site import site_of
    from provisioner.ledger.view import day2_view, read_ledger, when

    fleet = load_fleet(inventory)
    if host is not None and host not in fleet.hosts:
        raise UsageError(f"--host {host} is not a host of the inventory", path=str(inventory))
    site = site_of(fleet)
    with read_ledger(site=site) as ledger:
        view = day2_view(ledger)
    table = [r for r in view["incidents"] if (host is None or r["host"] == host)
             and (not open_only or r["status"] == "open")]
    dist = distributions(table)
    nodes = per_node(table)
    if prometheus is not None:
        from provisioner.reports.incidents_prometheus import render
        from provisioner.reports.textfile import write_atomic

        try:
            write_atomic(prometheus, render(view["incidents"], site=site, open_incidents=len(view["open_incidents"]),
                                            breaker_open=view["breaker"]["open"],
                                            recommended=len(view["recommended"])))
        except OSError as exc:
            raise UsageError(f"cannot write the metrics: {exc.strerror or exc}", path=str(prometheus)) from None
    if fmt is Format.json:
        sys.stdout.write(json.dumps({"inventory": str(inventory), "site": site, "breaker": view["breaker"],
                                     "incidents": table, "per_node": nodes,
                                     "distributions": {k: {x: y for x, y in v.items() if x != "values"}
                                                       for k, v in dist.items()}}, indent=2) + "\n")
        return int(Exit.OK)
    out = []
    for r in table:
        end = {"returned": f"returned {when(r['returned'])}", "replaced": f"marked for replacement "
               f"{when(r['replaced'])}"}.get(r["status"], "OPEN")
        out.append(f"#{r['id']} {r['host']} ({r['cluster'] or 'no cluster'}, {r['source']}): {r['cause']}; detected "
                   f"{when(r['detected'])}, detect {_s(r['detect_s'])}, drain {_s(r['drain_s'])}, return "
                   f"{_s(r['return_s'])}; {end}")
    if not table:
        out.append("no incidents" + (" open" if open_only else "") + (f" on {host}" if host else ""))
    for h, n in nodes.items():
        out.append(f"{h}: {n['incidents']} incident(s), {n['open']} open, mean time between incidents "
                   f"{_s(n['mean_between_s'])}")
    for name in ("detect", "drain", "return", "between"):
        d = dist[name]
        if d["count"]:
            out.append(f"time to {name}: n={d['count']} p50 {_s(d['p50'])} p99 {_s(d['p99'])} max {_s(d['max'])}"
                       if name != "between" else f"time between incidents: n={d['count']} p50 {_s(d['p50'])} "
                       f"p99 {_s(d['p99'])} max {_s(d['max'])}")
    b = view["breaker"]
    out.append(f"remediation breaker: OPEN since {when(b['since'])}: {b['why']}" if b["open"]
               else "remediation breaker: closed")
    sys.stdout.write("".join(printable(line) + "\n" for line in out))
    return int(Exit.OK)


def register(app: typer.Typer) -> None:
    @app.command("incidents", help=HELP)
    def incidents_cmd(
        inventory: Annotated[Path, typer.Argument(help="Inventory file or directory.", show_default=False)],
        fmt: Annotated[Format, typer.Option("--format", "-f", help="Text or JSON.")] = Format.text,
        host: Annotated[str | None, typer.Option("--host", help="Only this host's incidents.",
                                                 show_default=False)] = None,
        open_only: Annotated[bool, typer.Option("--open", help="Only the open incidents.")] = False,
        prometheus: Annotated[Path | None, typer.Option(
            "--prometheus", help="Also write the histograms (Prometheus text format) here.", show_default=False)
        ] = None,
        vault_password_file: Annotated[Path | None, typer.Option("--vault-password-file", help=VAULT_HELP)] = None,
    ) -> None:
        use_vault(vault_password_file)
        raise typer.Exit(run(inventory, fmt, host, open_only, prometheus))
