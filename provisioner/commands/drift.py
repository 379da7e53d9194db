"""`provision drift INVENTORY`: the same playbooks in check + diff mode; report what differs, change nothing.

Has `provisioner.cli`'s fast path (FAST_OPTIONS + run(): no typer or rich import), as the nightly timer's drift is
the suite's most frequent command; -e, --exec-node, --help and anything unusual go through typer (register())."""

import os
import sys
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from provisioner.commands.common import EXEC_NODE_HELP, EXTRA_VARS_HELP, VAULT_HELP, unwrap
from provisioner.errors import Exit, UsageError
from provisioner.reports.textfile import write_atomic

if TYPE_CHECKING:
    import typer


class Report(str, Enum):
    """--report formats."""

    text = "text"
    json = "json"
    junit = "junit"
    prometheus = "prometheus"


EXTENSIONS = {Report.text: "txt", Report.json: "json", Report.junit: "xml", Report.prometheus: "prom"}

#: option -> (parameter, type), the same options typer declares in register() (bool: a flag); cli.py's fast path
#: parses with it. The repeatable -e and --exec-node are left to typer.
FAST_OPTIONS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "--report": ("report", Report), "-r": ("report", Report), "--output": ("output", Path), "-o": ("output", Path),
    "--limit": ("limit", str), "-l": ("limit", str), "--tags": ("tags", str), "-t": ("tags", str),
    "--skip-tags": ("skip_tags", str), "--quiet": ("quiet", bool), "-q": ("quiet", bool),
    "--playbook": ("playbook", Path), "--accelerate": ("accelerate", str), "--full": ("full", bool),
    "--full-every": ("full_every", float), "--vault-password-file": ("vault_password_file", Path),
}

HELP = unwrap("""Report what differs between INVENTORY's hosts and the playbooks; change nothing.

Two tiers: a host whose inputs (its variables, -e, tags, the suite's content) are those of its last complete run
is probed with one SSH exec against the state recorded after that run; the hosts the probe finds changed or cannot
reach, hosts whose inputs changed and hosts without a record are checked by the playbooks in check + diff mode (with
the -e extra vars, validated first like `provision run`). --full checks every host with the playbooks. It reports,
per host, each resource that differs (file path / package / service, the task and role, the diff for files) and the
hosts that could not be checked. Reports: text, json, junit (one testcase per host x resource), prometheus
(node_exporter textfile). With --exec-node, the check is sharded across execution nodes (see `provision run`).

Exit codes: 0 no drift, 3 drift found, 1 check could not run or hosts unreachable/failed (takes precedence over 3),
2 usage.""")


def render(result: Any, fmt: Report) -> str:
    from provisioner.reports import drift_json, drift_junit, drift_prometheus, drift_text

    return {Report.text: drift_text.render, Report.json: drift_json.render, Report.junit: drift_junit.render,
            Report.prometheus: drift_prometheus.render}[fmt](result)


def exit_code(result: Any) -> int:
    if result.error or result.unreachable_hosts or result.failed_hosts or result.rc not in (0, None):
        return Exit.FAIL
    return Exit.DRIFT if result.drift else Exit.OK


def register(app: "typer.Typer") -> None:
    # no `from __future__ import annotations` in this module: typer reads these annotations, and typer is imported
    # here only (the fast path never imports it)
    import typer

    @app.command("drift", help=HELP)
    def drift_cmd(
        inventory: Annotated[Path, typer.Argument(help="Inventory file or directory.", show_default=False)],
        report: Annotated[Report, typer.Option("--report", "-r", help="Report format.")] = Report.text,
        output: Annotated[Path | None, typer.Option(
            "--output", "-o", help="Write the report here (atomically).")] = None,
        limit: Annotated[str | None, typer.Option("--limit", "-l", help="Host pattern, or @FILE.")] = None,
        tags: Annotated[str | None, typer.Option("--tags", "-t", help="Only check tasks with these tags.")] = None,
        skip_tags: Annotated[str | None, typer.Option("--skip-tags", help="Skip tasks with these tags.")] = None,
        extra: Annotated[list[str] | None, typer.Option(
            "--extra-vars", "-e", help=EXTRA_VARS_HELP)] = None,
        quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress on stderr.")] = False,
        playbook: Annotated[Path | None, typer.Option(
            "--playbook", help="Playbook to check (default site.yml).")] = None,
        accelerate: Annotated[str | None, typer.Option(
            "--accelerate",
            help="Execution accelerator: none | mitogen (default $PROVISION_ACCELERATE, none).")] = None,
        exec_node: Annotated[list[str] | None, typer.Option("--exec-node", help=EXEC_NODE_HELP)] = None,
        full: Annotated[bool, typer.Option(
            "--full", help="Check every host with Ansible (no probe tier; the weekly run).")] = False,
        full_every: Annotated[float | None, typer.Option(
            "--full-every", metavar="DAYS",
            help="--full when the last full check of this inventory is older than DAYS (the nightly timer).")] = None,
        vault_password_file: Annotated[Path | None, typer.Option("--vault-password-file", help=VAULT_HELP)] = None,
    ) -> None:
        raise typer.Exit(run(inventory, report=report, output=output, limit=limit, tags=tags, skip_tags=skip_tags,
                             extra=extra, quiet=quiet, playbook=playbook, accelerate=accelerate, exec_node=exec_node,
                             full=full, full_every=full_every, vault_password_file=vault_password_file))


