"""`provision drift INVENTORY`: the same playbooks in check + diff mode; report what differs, change nothing."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from provisioner.errors import Exit, UsageError
from provisioner.reports.textfile import write_atomic

# Exit codes are raised as SystemExit: cli.main() runs typer with standalone_mode=False, which returns (and there
# drops) a typer.Exit code.

err = Console(stderr=True, highlight=False)

FORMATS = ("text", "json", "junit", "prometheus")
EXTENSIONS = {"text": "txt", "json": "json", "junit": "xml", "prometheus": "prom"}

HELP = """Check INVENTORY's hosts against the playbooks (check + diff mode) and report, per host, each resource that
differs (file path / package / service, the task and role, the diff for files) and the hosts that could not be
checked. Read-only. Reports: text, json, junit (one testcase per host x resource), prometheus (node_exporter
textfile). Exit codes: 0 no drift, 3 drift found, 1 check could not run or hosts unreachable/failed (takes
precedence over 3), 2 usage."""


def render(result, fmt: str) -> str:  # type: ignore[no-untyped-def]
    from provisioner.reports import drift_json, drift_junit, drift_prometheus, drift_text

    return {"text": drift_text.render, "json": drift_json.render, "junit": drift_junit.render,
            "prometheus": drift_prometheus.render}[fmt](result)


def exit_code(result) -> int:  # type: ignore[no-untyped-def]
    if result.error or result.unreachable_hosts or result.failed_hosts or result.rc not in (0, None):
        return Exit.FAIL
    return Exit.DRIFT if result.drift else Exit.OK


def register(app: typer.Typer) -> None:
    @app.command("drift", help=HELP)
    def drift_cmd(
        inventory: Path = typer.Argument(..., help="Inventory file or directory."),
        report: str = typer.Option("text", "--report", "-r", help="text | json | junit | prometheus"),
        output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the report here (atomically)."),
        limit: Optional[str] = typer.Option(None, "--limit", "-l", help="Host pattern, or @FILE."),
        tags: Optional[str] = typer.Option(None, "--tags", "-t", help="Only check tasks with these tags."),
        skip_tags: Optional[str] = typer.Option(None, "--skip-tags", help="Skip tasks with these tags."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress on stderr."),
        playbook: Optional[Path] = typer.Option(None, "--playbook", help="Playbook to check (default site.yml)."),
    ) -> None:
        from provisioner.commands.common import finding_line, validate
        from provisioner.inventory import load_fleet
        from provisioner.reports import drift_text
        from provisioner.runner import make_progress, resolve_limit, run_playbook, target_hosts

        if report not in FORMATS:
            raise UsageError(f"--report must be one of {', '.join(FORMATS)}, got {report!r}")
        if output is not None:
            if output.is_dir():
                raise UsageError("--output is a directory", path=str(output))
            if not output.parent.is_dir() or not os.access(output.parent, os.W_OK):
                raise UsageError("--output directory does not exist or is not writable", path=str(output.parent))
        if playbook is not None and not playbook.is_file():
            raise UsageError("playbook not found", path=str(playbook))
        fleet = load_fleet(inventory)
        limit_abs = resolve_limit(limit)
        targeted = target_hosts(inventory, limit_abs)
        if not targeted:
            raise UsageError(f"no hosts match{' --limit ' + limit if limit else ''}", path=str(inventory))
        errors, _ = validate(fleet, set(targeted))
        if errors:
            for e in errors:
                err.print(f"[red]error[/] {finding_line(e)}")
            err.print(f"drift check not run: {len(errors)} validation error(s)")
            raise SystemExit(int(Exit.FAIL))

        progress = make_progress("none" if quiet else "auto")
        result = run_playbook(inventory, command="drift", playbook=playbook, limit=limit_abs, tags=tags,
                              skip_tags=skip_tags, check=True, diff=True, progress=progress)
        # every format is kept with the run's artifacts (.runs/<time>-drift/drift.{txt,json,xml,prom})
        for fmt, ext in EXTENSIONS.items():
            (Path(result.run_dir) / f"drift.{ext}").write_text(render(result, fmt))
        text = render(result, report)
        if output is not None:
            write_atomic(output, text)
            if not quiet:
                # the summary line of the text report, so a terminal user sees the outcome
                sys.stderr.write(drift_text.render(result, diffs=False).splitlines()[-2] + "\n")
        else:
            sys.stdout.write(text)
        if not quiet:
            sys.stderr.write(f"run dir: {result.run_dir}\n")
        raise SystemExit(int(exit_code(result)))
