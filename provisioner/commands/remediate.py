"""`provision remediate INVENTORY`: apply `lifecycle_policy` to the newest health results (the nightly timer's
step after `provision health`): quarantine, remediate, return, mark for replacement, restart a cluster."""

from __future__ import annotations

import json
import sys
from enum import Enum
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
followed by the health gate and, once that passes, the return burn-in tier (burnin_return_tier; the burn-in gate
needs a passed tier since the last step, a failed tier counts as a failed gate); a pass returns it (burn-in,
in-service, the mark written); N quarantines in
replace_after's window mark it for replacement. --app-fault HOST=WHY reports an application fault (a vLLM crash):
with no hardware signal its cluster is restarted (the vLLM roles), the node is not quarantined. Run `provision
health` first: its results are the ledger's.

--dry-run prints the next action per node and changes nothing (neither the nodes nor the ledger). One line per
action; docs/lifecycle.md has the table of decisions.

Rails (remediation_rails, docs/lifecycle.md#rails) hold every action that takes a node or cluster out, whoever asks
(--source operator, timer or alert): a circuit breaker (too many taken out within a window: automatic take-outs stop
until --close-breaker --reason WHY), a capacity floor per model for soft signals, a rate limit and a cool-down per
node, flap damping. In mode recommend (the default) actions are recorded, not executed: --approve ID executes one;
in mode observe they are only recorded; mode act executes. --alert-key KEY acts at most once per key.

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


class Source(str, Enum):
    operator = "operator"
    timer = "timer"
    alert = "alert"


def run(inventory: Path, *, limit: str | None = None, dry_run: bool = False, app_fault: list[str] | None = None,
        fmt: Format = Format.text, timeout: float = 900.0, source: Source = Source.operator,
        alert_key: str | None = None, approve: int | None = None, close_breaker: bool = False,
        reason: str | None = None) -> int:
    from provisioner.day2.lifecycle import Refused
    from provisioner.day2.service import close_breaker as close
    from provisioner.day2.service import remediate

    try:
        if close_breaker:
            from provisioner.day2.executor import actor_user

            was_open, line = close(inventory, reason=reason or "", actor=actor_user())
            sys.stdout.write(json.dumps({"ok": True, "was_open": was_open, "line": line}) + "\n"
                             if fmt is Format.json else line + "\n")
            return int(Exit.OK)
        res = remediate(inventory, limit=limit, dry_run=dry_run, app_faults=_app_faults(app_fault or []),
                        timeout=timeout, source=source.value, alert_key=alert_key, approve=approve)
    except Refused as exc:
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
        sys.stdout.write(json.dumps({"ok": res.ok, "dry_run": dry_run, "source": source.value,
                                     "duplicate": res.duplicate, "actions": res.lines}, indent=2) + "\n")
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
        source: Annotated[Source, typer.Option("--source", help="Who asks (kept with every action).")
                          ] = Source.operator,
        alert_key: Annotated[str | None, typer.Option(
            "--alert-key", help="Idempotency key: the same key acts at most once.", show_default=False)] = None,
        approve: Annotated[int | None, typer.Option(
            "--approve", help="Execute recommended action ID (mode recommend).", show_default=False)] = None,
        close_breaker: Annotated[bool, typer.Option(
            "--close-breaker", help="Close the circuit breaker (needs --reason).")] = False,
        reason: Annotated[str | None, typer.Option("--reason", "-r", help="Why the breaker is closed.",
                                                   show_default=False)] = None,
        fmt: Annotated[Format, typer.Option("--format", "-f", help="Text or JSON.")] = Format.text,
        timeout: Annotated[float, typer.Option("--timeout", help="Seconds per health gate.")] = 900.0,
        vault_password_file: Annotated[Path | None, typer.Option("--vault-password-file", help=VAULT_HELP)] = None,
    ) -> None:
        use_vault(vault_password_file)
        raise typer.Exit(run(inventory, limit=limit, dry_run=dry_run, app_fault=app_fault, fmt=fmt, timeout=timeout,
                             source=source, alert_key=alert_key, approve=approve, close_breaker=close_breaker,
                             reason=reason))
