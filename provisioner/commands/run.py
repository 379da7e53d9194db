"""`provision run INVENTORY`: validate, preflight, then apply playbooks/site.yml through ansible-runner."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console

from provisioner.commands.common import finding_line, validate
from provisioner.errors import Exit, UsageError

# Exit codes are raised as SystemExit: cli.main() runs typer with standalone_mode=False, which returns (and there
# drops) a typer.Exit code.

err = Console(stderr=True, highlight=False)

HELP = """Apply the playbooks (default playbooks/site.yml) to INVENTORY through ansible-runner.

Validates the inventory first (refuses on errors) and runs the preflight probe (unless --skip-preflight); live
progress on stderr; artifacts under .runs/<time>-run/ (printed). Failed hosts are listed with a ready-to-paste
`--limit @<run dir>/retry`. Exit codes: 0 all hosts ok, 1 validation/preflight refused or any host failed,
unreachable or not reached, 2 usage."""


# ------------------------------------------------------------------------------------------------------------------
# adapters to the other stages (they live in other modules; keep the coupling here, in one place)
def preflight(fleet: Any, targeted: list[str]) -> tuple[bool, list[str]] | None:
    """provisioner.probes.preflight on the targeted GPU nodes: (all ok, problem lines); None when not available."""
    try:
        from provisioner.probes.preflight import run_preflight
    except ImportError:
        return None
    reports = run_preflight(fleet, hosts=targeted)
    problems = [f"{name}: {rep.message}" for name, rep in reports.items() if not rep.ok]
    return not problems, problems


# ------------------------------------------------------------------------------------------------------------------
def register(app: typer.Typer) -> None:
    @app.command("run", help=HELP)
    def run_cmd(
        inventory: Path = typer.Argument(..., help="Inventory file or directory."),
        limit: Optional[str] = typer.Option(None, "--limit", "-l", help="Host pattern, or @FILE (a retry file)."),
        tags: Optional[str] = typer.Option(None, "--tags", "-t", help="Only tasks with these tags (comma list)."),
        skip_tags: Optional[str] = typer.Option(None, "--skip-tags", help="Skip tasks with these tags."),
        serial: Optional[str] = typer.Option(None, "--serial", help="Rolling batches: N hosts or N% per batch."),
        max_fail_percent: Optional[int] = typer.Option(
            None, "--max-fail-percent", help="Stop the rollout when more than P% of a batch fails (0-100)."),
        check: bool = typer.Option(False, "--check", help="Dry run (check + diff); changes nothing."),
        json_out: bool = typer.Option(False, "--json", help="One JSON object on stdout at the end; no progress."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress; short summary only."),
        skip_preflight: bool = typer.Option(False, "--skip-preflight", help="Do not run the preflight probe."),
        playbook: Optional[Path] = typer.Option(None, "--playbook", help="Playbook to run (default site.yml)."),
    ) -> None:
        from provisioner.inventory import load_fleet
        from provisioner.reports import run_json, run_text
        from provisioner.runner import make_progress, resolve_limit, run_playbook, target_hosts, validate_serial

        validate_serial(serial)
        if max_fail_percent is not None and not 0 <= max_fail_percent <= 100:
            raise UsageError(f"--max-fail-percent must be 0..100, got {max_fail_percent}")
        if playbook is not None and not playbook.is_file():
            raise UsageError("playbook not found", path=str(playbook))
        fleet = load_fleet(inventory)
        limit_abs = resolve_limit(limit)
        targeted = target_hosts(inventory, limit_abs)
        if not targeted:
            raise UsageError(f"no hosts match{' --limit ' + limit if limit else ''}", path=str(inventory))

        errors, warnings = validate(fleet, set(targeted))
        for w in warnings:
            if getattr(w, "severity", "") == "warning" and not quiet and not json_out:
                err.print(f"[yellow]warning[/] {finding_line(w)}")
        if errors:
            for e in errors:
                err.print(f"[red]error[/] {finding_line(e)}")
            err.print(f"refusing to run: {len(errors)} validation error(s) (see `provision validate {inventory}`)")
            raise SystemExit(int(Exit.FAIL))

        if not skip_preflight:
            pf = preflight(fleet, targeted)
            if pf is not None:
                ok, problems = pf
                if ok and not (quiet or json_out):
                    err.print(f"preflight: ok ({len(targeted)} hosts targeted)")
                for p in problems:
                    err.print(f"[red]preflight[/] {p}")
                if not ok:
                    err.print("refusing to run: preflight failed (fix the hosts, narrow --limit, or --skip-preflight)")
                    raise SystemExit(int(Exit.FAIL))

        progress = make_progress("none" if (json_out or quiet) else "auto")
        result = run_playbook(
            inventory, command="run", playbook=playbook, limit=limit_abs, tags=tags, skip_tags=skip_tags,
            check=check, serial=serial, max_fail_percent=max_fail_percent, progress=progress,
        )
        if json_out:
            sys.stdout.write(run_json.render(result))
        else:
            sys.stdout.write(run_text.render(result, quiet=quiet))
        raise SystemExit(int(Exit.OK if result.succeeded else Exit.FAIL))
