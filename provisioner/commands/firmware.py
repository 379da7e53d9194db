"""`provision firmware INVENTORY`: the fleet's firmware as its BMCs report it, against the `firmware` map."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from provisioner.commands.common import Format, unwrap
from provisioner.errors import Exit

HELP = unwrap("""Read every BMC's firmware inventory and compare it with the inventory's `firmware` map.

Hosts with a bmc_address or a firmware map (narrowed by --limit) are read over Redfish (UpdateService/
FirmwareInventory, plus ComputerSystem.BiosVersion and Manager.FirmwareVersion). Where the map names gpu or hca (or
with --node), the node's own report joins in over SSH: nvidia-smi's VBIOS per GPU, each InfiniBand HCA's fw_ver.
Prints the fleet's firmware table, then the findings: FW010 a version not accepted (component, found, wanted,
host), FW011 a wanted component nobody reports, FW012 a BMC that could not be read. The BMC001-005 / FW001-003 rules
run first.

Exit codes: 0 every wanted version found, 1 a mismatch, an invalid map or an unreadable BMC, 2 usage.""")


def run(inventory: Path, limit: str | None = None, fmt: Format = Format.text, forks: int = 16,
        vault_password_file: Path | None = None, node: bool = False) -> int:
    from provisioner.bmc.config import BmcConfigError
    from provisioner.bmc.firmware import FirmwareFinding, HostFirmware, compare, merged, wanted_map
    from provisioner.bmc.redfish import Bmc, BmcError, opt_out_line
    from provisioner.bmc.session import bmc_target, each, select, setup_vault
    from provisioner.errors import UsageError
    from provisioner.inventory import load_fleet
    from provisioner.rules import run_rules

    if forks < 1:
        raise UsageError("--forks must be >= 1")
    fleet = load_fleet(inventory)
    pool = select(fleet, [limit]) if limit else list(fleet.hosts)
    hosts = [h for h in pool if fleet.hosts[h].vars.get("bmc_address") or "firmware" in fleet.hosts[h].vars]
    if not hosts:
        raise UsageError(f"no hosts with bmc_address or firmware{' in --limit ' + limit if limit else ''}",
                         path=str(inventory))
    scope = set(hosts)
    invalid = [f for f in run_rules(fleet) if f.code.startswith(("BMC", "FW")) and f.severity == "error"
               and (f.host is None or f.host in scope)]
    setup_vault(fleet, hosts, vault_password_file)

    def one(host: str) -> HostFirmware:
        if not fleet.hosts[host].vars.get("bmc_address") and host in node_hosts:
            return HostFirmware(host)  # no BMC: the node's own report only
        try:
            t = bmc_target(fleet, host)
        except BmcConfigError as exc:
            return HostFirmware(host, error=f"{host}: {exc}")
        warn = opt_out_line(t)
        if warn:
            sys.stderr.write(warn + "\n")
        try:
            return Bmc(t).firmware()
        except BmcError as exc:
            return HostFirmware(host, error=str(exc))

    from provisioner.probes.nodefw import read_nodes, wants_node

    wanted = {h: wanted_map(fleet.hosts[h].vars.get("firmware")) for h in hosts}
    node_hosts = [h for h in hosts if node or wants_node(wanted[h])]
    results = each(hosts, one, forks)
    nodes = read_nodes(fleet, node_hosts)
    reports: dict[str, HostFirmware] = {}
    for h in hosts:
        r = results[h]
        reports[h] = r if isinstance(r, HostFirmware) else HostFirmware(h, error=f"{h}: {type(r).__name__}: {r}")
        if h in nodes:
            reports[h] = merged(reports[h], *nodes[h])
    findings: list[FirmwareFinding] = []
    for h in hosts:
        findings.extend(compare(reports[h], wanted[h]))
    ok = not findings and not invalid
    if fmt is Format.json:
        doc: dict[str, Any] = {
            "ok": ok,
            "errors": [f.as_dict() for f in invalid],
            "hosts": {h: {"error": reports[h].error, "node_error": reports[h].node_error,
                          "wanted": {c: list(v) for c, v in wanted[h].items()},
                          "items": [{"component": i.component, "id": i.id, "name": i.name, "version": i.version,
                                     "source": i.source} for i in reports[h].items]} for h in hosts},
            "findings": [f.as_dict() for f in findings],
        }
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        _print_text(hosts, reports, wanted, findings, [f.line() for f in invalid])
    return int(Exit.OK if ok else Exit.FAIL)


def _print_text(hosts: list[str], reports: dict[str, Any], wanted: dict[str, Any], findings: list[Any],
                invalid: list[str]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    out = Console(highlight=False, soft_wrap=True)
    bad = {(f.host, f.component) for f in findings}
    table = Table(title="firmware", title_justify="left")
    for col in ("host", "component", "version", "from", "wanted", "status"):
        table.add_column(col)
    for h in hosts:
        rep = reports[h]
        if rep.error and not rep.items:
            table.add_row(h, "-", "-", "-", "-", "[red]unreadable[/]")
            continue
        comps = rep.versions()
        for c in sorted(set(comps) | set(wanted[h])):
            want = wanted[h].get(c)
            status = "[red]mismatch[/]" if (h, c) in bad else ("ok" if want else "-")
            src = sorted({"node" if i.source == "node" else "bmc" for i in rep.items if i.component == c})
            table.add_row(h, c, ", ".join(comps.get(c, [])) or "(not reported)", "+".join(src) or "-",
                          " or ".join(want or ()) or "-", status)
    out.print(table)
    for line in invalid:
        out.print(escape(line))
    for f in findings:
        out.print(escape(f.line()))
    n = len(findings) + len(invalid)
    out.print(f"{len(hosts)} host(s): {'firmware as wanted' if not n else f'{n} finding(s)'}")


def register(app: typer.Typer) -> None:
    @app.command("firmware", help=HELP)
    def firmware_cmd(
        inventory: Annotated[Path, typer.Argument(help="Inventory file or directory.", show_default=False)],
        limit: Annotated[str | None, typer.Option("--limit", "-l", help="Hosts/groups/globs, Ansible style.")] = None,
        fmt: Annotated[Format, typer.Option("--format", "-f", help="Table (text) or JSON.")] = Format.text,
        forks: Annotated[int, typer.Option("--forks", help="BMCs read at once.")] = 16,
        vault_password_file: Annotated[Path | None, typer.Option(
            "--vault-password-file", help="For vaulted bmc_password values (else ANSIBLE_VAULT_PASSWORD_FILE).",
            show_default=False)] = None,
        node: Annotated[bool, typer.Option(
            "--node", help="Also read every host's own report over SSH (VBIOS, HCA fw_ver), not only where the map "
                           "names gpu or hca.")] = False,
    ) -> None:
        raise typer.Exit(run(inventory, limit, fmt, forks, vault_password_file, node))
