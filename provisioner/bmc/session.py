"""What `provision power` and `provision firmware` share: the hosts' BMC targets with their passwords resolved
(environment, Ansible Vault, `{{ vault_... }}` templates), and a bounded thread pool over hosts."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from provisioner.bmc.config import BmcConfigError, BmcTarget, resolve_password, target
from provisioner.errors import UsageError
from provisioner.model import Fleet


def setup_vault(fleet: Fleet, hosts: Iterable[str], password_file: Path | None) -> None:
    """The vault secrets (provisioner.vault.setup: `password_file`, else ansible.cfg / ANSIBLE_VAULT_PASSWORD_FILE,
    as ansible-playbook reads them; once per process, never a prompt). `fleet` and `hosts` are kept for callers."""
    from provisioner import vault

    vault.setup(password_file)


def _templar(vars: Mapping[str, Any]) -> Callable[[str], Any]:
    def render(text: str) -> Any:
        from ansible.parsing.dataloader import DataLoader
        from ansible.template import Templar

        out = Templar(loader=DataLoader(), variables=dict(vars)).template(text)
        if isinstance(out, str) and "{{" in out:
            raise ValueError("not rendered")
        return out
    return render


def bmc_target(fleet: Fleet, host: str, environ: Mapping[str, str] | None = None) -> BmcTarget:
    """The host's BMC with its password; BmcConfigError (one line, no secret) when the inventory cannot give it."""
    hv = fleet.hosts[host].vars
    env = os.environ if environ is None else environ
    t = target(host, hv)  # address, scheme, TLS first: a host without a BMC needs no password
    return replace(t, password=resolve_password(host, hv, env, templar=_templar(hv)))


def select(fleet: Fleet, patterns: list[str]) -> list[str]:
    """Hosts matching Ansible-style patterns (names, groups, globs), in inventory order; UsageError when none."""
    from provisioner.inventory import limit_hosts

    hosts = limit_hosts(fleet, ",".join(patterns))
    if not hosts:
        raise UsageError(f"no hosts match {' '.join(patterns)}", path=str(fleet.source))
    return hosts


def each[T](hosts: list[str], fn: Callable[[str], T], forks: int) -> dict[str, T | BaseException]:
    """fn(host) for every host, `forks` at a time; an exception is that host's result, the others go on."""
    def safe(h: str) -> T | BaseException:
        try:
            return fn(h)
        except Exception as exc:
            return exc
    with ThreadPoolExecutor(max_workers=max(1, min(forks, len(hosts)))) as pool:
        return dict(zip(hosts, pool.map(safe, hosts), strict=True))


def before_after_table(title: str, rows: list[dict[str, Any]], last: str,
                       status: Callable[[dict[str, Any]], str]) -> None:
    """Print the host / before / after / `last` table of `provision power` and `firmware --apply` (one row per
    host; `status` gives the last column's cell, rich markup allowed)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for col in ("host", "before", "after", last):
        table.add_column(col)
    for r in rows:
        table.add_row(escape(str(r["host"])), escape(str(r["before"] or "-")), escape(str(r["after"] or "-")),
                      status(r))
    Console(highlight=False, soft_wrap=True).print(table)


__all__ = ["BmcConfigError", "before_after_table", "bmc_target", "each", "select", "setup_vault"]


def boot_id(fleet: Any, host: str, timeout: float) -> tuple[str | None, str | None]:
    """(the host's boot id, None) over SSH (the preflight's connection settings), or (None, why not)."""
    from provisioner.probes import ssh

    r = ssh.run_one(ssh.target_for(fleet.hosts[host]), "cat /proc/sys/kernel/random/boot_id",
                    timeout=max(1.0, timeout))
    if r.ok and r.rc == 0 and r.stdout.strip():
        return r.stdout.strip(), None
    return None, r.error or f"exit {r.rc}: {r.stderr.strip()[:200]}"


def wait_ssh(fleet: Any, host: str, deadline: float, *, not_boot: str | None = None, poll: float = 2.0) -> str:
    """Wait until SSH answers (with another boot id than `not_boot`); the boot id, or BmcError at the deadline."""
    import time

    from provisioner.bmc.redfish import BmcError

    why = "not tried"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise BmcError(f"{host}: powered on, but SSH did not answer{' with a new boot id' if not_boot else ''} "
                           f"in time ({why})")
        bid, err = boot_id(fleet, host, min(left, 15.0))
        if bid is not None and bid != not_boot:
            return bid
        why = err or "the old boot id: not restarted yet"
        time.sleep(min(poll, max(0.0, deadline - time.monotonic())))
