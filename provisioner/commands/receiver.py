"""`provision receiver serve|unit`: the alert receiver on the controller (provisioner/alerts)."""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from provisioner.commands.common import VAULT_HELP, unwrap, use_vault
from provisioner.errors import Exit, UsageError

TOKEN_VAR = "alert_receiver_token"

SERVE_HELP = unwrap("""Serve Alertmanager's webhook: acting alerts run health + remediate for their node.

POST /alerts with `Authorization: Bearer <alert_receiver_token>` (a vaulted variable of INVENTORY, group all; the
alertmanager role writes the same value into Alertmanager's credentials file). A firing alert labelled
remediate="true" whose `host` is a GPU node of INVENTORY runs `provision health INVENTORY --limit HOST`, then
`provision remediate INVENTORY --limit HOST`, once per alert (fingerprint + startsAt, kept in --state across
restarts); the resolve of an alert it acted on runs the pair once more (the return); duplicates and other alerts do
nothing. One log line per alert on stderr; GET /metrics: the receiver's counters plus the site's incidents, open
incidents and remediation breaker from the ledger (the breaker alert reads it).
docs/monitoring.md, "The alert loop".

Exit codes: 0 stopped, 2 usage (no token in the inventory, address in use).""")

UNIT_HELP = unwrap("""Write the systemd unit that runs `provision receiver serve` on this controller.

The unit names this installation's `provision`, the inventory and --listen/--state; the vault password reaches it as
a file path (ANSIBLE_VAULT_PASSWORD_FILE), never the token itself. Then: systemctl daemon-reload, enable --now.

Exit codes: 0 written, 2 usage (a path the unit cannot carry as written).""")


def _listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536 or not host:
        raise UsageError(f"--listen {value!r}: use ADDRESS:PORT (e.g. 198.18.0.1:9095)")
    return host.strip("[]"), int(port)


def _provision_bin() -> str:
    here = Path(sys.executable).parent / "provision"
    return str(here) if here.is_file() else (shutil.which("provision") or "provision")


def _token(inventory: Path) -> tuple[str, list[str], str]:
    """(the bearer token, the GPU nodes, the site) from the inventory; one UsageError line when the token is missing
    or short."""
    from provisioner import vault
    from provisioner.inventory import load_fleet
    from provisioner.ledger.site import site_of

    fleet = load_fleet(inventory)
    nodes = sorted(h.name for h in fleet.gpu_nodes)
    holders = [n for n, h in fleet.hosts.items() if h.vars.get(TOKEN_VAR) not in (None, "")]
    if not holders:
        raise UsageError(f"{TOKEN_VAR} is not set (group all; vault it: ansible-vault encrypt_string)",
                         path=str(inventory))
    vault.require(fleet, holders[:1], what="provision receiver serve", only=(TOKEN_VAR,))
    token = str(fleet.hosts[holders[0]].vars[TOKEN_VAR]).strip()
    if len(token) < 16:
        raise UsageError(f"{TOKEN_VAR} on host {holders[0]}: shorter than 16 characters", path=str(inventory))
    return token, nodes, site_of(fleet)


def _cached(fn: Callable[[], str], seconds: float) -> Callable[[], str]:
    """fn's answer kept for `seconds` (a scrape every few seconds reads the ledger at most that often)."""
    memo: dict[str, tuple[float, str]] = {}

    def get() -> str:
        now = time.monotonic()
        if "v" not in memo or now - memo["v"][0] > seconds:
            memo["v"] = (now, fn())
        return memo["v"][1]

    return get


def serve_cmd(inventory: Path, listen: str, state: Path | None, timeout: float) -> int:
    from provisioner.alerts.server import Receiver, health_then_remediate, log, serve
    from provisioner.alerts.store import Store
    from provisioner.day2.service import site_metrics
    from provisioner.paths import runs_dir

    addr, port = _listen(listen)
    token, nodes, site = _token(inventory)
    store = Store(state or runs_dir() / "alert-receiver.sqlite3")
    rx = Receiver(token=token, gpu_nodes=nodes, store=store,
                  action=health_then_remediate(_provision_bin(), inventory.absolute(), timeout),
                  day2_metrics=_cached(lambda: site_metrics(site), 5.0))
    try:
        srv = serve(rx, addr, port)
    except OSError as exc:
        raise UsageError(f"--listen {listen}: {exc.strerror or exc}") from None
    log(f"receiver listening on {addr}:{port} for {len(nodes)} GPU node(s) of {inventory}")
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()
        rx.stop()
        store.close()
    return int(Exit.OK)


