"""`provision monitoring INVENTORY --out DIR`: Prometheus scrape config and alert rules for the fleet."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.markup import escape

from provisioner.commands.common import VAULT_HELP, unwrap, use_vault
from provisioner.errors import Exit, UsageError

HELP = unwrap("""Write the Prometheus scrape config and alert rules for the fleet into DIR.

Renders prometheus.yml (scrapes every vLLM cluster head's /metrics, node_exporter on every GPU node and balancer,
the DCGM exporter) and prometheus-rules.yml (alerts: GPU memory, waiting requests, P99 end-to-end /
time-to-first-token / inter-token latency, vLLM head down, slow model load, drift, health gate). Thresholds are
monitoring_* variables (roles/monitoring/defaults/main.yml), set in the inventory for groups `all` or `monitoring`,
or with --set. docs/monitoring.md.

Exit codes: 0 written (and checked), 1 promtool rejected a file, or a value rules TXT001/TXT002 refuse (in the
inventory or a --set; nothing written), 2 usage (unreadable inventory, bad --set, unwritable DIR).""")


def _parse_sets(sets: list[str]) -> dict[str, Any]:
    out = {}
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep or not key.startswith("monitoring_"):
            raise UsageError(f"--set {item!r}: use monitoring_NAME=VALUE (VALUE is YAML, e.g. 0.95 or 10m)")
        try:
            out[key] = yaml.safe_load(value) if value != "" else ""
        except yaml.YAMLError:
            raise UsageError(f"--set {item!r}: VALUE is not valid YAML") from None
    return out


def _hostile(fleet: Any, overrides: dict[str, Any]) -> list[str]:
    """Rules TXT001/TXT002's errors on the inventory, and on each --set value: what would change the files' shape."""
    from provisioner.rules import run_rules
    from provisioner.rules.text import value_problems

    lines = [f.line() for f in run_rules(fleet) if f.code.startswith("TXT") and f.severity == "error"]
    return lines + [f"--set {k}: {p}" for k, v in overrides.items() for p in value_problems(k, v)]


def run(inventory: Path, out: Path, sets: list[str], check: bool | None) -> int:
    from provisioner.inventory import load_fleet
    from provisioner.monitoring import scrape_targets, write_monitoring

    console = Console(highlight=False)
    fleet = load_fleet(inventory)
    overrides = _parse_sets(sets)
    refused = _hostile(fleet, overrides)
    if refused:
        for line in refused:
            sys.stderr.write(line + "\n")
        sys.stderr.write(f"{inventory}: nothing written: no value may change the shape of prometheus.yml "
                         "(provision validate lists every finding)\n")
        return Exit.FAIL
    written = write_monitoring(fleet, out, overrides)
    targets = scrape_targets(written[0].read_text(encoding="utf-8"))
    rules = yaml.safe_load(written[1].read_text(encoding="utf-8"))
    n_alerts = sum(len(g.get("rules") or []) for g in rules.get("groups") or [])
    for p in written:
        console.print(f"wrote {p}", markup=False)
    console.print(", ".join(f"{job}: {len(cfgs)} target(s)" for job, cfgs in targets.items()) + f"; {n_alerts} alerts",
                  markup=False)

    promtool = shutil.which("promtool")
    if check is None:
        check = promtool is not None
    if check:
        if promtool is None:
            raise UsageError("--check: promtool is not installed (Debian: apt-get install prometheus)")
        r = subprocess.run([promtool, "check", "config", str(written[0])], capture_output=True, text=True)
        if r.returncode != 0:
            console.print(f"[bold red]promtool check config failed[/]\n{escape(r.stdout + r.stderr)}")
            return Exit.FAIL
        console.print("promtool check config: ok (rules included)")
    return Exit.OK


def register(app: typer.Typer) -> None:
    @app.command("monitoring", help=HELP)
    def monitoring_cmd(
        inventory: Annotated[Path, typer.Argument(
            help="Inventory file or directory (e.g. inventories/rack-a.ini).", show_default=False)],
        out: Annotated[Path, typer.Option(
            "--out", "-o", help="Directory to write prometheus.yml and prometheus-rules.yml.", show_default=False)],
        sets: Annotated[list[str] | None, typer.Option(
            "--set", "-s", help="Override a variable: monitoring_NAME=VALUE (repeat).")] = None,
        check: Annotated[bool | None, typer.Option(
            "--check/--no-check", help="Run promtool check config on the result (default: when promtool exists).",
            show_default=False)] = None,
        vault_password_file: Annotated[Path | None, typer.Option("--vault-password-file", help=VAULT_HELP)] = None,
    ) -> None:
        use_vault(vault_password_file)
        raise typer.Exit(run(inventory, out, sets or [], check))
