"""`provision preflight INVENTORY`: compare every GPU node's real hardware with the inventory (one SSH exec per host)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from provisioner.commands.common import load_targets
from provisioner.errors import Exit

if TYPE_CHECKING:
    import typer

# Start-up matters here (a preflight is seconds; importing typer/rich/pydantic alone was ~0.3 s of it): this module
# imports no CLI framework at import time. `provision preflight ...` with well-formed options runs through
# `provisioner.cli`'s fast path (FAST_OPTIONS + run()); --help and anything unusual goes through typer (register()).

#: option -> (parameter, type), the same options typer declares in register(); cli.py's fast path parses with it.
FAST_OPTIONS: dict[str, tuple[str, type]] = {
    "--limit": ("limit", str), "-l": ("limit", str), "--format": ("fmt", str), "-f": ("fmt", str),
    "--timeout": ("timeout", float), "--forks": ("forks", int),
}
DEFAULTS: dict[str, Any] = {"limit": None, "fmt": "text", "timeout": 30.0, "forks": 64}

HELP = """Probe the GPU nodes of INVENTORY over SSH (paramiko, parallel, one command per host) and compare what they
really have with the inventory: GPU count and model, the HCAs of `ib_hcas` present, ACTIVE/LinkUp at the expected
rate (`ib_rate_gbps`, default 400), GPU-NIC NUMA affinity, the network interface NCCL_SOCKET_IFNAME names
(`bootstrap_interface`, as /etc/nccl.conf renders it), OS and kernel, free disk for models.

Host keys are checked against known_hosts (the inventory's UserKnownHostsFile included); unknown keys are refused.
Exit codes: 0 every host matches, 1 a mismatch or an unreachable host, 2 usage."""


def render_text(reports: dict[str, Any], seconds: float) -> str:
    lines = []
    width = max([len(h) for h in reports] + [4])
    n_ok = n_bad = n_unr = 0
    for name, r in reports.items():
        if not r.reachable:
            n_unr += 1
            lines.append(f"{name:<{width}}  UNREACHABLE  {r.error}")
            continue
        errors = [m for m in r.mismatches if m.severity == "error"]
        warns = [m for m in r.mismatches if m.severity != "error"]
        f = r.facts
        gpus = f.get("gpus") or []
        gdesc = f"{len(gpus)}x {gpus[0]['name']}" if gpus else "no GPU"
        ib = f.get("ib") or {}
        idesc = f"{sum(1 for p in ib.values() if p['state'] == 'ACTIVE')}/{len(ib)} IB ports active"
        free = f.get("disk_free_bytes")
        ddesc = f"{free / 1e9:.0f} GB free" if free is not None else "disk ?"
        summary = f"{gdesc}, {idesc}, {f.get('os') or 'OS ?'}, kernel {f.get('kernel') or '?'}, {ddesc}"
        if errors:
            n_bad += 1
            lines.append(f"{name:<{width}}  MISMATCH     {summary}")
        else:
            n_ok += 1
            lines.append(f"{name:<{width}}  OK           {summary}")
        for m in errors:
            lines.append(f"{'':<{width}}    {name}: {m.line()}")
        for m in warns:
            lines.append(f"{'':<{width}}    {name}: warning: {m.line()}")
    lines.append(f"preflight: {len(reports)} hosts, {n_ok} ok, {n_bad} mismatched, {n_unr} unreachable "
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


def run(inventory: Path, limit: Optional[str] = None, fmt: str = "text", timeout: float = 30.0,
        forks: int = 64) -> int:
    """`provision preflight`: probe, print the report, return the exit code (0 all match, 1 otherwise)."""
    from provisioner.probes.preflight import probe

    fleet, hosts = load_targets(inventory, limit, fmt, timeout, forks)
    t0 = time.monotonic()
    reports = probe(fleet, hosts, timeout=timeout, forks=forks)
    seconds = time.monotonic() - t0
    sys.stdout.write(render_json(reports, seconds) if fmt == "json" else render_text(reports, seconds))
    return int(Exit.OK if all(r.ok for r in reports.values()) else Exit.FAIL)


def register(app: typer.Typer) -> None:
    import typer

    @app.command("preflight", help=HELP)
    def preflight_cmd(
        inventory: Path = typer.Argument(..., help="Inventory file or directory."),
        limit: Optional[str] = typer.Option(DEFAULTS["limit"], "--limit", "-l",
                                            help="Hosts/groups/globs, Ansible style."),
        fmt: str = typer.Option(DEFAULTS["fmt"], "--format", "-f", help="text or json."),
        timeout: float = typer.Option(DEFAULTS["timeout"], "--timeout", help="Seconds per host (connect + probe)."),
        forks: int = typer.Option(DEFAULTS["forks"], "--forks", help="Hosts probed at once (at most one per host)."),
    ) -> None:
        raise SystemExit(run(inventory, limit, fmt, timeout, forks))


