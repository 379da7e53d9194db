"""`provision power INVENTORY HOST... on|off|cycle|status`: Redfish power through each host's BMC."""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from provisioner.commands.common import Format, unwrap
from provisioner.errors import Exit, UsageError

HELP = unwrap("""Power hosts on, off or through a cycle, or read their power state, through their BMCs (Redfish).

HOST... are inventory hosts, groups or globs (Ansible patterns); the last argument is the action: on, off (ForceOff),
cycle (ForceRestart, or ForceOff then On) or status. The power state is read back and waited for (--timeout); after
on and cycle, SSH to the host is waited for too, within the same --timeout (cycle: until the host answers with a
new boot id; --no-wait-ssh: a host without an OS yet, e.g. before PXE). off and cycle need --yes. --boot pxe|disk
sets a one-time boot override first (the hand-off to an OS installer, docs/bmc.md).

BMC variables: bmc_address, bmc_username, bmc_password (vaulted) or bmc_password_env, bmc_tls_verify, bmc_ca_file
(docs/bmc.md). A host whose BMC cannot be reached is one line and exit 1; the others go on.

Exit codes: 0 every host done, 1 a host failed or has no usable BMC, 2 usage.""")

ACTIONS = ("on", "off", "cycle", "status")


class Boot(str, Enum):
    pxe = "pxe"
    disk = "disk"


def run(inventory: Path, args: list[str], *, yes: bool = False, boot: Boot | None = None, timeout: float = 300.0,
        forks: int = 16, fmt: Format = Format.text, vault_password_file: Path | None = None,
        ssh_wait: bool = True) -> int:
    from provisioner.bmc.config import BmcConfigError
    from provisioner.bmc.redfish import Bmc, BmcError, opt_out_line
    from provisioner.bmc.session import before_after_table, bmc_target, boot_id, each, select, setup_vault, wait_ssh
    from provisioner.inventory import load_fleet

    if len(args) < 2 or args[-1] not in ACTIONS:
        raise UsageError(f"expected HOST... {'|'.join(ACTIONS)} (got {' '.join(args) or 'nothing'})")
    if timeout <= 0 or forks < 1:
        raise UsageError("--timeout must be > 0 and --forks >= 1")
    action = args[-1]
    if action in ("off", "cycle") and not yes:
        raise UsageError(f"power {action} cuts the power of running hosts: add --yes")
    if boot is not None and action not in ("on", "cycle"):
        raise UsageError("--boot goes with on or cycle")
    fleet = load_fleet(inventory)
    hosts = select(fleet, args[:-1])
    setup_vault(fleet, hosts, vault_password_file)
    from provisioner import vault

    vault.require(fleet, [h for h in hosts if fleet.hosts[h].vars.get("bmc_address")], what="provision power",
                  only=("bmc_password",))  # the BMC password, one line up front (exit 2); nothing else is needed

    def one(host: str) -> dict[str, Any]:
        try:
            t = bmc_target(fleet, host)
        except BmcConfigError as exc:
            raise BmcError(f"{host}: {exc}") from None
        warn = opt_out_line(t)
        if warn:
            sys.stderr.write(warn + "\n")
        import time

        deadline = time.monotonic() + timeout
        bmc = Bmc(t)
        old_boot = None
        if ssh_wait and action == "cycle" and bmc.power_state() == "On":
            old_boot, _ = boot_id(fleet, host, 10.0)  # None: not reachable now, any answer afterwards will do
        if boot is not None:
            bmc.boot_once(boot.value)
        before, after = bmc.power(action, timeout=timeout)
        row: dict[str, Any] = {"host": host, "ok": True, "before": before, "after": after, "error": None}
        if ssh_wait and action in ("on", "cycle"):
            row["boot_id"] = wait_ssh(fleet, host, deadline, not_boot=old_boot)
            row["boot_id_before"] = old_boot
        return row

    results = each(hosts, one, forks)
    rows: list[dict[str, Any]] = []
    for h in hosts:
        r = results[h]
        if isinstance(r, BaseException):
            msg = str(r) if isinstance(r, BmcError) else f"{h}: {type(r).__name__}: {r}"
            rows.append({"host": h, "ok": False, "before": None, "after": None, "error": msg})
        else:
            rows.append(r)
    ok = all(r["ok"] for r in rows)
    if fmt is Format.json:
        sys.stdout.write(json.dumps({"ok": ok, "action": action, "hosts": rows}, indent=2) + "\n")
    else:
        before_after_table(f"power {action}", rows, "result", lambda r: "ok" if r["ok"] else "[red]failed[/]")
    for r in rows:  # one line per failed host, whatever the format
        if r["error"]:
            sys.stderr.write(f"error: {r['error']}\n")
    return int(Exit.OK if ok else Exit.FAIL)


def register(app: typer.Typer) -> None:
    @app.command("power", help=HELP)
    def power_cmd(
        inventory: Annotated[Path, typer.Argument(help="Inventory file or directory.", show_default=False)],
        args: Annotated[list[str], typer.Argument(
            help="HOST... (names, groups, globs) then on|off|cycle|status.", show_default=False)],
        yes: Annotated[bool, typer.Option("--yes", help="Confirm off / cycle.")] = False,
        boot: Annotated[Boot | None, typer.Option(
            "--boot", help="One-time boot override before on / cycle: pxe or disk.", show_default=False)] = None,
        timeout: Annotated[float, typer.Option(
            "--timeout", help="Seconds to wait for the power state to read back (and SSH, after on / cycle).")] = 300.0,
        forks: Annotated[int, typer.Option("--forks", help="BMCs driven at once.")] = 16,
        fmt: Annotated[Format, typer.Option("--format", "-f", help="Table (text) or JSON.")] = Format.text,
        vault_password_file: Annotated[Path | None, typer.Option(
            "--vault-password-file", help="For vaulted bmc_password values (else ANSIBLE_VAULT_PASSWORD_FILE).",
            show_default=False)] = None,
        no_wait_ssh: Annotated[bool, typer.Option(
            "--no-wait-ssh", help="After on / cycle, do not wait for SSH (a host with no OS yet).")] = False,
    ) -> None:
        raise typer.Exit(run(inventory, args, yes=yes, boot=boot, timeout=timeout, forks=forks, fmt=fmt,
                             vault_password_file=vault_password_file, ssh_wait=not no_wait_ssh))