def run(inventory: Path, *, report: Report = Report.text, output: Path | None = None, limit: str | None = None,
        tags: str | None = None, skip_tags: str | None = None, extra: list[str] | None = None, quiet: bool = False,
        playbook: Path | None = None, accelerate: str | None = None, exec_node: list[str] | None = None,
        full: bool = False, full_every: float | None = None, vault_password_file: Path | None = None) -> int:
    """The drift check; the exit code (Exit)."""
    from provisioner.commands.common import finding_line, load_run_targets, shard_lines, shard_targets, validate
    from provisioner.reports import drift_text

    if output is not None:
        if output.is_dir():
            raise UsageError("--output is a directory", path=str(output))
        if not output.parent.is_dir() or not os.access(output.parent, os.W_OK):
            raise UsageError("--output directory does not exist or is not writable", path=str(output.parent))
    fleet, xv, limit_abs, targeted = load_run_targets(inventory, extra, limit, playbook, accelerate,
                                                        vault_password_file, "provision drift")
    nodes, targeted = shard_targets(fleet, targeted, exec_node, accelerate)
    errors, _ = validate(fleet, set(targeted))
    if errors:
        for e in errors:
            sys.stderr.write(f"error {finding_line(e)}\n")
        sys.stderr.write(f"drift check not run: {len(errors)} validation error(s)\n")
        return int(Exit.FAIL)

    import time

    from provisioner.drift import tiers as tiering
    from provisioner.ledger.site import site_of
    from provisioner.paths import ledger_path

    started = time.time()
    if full_every is not None:
        if full_every <= 0:
            raise UsageError(f"--full-every must be a positive number of days, got {full_every:g}")
        full = full or tiering.full_due(str(inventory), full_every, ledger_path())
    # tier 1: hosts whose inputs are unchanged since their last complete run get the probe; the others, and the
    # hosts the probe finds changed or cannot reach, go to tier 2 (Ansible check + diff, as before)
    tiers = tiering.sort_hosts(fleet, targeted, full=full, playbook=playbook, tags=tags, skip_tags=skip_tags,
                               extra=xv, ledger_path=ledger_path(), exec_nodes=nodes)
    tier2 = [h for h in targeted if h in tiers.tier2]
    if not quiet and not full:
        sys.stderr.write(f"drift: {len(tiers.tier1)} host(s) clean by the probe, {len(tier2)} to check with "
                         f"Ansible ({tiers.probe_seconds:.1f}s probing)\n")
    if tier2:
        from provisioner.role_gates import idle_roles
        from provisioner.runner import make_progress, run_playbook

        progress = make_progress("none" if quiet else "auto")
        result = run_playbook(inventory, command="drift", playbook=playbook,
                              limit=limit_abs if full else ",".join(tier2), tags=tags, skip_tags=skip_tags,
                              check=True, diff=True, extravars=xv, targeted=tier2, progress=progress,
                              accelerate=accelerate, exec_nodes=nodes, fleet=fleet if nodes else None,
                              amend=lambda r: tiering.merge(tiers, r, targeted),
                              idle_roles=idle_roles(fleet, tier2, xv), ledger_site=site_of(fleet))
        if not full:
            tiering.refresh(fleet, tiers, result, ledger_path(Path(result.run_dir).parent))
        elif limit_abs is None and not tags and not result.error:
            tiering.full_done(str(inventory), ledger_path(Path(result.run_dir).parent))
    else:
        result, rec = tiering.probe_only_result(inventory, playbook, limit_abs, started, site=site_of(fleet),
                                                targeted=targeted)
        tiering.merge(tiers, result, targeted)
        rec.finish(result)
    # every format is kept with the run's artifacts (.runs/<time>-drift/drift.{txt,json,xml,prom})
    for fmt, ext in EXTENSIONS.items():
        (Path(result.run_dir) / f"drift.{ext}").write_text(render(result, fmt))
    text = render(result, report)
    if output is not None:
        write_atomic(output, text)
        if not quiet:
            # the summary line of the text report, so a terminal user sees the outcome
            summary = [ln for ln in drift_text.render(result, diffs=False).splitlines() if ln.startswith("drift: ")]
            sys.stderr.write(summary[-1] + "\n")
    else:
        sys.stdout.write(text)
    if not quiet:
        for line in shard_lines(result):
            sys.stderr.write(line + "\n")
        if output is not None or report is not Report.text:  # the text report on stdout ends with it already
            sys.stderr.write(f"run dir: {result.run_dir}\n")
    return int(exit_code(result))
