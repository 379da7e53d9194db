"""`provision node INVENTORY HOST --state STATE --reason TEXT`: a manual lifecycle transition, kept in the ledger."""

from __future__ import annotations

import getpass
import json
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from provisioner.commands.common import VAULT_HELP, Format, unwrap, use_vault
from provisioner.day2.lifecycle import STATES
from provisioner.errors import Exit, UsageError

HELP = unwrap("""Move HOST of INVENTORY to another lifecycle state, with a reason; the ledger keeps it.

The allowed transitions and the refusals are docs/lifecycle.md's: into in-service only after a passed `provision
health` since the host entered its present state and (burn-in gate, on unless the site sets `burnin_gate: false`)
a passed `provision burn-in` since it left service; draining the last cluster serving a model only with --force.
This records the state only: it does not drain the balancer, stop vLLM or touch the node's in-service mark
(provision drain and provision return do).

--adopt (with --state in-service): a node that served before the ledger knew it is recorded in service at once
(new -> provisioning -> burn-in -> in-service) after a passed health gate, the burn-in gate waived and said so in the
ledger (forced); only for a host the ledger has never moved.

Exit codes: 0 recorded, 1 refused (one line saying why), 2 usage.""")

State = Enum("State", {s.replace("-", "_"): s for s in STATES}, type=str)  # type: ignore[misc]


def actor() -> str:
    try:
        return f"user:{getpass.getuser()}"
    except (KeyError, OSError):
        return "user:?"


def run(inventory: Path, host: str, state: str, reason: str, *, force: bool = False,
        fmt: Format = Format.text, adopting: bool = False) -> int:
    from provisioner.day2.lifecycle import SERVING, Refused, adopt, transition
    from provisioner.inventory import load_fleet
    from provisioner.ledger.view import lifecycle_context, open_ledger

    if not reason.strip():
        raise UsageError("--reason must say why (it is kept in the ledger)")
    if adopting and state != SERVING:
        raise UsageError(f"--adopt records a serving node: it goes with --state {SERVING}")
    fleet = load_fleet(inventory)
    if host not in fleet.hosts:
        raise UsageError(f"{host} is not a host of the inventory", path=str(inventory))
    try:
        with open_ledger(fleet) as ledger, ledger.atomic():  # the check (last cluster serving a model) and its write
            current = ledger.state(host)[0]
            ctx = lifecycle_context(fleet, ledger, host)
            chain = adopt(current, seen=bool(ledger.transitions(host)), reason=reason, host=host, context=ctx) \
                if adopting else (transition(current, state, reason=reason, host=host, force=force, context=ctx),)
            for res in chain:
                t = ledger.record_transition(host, res.from_state, res.to_state, reason=res.reason, actor=actor(),
                                             forced=res.forced)
    except Refused as exc:
        sys.stderr.write(f"refused: {exc}\n")
        return int(Exit.FAIL)
    notes = [n for res in chain for n in res.notes]
    if fmt is Format.json:
        sys.stdout.write(json.dumps({"host": host, "from": chain[0].from_state, "to": t.to_state, "reason": t.reason,
                                     "at": t.at, "actor": t.actor, "forced": t.forced, "notes": notes},
                                    indent=2) + "\n")
    else:
        for res in chain:
            sys.stdout.write(f"{host}: {res.from_state} -> {res.to_state} ({res.reason})\n")
        for n in notes:
            sys.stdout.write(f"  note: {n}\n")
    return int(Exit.OK)


def register(app: typer.Typer) -> None:
    @app.command("node", help=HELP)
    def node_cmd(
        inventory: Annotated[Path, typer.Argument(help="Inventory file or directory.", show_default=False)],
        host: Annotated[str, typer.Argument(help="Inventory host name.", show_default=False)],
        state: Annotated[State, typer.Option("--state", "-s", help="The lifecycle state to move HOST to.",
                                             show_default=False)],
        reason: Annotated[str, typer.Option("--reason", "-r", help="Why (kept in the ledger).",
                                            show_default=False)],
        force: Annotated[bool, typer.Option(
            "--force", help="Drain even the last cluster serving a model.")] = False,
        adopting: Annotated[bool, typer.Option(
            "--adopt", help="Record a node that served before the ledger knew it (with --state in-service).")] = False,
        fmt: Annotated[Format, typer.Option("--format", "-f", help="Text or JSON.")] = Format.text,
        vault_password_file: Annotated[Path | None, typer.Option("--vault-password-file", help=VAULT_HELP)] = None,
    ) -> None:
        use_vault(vault_password_file)
        raise typer.Exit(run(inventory, host, state.value, reason, force=force, fmt=fmt, adopting=adopting))
