"""`provision remediate INVENTORY`: apply `lifecycle_policy` to the newest health results (the nightly timer's
step after `provision health`): quarantine, remediate, return, mark for replacement, restart a cluster."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

import provisioner.probes  # noqa: F401  (keeps the SSH key variables in the fleet model)
from provisioner.commands.common import VAULT_HELP, Format, unwrap, use_vault
from provisioner.errors import Exit, UsageError
from provisioner.reports import count

HELP = unwrap("""Apply the quarantine/remediation policy (lifecycle_policy) to the newest health results.

For every GPU node with lifecycle_policy: a failed hard check (ecc, xid, fabricmanager, nvlink, ib: quarantine_on)
quarantines it with the check as reason (the ledger's transitions, the in-service mark removed); a quarantined node
gets the next remediation step (gpu_reset when no process holds a GPU, reboot, power_cycle through its BMC), each
followed by the health gate; a pass returns it (burn-in, in-service, the mark written); N quarantines in
replace_after's window mark it for replacement. --app-fault HOST=WHY reports an application fault (a vLLM crash):
with no hardware signal its cluster is restarted (the vLLM roles), the node is not quarantined. Run `provision
health` first: its results are the ledger's.

--dry-run prints the next action per node and changes nothing (neither the nodes nor the ledger). One line per
action; docs/lifecycle.md has the table of decisions.

Exit codes: 0 done (nodes staying quarantined included), 1 a step, a mark or the ledger failed, or lifecycle_policy
is invalid, 2 usage.""")

def _app_faults(given: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in given:
        host, sep, why = item.partition("=")
        if not sep or not why.strip():
            raise UsageError(f"--app-fault {item!r}: expected HOST=WHY (e.g. n1='vLLM exited 1')")
        out[host] = why.strip()
    return out


def run(inventory: Path, *, limit: str | None = None, dry_run: bool = False, app_fault: list[str] | None = None,
        fmt: Format = Format.text, timeout: float = 900.0) -> int:
    from provisioner.day2.lifecycle import Refused
    from provisioner.day2.service import remediate
    from provisioner.ledger import LedgerError

    try:
        res = remediate(inventory, limit=limit, dry_run=dry_run, app_faults=_app_faults(app_fault or []),
                        timeout=timeout)
    except (LedgerError, Refused) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return int(Exit.FAIL)
    if res.errors:
        for e in res.errors:
            sys.stderr.write(f"error: {e}\n")
        return int(Exit.FAIL)
    if not res.hosts:
        sys.stdout.write("remediate: no GPU node has lifecycle_policy (docs/lifecycle.md): nothing to do\n")
        return int(Exit.OK)
    if fmt is Format.json:
        sys.stdout.write(json.dumps({"ok": res.ok, "dry_run": dry_run, "actions": res.lines}, indent=2) + "\n")
    else:
        for ln in res.lines:
            sys.stdout.write(ln["line"] + "\n")
        sys.stdout.write(f"remediate: {count(len(res.hosts), 'node')} under the policy, {count(res.actions, 'action')}"
                         f"{' (dry run: nothing changed)' if dry_run else ''}\n")
    return int(Exit.OK if res.ok else Exit.FAIL)


def register(app: typer.Typer) -> None:
    @app.command("remediate", help=HELP)
    def remediate_cmd(
        inventory: Annotated[Path, typer.Argument(help="Inventory file or directory.", show_default=False)],
        limit: Annotated[str | None, typer.Option("--limit", "-l", help="Hosts/groups/globs, Ansible style.")] = None,
        dry_run: Annotated[bool, typer.Option(
            "--dry-run", help="Print the next action per node; change nothing.")] = False,
        app_fault: Annotated[list[str] | None, typer.Option(
            "--app-fault", help="HOST=WHY: an application fault seen on HOST (repeat).", show_default=False)] = None,
        fmt: Annotated[Format, typer.Option("--format", "-f", help="Text or JSON.")] = Format.text,
        timeout: Annotated[float, typer.Option("--timeout", help="Seconds per health gate.")] = 900.0,
        vault_password_file: Annotated[Path | None, typer.Option("--vault-password-file", help=VAULT_HELP)] = None,
    ) -> None:
        use_vault(vault_password_file)
        raise typer.Exit(run(inventory, limit=limit, dry_run=dry_run, app_fault=app_fault, fmt=fmt, timeout=timeout))
