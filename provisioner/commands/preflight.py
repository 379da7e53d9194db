"""`provision preflight INVENTORY`: compare every GPU node's real hardware with the inventory (one SSH exec a host)."""

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from provisioner.commands.common import VAULT_HELP, Format, load_targets, unwrap, use_vault
from provisioner.errors import Exit
from provisioner.reports import count

if TYPE_CHECKING:
    import typer

# Start-up matters here (a preflight is seconds; importing typer/rich/pydantic alone was ~0.3 s of it): this module
# imports no CLI framework at import time. `provision preflight ...` with well-formed options runs through
# `provisioner.cli`'s fast path (FAST_OPTIONS + run()); --help and anything unusual goes through typer (register()).

#: option -> (parameter, type), the same options typer declares in register(); cli.py's fast path parses with it.
FAST_OPTIONS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "--limit": ("limit", str), "-l": ("limit", str), "--format": ("fmt", Format), "-f": ("fmt", Format),
    "--timeout": ("timeout", float), "--forks": ("forks", int),
}

HELP = unwrap("""Compare the GPU nodes' real hardware with the inventory (one SSH command per host).

Probes the GPU nodes of INVENTORY over SSH (paramiko, in parallel) and compares what they really have with the
inventory: GPU count and model, the HCAs of `ib_hcas` present, ACTIVE/LinkUp at the expected rate (`ib_rate_gbps`,
default 400), GPU-NIC NUMA affinity, the network interface NCCL_SOCKET_IFNAME names (`bootstrap_interface`, as
/etc/nccl.conf renders it), OS and kernel, free disk for models.

Host keys are checked as ssh checks them (UserKnownHostsFile and GlobalKnownHostsFile of the inventory's ssh args);
unknown or changed keys are refused unless StrictHostKeyChecking=accept-new/no says otherwise (a warning names the
host).

Exit codes: 0 every host matches, 1 a mismatch or an unreachable host, 2 usage.""")


def render_text(reports: dict[str, Any], seconds: float) -> str:
    """A rich table (host, result, GPUs, IB ports active, OS, kernel, free disk), then one line per mismatch and
    the summary."""
    from provisioner.reports.table import plain_table, to_text

    table = plain_table("host", "result", "GPUs", "IB active", "OS", "kernel", "disk free", "error",
                        right=("IB active", "disk free"))
    details: list[str] = []
    n_ok = n_bad = n_unr = 0
    for name, r in reports.items():
        if not r.reachable:
            n_unr += 1
            table.add_row(name, "UNREACHABLE", "", "", "", "", "", str(r.error or ""))
            continue
        errors = [m for m in r.mismatches if m.severity == "error"]
        warns = [m for m in r.mismatches if m.severity != "error"]
        f = r.facts
        gpus = f.get("gpus") or []
        ib = f.get("ib") or {}
        free = f.get("disk_free_bytes")
        n_bad, n_ok = (n_bad + 1, n_ok) if errors else (n_bad, n_ok + 1)
        table.add_row(name, "MISMATCH" if errors else "OK", f"{len(gpus)}x {gpus[0]['name']}" if gpus else "no GPU",
                      f"{sum(1 for p in ib.values() if p['state'] == 'ACTIVE')}/{len(ib)}", f.get("os") or "?",
                      f.get("kernel") or "?", f"{free / 1e9:.0f} GB" if free is not None else "?", "")
        details += [f"{name}: {m.line()}" for m in errors] + [f"{name}: warning: {m.line()}" for m in warns]
    lines = [to_text(table).rstrip("\n"), *details]
    lines.append(f"preflight: {count(len(reports), 'host')}, {n_ok} ok, {n_bad} mismatched, {n_unr} unreachable "
                 f"({seconds:.2f}s)")
    return "\n".join(lines) + "\n"


def render_json(reports: dict[str, Any], seconds: float) -> str:
    doc = {
        "ok": all(r.ok for r in reports.values()),
        "seconds": round(seconds, 3),
        "hosts": {n: r.to_dict() for n, r in reports.items()},
        "summary": {
            "hosts": len(reports),
            "ok": sum(1 for r in reports.values() if r.ok),
            "mismatched": sum(1 for r in reports.values() if r.reachable and not r.ok),
            "unreachable": sum(1 for r in reports.values() if not r.reachable),
        },
    }
    return json.dumps(doc, indent=2) + "\n"


def run(inventory: Path, limit: str | None = None, fmt: Format = Format.text, timeout: float = 30.0,
        forks: int = 64) -> int:
    """`provision preflight`: probe, print the report, return the exit code (0 all match, 1 otherwise)."""
    from provisioner.probes.preflight import probe

    fleet, hosts = load_targets(inventory, limit, timeout, forks)
    t0 = time.monotonic()
    reports = probe(fleet, hosts, timeout=timeout, forks=forks)
    seconds = time.monotonic() - t0
    sys.stdout.write(render_json(reports, seconds) if fmt is Format.json else render_text(reports, seconds))
    return int(Exit.OK if all(r.ok for r in reports.values()) else Exit.FAIL)


def register(app: "typer.Typer") -> None:
    # no `from __future__ import annotations` in this module: typer reads these annotations, and typer is imported
    # here only (the fast path never imports it)
    from typing import Annotated

    import typer

    @app.command("preflight", help=HELP)
    def preflight_cmd(
        inventory: Annotated[Path, typer.Argument(help="Inventory file or directory.", show_default=False)],
        limit: Annotated[str | None, typer.Option("--limit", "-l", help="Hosts/groups/globs, Ansible style.")] = None,
        fmt: Annotated[Format, typer.Option("--format", "-f", help="Report on stdout.")] = Format.text,
        timeout: Annotated[float, typer.Option("--timeout", help="Seconds per host (connect + probe).")] = 30.0,
        forks: Annotated[int, typer.Option("--forks", help="Hosts probed at once (at most one per host).")] = 64,
        vault_password_file: Annotated[Path | None, typer.Option("--vault-password-file", help=VAULT_HELP)] = None,
    ) -> None:
        use_vault(vault_password_file)
        raise typer.Exit(run(inventory, limit, fmt, timeout, forks))