_UNIT_SAFE = re.compile(r"[A-Za-z0-9_./:@+,=-]+")


def unit_text(provision: str, inventory: Path, listen: str, state: Path, env: dict[str, str]) -> str:
    """The unit file; every value is checked to be one plain word (no value may change the unit's shape)."""
    _listen(listen)
    words = {"provision": provision, "inventory": str(inventory), "--listen": listen, "--state": str(state),
             **env}
    for what, v in words.items():
        if not _UNIT_SAFE.fullmatch(v):
            raise UsageError(f"{what} {v!r}: the unit carries only plain paths (letters, digits, _./:@+,=-)")
    envs = "".join(f"Environment={k}={v}\n" for k, v in sorted(env.items()))
    return ("# Managed by provisioner (`provision receiver unit`): the alert receiver (docs/monitoring.md).\n"
            "[Unit]\nDescription=provisioner alert receiver (Alertmanager webhook -> health + remediate)\n"
            "After=network-online.target\nWants=network-online.target\n\n"
            f"[Service]\nType=simple\n{envs}"
            f"ExecStart={provision} receiver serve {inventory} --listen {listen} --state {state}\n"
            "Restart=always\nRestartSec=2\n\n[Install]\nWantedBy=multi-user.target\n")


def register(app: typer.Typer) -> None:
    group = typer.Typer(name="receiver", help="The alert receiver on the controller (docs/monitoring.md).",
                        no_args_is_help=True)

    @group.command("serve", help=SERVE_HELP)
    def serve(
        inventory: Annotated[Path, typer.Argument(help="Inventory file or directory.", show_default=False)],
        listen: Annotated[str, typer.Option("--listen", help="ADDRESS:PORT to listen on.")] = "127.0.0.1:9095",
        state: Annotated[Path | None, typer.Option(
            "--state", help="SQLite file of the alerts acted on (default: the runs directory).")] = None,
        timeout: Annotated[float, typer.Option("--timeout", help="Seconds per health or remediate run.")] = 1800.0,
        vault_password_file: Annotated[Path | None, typer.Option("--vault-password-file", help=VAULT_HELP)] = None,
    ) -> None:
        use_vault(vault_password_file)
        raise typer.Exit(serve_cmd(inventory, listen, state, timeout))

    @group.command("unit", help=UNIT_HELP)
    def unit(
        inventory: Annotated[Path, typer.Argument(help="Inventory file or directory.", show_default=False)],
        out: Annotated[Path, typer.Option("--out", "-o", help="Unit file to write.", show_default=False)],
        listen: Annotated[str, typer.Option("--listen", help="ADDRESS:PORT to listen on.")] = "127.0.0.1:9095",
        state: Annotated[Path, typer.Option("--state", help="SQLite file of the alerts acted on.")] = Path(
            "/var/lib/provisioner/alert-receiver.sqlite3"),
        vault_password_file: Annotated[Path | None, typer.Option("--vault-password-file", help=VAULT_HELP)] = None,
    ) -> None:
        env = {k: os.environ[k] for k in ("PROVISION_LEDGER", "PROVISION_STATE_DIR") if os.environ.get(k)}
        pw = vault_password_file or (Path(os.environ["ANSIBLE_VAULT_PASSWORD_FILE"])
                                     if os.environ.get("ANSIBLE_VAULT_PASSWORD_FILE") else None)
        if pw is not None:
            env["ANSIBLE_VAULT_PASSWORD_FILE"] = str(pw.expanduser().absolute())
        text = unit_text(_provision_bin(), inventory.absolute(), listen, state.absolute(), env)
        try:
            out.write_text(text)
        except OSError as exc:
            raise UsageError(f"cannot write the unit: {exc.strerror or exc}", path=str(out)) from None
        sys.stdout.write(f"wrote {out}\n")
        raise typer.Exit(int(Exit.OK))

    app.add_typer(group)
